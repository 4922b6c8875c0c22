"""Benchmark: NSP data preparation, ours vs a straightforward baseline, and `prepare`'s memory.

1. BBC (whole corpus): tokenize every sentence and build NSP examples. Ours batch-encodes all
   sentences in one Rust call (`tokenize_corpus`); the baseline calls `tokenizer.encode` once per
   sentence in a Python loop. Both then run the same builder (`create_nsp_examples`). Goal: ours
   at most 10 s on 2 cores. transformers v5 no longer ships TextDatasetForNextSentencePrediction
   (it never truncated pairs anyway), so there is no library reference to time against.
2. `prepare` (streaming `prepare_shards`, a tokenizer passed in) on generated folders of .txt
   files, one article per file (BBC News with about 10% People's Daily by bytes, sentences
   rotated so files differ), each run in a fresh process that reports its own peak RSS
   (`resource.getrusage`):
   a. a `--sample-gb` folder (default 0.2 GB): streaming vs the in-memory path
      (`load_corpus` + `create_nsp_examples` on the same text), median of `--runs` runs and
      the ratio. Goal (issue 14): streaming within 2x of in-memory.
   b. a `--size-gb` folder (default 1 GB) that also holds one file with a single 10 MB line:
      streaming once. Goal (issue 14): peak RSS <= 2 GB.
   c. one BERT-format file that is a single 10 MB line (no newline at all): the line is cut and
      the document split into parts (counts below), with a small peak RSS.
   Results go to benchmarks/results/data.json.

Usage: python benchmarks/data.py [--runs 3] [--sample-gb 0.2] [--size-gb 1] [--skip-bbc]
                                 [--skip-stream] [--out benchmarks/results/data.json]
Be kind to a shared machine: OMP_NUM_THREADS=1 RAYON_NUM_THREADS=1 python benchmarks/data.py
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _record import write_record  # benchmarks/ is on sys.path when run as a script

import bertlab as bl
from bertlab.pairs import TokenizedCorpus, create_nsp_examples, nsp_stats, tokenize_corpus
from bertlab.tokenizer import save_tokenizer

RESULTS = Path(__file__).parent / "results"
GOAL_PEAK_MB = 2048
GOAL_TIME_RATIO = 2.0
LONG_LINE_BYTES = 10_000_000


def per_sentence_loop(docs, tok) -> TokenizedCorpus:
    """The baseline: one `encode` call per sentence, from Python."""
    sentences = [[s for s in (tok.encode(x, add_special_tokens=False).ids for x in d.sentences) if s]
                 for d in docs]
    return TokenizedCorpus([d.id for d in docs], sentences)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def bench_bbc(runs: int) -> dict:
    docs = bl.load_corpus("bbc")
    tok = bl.train_tokenizer(docs)
    ours_tok, loop_tok, build = [], [], []
    for _ in range(runs):
        t, corpus = timed(lambda: tokenize_corpus(docs, tok))
        ours_tok.append(t)
        t, baseline = timed(lambda: per_sentence_loop(docs, tok))
        loop_tok.append(t)
        assert baseline.sentences == corpus.sentences  # same ids, or the timing means nothing
        t, examples = timed(lambda c=corpus: create_nsp_examples(c, tok, max_seq_len=128, seed=0))
        build.append(t)
    stats = nsp_stats(examples)
    med = statistics.median
    ours_total, loop_total = med(ours_tok) + med(build), med(loop_tok) + med(build)
    print(f"BBC: {len(docs):,} documents, {stats['sentences']:,} sentences -> "
          f"{stats['examples']:,} examples (NotNext {stats['not_next_share']:.3f}); "
          f"median of {runs} runs, {os.cpu_count()} CPUs")
    print(f"{'step':<22}{'bertlab':>10}{'per-sentence loop':>20}{'ratio':>8}")
    print(f"{'tokenize':<22}{med(ours_tok):>9.2f}s{med(loop_tok):>19.2f}s"
          f"{med(loop_tok) / med(ours_tok):>7.1f}x")
    print(f"{'build examples':<22}{med(build):>9.2f}s{'(same builder)':>20}")
    print(f"{'total':<22}{ours_total:>9.2f}s{loop_total:>19.2f}s{loop_total / ours_total:>7.1f}x")
    print(f"goal total <= 10 s: {'met' if ours_total <= 10 else 'MISSED'} ({ours_total:.1f} s)")
    return {"runs": runs, "tokenize_s": med(ours_tok), "per_sentence_loop_s": med(loop_tok),
            "build_s": med(build), "total_s": ours_total, "loop_total_s": loop_total,
            "speedup": loop_total / ours_total, "examples": stats["examples"]}


def article_texts() -> tuple[list[list[str]], list[list[str]]]:
    """Return (sentences of each BBC article, sentences of each People's Daily article)."""
    return [d.sentences for d in bl.load_corpus("bbc")], [d.sentences for d in bl.load_corpus("zh-news")]


def write_folder(folder: Path, size_bytes: int, seed: int = 0, long_line: bool = False) -> dict:
    """Write about `size_bytes` of .txt files (one article each, 1,000 per sub-folder) into
    `folder`; with `long_line`, also `long-line.txt`, one line of 10 MB. Return its shape."""
    english, chinese = article_texts()
    rng = random.Random(seed)
    written = files = zh_bytes = 0
    folder.mkdir(parents=True)
    if long_line:
        written += write_long_line(folder / "long-line.txt", english, seed)
    while written < size_bytes:
        zh = rng.random() < 0.12  # about 10% of the bytes
        sentences = rng.choice(chinese if zh else english)
        first = rng.randrange(len(sentences))  # vary the articles a little
        sentences = sentences[first:] + sentences[:first]
        joiner = "" if zh else " "
        text = "\n\n".join(joiner.join(sentences[i : i + 3]) for i in range(0, len(sentences), 3))
        data = (text + "\n").encode("utf-8")
        sub = folder / f"{files // 1000:04d}"
        if files % 1000 == 0:
            sub.mkdir(exist_ok=True)
        (sub / f"{files:07d}.txt").write_bytes(data)
        written += len(data)
        zh_bytes += len(data) if zh else 0
        files += 1
    return {"bytes": written, "files": files + long_line, "chinese_share_of_bytes": zh_bytes / written}


def write_long_line(path: Path, english: list[list[str]], seed: int = 0) -> int:
    """Write one line (no newline) of English sentences, LONG_LINE_BYTES long; return its size."""
    rng = random.Random(seed)
    parts, size = [], 0
    while size < LONG_LINE_BYTES:
        sentence = rng.choice(rng.choice(english))
        parts.append(sentence)
        size += len(sentence.encode("utf-8")) + 1
    data = " ".join(parts).encode("utf-8")
    path.write_bytes(data)
    return len(data)


CHILD = r"""
import json, resource, sys, time
import bertlab as bl
from bertlab.corpus import split_documents
from bertlab.pairs import create_nsp_examples
from bertlab.engine.shards import PrepareOptions, prepare_shards
from bertlab.engine.streaming import StreamOptions
from bertlab.tokenizer import load_tokenizer
mode, corpus, tok_path, out, splits = sys.argv[1:6]
splits = None if splits == "all" else tuple(splits.split(","))
tok = load_tokenizer(tok_path)
start = time.perf_counter()
if mode == "stream":
    summary = prepare_shards(corpus, tok, out,
                             PrepareOptions(StreamOptions(max_seq_len=128), splits=splits), seed=0)
    metas = summary["splits"].values()
    result = {"examples": sum(m["examples"] for m in metas),
              "documents": sum(m["documents"] for m in metas), **summary["corpus_read"]}
else:
    docs = bl.load_corpus(corpus)
    groups = split_documents(docs)
    chosen = [groups[s] for s in splits] if splits else [docs]
    result = {"examples": sum(len(create_nsp_examples(g, tok, max_seq_len=128, seed=0))
                              for g in chosen),
              "documents": sum(len(g) for g in chosen)}
result["seconds"] = time.perf_counter() - start
result["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
print(json.dumps(result))
"""


def run_child(mode: str, corpus: Path, tok_path: Path, out: Path,
              splits: str = "train,validation") -> dict:
    """Run one prepare in a fresh process; return its seconds, peak RSS (MB) and counts."""
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(corpus), str(tok_path), str(out),
                           splits], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run on {corpus} failed:\n{proc.stderr}")
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_prepare(runs: int, sample_gb: float, size_gb: float, tmp: Path) -> dict:
    tok = bl.train_tokenizer(bl.load_corpus("bbc"))
    tok_path = save_tokenizer(tok, tmp / "tokenizer.json")
    med = statistics.median
    results: dict = {}

    sample = tmp / "sample"
    shape = write_folder(sample, int(sample_gb * 1e9), seed=1)
    mb = shape["bytes"] / 1e6
    rows: dict[str, list[dict]] = {"stream": [], "memory": []}
    for _ in range(runs):  # alternate, so a slow spell of the machine hits both paths
        for mode in rows:
            rows[mode].append(run_child(mode, sample, tok_path, tmp / "out"))
    summary = {mode: {key: med(r[key] for r in rs) for key in ("seconds", "peak_mb")}
               for mode, rs in rows.items()}
    time_ratio = summary["stream"]["seconds"] / summary["memory"]["seconds"]
    peak_ratio = summary["stream"]["peak_mb"] / summary["memory"]["peak_mb"]
    print(f"\nprepare on a {mb:,.0f} MB folder ({shape['files']:,} .txt files, "
          f"{shape['chinese_share_of_bytes']:.0%} Chinese by bytes), max_seq_len 128, train + "
          f"validation; median of {runs} runs, each in a fresh process")
    print(f"{'path':<36}{'seconds':>9}{'MB/s':>8}{'peak RSS':>12}{'examples':>11}")
    names = {"stream": "streaming prepare_shards", "memory": "in memory: load_corpus + create"}
    for mode, name in names.items():
        m = summary[mode]
        print(f"{name:<36}{m['seconds']:>9.1f}{mb / m['seconds']:>8.2f}{m['peak_mb']:>9.0f} MB"
              f"{rows[mode][0]['examples']:>11,}")
    print(f"streaming / in memory: time {time_ratio:.2f}x (goal <= {GOAL_TIME_RATIO:.0f}x: "
          f"{'met' if time_ratio <= GOAL_TIME_RATIO else 'MISSED'}), peak RSS {peak_ratio:.2f}x")
    results["sample"] = {"corpus": shape, "runs": rows, "medians": summary,
                         "time_ratio_stream_over_memory": time_ratio,
                         "peak_ratio_stream_over_memory": peak_ratio}

    shutil.rmtree(sample)
    big = tmp / "big"
    shape = write_folder(big, int(size_gb * 1e9), seed=2, long_line=True)
    mb = shape["bytes"] / 1e6
    r = run_child("stream", big, tok_path, tmp / "out")
    print(f"\nstreaming prepare on a {mb:,.0f} MB folder ({shape['files']:,} .txt files, one of "
          f"them a single {LONG_LINE_BYTES / 1e6:.0f} MB line), one run")
    print(f"{r['seconds']:.0f} s, {mb / r['seconds']:.2f} MB/s, peak RSS {r['peak_mb']:,.0f} MB "
          f"(goal <= {GOAL_PEAK_MB:,} MB: {'met' if r['peak_mb'] <= GOAL_PEAK_MB else 'MISSED'}), "
          f"{r['examples']:,} examples from {r['documents']:,} documents; long lines cut "
          f"{r['long_lines_split']}, documents split {r['documents_split']}")
    results["full"] = {"corpus": shape, "run": r, "goal_peak_mb": GOAL_PEAK_MB}
    shutil.rmtree(big)

    line = tmp / "one-line.txt"
    size = write_long_line(line, article_texts()[0], seed=3)
    r = run_child("stream", line, tok_path, tmp / "out", splits="all")
    print(f"\nstreaming prepare on one BERT-format file that is a single {size / 1e6:.0f} MB line: "
          f"{r['documents']} documents (parts), {r['examples']:,} examples, long lines cut "
          f"{r['long_lines_split']}, documents split {r['documents_split']}, peak RSS "
          f"{r['peak_mb']:,.0f} MB, {r['seconds']:.0f} s")
    results["long_line"] = {"bytes": size, "run": r}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sample-gb", type=float, default=0.2,
                        help="folder size for streaming vs in memory (default: 0.2)")
    parser.add_argument("--size-gb", type=float, default=1.0,
                        help="folder size for the streaming peak RSS (default: 1)")
    parser.add_argument("--skip-bbc", action="store_true")
    parser.add_argument("--skip-stream", action="store_true")
    parser.add_argument("--tmp", type=Path, default=None,
                        help="where to generate the corpora (default: the system temp folder)")
    parser.add_argument("--out", type=Path, default=RESULTS / "data.json")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    measured: dict = {"cpus": os.cpu_count(),
                      "threads_env": {k: os.environ.get(k) for k in
                                      ("OMP_NUM_THREADS", "RAYON_NUM_THREADS")}}
    if not args.skip_bbc:
        measured["bbc"] = bench_bbc(args.runs)
    if not args.skip_stream:
        with tempfile.TemporaryDirectory(prefix="bertlab-bench-", dir=args.tmp) as tmp:
            measured["prepare"] = bench_prepare(args.runs, args.sample_gb, args.size_gb, Path(tmp))
    measured["total_seconds"] = round(time.perf_counter() - start, 1)
    write_record("data.py", args, argv, args.out, **measured)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
