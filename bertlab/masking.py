"""Masked-LM masking: pick prediction targets, perturb them 80/10/10, label the originals.

BERT's recipe has three steps, one function each, and the "15%" belongs to the first one only:

1. `select_targets`: about 15% of the maskable tokens become prediction targets;
2. `perturb_targets`: each target's input -> [MASK] 80%, a random token 10%, left unchanged 10%;
3. `label_targets`: the original id at every target, -100 (ignored by the loss) everywhere else.

Read top to bottom: `IGNORE_INDEX`, the -100 label that the data, the model and the metrics
share; the random draws (`example_seed`, `Draws`), which give a row the same mask whatever batch
or process it lands in; `MaskingConfig`, every setting with BERT's values; the three steps, and
`mask_tokens`, which runs them on a whole batch with tensor operations; `mask_tokens_reference`,
the plain Python loop the course starts from; and the word ids that whole-word masking reads
(`word_ids_from_encoding`).

Taught in notebooks/02_masked_lm.ipynb.
"""

from __future__ import annotations

import enum
import functools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from tokenizers import Encoding, Tokenizer

from bertlab.tokenizer import MASK, SPECIAL_TOKENS, SpecialIds, special_ids

# --------------------------------------------------------------------------------------------
# The label of what is not predicted
#
# A label of -100 marks a position (or a pair) that is not predicted and adds nothing to the loss:
# PyTorch's cross-entropy skips it by default (`ignore_index=-100`), and `transformers` uses the
# same value. Masking writes it; the data, the model and the metrics import it from here.

IGNORE_INDEX = -100  # the label of a position that is not predicted (cross-entropy's default)


# --------------------------------------------------------------------------------------------
# Counter-based random draws: splitmix64 hashes of (row seed, position, kind of draw)
#
# A row's draws depend only on its seed, never on which batch, worker, process or device the row
# lands in, so masks are reproducible however the data is split. `example_seed` builds the row
# seeds; `Draws` hands `mask_tokens` its random numbers, from a `torch.Generator` or from the hash.

# splitmix64 (Steele, Lea & Flood 2014) turns a counter into 64 well-mixed bits. Multiplication on
# int64 tensors wraps modulo 2**64, which is exactly the arithmetic the mix needs; right shifts on
# signed tensors are arithmetic, so each shift is masked to behave as a logical one.

_MASK64 = (1 << 64) - 1


def _signed64(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


_GAMMA = _signed64(0x9E3779B97F4A7C15)  # splitmix64's counter increment (golden ratio)
_MIX1 = _signed64(0xBF58476D1CE4E5B9)
_MIX2 = _signed64(0x94D049BB133111EB)
_LOW63 = (1 << 63) - 1  # a seed's bits: non-negative as an int64
_LOW53 = (1 << 53) - 1
_UNIT53 = 1.0 / (1 << 53)  # a 53-bit integer k times this is the uniform k / 2**53
_LOW32 = (1 << 32) - 1
_KIND_BITS = 3  # each position owns 2**3 stream slots: up to 8 independent kinds of draw


def _mix_tensor(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ ((z >> 30) & ((1 << 34) - 1))) * _MIX1
    z = (z ^ ((z >> 27) & ((1 << 37) - 1))) * _MIX2
    return z ^ ((z >> 31) & ((1 << 33) - 1))


def _mix_numpy(z: np.ndarray) -> np.ndarray:
    # The same splitmix64 finalizer on uint64 arrays, whose shifts are logical and whose products
    # wrap: fewer and cheaper steps than on int64 tensors, the same numbers.
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def example_seed(seed: int, epoch_or_dupe: int,
                 index: int | np.ndarray | torch.Tensor) -> int | np.ndarray | torch.Tensor:
    """Return the row seed of example `index` for pass `epoch_or_dupe` of a run seeded with `seed`.

    Pass the result as `mask_tokens(..., row_seeds=...)`. Dynamic masking (RoBERTa): use the epoch,
    so every epoch gets a fresh mask, identical on any number of processes or workers. Static
    masking with a dupe factor (Google's `create_pretraining_data.py`): use the copy number
    0..mask_copies-1 and keep it fixed across epochs. `index` may be an int (returns an int), an
    integer numpy array (returns an int64 array) or a LongTensor (returns a LongTensor): a whole
    batch's seeds in one call, the same values. Seeds are non-negative.

    Taught in notebooks/02_masked_lm.ipynb.
    """
    # Chained splitmix64 steps: each input moves the state along the golden-ratio counter. numpy's
    # uint64 arrays wrap modulo 2**64 (arrays, not scalars, which warn when they overflow).
    inner = _mix_numpy(np.array([(seed * _GAMMA + _GAMMA) & _MASK64], dtype=np.uint64))
    inner = _mix_numpy(inner + np.uint64(((epoch_or_dupe + 1) * _GAMMA) & _MASK64))  # (1,)
    if isinstance(index, torch.Tensor):
        if index.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"example_seed: index has dtype {index.dtype}; pass integer indices")
        start = int(inner.view(np.int64)[0])
        return _mix_tensor(start + (index.long() + 1) * _GAMMA) & _LOW63
    indices = np.atleast_1d(np.asarray(index, dtype=np.int64)).view(np.uint64)  # (n,)
    seeds = _mix_numpy(inner + (indices + np.uint64(1)) * np.uint64(_GAMMA & _MASK64))
    seeds = seeds.view(np.int64) & _LOW63
    return int(seeds[0]) if np.ndim(index) == 0 else seeds


