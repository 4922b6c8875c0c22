"""bertlab's collator as transformers.Trainer's data_collator, on rows of a datasets.Dataset."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

import bertlab as bl
from bertlab.data import PretrainingCollator, PretrainingDataset
from bertlab.hf import TrainerMissingError, mask_epoch_callback
from bertlab.masking import IGNORE_INDEX
from bertlab.pairs import create_nsp_examples
from bertlab.tokenizer import MASK, special_ids

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
pytest.importorskip("accelerate")


@pytest.fixture(scope="module")
def setup():
    docs = bl.load_corpus("bbc")[:50]
    tok = bl.train_tokenizer(docs, vocab_size=500)
    return tok, docs


def _mlm_rows(tok, docs) -> datasets.Dataset:
    """One [CLS] sentence [SEP] row per BBC sentence (at most 64 tokens), numbered."""
    specials = special_ids(tok)
    rows = [[specials.cls, *tok.encode(s, add_special_tokens=False).ids[:62], specials.sep]
            for doc in docs for s in doc.sentences]
    return datasets.Dataset.from_dict({"input_ids": rows, "index": list(range(len(rows)))})


def _nsp_rows(examples) -> datasets.Dataset:
    items = [PretrainingDataset(examples)[i] for i in range(len(examples))]
    return datasets.Dataset.from_dict({
        "input_ids": [it["input_ids"].tolist() for it in items],
        "token_type_ids": [it["token_type_ids"].tolist() for it in items],
        "next_sentence_label": [it["next_sentence_label"] for it in items],
        "index": list(range(len(items))),
    })


def _args(tmp_path, **options) -> transformers.TrainingArguments:
    settings = dict(output_dir=str(tmp_path), max_steps=30, per_device_train_batch_size=8,
                    report_to=[], use_cpu=True, learning_rate=1e-3, logging_steps=5,
                    save_strategy="no", remove_unused_columns=False, seed=0,
                    disable_tqdm=True)
    return transformers.TrainingArguments(**{**settings, **options})


def _tiny(tok, kind: str):
    config = transformers.BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32,
                                     num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=128)
    torch.manual_seed(0)  # the test's own model init; the package never seeds globally
    return getattr(transformers, kind)(config)


def _logged_losses(trainer) -> list[float]:
    return [row["loss"] for row in trainer.state.log_history if "loss" in row]


def _check_masking_statistics(batches, tok) -> None:
    """Selected share ~15% of real non-special tokens, 80/10/10 among targets (binomial
    tolerance, counted per word since a word shares one decision), whole words, -100 elsewhere."""
    specials = special_ids(tok)
    vocab = {i: t for t, i in tok.get_vocab().items()}
    counts = {"maskable": 0, "selected": 0, "words": 0, "mask": 0, "keep": 0, "random": 0}
    for batch, original in batches:
        labels, inputs = batch["labels"], batch["input_ids"]
        selected = labels != IGNORE_INDEX
        special = torch.isin(original, torch.tensor(specials.all)) | (batch["attention_mask"] == 0)
        assert not (selected & special).any(), "a special token or padding was selected"
        assert torch.equal(labels[selected], original[selected])
        for row, col in selected.nonzero().tolist():
            piece = vocab[int(original[row, col])]
            if piece.startswith("##"):  # whole words: a piece goes with the one before it
                assert selected[row, col - 1]
                continue
            counts["words"] += 1
            kind = ("mask" if inputs[row, col] == tok.token_to_id(MASK) else
                    "keep" if inputs[row, col] == original[row, col] else "random")
            counts[kind] += 1
        counts["maskable"] += int((~special).sum())
        counts["selected"] += int(selected.sum())
    assert abs(counts["selected"] / counts["maskable"] - 0.15) < 0.02, counts
    n = counts["words"]
    for kind, p in (("mask", 0.8), ("keep", 0.1), ("random", 0.1)):
        assert abs(counts[kind] / n - p) < 4 * math.sqrt(p * (1 - p) / n) + 1 / 500, (kind, counts)


@pytest.mark.slow
def test_trainer_learns_masked_lm_with_bertlabs_collator(setup, tmp_path, one_thread):
    tok, docs = setup
    rows = _mlm_rows(tok, docs)
    collator = PretrainingCollator(tok, whole_word=True, seed=0)
    # 300 steps of 8 rows: more than three passes over the 728 sentences
    args = _args(tmp_path, max_steps=300, logging_steps=5, learning_rate=3e-3)
    trainer = transformers.Trainer(
        model=_tiny(tok, "BertForMaskedLM"), args=args, train_dataset=rows,
        data_collator=collator, callbacks=[mask_epoch_callback(collator)])
    trainer.train()
    losses = _logged_losses(trainer)
    assert len(losses) == 60 and all(math.isfinite(x) for x in losses), losses
    # from chance (ln 500 = 6.2) down past it: steps 1-5 against the last 15 steps
    assert sum(losses[-3:]) / 3 < losses[0] - 0.4, losses
    assert collator.epoch == 3  # the callback moved the masking epoch on

    # What the Trainer's own data path gives: the statistics over many batches.
    batches = []
    for epoch in range(3):
        collator.set_epoch(epoch)
        for batch in trainer.get_train_dataloader():
            # the unmasked ids: the labels where predicted, else the input itself
            original = torch.where(batch["labels"] == IGNORE_INDEX, batch["input_ids"], batch["labels"])
            batches.append((batch, original))
    assert set(batches[0][0]) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    _check_masking_statistics(batches, tok)


@pytest.mark.slow
def test_trainer_takes_nsp_pairs_for_bert_for_pretraining(setup, tmp_path, one_thread):
    tok, docs = setup
    examples = create_nsp_examples(docs, tok, max_seq_len=64, seed=0)
    collator = PretrainingCollator(tok, whole_word=True, seed=0)
    trainer = transformers.Trainer(
        model=_tiny(tok, "BertForPreTraining"), args=_args(tmp_path, max_steps=20),
        train_dataset=_nsp_rows(examples), data_collator=collator,
        callbacks=[mask_epoch_callback(collator)])
    batch = next(iter(trainer.get_train_dataloader()))
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels",
                          "next_sentence_label"}
    trainer.train()
    losses = _logged_losses(trainer)
    assert losses and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses


def test_rows_get_the_masks_bertlabs_own_dataset_gives(setup):
    """Same seed, epoch and example index: the same mask, whatever batch the row lands in
    (so whatever worker), and a new one in the next epoch."""
    tok, docs = setup
    examples = create_nsp_examples(docs, tok, max_seq_len=64, seed=0)[:24]
    own = PretrainingDataset(examples, seed=3)
    rows = list(_nsp_rows(examples))
    collator = PretrainingCollator(tok, whole_word=True, seed=3)
    ours = PretrainingCollator(tok, whole_word=True)([own[i] for i in range(24)])
    theirs = collator(rows)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    reversed_batch = collator(rows[::-1][:8])  # other companions, other padding
    n = int(reversed_batch["attention_mask"][0].sum())
    assert torch.equal(reversed_batch["labels"][0, :n], theirs["labels"][23, :n])
    collator.set_epoch(1)
    own.set_epoch(1)
    assert torch.equal(collator(rows)["labels"],
                       PretrainingCollator(tok, whole_word=True)([own[i] for i in range(24)])["labels"])
    assert not torch.equal(collator(rows)["labels"], theirs["labels"])


def test_rows_take_word_ids_with_none_at_the_specials(setup):
    tok, _ = setup
    collator = PretrainingCollator(tok, whole_word=True, return_word_ids=True)
    ids = tok.encode("the markets rose sharply").ids
    batch = collator([{"input_ids": ids, "word_ids": [None, *[0] * (len(ids) - 2), None],
                       "index": 0}])
    assert batch["word_ids"][0].tolist() == [-1, *[0] * (len(ids) - 2), -1]
    selected = batch["labels"][0] != IGNORE_INDEX
    assert selected[1:-1].all() or not selected.any()  # one word: all its pieces or none


def test_rows_without_an_index_name_the_fix(setup, tmp_path):
    tok, docs = setup
    collator = PretrainingCollator(tok)
    with pytest.raises(ValueError, match="remove_unused_columns=False"):
        collator([{"input_ids": [2, 9, 3]}])
    with pytest.raises(ValueError, match="next_sentence_label"):
        collator([{"input_ids": [2, 9, 3], "index": 0, "next_sentence_label": 0},
                  {"input_ids": [2, 9, 3], "index": 1}])
    with pytest.raises(ValueError, match="seed="):
        PretrainingCollator(tok, seed=1.5)
    # The Trainer's default drops the "index" column; the first batch then says what to set.
    trainer = transformers.Trainer(
        model=_tiny(tok, "BertForMaskedLM"), args=_args(tmp_path, remove_unused_columns=True),
        train_dataset=_mlm_rows(tok, docs), data_collator=collator)
    with pytest.raises(ValueError, match="remove_unused_columns=False"):
        next(iter(trainer.get_train_dataloader()))


def test_callback_refuses_what_would_freeze_the_masks(setup, tmp_path):
    tok, docs = setup
    with pytest.raises(ValueError, match="PretrainingCollator"):
        mask_epoch_callback(transformers.DataCollatorForLanguageModeling)
    collator = PretrainingCollator(tok)
    trainer = transformers.Trainer(
        model=_tiny(tok, "BertForMaskedLM"),
        args=_args(tmp_path, dataloader_num_workers=1, dataloader_persistent_workers=True),
        train_dataset=_mlm_rows(tok, docs), data_collator=collator,
        callbacks=[mask_epoch_callback(collator)])
    with pytest.raises(ValueError, match="dataloader_persistent_workers=False"):
        trainer.train()


@pytest.mark.parametrize("hidden", ["transformers", "accelerate"])
def test_missing_trainer_packages_name_the_install(hidden):
    code = f"""
