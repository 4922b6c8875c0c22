"""Bad input to `python -m bertlab`: one `error:` line that names the input, exit code 2, no
traceback, and nothing on disk changed.

Most cases run in-process through `bertlab.cli.main`. To add one, add a line to CASES:
(id, command line, fragments the error line must contain). The command line is split like a
shell would; `{name}` is a path from the `world` fixture, `TINY` expands to a 2-step tiny-model
pretrain.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from faultlib import assert_one_clear_error, assert_unchanged, private_tmpfs_works, snapshot

import bertlab.engine.checkpoint as checkpoint_mod
import bertlab.pretraining as pretraining_mod
from bertlab.cli import COMMANDS, main
from bertlab.corpus import split_of
from bertlab.engine.checkpoint import latest_checkpoint, save_checkpoint
from bertlab.hf import load_hf, save_hf
from bertlab.loading import list_checkpoints, load_run
from bertlab.readers import load_corpus
from bertlab.tokenizer import save_tokenizer, train_tokenizer

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--vocab-size", "300", "--max-seq-len", "64", "--hidden-size", "32", "--num-heads", "2",
         "--intermediate-size", "64", "--batch-size", "8", "--eval-interval", "3",
         "--eval-batches", "1", "--no-progress", "--log-interval", "0", "--device", "cpu"]
# A case that is wrongly accepted then finishes in seconds instead of training for an hour.
TINY = ["--max-steps", "2", *SMALL]


pytestmark = pytest.mark.usefixtures("one_thread")


def _copy(src: Path, dst: Path, drop: str | None = None) -> Path:
    shutil.copytree(src, dst)
    if drop:
        (dst / drop).unlink()
    return dst


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, str]:
    """Return the paths the cases refer to: a run, shards, an HF export and broken variants."""
    root = tmp_path_factory.mktemp("world")
    docs = load_corpus("bbc")
    corpus = root / "corpus"
    corpus.mkdir()
    for i, doc in enumerate(docs[:40]):
        (corpus / f"doc{i:02d}.txt").write_text(doc.text, encoding="utf-8")
    run, shards, hf = root / "run", root / "shards", root / "hf"
    assert main(["pretrain", "--corpus", str(corpus), "--out", str(run), *TINY]) == 0
    assert main(["prepare", "--corpus", str(corpus), "--out", str(shards), "--vocab-size", "300",
                 "--max-seq-len", "64"]) == 0
    assert main(["export-hf", str(run), str(hf)]) == 0
    paths = {"root": root, "corpus": corpus, "run": run, "shards": shards, "hf": hf}

    (root / "file").write_text("not a folder\n")
    (root / "other").mkdir()
    (root / "other" / "notes.txt").write_text("my own notes\n")
    paths.update(file=root / "file", other=root / "other", empty=root / "empty")
    (root / "empty").mkdir()
    paths["one_sentence"] = root / "one-sentence-docs"
    paths["one_sentence"].mkdir()
    for i, doc in enumerate(docs[:30]):
        (paths["one_sentence"] / f"review{i:02d}.txt").write_text(doc.sentences[0] + "\n")
    paths["single_shards"] = root / "single-shards"  # prepare --segments single of those
    assert main(["prepare", "--corpus", str(paths["one_sentence"]), "--out",
                 str(paths["single_shards"]), "--vocab-size", "300", "--max-seq-len", "64",
                 "--segments", "single"]) == 0
    paths["latin1"] = root / "latin1"  # one file saved in Windows' cp1252, not UTF-8
    paths["latin1"].mkdir()
    for i, doc in enumerate(docs[:40]):
        text = doc.text.replace("the", "th\xe9") if i == 3 else doc.text
        (paths["latin1"] / f"doc{i:02d}.txt").write_bytes(
            text.encode("cp1252" if i == 3 else "utf-8"))
    for name in ("small_task", "latin1_task"):  # two labels; no test document / a cp1252 file
        paths[name] = root / name.replace("_", "-")
        for label in ("business", "sport"):
            (paths[name] / label).mkdir(parents=True)
            ids = [f"{label}{i}" for i in range(60) if split_of(f"{label}/{label}{i}") == "train"]
            for i, stem in enumerate(ids[:3] if name == "small_task" else ids[:12]):
                text = docs[i].text.replace("the", "th\xe9") if label == "sport" and i == 1 \
                    else docs[i].text
                coding = "cp1252" if name == "latin1_task" and text != docs[i].text else "utf-8"
                (paths[name] / label / f"{stem}.txt").write_bytes(text.encode(coding))
    paths["few_docs"] = root / "few-docs"  # a few dozen pairs: fewer than --recipe gpu's batch
    paths["few_docs"].mkdir()
    for i, doc in enumerate(docs[:8]):
        (paths["few_docs"] / f"doc{i}.txt").write_text(doc.text, encoding="utf-8")
    paths["one_doc"] = root / "one-doc"
    paths["one_doc"].mkdir()
    (paths["one_doc"] / "a.txt").write_text(docs[0].text, encoding="utf-8")

    model, tok = load_run(run)
    tok_400 = save_tokenizer(train_tokenizer(docs[:40], vocab_size=400), root / "tok-400.json")
    tok_other = train_tokenizer(docs[40:80], vocab_size=300)
    assert tok_other.get_vocab_size() == tok.get_vocab_size() == 300
    assert tok_other.get_vocab() != tok.get_vocab()
    paths["tok_400"] = tok_400
    paths["tok_other"] = save_tokenizer(tok_other, root / "tok-other-300.json")

    paths["run_no_tok"] = _copy(run, root / "run-no-tokenizer", drop="tokenizer.json")
    paths["run_no_ckpt"] = root / "run-no-checkpoint"
    paths["run_no_ckpt"].mkdir()
    shutil.copy(run / "run.json", paths["run_no_ckpt"] / "run.json")
    paths["run_big_tok"] = _copy(run, root / "run-big-tokenizer")
    shutil.copy(tok_400, paths["run_big_tok"] / "tokenizer.json")
    tok_200 = save_tokenizer(train_tokenizer(docs[:40], vocab_size=200), root / "tok-200.json")
    paths["run_small_tok"] = _copy(run, root / "run-small-tokenizer")
    shutil.copy(tok_200, paths["run_small_tok"] / "tokenizer.json")
    paths["tok_400_json"] = tok_400
    paths["run_no_json"] = _copy(run, root / "run-no-run-json", drop="run.json")
    paths["run_bad_json"] = _copy(run, root / "run-bad-json")
    text = (run / "run.json").read_text()
    (paths["run_bad_json"] / "run.json").write_text(text[: len(text) // 2])  # a cut-off write
    paths["json"] = root / "notes.json"  # one JSON document, not rows
    paths["json"].write_text(json.dumps([{"text": d.text} for d in docs[:20]]))
    rows = [json.dumps({"text": d.text}) + "\n" for d in docs[:20]]
    good_rows = "".join(rows)
    paths["jsonl_bad"] = root / "notes.jsonl"  # record 3 is cut off
    paths["jsonl_bad"].write_text("".join(rows[:2]) + rows[2][:40] + "\n" + "".join(rows[3:]))
    paths["csv"] = root / "reviews.csv"  # the text is under "body"
    paths["csv"].write_text("id,body\n" + "".join(f'{i},"{d.sentences[0]}"\n'
                                                   for i, d in enumerate(docs[:20])))
    paths["gz_bad"] = root / "notes.jsonl.gz"  # named .gz, but not gzip
    paths["gz_bad"].write_text(good_rows)
    paths["pages"] = root / "pages.jsonl"  # page "a" comes back after page "b"
    paths["pages"].write_text("".join(json.dumps({"page": p, "text": d.text}) + "\n"
                                      for p, d in zip("aabba", docs[:5], strict=True)))
    paths["reviews"] = root / "reviews.jsonl"  # a task of rows, labelled under "label"
    paths["reviews"].write_text("".join(json.dumps({"text": d.text, "label": d.label}) + "\n"
                                        for d in docs[:40]))
    paths["reviews_null"] = root / "reviews-null-label.jsonl"  # record 4 has no label
    paths["reviews_null"].write_text("".join(json.dumps({"text": d.text, "label": None if i == 3
                                                         else d.label}) + "\n"
                                             for i, d in enumerate(docs[:40])))
    paths["rows_empty"] = root / "rows-empty-text.csv"  # record 2's text is blank
    paths["rows_empty"].write_text("text\nA first row. Two sentences.\n\"   \"\nLast row.\n")
    paths["loop_corpus"] = _copy(corpus, root / "corpus-with-a-loop")
    (paths["loop_corpus"] / "again").symlink_to(paths["loop_corpus"], target_is_directory=True)
    paths["hf_big_tok"] = _copy(hf, root / "hf-big-tokenizer")
    shutil.copy(tok_400, paths["hf_big_tok"] / "tokenizer.json")
    paths["hf_no_weights"] = _copy(hf, root / "hf-no-weights", drop="model.safetensors")

    config = json.loads((hf / "config.json").read_text())
    for name, text in [("hf_bad_json", '{"vocab_size": 300,\n "hidden_size": }'),
                       ("hf_no_key", json.dumps({k: v for k, v in config.items()
                                                 if k != "hidden_size"})),
                       ("hf_wrong_type", json.dumps(config | {"num_hidden_layers": "two"})),
                       ("hf_bad_eps", json.dumps(config | {"layer_norm_eps": -1e-12})),
                       ("hf_nan_init", json.dumps(config | {"initializer_range": float("nan")})),
                       ("hf_negative_init", json.dumps(config | {"initializer_range": -0.02}))]:
        paths[name] = _copy(hf, root / name.replace("_", "-"))
        (paths[name] / "config.json").write_text(text)

    with torch.no_grad():
        nan_model = load_hf(hf)
        nan_model.mlm.dense.weight[0, 0] = float("nan")
        paths["hf_nan"] = save_hf(nan_model, tok, root / "hf-nan")
        paths["run_nan"] = _copy(run, root / "run-nan")
        save_checkpoint(latest_checkpoint(paths["run_nan"]), nan_model)
        # Finite weights whose products overflow float32: inf, then NaN after LayerNorm.
        huge = load_hf(hf)
        for layer in huge.bert.layers:
            layer.ffn_in.weight.fill_(1e30)
            layer.ffn_out.weight.fill_(1e30)
        paths["hf_overflow"] = save_hf(huge, tok, root / "hf-overflow")
    return {name: str(path) for name, path in paths.items()}


def expand(command: str, world: dict[str, str]) -> list[str]:
    argv: list[str] = []
    for token in shlex.split(command):
        argv += TINY if token == "TINY" else [token.format(**world)]
    return argv


CASES = [
    # pretrain: the output folder
    ("pretrain-into-a-run-without-resume", "pretrain --corpus {corpus} --out {run} TINY",
     ["--out {run}", "--resume", "nothing was written"]),
    ("pretrain-into-shards", "pretrain --corpus {corpus} --out {shards} TINY",
     ["--out {shards}", "prepared NSP shards"]),
    ("pretrain-into-an-hf-export", "pretrain --corpus {corpus} --out {hf} TINY",
     ["--out {hf}", "Hugging Face"]),
    ("pretrain-into-other-files", "pretrain --corpus {corpus} --out {other} TINY",
     ["--out {other}", "other files"]),
    ("pretrain-out-is-a-file", "pretrain --corpus {corpus} --out {file} TINY",
     ["--out {file}", "is a file"]),
    ("pretrain-out-under-a-file", "pretrain --corpus {corpus} --out {file}/run TINY",
     ["--out {file}/run", "{file} is a file"]),
    ("pretrain-resume-new-folder", "pretrain --corpus {corpus} --out {root}/new --resume TINY",
     ["--resume", "{root}/new", "no checkpoint"]),
    ("pretrain-into-a-run-that-never-saved", "pretrain --corpus {corpus} --out {run_no_ckpt} TINY",
     ["--out {run_no_ckpt}", "before its first checkpoint", "run.json", "delete the folder"]),
    # A start refused before its first step leaves nothing behind: the fix it names then works
    # with the same --out (issue 37; a start that fails is below).
    ("pretrain-fp16-on-a-cpu", "pretrain --corpus {corpus} --out {root}/fp16 --precision fp16 TINY",
     ["fp16", "needs a GPU", "bf16"]),
    ("pretrain-resume-run-without-checkpoint",
     "pretrain --corpus {corpus} --out {run_no_ckpt} --resume TINY",
     ["--resume", "{run_no_ckpt}", "no checkpoint"]),
    # pretrain: the tokenizer
    ("pretrain-resume-tokenizer-of-another-size",
     "pretrain --corpus {corpus} --out {run} --resume --tokenizer {tok_400} TINY",
     ["--tokenizer {tok_400}", "{run}/tokenizer.json", "400 vs 300 tokens"]),
    ("pretrain-resume-tokenizer-same-size-other-tokens",
     "pretrain --corpus {corpus} --out {run} --resume --tokenizer {tok_other} TINY",
     ["--tokenizer {tok_other}", "both have 300 tokens, but not the same ones"]),
    ("pretrain-shards-with-another-tokenizer",
     "pretrain --corpus {shards} --out {root}/new --tokenizer {tok_400} TINY",
     ["{tok_400}", "{shards}", "400 vs 300 tokens"]),
    ("pretrain-shards-with-another-pair-length",
     "pretrain --corpus {shards} --out {root}/new TINY --max-seq-len 32",
     ["--max-seq-len 32", "{shards}", "hold 64-token pairs", "prepare again with --max-seq-len 32"]),
    ("pretrain-tokenizer-missing",
     "pretrain --corpus {corpus} --out {root}/new --tokenizer {root}/nope.json TINY",
     ["{root}/nope.json", "does not exist"]),
    # pretrain: corpus and settings
    ("pretrain-corpus-missing", "pretrain --corpus {root}/nope --out {root}/new TINY",
     ["{root}/nope"]),
    ("pretrain-max-seq-len-too-small",
     "pretrain --corpus {corpus} --out {root}/new TINY --max-seq-len 4",
     ["max_seq_len=4", "too small"]),
    ("pretrain-max-seq-len-beyond-positions",
     "pretrain --corpus {corpus} --out {root}/new TINY --max-position-embeddings 32",
     ["--max-seq-len 64", "--max-position-embeddings 32"]),
    ("pretrain-threads-0", "pretrain --corpus {corpus} --out {root}/new TINY --threads 0",
     ["--threads 0"]),
    ("pretrain-threads-negative", "pretrain --corpus {corpus} --out {root}/new TINY --threads -2",
     ["--threads -2"]),
    ("pretrain-num-workers-negative",
     "pretrain --corpus {corpus} --out {root}/new TINY --num-workers -1", ["--num-workers -1"]),
    ("pretrain-heads-do-not-divide-hidden",
     "pretrain --corpus {corpus} --out {root}/new TINY --num-heads 3",
     ["hidden_size=32", "num_heads=3"]),
    ("pretrain-unknown-preset", "pretrain --corpus {corpus} --out {root}/new TINY --preset huge",
     ["unknown preset 'huge'"]),
    # settings that would train on nothing, or grow the model unasked
    ("pretrain-mlm-probability-0",
     "pretrain --corpus {corpus} --out {root}/new TINY --mlm-probability 0",
     ["--mlm-probability 0", "learn nothing"]),
    ("pretrain-max-seq-len-past-512-positions",
     "pretrain --corpus {corpus} --out {root}/new TINY --max-seq-len 100000",
     ["--max-seq-len 100000", "--max-position-embeddings 512", "--max-position-embeddings 100000"]),
    # a setting named as the library knows it and by the flag the user typed
    ("pretrain-lr-negative", "pretrain --corpus {corpus} --out {root}/new TINY --lr -1",
     ["TrainConfig.lr (--lr) must be a positive number", "-1.0"]),
    ("pretrain-warmup-past-the-run",
     "pretrain --corpus {corpus} --out {root}/new TINY --warmup-steps 5",
     ["warmup_steps=5 (--warmup-steps)", "max_steps=2 (--max-steps)"]),
    ("pretrain-no-budget", "pretrain --corpus {corpus} --out {root}/new TINY --max-steps none",
     ["needs a budget", "--max-steps", "--max-minutes"]),
    ("pretrain-schedule-unknown", "pretrain --corpus {corpus} --out {root}/new TINY --schedule steps",
     ["TrainConfig.schedule='steps' (--schedule) is not one of linear, cosine, constant"]),
    # a resume that would continue with other settings than the run's
    ("pretrain-resume-with-another-lr", "pretrain --corpus {corpus} --out {run} --resume TINY --lr 0.5",
     ["--resume", "trained with lr 0.001", "has 0.5", "pass --lr 0.001"]),
    ("pretrain-resume-with-another-mlm-probability",
     "pretrain --corpus {corpus} --out {run} --resume TINY --mlm-probability 0.2",
     ["trained with masking mlm_probability 0.4", "has 0.2", "--mlm-probability 0.4"]),
    # the same, with run.json gone: the checkpoint's own state is what a resume is checked on
    ("pretrain-resume-run-json-deleted-another-lr",
     "pretrain --corpus {corpus} --out {run_no_json} --resume TINY --lr 0.005",
     ["trained with lr 0.001", "has 0.005", "pass --lr 0.001", "nothing was written"]),
    ("pretrain-resume-run-json-deleted-another-mlm-probability",
     "pretrain --corpus {corpus} --out {run_no_json} --resume TINY --mlm-probability 0.15",
     ["trained with masking mlm_probability 0.4", "has 0.15", "--mlm-probability 0.4"]),
    ("pretrain-resume-run-json-deleted-another-schedule",
     "pretrain --corpus {corpus} --out {run_no_json} --resume TINY --schedule cosine",
     ["trained with schedule linear", "has cosine", "--schedule linear"]),
    ("pretrain-resume-grouped-on-an-ungrouped-run",
     "pretrain --corpus {corpus} --out {run} --resume TINY --group-by-length 4",
     ["group_by_length 0", "has 4", "--group-by-length"]),
    # a validation set that is not one
    ("pretrain-validate-also-neither-length-nor-shards",
     "pretrain --corpus {corpus} --out {root}/new TINY --validate-also {other}",
     ["--validate-also {other}", "neither a token length", "shard folder"]),
    ("pretrain-validate-also-the-runs-own-length",
     "pretrain --corpus {corpus} --out {root}/new TINY --validate-also 64",
     ["--validate-also 64", "the run's own validation pairs"]),
    ("pretrain-validate-also-a-length-on-shards",
     "pretrain --corpus {shards} --out {root}/new TINY --validate-also 32",
     ["--validate-also 32", "shard folder", "prepare --max-seq-len 32"]),
    ("pretrain-resume-run-json-cut-off",
     "pretrain --corpus {corpus} --out {run_bad_json} --resume TINY",
     ["{run_bad_json}/run.json", "not valid JSON", "new run"]),
    # files whose syntax is not text
    ("pretrain-corpus-json", "pretrain --corpus {json} --out {root}/new TINY",
     ["{json}", "JSON file", "JSON Lines", ".txt"]),
    # issue 39: rows (JSON Lines, CSV, TSV, Parquet)
    ("pretrain-corpus-jsonl-bad-row", "pretrain --corpus {jsonl_bad} --out {root}/new TINY",
     ["{jsonl_bad}", "record 3 (line 3: ", "is not valid JSON", "--on-bad-row skip"]),
    ("prepare-corpus-csv-without-the-text-field", "prepare --corpus {csv} --out {root}/new",
     ["{csv}", "no field 'text' (--text-field)", "'id', 'body'", "pass --text-field"]),
    ("prepare-corpus-gz-that-is-not-gzip", "prepare --corpus {gz_bad} --out {root}/new",
     ["{gz_bad}", "cannot be read", "gzip"]),
    ("prepare-doc-field-value-comes-back",
     "prepare --corpus {pages} --out {root}/new --doc-field page",
     ["{pages}", "record 5", "page='a' (--doc-field) again", "put the rows of each document together"]),
    ("prepare-text-field-on-a-folder", "prepare --corpus {corpus} --out {root}/new --text-field body",
     ["--text-field body", "'{corpus}' is a folder of .txt files, which has no fields"]),
    ("pretrain-doc-field-on-a-txt-file",
     "pretrain --corpus {corpus}/doc00.txt --out {root}/new TINY --doc-field id",
     ["--doc-field id", "BERT-format text file, which has no fields"]),
    ("finetune-task-rows-without-the-label-field",
     "finetune {run} --task {reviews} --methods tf-idf --label-field topic",
     ["{reviews}", "no field 'topic' (--label-field)", "'text', 'label'"]),
    ("finetune-task-row-with-a-null-label", "finetune {run} --task {reviews_null} --methods tf-idf",
     ["{reviews_null}", "record 4 (line 4: ", "holds null in field 'label', not a string",
      "--on-bad-row skip"]),
    ("prepare-corpus-row-with-an-empty-text", "prepare --corpus {rows_empty} --out {root}/new",
     ["{rows_empty}", "record 2 (line 3: '\"   \"')", "has an empty field 'text'"]),
    ("pretrain-text-field-on-shards", "pretrain --corpus {shards} --out {root}/new TINY --text-field body",
     ["--text-field body", "--corpus {shards} holds prepared shards", "pass these flags to prepare"]),
    ("finetune-text-field-on-a-named-task", "finetune {run} --methods tf-idf --text-field body",
     ["--text-field body", "corpus 'bbc' is a built-in corpus, which has no fields"]),
    # issue 37: a labelled folder read wrongly
    ("prepare-corpus-folder-with-a-link-loop", "prepare --corpus {loop_corpus} --out {root}/new",
     ["{loop_corpus}/again' leads to", "already read as '{loop_corpus}'", "remove the link"]),
    # a device this machine does not have
    ("pretrain-device-mps-missing", "pretrain --corpus {corpus} --out {root}/new TINY --device mps",
     ["device='mps'", "not available here"]),
    ("pretrain-device-cuda-missing",
     "pretrain --corpus {corpus} --out {root}/new TINY --device cuda:3",
     ["device='cuda:3'", "not available here"]),
    ("finetune-device-mps-missing", "finetune {run} --methods tf-idf --device mps",
     ["device='mps'", "not available here"]),
    # a resume that would train another objective
    ("pretrain-resume-with-another-objective",
     "pretrain --corpus {corpus} --out {run} --resume TINY --nsp",
     ["objective mlm, this resume has mlm,nsp", "--objectives"]),
    ("pretrain-sop-on-nsp-shards",
     "pretrain --corpus {shards} --out {root}/new TINY --objectives mlm,sop",
     ["--objectives mlm,sop", "{shards}", "hold NSP pairs"]),
    # prepare
    ("prepare-out-is-a-file", "prepare --corpus {corpus} --out {file}",
     ["--out {file}", "is a file"]),
    ("prepare-out-under-a-file", "prepare --corpus {corpus} --out {file}/shards",
     ["--out {file}/shards", "{file} is a file"]),
    ("prepare-into-existing-shards", "prepare --corpus {corpus} --out {shards}",
     ["--out {shards}", "prepared NSP shards"]),
    ("prepare-into-a-run", "prepare --corpus {corpus} --out {run}",
     ["--out {run}", "pretraining run"]),
    # refused once the folders are made: they must go again
    ("prepare-corpus-missing", "prepare --corpus {root}/nope --out {root}/new/deeper/shards",
     ["{root}/nope"]),
    ("prepare-one-sentence-documents", "prepare --corpus {one_sentence} --out {root}/new",
     ["{one_sentence}", "no training pairs", "have one sentence", "at least two",
      "--objectives mlm --segments single"]),
    ("pretrain-one-sentence-documents", "pretrain --corpus {one_sentence} --out {root}/new TINY",
     ["no examples to load", "have one sentence", "at least two",
      "--objectives mlm --segments single"]),
    ("pretrain-single-segments-with-nsp",
     "pretrain --corpus {one_sentence} --out {root}/new --segments single --nsp TINY",
     ["--segments single", "--objectives mlm,nsp", "pass --objectives mlm"]),
    ("pretrain-single-segments-from-shards",
     "pretrain --corpus {shards} --out {root}/new --objectives mlm --segments single TINY",
     ["--segments single", "{shards}", "hold NSP pairs", "built from the text",
      "prepare it again with --segments single"]),
    ("pretrain-nsp-on-single-segment-shards",
     "pretrain --corpus {single_shards} --out {root}/new --objectives mlm,nsp TINY",
     ["--objectives mlm,nsp --segments pairs", "{single_shards}", "hold single segments",
      "pass --objectives mlm --segments single"]),
    ("pretrain-single-segment-shards-as-pairs",
     "pretrain --corpus {single_shards} --out {root}/new --objectives mlm TINY",
     ["--objectives mlm --segments pairs", "{single_shards}", "hold single segments",
      "pass --objectives mlm --segments single"]),
    ("pretrain-single-segment-shards-with-the-recipe-s-nsp",
     "pretrain --corpus {single_shards} --out {root}/new --recipe bert TINY",
     ["{single_shards}", "hold single segments", "pass --objectives mlm --segments single"]),
    ("prepare-corpus-not-utf8", "prepare --corpus {latin1} --out {root}/new",
     ["{latin1}/doc03.txt", "not valid UTF-8", "--encoding-errors replace"]),
    ("pretrain-corpus-not-utf8", "pretrain --corpus {latin1} --out {root}/new TINY",
     ["{latin1}/doc03.txt", "not valid UTF-8", "--encoding-errors replace"]),
    ("prepare-corpus-is-a-device", "prepare --corpus /dev/null --out {root}/new",
     ["/dev/null", "pipe or device", "save the text to a file"]),
    ("pretrain-corpus-is-standard-input", "pretrain --corpus /dev/stdin --out {root}/new TINY",
     ["/dev/stdin", "pipe or device", "read only once"]),
    ("prepare-out-is-a-device", "prepare --corpus {corpus} --out /dev/null",
     ["--out /dev/null", "is a file"]),
    ("resume-a-pairs-run-as-single-segments",
     "pretrain --corpus {corpus} --out {run} --resume --objectives mlm --segments single TINY",
     ["{run}", "started with --segments pairs", "pass --segments pairs"]),
    ("export-from-a-device", "export-hf /dev/null {root}/new", ["/dev/null", "not a folder"]),
    ("fill-mask-from-a-device", "fill-mask /dev/null 'the [MASK] rose'",
     ["/dev/null", "not a folder"]),
    ("prepare-corpus-of-one-document", "prepare --corpus {one_doc} --out {root}/new",
     ["{one_doc}", "1 document"]),
    # export-hf
    ("export-run-without-tokenizer", "export-hf {run_no_tok} {root}/new",
     ["{run_no_tok}", "no tokenizer.json"]),
    ("export-from-shards", "export-hf {shards} {root}/new", ["{shards}", "prepared NSP shards"]),
    ("export-from-other-files", "export-hf {other} {root}/new", ["{other}", "other files"]),
    ("export-from-missing-folder", "export-hf {root}/nope {root}/new",
     ["{root}/nope", "is not a folder"]),
    ("export-from-run-without-checkpoint", "export-hf {run_no_ckpt} {root}/new",
     ["{run_no_ckpt}", "no checkpoint"]),
    ("export-onto-a-file", "export-hf {run} {file}", ["{file}", "is a file"]),
    ("export-under-a-file", "export-hf {run} {file}/hf", ["{file}/hf", "{file} is a file"]),
    ("export-into-other-files", "export-hf {run} {other}", ["{other}", "other files"]),
    ("export-into-the-run", "export-hf {run} {run}", ["out_dir {run}", "pretraining run"]),
    ("export-into-the-runs-checkpoints", "export-hf {run} {run}/checkpoints/hf",
     ["{run}/checkpoints/hf", "inside the run folder {run}"]),
    ("export-into-a-folder-inside-the-run", "export-hf {run} {run}/hf",
     ["{run}/hf", "inside the run folder {run}"]),
    ("export-onto-an-export-unasked", "export-hf {run} {hf}",
     ["{hf}", "already holds a Hugging Face export", "--overwrite"]),
    ("export-into-shards", "export-hf {run} {shards}", ["{shards}", "prepared NSP shards"]),
    ("export-tokenizer-larger-than-model", "export-hf {run_big_tok} {root}/new",
     ["{run_big_tok}", "400 tokens", "has 300"]),
    ("export-non-finite-weights", "export-hf {run_nan} {root}/new",
     ["{run_nan}", "NaN or inf", "diverged"]),
    # fill-mask
    ("fill-mask-text-without-mask", "fill-mask {run} 'the market fell'",
     ["'the market fell'", "[MASK]"]),
    ("fill-mask-top-k-0", "fill-mask {run} 'the [MASK] fell' --top-k 0", ["--top-k 0"]),
    ("fill-mask-on-shards", "fill-mask {shards} 'the [MASK] fell'",
     ["{shards}", "prepared NSP shards"]),
    ("fill-mask-missing-folder", "fill-mask {root}/nope 'the [MASK] fell'",
     ["{root}/nope", "is not a folder"]),
    ("fill-mask-empty-folder", "fill-mask {empty} 'the [MASK] fell'", ["{empty}", "nothing"]),
    ("fill-mask-run-without-checkpoint", "fill-mask {run_no_ckpt} 'the [MASK] fell'",
     ["{run_no_ckpt}", "no checkpoint"]),
    ("fill-mask-run-without-tokenizer", "fill-mask {run_no_tok} 'the [MASK] fell'",
     ["{run_no_tok}", "no tokenizer.json"]),
    ("fill-mask-run-tokenizer-larger-than-model", "fill-mask {run_big_tok} 'the [MASK] fell'",
     ["{run_big_tok}", "400 tokens", "has 300"]),
    ("fill-mask-hf-tokenizer-larger-than-model", "fill-mask {hf_big_tok} 'the [MASK] fell'",
     ["{hf_big_tok}", "400 tokens", "has 300"]),
    ("fill-mask-run-tokenizer-smaller-than-model", "fill-mask {run_small_tok} 'the [MASK] fell'",
     ["{run_small_tok}", "200 tokens", "has 300", "not the tokenizer the model was trained with"]),
    ("finetune-run-tokenizer-smaller-than-model", "finetune {run_small_tok} --methods tf-idf",
     ["{run_small_tok}", "200 tokens", "has 300"]),
    ("export-tokenizer-smaller-than-model", "export-hf {run_small_tok} {root}/new",
     ["{run_small_tok}", "200 tokens", "has 300"]),
    ("fill-mask-run-nan-weights", "fill-mask {run_nan} 'the [MASK] fell'",
     ["{run_nan}", "NaN or inf", "diverged"]),
    ("fill-mask-hf-nan-weights", "fill-mask {hf_nan} 'the [MASK] fell'",
     ["{hf_nan}", "NaN or inf", "diverged"]),
    ("fill-mask-overflowing-weights", "fill-mask {hf_overflow} 'the [MASK] fell'",
     ["{hf_overflow}", "NaN or inf probabilities", "diverged"]),
    ("fill-mask-config-not-json", "fill-mask {hf_bad_json} 'the [MASK] fell'",
     ["{hf_bad_json}/config.json", "not valid JSON", "line 2, column"]),
    ("fill-mask-config-without-a-key", "fill-mask {hf_no_key} 'the [MASK] fell'",
     ["{hf_no_key}/config.json", "lacks hidden_size"]),
    ("fill-mask-config-wrong-type", "fill-mask {hf_wrong_type} 'the [MASK] fell'",
     ["{hf_wrong_type}/config.json", "num_hidden_layers", "'two'"]),
    ("fill-mask-hf-without-weights", "fill-mask {hf_no_weights} 'the [MASK] fell'",
     ["{hf_no_weights}", "model.safetensors"]),
    # finetune
    ("finetune-on-shards", "finetune {shards} --methods tf-idf",
     ["{shards}", "prepared NSP shards"]),
    ("finetune-unknown-method", "finetune {run} --methods magic", ["--methods magic"]),
    ("finetune-task-folder-without-labels", "finetune {run} --task {corpus} --methods tf-idf",
     ["task folder '{corpus}'", "lie directly in it", "sub-folder named after its label"]),
    ("finetune-task-neither-name-nor-folder", "finetune {run} --task {root}/nope",
     ["{root}/nope", "neither a known task", "one sub-folder per label"]),
    ("finetune-nan-weights", "finetune {run_nan} --methods fine-tuned",
     ["{run_nan}", "NaN or inf"]),
    # demo (all refused before the first slow step)
    ("demo-steps-0", "demo --out {root}/new --steps 0", ["--steps 0"]),
    ("demo-steps-negative", "demo --out {root}/new --steps -1", ["--steps -1"]),
    ("demo-threads-0", "demo --out {root}/new --threads 0", ["--threads 0"]),
    ("demo-finetune-epochs-0", "demo --out {root}/new --finetune-epochs 0",
     ["--finetune-epochs 0"]),
    ("demo-into-other-files", "demo --out {other}", ["--out {other}", "notes.txt"]),
    ("demo-into-a-run", "demo --out {run}", ["--out {run}", "pretraining run"]),
    ("demo-out-is-a-file", "demo --out {file}", ["--out {file}", "is a file"]),
    # issue 37: a setting silently ignored, or reported as another problem
    ("pretrain-batch-larger-than-the-corpus",
     "pretrain --corpus {corpus} --out {root}/new TINY --batch-size 100000",
     ["batch_size=100000 is larger than the", "training examples", "--batch-size"]),
    ("pretrain-gpu-recipe-batch-larger-than-the-corpus",
     "pretrain --corpus {few_docs} --out {root}/new --recipe gpu --max-steps 2 --device cpu "
     "--vocab-size 300 --max-seq-len 64 --pair-draws 1 --no-progress",
     ["batch_size=256 is larger than the", "training examples", "--batch-size"]),
    ("pretrain-eps-inf", "pretrain --corpus {corpus} --out {root}/new TINY --eps inf",
     ["TrainConfig.eps (--eps) must be a positive number", "inf"]),
    ("pretrain-minutes-inf", "pretrain --corpus {corpus} --out {root}/new TINY --minutes inf",
     ["TrainConfig.max_minutes (--max-minutes) must be a positive number or None", "inf"]),
    ("pretrain-weight-decay-nan",
     "pretrain --corpus {corpus} --out {root}/new TINY --weight-decay nan",
     ["TrainConfig.weight_decay (--weight-decay) must be a number >= 0", "nan"]),
    ("pretrain-muon-lr-inf",
     "pretrain --corpus {corpus} --out {root}/new TINY --optimizer muon --muon-lr inf",
     ["TrainConfig.muon_lr (--muon-lr) must be a positive number", "inf"]),
    ("pretrain-pair-draws-beyond-memory",
     "pretrain --corpus {corpus} --out {root}/new TINY --pair-draws 100000",
     ["pair_draws=100000 would build", "in memory before the first step", "GiB",
      "prepare --pair-draws K"]),
    ("finetune-epochs-inf", "finetune {run} --methods tf-idf --epochs inf",
     ["FinetuneConfig.epochs (--epochs) must be a positive number", "inf"]),
    ("finetune-max-seq-len-2", "finetune {run} --methods tf-idf --max-seq-len 2",
     ["FinetuneConfig.max_seq_len=2 (--max-seq-len)", "at least 3"]),
    ("demo-finetune-epochs-inf", "demo --out {root}/new --finetune-epochs inf",
     ["--finetune-epochs inf", "positive number"]),
    ("finetune-task-too-small-to-split", "finetune {run} --task {small_task} --methods tf-idf",
     ["task '{small_task}' is too small", "none of its 6 documents", "test split",
      "add labelled documents"]),
    ("fill-mask-config-negative-layer-norm-eps", "fill-mask {hf_bad_eps} 'the [MASK] fell'",
     ["{hf_bad_eps}/config.json", "layer_norm_eps must be a finite number > 0", "-1e-12"]),
    ("fill-mask-config-nan-initializer-range", "fill-mask {hf_nan_init} 'the [MASK] fell'",
     ["{hf_nan_init}/config.json", "initializer_range must be a finite number >= 0", "nan"]),
    ("fill-mask-config-negative-initializer-range",
     "fill-mask {hf_negative_init} 'the [MASK] fell'",
     ["{hf_negative_init}/config.json", "initializer_range", "-0.02"]),
]


def test_parquet_without_pyarrow_names_the_extra(world, capsys, monkeypatch):
    # Not a CASE: whether pyarrow is installed is the machine's; here its import is made to fail.
    path = Path(world["root"]) / "rows.parquet"
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    try:
        path.write_bytes(b"PAR1")
        before = snapshot(world["root"])
        assert main(["prepare", "--corpus", str(path), "--out", f"{world['root']}/new"]) == 2
        assert_one_clear_error(capsys.readouterr().err, [str(path), "Parquet file", "pyarrow",
                                                         "pip install bertlab[parquet]"])
        assert_unchanged(before, snapshot(world["root"]))
    finally:
        path.unlink()


def test_finetune_reads_a_task_that_is_not_utf8_as_the_message_says(world, capsys):
    # Every command that reads text has --encoding-errors, so the library's advice holds for all.
    before = snapshot(world["root"])
    command = ["finetune", world["run"], "--task", world["latin1_task"], "--methods", "tf-idf"]
    assert main(command) == 2
    assert_one_clear_error(capsys.readouterr().err, [
        "sport1.txt", "not valid UTF-8", "convert it to UTF-8",
        "errors='replace' (--encoding-errors replace)"])
    assert_unchanged(before, snapshot(world["root"]))
    # With the flag the file reads; this task (training documents only) is then too small.
    assert main([*command, "--encoding-errors", "replace"]) == 2
    assert_one_clear_error(capsys.readouterr().err, ["is too small", "test split"])


def test_a_refusal_once_the_process_group_is_up_closes_it(world, capsys, monkeypatch):
    # Under torchrun a rank that leaves without closing its group can abort the process.
    import bertlab.commands.pretrain as run
    closed: list[bool] = []
    monkeypatch.setattr(run, "close_distributed", lambda together=True: closed.append(together))
    assert main(expand("pretrain --corpus {corpus} --out {run} TINY", world)) == 2
    assert "--resume" in capsys.readouterr().err
    assert closed == [False]  # closed without a barrier: the other ranks may be elsewhere


@pytest.mark.parametrize("command, fragments", [pytest.param(c, f, id=i) for i, c, f in CASES])
def test_bad_input_is_one_clear_error_and_changes_nothing(world, capsys, command, fragments):
    argv = expand(command, world)
    before = snapshot(world["root"])
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert_one_clear_error(err, [f.format(**world) for f in fragments])
    assert_unchanged(before, snapshot(world["root"]))


def test_a_start_that_diverges_before_its_first_checkpoint_leaves_out_as_it_was(world, capsys):
    out = Path(world["root"]) / "diverged"
    before = snapshot(world["root"])
    argv = expand(f"pretrain --corpus {{corpus}} --out {out} --optimizer adamw TINY", world)
    assert main([*argv, "--lr", "1e30"]) == 1  # a failure, not bad input
    err = capsys.readouterr().err
    assert "diverged: lower lr (peak 1e+30" in err and "Newest checkpoint: None" in err
    assert_unchanged(before, snapshot(world["root"]))  # no run.json, no tokenizer, no folder
    assert main(argv) == 0  # so the fix it names works with the same --out
    assert (out / "run.json").is_file() and list((out / "checkpoints").iterdir())
    shutil.rmtree(out)


def _hold_lock(folder: str) -> subprocess.Popen:
    code = ("import sys, time\nfrom bertlab.engine.folders import FolderLock\n"
            "with FolderLock(sys.argv[1], 'run folder'):\n"
            "    print('locked', flush=True)\n    time.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, folder], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


@pytest.mark.parametrize("target, extra", [("run", ["--resume", "--max-steps", "3"]),
                                           ("root/locked-new", [])])
def test_a_run_folder_in_use_by_another_process_is_refused(world, capsys, target, extra):
    folder = str(Path(world["root"]) / "locked-new") if target.startswith("root") else world[target]
    holder = _hold_lock(folder)
    try:
        before = snapshot(world["root"])
        code = main(["pretrain", "--corpus", world["corpus"], "--out", folder, *TINY, *extra])
        err = capsys.readouterr().err
        assert code == 2, err
        assert_one_clear_error(err, [folder, f"in use by process {holder.pid}"])
        assert_unchanged(before, snapshot(world["root"]))
    finally:
        holder.kill()
        holder.wait()
        if target.startswith("root"):
            shutil.rmtree(folder)


@pytest.mark.parametrize("number, code, fix", [
    (errno.ENOSPC, 1, "free some disk space"),
    (errno.EACCES, 2, "permissions"),
    (errno.ENOTDIR, 2, "not a folder"),
])
def test_os_errors_end_in_one_line_naming_the_path(monkeypatch, capsys, number, code, fix):
    def fail(args):
        raise OSError(number, os.strerror(number), "/data/run/checkpoints/step-00000100")

    monkeypatch.setitem(COMMANDS, "fill-mask", fail)
    assert main(["fill-mask", "somewhere", "a [MASK]"]) == code
    assert_one_clear_error(capsys.readouterr().err,
                           ["/data/run/checkpoints/step-00000100", os.strerror(number), fix])


class _Terminated(KeyboardInterrupt):
    signum = signal.SIGTERM


@pytest.mark.parametrize("exc, code, name", [(KeyboardInterrupt(), 130, "SIGINT"),
                                             (_Terminated(), 143, "SIGTERM")])
def test_signals_exit_with_128_plus_the_signal(monkeypatch, capsys, exc, code, name):
    def stop(args):
        raise exc

    monkeypatch.setitem(COMMANDS, "fill-mask", stop)
    assert main(["fill-mask", "somewhere", "a [MASK]"]) == code
    err = capsys.readouterr().err
    assert name in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_refusal_from_the_real_command_line_has_no_traceback(world):
    # Through `python -m bertlab`, as a user runs it: the exit status and stderr of the process.
    done = subprocess.run([sys.executable, "-m", "bertlab", "export-hf", world["run"],
                           world["other"]], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert_one_clear_error(done.stderr, [world["other"], "other files"])


# ---------------------------------------------------------------------------------------------
# Faults while a real `python -m bertlab pretrain` runs: signals, kill -9, a full disk, a second
# process. Every time, what is on disk must be loadable and the run must continue exactly.

PROCESS = [*SMALL, "--threads", "1", "--log-interval", "1", "--eval-interval", "1000",
           "--checkpoint-interval", "5", "--keep-checkpoints", "3"]
STEPS = 150


def _as_in_a_terminal() -> None:
    # A job started in the background by a non-interactive shell (CI, nohup ... &) inherits
    # SIGINT ignored, and Python then never turns it into KeyboardInterrupt. The run under test
    # gets the default disposition, as a command typed in a terminal has.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _pretrain(world: dict[str, str], out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bertlab", "pretrain", "--corpus",
                             world["corpus"], "--out", str(out), *PROCESS, *extra], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_in_a_terminal)


def _wait_for_step(process: subprocess.Popen, step: int) -> list[str]:
    """Read the process's output until it reports optimizer step `step`; return the lines."""
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("step ") and int(line.split()[1]) >= step:
            return lines
    raise AssertionError(f"the run ended before step {step}: {''.join(lines)[-2000:]}"
                         f"{process.stderr.read()[-2000:]}")


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_run(run)[0].state_dict()


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a), "the resumed run differs"


