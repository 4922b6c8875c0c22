"""Tests for bertlab.masking: the 15% -> 80/10/10 -> labels recipe, checked by counting.

Statistical tests use fixed seeds (so they are deterministic) and tolerances of about five
standard errors over a million candidate tokens, so a wrong rate fails and a right one passes.
"""

from __future__ import annotations

import random
import re

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from scipy import stats
from tokenizers import Tokenizer, models

import bertlab as bl
from bertlab.course.viz import plot_mask_strip, plot_masking_rates
from bertlab.course.widgets import mask_strip_html, masking_explorer
from bertlab.masking import (
    IGNORE_INDEX,
    Decision,
    Draws,
    MaskingConfig,
    example_seed,
    label_targets,
    mask_tokens,
    mask_tokens_reference,
    perturb_targets,
    select_targets,
    word_ids_from_encoding,
    wordpiece_word_ids,
)
from bertlab.tokenizer import SpecialIds, encode_sentences

SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4, vocab_size=1000)
# Hugging Face's vocab.txt layout: specials are not one block of ids.
SPLIT_SPECIALS = SpecialIds(pad=0, unk=100, cls=101, sep=102, mask=103, vocab_size=30522)


def random_batch(specials: SpecialIds, rows: int, length: int, seed: int,
                 min_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[CLS] words [SEP] [PAD]..., words drawn from the non-special ids, with ragged lengths."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([i for i in range(specials.vocab_size) if i not in specials.all])
    ids = allowed[torch.randint(len(allowed), (rows, length), generator=g)]
    lengths = torch.randint(min_len or length // 2, length + 1, (rows,), generator=g)
    positions = torch.arange(length)
    ids[:, 0] = specials.cls
    ids[torch.arange(rows), lengths - 1] = specials.sep
    attention = (positions[None, :] < lengths[:, None]).long()
    ids[attention == 0] = specials.pad
    return ids, attention


def randomness(path: str, rows: int, seed: int = 0) -> dict:
    if path == "generator":
        return {"generator": torch.Generator().manual_seed(seed)}
    return {"row_seeds": example_seed(seed, 0, torch.arange(rows))}


@pytest.fixture(scope="module")
def bbc():
    docs = bl.load_corpus("bbc")
    return docs, bl.train_tokenizer(docs)


# --- rates, counted over a million candidates ----------------------------------------------------


@pytest.mark.parametrize("path", ["generator", "row_seeds"])
@pytest.mark.parametrize("rate, mask_p, random_p", [
    (0.15, 0.8, 0.1), (0.15, 1.0, 0.0), (0.15, 0.0, 1.0), (0.40, 0.8, 0.1), (0.15, 0.5, 0.4),
])
def test_selection_and_decision_rates(path, rate, mask_p, random_p):
    ids, attention = random_batch(SPECIALS, 1000, 1100, seed=1, min_len=1050)
    candidates = int(attention.sum()) - 2 * len(ids)  # minus [CLS] and [SEP]
    assert candidates >= 1_000_000
    masking = MaskingConfig(mlm_probability=rate, mask_replace_prob=mask_p,
                            random_replace_prob=random_p)
    masked, labels, decisions = mask_tokens(ids, SPECIALS, masking, return_decisions=True,
                                            **randomness(path, len(ids)))
    counts = torch.bincount(decisions.flatten().long(), minlength=4)
    targets = int(counts[1:].sum())
    assert abs(targets / candidates - rate) < 0.002
    assert abs(counts[Decision.MASK] / targets - mask_p) < 0.005
    assert abs(counts[Decision.RANDOM] / targets - random_p) < 0.004
    assert abs(counts[Decision.KEEP] / targets - (1 - mask_p - random_p)) < 0.004
    # The decisions are what the outputs show.
    is_target = decisions != Decision.NOT_TARGET
    assert torch.equal(labels != IGNORE_INDEX, is_target)
    assert torch.equal(masked[decisions == Decision.MASK],
                       torch.full_like(masked[decisions == Decision.MASK], SPECIALS.mask))
    kept = decisions == Decision.KEEP
    assert torch.equal(masked[kept], ids[kept])
    assert torch.equal(masked[~is_target], ids[~is_target])


def test_full_rate_selects_every_candidate():
    ids, attention = random_batch(SPECIALS, 50, 64, seed=2)
    _, labels = mask_tokens(ids, SPECIALS, mlm_probability=1.0, generator=torch.Generator())
    maskable = attention.bool() & (ids > 4)
    assert torch.equal(labels != IGNORE_INDEX, maskable)


# --- what is never selected, labels, replacements -------------------------------------------------


@pytest.mark.parametrize("specials", [SPECIALS, SPLIT_SPECIALS])
@pytest.mark.parametrize("use_attention", [True, False])
def test_specials_and_padding_never_selected(specials, use_attention):
    ids, attention = random_batch(specials, 200, 48, seed=3)
    g = torch.Generator().manual_seed(3)
    sprinkle = torch.rand(ids.shape, generator=g) < 0.1
    ids[sprinkle & attention.bool()] = specials.unk
    ids[(torch.rand(ids.shape, generator=g) < 0.05) & attention.bool()] = specials.mask
    masked, labels, decisions = mask_tokens(
        ids, specials, mlm_probability=1.0, attention_mask=attention if use_attention else None,
        generator=g, return_decisions=True,
    )
    special = torch.isin(ids, torch.tensor(specials.all))
    target = labels != IGNORE_INDEX
    assert not (target & special).any()
    assert not (target & (attention == 0)).any()
    assert torch.equal(target, ~special)  # rate 1.0: everything else is a target
    assert torch.equal(labels[target], ids[target])  # labels hold the originals
    assert torch.equal(masked[~target], ids[~target])  # non-targets untouched


def test_attention_mask_excludes_positions_even_if_not_pad():
    ids = torch.tensor([[2, 10, 11, 12, 3, 13, 14]])
    attention = torch.tensor([[1, 1, 1, 1, 1, 0, 0]])
    _, labels = mask_tokens(ids, SPECIALS, mlm_probability=1.0, attention_mask=attention,
                            generator=torch.Generator())
    assert labels.tolist() == [[-100, 10, 11, 12, -100, -100, -100]]


@pytest.mark.parametrize("path", ["generator", "row_seeds"])
def test_random_replacements_are_uniform_over_non_special_ids(path):
    specials = SpecialIds(pad=0, unk=7, cls=8, sep=9, mask=20, vocab_size=30)
    allowed = [i for i in range(30) if i not in specials.all]
    ids = torch.full((400, 200), allowed[0])
    masking = MaskingConfig(mlm_probability=1.0, mask_replace_prob=0.0, random_replace_prob=1.0)
    masked, _, decisions = mask_tokens(ids, specials, masking, return_decisions=True,
                                       **randomness(path, len(ids)))
    assert (decisions == Decision.RANDOM).all()
    counts = torch.bincount(masked.flatten(), minlength=30)
    assert counts[list(specials.all)].sum() == 0
    assert stats.chisquare(counts[allowed].numpy()).pvalue > 1e-3


def test_input_is_not_modified_and_dtype_and_shape_kept():
    ids, attention = random_batch(SPECIALS, 8, 32, seed=4)
    ids32 = ids.int()
    before = ids32.clone()
    masked, labels = mask_tokens(ids32, SPECIALS, mlm_probability=0.5, generator=torch.Generator())
    assert torch.equal(ids32, before)
    assert masked.dtype == labels.dtype == torch.int32
    single, single_labels, decisions = mask_tokens(ids[0], SPECIALS, generator=torch.Generator(),
                                                   return_decisions=True)
    assert single.shape == single_labels.shape == decisions.shape == ids[0].shape


# --- at least one target ---------------------------------------------------------------------------


def test_every_row_with_a_candidate_gets_a_target():
    ids = torch.tensor([[2, 10, 3, 0, 0]] * 500 + [[2, 3, 0, 0, 0]] * 10)
    for randomness_kw in (randomness("generator", 510), randomness("row_seeds", 510)):
        _, labels = mask_tokens(ids, SPECIALS, mlm_probability=0.01, **randomness_kw)
        counts = (labels != IGNORE_INDEX).sum(dim=1)
        assert (counts[:500] == 1).all()
        assert (counts[500:] == 0).all()  # nothing maskable, nothing selected
    _, labels = mask_tokens(ids, SPECIALS, mlm_probability=0.0, generator=torch.Generator())
    assert (labels == IGNORE_INDEX).all()  # an explicit zero rate selects nothing


def test_min_one_target_bias_matches_the_documented_formula():
    n, p, rows = 8, 0.15, 200_000
    ids = torch.randint(5, 1000, (rows, n), generator=torch.Generator().manual_seed(5))
    _, labels = mask_tokens(ids, SPECIALS, mlm_probability=p,
                            generator=torch.Generator().manual_seed(5))
    rate = (labels != IGNORE_INDEX).float().mean().item()
    expected = p + (1 - p) ** n / n  # 0.184
    assert abs(rate - expected) < 0.002
    assert abs(rate - p) > 0.03  # the bias is real at n = 8, and the test can tell


def test_forced_target_is_uniform_over_candidates():
    ids = torch.randint(5, 1000, (40_000, 10), generator=torch.Generator().manual_seed(6))
    ids[:, 0] = SPECIALS.cls
    _, labels = mask_tokens(ids, SPECIALS, mlm_probability=1e-9,
                            generator=torch.Generator().manual_seed(6))
    target = labels != IGNORE_INDEX
    assert (target.sum(dim=1) == 1).all()
    per_position = target.sum(dim=0).numpy()
    assert per_position[0] == 0
    assert stats.chisquare(per_position[1:]).pvalue > 1e-3


# --- exact count and max_predictions ----------------------------------------------------------------


@pytest.mark.parametrize("path", ["generator", "row_seeds"])
def test_exact_selection_count(path):
    ids, attention = random_batch(SPECIALS, 300, 80, seed=7, min_len=3)
    n = ((ids > 4) & attention.bool()).sum(dim=1).tolist()
    for max_predictions in (None, 5):
        _, labels = mask_tokens(ids, SPECIALS,
                                MaskingConfig(selection="exact", max_predictions=max_predictions),
                                **randomness(path, len(ids)))
        got = (labels != IGNORE_INDEX).sum(dim=1).tolist()
        cap = max_predictions or 10**9
        assert got == [min(cap, max(1, round(k * 0.15))) if k else 0 for k in n]


def test_exact_count_rounds_half_to_even_like_python():
    # n = 10 -> 1.5 -> 2 and n = 30 -> 4.5 -> 4 (Python's round), at p = 0.15.
    for n, expected in ((10, round(10 * 0.15)), (30, round(30 * 0.15)), (50, round(50 * 0.15))):
        ids = torch.randint(5, 1000, (20, n), generator=torch.Generator().manual_seed(n))
        _, labels = mask_tokens(ids, SPECIALS, masking=MaskingConfig(selection="exact"),
                                generator=torch.Generator())
        assert ((labels != IGNORE_INDEX).sum(dim=1) == expected).all()
    assert (round(10 * 0.15), round(30 * 0.15)) == (2, 4)


def test_exact_selection_is_uniform_over_positions():
    ids = torch.randint(5, 1000, (20_000, 20), generator=torch.Generator().manual_seed(8))
    _, labels = mask_tokens(ids, SPECIALS,
                            masking=MaskingConfig(selection="exact", mlm_probability=0.25),
                            generator=torch.Generator().manual_seed(8))
    per_position = (labels != IGNORE_INDEX).sum(dim=0).numpy()
    assert stats.chisquare(per_position).pvalue > 1e-3


def test_max_predictions_caps_bernoulli():
    ids, _ = random_batch(SPECIALS, 500, 128, seed=9, min_len=120)
    _, labels = mask_tokens(ids, SPECIALS,
                            masking=MaskingConfig(mlm_probability=0.4, max_predictions=20),
                            generator=torch.Generator().manual_seed(9))
    counts = (labels != IGNORE_INDEX).sum(dim=1)
    assert counts.max() == 20 and counts.min() >= 1


# --- whole-word masking -----------------------------------------------------------------------------


def word_batch(rows: int, seed: int, words_per_row: tuple[int, int] = (5, 30)):
    """Rows of [CLS] w w w [SEP] [PAD] with words of 1-4 pieces; word ids as a tensor (-1 = none)."""
    rng = random.Random(seed)
    ids_rows, word_rows = [], []
    for _ in range(rows):
        ids, words = [SPECIALS.cls], [-1]
        for word in range(rng.randint(*words_per_row)):
            pieces = rng.choice([1, 1, 1, 2, 2, 3, 4])
            ids += [rng.randrange(5, 1000) for _ in range(pieces)]
            words += [word] * pieces
        ids.append(SPECIALS.sep)
        words.append(-1)
        ids_rows.append(ids)
        word_rows.append(words)
    length = max(map(len, ids_rows))
    ids = torch.tensor([r + [SPECIALS.pad] * (length - len(r)) for r in ids_rows])
    words = torch.tensor([r + [-1] * (length - len(r)) for r in word_rows])
    return ids, words


def words_are_whole(words: torch.Tensor, target: torch.Tensor) -> bool:
    for row_words, row_target in zip(words.tolist(), target.tolist(), strict=True):
        seen: dict[int, set[bool]] = {}
        for word, chosen in zip(row_words, row_target, strict=True):
            if word >= 0:
                seen.setdefault(word, set()).add(chosen)
        if any(len(v) > 1 for v in seen.values()):
            return False
    return True


@pytest.mark.parametrize("path", ["generator", "row_seeds"])
@pytest.mark.parametrize("selection", ["bernoulli", "exact"])
def test_whole_word_never_splits_a_word(path, selection):
    ids, words = word_batch(800, seed=10)
    masked, labels, decisions = mask_tokens(ids, SPECIALS,
                                            masking=MaskingConfig(selection=selection),
                                            word_ids=words, return_decisions=True,
                                            **randomness(path, len(ids)))
    target = labels != IGNORE_INDEX
    assert words_are_whole(words, target)
    assert not (target & (words < 0)).any()
    assert (target.sum(dim=1) >= 1).all()
    # Per-word decision (the default): all pieces of a word share one decision.
    for row_words, row_decisions in zip(words.tolist(), decisions.tolist(), strict=True):
        by_word: dict[int, set[int]] = {}
        for word, decision in zip(row_words, row_decisions, strict=True):
            if decision:
                by_word.setdefault(word, set()).add(decision)
        assert all(len(v) == 1 for v in by_word.values())
    if selection == "exact":
        n = (words >= 0).sum(dim=1)
        budget = torch.round(n.double() * 0.15).long().clamp(min=1)
        assert (target.sum(dim=1) <= torch.maximum(budget, torch.tensor(4))).all()


def test_whole_word_rates_and_per_piece_decisions():
    ids, words = word_batch(2500, seed=11, words_per_row=(60, 100))  # (1 - p)**60: no bias
    candidates = int((words >= 0).sum())
    _, labels, decisions = mask_tokens(ids, SPECIALS,
                                       masking=MaskingConfig(per_word_decision=False),
                                       word_ids=words, generator=torch.Generator().manual_seed(11),
                                       return_decisions=True)
    target = labels != IGNORE_INDEX
    assert abs(target.sum().item() / candidates - 0.15) < 0.006
    counts = torch.bincount(decisions.flatten().long(), minlength=4)[1:].float()
    assert abs(counts[0] / counts.sum() - 0.8) < 0.01
    # Per-piece decisions: some selected word must mix decisions (Google's behaviour).
    mixed = 0
    for row_words, row_decisions in zip(words.tolist(), decisions.tolist(), strict=True):
        by_word: dict[int, set[int]] = {}
        for word, decision in zip(row_words, row_decisions, strict=True):
            if decision:
                by_word.setdefault(word, set()).add(decision)
        mixed += sum(len(v) > 1 for v in by_word.values())
    assert mixed > 100


def test_word_ids_as_lists_match_tensor():
    ids, words = word_batch(5, seed=12)
    as_lists = [[None if w < 0 else w for w in row] for row in words.tolist()]
    a = mask_tokens(ids, SPECIALS, word_ids=words, row_seeds=[1, 2, 3, 4, 5])
    b = mask_tokens(ids, SPECIALS, word_ids=as_lists, row_seeds=[1, 2, 3, 4, 5])
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_word_ids_from_encoding(bbc):
    _, tok = bbc
    enc = tok.encode("The unbelievable rise.", "Shares fell.")
    words = word_ids_from_encoding(enc)
    assert len(words) == len(enc.tokens)
    for token, word, previous in zip(enc.tokens[1:], words[1:], words[:-1], strict=True):
        if token.startswith("##"):
            assert word == previous
    specials = [w is None for w in words]
    assert specials == [bool(s) for s in enc.special_tokens_mask]
    real = [w for w in words if w is not None]
    assert real == sorted(real) and len(set(real)) == real[-1] + 1  # unique across the pair
    assert word_ids_from_encoding([enc, enc]) == [words, words]


def test_wordpiece_word_ids_on_strings_and_arrays():
    tokens = ["[CLS]", "##a", "b", "##c", "[UNK]", "##d", "e", "[SEP]", "##f", "[PAD]"]
    expected = [None, 0, 1, 1, None, 2, 3, None, 4, None]  # no word runs across a special token
    assert wordpiece_word_ids(tokens) == expected
    assert wordpiece_word_ids(["##a", "b"]) == [0, 1] and wordpiece_word_ids([]) == []
    batch = wordpiece_word_ids(np.array([tokens, tokens[::-1]]))  # (2, T) -> (2, T), -1 = None
    assert batch.dtype == np.int64 and batch.shape == (2, len(tokens))
    assert batch[0].tolist() == [-1 if w is None else w for w in expected]
    assert batch[1].tolist() == [-1 if w is None else w for w in wordpiece_word_ids(tokens[::-1])]


# --- agreement with the reference loop and with transformers ---------------------------------------


def test_reference_loop_on_the_notes_example():
    tokens = ["我", "爱", "华", "中", "科", "技", "大", "学"]
    masked, labels = mask_tokens_reference(tokens, tokens, MaskingConfig(
                                               mlm_probability=1.0, mask_replace_prob=1.0,
                                               random_replace_prob=0.0),
                                           rng=random.Random(0))
    assert masked == ["[MASK]"] * 8 and labels == tokens
    masked, labels = mask_tokens_reference(["[CLS]", *tokens, "[SEP]"], tokens, rng=random.Random(1))
    assert masked[0] == "[CLS]" and labels[0] == IGNORE_INDEX and labels[-1] == IGNORE_INDEX
    for out, label, original in zip(masked[1:-1], labels[1:-1], tokens, strict=True):
        assert label in (IGNORE_INDEX, original)
        if label == IGNORE_INDEX:
            assert out == original


def test_reference_loop_and_vectorized_agree_in_distribution():
    ids, attention = random_batch(SPECIALS, 1500, 96, seed=13, min_len=80)
    vocab = [i for i in range(SPECIALS.vocab_size) if i not in SPECIALS.all]
    rng = random.Random(13)
    ref = [0, 0, 0, 0]
    for row in ids.tolist():
        _, _, decisions = mask_tokens_reference(row, vocab, mask_token=SPECIALS.mask,
                                                special_tokens=SPECIALS.all, rng=rng,
                                                return_decisions=True)
        for d in decisions:
            ref[d] += 1
    ref[0] -= int((ids == SPECIALS.pad).sum()) + 2 * len(ids)  # count candidates only
    _, _, decisions = mask_tokens(ids, SPECIALS, generator=torch.Generator().manual_seed(13),
                                  return_decisions=True)
    ours = torch.bincount(decisions.flatten().long(), minlength=4).tolist()
    ours[0] -= int((ids == SPECIALS.pad).sum()) + 2 * len(ids)
    assert sum(ours) == sum(ref)
    assert stats.chi2_contingency(np.array([ref, ours])).pvalue > 1e-3


def test_agrees_with_transformers_collator(bbc):
    """Same batches, same output categories in distribution as DataCollatorForLanguageModeling.

    Differences on purpose, too small to show here: transformers may draw a special token as the
    "random" replacement (transformers#15342; 5 in 8,192 here), we never do; we give a sequence
    with no target one target (these rows hold ~100 candidates, so that never happens). Both skip
    [UNK] and padding.
    """
    transformers = pytest.importorskip("transformers")
    docs, tok = bbc
    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, mask_token="[MASK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", unk_token="[UNK]",
    )
    collator = transformers.DataCollatorForLanguageModeling(hf_tok, mlm_probability=0.15, seed=0)
    specials = bl.special_ids(tok)
    examples = []  # [CLS] consecutive sentences [SEP], up to 128 tokens: pretraining-like rows
    for doc in docs[:700]:
        chunk: list[int] = []
        for ids in encode_sentences(tok, doc.sentences):
            if chunk and len(chunk) + len(ids) > 126:
                examples.append([specials.cls, *chunk, specials.sep])
                chunk = []
            chunk += ids[:126]
        examples.append([specials.cls, *chunk, specials.sep])
    g = torch.Generator().manual_seed(0)
    table = np.zeros((2, 4), dtype=np.int64)  # rows: ours, transformers
    for start in range(0, len(examples), 256):
        group = examples[start:start + 256]
        hf = collator([{"input_ids": e} for e in group])
        length = hf["input_ids"].shape[1]
        ids = torch.tensor([e + [specials.pad] * (length - len(e)) for e in group])
        masked, labels = mask_tokens(ids, specials, attention_mask=hf["attention_mask"], generator=g)
        for row, (out, lab) in enumerate(((masked, labels), (hf["input_ids"], hf["labels"]))):
            target = lab != IGNORE_INDEX
            candidates = ~torch.isin(ids, torch.tensor(specials.all))
            assert not (target & ~candidates).any()  # neither side selects specials or padding
            # Output categories: not a target, shows [MASK], shows the original, shows another id.
            table[row] += [int((candidates & ~target).sum()),
                           int((target & (out == specials.mask)).sum()),
                           int((target & (out == ids)).sum()),
                           int((target & (out != ids) & (out != specials.mask)).sum())]
    assert table.sum(axis=1)[0] == table.sum(axis=1)[1] > 250_000
    assert stats.chi2_contingency(table).pvalue > 1e-3


# --- randomness -------------------------------------------------------------------------------------


def test_row_seeds_make_a_row_independent_of_its_batch():
    ids, attention = random_batch(SPECIALS, 64, 100, seed=14)
    seeds = example_seed(3, 1, torch.arange(64))
    for selection in ("bernoulli", "exact"):
        full = mask_tokens(ids, SPECIALS, masking=MaskingConfig(selection=selection),
                           row_seeds=seeds, attention_mask=attention, return_decisions=True)
        order = torch.randperm(64, generator=torch.Generator().manual_seed(14))[:17]
        part = mask_tokens(ids[order], SPECIALS, masking=MaskingConfig(selection=selection),
                           row_seeds=seeds[order], attention_mask=attention[order],
                           return_decisions=True)
        assert all(torch.equal(a[order], b) for a, b in zip(full, part, strict=True))
        # Padding a row further (a longer batch) leaves its mask alone.
        longer = torch.cat([ids, torch.zeros(64, 28, dtype=ids.dtype)], dim=1)
        wide = mask_tokens(longer, SPECIALS, masking=MaskingConfig(selection=selection),
                           row_seeds=seeds, return_decisions=True)
        assert all(torch.equal(a, b[:, :100]) for a, b in zip(full, wide, strict=True))
        single = mask_tokens(ids[5], SPECIALS, masking=MaskingConfig(selection=selection),
                             row_seeds=int(seeds[5]), attention_mask=attention[5],
                             return_decisions=True)
        assert all(torch.equal(a[5], b) for a, b in zip(full, single, strict=True))


def test_row_seeds_with_whole_words_are_batch_independent():
    ids, words = word_batch(30, seed=15)
    seeds = example_seed(0, 0, torch.arange(30))
    full = mask_tokens(ids, SPECIALS, word_ids=words, row_seeds=seeds)
    part = mask_tokens(ids[10:12], SPECIALS, word_ids=words[10:12], row_seeds=seeds[10:12])
    assert all(torch.equal(a[10:12], b) for a, b in zip(full, part, strict=True))


def test_generator_reproducible_and_seed_sensitive():
    ids, _ = random_batch(SPECIALS, 32, 64, seed=16)

    def run(seed):
        return mask_tokens(ids, SPECIALS, generator=torch.Generator().manual_seed(seed))

    assert all(torch.equal(a, b) for a, b in zip(run(1), run(1), strict=True))
    assert not torch.equal(run(1)[1], run(2)[1])


def test_example_seed_int_and_tensor_agree_and_differ_by_epoch():
    index = torch.arange(1000)
    seeds = example_seed(7, 2, index)
    assert seeds.dtype == torch.int64 and (seeds >= 0).all()
    assert [example_seed(7, 2, i) for i in range(0, 1000, 97)] == seeds[::97].tolist()
    assert len(set(seeds.tolist())) == 1000
    assert not torch.equal(seeds, example_seed(7, 3, index))
    assert not torch.equal(seeds, example_seed(8, 2, index))
    ids, _ = random_batch(SPECIALS, 1000, 64, seed=17)
    epoch2 = mask_tokens(ids, SPECIALS, row_seeds=seeds)[1]
    epoch3 = mask_tokens(ids, SPECIALS, row_seeds=example_seed(7, 3, index))[1]
    same_rows = (epoch2 == epoch3).all(dim=1).float().mean()
    assert same_rows < 0.01  # dynamic masking: a new epoch gives new masks


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_row_seeds_give_the_same_mask_on_cuda():
    ids, attention = random_batch(SPLIT_SPECIALS, 64, 128, seed=18)
    seeds = example_seed(0, 0, torch.arange(64))
    cpu = mask_tokens(ids, SPLIT_SPECIALS, row_seeds=seeds, attention_mask=attention)
    gpu = mask_tokens(ids.cuda(), SPLIT_SPECIALS, row_seeds=seeds.cuda(),
                      attention_mask=attention.cuda())
    assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu, gpu, strict=True))


