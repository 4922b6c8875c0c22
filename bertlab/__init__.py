"""bertlab: BERT pretraining, built step by step.

The names below are the short path through the course: corpus -> tokenizer -> masking -> NSP
pairs -> loader -> model -> pretraining -> export -> downstream. Everything else is imported from
its module (`from bertlab.masking import Decision`); each module is one concept, in the order the
notebooks teach them. Importing bertlab never trains, downloads, prints or plots.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

from bertlab.data import pretraining_loader
from bertlab.downstream import compare_downstream
from bertlab.finetune import FinetuneConfig, finetune_classifier, format_table, linear_probe
from bertlab.hf import load_hf, save_hf
from bertlab.loading import load_model
from bertlab.masking import IGNORE_INDEX, mask_tokens
from bertlab.model import BertConfig, BertForPreTraining, BertForSequenceClassification, BertModel
from bertlab.pairs import IS_NEXT, NOT_NEXT, create_nsp_examples
from bertlab.pretraining import evaluate, fill_mask, pretrain
from bertlab.readers import load_corpus
from bertlab.tokenizer import special_ids, train_tokenizer
from bertlab.train import TrainConfig

__version__ = "0.1.0"

# Modules that moved when the package was laid out in tiers (bertlab/README.md), by old name: the
# modules that now hold their names, searched in order. Importing an old name still works, for
# one release, with a DeprecationWarning that names the new module.
_MOVED = {
    "bertlab.engine.files": ("bertlab.engine.folders", "bertlab.artefacts", "bertlab.atomic",
                             "bertlab.tokenizer", "bertlab.engine.outputs"),
    "bertlab.engine.recipes": ("bertlab.recipes",),
    "bertlab.engine.sizes": ("bertlab.counts",),
    "bertlab.engine.textfiles": ("bertlab.textfiles",),
    "bertlab.engine.records": ("bertlab.rows",),
    "bertlab.engine.readers": ("bertlab.readers",),
    "bertlab.engine.hooks": ("bertlab.engine.session", "bertlab.data"),
    "bertlab.engine.fast": ("bertlab.pretraining",),
    "bertlab.engine.loading": ("bertlab.loading",),
    "bertlab.engine.card": ("bertlab.export", "bertlab.hf"),
    "bertlab.engine.tasks": ("bertlab.downstream", "bertlab.finetune"),
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module name (`_MOVED`) as a module that hands out the names of the new ones."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in _MOVED else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        new = _MOVED[module.__name__]
        frame, level = sys._getframe(1), 2  # the warning points at the import, past importlib's
        while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
            frame, level = frame.f_back, level + 1
        warnings.warn(f"{module.__name__} has moved: import from {' or '.join(new)}; the old "
                      f"name goes in the next release", DeprecationWarning, stacklevel=level)

        def __getattr__(attr):
            for target in new:
                found = importlib.import_module(target)
                if hasattr(found, attr):
                    return getattr(found, attr)
            raise AttributeError(f"{module.__name__} (now {', '.join(new)}) has no {attr!r}")
        module.__getattr__ = __getattr__


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())

__all__ = [
    "load_corpus", "train_tokenizer", "special_ids",            # 01 text and WordPiece
    "mask_tokens", "IGNORE_INDEX",                              # 02 masked LM
    "create_nsp_examples", "IS_NEXT", "NOT_NEXT",               # 03 sentence pairs
    "pretraining_loader",
    "BertConfig", "BertModel", "BertForPreTraining",            # 04 the encoder
    "BertForSequenceClassification",
    "TrainConfig", "pretrain", "evaluate", "fill_mask",         # 05 pretraining
    "load_model", "save_hf", "load_hf",
    "FinetuneConfig", "finetune_classifier", "linear_probe",    # 06 [CLS] downstream
    "compare_downstream", "format_table",
]
