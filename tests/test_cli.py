"""`python -m bertlab`: help, pretrain -> resume -> fill-mask -> export-hf end to end, bad input."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path

import pytest

from bertlab.cli import build_parser, main
from bertlab.commands import pretrain as run
from bertlab.commands.pretrain import add_dataclass_flags
from bertlab.course import demo
from bertlab.readers import load_corpus
from bertlab.recipes import recipe
from bertlab.train import TrainConfig

SMALL = ["--vocab-size", "300", "--max-seq-len", "64", "--hidden-size", "32", "--num-heads", "2",
         "--intermediate-size", "64", "--batch-size", "8", "--eval-interval", "3",
         "--eval-batches", "1", "--no-progress", "--log-interval", "0", "--device", "cpu"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    for i, doc in enumerate(load_corpus("bbc")[:40]):
        (folder / f"doc{i:02d}.txt").write_text(doc.text, encoding="utf-8")
    return folder


def test_help_lists_every_subcommand():
    done = subprocess.run([sys.executable, "-m", "bertlab", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0
    for command in ("prepare", "pretrain", "finetune", "export-hf", "fill-mask", "demo"):
        assert command in done.stdout


def test_pretrain_has_a_flag_for_every_train_config_field():
    help_text = build_parser()._subparsers._group_actions[0].choices["pretrain"].format_help()
    for f in fields(TrainConfig):
        assert "--" + f.name.replace("_", "-") in help_text
    assert "--minutes" in help_text


def test_a_field_type_without_a_flag_kind_stops_the_parser_naming_the_field():
    @dataclass
    class Settings:
        steps: int = 1
        layers: list[int] = field(default_factory=list)

    group = argparse.ArgumentParser().add_argument_group("settings")
    with pytest.raises(TypeError, match=r"Settings\.layers has type list\[int\], .*add it to "
                                        r"_FLAG_KINDS in bertlab/commands/flags\.py"):
        add_dataclass_flags(group, Settings, None, {})
    add_dataclass_flags(group, Settings, ["steps"], {})  # a field without a flag is not looked at


def test_flag_kinds_come_from_the_annotation_whether_written_as_text_or_as_a_type():
    # make_dataclass keeps the types themselves; this module's annotations are text.
    plain = make_dataclass("Plain", [("limit", int | None, 3), ("fast", bool, False),
                                     ("betas", tuple[float, float], (0.9, 0.99))])
    parser = argparse.ArgumentParser()
    add_dataclass_flags(parser.add_argument_group("plain"), plain, None, {})
    assert vars(parser.parse_args([])) == {}  # absent flags leave the dataclass defaults
    assert vars(parser.parse_args(["--limit", "none", "--no-fast", "--betas", "0.8", "0.9"])) == {
        "limit": None, "fast": False, "betas": [0.8, 0.9]}
    assert parser.parse_args(["--limit", "7"]).limit == 7


def test_pretrain_resume_fill_mask_export_end_to_end(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), "--max-steps", "3",
                 *SMALL]) == 0
    out = capsys.readouterr().out
    assert "done: 3 steps" in out and "[MASK] acc" in out
    assert (run / "tokenizer.json").is_file() and (run / "history.csv").is_file()
    settings = json.loads((run / "run.json").read_text())
    assert settings["model"]["hidden_size"] == 32 and settings["train"]["max_steps"] == 3

    # Resume with a larger budget: continues from step 3 to 6.
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), "--max-steps", "6",
                 "--resume", *SMALL]) == 0
    assert "done: 6 steps" in capsys.readouterr().out
    history = json.loads((run / "history.json").read_text())
    assert [row["step"] for row in history] == [0, 3, 6]

    assert main(["fill-mask", str(run), "the [MASK] fell sharply", "--top-k", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "the [MASK] fell sharply" and lines[1].startswith("  [MASK] #1:")
    assert lines[1].count(",") == 2  # three guesses

    hf = tmp_path / "hf"
    assert main(["export-hf", str(run), str(hf)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {hf}")
    assert (hf / "config.json").is_file() and (hf / "model.safetensors").is_file()
    assert main(["export-hf", str(run), str(hf)]) == 2  # an earlier export is kept...
    assert "--overwrite" in capsys.readouterr().err
    assert main(["export-hf", str(run), str(hf), "--overwrite"]) == 0  # ...unless asked
    assert capsys.readouterr().out.startswith(f"replaced the previous export in {hf}")
    assert main(["fill-mask", str(hf), "the [MASK] fell sharply", "--top-k", "3"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[:2] == lines[:2]  # same model, same guesses


def test_time_budget_flag(corpus, tmp_path, capsys):
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(tmp_path / "run"),
                 "--minutes", "0.02", *SMALL]) == 0
    assert "stopped by max_minutes" in capsys.readouterr().out


def test_pairs_drawn_afresh_and_batches_grouped_by_length_from_the_command_line(corpus, tmp_path,
                                                                                capsys):
    run = tmp_path / "run"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), "--max-steps", "4",
                 *SMALL, "--pair-draws", "2", "--group-by-length", "4"]) == 0
    assert "done: 4 steps" in capsys.readouterr().out
    args = json.loads((run / "run.json").read_text())["args"]
    assert args["pair_draws"] == 2 and args["group_by_length"] == 4
    # A resume with other draws is another dataset: refused, naming the draws.
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), "--max-steps", "6",
                 *SMALL, "--pair-draws", "3", "--group-by-length", "4", "--resume"]) == 2
    assert "pair draws 2, this resume has 3" in capsys.readouterr().err


def test_mlm_only_pretraining_and_evaluation_only_at_the_ends(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), "--max-steps", "4",
                 *SMALL, "--no-nsp", "--eval-interval", "none"]) == 0
    assert "done: 4 steps" in capsys.readouterr().out
    assert json.loads((run / "run.json").read_text())["args"]["nsp"] is False
    assert [row["step"] for row in json.loads((run / "history.json").read_text())] == [0, 4]


def test_one_sentence_documents_train_masked_lm_alone_as_single_segments(tmp_path, capsys):
    reviews = tmp_path / "reviews"
    reviews.mkdir()
    for i, doc in enumerate(load_corpus("bbc")[:60]):  # one sentence per file, as reviews are
        (reviews / f"r{i:02d}.txt").write_text(doc.sentences[0] + "\n", encoding="utf-8")
    run = tmp_path / "run"
    flags = ["pretrain", "--corpus", str(reviews), "--out", str(run), *SMALL]
    assert main([*flags, "--max-steps", "3", "--no-nsp"]) == 2  # pairs: none exist
    assert "--segments single" in capsys.readouterr().err
    assert main([*flags, "--max-steps", "3", "--no-nsp", "--segments", "single"]) == 0
    out = capsys.readouterr().out
    assert "MLM only on single segments" in out and "NSP acc" not in out
    assert main([*flags, "--max-steps", "6", "--no-nsp", "--resume"]) == 2
    assert "started with --segments single" in capsys.readouterr().err
    assert main([*flags, "--max-steps", "6", "--no-nsp", "--segments", "single",
                 "--resume"]) == 0
    history = json.loads((run / "history.json").read_text())
    assert history[-1]["step"] == 6 and "val_mask_accuracy" in history[-1]
    assert not any(k.startswith("val_nsp") for row in history for k in row)


@pytest.mark.parametrize("extra, message", [
    (["--preset", "huge"], "unknown preset 'huge'"),
    (["--batch-size", "7", "--grad-accum", "2"],
     "batch_size=7 (--batch-size) is not divisible by grad_accum=2 (--grad-accum)"),
    (["--schedule", "steps"], "schedule='steps' (--schedule) is not one of"),
    (["--group-by-length", "0"], "--group-by-length 0: pass how many batches"),
    (["--pair-draws", "0"], "pair_draws=0 (--pair-draws); pass a whole number >= 1"),
    # The library names the setting; the CLI adds the flag it has for it.
    (["--lr", "-1"], "TrainConfig.lr (--lr) must be a positive number, got -1.0"),
    (["--mlm-probability", "1.5"],
     "mlm_probability=1.5 (--mlm-probability) is not a probability; pass a number in [0, 1]"),
    (["--warmup-steps", "9", "--max-steps", "3"],
     "warmup_steps=9 (--warmup-steps) is not below max_steps=3 (--max-steps)"),
])
def test_bad_pretrain_settings_exit_with_a_clear_message(corpus, tmp_path, capsys, extra, message):
    code = main(["pretrain", "--corpus", str(corpus), "--out", str(tmp_path / "run"),
                 "--max-steps", "1", *SMALL, *extra])
    assert code == 2
    assert message in capsys.readouterr().err


def test_out_that_is_a_file_and_a_mismatched_resume(corpus, tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(a_file), *SMALL]) == 2
    assert "is a file" in capsys.readouterr().err
    run = tmp_path / "run"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), "--max-steps", "1",
                 *SMALL]) == 0
    capsys.readouterr()
    wider = [*SMALL[:SMALL.index("--hidden-size") + 1], "64",
             *SMALL[SMALL.index("--hidden-size") + 2:]]
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), "--max-steps", "2",
                 "--resume", *wider]) == 2
    assert "hidden_size: checkpoint 32 vs model 64" in capsys.readouterr().err


def test_a_run_that_never_saved_a_checkpoint_is_kept_until_the_user_removes_it(corpus, tmp_path,
                                                                              capsys):
    # A run stopped before its first checkpoint (a full disk, say) holds run.json, the history
    # and tokenizer.json: nothing to resume, but a new run must not replace them unasked.
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    (run / "history.json").write_text("[]")
    argv = ["pretrain", "--corpus", str(corpus), "--out", str(run), "--max-steps", "1", *SMALL]
    assert main(argv) == 2
    assert "stopped before its first checkpoint (history.json, run.json)" in capsys.readouterr().err
    assert (run / "run.json").read_text() == "{}"
    shutil.rmtree(run)
    assert main(argv) == 0
    assert "done: 1 steps" in capsys.readouterr().out
    assert json.loads((run / "run.json").read_text())["train"]["max_steps"] == 1


def test_demo_may_reuse_its_own_folder(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(demo, "run_demo", lambda out, **settings: ran.append(out))
    out = tmp_path / "demo"
    (out / "run").mkdir(parents=True)
    (out / "curves.png").write_bytes(b"png")
    (out / "results.json").write_text("{}")
    assert main(["demo", "--out", str(out), "--steps", "3", "--threads", "1"]) == 0
    assert ran == [out]


def test_fill_mask_and_export_need_a_model_folder(tmp_path, capsys):
    assert main(["fill-mask", str(tmp_path / "missing"), "a [MASK]"]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["export-hf", str(tmp_path), str(tmp_path / "hf")]) == 2
    assert "has no checkpoint" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_runs_end_to_end_and_ends_with_the_downstream_table(tmp_path, capsys):
    # The main job at a toy budget: every stage runs, the table and the files are written.
    assert main(["demo", "--out", str(tmp_path / "demo"), "--steps", "4",
                 "--finetune-epochs", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "7/7 downstream" in out
    assert "first 64 tokens of each story" in out  # the length the course recipe pretrains at
    for method in ("fine-tuned", "linear probe", "TF-IDF", "from scratch"):
        assert method in out
    results = json.loads((tmp_path / "demo" / "results.json").read_text())
    methods = sorted(r["method"] for r in results["downstream"])
    # All labels once, then 8 and 32 per class with 3 seeds each: 4 methods x (1 + 2 x 3).
    assert len(methods) == 4 * 7 and sorted({m.split()[0] for m in methods}) == [
        "TF-IDF", "fine-tuned", "from", "linear"]
    assert sorted({r["k_per_class"] or 0 for r in results["downstream"]}) == [0, 8, 32]
    assert "[MASK] acc" in out and "cloze set" in out
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in results["downstream"])
    assert (tmp_path / "demo" / "curves.png").is_file()


def test_recipe_flag_sets_the_run_and_explicit_flags_win(corpus, tmp_path, capsys):
    bert, course = recipe("bert"), recipe("course")
    for name, extra in (("bert", []), ("course", ["--nsp", "--mlm-probability", "0.2",
                                                   "--lr", "3e-4"])):
        run = tmp_path / name
        assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), "--max-steps", "2",
                     *SMALL, "--recipe", name, *extra]) == 0
        assert f"recipe: {name}" in capsys.readouterr().out
        saved = json.loads((run / "run.json").read_text())
        if name == "bert":
            assert (saved["mlm_probability"], saved["objectives"]) == (0.15, ["mlm", "nsp"])
            assert saved["train"]["optimizer"] == bert.optimizer
            assert saved["model"]["hidden_dropout"] == bert.dropout
        else:
            assert (saved["mlm_probability"], saved["objectives"]) == (0.2, ["mlm", "nsp"])
            assert saved["train"]["optimizer"] == course.optimizer
            assert saved["train"]["lr"] == 3e-4 and saved["max_seq_len"] == 64  # SMALL's
            assert saved["train"]["muon_lr"] == course.muon_lr
    with pytest.raises(SystemExit):  # argparse: "invalid choice: 'fast'", exit status 2
        main(["pretrain", "--corpus", str(corpus), "--out", str(tmp_path / "x"),
              "--recipe", "fast"])


def test_resume_with_another_recipe_is_refused_naming_the_first(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), "--max-steps", "2",
                 *SMALL, "--recipe", "bert"]) == 0
    capsys.readouterr()
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), "--max-steps", "4",
                 *SMALL, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "started with --recipe bert, not --recipe course" in err and "pass --recipe bert" in err
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), "--max-steps", "4",
                 *SMALL, "--resume", "--recipe", "bert"]) == 0


def test_sop_from_the_command_line_resumes_exactly_and_keeps_its_objectives(corpus, tmp_path,
                                                                           capsys):
    # A constant learning rate, so 3 + 3 steps follow the same schedule as 6 in one go.
    sop = [*SMALL, "--objectives", "mlm,sop", "--schedule", "constant", "--warmup-fraction", "0"]
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(straight), "--max-steps", "6",
                 *sop]) == 0
    assert "MLM + SOP" in capsys.readouterr().out
    assert json.loads((straight / "run.json").read_text())["objectives"] == ["mlm", "sop"]
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(cut), "--max-steps", "3",
                 *sop]) == 0
    capsys.readouterr()
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(cut), "--max-steps", "6",
                 "--resume", *SMALL, "--schedule", "constant", "--warmup-fraction", "0"]) == 2
    assert "objective mlm,sop, this resume has mlm; " in capsys.readouterr().err
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(cut), "--max-steps", "6",
                 "--resume", *sop]) == 0
    rows = [json.loads((run / "history.json").read_text())[-1] for run in (straight, cut)]
    assert rows[0]["step"] == rows[1]["step"] == 6
    for key in ("train_loss", "val_mlm_loss", "val_sop_accuracy", "val_sop_loss"):
        assert rows[0][key] == rows[1][key], key  # bit for bit
    assert not any(key.startswith("val_nsp") for key in rows[0])  # named by the task it learned


def test_objectives_flags_are_checked_before_anything_is_written(corpus, tmp_path, capsys):
    for extra, message in ((["--objectives", "mlm,nsp,sop"], "nsp and sop both train"),
                           (["--objectives", "sop"], "leaves out mlm"),
                           (["--objectives", "mlm,sop", "--no-nsp"], "pass --objectives alone")):
        out = tmp_path / "run"
        assert main(["pretrain", "--corpus", str(corpus), "--out", str(out), "--max-steps", "2",
                     *SMALL, *extra]) == 2
        assert message in capsys.readouterr().err
        assert not out.exists()


def test_in_a_log_the_bar_becomes_plain_lines_and_no_progress_is_silent(corpus, tmp_path,
                                                                       monkeypatch):
    # Output to a file, as `make demo > demo.log 2>&1` does: no bar of carriage returns, one
    # plain line per evaluation, and a progress line at most every LOG_EVERY_S (0 here: each step).
    import bertlab.engine.session as hooks_mod

    flags = [a for a in SMALL if a not in ("--no-progress", "--log-interval", "0")]
    log = tmp_path / "log.txt"
    done = subprocess.run([sys.executable, "-m", "bertlab", "pretrain", "--corpus", str(corpus),
                           "--out", str(tmp_path / "run"), "--max-steps", "6", *flags],
                          stdout=log.open("w"), stderr=subprocess.STDOUT, timeout=300)
    text = log.read_text()
    assert done.returncode == 0, text
    assert "\r" not in text and "it/s" not in text
    assert sum(line.startswith("step=") for line in text.splitlines()) == 3  # steps 0, 3, 6
    monkeypatch.setattr(hooks_mod, "LOG_EVERY_S", 0.0)
    plain = tmp_path / "plain.txt"
    with plain.open("w") as out, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(out):
        assert main(["pretrain", "--corpus", str(corpus), "--out", str(tmp_path / "run2"),
                     "--max-steps", "4", *flags]) == 0
    lines = plain.read_text().splitlines()
    assert [line.split()[1:4] for line in lines if line.startswith("step ")] == \
        [[str(n), "of", "4"] for n in (1, 2, 3, 4)]
    quiet = tmp_path / "quiet.txt"
    with quiet.open("w") as out, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(out):
        assert main(["pretrain", "--corpus", str(corpus), "--out", str(tmp_path / "run3"),
                     "--max-steps", "4", *SMALL[:-4], "--device", "cpu"]) == 0
    said = quiet.read_text()
    assert not any(line.startswith(("step ", "step=")) for line in said.splitlines()), said
    assert "done: 4 steps" in said


def test_finetune_reads_a_folder_of_labelled_text(corpus, tmp_path, capsys):
    run, task = tmp_path / "run", tmp_path / "my-task"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), "--max-steps", "2",
                 *SMALL]) == 0
    docs = load_corpus("bbc")
    for label in ("sport", "tech"):
        (task / label).mkdir(parents=True)
        for i, doc in enumerate([d for d in docs if d.label == label][:40]):
            (task / label / f"{i:02d}.txt").write_text(doc.text, encoding="utf-8")
    (task / "sport" / "empty-label-check.txt").write_text("A short one. Still sport.\n")
    capsys.readouterr()
    assert main(["finetune", str(run), "--task", str(task), "--methods", "tf-idf",
                 "--max-seq-len", "64", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert f"{task}: test split" in out and "TF-IDF" in out
    (task / "loose.txt").write_text("No label. None at all.\n")
    assert main(["finetune", str(run), "--task", str(task), "--methods", "tf-idf"]) == 2
    assert "lie directly in it" in capsys.readouterr().err


def test_finetune_reads_the_length_the_model_was_pretrained_at(corpus, tmp_path, capsys,
                                                               monkeypatch):
    from bertlab import cli

    run, hf, task = tmp_path / "run", tmp_path / "hf", tmp_path / "task"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), "--max-steps", "1",
                 *SMALL, "--max-position-embeddings", "64"]) == 0
    assert main(["export-hf", str(run), str(hf)]) == 0  # no MANIFEST.json: a folder of yours
    docs = load_corpus("bbc")
    for label in ("sport", "tech"):
        (task / label).mkdir(parents=True)
        for i, doc in enumerate([d for d in docs if d.label == label][:20]):
            (task / label / f"{i:02d}.txt").write_text(doc.text, encoding="utf-8")
    lengths = []

    def spy(*args, config, **kwargs):
        lengths.append(config.max_seq_len)
        return compare(*args, config=config, **kwargs)

    compare = cli.compare_downstream
    monkeypatch.setattr(cli, "compare_downstream", spy)
    tf_idf = ["--task", str(task), "--methods", "tf-idf", "--device", "cpu"]
    capsys.readouterr()
    assert main(["finetune", str(run), *tf_idf]) == 0  # run.json says 64 tokens
    assert main(["finetune", str(run), *tf_idf, "--max-seq-len", "32"]) == 0  # the flag wins
    assert main(["finetune", str(hf), *tf_idf]) == 0  # nothing records it: 128
    assert lengths == [64, 32, 128]
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("reading")]
    assert said == [
        f"reading the first 64 tokens of each document: the length the model was pretrained "
        f"at ({run / 'run.json'})",
        "reading the first 32 tokens of each document: as --max-seq-len asks",
        f"reading the first 128 tokens of each document: the default; {hf} records no "
        f"pretraining length (no run.json or MANIFEST.json with one), pass --max-seq-len to "
        f"choose"]
    # Longer than the model's 64 positions: refused as before, naming both numbers.
    assert main(["finetune", str(hf), *tf_idf[:-3], "fine-tuned", "--device", "cpu"]) == 2
    assert "max_seq_len=128 (--max-seq-len) is longer than the model's max_position_embeddings=64" in \
        capsys.readouterr().err
    # A recorded length past the positions (run.json edited) names the file and the flag.
    saved = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**saved, "max_seq_len": 512}))
    assert main(["finetune", str(run), *tf_idf]) == 2
    err = capsys.readouterr().err
    assert f"reads 512 tokens per document from the length the model was pretrained at " \
           f"({run / 'run.json'}), past the model's 64 positions" in err
    assert "pass --max-seq-len 64 (or fewer), or correct that file" in err


def test_pretrained_length_reads_run_json_then_the_manifest_and_names_a_bad_record(tmp_path):
    from bertlab.errors import BadInput
    from bertlab.loading import pretrained_length

    shipped = Path(__file__).resolve().parents[1] / "models" / "course-tiny"
    assert pretrained_length(shipped) == (64, shipped / "MANIFEST.json")
    assert pretrained_length(tmp_path) is None
    (tmp_path / "run.json").write_text('{"args": {}, "max_seq_len": null}')  # ready-made pairs
    assert pretrained_length(tmp_path) is None
    (tmp_path / "MANIFEST.json").write_text('{"recipe": {"max_seq_len": 96}}')
    assert pretrained_length(tmp_path) == (96, tmp_path / "MANIFEST.json")
    (tmp_path / "run.json").write_text('{"args": {}, "max_seq_len": 48}')
    assert pretrained_length(tmp_path) == (48, tmp_path / "run.json")
    (tmp_path / "MANIFEST.json").write_text("{not json")  # not read: run.json answers
    assert pretrained_length(tmp_path) == (48, tmp_path / "run.json")
    for run_json, named in (('{"max_seq_len": "64"}', "run.json"), ("{}", "MANIFEST.json")):
        (tmp_path / "run.json").write_text(run_json)
        with pytest.raises(BadInput, match=f"{named}: .*pass --max-seq-len"):
            pretrained_length(tmp_path)


def test_validate_also_adds_a_history_column_set_per_length(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(out), "--max-steps", "3",
                 "--validate-also", "32", *SMALL]) == 0
    history = json.loads((out / "history.json").read_text())
    assert [row["step"] for row in history] == [0, 3]
    for row in history:  # the run's own 64-token pairs, and the same documents cut at 32
        assert row["val_mask_targets"] > row["val_32_mask_targets"] > 0
    shards = tmp_path / "shards32"
    assert main(["prepare", "--corpus", str(corpus), "--out", str(shards), "--max-seq-len", "32",
                 "--tokenizer", str(out / "tokenizer.json")]) == 0
    again = tmp_path / "again"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(again), "--max-steps", "3",
                 "--tokenizer", str(out / "tokenizer.json"), "--validate-also", str(shards),
                 *SMALL]) == 0
    rows = json.loads((again / "history.json").read_text())
    assert rows[0]["val_32_mask_targets"] > 0  # the shards' validation split, at their length


def test_the_first_line_says_what_the_run_trains_not_the_recipes_defaults():
    def first_line(*flags: str) -> str:
        args = build_parser().parse_args(["pretrain", "--out", "unused", *flags])
        return run._recipe_line(run._pretrain_settings(args, Path(args.corpus)))

    course = recipe("course")
    assert first_line() == f"recipe: course (40% masked, MLM only, muon); {course.summary}"
    sop = first_line("--objectives", "mlm,sop")
    assert sop.startswith("recipe: course (40% masked, MLM + SOP, muon); ")
    assert "MLM only" not in sop and "--objectives mlm,sop in place of its own" in sop
    changed = first_line("--recipe", "gpu", "--batch-size", "64", "--mlm-probability", "0.2")
    assert "the gpu recipe with --mlm-probability 0.2, --batch-size 64 in place" in changed


def test_rows_through_pretrain_and_finetune_with_their_flags(tmp_path, capsys):
    import csv
    import gzip
    docs = load_corpus("bbc")
    chosen = [d for d in docs if d.label == "sport"][:40] + [d for d in docs if d.label == "tech"][:40]
    rows = tmp_path / "articles.jsonl.gz"
    with gzip.open(rows, "wt", encoding="utf-8") as handle:
        for doc in chosen[:40]:
            for sentence in doc.sentences:
                handle.write(json.dumps({"article": doc.id, "body": sentence}) + "\n")
        handle.write('{"article": "x", "body": ""}\n')  # a bad row, skipped and counted
    run = tmp_path / "run"
    assert main(["pretrain", "--corpus", str(rows), "--out", str(run), "--max-steps", "2",
                 "--text-field", "body", "--doc-field", "article", "--on-bad-row", "skip",
                 *SMALL]) == 0
    err = capsys.readouterr().err
    assert "warning: corpus" in err and "skipped 1 bad row(s)" in err and "record " in err
    settings = json.loads((run / "run.json").read_text())
    assert settings["corpus_read"]["bad_rows_skipped"] == 1
    assert settings["args"]["doc_field"] == "article"
    task = tmp_path / "topics.csv"
    with open(task, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["topic", "story"])
        writer.writerows([d.label, d.text] for d in chosen)
    capsys.readouterr()
    with open(task, "a", encoding="utf-8") as handle:
        handle.write("tech\n")  # a row without its story: skipped, and the --json says so
    assert main(["finetune", str(run), "--task", str(task), "--methods", "tf-idf",
                 "--text-field", "story", "--label-field", "topic", "--device", "cpu",
                 "--on-bad-row", "skip", "--json", str(tmp_path / "r.json")]) == 0
    assert f"{task}: test split" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["corpus_read"]["bad_rows_skipped"] == 1