# --- the three steps on their own: select -> perturb -> label ------------------------------------


@pytest.mark.parametrize("specials", [SPECIALS, SPLIT_SPECIALS])
def test_select_targets_skips_specials_and_padding_and_picks_the_right_count(specials):
    ids, attention = random_batch(specials, 400, 500, seed=20, min_len=3)
    g = torch.Generator().manual_seed(20)
    ids[(torch.rand(ids.shape, generator=g) < 0.05) & attention.bool()] = specials.unk
    ids[(torch.rand(ids.shape, generator=g) < 0.05) & attention.bool()] = specials.mask
    maskable = attention.bool() & ~torch.isin(ids, torch.tensor(specials.all))
    everything = select_targets(ids, specials, masking=MaskingConfig(mlm_probability=1.0),
                                attention_mask=attention, generator=g)
    assert everything.dtype == torch.bool and torch.equal(everything, maskable)
    selected = select_targets(ids, specials, attention_mask=attention, generator=g)
    assert not (selected & ~maskable).any()  # never a special token, never padding
    assert abs(selected.sum().item() / maskable.sum().item() - 0.15) < 0.004
    exact = select_targets(ids, specials, masking=MaskingConfig(selection="exact"),
                           attention_mask=attention,
                           row_seeds=example_seed(0, 0, torch.arange(len(ids))))
    n = maskable.sum(dim=1).tolist()
    assert not (exact & ~maskable).any()
    assert exact.sum(dim=1).tolist() == [max(1, round(k * 0.15)) if k else 0 for k in n]
    one = select_targets(ids[0], specials, attention_mask=attention[0], generator=g)
    assert one.shape == ids[0].shape and not (one & ~maskable[0]).any()


