"""Checkpoints and trained models on disk: atomic safetensors folders, verified on every load.

A checkpoint is a folder `RUN/checkpoints/step-NNNNNNNN/`: tensors in safetensors, everything
else in JSON, the SHA-256 of every file in digests.json. It is built in a hidden staging folder
and renamed into place (`bertlab.engine.folders.atomic_write_folder`), so a crash, a kill or a full disk
never leaves half of one. Nothing is ever unpickled.

`load_run` rebuilds the model of a pretraining run from its newest checkpoint that verifies
(`bertlab.loading.load_model` takes either a run folder or a Hugging Face folder).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file, save_model
from safetensors.torch import load_model as load_safetensors_model
from tokenizers import Tokenizer
from torch import nn

from bertlab.atomic import is_disk_full
from bertlab.engine.folders import STAGING_SUFFIX, atomic_write_folder
from bertlab.errors import BadInput, flag_of
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.tokenizer import vocab_digest

CHECKPOINT_FORMAT = 2  # 2: digests.json (SHA-256 of every file); 1 is still read, unverified
_CHECKPOINT_NAME = re.compile(r"^step-(\d{8})$")
T = TypeVar("T")


class CorruptCheckpoint(ValueError):
    """A checkpoint whose files do not match the SHA-256 digests written when it was saved
    (`problem` says how), or a folder among the checkpoints that holds no checkpoint."""

    def __init__(self, message: str, problem: str = "") -> None:
        super().__init__(message)
        self.problem = problem or message


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _model_config(model: nn.Module) -> dict | None:
    config = getattr(model, "config", None)
    return config.to_dict() if hasattr(config, "to_dict") else None


# ---------------------------------------------------------------------------------------------
# Saving


def save_checkpoint(path: str | Path, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, *,
                    state: dict | None = None,
                    rng: dict[str, torch.Tensor] | None = None,
                    scaler: torch.amp.GradScaler | None = None) -> Path:
    """Return `path` after writing a complete checkpoint folder there, atomically.

    Files: model.safetensors (tied weights stored once), optimizer.safetensors + its settings in
    state.json, rng.safetensors (random-generator states), state.json (step, data position,
    configs, history: anything JSON-serialisable in `state`) and digests.json (the SHA-256 of
    each file, checked on every load). A crash, a kill or a full disk mid-write leaves the
    previous checkpoints untouched and never a half-written one (`atomic_write_folder`). A full
    disk raises an OSError (ENOSPC) that names the newest complete checkpoint.
    """
    path = Path(path)
    try:
        # The staging folders that killed writers left in checkpoints/ go too (sweep_stale).
        return atomic_write_folder(
            path, lambda folder: _write_checkpoint_files(folder, model, optimizer, state, rng,
                                                         scaler), sweep_stale=True)
    except BaseException as exc:
        if not is_disk_full(exc):
            raise
        kept = _complete_checkpoints(path.parent)
        then = ("then continue the run with --resume (resume=True)" if kept else
                f"then start the run again in an empty folder (delete {path.parent.parent}: "
                f"there is nothing in it to resume)")
        previous = (f"the newest complete checkpoint is still {kept[-1]}" if kept
                    else "no earlier checkpoint exists")
        raise OSError(errno.ENOSPC, f"no space left on the device while writing checkpoint "
                      f"{path}; nothing of it was kept and {previous}. Free some space, "
                      f"{then}") from exc


def _write_checkpoint_files(folder: Path, model: nn.Module,
                            optimizer: torch.optim.Optimizer | None, state: dict | None,
                            rng: dict[str, torch.Tensor] | None,
                            scaler: torch.amp.GradScaler | None) -> None:
    save_model(model, str(folder / "model.safetensors"))
    meta = {"format": CHECKPOINT_FORMAT, "model_class": type(model).__name__,
            "model_config": _model_config(model), **(state or {})}
    if optimizer is not None:
        sd = optimizer.state_dict()
        tensors, scalars = {}, {}
        for index, param_state in sd["state"].items():
            for key, value in param_state.items():
                if torch.is_tensor(value):
                    tensors[f"{index}.{key}"] = value.detach().cpu().contiguous()
                else:
                    scalars[f"{index}.{key}"] = value
        save_file(tensors, str(folder / "optimizer.safetensors"))
        meta["optimizer"] = {"param_groups": sd["param_groups"], "scalars": scalars}
    if scaler is not None and scaler.is_enabled():
        meta["grad_scaler"] = scaler.state_dict()
    if rng:
        save_file({k: v.contiguous() for k, v in rng.items()}, str(folder / "rng.safetensors"))
    (folder / "state.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    digests = {file.name: _sha256(file) for file in sorted(folder.iterdir())}
    (folder / "digests.json").write_text(json.dumps(digests, indent=1), encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Verifying and loading


def _corrupt(path: Path, problem: str) -> CorruptCheckpoint:
    return CorruptCheckpoint(
        f"checkpoint {path} is corrupt: {problem}. Its files were damaged or changed on disk "
        f"after it was saved; use an older checkpoint (load_run and --resume fall back to the "
        f"newest one that verifies)", problem)


def verify_checkpoint(path: str | Path) -> None:
    """Check every file of a checkpoint against the SHA-256 digests written when it was saved.

    Raises `CorruptCheckpoint` (a ValueError) naming the first file that is missing or differs.
    Checkpoints of format 1 (before digests) pass unverified.
    """
    path = Path(path)
    digests_file = path / "digests.json"
    if not digests_file.is_file():
        if not (path / "state.json").is_file():  # an empty or stray step-N folder
            raise _corrupt(path, "it holds neither digests.json nor state.json (a stray or "
                                 "half-written folder, not a checkpoint)")
        if read_checkpoint_state(path, verified=True).get("format") == 1:
            return
        raise _corrupt(path, "digests.json is missing")
    try:
        digests = json.loads(digests_file.read_text(encoding="utf-8"))
        items = sorted(digests.items())
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise _corrupt(path, f"digests.json is not readable ({e})") from None
    unlisted = sorted(f.name for f in path.iterdir() if f.name != "digests.json"
                      and f.name not in digests)
    if not items or unlisted:  # a file no digest covers cannot be verified
        raise _corrupt(path, f"digests.json lists no digest for "
                             f"{', '.join(unlisted) or 'any file'}, so it cannot be verified")
    for name, expected in items:
        file = path / name
        if not file.is_file():
            raise _corrupt(path, f"{name} is missing")
        if _sha256(file) != expected:
            raise _corrupt(path, f"{name} does not match the SHA-256 written when it was saved")


def read_checkpoint_state(path: str | Path, *, verified: bool = False) -> dict:
    """Return the JSON part of a checkpoint (step, configs, history...), checking it is readable.

    Unless `verified`, the checkpoint's digests are checked first (`verify_checkpoint`).
    """
    path = Path(path)
    state_file = path / "state.json"
    if not state_file.is_file():
        raise ValueError(f"{path} is not a bertlab checkpoint (no state.json); pass a folder "
                         f"written by save_checkpoint, e.g. RUN/checkpoints/step-00001000")
    if not verified:
        verify_checkpoint(path)
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _corrupt(path, f"state.json is not valid JSON ({e})") from None
    if state.get("format") not in (1, CHECKPOINT_FORMAT):
        raise ValueError(f"checkpoint {path} has format {state.get('format')!r}; this bertlab "
                         f"reads formats 1 and {CHECKPOINT_FORMAT}")
    return state


# The model settings `pretrain` has a flag for (--hidden-dropout...); the rest come with --preset.
_MODEL_FLAGS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                "max_position_embeddings", "hidden_dropout", "attention_dropout")


def _describe_mismatch(saved: dict, current: dict) -> str:
    keys = sorted(set(saved) | set(current))
    return "; ".join(f"{k}: checkpoint {saved.get(k)!r} vs model {current.get(k)!r}"
                     for k in keys if saved.get(k) != current.get(k))


def load_checkpoint(path: str | Path, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None, *,
                    scaler: torch.amp.GradScaler | None = None, verify: bool = True) -> dict:
    """Return the checkpoint's state dict after loading its weights into `model` (and optimizer).

    Every file is first checked against the digests written at save time (`CorruptCheckpoint`
    if one differs; `verify=False` skips that for a checkpoint just verified); weights that are
    not finite (a run saved after it diverged) are refused. The model must have the
    configuration the checkpoint was trained with; otherwise this raises a ValueError naming
    both values (e.g. vocab_size 8192 vs 4096). Only safetensors and JSON are read: nothing is
    unpickled. Random-generator states come back under "rng" (tensors); the caller decides
    whether to restore them (`train_loop` does, for exact resumes).
    """
    path = Path(path)
    state = read_checkpoint_state(path, verified=not verify)
    current = _model_config(model)
    if state.get("model_class") != type(model).__name__:
        raise ValueError(f"checkpoint {path} holds a {state.get('model_class')}, but the model "
                         f"is a {type(model).__name__}")
    if state.get("model_config") != current:
        saved = state.get("model_config") or {}
        flags = " ".join(f"{flag_of(k)} {saved[k]}" for k in sorted(saved) if k in _MODEL_FLAGS
                         and saved.get(k) != (current or {}).get(k))
        raise ValueError(f"checkpoint {path} was trained with a different model config: "
                         f"{_describe_mismatch(saved, current or {})}. On the command line pass "
                         f"the run's own settings ({flags or 'its --preset'}); in Python build "
                         f"the model from the checkpoint's config "
                         f"(bertlab.loading.load_run); or start a new run")
    try:
        missing, unexpected = load_safetensors_model(
            model, str(path / "model.safetensors"), strict=False,
            device=str(next(model.parameters()).device))
        if missing or unexpected:
            raise ValueError(f"checkpoint {path} does not fit the model: missing {missing}, "
                             f"unexpected {unexpected}")
        if optimizer is not None and "optimizer" not in state:
            raise ValueError(f"checkpoint {path} has no optimizer state; load it without "
                             f"an optimizer, or resume from a training checkpoint")
        flat = load_file(str(path / "optimizer.safetensors")) if optimizer is not None else {}
        rng_file = path / "rng.safetensors"
        rng = load_file(str(rng_file)) if rng_file.exists() else {}
    except (SafetensorError, OSError, RuntimeError) as e:
        raise _corrupt(path, f"its files cannot be read ({e})") from e
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise ValueError(f"checkpoint {path} holds non-finite weights (NaN or inf in {bad[0]}"
                         f"{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}): the run had "
                         f"diverged before it was saved; use an older checkpoint")
    if optimizer is not None:
        _load_optimizer(path, optimizer, flat, state["optimizer"])
    if scaler is not None and "grad_scaler" in state:
        scaler.load_state_dict(state["grad_scaler"])
    state["rng"] = rng
    return state


def _load_optimizer(path: Path, optimizer: torch.optim.Optimizer,
                    tensors: dict[str, torch.Tensor], saved: dict) -> None:
    per_param: dict[int, dict] = {}
    for key, value in [*tensors.items(), *saved["scalars"].items()]:
        index, name = key.split(".", 1)
        per_param.setdefault(int(index), {})[name] = value
    groups = saved["param_groups"]
    for group, live in zip(groups, optimizer.param_groups, strict=False):
        # Keep this machine's kernel choice (a CPU checkpoint may be resumed with fused CUDA).
        for key in ("fused", "foreach", "capturable", "differentiable"):
            if key in live:
                group[key] = live[key]
        if "betas" in group:  # JSON stored the tuple as a list; Muon's groups have none
            group["betas"] = tuple(group["betas"])
    if len(groups) != len(optimizer.param_groups):
        raise ValueError(f"checkpoint {path} has {len(groups)} optimizer parameter groups, "
                         f"the optimizer has {len(optimizer.param_groups)}")
    optimizer.load_state_dict({"state": per_param, "param_groups": groups})


# ---------------------------------------------------------------------------------------------
# The checkpoints of a run


def _complete_checkpoints(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if _CHECKPOINT_NAME.match(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: p.name)


def checkpoint_folders(run_dir: str | Path) -> list[Path]:
    """Return the complete checkpoints of a run, oldest first (half-written ones never count);
    `bertlab.loading.list_checkpoints` is this for the lesson."""
    return _complete_checkpoints(Path(run_dir) / "checkpoints")


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """Return the newest complete checkpoint folder of a run, or None when there is none."""
    found = checkpoint_folders(run_dir)
    return found[-1] if found else None


def latest_verified_checkpoint(run_dir: str | Path) -> Path | None:
    """Return the newest checkpoint of a run whose files match their digests (None: no checkpoint).

    A newer checkpoint that fails verification is skipped with a warning that names it and the
    one used instead. If every checkpoint fails, a CorruptCheckpoint says so, with the newest's
    problem (no older one to use). A checkpoint that a run still writing here deletes meanwhile (keep_checkpoints) is
    gone, not corrupt: the folder is listed again, for the newer one saved before it went.
    """
    for attempt in range(ROTATION_RETRIES + 1):
        found, vanished = checkpoint_folders(run_dir), False
        first_error: CorruptCheckpoint | None = None
        for path in reversed(found):
            try:
                verify_checkpoint(path)
            except (ValueError, OSError) as e:  # CorruptCheckpoint, or files gone with the folder
                if checkpoint_gone(path):
                    vanished = True
                    if attempt < ROTATION_RETRIES:
                        break  # list again: a newer one was saved before this one went
                    continue
                if not isinstance(e, CorruptCheckpoint):
                    raise
                first_error = first_error or e
                continue
            if first_error is not None:
                warnings.warn(f"{first_error} Using {path.name} instead, the newest checkpoint "
                              f"that verifies.", stacklevel=2)
            return path
        else:
            if first_error is not None:
                raise CorruptCheckpoint(
                    f"every checkpoint of {Path(run_dir)} is corrupt ({len(found)}; the newest, "
                    f"{found[-1].name}: {first_error.problem}), so there is none to fall back "
                    f"to: train again in a new folder, or restore the run from a copy")
            if not vanished:
                return None
    return None


def checkpoint_gone(path: Path) -> bool:
    """Return whether checkpoint `path` is gone (deleted by the run that wrote it) rather than
    damaged. A run renames a checkpoint away before deleting it (`remove_checkpoint`), but one
    deleted in place loses its files one by one: a folder that lacks files is given a moment
    to vanish before it is called damaged."""
    for _ in range(_VANISH_CHECKS):
        if not path.is_dir():
            return True
        if all((path / name).is_file() for name in ("state.json", "model.safetensors")) \
                and (path / "digests.json").is_file():
            return False  # whole: what failed is in its files
        time.sleep(_VANISH_WAIT_S)
    return not path.is_dir()


# How long a checkpoint folder that lacks files is watched for vanishing: a deletion takes
# milliseconds.
_VANISH_CHECKS, _VANISH_WAIT_S = 10, 0.05


def remove_checkpoint(path: Path) -> None:
    """Delete an old checkpoint so that a reader never sees it half deleted: it is renamed to
    a hidden name first (one step), then deleted there. The caller holds the run folder's lock,
    so any such hidden folder left beside it came from a writer that died in between: it goes
    too."""
    for left in path.parent.glob(f".*{_REMOVED}"):
        shutil.rmtree(left, ignore_errors=True)
    aside = path.parent / f".{path.name}.{os.getpid()}{_REMOVED}"
    os.replace(path, aside)
    shutil.rmtree(aside, ignore_errors=True)


_REMOVED = f".removed{STAGING_SUFFIX}"  # the end of a checkpoint folder's name while it is deleted


def read_newest(run_dir: str | Path, read: Callable[[Path], T]) -> tuple[Path, T]:
    """Return (checkpoint, read(checkpoint)) for the newest checkpoint of a run that verifies.

    When a run still writing into the folder deletes the one chosen while `read` reads it
    (keep_checkpoints), the newest is chosen again (at most ROTATION_RETRIES times), so that
    everything `read` returns comes from one checkpoint. No checkpoint is a ValueError.
    """
    run_dir = Path(run_dir)
    for attempt in range(ROTATION_RETRIES + 1):
        path = latest_verified_checkpoint(run_dir)
        if path is None:
            raise ValueError(f"run folder {run_dir} has no checkpoint (looked in "
                             f"{run_dir / 'checkpoints'}); train first, e.g. python -m bertlab "
                             f"pretrain")
        try:
            return path, read(path)
        except (OSError, ValueError):  # CorruptCheckpoint, or state.json gone
            if not checkpoint_gone(path) or attempt == ROTATION_RETRIES:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


# ---------------------------------------------------------------------------------------------
# A trained model back from a run folder


def read_run_model(run_dir: str | Path, checkpoint: str | Path | None = None,
                   device: str | torch.device = "cpu") -> tuple[Path, BertForPreTraining]:
    """Return (checkpoint folder, model) of a pretraining run folder: `checkpoint` verified, or
    else the newest checkpoint that verifies (a newer one that fails its digests is skipped, with
    a warning). The model is rebuilt from the config stored in the checkpoint
    (`bertlab.loading.load_run` adds the run's tokenizer)."""
    if checkpoint is not None:
        path = Path(checkpoint)
        return path, _load_run_model(path, verify=True, device=device)
    return read_newest(Path(run_dir), lambda p: _load_run_model(p, False, device))


def check_run_tokenizer(state: dict, tokenizer: Tokenizer, tok_file: Path) -> None:
    """Raise `BadInput` unless `tokenizer` has the vocabulary the checkpoint (its `state`) was
    trained with: a swapped tokenizer of the same size would give every id another word. A
    checkpoint that records no vocabulary (written before it was recorded) passes."""
    recorded = state.get("tokenizer")
    if not recorded:
        return
    now = vocab_digest(tokenizer)[:16]
    if now != recorded:
        raise BadInput(str(tok_file), f"is not the tokenizer this run trained with (its "
                                      f"vocabulary digest is {now}; the checkpoint records "
                                      f"{recorded}), so every id would read as another word",
                       "put back the run's own tokenizer.json (the one its shards or its first "
                       "start saved) and run the command again (nothing was written)")


def load_run_checkpoint(run_dir: str | Path, device: str | torch.device = "cpu",
                        ) -> tuple[BertForPreTraining, dict]:
    """Return the model of a run's newest checkpoint that verifies and that checkpoint's
    state (step, configs, history): both from the one checkpoint, also while a run still
    writing into the folder deletes old ones (what `export-hf` and its model card need)."""
    return read_newest(run_dir, lambda path: (_load_run_model(path, False, device),
                                              read_checkpoint_state(path, verified=True)))[1]


# How often a reader chooses again when a running run rotates its choice away meanwhile.
ROTATION_RETRIES = 3


def _load_run_model(path: Path, verify: bool, device: str | torch.device) -> BertForPreTraining:
    if verify:  # latest_verified_checkpoint has hashed the newest already
        verify_checkpoint(path)
    state = read_checkpoint_state(path, verified=True)
    if state.get("model_class") != "BertForPreTraining" or not state.get("model_config"):
        raise ValueError(f"checkpoint {path} holds a {state.get('model_class')}, not a "
                         f"BertForPreTraining")
    model = BertForPreTraining(BertConfig.from_dict(state["model_config"])).to(device)
    load_checkpoint(path, model, verify=False)
    return model.eval()


def read_run_json(run_dir: str | Path, use: str) -> dict:
    """Return the settings `pretrain` wrote to run_dir/run.json ({} when there is none).

    A run.json that is not valid JSON, not an object, or whose "args" is not an object raises
    a `BadInput` naming the file; `use` says what needs it and what to do (e.g. "--resume reads
    the run's --recipe and --segments there; start a new run in another folder").
    """
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        return {}
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(str(path), f"is not valid JSON ({e})", use) from None
    args = run.get("args", {}) if isinstance(run, dict) else None
    if not isinstance(args, dict):
        found = (f"it holds a JSON {type(run).__name__}" if not isinstance(run, dict) else
                 f"its 'args' is a JSON {type(args).__name__}")
        raise BadInput(str(path), f"is not the JSON object pretrain writes ({found})", use)
    return run
