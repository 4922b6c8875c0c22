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