def _assert_every_checkpoint_loads(run: Path) -> list[str]:
    names = []
    for path in list_checkpoints(run):
        load_run(run, checkpoint=path)  # verifies the digests and loads the weights
        names.append(path.name)
    leftovers = [p.name for p in (run / "checkpoints").iterdir() if p.name not in names]
    assert all(name.startswith(".") and name.endswith(".tmp") for name in leftovers), leftovers
    return names


@pytest.fixture(scope="module")
def straight_run(world, tmp_path_factory) -> dict[str, torch.Tensor]:
    """The final weights of the run the interrupted ones must reproduce."""
    out = tmp_path_factory.mktemp("straight") / "run"
    done = _pretrain(world, out, "--max-steps", str(STEPS))
    _, err = done.communicate(timeout=300)
    assert done.returncode == 0, err
    return _weights(out)


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_saves_a_checkpoint_and_the_resume_is_exact(world, straight_run, tmp_path,
                                                            signum, code):
    out = tmp_path / "run"
    process = _pretrain(world, out, "--max-steps", str(STEPS))
    _wait_for_step(process, 12)
    process.send_signal(signum)
    rest, err = process.communicate(timeout=120)
    name = signal.Signals(signum).name
    assert process.returncode == code, err
    assert f"stopped by {name} (exit code {code})" in err and "Traceback" not in err
    assert f"{name} at step" in rest and "checkpoint saved" in rest
    stopped = int(rest.split(f"{name} at step ")[1].split(":")[0])
    assert 12 <= stopped < STEPS
    assert _assert_every_checkpoint_loads(out)[-1] == f"step-{stopped:08d}"
    resumed = _pretrain(world, out, "--max-steps", str(STEPS), "--resume")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    _assert_same_weights(_weights(out), straight_run)