import sys
sys.modules[{hidden!r}] = None  # any import of it now fails
from bertlab.data import PretrainingCollator
from bertlab.hf import TrainerMissingError, mask_epoch_callback
from bertlab.tokenizer import SpecialIds
try:
    mask_epoch_callback(PretrainingCollator(SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4, vocab_size=50)))
except TrainerMissingError as error:
    print(error)
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert f"needs {hidden} (not installed)" in out.stdout and "pip install" in out.stdout, out
    assert issubclass(TrainerMissingError, ImportError)


def test_the_benchmark_times_the_trainers_data_path_on_small_sizes(setup, tmp_path, load_benchmark):
    tok, docs = setup
    bench = load_benchmark("masking")
    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, mask_token="[MASK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", unk_token="[UNK]")
    loaders = bench.trainer_loaders(tok, hf_tok, bench.make_examples(tok, docs[:20]), str(tmp_path))
    batch = next(iter(loaders["trainer_ours_words"]))
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    medians = bench.time_trainer_path(loaders, batches=1, repeats=1)
    assert set(medians) == {"trainer_hf", "trainer_ours", "trainer_ours_words"}
    assert all(t > 0 for t in medians.values())


def test_masks_are_the_same_with_dataloader_workers(setup, tmp_path):
    """Workers copy the collator when a pass starts: the epoch set before it reaches them."""
    tok, docs = setup
    rows = _mlm_rows(tok, docs).select(range(64))
    passes = {}
    for workers in (0, 2):
        collator = PretrainingCollator(tok, seed=0)
        trainer = transformers.Trainer(
            model=_tiny(tok, "BertForMaskedLM"),
            args=_args(tmp_path, dataloader_num_workers=workers), train_dataset=rows,
            data_collator=collator)
        loader = trainer.get_train_dataloader()
        collator.set_epoch(1)
        passes[workers] = [batch["labels"] for batch in loader]
    assert len(passes[0]) == 8
    assert all(torch.equal(a, b) for a, b in zip(passes[0], passes[2], strict=True))
    collator.set_epoch(0)
    assert not all(torch.equal(a, b["labels"])
                   for a, b in zip(passes[0], trainer.get_train_dataloader(), strict=True))
