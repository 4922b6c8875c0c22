"""Hugging Face interop: map weights to and from `transformers` BERT names; export and import.

Read top to bottom: the state-dict mapping (`to_hf_state_dict`, `from_hf_state_dict`), the
config.json fields, the export's files (`hf_files`, `write_hf`) and the import. A folder written
by `bertlab.export.save_hf` loads with
`transformers.BertForPreTraining.from_pretrained(dir)` and
`BertTokenizerFast.from_pretrained(dir)`; `load_hf` reads such folders (ours or Hugging Face's)
back. The files are plain JSON and safetensors, so none of this imports `transformers`.

Last, bertlab's masking inside Hugging Face's `transformers.Trainer`: `mask_epoch_callback`
tells bertlab's collator the Trainer's epoch, so that each epoch gets new masks (it imports
`transformers` when it is called).

Taught in notebooks/04_encoder.ipynb and notebooks/09_your_own_corpus.ipynb.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from bertlab.artefacts import LOCK_NAME, describe_kind, folder_kind
from bertlab.atomic import through_link
from bertlab.data import PretrainingCollator
from bertlab.engine.folders import atomic_write_folder, keep_entry, sweep_dead_writers
from bertlab.engine.outputs import check_folder_holds
from bertlab.errors import BadInput, BadType, check_type
from bertlab.model import BertConfig, BertForPreTraining, BertForSequenceClassification
from bertlab.tokenizer import load_tokenizer, tokenizer_from_vocab

# Our name -> transformers name, for everything but the fused attention projection (below).
_EMBEDDINGS = {
    "embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight",
    "embeddings.position_embeddings.weight": "embeddings.position_embeddings.weight",
    "embeddings.token_type_embeddings.weight": "embeddings.token_type_embeddings.weight",
    "embeddings.norm.weight": "embeddings.LayerNorm.weight",
    "embeddings.norm.bias": "embeddings.LayerNorm.bias",
}
_LAYER = {  # inside bert.layers.{i} <-> bert.encoder.layer.{i}
    "attention.out": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
_HEADS = {
    "bert.pooler": "bert.pooler.dense",
    "mlm.dense": "cls.predictions.transform.dense",
    "mlm.norm": "cls.predictions.transform.LayerNorm",
    "nsp": "cls.seq_relationship",
    "classifier": "classifier",
}
_QKV = ("query", "key", "value")  # order of the rows of our fused qkv Linear

_TASKS = {"pretraining": BertForPreTraining, "classification": BertForSequenceClassification}
# (our config field, Hugging Face config field)
_CONFIG_FIELDS = [
    ("vocab_size", "vocab_size"),
    ("hidden_size", "hidden_size"),
    ("num_layers", "num_hidden_layers"),
    ("num_heads", "num_attention_heads"),
    ("intermediate_size", "intermediate_size"),
    ("max_position_embeddings", "max_position_embeddings"),
    ("type_vocab_size", "type_vocab_size"),
    ("hidden_dropout", "hidden_dropout_prob"),
    ("attention_dropout", "attention_probs_dropout_prob"),
    ("layer_norm_eps", "layer_norm_eps"),
    ("initializer_range", "initializer_range"),
    ("pad_token_id", "pad_token_id"),
]
# Keys a config.json must have: they fix the weight shapes. For the other keys BertConfig's
# defaults are transformers' (dropouts, eps, 512 positions, 2 segment types), so a missing one
# means what it means to transformers.
_REQUIRED_CONFIG_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                         "intermediate_size")
_FLOAT_CONFIG_FIELDS = ("hidden_dropout", "attention_dropout", "layer_norm_eps",
                        "initializer_range")
# The line that marks a README.md as a model card bertlab wrote (`bertlab.export`): an export
# replaces such a card, and keeps any other README.md, a user's own, untouched.
CARD_MARK = ("<!-- This model card was written by bertlab; a new export replaces it. Delete this "
             "line to keep your edits. -->")
_SPECIAL_TOKENS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
                   "sep_token": "[SEP]", "mask_token": "[MASK]"}


class ModelFolderMissingError(ValueError, FileNotFoundError):
    """A model or tokenizer folder, or a file it needs, is not there.

    A ValueError (bad input, like every other refusal here) that is also a FileNotFoundError,
    so code that catches the latter keeps working.
    """


# ---------------------------------------------------------------------------------------------
# State-dict mapping


def to_hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Return the state dict renamed to `transformers.BertForPreTraining` names (or BertModel names
    under `bert.`, plus `classifier.*` for a classifier); the fused qkv is split into three.

    The tied MLM decoder (`cls.predictions.decoder.*`) is left out, as `save_pretrained` does.
    Works on gradients too (any dict keyed by our parameter names).
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        out.update(_our_key_to_hf(name, tensor))
    return out


def _our_key_to_hf(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    if name.startswith("bert.embeddings."):
        return {"bert." + _EMBEDDINGS[name.removeprefix("bert.")]: tensor}
    match = re.fullmatch(r"bert\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
    if match:
        i, module, kind = match.groups()
        prefix = f"bert.encoder.layer.{i}."
        if module == "attention.qkv":  # (3d, d) -> 3 x (d, d); (3d,) -> 3 x (d,)
            parts = tensor.chunk(3, dim=0)
            return {f"{prefix}attention.self.{q}.{kind}": p
                    for q, p in zip(_QKV, parts, strict=True)}
        return {f"{prefix}{_LAYER[module]}.{kind}": tensor}
    if name == "mlm.bias":
        return {"cls.predictions.bias": tensor}
    module, _, kind = name.rpartition(".")
    if module in _HEADS:
        return {f"{_HEADS[module]}.{kind}": tensor}
    raise KeyError(f"no Hugging Face name for parameter {name!r}")


def _normalise_hf_keys(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # Old checkpoints: LayerNorm gamma/beta, persistent position_ids/token_type_ids buffers.
    # BertModel-only checkpoints: no "bert." prefix.
    bare = not any(k.startswith("bert.") for k in state_dict)
    out = {}
    for key, tensor in state_dict.items():
        if key.endswith(("embeddings.position_ids", "embeddings.token_type_ids")):
            continue
        key = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", key))
        if bare and key.startswith(("embeddings.", "encoder.", "pooler.")):
            key = "bert." + key
        out[key] = tensor
    return out


def from_hf_state_dict(
    hf_state_dict: dict[str, torch.Tensor], config: BertConfig, task: str = "pretraining"
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Return (our state dict, names of our parameters the checkpoint did not provide).

    Accepts `BertForPreTraining`, `BertForSequenceClassification` and bare `BertModel`
    checkpoints, old `gamma`/`beta` LayerNorm names and the old persistent buffers. Encoder
    weights must all be there; missing pooler or head weights are reported, not invented.
    """
    if task not in _TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {sorted(_TASKS)}")
    hf = _normalise_hf_keys(hf_state_dict)
    ours: dict[str, torch.Tensor] = {}
    used: set[str] = set()

    def take(hf_key: str) -> torch.Tensor | None:
        if hf_key in hf:
            used.add(hf_key)
            return hf[hf_key]
        return None

    for our, theirs in _EMBEDDINGS.items():
        ours["bert." + our] = take("bert." + theirs)
    for i in range(config.num_layers):
        prefix = f"bert.encoder.layer.{i}."
        for kind in ("weight", "bias"):
            parts = [take(f"{prefix}attention.self.{q}.{kind}") for q in _QKV]
            ours[f"bert.layers.{i}.attention.qkv.{kind}"] = (
                None if any(p is None for p in parts) else torch.cat(parts, dim=0)
            )
            for module, hf_module in _LAYER.items():
                ours[f"bert.layers.{i}.{module}.{kind}"] = take(f"{prefix}{hf_module}.{kind}")
    missing_encoder = [k for k, v in ours.items() if v is None]
    if missing_encoder:
        raise ValueError(
            f"checkpoint lacks encoder weights for a {config.num_layers}-layer model, e.g. "
            f"{missing_encoder[:3]} (Hugging Face names); is config.json from the same model?"
        )

    heads = ["bert.pooler"] + (["mlm.dense", "mlm.norm", "nsp"] if task == "pretraining"
                               else ["classifier"])
    for module in heads:
        for kind in ("weight", "bias"):
            ours[f"{module}.{kind}"] = take(f"{_HEADS[module]}.{kind}")
    if task == "pretraining":
        # The decoder's weight and bias are tied copies of the word table and this bias.
        decoder_bias = take("cls.predictions.decoder.bias")
        ours["mlm.bias"] = take("cls.predictions.bias")
        if ours["mlm.bias"] is None:
            ours["mlm.bias"] = decoder_bias
        take("cls.predictions.decoder.weight")
    # The other task's heads are expected leftovers (e.g. fine-tuning a pretrained checkpoint).
    other = ("classifier.",) if task == "pretraining" else ("cls.",)
    unexpected = sorted(k for k in hf if k not in used and not k.startswith(other))
    if unexpected:
        raise ValueError(f"checkpoint has weights this BERT does not use: {unexpected[:5]}")
    missing = [k for k, v in ours.items() if v is None]
    return {k: v for k, v in ours.items() if v is not None}, missing