@pytest.mark.slow
def test_kill_9_five_times_leaves_loadable_checkpoints_and_an_exact_run(world, straight_run,
                                                                        tmp_path):
    out = tmp_path / "run"
    for attempt in range(5):
        extra = ["--resume"] if attempt else []
        process = _pretrain(world, out, "--max-steps", str(STEPS), *extra)
        lines = _wait_for_step(process, 10 * (attempt + 1) + 3)
        process.kill()  # SIGKILL: no handler runs, nothing is saved on the way out
        process.wait(timeout=60)
        assert process.returncode == -signal.SIGKILL, "".join(lines)
        saved = _assert_every_checkpoint_loads(out)
        assert saved, "no checkpoint survived"
    resumed = _pretrain(world, out, "--max-steps", str(STEPS), "--resume")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    _assert_same_weights(_weights(out), straight_run)


@pytest.mark.parametrize("steps_before, said_then", [
    # Ctrl-C before step 5: the checkpoint of step 4 is on disk already, and says so.
    (0, "the checkpoint of step 4 is complete at {ckpt4}; continue with resume=True"),
    # Ctrl-C after step 5: its checkpoint is abandoned; step 4's is the newest complete one.
    (1, "checkpoint of step 5 was abandoned (no partial files are left); the newest complete "
        "checkpoint on disk is {ckpt4}"),
])
def test_a_second_interrupt_during_the_save_says_what_is_complete_on_disk(
        world, tmp_path, capsys, monkeypatch, steps_before, said_then):
    out = tmp_path / "run"
    assert main(["pretrain", "--corpus", world["corpus"], "--out", str(out), "--max-steps", "4",
                 "--checkpoint-interval", "2", *SMALL]) == 0
    capsys.readouterr()
    real_write = checkpoint_mod._write_checkpoint_files
    real_loss = pretraining_mod.PretrainingObjective.loss
    calls = {"loss": 0}

    def half_written_then_ctrl_c(tmp, *args):  # the save is half written when the second comes
        real_write(tmp, *args)
        raise KeyboardInterrupt

    def ctrl_c_after(objective, model, batch, totals):  # the first Ctrl-C, between steps
        calls["loss"] += 1
        if calls["loss"] > steps_before:
            monkeypatch.setattr(checkpoint_mod, "_write_checkpoint_files",
                                half_written_then_ctrl_c)
            raise KeyboardInterrupt
        return real_loss(objective, model, batch, totals)

    monkeypatch.setattr(pretraining_mod.PretrainingObjective, "loss", ctrl_c_after)
    before = _assert_every_checkpoint_loads(out)
    code = main(["pretrain", "--corpus", world["corpus"], "--out", str(out), "--max-steps", "8",
                 "--checkpoint-interval", "2", "--resume", *SMALL])
    said = capsys.readouterr()
    assert code == 130, said.err
    assert "second interrupt during the save" in said.out
    assert said_then.format(ckpt4=out / "checkpoints" / "step-00000004") in said.out, said.out
    monkeypatch.undo()
    assert _assert_every_checkpoint_loads(out) == before
    assert not any(p.name.startswith(".") for p in (out / "checkpoints").iterdir())


