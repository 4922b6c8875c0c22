"""The pretraining objectives, by name: what each adds to the loss and which pairs it trains on.

A run trains a list of them, `("mlm",)`, `("mlm", "nsp")` (BERT) or `("mlm", "sop")` (ALBERT's
sentence order). Masked LM is always in; at most one pair objective trains the 2-way head on
[CLS] (the model has one). A new objective is a pair builder and one entry in `OBJECTIVES`:
the loader builds its pairs (`bertlab.data.LoaderOptions(pairs=...)`), the loss adds its
term (`bertlab.pretraining.pretraining_loss`), and the CLI accepts it (`--objectives`).

Taught in notebooks/05_pretraining.ipynb
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bertlab.nsp import create_nsp_examples
from bertlab.single import create_single_examples
from bertlab.sop import create_sop_examples


@dataclass(frozen=True)
class ObjectiveSpec:
    """One pretraining objective: the loss term it adds, and the pairs it needs.

    Its loss is the model's summed cross-entropy `loss_sum` (a key of `loss_sums`) over the
    step's `count` (a key of `bertlab.model.loss_counts`). A pair objective has a `pairs`
    builder (documents -> examples, `create_nsp_examples`' signature) and names the parameters
    only it trains (`trains`: prefixes): without it they get no gradient and sit the run out.
    """

    name: str
    summary: str
    loss_sum: str
    count: str
    pairs: Callable | None = None
    trains: tuple[str, ...] = ()


_PAIR_HEAD = ("bert.pooler.", "nsp.")  # the pooler on [CLS] and the 2-way head on it

OBJECTIVES: dict[str, ObjectiveSpec] = {
    "mlm": ObjectiveSpec("mlm", "masked LM: predict the original token at each target",
                         loss_sum="mlm", count="targets"),
    "nsp": ObjectiveSpec("nsp", "next-sentence prediction: does B follow A, or come from "
                         "another document? (BERT)", loss_sum="nsp", count="sequences",
                         pairs=create_nsp_examples, trains=_PAIR_HEAD),
    "sop": ObjectiveSpec("sop", "sentence-order prediction: are A and B in their order, or "
                         "swapped? (ALBERT)", loss_sum="nsp", count="sequences",
                         pairs=create_sop_examples, trains=_PAIR_HEAD),
}
PAIRS_FOR_MLM_ONLY = "nsp"  # masked LM alone still reads [CLS] A [SEP] B [SEP] pairs, built as NSP's
# Masked LM alone may instead read single segments, [CLS] text [SEP] (`bertlab.single`): the
# input for text whose documents have one sentence each, where no pair exists.
SINGLE = "single"
INPUTS = ("pairs", SINGLE)  # what --segments chooses between


def check_objectives(objectives: Sequence[str] | str, where: str = "objectives") -> tuple[str, ...]:
    """Return `objectives` as a tuple of names after checking it is a list this model can train.

    A string is split at commas ("mlm,sop"). Refused, naming `where` and the fix: an unknown
    name, a repeat, a list without "mlm", or two pair objectives (the model has one pair head).
    """
    names = tuple(n.strip() for n in objectives.split(",")) if isinstance(objectives, str) \
        else tuple(objectives)
    unknown = [n for n in names if n not in OBJECTIVES]
    if unknown:
        raise ValueError(f"{where}: unknown objective {unknown[0]!r}; choose from "
                         f"{', '.join(OBJECTIVES)} (e.g. mlm,nsp)")
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: {','.join(names)} names an objective twice; list each once")
    if "mlm" not in names:
        raise ValueError(f"{where}: {','.join(names) or 'nothing'} leaves out mlm; every run "
                         f"trains masked LM (add mlm, e.g. mlm,{','.join(names) or 'nsp'})")
    pairs = [n for n in names if OBJECTIVES[n].pairs is not None]
    if len(pairs) > 1:
        raise ValueError(f"{where}: {' and '.join(pairs)} both train the one pair head on [CLS]; "
                         f"choose one of them")
    return names


def pair_objective(objectives: Sequence[str]) -> str | None:
    """Return the pair objective of a (checked) list ("nsp", "sop"), or None for masked LM only."""
    return next((n for n in objectives if OBJECTIVES[n].pairs is not None), None)


def pairs_of(objectives: Sequence[str], segments: str = "pairs") -> str:
    """Return how the examples of a run with these objectives are built: "nsp", "sop" (keys of
    OBJECTIVES) or "single", for masked LM alone with `segments="single"`."""
    if segments not in INPUTS:
        raise ValueError(f"segments={segments!r} is not known; choose from {', '.join(INPUTS)}")
    pair = pair_objective(objectives)
    if segments == SINGLE:
        if pair is not None:
            raise ValueError(f"{pair} trains on sentence pairs, so its input cannot be single "
                             f"segments; train masked LM alone (objectives mlm) on single "
                             f"segments, or keep pairs")
        return SINGLE
    return pair or PAIRS_FOR_MLM_ONLY


def pair_builder(pairs: str) -> Callable:
    """Return the function that builds the examples of `pairs` ("nsp", "sop" or "single")."""
    if pairs == SINGLE:
        return create_single_examples
    if pairs not in OBJECTIVES or OBJECTIVES[pairs].pairs is None:
        choices = ", ".join([*(n for n, spec in OBJECTIVES.items() if spec.pairs is not None),
                             SINGLE])
        raise ValueError(f"pairs={pairs!r} is not a pair objective; choose from {choices}")
    return OBJECTIVES[pairs].pairs
