"""NSP by sentences per side: the shipped NSP model on pairs of 1, 2 and 3 sentences a side, beside
a rule that only asks whether A and B share a content word.

Notebook 03 teaches NSP on two sentences; the twins (benchmarks/twins.py) trained and scored it
on chunks of up to 128 tokens. This benchmark asks what the NSP head does on short segments. On
the BBC validation split (documents the models never trained on) it builds held-out pairs with k
= 1, 2 and 3 sentences a side, half IsNext and half NotNext:

- A is k consecutive sentences of a document. IsNext: B is the k sentences after A. NotNext: B
  is k consecutive sentences of another validation document, taken from the same place a B
  would sit there (after a window of k sentences), so B's position in its document tells
  nothing about the label.
- Pairs longer than the model's length (its recipe's max_seq_len) are cut the way the pair
  builder cuts them (`bertlab.pairs.PairBuilder`: one token at a time from the longer side).

Scored, on the same pairs, unmasked:

- course-nsp: the NSP head of models/course-nsp (MLM + NSP; the prediction is its argmax);
- course-mlm: the same head of its MLM-only twin, models/course-mlm, never trained: a control
  that should be a coin, so that any skill above it is NSP's;
- the shared-content-word rule: IsNext iff A and B share at least one content word (a lowercased
  word of 3 letters or more, not in `STOPWORDS`), read from the very tokens the model reads.

Each k is scored on several draws (`--draws`, each `--pairs` pairs from its own seed), so every
figure has a mean and a sample standard deviation over the draws; course-nsp minus the rule is
paired draw by draw (mean +- 2 SE). The rule is also scored on sentence-order pairs made from
each draw's IsNext pairs, half of them swapped: the words two sides share do not depend on their
order, so there it can only guess. Then, at k = 1, the same
scores by partner: IsNext pairs, NotNext pairs whose B comes from a story of the same topic, and
NotNext pairs whose B comes from another topic. A reader of topics alone would get same-topic
NotNext pairs wrong.

Results, with the command, go to benchmarks/results/nsp_sentences.json (notebook 06 reads it).
About a minute on one CPU thread.

Usage: python benchmarks/nsp_sentences.py [--pairs 400] [--draws 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from _record import (  # benchmarks/ is on sys.path when run as a script
    REPO,
    check_common,
    write_record,
)
from tokenizers import Tokenizer

from bertlab.corpus import split_documents
from bertlab.errors import BadInput, run_reporting
from bertlab.loading import load_model
from bertlab.pairs import (
    IN_ORDER,
    IS_NEXT,
    NOT_NEXT,
    SWAPPED,
    Example,
    PairBuilder,
    TokenizedCorpus,
    pad_examples,
    tokenize_corpus,
)
from bertlab.readers import load_corpus
from bertlab.tokenizer import special_ids

RESULTS = REPO / "benchmarks" / "results"
MODELS = {"course-nsp": REPO / "models" / "course-nsp", "course-mlm": REPO / "models" / "course-mlm"}
SIDES = (1, 2, 3)  # sentences per side
MAX_SIDES = 6  # BBC sentences average about 25 tokens: 2 x 6 of them overflow 128 tokens

# Function words and the commonest words of news copy: sharing one of them says nothing about
# whether two passages belong together.
STOPWORDS = frozenset("""
about after all also and any are been before being but can could did does for from had has
have her here him his how its into just last like made many may more most much new not now off
one only other our out over said says she some such than that the their them then there these
they this those two very was way were what when where which while who will with would year
years you your
""".split())
MIN_LETTERS = 3
# The sets of pairs: (labels, drawn evenly; where a NotNext B comes from).
KINDS = {"mixed": ((IS_NEXT, NOT_NEXT), "any"), "is_next": ((IS_NEXT,), "any"),
         "not_next_same_topic": ((NOT_NEXT,), "same topic"),
         "not_next_other_topic": ((NOT_NEXT,), "other topic")}
_WORD = re.compile(r"[a-z]+")


def content_words(text: str) -> set[str]:
    """Return the content words of `text`: lowercased runs of letters of at least `MIN_LETTERS`,
    stopwords left out."""
    return {w for w in _WORD.findall(text.lower()) if len(w) >= MIN_LETTERS and w not in STOPWORDS}


def rule_label(a_text: str, b_text: str) -> int:
    """Return the rule's label for a pair: IS_NEXT iff A and B share a content word."""
    return IS_NEXT if content_words(a_text) & content_words(b_text) else NOT_NEXT