class Draws:
    """The random numbers of one `mask_tokens` call: from a generator, or hashed from row seeds.

    Keys are uniforms in [0, 1): float32 from the generator, or 53-bit integers k (standing for
    k / 2**53) from the hash, which `grid` compares with a probability in their own units,
    exactly. In hash mode, draw `kind` (0..7) at index j of row i is output number
    j * 8 + kind + 1 of the splitmix64 stream that starts at row i's mixed seed. On the CPU the
    hash runs on numpy uint64 arrays (about three times cheaper per step at batch sizes); on
    other devices on int64 tensors (same numbers).
    """

    def __init__(self, generator: torch.Generator | None, row_seeds: torch.Tensor | None,
                 device: torch.device, use_numpy: bool | None = None) -> None:
        self.generator, self.device = generator, device
        self.hashed = row_seeds is not None
        self.last = 1 << 62 if self.hashed else 2.0  # sorts after every key
        self.numpy = device.type == "cpu" if use_numpy is None else use_numpy
        self._starts: dict[int, Any] = {}
        if self.hashed:
            if self.numpy:
                self.state = _mix_numpy(row_seeds.cpu().contiguous().numpy().view(np.uint64))
            else:
                self.state = _mix_tensor(row_seeds)  # (B,)

    def _hash(self, kind: int, length: int, flat: torch.Tensor | None = None) -> Any:
        """64 hashed bits at every (row, index) of (B, L), or at the listed flat positions only."""
        if length not in self._starts:  # the stream position of kind 0 at every (row, index)
            if self.numpy:
                index = np.arange(length, dtype=np.uint64)
                offset = ((index << np.uint64(_KIND_BITS)) + np.uint64(1)) * np.uint64(_GAMMA & _MASK64)
            else:
                index = torch.arange(length, device=self.device)
                offset = ((index << _KIND_BITS) + 1) * _GAMMA  # (L,)
            self._starts[length] = self.state[:, None] + offset[None, :]  # (B, 1) + (1, L)
        start = self._starts[length]
        if self.numpy:
            if flat is not None:
                start = start.reshape(-1)[flat.cpu().numpy()]
            return _mix_numpy(start + np.uint64((kind * _GAMMA) & _MASK64))
        if flat is not None:
            start = start.take(flat)
        return _mix_tensor(start + _signed64(kind * _GAMMA))

    def grid(self, kind: int, batch: int, length: int,
             below: float | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Keys for every (row, index), shape (B, L), and where they fall below the probability
        `below` (None when not asked)."""
        if not self.hashed:
            keys = torch.rand((batch, length), generator=self.generator, device=self.device)
            return keys, None if below is None else keys < below
        z = self._hash(kind, length)
        if self.numpy:
            keys = torch.from_numpy((z >> np.uint64(11)).view(np.int64)).to(self.device)
        else:
            keys = (z >> 11) & _LOW53
        # k / 2**53 < p exactly when k < ceil(p * 2**53): scaling by 2**53 loses nothing.
        return keys, None if below is None else keys < math.ceil(below * (1 << 53))

    def uniform(self, keys: torch.Tensor) -> torch.Tensor:
        """The keys as float64 uniforms in [0, 1)."""
        return keys.double() if keys.is_floating_point() else keys.double() * _UNIT53

    def at(self, kind: int, flat: torch.Tensor, length: int,
           n: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A uniform in [0, 1) and an integer in [0, n) at each listed flat position of (B, L).

        Both come from one 64-bit hash: the uniform from its high 32 bits, the integer from
        its low 32 bits by multiply-shift (off from uniform by at most n / 2**32 per value).
        """
        if not self.hashed:
            u = torch.rand(flat.shape, generator=self.generator, device=self.device)
            if n is None:
                return u, None
            return u, torch.randint(n, flat.shape, generator=self.generator, device=self.device)
        z = self._hash(kind, length, flat)  # (k,)
        if self.numpy:
            u = torch.from_numpy((z >> np.uint64(32)).astype(np.float64) * (1.0 / (1 << 32)))
            if n is None:
                return u.to(self.device), None
            pick = ((z & np.uint64(_LOW32)) * np.uint64(n)) >> np.uint64(32)
            return u.to(self.device), torch.from_numpy(pick.view(np.int64)).to(self.device)
        u = ((z >> 32) & _LOW32).double() * (1.0 / (1 << 32))
        return u, None if n is None else ((z & _LOW32) * n) >> 32


# --------------------------------------------------------------------------------------------
# Masking: the settings, the three steps, and mask_tokens

SELECTIONS = ("bernoulli", "exact")
# Kinds of random draw: each gets its own counter stream (see `Draws`), so they are independent.
_SELECT, _DECIDE, _WORD_SELECT, _WORD_DECIDE = range(4)


class Decision(enum.IntEnum):
    """What masking did at one position (returned by `mask_tokens(..., return_decisions=True)`).

    Taught in notebooks/02_masked_lm.ipynb.
    """

    NOT_TARGET = 0  # not predicted: input unchanged, label -100
    MASK = 1  # target, input replaced by [MASK]
    RANDOM = 2  # target, input replaced by a random non-special token (may equal the original)
    KEEP = 3  # target, input left unchanged


# --- input checking ---------------------------------------------------------------------------------


def _check_probability(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name}={value!r} is not a probability; pass a number in [0, 1]")
    return float(value)


@dataclass(frozen=True)
class MaskingConfig:
    """Every masked-LM masking setting, with BERT's values: one object for `mask_tokens` and its
    steps, the collator, the loaders and the recipes.

    `mlm_probability` of the maskable tokens become targets (`selection`: "bernoulli" per token,
    or "exact" counts; at most `max_predictions` per sequence); a target becomes [MASK] with
    `mask_replace_prob`, a random token with `random_replace_prob`, and stays itself otherwise;
    `per_word_decision` shares one decision among a whole word's pieces. Checked when built: a
    bad setting raises ValueError naming it and the fix.
    """

    mlm_probability: float = 0.15
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1
    selection: str = "bernoulli"
    max_predictions: int | None = None
    per_word_decision: bool = True

    def __post_init__(self) -> None:
        for name in ("mlm_probability", "mask_replace_prob", "random_replace_prob"):
            object.__setattr__(self, name, _check_probability(name, getattr(self, name)))
        if self.mask_replace_prob + self.random_replace_prob > 1.0 + 1e-12:
            raise ValueError(f"mask_replace_prob + random_replace_prob = "
                             f"{self.mask_replace_prob + self.random_replace_prob:g} exceeds 1; "
                             f"the unchanged share is 1 minus their sum (e.g. 0.8 and 0.1 leave "
                             f"0.1)")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection={self.selection!r} is unknown; use one of "
                             f"{', '.join(SELECTIONS)}")
        limit = self.max_predictions
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 1):
            raise ValueError(f"max_predictions={limit!r}; pass a positive int or None")
        if not isinstance(self.per_word_decision, bool):
            raise ValueError(f"per_word_decision={self.per_word_decision!r}; pass True or False")