# ---------------------------------------------------------------------------------------------
# Config


def hf_config_fields(config: BertConfig) -> dict[str, Any]:
    """Return a bertlab config's settings under their Hugging Face names.

    The one place the two configs meet: `transformers.BertConfig(**hf_config_fields(config))`
    builds the same encoder (erf GELU, LayerNorm eps, dropout, init), and `hf_config_dict`
    writes these into config.json.
    """
    return {**{hf: getattr(config, ours) for ours, hf in _CONFIG_FIELDS}, "hidden_act": "gelu"}


def hf_config_dict(model: BertForPreTraining | BertForSequenceClassification,
                   label_names: list[str] | None = None) -> dict:
    """Return the Hugging Face config.json contents for the model."""
    out = hf_config_fields(model.config)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    out.update(model_type="bert", position_embedding_type="absolute",
               tie_word_embeddings=True, is_decoder=False, dtype=dtype)
    if isinstance(model, BertForSequenceClassification):
        names = label_names or [f"LABEL_{i}" for i in range(model.num_labels)]
        if len(names) != model.num_labels:
            raise ValueError(f"label_names has {len(names)} names for {model.num_labels} labels")
        out["architectures"] = ["BertForSequenceClassification"]
        out["id2label"] = {str(i): name for i, name in enumerate(names)}
        out["label2id"] = {name: i for i, name in enumerate(names)}
        if model.num_labels == 1:
            out["problem_type"] = "regression"
    elif isinstance(model, BertForPreTraining):
        out["architectures"] = ["BertForPreTraining"]
    else:
        raise BadType(f"save_hf(model={type(model).__name__})", "is not a bertlab "
                      "BertForPreTraining or BertForSequenceClassification",
                      "pass a model bl.load_model or bl.BertForPreTraining gives")
    return dict(sorted(out.items()))


