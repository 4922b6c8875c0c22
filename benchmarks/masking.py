"""Masked-LM masking speed: bertlab.mask_tokens vs transformers' DataCollatorForLanguageModeling.

Both sides get the same padded BBC batches (64 sequences of [CLS] sentences [SEP], at most 128
tokens, padded to the longest row) and run alternately, batch by batch, in one process: for each
batch the steps run in a fresh random order, each step three times in a row. The first of the
three runs on caches the previous step left cold ("cold"), the other two on warm ones ("warm").
Three comparisons:

1. masking alone: `mask_tokens(ids, specials, attention_mask=..., generator=g)` (and with
   `row_seeds=`) vs `collator.torch_mask_tokens(ids, special_tokens_mask=None)`, which is how
   the collator calls it when examples carry no precomputed special-token mask (it then builds
   that mask row by row in Python);
2. the whole collate from a list of examples (bertlab.data.PretrainingCollator: pad, segment ids,
   attention mask, row-seeded masking) vs calling the
   collator on the same list of {"input_ids": [...]} examples;
3. transformers.Trainer's data path: `trainer.get_train_dataloader()` over one datasets.Dataset
   of the same examples (an `index` column beside `input_ids`), iterated for --trainer-batches
   batches, with bertlab's collator (token by token, and whole words; remove_unused_columns=False)
   and with DataCollatorForLanguageModeling (the Trainer's default column removal), alternately.
   Each pass includes what both sides share: the Trainer's sampler and the rows read from Arrow.

Prints medians (wall clock, and for warm calls also the calling thread's CPU time, which a busy
shared machine disturbs less), tokens/s (padded positions) and the ratios; for the Trainer row,
the median wall time per batch over the passes. Takes ~30 s. Run:
    .venv/bin/python benchmarks/masking.py
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import tempfile
import time
import warnings

import numpy as np
import torch
from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

import bertlab as bl
from bertlab.data import PretrainingCollator
from bertlab.masking import example_seed, mask_tokens
from bertlab.tokenizer import encode_sentences

BATCH, MAX_LEN = 64, 128
CALLS = 3  # consecutive calls per step and batch: one cold, then warm


def make_examples(tok, docs, max_len: int = MAX_LEN) -> list[list[int]]:
    """Pack each document's sentences into [CLS] chunk [SEP] examples of at most max_len tokens."""
    specials = bl.special_ids(tok)
    examples = []
    for doc in docs:
        chunk: list[int] = []
        for ids in encode_sentences(tok, doc.sentences):
            if chunk and len(chunk) + len(ids) > max_len - 2:
                examples.append([specials.cls, *chunk, specials.sep])
                chunk = []
            chunk.extend(ids[: max_len - 2])
        if chunk:
            examples.append([specials.cls, *chunk, specials.sep])
    return examples