@pytest.mark.parametrize("path", ["generator", "row_seeds"])
def test_perturb_targets_shares_are_80_10_10_and_touch_only_the_targets(path):
    ids, attention = random_batch(SPECIALS, 400, 500, seed=21, min_len=450)
    selected = attention.bool() & (ids > 4)  # every maskable token, 179,000 or so targets
    selected[:, ::7] = False  # ...but not all: the rest must stay as they are
    masked, decisions = perturb_targets(ids, selected, SPECIALS, return_decisions=True,
                                        **randomness(path, len(ids)))
    assert torch.equal(decisions != Decision.NOT_TARGET, selected)
    assert torch.equal(masked[~selected], ids[~selected])
    counts = torch.bincount(decisions[selected].long(), minlength=4)[1:].double()
    shares = (counts / counts.sum()).tolist()
    assert abs(shares[0] - 0.8) < 0.005 and abs(shares[1] - 0.1) < 0.0035
    assert abs(shares[2] - 0.1) < 0.0035
    assert (masked[decisions == Decision.MASK] == SPECIALS.mask).all()
    assert torch.equal(masked[decisions == Decision.KEEP], ids[decisions == Decision.KEEP])
    assert (masked[decisions == Decision.RANDOM] > 4).all()  # a random token is never special
    alone = perturb_targets(ids, selected, SPECIALS, **randomness(path, len(ids)))
    assert torch.equal(alone, masked)  # return_decisions changes nothing else