def sides_text(example: Example, tok: Tokenizer) -> tuple[str, str]:
    """Return the text of A and of B as the model reads them (after truncation)."""
    ids = [int(t) for t in example.input_ids]
    return tok.decode(ids[1:1 + example.a_len]), tok.decode(ids[2 + example.a_len:-1])


def rule_labels(examples: Sequence[Example], tok: Tokenizer) -> list[int]:
    """Return the shared-content-word rule's label for each pair."""
    return [rule_label(*sides_text(e, tok)) for e in examples]


def sop_rule_accuracy(examples: Sequence[Example], tok: Tokenizer, seed: int) -> float:
    """Return the rule's accuracy on sentence-order pairs made from the IsNext pairs among
    `examples`, half of them swapped (B before A): it says IN_ORDER iff the two sides share a
    content word. A shared word is shared either way round, so the rule can only guess."""
    in_order = [sides_text(e, tok) for e in examples if e.next_sentence_label == IS_NEXT]
    if not in_order:
        raise BadInput("the pairs", "hold no IsNext pair to make sentence-order pairs from",
                       "pass more pairs")
    labels = [SWAPPED if i % 2 else IN_ORDER for i in range(len(in_order))]
    random.Random(seed).shuffle(labels)
    said = [IN_ORDER if rule_label(*(sides if label == IN_ORDER else sides[::-1])) == IS_NEXT
            else SWAPPED for sides, label in zip(in_order, labels, strict=True)]
    return sum(s == label for s, label in zip(said, labels, strict=True)) / len(labels)


def accuracy(predicted: Sequence[int], examples: Sequence[Example]) -> float:
    """Return the share of pairs whose predicted label is their label."""
    if len(predicted) != len(examples) or not examples:
        raise BadInput("the predictions", f"{len(predicted)} of them for {len(examples)} pairs",
                       "pass one prediction per pair, and at least one pair")
    return sum(p == e.next_sentence_label for p, e in zip(predicted, examples, strict=True)) / len(examples)


# ---------------------------------------------------------------------------------------------
# The held-out pairs


def held_out(tok: Tokenizer, corpus: str = "bbc") -> tuple[TokenizedCorpus, list[str]]:
    """Return the validation split of `corpus`, tokenized, and each document's topic label."""
    validation = split_documents(load_corpus(corpus))["validation"]
    return (tokenize_corpus(validation, tok, name=f"{corpus} validation"),
            [d.label or "" for d in validation])


def _partner(rng: random.Random, a_doc: int, usable: Sequence[int], topics: Sequence[str],
             partner: str) -> int:
    """Return the document NotNext B comes from: another usable one, of A's topic ("same topic"),
    of another topic ("other topic") or any ("any")."""
    wanted = [d for d in usable if d != a_doc and (
        partner == "any" or (topics[d] == topics[a_doc]) == (partner == "same topic"))]
    if not wanted:
        raise BadInput(f"document {a_doc}", f"has no {partner!r} NotNext partner on offer",
                       "pass more documents or another partner")
    return rng.choice(wanted)