def config_from_hf(hf_config: dict, source: str | Path = "config.json") -> BertConfig:
    """Return our `BertConfig` from a Hugging Face BERT config.json dict.

    `source` names the file in error messages. The shape-defining keys (vocab_size,
    hidden_size, num_hidden_layers, num_attention_heads, intermediate_size) must be there; the
    others fall back to the defaults BERT and transformers share.
    """
    if not isinstance(hf_config, dict):
        raise ValueError(f"{source} holds a JSON {type(hf_config).__name__}, not an object of "
                         f"settings; is it a Hugging Face config.json?")
    if hf_config.get("model_type", "bert") != "bert":
        raise ValueError(f"{source} describes a {hf_config['model_type']!r} model, not 'bert'")
    act = hf_config.get("hidden_act", "gelu")
    if act != "gelu":
        raise ValueError(f"{source}: hidden_act={act!r} is not supported; bertlab uses erf GELU "
                         f"('gelu')")
    if hf_config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{source}: only absolute position embeddings are supported")
    missing = [key for key in _REQUIRED_CONFIG_KEYS if hf_config.get(key) is None]
    if missing:
        raise ValueError(f"{source} lacks {', '.join(missing)}; a BERT config.json needs "
                         f"{', '.join(_REQUIRED_CONFIG_KEYS)} (save the model with save_hf or "
                         f"transformers' save_pretrained)")
    settings = {}
    for ours, hf in _CONFIG_FIELDS:
        value = hf_config.get(hf)
        if value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if ours in _FLOAT_CONFIG_FIELDS:
            if not number:
                raise ValueError(f"{source}: {hf} must be a number, got {value!r}")
            value = float(value)
        elif not number or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"{source}: {hf} must be a whole number, got {value!r}")
        settings[ours] = value if ours in _FLOAT_CONFIG_FIELDS else int(value)
    try:
        return BertConfig(**settings)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