def test_label_targets_is_ignore_index_exactly_off_the_selection():
    ids, _ = random_batch(SPECIALS, 50, 40, seed=22)
    selected = torch.rand(ids.shape, generator=torch.Generator().manual_seed(22)) < 0.3
    labels = label_targets(ids, selected)
    assert torch.equal(labels == IGNORE_INDEX, ~selected)
    assert torch.equal(labels[selected], ids[selected])
    assert torch.equal(label_targets(ids[3], selected[3]), labels[3])
    with pytest.raises(ValueError, match=r"selected must be a bool tensor shaped like input_ids"):
        label_targets(ids, selected[0])
    with pytest.raises(ValueError, match=r"selected must be a bool tensor shaped like input_ids"):
        perturb_targets(ids, selected.long(), SPECIALS)


@pytest.mark.parametrize("kwargs", [
    {},
    {"selection": "exact", "max_predictions": 4},
    {"mlm_probability": 0.4, "max_predictions": 6, "mask_replace_prob": 0.5,
     "random_replace_prob": 0.4},
    {"mask_replace_prob": 1.0, "random_replace_prob": 0.0},
    {"mlm_probability": 0.0},
    {"words": True},
    {"words": True, "selection": "exact", "per_word_decision": False},
    {"words": True, "mlm_probability": 0.0},
    {"one_row": True},
])
@pytest.mark.parametrize("path", ["generator", "row_seeds"])
def test_the_three_steps_compose_to_mask_tokens(path, kwargs):
    """select -> perturb -> label, with the same generator passed on, is mask_tokens bit for bit."""
    kwargs = dict(kwargs)
    ids, attention = random_batch(SPECIALS, 30, 60, seed=23)
    words = None
    if kwargs.pop("words", False):
        ids, words = word_batch(30, seed=23)
        attention = (ids != SPECIALS.pad).long()
    if kwargs.pop("one_row", False):
        ids, attention = ids[4], attention[4]
    masking = MaskingConfig(**kwargs)
    rows = 1 if ids.dim() == 1 else len(ids)
    rand, rand_again = randomness(path, rows, seed=5), randomness(path, rows, seed=5)
    expected = mask_tokens(ids, SPECIALS, masking, word_ids=words, attention_mask=attention,
                           return_decisions=True, **rand)
    selected = select_targets(ids, SPECIALS, masking, word_ids=words, attention_mask=attention,
                              **rand_again)
    # As mask_tokens does: at rate 0 there is nothing to perturb, so no per-word decisions to draw.
    per_word = words if masking.mlm_probability > 0 else None
    masked, decisions = perturb_targets(ids, selected, SPECIALS, masking, word_ids=per_word,
                                        return_decisions=True, **rand_again)
    got = (masked, label_targets(ids, selected), decisions)
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    if path == "generator":  # and the generator ends in the same state: the next batch agrees too
        assert torch.equal(rand["generator"].get_state(), rand_again["generator"].get_state())