@pytest.mark.slow
def test_two_runs_on_one_folder_do_not_destroy_each_other(world, tmp_path):
    out = tmp_path / "run"
    first = _pretrain(world, out, "--max-steps", "100000", "--checkpoint-interval", "none")
    _wait_for_step(first, 3)  # it holds the lock and has written run.json and tokenizer.json
    before = snapshot(out)
    second = subprocess.run([sys.executable, "-m", "bertlab", "pretrain", "--corpus",
                             world["corpus"], "--out", str(out), *PROCESS, "--max-steps", "5"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert second.returncode == 2
    assert_one_clear_error(second.stderr, [str(out), f"in use by process {first.pid}"])
    after = snapshot(out)
    assert {p: v for p, v in after.items() if "history" not in p} == \
        {p: v for p, v in before.items() if "history" not in p}  # the first run still writes
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130, err
    assert len(_assert_every_checkpoint_loads(out)) == 1  # its Ctrl-C checkpoint


@pytest.mark.slow
@pytest.mark.skipif(private_tmpfs_works() is not None, reason=str(private_tmpfs_works()))
def test_a_full_disk_during_a_checkpoint_keeps_the_last_one_and_says_so(world, tmp_path):
    # A small tmpfs in a private mount namespace (only this test's processes see it): a first
    # run saves two checkpoints, the disk is then filled up to half a checkpoint, and the
    # resumed run's next save must fail cleanly.
    disk, report = tmp_path / "disk", tmp_path / "report.txt"
    disk.mkdir()
    common = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "bertlab", "pretrain",
                                               "--corpus", world["corpus"], *PROCESS])
    script = f"""
set -u
mount -t tmpfs -o size=16m tmpfs {disk}
{common} --out {disk}/run --max-steps 10 > /dev/null 2>&1; echo "first=$?"
{sys.executable} - <<'PY'
import os, pathlib
run = pathlib.Path("{disk}/run/checkpoints")
size = sum(f.stat().st_size for f in (run / "step-00000010").iterdir())
free = os.statvfs(run).f_bavail * os.statvfs(run).f_frsize
pathlib.Path("{disk}/filler").write_bytes(b"x" * (free - size // 2))
PY
{common} --out {disk}/run --max-steps 30 --resume > /dev/null 2> {tmp_path}/err.txt
echo "second=$?"
{sys.executable} -c "
from bertlab.loading import list_checkpoints, load_run
for path in list_checkpoints('{disk}/run'):
    load_run('{disk}/run', checkpoint=path); print('loads', path.name)
import os; print('entries', sorted(os.listdir('{disk}/run/checkpoints')))"
"""
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c",
                           script], cwd=REPO, capture_output=True, text=True, timeout=600)
    report.write_text(done.stdout + done.stderr)
    out = done.stdout
    assert "first=0" in out, out + done.stderr
    assert "second=1" in out, out + done.stderr
    err = (tmp_path / "err.txt").read_text()
    assert_one_clear_error(err, ["no space left on the device while writing checkpoint",
                                 "step-00000015", "still", "step-00000010", "--resume"])
    assert "loads step-00000010" in out and "loads step-00000005" in out
    assert "entries ['step-00000005', 'step-00000010']" in out  # no half-written folder


