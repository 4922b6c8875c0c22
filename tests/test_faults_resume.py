"""A resume that would change the run is refused, naming the setting and both values; what a
resume may change on purpose is recorded; a killed run resumes at once; the advice works.

The resume contract: the settings that define a run's numerics and data stream (precision,
compilation, unpadding, segments, pair draws, tokenizer, validation examples, eval batches) are
stored in every checkpoint and compared one by one on resume (`bertlab.engine.resume.check_resume`).
Each refusal below runs the real CLI in-process and checks that nothing on disk changed.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultlib import (
    SMALL,
    TINY,
    assert_one_clear_error,
    assert_unchanged,
    corpus_folder,
    expand,
    snapshot,
)

from bertlab.cli import main
from bertlab.corpus import split_documents
from bertlab.data import LoaderOptions, pretraining_loader
from bertlab.engine.checkpoint import latest_checkpoint
from bertlab.errors import BadInput
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.pretraining import evaluate, pretrain
from bertlab.readers import load_corpus
from bertlab.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, str]:
    """A corpus, a 2-step run on it, and variants: run.json gone or a list, another tokenizer
    saved as the run's, a corpus whose validation article was replaced."""
    root = tmp_path_factory.mktemp("resume")
    docs = load_corpus("bbc")
    corpus = corpus_folder(root / "corpus")
    run = root / "run"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), *TINY]) == 0
    paths = {"root": root, "corpus": corpus, "run": run}
    paths["run_no_json"] = root / "run-no-json"
    shutil.copytree(run, paths["run_no_json"])
    (paths["run_no_json"] / "run.json").unlink()
    paths["run_list_json"] = root / "run-list-json"
    shutil.copytree(run, paths["run_list_json"])
    (paths["run_list_json"] / "run.json").write_text(json.dumps([{"args": {}}]))
    paths["run_other_tok"] = root / "run-other-tokenizer"  # 300 tokens, other ones
    shutil.copytree(run, paths["run_other_tok"])
    save_tokenizer(train_tokenizer(docs[40:80], vocab_size=300),
                   paths["run_other_tok"] / "tokenizer.json")
    paths["corpus_new_val"] = root / "corpus-new-validation"
    shutil.copytree(corpus, paths["corpus_new_val"])
    held_out = split_documents(load_corpus(corpus))["validation"][0].id
    (paths["corpus_new_val"] / f"{held_out}.txt").write_text(docs[90].text, encoding="utf-8")
    return {name: str(path) for name, path in paths.items()}


def _refused(world: dict[str, str], command: str, fragments: list[str], capsys,
             inputs: tuple[str, ...] = ("corpus", "run")) -> None:
    argv = expand(command, world)
    watched = [world[name] for name in inputs] + [f"{world['root']}/new"]
    before = snapshot(*watched)
    capsys.readouterr()
    assert main(argv) == 2
    assert_one_clear_error(capsys.readouterr().err, [f.format(**world) for f in fragments])
    assert_unchanged(before, snapshot(*watched))


RESUME = "pretrain --corpus {corpus} --out {run} --resume TINY"
CASES = [
    # the numerics: another precision, compilation or unpadding computes other weights
    ("precision", f"{RESUME} --precision bf16",
     ["precision fp32, this resume has bf16", "--precision fp32", "another folder"]),
    ("compile", f"{RESUME} --compile", ["compile False, this resume has True", "--no-compile"]),
    ("unpad", f"{RESUME} --unpad", ["unpad False, this resume has True", "--no-unpad"]),
    # the data stream: named by its setting, not blamed on the corpus or --max-seq-len
    ("pair-draws", f"{RESUME} --pair-draws 3",
     ["pair draws 1, this resume has 3", "--pair-draws 1"]),
    # the yardstick of the history's val_ columns
    ("eval-batches", f"{RESUME} --eval-batches 2",
     ["eval batches 1, this resume has 2", "--eval-batches 1"]),
    ("validate-also-added", f"{RESUME} --validate-also 32",
     ["validation examples' digest", "--validate-also"]),
]