def pad(examples: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Our padding step: one (B, T) tensor of ids and its attention mask.

    numpy.fromiter reads the Python ints several times faster than torch.tensor(list) does.
    """
    lengths = np.fromiter(map(len, examples), dtype=np.int64, count=len(examples))
    attention = np.arange(lengths.max())[None, :] < lengths[:, None]  # (B, T)
    ids = np.full(attention.shape, pad_id, dtype=np.int64)
    ids[attention] = np.fromiter(itertools.chain.from_iterable(examples), dtype=np.int64,
                                 count=int(lengths.sum()))
    return {"input_ids": torch.from_numpy(ids),
            "attention_mask": torch.from_numpy(attention.astype(np.int64))}


def collate_items(examples: list[list[int]], offset: int) -> list[dict]:
    """The dataset items bertlab's collator takes: ids, segment ids, a row seed, an NSP label."""
    return [
        {"input_ids": ids, "token_type_ids": [0] * len(ids), "row_seed": int(example_seed(0, 0, offset + j)),
         "next_sentence_label": 0}
        for j, ids in enumerate(examples)
    ]


def timed(fn) -> tuple[float, float]:
    """(wall seconds, this thread's CPU seconds) for one call."""
    start, start_cpu = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - start, time.thread_time() - start_cpu


def trainer_loaders(tok, hf_tok, examples: list[list[int]], folder: str) -> dict[str, object]:
    """Trainer's own train DataLoader over one datasets.Dataset, with each side's collator."""
    import datasets
    from transformers import BertConfig, BertForMaskedLM, Trainer, TrainingArguments

    rows = datasets.Dataset.from_dict({"input_ids": examples,
                                       "index": list(range(len(examples)))})
    model = BertForMaskedLM(BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32,
                                       num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=64))  # never run: the Trainer needs one
    sides = {"trainer_hf": (DataCollatorForLanguageModeling(hf_tok, mlm_probability=0.15, seed=0),
                            True),
             "trainer_ours": (PretrainingCollator(tok, seed=0), False),
             "trainer_ours_words": (PretrainingCollator(tok, whole_word=True, seed=0), False)}
    loaders = {}
    for key, (collator, drop_columns) in sides.items():
        args = TrainingArguments(output_dir=folder, per_device_train_batch_size=BATCH, seed=0,
                                 report_to=[], use_cpu=True, save_strategy="no",
                                 remove_unused_columns=drop_columns)
        trainer = Trainer(model=model, args=args, train_dataset=rows, data_collator=collator)
        loaders[key] = trainer.get_train_dataloader()
    return loaders


