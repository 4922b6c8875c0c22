"""Refusals name what moved, in the caller's language, with a fix that works when followed
(nothing lost, round 5): the CLI's advice parses as argv, a folder a live run holds is "in use",
never "delete it", and the API names its argument, its value and the fix.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from faultlib import SMALL, assert_one_clear_error, assert_unchanged, corpus_folder, snapshot

from bertlab.cli import main
from bertlab.engine.resume import check_resume
from bertlab.errors import BadInput
from bertlab.finetune import compare_methods
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.readers import load_corpus
from bertlab.tokenizer import train_tokenizer
from bertlab.train import TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> dict[str, Path]:
    """A run stopped after 2 of its 4 steps (one checkpoint), and its corpus."""
    root = tmp_path_factory.mktemp("refusals")
    corpus, run = corpus_folder(root / "corpus", 16), root / "run"
    argv = ["pretrain", "--corpus", str(corpus), "--out", str(run), *SMALL, "--max-steps", "4"]
    assert main([*argv, "--stop-after", "2"]) == 0
    return {"root": root, "corpus": corpus, "run": run, "argv": argv}


def test_the_betas_advice_is_argv_that_resumes(stopped_run, capsys):
    before = snapshot(stopped_run["root"])
    assert main([*stopped_run["argv"], "--resume", "--betas", "0.8", "0.99"]) == 2
    err = capsys.readouterr().err
    assert_one_clear_error(err, ["betas (0.9, 0.999)", "pass --betas 0.9 0.999"])
    assert_unchanged(before, snapshot(stopped_run["root"]))
    advice = err.split("pass --betas ")[1].split(",")[0].split()  # the two numbers it gives
    assert main([*stopped_run["argv"], "--resume", "--betas", *advice]) == 0, \
        capsys.readouterr().err


def test_resume_on_a_folder_a_live_run_holds_says_in_use_not_delete(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text("{}", encoding="utf-8")  # a start before its first checkpoint
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom bertlab.engine.folders import FolderLock\n"
         "with FolderLock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(120)",
         str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        corpus = corpus_folder(tmp_path / "corpus", 8)
        code = main(["pretrain", "--corpus", str(corpus), "--out", str(out), *SMALL,
                     "--max-steps", "2", "--resume"])
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert code == 2, err
    assert_one_clear_error(err, [str(out), f"in use by process {holder.pid}"])
    assert "delete" not in err


def test_pretrain_on_shards_prepare_is_still_writing_says_in_use(tmp_path, capsys):
    # prepare holds its --out (empty but for the lock) until the shards land in one step; a
    # pretrain started meanwhile was told the folder has "no .txt files".
    shards = tmp_path / "shards"
    shards.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom bertlab.engine.folders import FolderLock\n"
         "with FolderLock(sys.argv[1], 'shard folder'):\n    print('held', flush=True)\n"
         "    time.sleep(120)", str(shards)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        before = snapshot(tmp_path)
        code = main(["pretrain", "--corpus", str(shards), "--out", str(tmp_path / "run"), *SMALL,
                     "--max-steps", "2"])
        after = snapshot(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert code == 2, err
    assert_one_clear_error(err, [f"--corpus {shards} is in use by process {holder.pid}",
                                 "wait for it to finish"])
    assert ".txt" not in err
    assert_unchanged(before, after)


def test_a_changed_corpus_count_names_the_reading_flags():
    saved = {"train_examples": 10, "train_config": {}}
    with pytest.raises(BadInput, match=r"--doc-field.*--max-seq-len"):
        check_resume(saved, Path("run/checkpoints/step-00000002"), TrainConfig(),
                     {"train_examples": 12})


@pytest.mark.parametrize("value, hint", [("8192", "vocab_size=8192"), (8192.0, "vocab_size=8192"),
                                         (None, "vocab_size=8192")])
def test_a_vocab_size_of_the_wrong_type_names_its_type_not_its_size(value, hint):
    with pytest.raises(BadInput) as refused:
        train_tokenizer(["some text"], vocab_size=value, cache=False)
    message = str(refused.value)
    assert f"vocab_size={value!r}" in message and "not a whole number" in message
    assert hint in message and "too small" not in message


@pytest.mark.parametrize("argument", [{"methods": []}, {"methods": "tf-idf"},
                                      {"k_per_class": []}, {"seeds": ()},
                                      {"seeds": (s for s in ())}])
def test_compare_methods_refuses_an_empty_list_instead_of_returning_nothing(argument):
    docs = load_corpus("bbc")[:8]
    tok = train_tokenizer(docs, vocab_size=300, cache=False)
    model = BertForPreTraining(BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(),
                                                 hidden_size=32, intermediate_size=64))
    name = next(iter(argument))
    with pytest.raises(BadInput, match=name):
        compare_methods(model, tok, docs, **argument)


@pytest.mark.parametrize("command, words", [
    ("nsp_sentences.py --threads 0", ["--threads 0", "at least 1"]),
    ("nsp_sentences.py --sides 99", ["--sides 99", "pass sides from 1 to 6"]),
    ("nsp_sentences.py --out {tmp}", ["--out {tmp}", "is a folder", ".json file"]),
    ("attention_heads.py --models {tmp}/none", ["--models {tmp}/none", "no MANIFEST.json"]),
    ("attention_heads.py --threads 0", ["--threads 0", "at least 1"]),
], ids=["nsp-threads", "nsp-sides", "nsp-out-folder", "heads-missing-model", "heads-threads"])
def test_the_benchmark_scripts_refuse_bad_arguments_in_one_line(tmp_path, command, words):
    script, *args = command.format(tmp=tmp_path).split()
    done = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "benchmarks" / script),
                           *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert_one_clear_error(done.stderr, [w.format(tmp=tmp_path) for w in words])
    assert list(tmp_path.iterdir()) == []


def test_prepare_on_an_empty_file_names_the_corpus_not_the_tokenizer(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    before = snapshot(tmp_path)
    assert main(["prepare", "--corpus", str(empty), "--out", str(tmp_path / "s"),
                 "--vocab-size", "300"]) == 2
    assert_one_clear_error(capsys.readouterr().err, [f"--corpus {empty}", "holds no text"])
    assert_unchanged(before, snapshot(tmp_path))


def test_a_lock_that_is_a_folder_is_named_before_the_corpus_is_read(tmp_path, capsys):
    out = tmp_path / "shards"
    (out / ".lock").mkdir(parents=True)
    before = snapshot(tmp_path)
    assert main(["prepare", "--corpus", "bbc", "--out", str(out), "--vocab-size", "300"]) == 2
    captured = capsys.readouterr()
    assert_one_clear_error(captured.err, [f"--out {out}", ".lock as a folder", "remove"])
    assert captured.out == ""  # refused before the corpus was read
    assert_unchanged(before, snapshot(tmp_path))


def test_an_export_with_a_copy_of_its_runs_json_is_still_an_export(stopped_run, tmp_path,
                                                                  capsys):
    from bertlab.artefacts import folder_kind

    export = tmp_path / "export"
    assert main(["export-hf", str(stopped_run["run"]), str(export)]) == 0
    (export / "run.json").write_bytes((stopped_run["run"] / "run.json").read_bytes())
    assert folder_kind(export) == "hf"
    assert main(["fill-mask", str(export), "the [MASK] rose"]) == 0, capsys.readouterr().err


def test_an_export_says_the_length_the_model_was_pretrained_at(stopped_run, tmp_path):
    import json

    export = tmp_path / "export"
    assert main(["export-hf", str(stopped_run["run"]), str(export)]) == 0
    config = json.loads((export / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["model_max_length"] == 64  # SMALL pretrains on 64 tokens, of 512 positions
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(export))
    assert len(tok("word " * 300, truncation=True)["input_ids"]) == 64


def test_a_resume_over_a_model_flag_names_the_flag_and_its_value(stopped_run, capsys):
    before = snapshot(stopped_run["root"])
    assert main([*stopped_run["argv"], "--resume", "--hidden-dropout", "0.2"]) == 2
    err = capsys.readouterr().err
    assert_one_clear_error(err, ["hidden_dropout: checkpoint 0.0 vs model 0.2",
                                 "pass the run's own settings (--hidden-dropout 0.0)"])
    assert_unchanged(before, snapshot(stopped_run["root"]))


def test_an_edited_run_json_does_not_decide_a_resume(tmp_path, capsys):
    import json

    corpus, run = corpus_folder(tmp_path / "corpus", 16), tmp_path / "run"
    argv = ["pretrain", "--corpus", str(corpus), "--out", str(run), *SMALL, "--max-steps", "4"]
    assert main([*argv, "--stop-after", "2"]) == 0
    record = json.loads((run / "run.json").read_text(encoding="utf-8"))
    record["args"]["segments"] = "single"  # edited by hand: the checkpoint says pairs
    (run / "run.json").write_text(json.dumps(record), encoding="utf-8")
    assert main([*argv, "--resume"]) == 0, capsys.readouterr().err
    assert "done: 4 steps" in capsys.readouterr().out
