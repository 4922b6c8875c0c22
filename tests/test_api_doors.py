"""Every public name checks its arguments at the door (nothing lost, round 5, item 6).

The walk below calls each callable in `bl.__all__` once with good arguments, then with one
argument at a time replaced by None, an empty list and a value of the wrong type, and allows one
outcome only: a ValueError (`bertlab.errors.BadInput` is one; a wrong type is `BadType`, also a
TypeError) whose message names the argument: what the CLI turns into one `error:` line. An
IndexError, AttributeError, KeyError or bare TypeError from inside, or a bad value accepted,
fails the row.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

import bertlab as bl
from bertlab.errors import BadInput

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    every = bl.load_corpus("bbc")
    docs = [d for topic in ("sport", "tech") for d in every if d.label == topic][:40:2] + \
        [d for topic in ("sport", "tech") for d in every if d.label == topic][1:40:2]
    tok = bl.train_tokenizer(docs, vocab_size=300, cache=False)
    cfg = bl.BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), hidden_size=32,
                               intermediate_size=64, max_position_embeddings=64)
    model = bl.BertForPreTraining(cfg, generator=torch.Generator().manual_seed(0))
    loader = bl.pretraining_loader(docs, tok, split="train", seed=0)
    quick = bl.TrainConfig(max_steps=1, batch_size=32, eval_interval=None, progress=False,
                           log_interval=0, device="cpu")
    fine = bl.FinetuneConfig(epochs=0.1, min_steps=1, max_seq_len=32, device="cpu")
    return {"docs": docs, "tok": tok, "cfg": cfg, "model": model, "loader": loader,
            "quick": quick, "fine": fine, "ids": torch.randint(5, 300, (2, 16)),
            "out": tmp_path_factory.mktemp("doors")}


# name -> (the good call's positional arguments, keywords), built from `parts`; the arguments
# the walk replaces are the positional ones and the keywords named in WALKED.
def good_calls(p) -> dict:
    return {
        "load_corpus": (["bbc"], {}),
        "train_tokenizer": ([p["docs"][:5]], {"vocab_size": 200, "cache": False}),
        "special_ids": ([p["tok"]], {}),
        "mask_tokens": ([p["ids"], p["tok"]], {"mlm_probability": 0.15}),
        "create_nsp_examples": ([p["docs"][:10], p["tok"]], {"max_seq_len": 64, "seed": 0}),
        "pretraining_loader": ([p["docs"][:10], p["tok"]], {"split": "train", "seed": 0}),
        "BertModel": ([p["cfg"]], {}),
        "BertForPreTraining": ([p["cfg"]], {}),
        "BertForSequenceClassification": ([p["cfg"], 2], {}),
        "pretrain": ([p["model"], p["loader"], None, p["quick"]], {"objectives": ("mlm",)}),
        "evaluate": ([p["model"], p["loader"]], {"max_batches": 1}),
        "fill_mask": ([p["model"], p["tok"], "the [MASK] rose"], {"top_k": 3}),
        "load_model": ([str(REPO / "models" / "course-tiny")], {}),
        "save_hf": ([p["model"], p["tok"], str(p["out"] / "hf")], {}),
        "load_hf": ([str(REPO / "models" / "course-tiny")], {}),
        "finetune_classifier": ([p["model"], p["docs"]], {"tokenizer": p["tok"],
                                                           "config": p["fine"]}),
        "linear_probe": ([p["model"], p["docs"]], {"tokenizer": p["tok"]}),
        "compare_downstream": ([p["model"], p["tok"]], {"methods": ["TF-IDF"],
                                                        "config": p["fine"]}),
        "format_table": ([[{"method": "m", "labels_per_class": None, "runs": 1,
                            "accuracy": 0.5, "macro_f1": 0.5}]], {}),
    }


WALKED = {"train_tokenizer": ["vocab_size", "cache"], "mask_tokens": ["mlm_probability"],
          "create_nsp_examples": ["max_seq_len", "seed"], "pretraining_loader": ["seed"],
          "pretrain": ["objectives"], "evaluate": ["max_batches"], "fill_mask": ["top_k"],
          "finetune_classifier": ["tokenizer", "config"], "linear_probe": ["tokenizer"],
          "compare_downstream": ["methods", "config"]}
# Values that are good for an argument, so the walk does not replace it with them.
ALLOWED = {("pretrain", 2): [None], ("evaluate", "max_batches"): [None],
           ("mask_tokens", "mlm_probability"): [None], ("create_nsp_examples", 0): [],
           ("pretraining_loader", 0): [], ("finetune_classifier", "config"): [None],
           ("save_hf", 1): [None], ("compare_downstream", "config"): [None]}
PARAMETERS = {n: list(inspect.signature(getattr(bl, n)).parameters) for n in bl.__all__
              if callable(getattr(bl, n))}
BAD = {"None": None, "empty list": [], "wrong type": 3.5j}
CALLABLES = [n for n in bl.__all__ if callable(getattr(bl, n))
             and n not in ("BertConfig", "TrainConfig", "FinetuneConfig")]  # checked by their own tests


def rows():
    for name in CALLABLES:
        for where in ["positional"] + WALKED.get(name, []):
            for label in BAD:
                yield pytest.param(name, where, label, id=f"{name}-{where}-{label}")


def test_every_callable_name_has_a_good_call(parts):
    assert set(CALLABLES) == set(good_calls(parts))


@pytest.mark.parametrize("name, where, label", list(rows()))
def test_a_bad_argument_is_refused_at_the_door_naming_it(parts, name, where, label):
    args, kwargs = good_calls(parts)[name]
    bad = BAD[label]
    slots = range(len(args)) if where == "positional" else [where]
    for slot in slots:
        if any(bad is v or (bad == [] and v == []) for v in ALLOWED.get((name, slot), ())):
            continue
        call_args, call_kwargs = list(args), dict(kwargs)
        if isinstance(slot, int):
            call_args[slot] = bad
        else:
            call_kwargs[slot] = bad
        with pytest.raises(Exception) as raised:
            getattr(bl, name)(*call_args, **call_kwargs)
        assert isinstance(raised.value, ValueError), (
            f"bl.{name} with argument {slot} = {bad!r} raised "
            f"{type(raised.value).__name__}: {raised.value}")
        named = slot if isinstance(slot, str) else PARAMETERS[name][slot]
        assert named in str(raised.value) or isinstance(raised.value, BadInput), (
            f"bl.{name}'s refusal of {named} = {bad!r} does not name it: {raised.value}")
