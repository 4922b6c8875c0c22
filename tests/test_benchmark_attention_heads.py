"""benchmarks/attention_heads.py: what a head's strongest attention goes to, counted on real
query tokens only, and the record notebook 04 reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertlab.errors import BadInput
from bertlab.tokenizer import SpecialIds

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "results" / "attention_heads.json"
SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4, vocab_size=20)
CONTINUES = 10  # ids from here on are ## pieces in these tests


@pytest.fixture(scope="module")
def script(load_benchmark):
    return load_benchmark("attention_heads")


def one_hot_heads(rows: list[list[int]], T: int) -> torch.Tensor:
    """Return (1 layer, B, heads, T, T) attention probabilities: head h of row b puts all of
    query q's weight on key rows[b][h][q]."""
    B, H = len(rows), len(rows[0])
    probs = torch.zeros(1, B, H, T, T)
    for b in range(B):
        for h in range(H):
            for q, key in enumerate(rows[b][h]):
                probs[0, b, h, q, key] = 1.0
    return probs


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    # row 0: [CLS] w ##w x [SEP] y [SEP] (7 real); row 1: [CLS] z [SEP] + 4 [PAD]
    ids = torch.tensor([[2, 5, CONTINUES, 6, 3, 7, 3], [2, 8, 3, 0, 0, 0, 0]])
    return ids, (ids != SPECIAL.pad).long()


def shares_of(script, probs: torch.Tensor) -> dict[str, list[float]]:
    ids, mask = batch()
    continuation = torch.arange(SPECIAL.vocab_size) >= CONTINUES
    words = script.word_ids(ids, mask, continuation, SPECIAL)
    assert words.tolist() == [[-1, 1, 1, 2, -1, 3, -1], [-1, 1, -1, -1, -1, -1, -1]]
    return {k: v[0].tolist() for k, v in script.head_shares(probs, ids, mask, words,
                                                            SPECIAL).items()}


def test_a_head_that_always_reads_one_place_scores_one_there_and_padding_is_not_counted(script):
    # Padded queries (row 1, positions 3-6) look at [CLS]: counted, they would move every share.
    pad_rows = [0, 0, 0, 0]
    previous = [[0, 0, 1, 2, 3, 4, 5], [0, 0, 1, *pad_rows]]
    following = [[1, 2, 3, 4, 5, 6, 6], [1, 2, 2, *pad_rows]]  # the last real token: itself
    to_sep = [[4, 4, 4, 4, 6, 6, 4], [2, 2, 2, *pad_rows]]
    itself = [[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, *pad_rows]]
    heads = list(zip(previous, following, to_sep, itself, strict=True))
    shares = shares_of(script, one_hot_heads([list(h) for h in heads], 7))
    assert shares["previous"] == [1.0, 0.0, 0.0, 0.0]
    # to_sep reads the next token where that is a [SEP] (3 of the 8 queries that have a next one)
    assert shares["next"] == [0.0, 1.0, pytest.approx(3 / 8), 0.0]
    assert shares["sep"] == pytest.approx([1 / 10, 5 / 10, 1.0, 3 / 10])
    # [CLS] is read by 4 of the 10 real queries in the previous-token head (positions 0 and 1 of
    # each row); the 4 padded queries that read it too would make it 8 of 14
    assert shares["cls"] == pytest.approx([4 / 10, 0.0, 0.0, 2 / 10])
    assert shares["self"] == pytest.approx([2 / 10, 2 / 10, 1 / 10, 1.0])
    assert shares["same_word"] == [0.5, 0.5, 0.0, 0.0]


def test_ties_and_nameless_heads_score_low_and_no_query_leaves_nan(script):
    ids, mask = batch()
    uniform = mask[:, None, None, :].float().expand(1, 2, 1, 7, 7) / mask.sum(-1)[None, :, None,
                                                                                  None, None]
    shares = shares_of(script, uniform.contiguous())
    # a uniform row's argmax is its first key, [CLS]: the cls share, and nothing else but self
    # and previous at positions 0 and 1
    assert shares["cls"] == [1.0]
    assert shares["next"] == [0.0] and shares["same_word"] == [0.0]
    one_row = script.head_shares(uniform[:, 1:], ids[1:], mask[1:],
                                 torch.full((1, 7), -1), SPECIAL)
    assert torch.isnan(one_row["same_word"]).all()  # no word of two pieces: no share at all


def test_the_script_on_a_tiny_setting_finds_course_tiny_s_previous_token_head(script, tmp_path,
                                                                              one_thread):
    out = tmp_path / "heads.json"
    assert script.main(["--models", str(ROOT / "models" / "course-tiny"), "--samples", "2",
                        "--per-sample", "6", "--max-seq-len", "32", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["settings"]["models"] == ["models/course-tiny"]
    model = record["models"]["course-tiny"]
    assert model["max_seq_len"] == 32 and model["sequences"] == 12 and model["pairs"] == "nsp"
    for arm in ("trained", "untrained"):
        for name in script.BEHAVIOURS:
            samples = model[arm][name]["samples"]
            assert len(samples) == 2 and len(samples[0]) == model["layers"]
            assert all(0.0 <= s <= 1.0 for sample in samples for row in sample for s in row)
    best = model["best"]["previous"]
    assert best["trained"]["mean"] > 0.6 > 0.2 > best["untrained"]["mean"]
    assert best["trained"]["mean"] == model["trained"]["previous"]["mean"][best["layer"]][
        best["head"]]


def test_a_request_for_more_held_out_text_than_there_is_names_the_fix(script, tmp_path):
    with pytest.raises(BadInput, match="ask for fewer"):
        script.main(["--models", str(ROOT / "models" / "course-tiny"), "--samples", "1000",
                     "--per-sample", "1000", "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_the_committed_record_is_what_make_results_writes_and_its_best_heads_are_its_maxima():
    record = json.loads(RECORD.read_text(encoding="utf-8"))
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert record["command"].removeprefix("python ") in makefile
    assert sorted(record["models"]) == ["course-nsp", "course-tiny"]
    for model in record["models"].values():
        assert model["sequences"] == record["settings"]["samples"] * record["settings"]["per_sample"]
        for name, best in model["best"].items():
            means = model["trained"][name]["mean"]
            assert means[best["layer"]][best["head"]] == max(max(row) for row in means)
            assert best["untrained"]["mean"] == model["untrained"][name]["mean"][best["layer"]][
                best["head"]]