# ---------------------------------------------------------------------------------------------
# Export


def _tokenizer_files(tokenizer: Tokenizer, model_max_length: int) -> dict[str, str]:
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise ValueError("tokenizer ids are not 0..n-1 without gaps; cannot write vocab.txt")
    missing = [t for t in _SPECIAL_TOKENS.values() if t not in vocab]
    if missing:
        raise ValueError(f"tokenizer lacks the special tokens {missing}; BERT needs all of them")
    normalizer = json.loads(tokenizer.to_str()).get("normalizer") or {}
    lowercase = bool(normalizer.get("lowercase", False))
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": lowercase,
        "strip_accents": normalizer.get("strip_accents"),
        "tokenize_chinese_chars": bool(normalizer.get("handle_chinese_chars", True)),
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        **_SPECIAL_TOKENS,
    }
    return {
        "tokenizer.json": tokenizer.to_str(),
        "vocab.txt": "".join(token + "\n" for token, _ in by_id),
        "tokenizer_config.json": json.dumps(config, indent=2),
        "special_tokens_map.json": json.dumps(_SPECIAL_TOKENS, indent=2),
    }


def hf_files(model: BertForPreTraining | BertForSequenceClassification,
             tokenizer: Tokenizer | None, label_names: list[str] | None = None,
             max_length: int | None = None) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """Return what a Hugging Face folder of `model` holds: its text files (name -> text:
    config.json and, unless `tokenizer` is None, the tokenizer files, whose model_max_length is
    `max_length`, the length the model was pretrained at, or else its positions) and the
    tensors of model.safetensors. `write_hf` writes them; `save_hf` does both, into a
    folder it builds aside and renames into place.
    """
    files = {"config.json": json.dumps(hf_config_dict(model, label_names), indent=2) + "\n"}
    if tokenizer is not None:
        if tokenizer.get_vocab_size() != model.config.vocab_size:
            raise ValueError(f"tokenizer has {tokenizer.get_vocab_size()} tokens but the model's "
                             f"vocab_size is {model.config.vocab_size}; export the model with "
                             f"the tokenizer it was trained with (nothing was written)")
        files.update(_tokenizer_files(tokenizer, max_length or
                                      model.config.max_position_embeddings))
    # safetensors refuses views of shared storage (e.g. our qkv split): store contiguous copies.
    tensors = {k: v.detach().to("cpu").contiguous().clone()
               for k, v in to_hf_state_dict(model.state_dict()).items()}
    return files, tensors


def write_hf(folder: Path, files: dict[str, str], tensors: dict[str, torch.Tensor]) -> None:
    """Write `hf_files`' files and tensors (model.safetensors) into the existing `folder`."""
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Import


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}, column "
                         f"{e.colno}); restore it from the original export") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); restore it "
                         f"from the original export") from None


def _read_weight_file(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ModelFolderMissingError(f"'{path}' is missing; the folder's weights are incomplete")
    try:
        if path.suffix == ".bin":  # never unpickle arbitrary objects
            return torch.load(path, map_location="cpu", weights_only=True)
        return load_file(str(path))
    except (SafetensorError, RuntimeError, pickle.UnpicklingError, EOFError) as e:
        raise ValueError(f"'{path}' is corrupt or not a weights file ({e}); restore it from the "
                         f"original export") from None


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / "model.safetensors").is_file():
        return _read_weight_file(folder / "model.safetensors")
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index)
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no weight_map object; restore it from the original "
                             f"export")
        shards = sorted(set(weight_map.values()))
        return {k: v for shard in shards for k, v in _read_weight_file(folder / shard).items()}
    if (folder / "pytorch_model.bin").is_file():
        return _read_weight_file(folder / "pytorch_model.bin")
    raise ModelFolderMissingError(f"'{folder}' has no model.safetensors or pytorch_model.bin; "
                                  f"export the weights there (save_hf or save_pretrained)")


