"""bertlab.demo's text output: the pretraining history table and the fill-mask guesses.

The demo itself runs end to end (at a toy budget) in tests/test_cli.py.
"""

from __future__ import annotations

from bertlab.demo import format_guesses, history_table


def test_history_table_has_one_row_per_evaluation_and_the_baseline_last():
    history = [{"step": 0, "tokens": 0, "val_mlm_loss": 9.0, "val_mlm_accuracy": 0.0,
                "val_perplexity": 8103.1, "val_nsp_accuracy": 0.5},
               {"step": 50, "tokens": 12800, "train_loss": 7.25, "val_mlm_loss": 6.5}]
    lines = history_table(history, baseline=0.061).splitlines()
    assert lines[0].split() == ["step", "tokens", "train", "loss", "val", "MLM", "loss", "MLM",
                                "acc", "ppl", "NSP", "acc"]
    assert lines[1].split() == ["0", "0", "-", "9.000", "0.000", "8103.1", "0.500"]
    assert lines[2].split() == ["50", "12800", "7.250", "6.500", "nan", "nan", "nan"]
    assert lines[3] == "unigram baseline (always the most frequent target): MLM acc 0.061"
    assert len(history_table(history).splitlines()) == 3  # no baseline, no last line


def test_guesses_read_as_token_and_probability():
    assert format_guesses([("stock", 0.4123), ("##s", 0.05)]) == "stock 0.41, ##s 0.05"