BERT_MASKING = MaskingConfig()  # 15% of the tokens, then 80/10/10
_MASKING_FIX = "pass a bertlab.masking.MaskingConfig, e.g. MaskingConfig(mlm_probability=0.4)"


def _as_batch(input_ids: Any, selected: Any = None) -> tuple[torch.Tensor, bool]:
    if not isinstance(input_ids, torch.Tensor):
        raise ValueError(f"input_ids is a {type(input_ids).__name__}; pass a LongTensor of shape "
                         f"(T,) or (B, T) (e.g. torch.tensor(ids))")
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids has dtype {input_ids.dtype}; token ids must be integers "
                         f"(use .long())")
    if selected is not None and (getattr(selected, "dtype", None) != torch.bool
                                 or selected.shape != input_ids.shape):
        raise ValueError(f"selected must be a bool tensor shaped like input_ids, "
                         f"{tuple(input_ids.shape)} (what select_targets returns)")
    if input_ids.dim() == 1:
        return input_ids[None, :], True
    if input_ids.dim() == 2:
        return input_ids, False
    raise ValueError(f"input_ids has shape {tuple(input_ids.shape)}; pass (T,) for one sequence "
                     f"or (B, T) for a batch (reshape to (-1, T) first)")


class _Prepared(NamedTuple):
    """The checked arguments every step takes: the ids as (B, T), whether they came as one (T,)
    sequence, the shape they came in (for messages), the vocabulary, the settings and the
    randomness."""

    ids: torch.Tensor
    squeeze: bool
    shape: tuple[int, ...]
    specials: SpecialIds
    masking: MaskingConfig
    draws: Draws


