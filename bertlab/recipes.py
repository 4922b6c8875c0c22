"""Named pretraining recipes: BERT's own, and the course's, which leaves the plateau in minutes.

A recipe is every choice of a pretraining run that is not the model's size or the data: how
many tokens are masked, whether NSP is trained, dropout, optimizer, learning rate and schedule,
batch and sequence length. It spans three objects (the training loader's masking, the model's
config and `TrainConfig`), so it is written down once here and handed out to each:

    r = recipe("course")
    train = pretraining_loader(docs, tok, split="train", seed=0, options=r.loader_options())
    model = BertForPreTraining(r.model_config("tiny", tok.get_vocab_size()))
    pretrain(model, train, val, r.train_config(max_steps=2000), objectives=r.objectives)

All recipes give a plain `BertForPreTraining` (a valid `transformers` model after `save_hf`):
they differ only in how it is trained. Score any recipe on a validation loader masked BERT's
way (`pretraining_loader`'s defaults), so every run is measured with one yardstick.

Taught in notebooks/05_pretraining.ipynb
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from bertlab.config import TrainConfig
from bertlab.data import LoaderOptions
from bertlab.masking import BERT_MASKING, MaskingConfig
from bertlab.model import BertConfig
from bertlab.pairs import check_objectives, pairs_of

# The TrainConfig fields a recipe sets.
RECIPE_TRAIN_FIELDS = ("batch_size", "optimizer", "lr", "muon_lr", "warmup_fraction", "schedule",
                       "precision")
# The course's yardstick: validation pairs of this many tokens, masked BERT's way (15%,
# 80/10/10, seed 0), whatever recipe trained the model. Every recipe trains positions 0-63.
VAL_SEQ_LEN = 64
# The demo's budget with the course recipe: about 4 minutes on a 2-core CPU (`python -m bertlab demo`).
DEMO_STEPS = 3000


@dataclass(frozen=True)
class Recipe:
    """The settings of one named pretraining recipe; `RECIPES` holds the ones that exist.

    Taught in notebooks/05_pretraining.ipynb
    """

    name: str
    summary: str
    mlm_probability: float  # share of tokens selected as targets (then 80/10/10)
    objectives: tuple[str, ...]  # what it learns (bertlab.pairs): masked LM, + NSP or SOP
    dropout: float  # hidden and attention dropout
    batch_size: int
    max_seq_len: int
    optimizer: str  # "adamw", or "muon" (Muon on the encoder's matrices, AdamW on the rest)
    lr: float  # AdamW's peak learning rate
    muon_lr: float  # Muon's peak learning rate (optimizer="muon")
    warmup_fraction: float
    schedule: str  # decay after warmup: linear, cosine or constant
    pair_draws: int = 1  # cuts of the corpus into pairs; epoch e trains on draw e % pair_draws
    precision: str = "auto"  # TrainConfig.precision: auto is bf16 on CUDA, fp32 elsewhere
    steps: int | None = None  # the step budget the recipe was chosen at (None: the run sets one)

    def __post_init__(self) -> None:
        object.__setattr__(self, "objectives",
                           check_objectives(self.objectives, f"recipe {self.name!r}"))

    @property
    def masking(self) -> MaskingConfig:
        """Return the training loader's masking: `mlm_probability` of the tokens, then 80/10/10."""
        return MaskingConfig(mlm_probability=self.mlm_probability)

    def loader_options(self, **overrides: Any) -> LoaderOptions:
        """Return the training loader's `LoaderOptions`: batch_size, max_seq_len, the masking,
        the pairs its objectives train on and how many draws of them the epochs cycle through;
        overrides (other `LoaderOptions` fields) win."""
        settings = {"batch_size": self.batch_size, "max_seq_len": self.max_seq_len,
                    "masking": self.masking, "pairs": pairs_of(self.objectives),
                    "pair_draws": self.pair_draws}
        return LoaderOptions(**{**settings, **overrides})

    def with_objectives(self, objectives: Sequence[str] | str) -> Recipe:
        """Return this recipe with other objectives (e.g. "mlm,sop"), everything else equal."""
        return replace(self, objectives=check_objectives(objectives))

    def model_config(self, preset: str, vocab_size: int, **overrides: Any) -> BertConfig:
        """Return `BertConfig.preset(preset, vocab_size)` with this recipe's dropout."""
        settings = {"hidden_dropout": self.dropout, "attention_dropout": self.dropout}
        return BertConfig.preset(preset, vocab_size, **{**settings, **overrides})

    def train_config(self, **overrides: Any) -> TrainConfig:
        """Return a `TrainConfig` with this recipe's optimizer, schedule and batch; overrides win.

        Set the budget here (max_steps and/or max_minutes), and anything else the run needs.
        """
        settings = {k: getattr(self, k) for k in RECIPE_TRAIN_FIELDS}
        if self.steps is not None:
            settings["max_steps"] = self.steps
        return TrainConfig(**{**settings, **overrides})

    def to_dict(self) -> dict[str, Any]:
        """Return the settings as a JSON-ready dict; `Recipe.from_dict` reverses it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, settings: dict[str, Any]) -> Recipe:
        """Return the recipe a `to_dict` record holds (records written before objectives were a
        list say `"nsp": true/false`)."""
        settings = dict(settings)
        if "nsp" in settings:
            settings["objectives"] = ("mlm", "nsp") if settings.pop("nsp") else ("mlm",)
        return cls(**{**settings, "objectives": tuple(settings["objectives"])})


RECIPES: dict[str, Recipe] = {
    "bert": Recipe(
        name="bert",
        summary="BERT's recipe (Devlin et al. 2019): 15% of tokens masked 80/10/10, masked LM "
                "+ NSP, dropout 0.1, AdamW with warmup and linear decay; batch, sequence "
                "length, learning rate and warmup (6%, the paper's 1% of 1M steps is 10k) "
                "scaled to a small model on a CPU",
        mlm_probability=BERT_MASKING.mlm_probability, objectives=("mlm", "nsp"), dropout=0.1,
        batch_size=32,
        max_seq_len=128,
        optimizer="adamw", lr=2e-3, muon_lr=0.02, warmup_fraction=0.06, schedule="linear"),
    "course": Recipe(
        name="course",
        summary="the course's recipe for minutes on a CPU, found by measurement "
                "(benchmarks/recipe_search.py): 40% of tokens masked 80/10/10, MLM only, no "
                "dropout, Muon on the encoder's matrices, 16 x 64-token pairs",
        mlm_probability=0.4, objectives=("mlm",), dropout=0.0, batch_size=16,
        max_seq_len=64,
        optimizer="muon", lr=1e-3, muon_lr=0.01, warmup_fraction=0.06, schedule="linear"),
    # Why each setting, with the runs behind it: README.md, "Why the nsp recipe's settings".
    "nsp": Recipe(
        name="nsp",
        summary="the course's recipe with NSP, for an hour on a CPU, found by measurement "
                "(benchmarks/nsp_search.py): 40% of tokens masked 80/10/10, masked LM + NSP, "
                "no dropout, Muon on the encoder's matrices, 32 x 128-token pairs drawn afresh "
                "each epoch (16 draws), 10,000 steps",
        mlm_probability=0.4, objectives=("mlm", "nsp"), dropout=0.0, batch_size=32,
        max_seq_len=128,
        optimizer="muon", lr=1e-3, muon_lr=0.01, warmup_fraction=0.06, schedule="linear",
        pair_draws=16, precision="fp32", steps=10_000),
    # Why each setting: README.md, "Why the gpu recipe's settings".
    "gpu": Recipe(
        name="gpu",
        summary="the course's GPU recipe, for minutes on one GPU: BERT's masked LM + NSP at 15% "
                "masking 80/10/10, pairs drawn afresh each epoch (16 draws), dropout 0.1, "
                "AdamW 1e-3 with warmup and linear decay, 256 x 128-token pairs",
        mlm_probability=BERT_MASKING.mlm_probability, objectives=("mlm", "nsp"), dropout=0.1,
        batch_size=256, max_seq_len=128,
        optimizer="adamw", lr=1e-3, muon_lr=0.02, warmup_fraction=0.06, schedule="linear",
        pair_draws=16),
}


def recipe(name: str) -> Recipe:
    """Return the named recipe: "bert" (the paper's), "course" (this course's, for minutes on a
    CPU), "nsp" (the course's with NSP, for an hour on a CPU) or "gpu" (for minutes on one GPU).
    A recipe is chosen by name, never by the device.

    Taught in notebooks/05_pretraining.ipynb
    """
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {', '.join(RECIPES)}")
    return RECIPES[name]