def load_hf(
    folder: str | Path, task: str = "pretraining", num_labels: int | None = None
) -> BertForPreTraining | BertForSequenceClassification:
    """Return a bertlab model with the weights of a Hugging Face BERT folder.

    `task="pretraining"` gives `BertForPreTraining`; `task="classification"` gives
    `BertForSequenceClassification` (num_labels from config.json unless given). Heads the
    checkpoint lacks (e.g. a bare `BertModel`) are freshly initialised, with a warning. The
    model comes back in eval mode, as from `from_pretrained`.

    Every problem with the folder is a ValueError that names the file: a missing folder,
    config.json or weights file (`ModelFolderMissingError`, also a FileNotFoundError), a
    config.json that is not JSON or lacks a key, weights that do not fit the config or that
    are not finite (NaN or inf: a corrupt export or a diverged run).

    Taught in notebooks/04_encoder.ipynb
    """
    check_type(folder, (str, os.PathLike), "load_hf(folder)", "a path",
               "pass a Hugging Face folder's path as a str or pathlib.Path")
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFolderMissingError(f"model folder '{folder}' does not exist; check the path")
    if not (folder / "config.json").is_file():
        raise ModelFolderMissingError(f"'{folder}' has no config.json; is it a Hugging Face "
                                      f"folder (from save_hf, export-hf or save_pretrained)?")
    if task not in _TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {sorted(_TASKS)}")
    hf_config = _read_json(folder / "config.json")
    config = config_from_hf(hf_config, source=folder / "config.json")
    if task == "classification":
        num_labels = num_labels or len(hf_config.get("id2label") or {}) or 2
        model = BertForSequenceClassification(config, num_labels)
    else:
        model = BertForPreTraining(config)

    state, missing = from_hf_state_dict(_read_weights(folder), config, task)
    expected = model.state_dict()
    for key, tensor in state.items():
        if tensor.shape != expected[key].shape:
            theirs = next(iter(_our_key_to_hf(key, expected[key])))
            raise ValueError(
                f"'{folder}': shape mismatch for '{theirs}': checkpoint has "
                f"{tuple(tensor.shape)}, the model built from config.json expects "
                f"{tuple(expected[key].shape)}; are config.json and the weights from one model?"
            )
    model.load_state_dict(state, strict=False)
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(tensor.isfinite().all()):
            raise ValueError(f"'{folder}': the weights hold NaN or inf values ({name}), so the "
                             f"checkpoint is corrupt or the run diverged; export an earlier "
                             f"checkpoint or train again")
    if missing:
        modules = sorted({k if k == "mlm.bias" else k.rsplit(".", 1)[0] for k in missing})
        warnings.warn(
            f"'{folder}' has no weights for {', '.join(modules)}: they are freshly initialised "
            f"(train them before trusting their outputs)",
            stacklevel=2,
        )
    return model.eval()