def _prepare(input_ids: Any, tokenizer_or_special_ids: Any, masking: object,
             generator: torch.Generator | None, row_seeds: Any, selected: Any = None) -> _Prepared:
    # The arguments every step takes: the ids (and a selection), the vocabulary, the settings
    # (None: BERT's; a MaskingConfig checked its own values when it was built), the randomness.
    if masking is None:
        masking = BERT_MASKING
    elif not isinstance(masking, MaskingConfig):
        raise ValueError(f"masking={masking!r}; {_MASKING_FIX}")
    ids, squeeze = _as_batch(input_ids, selected)  # (B, T); squeeze: input_ids was one (T,)
    specials = (tokenizer_or_special_ids if isinstance(tokenizer_or_special_ids, SpecialIds)
                else special_ids(tokenizer_or_special_ids))
    if generator is not None and row_seeds is not None:
        raise ValueError("pass either generator= or row_seeds=, not both")
    if row_seeds is None:
        return _Prepared(ids, squeeze, tuple(input_ids.shape), specials, masking,
                         Draws(generator, None, ids.device))
    if isinstance(row_seeds, (int, list, tuple)) and not isinstance(row_seeds, bool):
        row_seeds = torch.atleast_1d(torch.tensor(row_seeds, dtype=torch.int64))  # an int: (1,)
    if not isinstance(row_seeds, torch.Tensor) or row_seeds.dtype not in (torch.int64, torch.int32):
        raise ValueError("row_seeds must be a LongTensor of shape (B,) (one seed per row; see "
                         "bertlab.masking.example_seed)")
    if squeeze and row_seeds.dim() == 0:
        row_seeds = row_seeds[None]
    if tuple(row_seeds.shape) != (len(ids),):
        raise ValueError(f"row_seeds has shape {tuple(row_seeds.shape)} but input_ids has "
                         f"{len(ids)} row(s); pass one seed per row, shape ({len(ids)},)")
    return _Prepared(ids, squeeze, tuple(input_ids.shape), specials, masking,
                     Draws(None, row_seeds.to(ids.device, torch.int64), ids.device))


def _as_word_ids(word_ids: Any, shape: tuple[int, int], squeeze: bool,
                 device: torch.device) -> torch.Tensor:
    if isinstance(word_ids, torch.Tensor):
        if word_ids.is_floating_point() or word_ids.dtype == torch.bool:
            raise ValueError(f"word_ids has dtype {word_ids.dtype}; pass integer word indices")
        tensor = word_ids[None, :] if squeeze and word_ids.dim() == 1 else word_ids
    else:
        rows = [word_ids] if squeeze else list(word_ids)
        if len(rows) != shape[0] or any(len(row) != shape[1] for row in rows):
            lengths = sorted({len(row) for row in rows})
            raise ValueError(f"word_ids has {len(rows)} row(s) of length(s) {lengths} but input_ids"
                             f" has shape {shape}; pass one word index (or None) per token")
        tensor = torch.tensor([[-1 if w is None else w for w in row] for row in rows],
                              dtype=torch.int64)
    if tuple(tensor.shape) != shape:
        raise ValueError(f"word_ids has shape {tuple(word_ids.shape)} but input_ids has shape "
                         f"{shape}; pass one word index per token (-1 for specials and padding)")
    return tensor.to(device=device, dtype=torch.int64)


class _Vocabulary(NamedTuple):
    """What masking needs to know of a vocabulary, as tensors on the batch's device."""

    maskable: torch.Tensor  # (V,) bool, False at the special ids: maskable[ids] marks targets-to-be
    replacements: torch.Tensor  # (V - k,) the non-special ids in order: a uniform index into it
    #                             is a uniform random replacement
    first_word: int | None  # k when the specials are ids 0..k-1 (bertlab's): then ids >= k are
    #                         the maskable ones, one comparison instead of a lookup


@functools.lru_cache(maxsize=64)
def _vocabulary(specials: SpecialIds, device: torch.device) -> _Vocabulary:
    # Built once per vocabulary and device: the step only looks ids up in it.
    taken = sorted(set(specials.all))
    maskable = torch.ones(specials.vocab_size, dtype=torch.bool)
    maskable[taken] = False
    first_word = len(taken) if taken == list(range(len(taken))) else None
    return _Vocabulary(maskable.to(device), maskable.nonzero().squeeze(1).to(device), first_word)


# --- selection ----------------------------------------------------------------------------------------


def _ranks(keys: torch.Tensor, eligible: torch.Tensor, last: float | int) -> torch.Tensor:
    """Rank (0 = smallest key) of each eligible entry within its row; ineligible ones rank last."""
    order = keys.masked_fill(~eligible, last).argsort(dim=1)  # (B, L)
    positions = torch.arange(keys.shape[1], device=keys.device).expand_as(order)
    return torch.empty_like(order).scatter_(1, order, positions)


def _exact_budget(count: torch.Tensor, mlm_probability: float,
                  max_predictions: int | None) -> torch.Tensor:
    # Google's rule, on maskable tokens: min(max_predictions, max(1, round(n * p))). torch.round
    # rounds halves to even like Python 3's round; float64 gives the same product Python does.
    budget = torch.round(count.to(torch.float64) * mlm_probability).long().clamp(min=1)
    if max_predictions is not None:
        budget = budget.clamp(max=max_predictions)
    return torch.where(count > 0, budget, 0)