# ---------------------------------------------------------------------------------------------
# Data loss: an export never deletes what it did not write; a name that is also a folder here


def test_overwriting_an_export_keeps_the_users_files_and_refuses_foreign_weights(world, tmp_path):
    hf = Path(shutil.copytree(world["hf"], tmp_path / "hf"))
    (hf / "README.md").write_text("# my model card\n")
    (hf / "notes").mkdir()
    (hf / "notes" / "eval.txt").write_text("kept\n")
    assert main(["export-hf", world["run"], str(hf), "--overwrite"]) == 0
    assert (hf / "README.md").read_text() == "# my model card\n"
    assert (hf / "notes" / "eval.txt").read_text() == "kept\n"
    assert load_hf(hf) is not None
    (hf / "pytorch_model.bin").write_bytes(b"another model")
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match="pytorch_model.bin: weights that this export would not"):
        save_hf(load_hf(hf), None, hf)
    assert_unchanged(before, snapshot(tmp_path))


def test_overwriting_an_export_keeps_the_users_links_as_links(world, tmp_path):
    # A link to a 20 MB folder came back as a 20 MB copy; a link looping back into the export
    # copied the export into itself until a RecursionError.
    hf = Path(shutil.copytree(world["hf"], tmp_path / "hf"))
    data = tmp_path / "big-data"
    data.mkdir()
    (data / "eval.jsonl").write_text("{}\n")
    os.chmod(data / "eval.jsonl", 0o600)
    (hf / "data").symlink_to(data)
    (hf / "card.md").symlink_to("../card-source.md")  # relative, and not there yet: kept too
    (hf / "loop").symlink_to(hf)
    (hf / "notes").mkdir()
    (hf / "notes" / "up").symlink_to("..")  # a loop inside a folder of the user's
    assert main(["export-hf", world["run"], str(hf), "--overwrite"]) == 0
    assert os.readlink(hf / "data") == str(data) and os.readlink(hf / "loop") == str(hf)
    assert os.readlink(hf / "card.md") == "../card-source.md"
    assert os.readlink(hf / "notes" / "up") == ".."
    assert (hf / "data" / "eval.jsonl").stat().st_mode & 0o777 == 0o600  # target untouched
    assert sorted(p.name for p in data.iterdir()) == ["eval.jsonl"]
    assert load_hf(hf) is not None
    # The export folder itself a link: the export goes where it leads, and the link stays.
    (tmp_path / "hf-link").symlink_to(hf)
    assert main(["export-hf", world["run"], str(tmp_path / "hf-link"), "--overwrite"]) == 0
    assert os.readlink(tmp_path / "hf-link") == str(hf) and load_hf(hf) is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big-data", "hf", "hf-link"]


