"""DDP: two gloo processes on CPU train exactly like one process with the same global batch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file

from bertlab.data import LoaderOptions, ShardedEpochSampler, pretraining_loader
from bertlab.engine.device import close_distributed
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.pairs import create_nsp_examples
from bertlab.pretraining import pretrain
from bertlab.readers import load_corpus
from bertlab.tokenizer import train_tokenizer
from bertlab.train import TrainConfig

GLOBAL_BATCH = 8
STEPS = 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _data():
    docs = load_corpus("bbc")
    tok = train_tokenizer(docs[:200], vocab_size=500)
    return tok, list(create_nsp_examples(docs[:40], tok, max_seq_len=64, seed=0))


def _run(rank: int, world: int, out: str, tok, examples) -> list[float]:
    """Train a tiny model for STEPS steps on `world` processes; return rank's step losses."""
    torch.set_num_threads(1)

    # One process uses the loader's default order; the ranks split that same order (what
    # sampler="distributed" builds under torchrun).
    def sampler(dataset):
        return ShardedEpochSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)

    train = pretraining_loader(examples, tok, split=None, seed=0,
                               options=LoaderOptions(batch_size=GLOBAL_BATCH // world,
                                                     sampler=sampler if world > 1 else None))
    # Dropout off: each process has its own dropout stream, so with dropout the runs would
    # differ by design.
    config = BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), hidden_size=32,
                               num_heads=2, intermediate_size=64, max_position_embeddings=64,
                               hidden_dropout=0.0, attention_dropout=0.0)
    model = BertForPreTraining(config, generator=torch.Generator().manual_seed(0))
    settings = TrainConfig(max_steps=STEPS, batch_size=GLOBAL_BATCH, lr=3e-3, progress=False,
                           log_interval=0, checkpoint_interval=3, device="cpu")
    result = pretrain(model, train, None, settings, out_dir=Path(out) / f"world{world}")
    return result.step_losses


def _worker(rank: int, world: int, port: int, out: str, tok, examples) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        losses = _run(rank, world, out, tok, examples)
        Path(out, f"losses-rank{rank}.json").write_text(json.dumps(losses))
        # Leave together: a rank that tears gloo down while its partner still talks to it can
        # abort ("terminate called without an active exception"), a flaky failure.
        close_distributed()
    finally:
        if dist.is_initialized():  # a failed rank: leave without waiting for the others
            dist.destroy_process_group()
    # Even after a clean goodbye, gloo's threads could abort this process's C++ teardown (about
    # one run in ten on 2 cores); the results are on disk, so end the process here.
    os._exit(0)


@pytest.mark.slow
def test_two_gloo_processes_match_one_process(tmp_path):
    tok, examples = _data()
    single = _run(0, 1, str(tmp_path), tok, examples)
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path), tok, examples), nprocs=2, join=True)
    rank0 = json.loads((tmp_path / "losses-rank0.json").read_text())
    rank1 = json.loads((tmp_path / "losses-rank1.json").read_text())
    assert rank0 == rank1  # every rank logs the same (all-reduced) loss
    assert rank0 == pytest.approx(single, abs=1e-5)
    assert single[-1] < single[0]
    # Only rank 0 wrote checkpoints, and they hold both ranks' dropout streams.
    last = tmp_path / "world2" / "checkpoints" / f"step-{STEPS:08d}"
    rng = load_file(str(last / "rng.safetensors"))
    assert sorted(rng) == ["rank0.torch_cpu", "rank1.torch_cpu"]


def _torchrun_pretrain(tmp_path, *flags: str) -> tuple[subprocess.CompletedProcess, Path]:
    """Run `pretrain` under torchrun with 2 CPU processes on 40 BBC documents and a very small
    model; return the finished process and the run folder."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, doc in enumerate(load_corpus("bbc")[:40]):
        (corpus / f"doc{i:02d}.txt").write_text(doc.text)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_port", str(_free_port()), "-m", "bertlab", "pretrain",
           "--corpus", str(corpus), "--out", str(out), "--vocab-size", "300",
           "--max-seq-len", "64", "--hidden-size", "32", "--num-heads", "2",
           "--intermediate-size", "64", "--max-steps", "3", *flags, "--no-progress",
           "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env), out


@pytest.mark.slow
def test_torchrun_cli_runs_two_processes(tmp_path):
    done, out = _torchrun_pretrain(tmp_path, "--batch-size", "8", "--eval-interval", "3",
                                   "--eval-batches", "1")
    assert done.returncode == 0, done.stderr
    assert "2 process(es)" in done.stdout and done.stdout.count("done: 3 steps") == 1
    assert (out / "checkpoints" / "step-00000003" / "model.safetensors").is_file()
    history = json.loads((out / "history.json").read_text())
    assert [row["step"] for row in history] == [0, 3]
    assert "val_mlm_accuracy" in history[-1]


@pytest.mark.slow
def test_torchrun_refuses_a_batch_that_does_not_split_before_writing(tmp_path):
    # Each of 2 processes would load 3.5 examples of a batch of 7: the library refuses it, naming
    # the flag, before the run folder is made.
    done, out = _torchrun_pretrain(tmp_path, "--batch-size", "7")
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors and all("TrainConfig.batch_size=7 (--batch-size)" in e and "2 process(es)" in e
                          and "multiple of 2" in e for e in errors), done.stderr
    assert not out.exists()  # (torchrun adds its own traceback of the failed processes)