def load_hf_tokenizer(folder: str | Path) -> Tokenizer:
    """Return the `tokenizers.Tokenizer` of a Hugging Face folder (tokenizer.json, else vocab.txt)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFolderMissingError(f"tokenizer folder '{folder}' does not exist; check the "
                                      f"path")
    if (folder / "tokenizer.json").is_file():
        return load_tokenizer(folder / "tokenizer.json")
    if (folder / "vocab.txt").is_file():
        settings_file = folder / "tokenizer_config.json"
        settings = _read_json(settings_file) if settings_file.is_file() else {}
        lowercase = settings.get("do_lower_case", True) if isinstance(settings, dict) else True
        return tokenizer_from_vocab(folder / "vocab.txt", lowercase=lowercase)
    raise ModelFolderMissingError(f"'{folder}' has neither tokenizer.json nor vocab.txt; export "
                                  f"the model with its tokenizer (save_hf(model, tokenizer, "
                                  f"folder))")


# ---------------------------------------------------------------------------------------------
# bertlab's masking inside Hugging Face's `transformers.Trainer`
#
# `PretrainingCollator` is the Trainer's `data_collator` as it is: rows of a `datasets.Dataset`
# with `input_ids` (and optionally `token_type_ids`, `next_sentence_label`, `word_ids`) and an
# `index` column become the batch dict `BertForMaskedLM` / `BertForPreTraining` take. Two
# settings make the masks what bertlab promises (the same for an example whatever batch, worker
# or process it lands in, a new one each epoch):
#
# - `TrainingArguments(remove_unused_columns=False)`: else the Trainer drops `index` and
#   `word_ids`, which the model's forward does not name;
# - `callbacks=[mask_epoch_callback(collator)]`: the Trainer never tells its collator the epoch,
#   so without it every epoch gets epoch 0's masks (static masking).
#
# The Trainer's sampler orders the rows by its own seed, not bertlab's `EpochShuffleSampler`:
# the masks of an example match a bertlab run with the same seed, the order of the batches does
# not. `mask_epoch_callback` imports `transformers` only when it is called.

INSTALL = "pip install 'transformers>=4.40' accelerate"


class TrainerMissingError(ValueError, ImportError):
    """The Trainer's packages (`transformers`, `accelerate`) are not installed: a ValueError
    like every refused setting, and an ImportError, so code that catches that keeps working."""


def _trainer_callback_class() -> type:
    """Return `transformers.TrainerCallback`, or raise TrainerMissingError naming the fix."""
    missing = []
    for name in ("transformers", "accelerate"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise TrainerMissingError(
            f"mask_epoch_callback is for transformers.Trainer, which needs "
            f"{' and '.join(missing)} (not installed); install with {INSTALL}, or train with "
            f"bertlab.pretrain, which moves the masking epoch itself")
    from transformers import TrainerCallback

    return TrainerCallback


def mask_epoch_callback(collator: PretrainingCollator) -> Any:
    """Return a `transformers.TrainerCallback` that gives `collator` the Trainer's epoch.

    At each epoch's start, before the Trainer opens its DataLoader (and so before workers copy
    the collator), it calls `collator.set_epoch(epoch)`: dynamic masking, a new mask per epoch.
    Persistent workers keep the copy they made at the first epoch, so it refuses
    `dataloader_persistent_workers=True` with workers.
    """
    if not isinstance(collator, PretrainingCollator):
        raise ValueError(f"mask_epoch_callback: collator={type(collator).__name__}; pass the "
                         f"bertlab.data.PretrainingCollator given to the Trainer as data_collator")
    base = _trainer_callback_class()

    class MaskEpochCallback(base):
        """Moves bertlab's masking epoch on with the Trainer's."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if args.dataloader_num_workers > 0 and args.dataloader_persistent_workers:
                raise ValueError(
                    "mask_epoch_callback: dataloader_persistent_workers=True keeps the workers' "
                    "first copy of the collator, so every epoch would reuse epoch 0's masks; "
                    "set dataloader_persistent_workers=False (or dataloader_num_workers=0)")

        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # state.epoch is a float (epochs done so far); a resume may start mid-epoch.
            collator.set_epoch(math.floor((state.epoch or 0) + 1e-9))

    return MaskEpochCallback()


# --------------------------------------------------------------------------------------------
# Writing a Hugging Face folder in one step


class OutputFolderTakenError(ValueError, FileExistsError):
    """`save_hf` was pointed at a folder that holds something other than a Hugging Face export."""


