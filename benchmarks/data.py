"""Benchmark: NSP data preparation, ours vs a straightforward baseline, side by side.

1. BBC (whole corpus): tokenize every sentence and build NSP examples. Ours batch-encodes all
   sentences in one Rust call (`tokenize_corpus`); the baseline calls `tokenizer.encode` once per
   sentence in a Python loop. Both then run the same builder (`create_nsp_examples`). Goal: ours
   at most 10 s on 2 cores. transformers v5 no longer ships TextDatasetForNextSentencePrediction
   (it never truncated pairs anyway), so there is no library reference to time against.
2. Streaming `prepare_shards` on a generated BERT-format corpus (BBC sentences, resampled):
   throughput in MB of text per second and peak RSS, each measured in a fresh subprocess with
   resource.getrusage. The in-memory path (`load_corpus` + `create_nsp_examples`) runs beside it
   when the corpus is at most 0.2 GB (it holds everything in memory; that is the point).

Usage: python benchmarks/data.py [--runs 3] [--size-gb 0.1] [--skip-bbc] [--skip-stream]
       python benchmarks/data.py --skip-bbc --size-gb 1     (the 1 GB measurement; peak < 2 GB)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bertlab as bl
from bertlab.nsp import TokenizedCorpus, create_nsp_examples, nsp_stats, tokenize_corpus
from bertlab.tokenizer import save_tokenizer


def per_sentence_loop(docs, tok) -> TokenizedCorpus:
    """The baseline: one `encode` call per sentence, from Python."""
    sentences = [[s for s in (tok.encode(x, add_special_tokens=False).ids for x in d.sentences) if s]
                 for d in docs]
    return TokenizedCorpus([d.id for d in docs], sentences)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def bench_bbc(runs: int) -> None:
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


def write_corpus(path: Path, size_bytes: int, seed: int = 0) -> int:
    """Write a BERT-format file of about `size_bytes` from resampled BBC documents; return its size."""
    docs = bl.load_corpus("bbc")
    rng = random.Random(seed)
    written = 0
    with path.open("w", encoding="utf-8") as out:
        while written < size_bytes:
            doc = rng.choice(docs)
            first = rng.randrange(len(doc.sentences))  # vary the documents a little
            block = "\n".join(doc.sentences[first:] + doc.sentences[:first]) + "\n\n"
            out.write(block)
            written += len(block.encode("utf-8"))
    return written


CHILD = r"""
import json, resource, sys, time
import bertlab as bl
from bertlab.data import prepare_shards
from bertlab.nsp import create_nsp_examples
mode, corpus, tok_path, out = sys.argv[1:5]
tok = bl.load_tokenizer(tok_path)
start = time.perf_counter()
if mode == "stream":
    summary = prepare_shards(corpus, tok, out, max_seq_len=128, seed=0)
    examples = sum(s["examples"] for s in summary["splits"].values())
else:
    docs = bl.load_corpus(corpus)
    groups = bl.split_documents(docs)
    examples = sum(len(create_nsp_examples(groups[s], tok, max_seq_len=128, seed=0))
                   for s in ("train", "validation"))
seconds = time.perf_counter() - start
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
print(json.dumps({"seconds": seconds, "peak_mb": peak_mb, "examples": examples}))
"""


def run_child(mode: str, corpus: Path, tok_path: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(corpus), str(tok_path), str(out)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_stream(size_gb: float) -> None:
    docs = bl.load_corpus("bbc")
    tok = bl.train_tokenizer(docs)
    with tempfile.TemporaryDirectory(prefix="bertlab-bench-") as tmp:
        tmp = Path(tmp)
        tok_path = save_tokenizer(tok, tmp / "tokenizer.json")
        corpus = tmp / "corpus.txt"
        size = write_corpus(corpus, int(size_gb * 1e9))
        mb = size / 1e6
        rows = [("prepare_shards (streaming)", run_child("stream", corpus, tok_path, tmp / "shards"))]
        if size_gb <= 0.2:
            rows.append(("load_corpus + create (in memory)",
                         run_child("memory", corpus, tok_path, tmp / "unused")))
        print(f"\nprepare: {mb:,.0f} MB BERT-format corpus (resampled BBC), max_seq_len 128, "
              f"train + validation; each run in a fresh process")
        print(f"{'path':<34}{'seconds':>9}{'MB/s':>8}{'peak RSS':>11}{'examples':>11}")
        for name, r in rows:
            print(f"{name:<34}{r['seconds']:>9.1f}{mb / r['seconds']:>8.2f}"
                  f"{r['peak_mb']:>8.0f} MB{r['examples']:>11,}")
        if len(rows) == 2:
            s, m = rows[0][1], rows[1][1]
            print(f"in-memory / streaming: time {m['seconds'] / s['seconds']:.2f}x, "
                  f"peak RSS {m['peak_mb'] / s['peak_mb']:.2f}x")
        peak = rows[0][1]["peak_mb"]
        print(f"streaming peak RSS < 2 GB: {'met' if peak < 2048 else 'MISSED'} ({peak:.0f} MB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size-gb", type=float, default=0.1)
    parser.add_argument("--skip-bbc", action="store_true")
    parser.add_argument("--skip-stream", action="store_true")
    args = parser.parse_args()
    if not args.skip_bbc:
        bench_bbc(args.runs)
    if not args.skip_stream:
        bench_stream(args.size_gb)


if __name__ == "__main__":
    main()
