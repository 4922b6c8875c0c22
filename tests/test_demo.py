"""bertlab.course.demo's text output: the pretraining history table and the fill-mask guesses.

The demo itself runs end to end (at a toy budget) in tests/test_cli.py.
"""

from __future__ import annotations

from bertlab.course.demo import format_guesses, history_table


def test_history_table_leads_with_mask_accuracy_and_ends_with_the_no_context_bar():
    history = [{"step": 0, "tokens": 0, "val_mask_accuracy": 0.001, "val_mask_loss": 9.0,
                "val_mlm_accuracy": 0.0, "val_nsp_accuracy": 0.5},
               {"step": 50, "tokens": 12800, "train_loss": 7.25, "val_mask_accuracy": 0.2,
                "val_mask_unigram_accuracy": 0.044, "val_mask_unigram_loss": 6.5}]
    lines = history_table(history).splitlines()
    assert lines[0].split() == ["step", "tokens", "train", "loss", "[MASK]", "acc", "[MASK]",
                                "loss", "all", "targets", "NSP", "acc"]
    assert lines[1].split() == ["0", "0", "-", "0.001", "9.000", "0.000", "0.500"]
    assert lines[2].split() == ["50", "12800", "7.250", "0.200", "nan", "nan", "nan"]
    assert lines[3] == ("no context (always the most frequent [MASK] target): [MASK] acc 0.044, "
                        "loss 6.500 (unigram entropy)")
    assert history_table(history, baseline=0.061).splitlines()[3].startswith(
        "no context (always the most frequent [MASK] target): [MASK] acc 0.061")
    assert len(history_table(history[:1]).splitlines()) == 2  # no bar known, no last line


def test_guesses_read_as_token_and_probability():
    assert format_guesses([("stock", 0.4123), ("##s", 0.05)]) == "stock 0.41, ##s 0.05"