# --- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    ({"mlm_probability": 1.5}, "mlm_probability=1.5 is not a probability"),
    ({"mlm_probability": -0.1}, "mlm_probability=-0.1 is not a probability"),
    ({"masking": {"mlm_probability": 0.4}}, "pass a bertlab.masking.MaskingConfig"),
    ({"masking": MaskingConfig(), "mlm_probability": 0.4}, "masking= or its mlm_probability="),
    ({"generator": torch.Generator(), "row_seeds": [1, 2]}, "not both"),
    ({"row_seeds": [1, 2, 3]}, "one seed per row"),
    ({"row_seeds": torch.tensor([1.0, 2.0])}, "row_seeds must be a LongTensor"),
    ({"word_ids": [[0, 1, 2]]}, "word_ids has 1 row"),
    ({"word_ids": torch.zeros(2, 5, dtype=torch.long)}, "word_ids has shape"),
    ({"attention_mask": torch.ones(2, 3)}, "attention_mask has shape"),
])
def test_bad_arguments_raise_clear_errors(kwargs, message):
    ids = torch.tensor([[2, 10, 11, 3], [2, 12, 3, 0]])
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        mask_tokens(ids, SPECIALS, **kwargs)


def test_bad_input_ids_raise_clear_errors():
    with pytest.raises(ValueError, match="dtype torch.float32; token ids must be integers"):
        mask_tokens(torch.tensor([[2.0, 10.0, 3.0]]), SPECIALS)
    with pytest.raises(ValueError, match=r"shape \(1, 2, 3\)"):
        mask_tokens(torch.zeros(1, 2, 3, dtype=torch.long), SPECIALS)
    with pytest.raises(ValueError, match="pass a LongTensor"):
        mask_tokens([[2, 10, 3]], SPECIALS)
    with pytest.raises(ValueError, match="vocabulary has 1000 tokens"):
        mask_tokens(torch.tensor([[2, 5000, 3]]), SPECIALS)


