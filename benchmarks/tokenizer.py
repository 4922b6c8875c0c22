"""Corpus -> WordPiece vocabulary -> token ids: how long does the data layer take, and against what?

Ours: load the BBC corpus, train the 8,192-piece WordPiece vocabulary (cache off) and encode every
sentence with one batch call into Rust. Goal: at most 10 s in total on 2 cores (median of 5 runs).

Reference for training: the `tokenizers` library's own WordPieceTrainer (Rust) on the same text
and settings, on BBC and on zh-news. Ours is deterministic; the library's breaks ties between
equally frequent merges in hash-map order. The script trains each several times and prints the
time ratio and how many different vocabularies each produced.

Reference for the encoding step, on the same vocabulary and the same sample of sentences:
transformers' pure-Python BERT tokenizer (`BertTokenizerLegacy`, Google's algorithm line for
line) and our tokenizer called once per sentence in a Python loop. The script checks that all
three produce the same tokens before it times anything.

Usage: python benchmarks/tokenizer.py [--runs 5] [--cores 2] [--sample-every 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from tokenizers import trainers

import bertlab as bl
from bertlab.tokenizer import (
    SPECIAL_TOKENS,
    build_untrained_tokenizer,
    encode_sentences,
    iter_texts,
    vocab_digest,
)

GOAL_SECONDS = 10.0


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def pin_cores(n: int) -> int:
    # Emulate a 2-core laptop on a bigger machine (Linux only; elsewhere use what there is).
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))[:n]
        os.sched_setaffinity(0, cpus)
        return len(cpus)
    return os.cpu_count() or 1


def library_vocabulary(texts: list[str], vocab_size: int = 8192) -> str:
    """The `tokenizers` WordPieceTrainer with bertlab's settings; returns the vocabulary digest."""
    tok = build_untrained_tokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=2,
                                        special_tokens=list(SPECIAL_TOKENS),
                                        continuing_subword_prefix="##", show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return vocab_digest(tok)


def compare_trainers(runs: int) -> None:
    print()
    print(f"training, side by side (cache off; median of {runs} runs; distinct = how many "
          f"different vocabularies the runs gave)")
    print(f"{'corpus':<10}{'bertlab s':>10}{'distinct':>9}{'tokenizers s':>14}{'distinct':>9}"
          f"{'ratio':>8}")
    for name in ("bbc", "zh-news"):
        docs = bl.load_corpus(name)
        texts = list(iter_texts(docs))
        ours = [timed(lambda d=docs: bl.train_tokenizer(d, cache=False)) for _ in range(runs)]
        theirs = [timed(lambda t=texts: library_vocabulary(t)) for _ in range(runs)]
        ours_s = statistics.median(t for t, _ in ours)
        theirs_s = statistics.median(t for t, _ in theirs)
        print(f"{name:<10}{ours_s:>10.2f}{len({vocab_digest(tok) for _, tok in ours}):>9}"
              f"{theirs_s:>14.2f}{len({digest for _, digest in theirs}):>9}"
              f"{ours_s / theirs_s:>7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--sample-every", type=int, default=10, help="reference runs on every k-th sentence")
    args = parser.parse_args()
    cores = pin_cores(args.cores)

    loads, trains, encodes = [], [], []
    for _ in range(args.runs):
        t_load, docs = timed(lambda: bl.load_corpus("bbc"))
        t_train, tok = timed(lambda d=docs: bl.train_tokenizer(d, vocab_size=8192, cache=False))
        sentences = [s for d in docs for s in d.sentences]
        t_encode, ids = timed(lambda t=tok, s=sentences: encode_sentences(t, s))
        loads.append(t_load)
        trains.append(t_train)
        encodes.append(t_encode)
    totals = [a + b + c for a, b, c in zip(loads, trains, encodes, strict=True)]
    n_tokens = sum(len(x) for x in ids)

    print(f"BBC: {len(docs)} articles, {len(sentences)} sentences, {n_tokens} tokens; "
          f"{cores} cores; median of {args.runs} runs")
    print(f"{'step':<28}{'median s':>10}{'share':>8}")
    total = statistics.median(totals)
    for name, values in (("load corpus", loads), ("train WordPiece (8192)", trains),
                         ("encode all (batch, Rust)", encodes)):
        print(f"{name:<28}{statistics.median(values):>10.2f}{statistics.median(values) / total:>8.0%}")
    print(f"{'total':<28}{total:>10.2f}   goal <= {GOAL_SECONDS:.0f} s: {'met' if total <= GOAL_SECONDS else 'MISSED'}")

    compare_trainers(args.runs)

    # Encoding, side by side, on a sample that the pure-Python reference finishes in seconds.
    # transformers is imported here, not at the top: it takes seconds and only this part needs it.
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    sample = sentences[:: args.sample_every]
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file = Path(tmp) / "vocab.txt"
        vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
        vocab_file.write_text("\n".join(t for t, _ in vocab) + "\n", encoding="utf-8")
        reference = BertTokenizerLegacy(str(vocab_file), do_lower_case=True)

    def ours_batch():
        return encode_sentences(tok, sample)

    def ours_loop():
        return [tok.encode(s, add_special_tokens=False).ids for s in sample]

    def python_reference():
        return [reference.convert_tokens_to_ids(reference.tokenize(s)) for s in sample]

    expected = ours_batch()
    assert ours_loop() == expected, "per-sentence loop disagrees with the batch"
    assert python_reference() == expected, "BertTokenizerLegacy disagrees with ours"
    ref_runs = max(1, min(3, args.runs))
    batch = statistics.median(timed(ours_batch)[0] for _ in range(args.runs))
    loop = statistics.median(timed(ours_loop)[0] for _ in range(args.runs))
    slow = statistics.median(timed(python_reference)[0] for _ in range(ref_runs))
    print()
    print(f"encoding {len(sample)} sentences (every {args.sample_every}th), identical ids from all three")
    print(f"{'encoder':<42}{'median s':>10}{'sent/s':>10}{'vs ours':>9}")
    for name, seconds in (("ours: encode_batch (Rust, parallel)", batch),
                          ("ours: encode per sentence (Python loop)", loop),
                          ("transformers BertTokenizerLegacy (Python)", slow)):
        print(f"{name:<42}{seconds:>10.3f}{len(sample) / seconds:>10.0f}{seconds / batch:>8.1f}x")
    print(f"ratio reference / ours: {slow / batch:.0f}x "
          f"(reference median of {ref_runs} runs, ours of {args.runs})")


if __name__ == "__main__":
    main()