def test_an_export_onto_a_looping_link_is_refused(world, tmp_path, capsys):
    (tmp_path / "loop").symlink_to("loop")
    assert main(["export-hf", world["run"], str(tmp_path / "loop")]) == 2
    assert_one_clear_error(capsys.readouterr().err, [f"'{tmp_path / 'loop'}'", "loops",
                                                     "nothing was written"])
    assert [p.name for p in tmp_path.iterdir()] == ["loop"] and (tmp_path / "loop").is_symlink()


def test_a_corpus_name_that_is_also_a_folder_here_is_refused_naming_both(world, tmp_path,
                                                                        monkeypatch, capsys):
    (tmp_path / "bbc").mkdir()
    (tmp_path / "bbc" / "a.txt").write_text("My own text. It has two sentences.\n")
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    assert main(["pretrain", "--corpus", "bbc", "--out", str(tmp_path / "run"), *TINY]) == 2
    assert_one_clear_error(capsys.readouterr().err, ["corpus 'bbc'", "built-in", "./bbc"])
    assert_unchanged(before, snapshot(tmp_path))


def test_the_api_pairs_a_model_only_with_a_tokenizer_of_its_size(world):
    from tokenizers import Tokenizer

    from bertlab.finetune import FinetuneConfig, finetune_classifier
    from bertlab.pretraining import fill_mask

    model, _ = load_run(world["run"])
    larger = Tokenizer.from_file(world["tok_400_json"])
    with pytest.raises(ValueError, match="fill_mask: the tokenizer has 400 tokens but the "
                                         "model's vocabulary has 300"):
        fill_mask(model, larger, "the [MASK] fell")
    with pytest.raises(ValueError, match="finetune_classifier: the tokenizer has 400 tokens"):
        finetune_classifier(model, load_corpus("bbc")[::40], tokenizer=larger,
                            config=FinetuneConfig(epochs=0.1))