def _ensure_one(selected: torch.Tensor, eligible: torch.Tensor, keys: torch.Tensor,
                last: float | int) -> torch.Tensor:
    """Give every row with an eligible entry but no selection the eligible entry of smallest key."""
    if bool(selected.any(dim=1).all()):  # the usual case, checked cheaply
        return selected
    empty = eligible.any(dim=1) & ~selected.any(dim=1)  # (B,)
    if not bool(empty.any()):
        return selected
    # Given that nothing was picked, the eligible keys are i.i.d. uniform above the threshold, so
    # the smallest one sits at a uniformly random eligible position.
    first = keys.masked_fill(~eligible, last).argmin(dim=1)  # (B,)
    forced = torch.zeros_like(selected)
    forced[empty, first[empty]] = True
    return selected | forced


def _select_words(words: torch.Tensor, maskable: torch.Tensor, masking: MaskingConfig,
                  draws: Draws) -> torch.Tensor:
    """Selected words (B, W) given each token's word (B, T, all >= 0), never splitting one."""
    max_predictions = masking.max_predictions
    batch, n_words = len(words), (int(words.max()) + 1 if words.numel() else 1)
    word_length = torch.zeros((batch, n_words), dtype=torch.int64, device=words.device)
    word_length.scatter_add_(1, words, maskable.long())  # maskable tokens per word, (B, W)
    bernoulli = masking.selection == "bernoulli"
    word_keys, under = draws.grid(_WORD_SELECT, batch, n_words,  # (B, W) each
                                  below=masking.mlm_probability if bernoulli else None)
    n_maskable = maskable.sum(dim=1)  # (B,)
    candidate = word_length > 0  # (B, W)
    if bernoulli:
        chosen = under & candidate
        if max_predictions is None:
            return _ensure_one(chosen, candidate, word_keys, draws.last)
        budget = torch.full_like(n_maskable, max_predictions)
    else:
        chosen = candidate
        budget = _exact_budget(n_maskable, masking.mlm_probability, max_predictions)
    # Google's greedy fill: visit the chosen words in random order, take a word when its tokens
    # still fit in the token budget, skip it otherwise. The loop runs over word ranks, not rows.
    order = word_keys.masked_fill(~chosen, draws.last).argsort(dim=1)  # (B, W)
    length = word_length.gather(1, order).masked_fill(~chosen.gather(1, order), 0)
    taken = torch.zeros_like(chosen)
    total = torch.zeros_like(budget)
    for rank in range(order.shape[1]):
        fits = (length[:, rank] > 0) & (total + length[:, rank] <= budget)
        total = total + torch.where(fits, length[:, rank], 0)
        taken[:, rank] = fits
    selected = torch.zeros_like(chosen).scatter_(1, order, taken)
    # A budget smaller than every word would leave the row without a target: take its first word.
    return _ensure_one(selected, chosen, word_keys, draws.last)


# --- the public functions: one per step, and mask_tokens, which runs the three ----------------------


def select_targets(
    input_ids: torch.Tensor, tokenizer_or_special_ids: Tokenizer | SpecialIds,
    masking: MaskingConfig = BERT_MASKING, *,
    word_ids: torch.Tensor | Sequence[Any] | None = None,
    attention_mask: torch.Tensor | None = None, generator: torch.Generator | None = None,
    row_seeds: torch.Tensor | Sequence[int] | int | None = None,
) -> torch.Tensor:
    """Return a bool tensor shaped like `input_ids`, True at the prediction targets (step 1).

    `masking` (a `MaskingConfig`) gives `mlm_probability`, `selection` and `max_predictions`.

    Targets come from the maskable positions: every position except the special tokens ([PAD],
    [UNK], [CLS], [SEP], [MASK]) and, when `attention_mask` is given, its zeros.
    `selection="bernoulli"`: each one independently with `mlm_probability` (what transformers
    does). `selection="exact"`: exactly min(max_predictions, max(1, round(n * p))) of the n
    maskable tokens per sequence. Google's `create_pretraining_data.py` uses the same rule but
    counts [CLS] and [SEP] in n, so its realised rate over maskable tokens is a little higher
    (0.152-0.164 at 128 tokens); `round` halves to even, as Python 3 does. `max_predictions` also
    caps the Bernoulli count (the kept targets are a uniform subset).

    [UNK] is never a target: its "original" carries no information to predict (transformers skips
    it too; Google's code does not). A sequence with at least one maskable token always gets at
    least one target when `mlm_probability > 0` (a uniformly chosen one if the draw gave none): a
    row without targets teaches nothing, and a batch of such rows gives a NaN loss
    (transformers#16711). Under Bernoulli selection that raises the expected rate over n maskable
    tokens from p to p + (1 - p)**n / n: +0.034 at n = 8, under 1e-6 beyond n = 64. Rate 0 selects
    nothing.

    Whole-word masking: pass `word_ids` (per sequence, one word index per token and None for
    specials and padding; a list of lists for a batch, or a LongTensor with -1 for None; see
    `word_ids_from_encoding`). Words are then selected as a whole: Bernoulli per word, or, in
    exact mode, Google's greedy fill of the token budget in random word order (a word that does
    not fit is skipped, so a word is never split; if no word fits, one word is taken anyway).
    Positions with word id -1 are never selected. `generator` and `row_seeds` as in `mask_tokens`.

    Taught in notebooks/02_masked_lm.ipynb.
    """
    batch = _prepare(input_ids, tokenizer_or_special_ids, masking, generator, row_seeds)
    return _select(batch, word_ids, attention_mask)