@pytest.mark.parametrize("command, fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_resume_that_changes_the_run_is_refused(world, command, fragments, capsys):
    _refused(world, command, ["{run}/checkpoints/step-00000002", *fragments], capsys)


def test_a_resume_with_replaced_validation_articles_is_refused(world, capsys):
    _refused(world, "pretrain --corpus {corpus_new_val} --out {run} --resume TINY",
             ["validation examples' digest", "the same validation documents"], capsys,
             inputs=("corpus_new_val", "run"))


def test_a_resume_on_single_segments_names_segments_without_run_json(world, capsys):
    # run.json (which names --segments) is gone: the checkpoint's own record decides.
    _refused(world, "pretrain --corpus {corpus} --out {run_no_json} --resume TINY "
             "--objectives mlm --segments single",
             ["segments nsp, this resume has single", "--segments pairs"], capsys,
             inputs=("corpus", "run_no_json"))


def test_a_resume_with_another_tokenizer_names_the_tokenizer(world, capsys):
    _refused(world, "pretrain --corpus {corpus} --out {run_other_tok} --resume TINY",
             ["tokenizer (vocabulary digest)", "the run's own tokenizer"], capsys,
             inputs=("corpus", "run_other_tok"))


def test_run_json_that_is_a_list_is_named_by_resume(world, capsys):
    _refused(world, "pretrain --corpus {corpus} --out {run_list_json} --resume TINY",
             ["{run_list_json}/run.json", "holds a JSON list", "--resume", "new run"], capsys,
             inputs=("corpus", "run_list_json"))


def test_run_json_that_is_a_list_is_named_by_export_hf(world, capsys):
    _refused(world, "export-hf {run_list_json} {root}/new",
             ["{run_list_json}/run.json", "holds a JSON list", "model card"], capsys,
             inputs=("run_list_json",))


def test_validate_also_past_the_positions_names_the_flag(world, capsys):
    _refused(world, "pretrain --corpus {corpus} --out {root}/new TINY --validate-also 600",
             ["--validate-also 600", "512 positions", "--max-position-embeddings 600"], capsys)


def test_validate_also_shards_past_the_positions_name_the_folder(world, capsys):
    # They were refused by the model, deep in the first evaluation, after training began.
    shards = f"{world['root']}/shards-128"
    if not Path(shards).exists():
        assert main(["prepare", "--corpus", world["corpus"], "--out", shards, "--max-seq-len",
                     "128", "--tokenizer", f"{world['run']}/tokenizer.json"]) == 0
    capsys.readouterr()
    _refused(world, "pretrain --corpus {corpus} --out {root}/new TINY "
                    f"--max-position-embeddings 64 --validate-also {shards}",
             [f"--validate-also {shards}", "holds 128-token pairs", "64 positions",
              "--max-seq-len 64 or less"], capsys)


def test_what_a_resume_changes_on_purpose_is_recorded(world, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(world["run"], out)
    assert main(["pretrain", "--corpus", world["corpus"], "--out", str(out), "--resume", *SMALL,
                 "--max-steps", "3", "--eval-interval", "1"]) == 0
    assert "resumed at step 2 with max_steps 2 -> 3, eval_interval 3 -> 1" in capsys.readouterr().out
    run = json.loads((out / "run.json").read_text())
    assert run["resumes"] == [{"step": 2, "changed": {"max_steps": [2, 3],
                                                      "eval_interval": [3, 1]}}]
    rows = json.loads((out / "history.json").read_text())
    assert [row.get("resumed_with") for row in rows] == \
        [None, None, "max_steps 2 -> 3, eval_interval 3 -> 1"]


def test_resume_advice_on_a_start_that_never_saved_works_when_followed(world, tmp_path, capsys):
    out = tmp_path / "never-saved"  # killed before its first checkpoint: run files, no checkpoint
    out.mkdir()
    for name in ("run.json", "tokenizer.json", "history.json"):
        shutil.copy(Path(world["run"]) / name, out / name)
    before = snapshot(out)
    assert main(["pretrain", "--corpus", world["corpus"], "--out", str(out), "--resume",
                 *TINY]) == 2
    assert_one_clear_error(capsys.readouterr().err, [
        f"--out {out}", "no checkpoint", "history.json, run.json, tokenizer.json",
        "delete the folder, then start a new run there without resume"])
    assert_unchanged(before, snapshot(out))
    shutil.rmtree(out)  # the advice, followed
    assert main(["pretrain", "--corpus", world["corpus"], "--out", str(out), *TINY]) == 0
    assert latest_checkpoint(out).name == "step-00000002"


@pytest.fixture(scope="module")
def loaders(world):
    tok = load_tokenizer(Path(world["run"]) / "tokenizer.json")
    docs = load_corpus(world["corpus"])
    options = LoaderOptions(batch_size=8, max_seq_len=64)
    model = BertForPreTraining(BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(),
                                                 hidden_size=32, num_heads=2,
                                                 intermediate_size=64))
    return model, pretraining_loader(docs, tok, split="train", options=options), \
        pretraining_loader(docs, tok, split="validation", options=options)


def test_evaluate_with_no_batches_names_max_batches(loaders):
    model, _, val = loaders
    with pytest.raises(BadInput, match=r"evaluate\(max_batches=0\): asks for no batch.*>= 1"):
        evaluate(model, val, max_batches=0)


def test_pretrain_with_a_dict_config_names_train_config(loaders, tmp_path):
    model, train, _ = loaders
    with pytest.raises(BadInput, match=r"pretrain\(config=...\): got the dict .*not a "
                                       r"bertlab.TrainConfig; pass TrainConfig\(\*\*that_dict\)"):
        pretrain(model, train, None, {"max_steps": 0}, out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _pretrain(world: dict[str, str], out: Path, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "bertlab", "pretrain", "--corpus", world["corpus"],
               "--out", str(out), "--threads", "1", *SMALL, *extra]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def test_a_run_killed_with_workers_resumes_at_once(world, tmp_path):
    # DataLoader workers outlive a kill -9 of their parent by seconds; they must not hold the
    # run folder's lock meanwhile, or the immediate --resume is refused as "in use".
    out = tmp_path / "run"
    killed = _pretrain(world, out, "--max-steps", "2000", "--num-workers", "2",
                       "--checkpoint-interval", "1", "--eval-interval", "1000")
    deadline = time.monotonic() + 120
    while latest_checkpoint(out) is None or latest_checkpoint(out).name < "step-00000003":
        assert killed.poll() is None and time.monotonic() < deadline, killed.stderr.read()
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    step = int(latest_checkpoint(out).name.removeprefix("step-"))
    resumed = _pretrain(world, out, "--max-steps", str(step + 1), "--num-workers", "2",
                        "--checkpoint-interval", "1", "--eval-interval", "1000", "--resume")
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    assert latest_checkpoint(out).name == f"step-{step + 1:08d}"