# ---------------------------------------------------------------------------------------------
# A full disk anywhere (an export, a cache file), and what killed writers leave behind


def test_a_full_disk_during_an_export_names_the_export_and_keeps_the_old_one(world, capsys,
                                                                          monkeypatch):
    from safetensors import SafetensorError

    import bertlab.hf as hf_mod

    def full(*args, **kwargs):  # what safetensors raises when the disk fills mid-write
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: '
                              'StorageFull, message: "No space left on device" })')

    monkeypatch.setattr(hf_mod, "save_file", full)
    before = snapshot(world["root"])
    assert main(["export-hf", world["run"], world["hf"], "--overwrite"]) == 1
    assert_one_clear_error(capsys.readouterr().err,
                           ["no space left", world["hf"], "nothing of it was kept", "free some"])
    assert_unchanged(before, snapshot(world["root"]))  # the old export, and no staging folder


def test_a_full_disk_on_a_saved_tokenizer_names_the_file_and_keeps_the_old_one(tmp_path,
                                                                             monkeypatch):
    # The user asked for this file, so a failed write is an error (a failed cache write is only
    # a warning: tests/test_tokenizer.py).
    import bertlab.atomic as files_mod

    tok = train_tokenizer(["a full disk stops the save"], vocab_size=50, cache=False)
    target = tmp_path / "saved" / "tokenizer.json"
    target.parent.mkdir()
    target.write_text("old")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files_mod.os, "fsync", full)
    with pytest.raises(OSError, match="no space left .* file .*tokenizer.json") as caught:
        save_tokenizer(tok, target.parent)  # a folder: the file is tokenizer.json inside it
    assert caught.value.errno == errno.ENOSPC
    assert target.read_text() == "old" and os.listdir(target.parent) == [target.name]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_what_a_killed_writer_left_is_swept_on_the_next_write(world, tmp_path):
    from bertlab.engine.folders import _owner, atomic_write_folder

    host = _owner().split("-")[0]
    target = tmp_path / "hf"
    dead, alive = _dead_pid(), os.getpid()
    stale = tmp_path / f".hf.{host}-{dead}.1a2b3c4d.tmp"  # 337 MB for a base export
    live = tmp_path / f".hf.{host}-{alive}.5e6f7a8b.tmp"  # a writer still at work: kept
    other = tmp_path / f".notes.{host}-{dead}.9c0d1e2f.tmp"  # another target's: not ours
    for folder in (stale, live, other):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"0" * 1000)
    assert main(["export-hf", world["run"], str(target)]) == 0
    assert not stale.exists() and live.exists() and other.exists()
    # Killed between its two renames: the target is missing and its previous copy set aside.
    # The next write moves that copy back first, so no complete export is ever deleted, and
    # then writes nothing: whether to replace it was decided while it was missing.
    aside = tmp_path / f".hf.{host}-{dead}.0f0f0f0f.old"
    os.replace(target, aside)
    seen = []
    with pytest.raises(ValueError, match="previous content is back in place"):
        atomic_write_folder(target, seen.append)
    assert seen == [] and not aside.exists() and (target / "config.json").is_file()