def build_pair(corpus: TokenizedCorpus, builder: PairBuilder, k: int, a_doc: int,
               b_doc: int) -> Example:
    """Return one pair of k sentences a side: B follows A in `a_doc` when `b_doc` is `a_doc`
    (IsNext), else B comes from `b_doc` (NotNext), from the place a B sits after a window of k
    sentences. Cut to the builder's length as the pair builder cuts."""
    rng, sents = builder.rng, corpus.sentences
    a_start = rng.randint(0, len(sents[a_doc]) - 2 * k)
    b_start = a_start + k if b_doc == a_doc else rng.randint(0, len(sents[b_doc]) - 2 * k) + k
    tokens_a = [t for s in sents[a_doc][a_start:a_start + k] for t in s]
    tokens_b = [t for s in sents[b_doc][b_start:b_start + k] for t in s]
    return builder.pair(tokens_a, tokens_b, IS_NEXT if b_doc == a_doc else NOT_NEXT,
                        doc_index=a_doc, doc_id=corpus.doc_ids[a_doc],
                        a_sentences=(a_start, a_start + k), b_doc_index=b_doc,
                        b_sentences=(b_start, b_start + k))


def draw_pairs(corpus: TokenizedCorpus, topics: Sequence[str], tok: Tokenizer, *, k: int,
               pairs: int, seed: int, max_seq_len: int, kind: str = "mixed") -> list[Example]:
    """Return `pairs` held-out pairs of k sentences a side of one of `KINDS`: their labels split
    evenly over the kind's labels in a shuffled order; A from a document with at least 2k
    sentences (so that an IsNext B exists), NotNext B from a partner document of the kind
    (`_partner`). The same seed, the same pairs."""
    labels, partner = KINDS[kind]
    rng = random.Random(seed)
    builder = PairBuilder(special_ids(tok), max_seq_len=max_seq_len, short_seq_prob=0.0,
                          balance="exact", rng=rng)
    usable = [d for d, sents in enumerate(corpus.sentences) if len(sents) >= 2 * k]
    if len(usable) < 2:
        raise BadInput(corpus.name, f"has {len(usable)} document(s) of {2 * k}+ sentences, and "
                       f"{k} sentence(s) a side need two", "pass a smaller k or more documents")
    order = [labels[i % len(labels)] for i in range(pairs)]
    rng.shuffle(order)
    found = []
    for label in order:
        a_doc = rng.choice(usable)
        b_doc = a_doc if label == IS_NEXT else _partner(rng, a_doc, usable, topics, partner)
        found.append(build_pair(corpus, builder, k, a_doc, b_doc))
    return found


# ---------------------------------------------------------------------------------------------
# Scoring


