"""Every Python block in README.md runs as printed (issue 57), with only its step counts made
small, by the replacements in SMALLER (each must match exactly once, so a rewritten block cannot
slip past them). Each block runs alone in a fresh interpreter, in an empty folder that sees the
repository's models/ (the shipped course models the README loads by path)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(encoding="utf-8"),
                    flags=re.M | re.S)
# The README's budgets -> a test's: fewer pretraining steps, a fraction of a fine-tuning epoch,
# two Trainer steps with a checkpoint saved at the second. Nothing else of a block changes.
SMALLER = {
    "course.train_config(max_steps=2500)": "course.train_config(max_steps=20, eval_interval=10)",
    "bl.FinetuneConfig(max_seq_len=course.max_seq_len)":
        "bl.FinetuneConfig(max_seq_len=course.max_seq_len, epochs=0.05, min_steps=2)",
    'transformers.TrainingArguments("out", remove_unused_columns=False)':
        'transformers.TrainingArguments("out", remove_unused_columns=False, max_steps=2, '
        'report_to=[], save_strategy="steps", save_steps=2)',
}


def test_the_readme_has_the_blocks_this_test_runs():
    assert len(BLOCKS) == 3, f"README.md has {len(BLOCKS)} Python blocks"
    for before in SMALLER:
        assert sum(block.count(before) for block in BLOCKS) == 1, before


@pytest.mark.slow
@pytest.mark.parametrize("number", range(len(BLOCKS)), ids=lambda n: f"block-{n + 1}")
def test_a_readme_block_runs_as_printed(tmp_path, number):
    code = BLOCKS[number]
    for before, after in SMALLER.items():
        code = code.replace(before, after)
    if "import transformers" in code or "transformers" in code.split("\n", 1)[0]:
        pytest.importorskip("transformers")
    (tmp_path / "models").symlink_to(REPO / "models")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_DISABLED": "true"})
    assert done.returncode == 0, f"README block {number + 1} failed:\n{done.stderr[-3000:]}"