def time_trainer_path(loaders: dict[str, object], batches: int, repeats: int) -> dict[str, float]:
    """Median seconds per batch of iterating each loader for `batches` batches, sides alternating
    in a fresh order per pass (the first pass warms up and is not counted)."""
    order_rng = random.Random(1)
    times: dict[str, list[float]] = {key: [] for key in loaders}
    for repeat in range(repeats + 1):
        for key in order_rng.sample(sorted(loaders), len(loaders)):
            start = time.perf_counter()
            for _ in zip(range(batches), loaders[key], strict=False):
                pass
            if repeat:
                times[key].append((time.perf_counter() - start) / batches)
    return {key: statistics.median(v) for key, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=40, help="distinct batches (default 40)")
    parser.add_argument("--repeats", type=int, default=5, help="passes over them (default 5)")
    parser.add_argument("--trainer-batches", type=int, default=20,
                        help="batches per pass over the Trainer's DataLoader (default 20)")
    args = parser.parse_args()

    docs = bl.load_corpus("bbc")
    tok = bl.train_tokenizer(docs)
    specials = bl.special_ids(tok)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, mask_token="[MASK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", unk_token="[UNK]",
    )
    collator = DataCollatorForLanguageModeling(hf_tok, mlm_probability=0.15, seed=0)
    collator.create_rng("pt")  # what the collator's first call does when given a seed

    examples = make_examples(tok, docs)
    groups = [examples[i * BATCH:(i + 1) * BATCH] for i in range(args.batches)]
    padded = [pad(group, specials.pad) for group in groups]
    hf_examples = [[{"input_ids": e} for e in group] for group in groups]
    our_items = [collate_items(group, i * BATCH) for i, group in enumerate(groups)]
    our_collator = PretrainingCollator(tok)
    generator = torch.Generator().manual_seed(0)
    order_rng = random.Random(0)
    positions = sum(b["input_ids"].numel() for b in padded) / len(padded)
    real = sum(int(b["attention_mask"].sum()) for b in padded) / len(padded)

    keys = ("hf", "ours", "ours_seeds", "hf_collate", "ours_collate")
    warm: dict[str, list[float]] = {k: [] for k in keys}
    warm_cpu: dict[str, list[float]] = {k: [] for k in keys}
    cold: dict[str, list[float]] = {k: [] for k in keys}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fast-tokenizer padding hint, once per call
        for repeat in range(args.repeats + 1):  # the first pass warms up and is not counted
            for i, (batch, items, hf_group) in enumerate(zip(padded, our_items, hf_examples,
                                                              strict=True)):
                ids, mask = batch["input_ids"], batch["attention_mask"]
                seeds = example_seed(0, repeat, torch.arange(i * BATCH, i * BATCH + len(ids)))
                hf_inputs = [ids.clone() for _ in range(CALLS)]  # it writes into its input
                steps = {
                    "hf": lambda c: collator.torch_mask_tokens(hf_inputs[c]),  # noqa: B023
                    "ours": lambda c: mask_tokens(  # noqa: B023
                        ids, specials, attention_mask=mask, generator=generator),  # noqa: B023
                    "ours_seeds": lambda c: mask_tokens(  # noqa: B023
                        ids, specials, attention_mask=mask, row_seeds=seeds),  # noqa: B023
                    "hf_collate": lambda c: collator(hf_group),  # noqa: B023
                    "ours_collate": lambda c: our_collator(items),  # noqa: B023
                }
                for key in order_rng.sample(keys, len(keys)):  # a fresh order per batch
                    for call in range(CALLS):
                        elapsed, cpu = timed(lambda: steps[key](call))  # noqa: B023
                        if not repeat:
                            continue
                        if call == 0:  # right after another step: cold caches
                            cold[key].append(elapsed)
                        else:
                            warm[key].append(elapsed)
                            warm_cpu[key].append(cpu)

    med = {name: {k: statistics.median(v) for k, v in table.items()}
           for name, table in (("warm", warm), ("cpu", warm_cpu), ("cold", cold))}
    print(f"{len(groups)} BBC batches of {BATCH}, mean {positions / BATCH:.1f} padded positions "
          f"per row ({real / positions:.0%} real tokens); {args.repeats} timed passes; "
          f"torch threads: {torch.get_num_threads()}")
    print(f"{'':<42}{'-------- warm --------':>24}{'--- warm CPU ---':>17}{'---- cold ----':>16}")
    print(f"{'step':<42}{'ms':>8}{'M tok/s':>9}{'ratio':>7}{'ms':>10}{'ratio':>7}"
          f"{'ms':>9}{'ratio':>7}")
    rows = [
        ("masking  transformers torch_mask_tokens", "hf", "hf"),
        ("masking  bertlab mask_tokens (generator)", "ours", "hf"),
        ("masking  bertlab mask_tokens (row_seeds)", "ours_seeds", "hf"),
        ("collate  transformers collator(examples)", "hf_collate", "hf_collate"),
        ("collate  bertlab PretrainingCollator(items)", "ours_collate", "hf_collate"),
    ]
    for name, key, ref in rows:
        line = f"{name:<42}{med['warm'][key] * 1e3:>8.3f}{positions / med['warm'][key] / 1e6:>9.1f}"
        for kind in ("warm", "cpu", "cold"):
            if kind != "warm":
                line += f"{med[kind][key] * 1e3:>{10 if kind == 'cpu' else 9}.3f}"
            line += f"{med[kind][ref] / med[kind][key]:>6.1f}x"
        print(line)
    print("Medians. warm: calls 2-3 of each step's block of 3 (wall clock); warm CPU: the same\n"
          "calls, the calling thread's CPU time (steadier on a busy machine); cold: the first\n"
          "call of each block, right after another step. M tok/s counts padded positions;\n"
          "ratio = transformers time / this time.")
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = time_trainer_path(trainer_loaders(tok, hf_tok, examples, folder),
                                    args.trainer_batches, args.repeats)
    print(f"Trainer data path, get_train_dataloader(), {args.trainer_batches} batches of {BATCH} "
          f"per pass, median ms per batch over {args.repeats} passes:")
    for name, key in (("  transformers DataCollatorForLanguageModeling", "trainer_hf"),
                      ("  bertlab PretrainingCollator (token by token)", "trainer_ours"),
                      ("  bertlab PretrainingCollator (whole words)", "trainer_ours_words")):
        print(f"{name:<50}{trainer[key] * 1e3:>8.3f} ms"
              f"{trainer['trainer_hf'] / trainer[key]:>7.1f}x")

if __name__ == "__main__":
    main()