@torch.no_grad()
def p_is_next(model: torch.nn.Module, examples: Sequence[Example], pad: int,
              batch_size: int = 200) -> list[float]:
    """Return the pair head's probability of IsNext for each pair (unmasked inputs, padded)."""
    model.eval()
    found: list[float] = []
    for i in range(0, len(examples), batch_size):
        batch = pad_examples(examples[i:i + batch_size], pad)
        encoded = model.bert(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        found += model.nsp(encoded.pooler_output).softmax(-1)[:, IS_NEXT].tolist()
    return found


def head_labels(probabilities: Sequence[float]) -> list[int]:
    """Return the head's label for each pair: IS_NEXT where P(IsNext) > 1/2."""
    return [IS_NEXT if p > 0.5 else NOT_NEXT for p in probabilities]


def spread(values: Sequence[float]) -> dict:
    """Return the mean, the sample standard deviation (0 for one value) and the values."""
    return {"mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "per_draw": list(values)}


def score_draw(models: dict, examples: Sequence[Example], tok: Tokenizer) -> dict[str, float]:
    """Return each model's head accuracy and the rule's on one set of pairs."""
    pad = special_ids(tok).pad
    scores = {name: accuracy(head_labels(p_is_next(m, examples, pad)), examples)
              for name, m in models.items()}
    scores["rule"] = accuracy(rule_labels(examples, tok), examples)
    return scores


def by_sides(models: dict, corpus: TokenizedCorpus, topics: Sequence[str], tok: Tokenizer,
             args: argparse.Namespace) -> dict:
    """Return, per k in `args.sides`, each scorer's accuracy over the draws and the pairs' shape."""
    found = {}
    for k in args.sides:
        draws = [draw_pairs(corpus, topics, tok, k=k, pairs=args.pairs, seed=seed,
                            max_seq_len=args.max_seq_len) for seed in range(args.draws)]
        scores = [score_draw(models, d, tok) for d in draws]
        every = [e for d in draws for e in d]
        gaps = [s["course-nsp"] - s["rule"] for s in scores]  # paired: the same pairs
        found[str(k)] = {
            **{name: spread([s[name] for s in scores]) for name in scores[0]},
            "nsp_minus_rule": {**spread(gaps), "two_se": 2 * spread(gaps)["std"] / len(gaps) ** 0.5},
            "rule_on_sop_pairs": spread([sop_rule_accuracy(d, tok, seed)
                                         for seed, d in enumerate(draws)]),
            "pairs_per_draw": args.pairs,
            "is_next_share": sum(e.next_sentence_label == IS_NEXT for e in every) / len(every),
            "mean_tokens": statistics.fmean(len(e.input_ids) for e in every),
            "truncated_share": sum(e.truncated for e in every) / len(every)}
        print(f"  k = {k}: " + ", ".join(f"{name} {found[str(k)][name]['mean']:.3f} ± "
                                         f"{found[str(k)][name]['std']:.3f}" for name in scores[0])
              + f"  ({found[str(k)]['mean_tokens']:.0f} tokens a pair)", flush=True)
    return found


def by_partner(models: dict, corpus: TokenizedCorpus, topics: Sequence[str], tok: Tokenizer,
               args: argparse.Namespace, k: int = 1) -> dict:
    """Return, at k sentences a side, each scorer's accuracy on IsNext pairs alone and on NotNext
    pairs whose B is of A's topic or of another, over the draws."""
    found: dict = {"sides": k}
    for kind in ("is_next", "not_next_same_topic", "not_next_other_topic"):
        scores = [score_draw(models, draw_pairs(
            corpus, topics, tok, k=k, pairs=args.pairs // 2, seed=1000 + seed,
            max_seq_len=args.max_seq_len, kind=kind), tok) for seed in range(args.draws)]
        found[kind] = {name: spread([s[name] for s in scores]) for name in scores[0]}
        print(f"  {kind}: " + ", ".join(f"{name} {found[kind][name]['mean']:.3f}"
                                        for name in scores[0]), flush=True)
    return found


def checks_of(sides: dict, partners: dict) -> dict[str, bool]:
    """Return the statements notebook 06 makes about the numbers, each True or False."""
    ks = sorted(sides, key=int)
    nsp = [sides[k]["course-nsp"]["mean"] for k in ks]
    gap = {k: sides[k]["nsp_minus_rule"] for k in ks}
    same, other = (partners[kind]["course-nsp"]["mean"]
                   for kind in ("not_next_same_topic", "not_next_other_topic"))
    return {
        "course-nsp rises with every added sentence a side": all(
            a < b for a, b in zip(nsp, nsp[1:], strict=False)),
        f"at {ks[0]} sentence(s) a side course-nsp is within 2 SE of the rule": abs(
            gap[ks[0]]["mean"]) <= gap[ks[0]]["two_se"],
        "at no k is course-nsp above the rule beyond 2 SE": all(
            g["mean"] <= g["two_se"] for g in gap.values()),
        "course-mlm's head, never trained, is a coin at every k (within 0.05 of 1/2)": all(
            abs(sides[k]["course-mlm"]["mean"] - 0.5) <= 0.05 for k in ks),
        "course-nsp gets same-topic NotNext pairs right less often than other-topic ones":
            same < other,
        "the rule is a coin on sentence-order pairs at every k (within 0.05 of 1/2)": all(
            abs(sides[k]["rule_on_sop_pairs"]["mean"] - 0.5) <= 0.05 for k in ks),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=400, help="pairs in each draw")
    parser.add_argument("--draws", type=int, default=5, help="draws of pairs (seeds 0, 1, ...)")
    parser.add_argument("--sides", type=int, nargs="+", default=list(SIDES),
                        help="sentences per side to score")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=RESULTS / "nsp_sentences.json")
    args = parser.parse_args(argv)
    if args.pairs < 4 or args.draws < 1 or min(args.sides) < 1:
        parser.error(f"--pairs {args.pairs}, --draws {args.draws}, --sides {args.sides}: pass "
                     f"at least 4 pairs, 1 draw and sides of 1 sentence or more")
    if max(args.sides) > MAX_SIDES:
        raise BadInput(f"--sides {' '.join(map(str, args.sides))}", f"asks for more than "
                       f"{MAX_SIDES} sentences a side, which no pair of the models' length holds",
                       f"pass sides from 1 to {MAX_SIDES}")
    check_common(args.threads, args.out, list(MODELS.values()))
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    manifests = {n: json.loads((p / "MANIFEST.json").read_text()) for n, p in MODELS.items()}
    models = {}
    for name, path in MODELS.items():
        models[name], tok = load_model(path, require_tokenizer=True)
    lengths = {m["recipe"]["max_seq_len"] for m in manifests.values()}
    corpora = {m["corpus"]["name"] for m in manifests.values()}
    if len(lengths) != 1 or len(corpora) != 1:
        raise BadInput(", ".join(map(str, MODELS.values())), f"were trained at lengths "
                       f"{sorted(lengths)} on {sorted(corpora)}", "compare twins of one length "
                       "and one corpus (benchmarks/twins.py --ship writes them)")
    args.max_seq_len = lengths.pop()
    corpus, topics = held_out(tok, corpora.pop())
    print(f"{len(corpus)} validation documents; {args.draws} draws of {args.pairs} pairs a k, "
          f"up to {args.max_seq_len} tokens", flush=True)
    sides = by_sides(models, corpus, topics, tok, args)
    print(f"by NotNext partner, {args.draws} draws of {args.pairs // 2} pairs each:", flush=True)
    partners = by_partner(models, corpus, topics, tok, args)
    checks = checks_of(sides, partners)
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'MISS'}  {name}")
    given = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "max_seq_len"})
    write_record(
        "nsp_sentences.py", given, argv, args.out, max_seq_len=args.max_seq_len,
        models={n: {"what": m["what"], "objectives": m["objectives"], "steps": m["steps"],
                    "max_seq_len": m["recipe"]["max_seq_len"], "corpus": m["corpus"]["name"],
                    "pair_head": "trained (NSP)" if "nsp" in m["objectives"] else
                    "never trained: a control, expected to be a coin"}
                for n, m in manifests.items()},
        pairs=("BBC validation split; A = k consecutive sentences of a document with 2k or more; "
               "IsNext B = the next k; NotNext B = k consecutive sentences after a k-sentence "
               "window of another validation document; labels half and half; cut to max_seq_len "
               "by the pair builder's rule; inputs unmasked; a head predicts IsNext where "
               "P(IsNext) > 1/2"),
        rule={"says": "IsNext iff A and B share a content word", "min_letters": MIN_LETTERS,
              "stopwords": sorted(STOPWORDS), "reads": "the decoded tokens the model reads"},
        labels={"is_next": IS_NEXT, "not_next": NOT_NEXT}, by_sides=sides,
        by_partner=partners, checks=checks,
        timings_s={"total": round(time.perf_counter() - start, 1)})
    return 0


if __name__ == "__main__":
    # Bad input ends in one `error:` line (exit 2), as in `python -m bertlab`.
    sys.exit(run_reporting(main))