def save_hf(
    model: BertForPreTraining | BertForSequenceClassification,
    tokenizer: Tokenizer | None,
    out_dir: str | Path,
    label_names: list[str] | None = None,
    card: str | None = None,
    max_length: int | None = None,
    extra: Mapping[str, str] | None = None,
) -> Path:
    """Return `out_dir` after writing a Hugging Face folder there: config.json,
    model.safetensors, (unless `tokenizer` is None) the tokenizer files (`bertlab.hf.hf_files`)
    and (with `card`, the text of a model card from `model_card`) README.md. `max_length`, the
    length the model was pretrained at, is the tokenizer's model_max_length (None: the model's
    positions), so `transformers` never truncates to positions that had no gradient. `extra`:
    more files (name -> text) written in the same step, such as a fine-tuning's finetune.json.

    The folder is built in a hidden sibling and renamed into place (`atomic_write_folder`), so
    a crash never leaves half a model. An existing export there is replaced, and the files in it
    that an export does not write are kept, a README.md of the user's too (one without
    `CARD_MARK`: `card` then is not written), and so is a folder that holds only such a
    README.md; weights of another format there are refused. Any other non-empty folder, a file or a path under a file is
    refused with a ValueError before anything is written (`OutputFolderTakenError`, also a
    FileExistsError, for a folder that holds something else).

    Taught in notebooks/04_encoder.ipynb
    """
    check_type(model, (BertForPreTraining, BertForSequenceClassification), "save_hf(model)",
               "a bertlab BertForPreTraining or BertForSequenceClassification",
               "pass the model bl.load_model or bl.BertForPreTraining gives")
    check_type(tokenizer, (Tokenizer, type(None)), "save_hf(tokenizer)",
               "a tokenizers.Tokenizer or None", "pass the tokenizer the model was trained with")
    check_type(out_dir, (str, os.PathLike), "save_hf(out_dir)", "a path",
               "pass the export folder's path as a str or pathlib.Path")
    out_dir = Path(out_dir)
    sweep_dead_writers(through_link(out_dir))  # a killed export's set-aside copy back first
    kind = folder_kind(out_dir)
    if kind == "other" and holds_only_users_readme(out_dir):
        kind = "readme"  # a folder made for the export, with its README written first
    if kind not in ("missing", "empty", "hf", "file", "readme"):
        raise OutputFolderTakenError(
            f"'{out_dir}' holds {describe_kind(kind)}, so it is not a model folder that may be "
            f"replaced; choose a new or empty folder (nothing was written)")
    check_folder_holds(out_dir, "out_dir", accept=("hf", "other") if kind == "readme" else ("hf",))
    files, tensors = hf_files(model, tokenizer, label_names, max_length)
    clash = sorted(set(extra or {}) & {*files, "model.safetensors", "README.md"})
    if clash:
        raise BadInput(f"save_hf(extra={clash})", "names files the export writes itself",
                       "give the extra files other names (nothing was written)")
    files.update(extra or {})
    replacing = kind in ("hf", "readme")
    if card is not None and not (replacing and is_users_readme(out_dir / "README.md")):
        files["README.md"] = card
    kept = _kept_entries(out_dir, {*files, "model.safetensors"}) if replacing else []

    def write(folder: Path) -> None:
        write_hf(folder, files, tensors)
        for entry in kept:  # the user's own files come along into the new folder
            keep_entry(entry, folder / entry.name)

    return atomic_write_folder(out_dir, write)


def holds_only_users_readme(folder: Path) -> bool:
    """Return whether `folder` holds a README.md of the user's and nothing else (but a lock):
    a folder an export may fill, keeping that README."""
    names = {e.name for e in folder.iterdir()} - {LOCK_NAME}
    return names == {"README.md"} and is_users_readme(folder / "README.md")


def is_users_readme(path: Path) -> bool:
    """Return whether `path` is there and is not a model card bertlab wrote (no CARD_MARK)."""
    if not path.exists():
        return False
    return not (path.is_file() and CARD_MARK in path.read_text(encoding="utf-8", errors="replace"))


_WEIGHT_FILES = (".bin", ".safetensors", ".h5", ".msgpack", ".ckpt", ".index.json")


def _kept_entries(folder: Path, written: set[str]) -> list[Path]:
    """Return what an export replacing `folder` keeps: every entry it does not write itself.

    Weights it did not write (another format, or shards) are refused: beside the new
    model.safetensors they would make the folder two models at once.
    """
    kept = sorted(e for e in folder.iterdir() if e.name not in written)
    weights = [e.name for e in kept if e.name.endswith(_WEIGHT_FILES)]
    if weights:
        raise OutputFolderTakenError(
            f"'{folder}' also holds {', '.join(weights)}: weights that this export would not "
            f"replace; move them out first, or export to a new folder (nothing was written)")
    return kept
