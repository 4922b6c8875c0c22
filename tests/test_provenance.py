"""A run says what made it: run.json records the versions, the platform, the CPU's bf16 and the
commit (issue 57), as a course model's MANIFEST does."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from faultlib import SMALL, corpus_folder

from bertlab.cli import main

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def test_run_json_records_versions_platform_and_commit(tmp_path):
    run = tmp_path / "run"
    assert main(["pretrain", "--corpus", str(corpus_folder(tmp_path / "c", 8)), "--out",
                 str(run), *SMALL, "--max-steps", "1"]) == 0
    made = json.loads((run / "run.json").read_text(encoding="utf-8"))["made_with"]
    assert made["torch"] == torch.__version__ and made["python"].count(".") == 2
    assert made["platform"] and isinstance(made["native_bf16"], bool)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode == 0:  # a checkout: the commit, marked when bertlab/ has changes
        assert made["commit"].split("+")[0] == head.stdout.strip()


def test_prepare_and_pretrain_say_what_they_left_out_and_why(tmp_path, capsys):
    corpus = corpus_folder(tmp_path / "c")
    assert main(["prepare", "--corpus", str(corpus), "--out", str(tmp_path / "s"),
                 "--vocab-size", "300", "--max-seq-len", "64"]) == 0
    said = capsys.readouterr().out
    meta = json.loads((tmp_path / "s" / "train" / "meta.json").read_text(encoding="utf-8"))
    assert meta["tokens_dropped"] > 0  # BBC articles do not fit 64-token pairs whole
    assert f"left out: {meta['tokens_dropped']:,} tokens" in said
    assert "pairs longer than --max-seq-len 64" in said
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(tmp_path / "r"), *SMALL,
                 "--max-steps", "1"]) == 0
    assert "left out: " in capsys.readouterr().out