def _select(prepared: _Prepared, word_ids: Any,
            attention_mask: torch.Tensor | None) -> torch.Tensor:
    # Step 1 on checked arguments (`_prepare`).
    ids, squeeze, _, specials, masking, draws = prepared
    mlm_probability, max_predictions = masking.mlm_probability, masking.max_predictions
    (batch, length), device = ids.shape, ids.device
    if ids.numel():
        low, high = torch.aminmax(ids)
        if int(low) < 0 or int(high) >= specials.vocab_size:
            raise ValueError(f"input_ids holds ids from {int(low)} to {int(high)} but the "
                             f"vocabulary has {specials.vocab_size} tokens; pass the tokenizer "
                             f"that produced these ids")
    vocabulary = _vocabulary(specials, device)
    maskable = (ids >= vocabulary.first_word if vocabulary.first_word is not None
                else vocabulary.maskable[ids])  # (B, T)
    if attention_mask is not None:
        attention = attention_mask[None, :] if squeeze and attention_mask.dim() == 1 else attention_mask
        if tuple(attention.shape) != (batch, length):
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)} but "
                             f"input_ids has shape {prepared.shape}; pass the mask of the same "
                             f"batch")
        maskable.logical_and_(attention)
    if mlm_probability == 0.0:
        selected = torch.zeros_like(maskable)
    elif word_ids is None and masking.selection == "exact":  # the budget's worth of smallest keys
        keys, _ = draws.grid(_SELECT, batch, length)  # (B, T)
        budget = _exact_budget(maskable.sum(dim=1), mlm_probability, max_predictions)
        selected = _ranks(keys, maskable, draws.last) < budget[:, None]
    elif word_ids is None:  # a key below p
        keys, under = draws.grid(_SELECT, batch, length, below=mlm_probability)  # (B, T) each
        selected = under & maskable
        if max_predictions is not None:
            selected &= _ranks(keys, maskable, draws.last) < max_predictions
        selected = _ensure_one(selected, maskable, keys, draws.last)
    else:
        words = _as_word_ids(word_ids, (batch, length), squeeze, device)  # (B, T), -1 = none
        maskable &= words >= 0
        words = words.clamp(min=0)  # the -1s are not maskable: any word index will do
        chosen = _select_words(words, maskable, masking, draws)
        selected = chosen.gather(1, words) & maskable  # (B, W) -> (B, T)
    return selected[0] if squeeze else selected  # (1, T) -> (T,) for one sequence