def test_the_encoding_errors_flag_reads_what_the_message_says(world, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["pretrain", "--corpus", world["latin1"], "--out", str(out), *TINY,
                 "--encoding-errors", "replace"]) == 0
    assert "done: 2 steps" in capsys.readouterr().out


def test_a_pipe_or_fifo_as_corpus_is_refused_at_once_not_waited_on(tmp_path):
    fifo = tmp_path / "corpus.fifo"
    os.mkfifo(fifo)  # no writer: opening it for reading would block forever
    for command in ("prepare", "pretrain"):
        done = subprocess.run([sys.executable, "-m", "bertlab", command, "--corpus", str(fifo),
                               "--out", str(tmp_path / "new")], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert_one_clear_error(done.stderr, [str(fifo), "pipe", "save the text to a file"])
        assert sorted(os.listdir(tmp_path)) == ["corpus.fifo"]  # no folder, no lock


def test_sigterm_during_prepare_says_so_and_leaves_nothing(world, tmp_path, capsys, monkeypatch):
    import bertlab.engine.shards as shards_mod

    real = shards_mod._ShardWriter.add
    calls = {"n": 0}

    def add_then_terminated(self, ex):  # SIGTERM arrives while the shards are being written
        calls["n"] += 1
        if calls["n"] == 50:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, ex)

    monkeypatch.setattr(shards_mod._ShardWriter, "add", add_then_terminated)
    out = tmp_path / "new" / "shards"
    assert main(["prepare", "--corpus", world["corpus"], "--out", str(out), "--vocab-size",
                 "300", "--max-seq-len", "64"]) == 143
    err = capsys.readouterr().err
    assert "stopped by SIGTERM (exit code 143)" in err and "Traceback" not in err
    assert os.listdir(tmp_path) == []  # no staging folder, no lock, not even the new folders


def test_a_finished_command_leaves_no_lock_in_its_folders(world, tmp_path):
    shards, run = tmp_path / "shards", tmp_path / "run"
    assert main(["prepare", "--corpus", world["corpus"], "--out", str(shards), "--vocab-size",
                 "300", "--max-seq-len", "64"]) == 0
    assert main(["pretrain", "--corpus", str(shards), "--out", str(run), *TINY]) == 0
    for folder in (shards, run):
        assert ".lock" not in os.listdir(folder), os.listdir(folder)