def test_tokenizer_without_mask_token_is_rejected():
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    with pytest.raises(ValueError, match=r"no \[MASK\] token"):
        mask_tokens(torch.tensor([[2, 4, 3]]), tok)



@pytest.mark.parametrize("settings, message", [
    ({"mask_replace_prob": 2}, "mask_replace_prob=2 is not a probability; pass a number in [0, 1]"),
    ({"mlm_probability": float("nan")}, "nan is not a probability; pass a number in [0, 1]"),
    ({"mlm_probability": True}, "mlm_probability=True is not a probability"),
    ({"mask_replace_prob": 0.8, "random_replace_prob": 0.3}, "exceeds 1"),
    ({"selection": "topk"}, "selection='topk' is unknown"),
    ({"max_predictions": 0}, "max_predictions=0"),
    ({"per_word_decision": "yes"}, "per_word_decision='yes'; pass True or False"),
])
def test_a_bad_masking_setting_is_refused_where_the_config_is_built(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        MaskingConfig(**settings)
    # The library names the setting; the CLI adds the flag (tests/test_cli.py).
    assert "--" not in str(refused.value)
    assert MaskingConfig(mlm_probability=1, mask_replace_prob=0).mask_replace_prob == 0.0


def test_the_reference_loop_takes_only_the_three_shares():
    for other in ({"selection": "exact"}, {"max_predictions": 3}):
        with pytest.raises(ValueError, match="use mask_tokens for those"):
            mask_tokens_reference(["a"], ["a"], MaskingConfig(**other), rng=random.Random(0))


# --- edge cases --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0,)])
def test_empty_inputs_give_empty_outputs(shape):
    ids = torch.zeros(shape, dtype=torch.long)
    for selection in ("bernoulli", "exact"):
        out = mask_tokens(ids, SPECIALS, masking=MaskingConfig(selection=selection),
                          generator=torch.Generator(), return_decisions=True)
        assert all(t.shape == ids.shape for t in out)


def test_non_contiguous_input():
    ids, attention = random_batch(SPECIALS, 16, 64, seed=19)
    view = ids[:, ::2]
    masked, labels = mask_tokens(view, SPECIALS, mlm_probability=0.5, row_seeds=list(range(16)))
    again = mask_tokens(view.contiguous(), SPECIALS, mlm_probability=0.5, row_seeds=list(range(16)))
    assert torch.equal(masked, again[0]) and torch.equal(labels, again[1])
    target = labels != IGNORE_INDEX
    assert torch.equal(labels[target], view[target])


# --- pictures and widget (bertlab.course.viz / bertlab.course.widgets, masked-LM sections) --------------------


def test_mask_strip_and_rates_figures():
    tokens = ["[CLS]", "the", "dollar", "fell", "[SEP]"]
    fig = plot_mask_strip(tokens, ["[CLS]", "[MASK]", "dollar", "cat", "[SEP]"],
                          [0, Decision.MASK, Decision.KEEP, Decision.RANDOM, 0])
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("-100") == 2 and "[MASK]" in texts and "fell" in texts
    plt.close(fig)
    with pytest.raises(ValueError, match="one of each per position"):
        plot_mask_strip(tokens, tokens[:3], [0] * 5)
    fig = plot_masking_rates(np.array([[850, 120, 15, 15], [840, 128, 16, 16]]))
    heights = [round(p.get_height(), 3) for p in fig.axes[0].patches]
    assert heights[:2] == [round((150 / 1000 + 160 / 1000) / 2, 3), 0.8]
    plt.close(fig)
    with pytest.raises(ValueError, match="pass \\(samples, 4\\)"):
        plot_masking_rates(np.zeros((3, 3)))


def test_mask_strip_html_and_explorer(bbc):
    page = mask_strip_html(["我", "<b>"], ["[MASK]", "<b>"], [Decision.MASK, 0])
    assert "我" in page and "&lt;b&gt;" in page and "-100" in page
    docs, tok = bbc
    explorer = masking_explorer(tok, docs[0].sentences[:3], seed=0)
    rate, to_mask, to_random, row, view = explorer.children
    rate.value = 1.0
    n_tokens = len(tok.encode(docs[0].sentences[0]).ids)
    assert view.value.startswith(f"<div>draw 0: {n_tokens - 2} targets")
    to_mask.value = 0.95
    assert to_random.max == pytest.approx(0.05) and to_random.value <= 0.05
    before = view.value
    row.children[1].click()  # resample
    assert "draw 1:" in view.value and view.value != before


def test_numpy_and_tensor_hashes_agree():
    seeds = torch.tensor([0, 1, -5, 2**62, -(2**63), 2**63 - 1])
    cpu = torch.device("cpu")
    fast, plain = (Draws(None, seeds, cpu, use_numpy=flag) for flag in (True, False))
    for kind in range(4):
        for a, b in zip(fast.grid(kind, 6, 50, below=0.3), plain.grid(kind, 6, 50, below=0.3),
                        strict=True):
            assert torch.equal(a, b)
    flat = torch.tensor([0, 7, 49, 50, 123, 299])
    for n in (None, 8187, 2**31 - 1):
        for a, b in zip(fast.at(1, flat, 50, n), plain.at(1, flat, 50, n), strict=True):
            assert (a is None and b is None) or torch.equal(a, b)


def test_the_label_the_masking_leaves_is_the_one_the_model_ignores():
    from bertlab import masking, model

    # One name, defined once: masking and the model both take bertlab.masking' constant.
    assert masking.IGNORE_INDEX is model.IGNORE_INDEX
    assert IGNORE_INDEX == torch.nn.CrossEntropyLoss().ignore_index
    assert not hasattr(model, "NOT_PREDICTED")


def test_the_masking_settings_have_one_home():
    import dataclasses
    import inspect

    from bertlab.masking import BERT_MASKING

    defaults = {f.name: f.default for f in dataclasses.fields(MaskingConfig)}
    assert defaults == dataclasses.asdict(BERT_MASKING) == {
        "mlm_probability": 0.15, "mask_replace_prob": 0.8, "random_replace_prob": 0.1,
        "selection": "bernoulli", "max_predictions": None, "per_word_decision": True}
    # Every step takes the one object; none takes a setting on its own (mask_tokens'
    # mlm_probability is its shorthand for MaskingConfig(mlm_probability=...)).
    for fn in (mask_tokens, select_targets, perturb_targets, mask_tokens_reference):
        params = inspect.signature(fn).parameters
        loose = set(defaults) & set(params) - ({"mlm_probability"} if fn is mask_tokens else set())
        assert "masking" in params and not loose, fn.__name__
    for bad, message in [({"mlm_probability": 1.5}, "mlm_probability"),
                         ({"mask_replace_prob": 0.9, "random_replace_prob": 0.2}, "exceeds 1"),
                         ({"selection": "greedy"}, "selection='greedy' is unknown")]:
        with pytest.raises(ValueError, match=message):
            MaskingConfig(**bad)
    assert MaskingConfig(mlm_probability=1).mlm_probability == 1.0  # floats, whatever was typed