def perturb_targets(
    input_ids: torch.Tensor, selected: torch.Tensor,
    tokenizer_or_special_ids: Tokenizer | SpecialIds, masking: MaskingConfig = BERT_MASKING, *,
    word_ids: torch.Tensor | Sequence[Any] | None = None,
    generator: torch.Generator | None = None,
    row_seeds: torch.Tensor | Sequence[int] | int | None = None, return_decisions: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Return `masked_input_ids`: `input_ids` with each target of `selected` perturbed (step 2).

    `selected` is what `select_targets` returns; `masking` (a `MaskingConfig`) gives the shares.
    A target becomes [MASK] with `mask_replace_prob`, a token drawn uniformly from the
    non-special vocabulary with `random_replace_prob` (Google and transformers may draw special
    ones), or stays unchanged; other positions are left alone. With `word_ids` (as in
    `select_targets`) and `per_word_decision=True` all pieces of a word get the same decision;
    `False` decides per piece, as Google does. `generator` and `row_seeds` as in `mask_tokens`;
    `return_decisions=True` returns `(masked_input_ids, decisions)`, as it does.

    Taught in notebooks/02_masked_lm.ipynb.
    """
    batch = _prepare(input_ids, tokenizer_or_special_ids, masking, generator, row_seeds, selected)
    return _perturb(batch, selected, word_ids, return_decisions)


def _perturb(prepared: _Prepared, selected: torch.Tensor, word_ids: Any,
             return_decisions: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    # Step 2 on checked arguments (`_prepare`).
    squeeze, specials, masking, draws = (prepared.squeeze, prepared.specials, prepared.masking,
                                         prepared.draws)
    mask_replace_prob, random_replace_prob = masking.mask_replace_prob, masking.random_replace_prob
    ids = prepared.ids.contiguous()  # flat positions below index the row-major layout
    batch, length = ids.shape
    replacements = _vocabulary(specials, ids.device).replacements  # what a random token may be
    # Only the k targets (about 15% of the batch) are touched, as flat (k,) tensors.
    flat = selected.reshape(-1).nonzero().squeeze(1)  # (k,) positions in the flattened (B, T)
    original = ids.take(flat)
    decide, pick = draws.at(_DECIDE, flat, length,
                            len(replacements) if random_replace_prob > 0.0 else None)
    if word_ids is not None and masking.per_word_decision:  # a word's pieces share one decision
        words = _as_word_ids(word_ids, (batch, length), squeeze, ids.device)  # (B, T), -1 = none
        n_words = max(int(words.max()) + 1, 1) if words.numel() else 1
        word_flat = (flat // length) * n_words + words.take(flat).clamp(min=0)  # (k,) in (B, W)
        keys, _ = draws.grid(_WORD_DECIDE, batch, n_words)  # (B, W)
        decide = draws.uniform(keys.take(word_flat))
    # decide in [0, m): [MASK]; in [m, m + r): a random token; in [m + r, 1): kept.
    new = original
    if pick is not None:
        pick = replacements[pick].to(ids.dtype)
        new = torch.where(decide < mask_replace_prob + random_replace_prob, pick, original)
    new = torch.where(decide < mask_replace_prob, specials.mask, new)
    masked = ids.put(flat, new)
    if not return_decisions:
        return masked[0] if squeeze else masked  # (1, T) -> (T,) for one sequence
    decision = torch.full_like(original, int(Decision.KEEP), dtype=torch.int8)
    if pick is not None:
        decision[decide < mask_replace_prob + random_replace_prob] = int(Decision.RANDOM)
    decision[decide < mask_replace_prob] = int(Decision.MASK)
    decisions = torch.zeros_like(ids, dtype=torch.int8).put_(flat, decision)
    return (masked[0], decisions[0]) if squeeze else (masked, decisions)


def label_targets(input_ids: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """Return the labels (step 3): the original id at each target, -100 (`IGNORE_INDEX`) elsewhere.

    Taught in notebooks/02_masked_lm.ipynb.
    """
    _as_batch(input_ids, selected)
    return torch.where(selected, input_ids, IGNORE_INDEX)


def mask_tokens(
    input_ids: torch.Tensor, tokenizer_or_special_ids: Tokenizer | SpecialIds,
    masking: MaskingConfig | None = None, *, mlm_probability: float | None = None,
    word_ids: torch.Tensor | Sequence[Any] | None = None,
    attention_mask: torch.Tensor | None = None, generator: torch.Generator | None = None,
    row_seeds: torch.Tensor | Sequence[int] | int | None = None, return_decisions: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Return `(masked_input_ids, labels)`: BERT's masked-LM inputs and targets for `input_ids`.

    `input_ids` is a LongTensor of shape (T,) or (B, T); it is never modified. The three steps
    are `select_targets`, `perturb_targets` and `label_targets`: their docstrings hold the details.

    `masking` (a `MaskingConfig`) holds every setting; None is BERT's (15%, then 80/10/10).
    `mlm_probability=p` is short for `masking=MaskingConfig(mlm_probability=p)` (pass one or
    the other).

    Randomness: `generator` (a torch.Generator; reproducible for a given batch) or `row_seeds`
    (one int64 seed per row): row i's draws are a counter-based hash (splitmix64; see
    `Draws`) of (seed, position, kind of draw), so a row's mask depends only on its seed and
    its tokens, never on which batch, worker, process or device it lands in, nor on how far the
    batch is padded. Build row seeds with `example_seed(seed, epoch_or_dupe, index)`. Neither
    given: torch's global generator. The three steps called in turn with the same generator (or
    row seeds) give the same result.

    With `return_decisions=True` a third tensor (int8, same shape) holds a `Decision` per position:
    NOT_TARGET, MASK, RANDOM or KEEP. Tests count these, since a random replacement can equal the
    original token.

    Taught in notebooks/02_masked_lm.ipynb.
    """
    # Checked before step 1 draws anything: a bad setting leaves the generator untouched.
    if mlm_probability is not None:
        if masking is not None:
            raise ValueError("pass either masking= or its mlm_probability= shorthand, not both "
                             "(MaskingConfig(mlm_probability=...) holds the rate)")
        masking = MaskingConfig(mlm_probability=mlm_probability)
    # One set of draws for both steps: what select_targets then perturb_targets would draw.
    batch = _prepare(input_ids, tokenizer_or_special_ids, masking, generator, row_seeds)
    selected = _select(batch, word_ids, attention_mask)
    # Nothing is selected at rate 0, and step 1 then never reads (nor checks) the word ids.
    perturbed = _perturb(batch, selected, word_ids if batch.masking.mlm_probability else None,
                         return_decisions)
    masked, *decisions = perturbed if return_decisions else (perturbed,)
    return (masked, label_targets(input_ids, selected), *decisions)


def mask_tokens_reference(
    tokens: Sequence[Any], vocab: Sequence[Any], masking: MaskingConfig = BERT_MASKING, *,
    mask_token: Any = MASK, special_tokens: Sequence[Any] = SPECIAL_TOKENS, rng: random.Random,
    return_decisions: bool = False,
) -> tuple[list[Any], ...]:
    """Return `(masked_tokens, labels)` from the plain one-token-at-a-time loop in the BERT paper.

    Works on token strings (e.g. ["我", "爱", "华", ...]) or ids: `vocab` lists what a random
    replacement may be, `mask_token` and `special_tokens` must be of the same kind as `tokens`.
    `masking` gives the three shares (`mlm_probability`, `mask_replace_prob`,
    `random_replace_prob`); the loop selects token by token, so it takes no other setting.
    Labels hold the original token at each target and -100 elsewhere. Unlike `mask_tokens` it
    may return no target at all (the loop has no guarantee), and it is slow: it is the readable
    definition the vectorized version is tested against.

    Taught in notebooks/02_masked_lm.ipynb.
    """
    if masking is not None and not isinstance(masking, MaskingConfig):
        raise ValueError(f"masking={masking!r}; {_MASKING_FIX}")
    masking = masking or BERT_MASKING
    if masking.selection != "bernoulli" or masking.max_predictions is not None:
        raise ValueError(f"mask_tokens_reference is the per-token loop: it takes "
                         f"selection='bernoulli' and no max_predictions (got "
                         f"selection={masking.selection!r}, "
                         f"max_predictions={masking.max_predictions!r}); use mask_tokens for those")
    mlm_probability = masking.mlm_probability
    mask_replace_prob, random_replace_prob = masking.mask_replace_prob, masking.random_replace_prob
    skip = set(special_tokens)
    masked, labels, decisions = [], [], []
    for token in tokens:
        if token in skip or rng.random() >= mlm_probability:  # step 1: is it a target?
            masked.append(token)
            labels.append(IGNORE_INDEX)  # step 3: not predicted
            decisions.append(Decision.NOT_TARGET)
            continue
        r = rng.random()  # step 2: how is the target perturbed?
        if r < mask_replace_prob:
            masked.append(mask_token)
            decisions.append(Decision.MASK)
        elif r < mask_replace_prob + random_replace_prob:
            masked.append(rng.choice(vocab))
            decisions.append(Decision.RANDOM)
        else:
            masked.append(token)
            decisions.append(Decision.KEEP)
        labels.append(token)  # step 3: predict the original, whatever the input shows
    return (masked, labels, decisions) if return_decisions else (masked, labels)


# --------------------------------------------------------------------------------------------
# Word ids: which tokens whole-word masking treats as one word


def continuing_prefix(tokenizer: Tokenizer) -> str:
    """Return the mark a tokenizer's model puts before a piece that continues a word ("##").

    BERT's WordPiece writes "##"; a model built with another (`continuing_subword_prefix="@@"`)
    has its own. A model without one (WordLevel) gets "##", which none of its tokens start with.
    """
    return getattr(tokenizer.model, "continuing_subword_prefix", None) or "##"


def wordpiece_word_ids(tokens: Sequence[str] | np.ndarray,
                       prefix: str = "##") -> list[int | None] | np.ndarray:
    """Return the word index of each WordPiece token string: a "##" piece joins the word before it.

    Special tokens ([CLS], [SEP], [PAD], [UNK], [MASK]) belong to no word (None), and a "##"
    piece right after one starts a word. Indices count 0, 1, 2, ... over the whole sequence, so
    the two sentences of a pair never share one. `tokens` is one sequence of strings (returns a
    list) or a numpy array of strings of shape (..., T) (returns an int64 array of the same shape,
    -1 for None, without a Python loop: a collator passes `vocab[ids]`, the token strings by id).
    `prefix` is the tokenizer's own continuation mark (`continuing_prefix`), "##" for BERT's.
    """
    strings = np.asarray(tokens, dtype=str)
    is_word = ~np.isin(strings, SPECIAL_TOKENS)
    continues = np.char.startswith(strings, prefix)
    continues[..., 1:] &= is_word[..., :-1]
    continues[..., :1] = False  # the first piece of a sequence starts a word, "##" or not
    word = np.where(is_word, np.cumsum(is_word & ~continues, axis=-1) - 1, -1)
    if isinstance(tokens, np.ndarray):
        return word.astype(np.int64)
    return [None if w < 0 else w for w in word.tolist()]


def word_ids_from_encoding(encoding: Encoding | Sequence[Encoding]) -> list[Any]:
    """Return one word index per token (None for special tokens and padding) for whole-word masking.

    The word ids of `wordpiece_word_ids(encoding.tokens)`. Unlike the tokenizer's own
    `encoding.word_ids`, which restart at 0 for the second sentence, they run over the whole
    sequence. A list of encodings gives a list of lists.

    Taught in notebooks/02_masked_lm.ipynb.
    """
    if not isinstance(encoding, Encoding):
        return [word_ids_from_encoding(e) for e in encoding]
    return wordpiece_word_ids(encoding.tokens)
