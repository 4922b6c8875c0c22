"""bertlab: BERT pretraining, built step by step.

The names below are the short path through the course: corpus -> tokenizer -> masking -> NSP
pairs -> loader -> model -> pretraining -> export -> downstream. Everything else is imported from
its module (`from bertlab.masking import Decision`); each module is one concept, in the order the
notebooks teach them. Importing bertlab never trains, downloads, prints or plots.
"""

from bertlab.data import pretraining_loader
from bertlab.engine.card import save_hf
from bertlab.engine.loading import load_model
from bertlab.engine.readers import load_corpus
from bertlab.engine.tasks import compare_downstream, finetune_classifier
from bertlab.finetune import FinetuneConfig, format_table, linear_probe
from bertlab.hf import load_hf
from bertlab.masking import IGNORE_INDEX, mask_tokens
from bertlab.model import BertConfig, BertForPreTraining, BertForSequenceClassification, BertModel
from bertlab.pairs import IS_NEXT, NOT_NEXT, create_nsp_examples
from bertlab.pretraining import evaluate, fill_mask, pretrain
from bertlab.tokenizer import special_ids, train_tokenizer
from bertlab.train import TrainConfig

__version__ = "0.1.0"

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
