"""One run folder: what the library's `pretrain` writes, every command of the CLI reads.

A notebook user's run and a CLI user's run are the same thing: `bl.pretrain(..., out_dir=)`
writes the tokenizer and run.json beside the checkpoints and the history, so `fill-mask`,
`export-hf`, `finetune` and `pretrain --resume` open it as they open a folder the CLI made.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from faultlib import SMALL, corpus_folder

import bertlab as bl
from bertlab.cli import main
from bertlab.data import LoaderOptions
from bertlab.loading import list_checkpoints
from bertlab.readers import load_corpus
from bertlab.recipes import recipe

pytestmark = pytest.mark.usefixtures("one_thread")


def _library_run(corpus: Path, out: Path) -> None:
    """Pretrain 2 steps with the library, with the settings `pretrain --recipe bert` and
    faultlib's SMALL flags give, into `out`."""
    chosen = recipe("bert")
    docs = load_corpus(corpus)
    tok = bl.train_tokenizer(docs, vocab_size=300)
    options = LoaderOptions(batch_size=8, max_seq_len=64, pairs="nsp")
    train = bl.pretraining_loader(docs, tok, split="train", seed=0, options=chosen.loader_options(
        batch_size=8, max_seq_len=64))
    val = bl.pretraining_loader(docs, tok, split="validation", seed=0, options=options)
    config = chosen.train_config(max_steps=2, batch_size=8, eval_interval=3, eval_batches=1,
                                 progress=False, log_interval=0, device="cpu")
    model_config = chosen.model_config("tiny", tok.get_vocab_size(), hidden_size=32,
                                       num_heads=2, intermediate_size=64)
    model = bl.BertForPreTraining(model_config,
                                  generator=torch.Generator().manual_seed(config.seed))
    bl.pretrain(model, train, val, config, out_dir=out, objectives=chosen.objectives)


def test_a_library_run_folder_is_complete_and_every_command_reads_it(tmp_path, capsys):
    corpus = corpus_folder(tmp_path / "corpus", 80)
    run = tmp_path / "run"
    _library_run(corpus, run)
    assert (run / "tokenizer.json").is_file() and len(list_checkpoints(run)) == 1
    record = json.loads((run / "run.json").read_text())
    assert record["objectives"] == ["mlm", "nsp"] and record["mlm_probability"] == 0.15
    assert record["max_seq_len"] == 64 and record["model"]["hidden_size"] == 32
    assert record["train"]["max_steps"] == 2 and "args" not in record
    capsys.readouterr()

    assert main(["fill-mask", str(run), "the [MASK] rose sharply"]) == 0
    assert "[MASK] #1:" in capsys.readouterr().out

    assert main(["export-hf", str(run), str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "config.json").is_file()
    assert (tmp_path / "hf" / "tokenizer.json").is_file()

    task = tmp_path / "task"
    docs = load_corpus(corpus)
    for label, texts in (("a", docs[:40]), ("b", docs[40:])):
        (task / label).mkdir(parents=True)
        for i, doc in enumerate(texts):
            (task / label / f"{i}.txt").write_text(" ".join(doc.sentences))
    assert main(["finetune", str(run), "--task", str(task), "--methods", "linear-probe",
                 "--max-seq-len", "64", "--device", "cpu"]) == 0
    assert "linear probe" in capsys.readouterr().out

    assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), "--resume",
                 "--recipe", "bert", "--max-steps", "4", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "resumed at step 2" in out, out
    assert [p.name for p in list_checkpoints(run)][-1] == "step-00000004"
