"""`python -m bertlab demo`: the whole pipeline on BBC news in a few minutes, told step by step.

Corpus -> tokenizer -> NSP data -> pretrain (tiny on CPU, small on a GPU) -> fill-mask before and
after -> [CLS] fine-tuning on BBC topics against TF-IDF and from scratch. It prints each stage,
then writes `run/` (the pretraining run), `curves.png` and `results.json` into its folder.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch

from bertlab.checkpoint import list_checkpoints
from bertlab.corpus import load_corpus
from bertlab.data import pretraining_loader
from bertlab.device import resolve_device
from bertlab.finetune import FinetuneConfig, compare_downstream, format_table
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.pretraining import fill_mask, pretrain, unigram_baseline
from bertlab.tokenizer import save_tokenizer, train_tokenizer
from bertlab.train import TrainConfig
from bertlab.util import LOCK_NAME, atomic_write_json, check_output_folder
from bertlab.viz import plot_training_curves

EXAMPLES = (
    "the [MASK] fell sharply on wall street.",
    "the prime [MASK] said the election would be held in may.",
    "the film won the award for best [MASK].",
    "the team won the [MASK] after extra time.",
)
# What the demo writes into its folder; a folder with only these may be reused.
DEMO_FILES = frozenset({"run", "curves.png", "results.json", LOCK_NAME})


def history_table(history: list[dict], baseline: float | None = None) -> str:
    """Return a text table of a pretraining history (`TrainResult.history`), one row per
    evaluation, with the unigram baseline's MLM accuracy as a last line when given."""
    lines = [f"{'step':>6} {'tokens':>10} {'train loss':>10} {'val MLM loss':>12} "
             f"{'MLM acc':>8} {'ppl':>8} {'NSP acc':>8}"]
    for row in history:
        train_loss = row.get("train_loss")
        lines.append(
            f"{row['step']:>6} {row['tokens']:>10} "
            f"{'-' if train_loss is None else f'{train_loss:.3f}':>10} "
            f"{row.get('val_mlm_loss', float('nan')):>12.3f} "
            f"{row.get('val_mlm_accuracy', float('nan')):>8.3f} "
            f"{row.get('val_perplexity', float('nan')):>8.1f} "
            f"{row.get('val_nsp_accuracy', float('nan')):>8.3f}")
    if baseline is not None:
        lines.append(f"unigram baseline (always the most frequent target): MLM acc {baseline:.3f}")
    return "\n".join(lines)


def format_guesses(options: list[tuple[str, float]]) -> str:
    """Return one [MASK]'s guesses as "token prob, token prob, ..." (as `fill_mask` gives them)."""
    return ", ".join(f"{token} {prob:.2f}" for token, prob in options)


def check_demo_folder(out: Path) -> None:
    """Raise a ValueError unless `out` is missing, empty or a previous demo's folder."""
    if check_output_folder(out, "--out", accept=("other",)) == "other":
        foreign = sorted(p.name for p in out.iterdir() if p.name not in DEMO_FILES)
        if foreign:
            shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            raise ValueError(f"--out {out} holds files the demo did not write ({shown}); choose "
                             f"a new folder or a previous demo's (nothing was written)")


def run_demo(out: str | Path, minutes: float | None = None, finetune_epochs: float = 3.0,
             threads: int | None = None) -> dict:
    """Return the results written to `out/results.json` after running the demo into `out`.

    `minutes` is the pretraining budget (default 4 on CPU, 3 on a GPU; the whole demo stays
    within about 10 minutes), `finetune_epochs` the [CLS] fine-tuning epochs on BBC topics,
    `threads` the torch CPU threads (default 1 on CPU). The caller checks `out` (see DEMO_FILES):
    a previous demo's run inside it is replaced.
    """
    import matplotlib.pyplot as plt  # lazy: slow to import, needed only to close the figure

    out = Path(out)
    start = time.perf_counter()
    device = resolve_device("auto")
    gpu = device.type == "cuda"
    preset, batch, default_minutes = ("small", 128, 3.0) if gpu else ("tiny", 32, 4.0)
    minutes = default_minutes if minutes is None else minutes
    if not gpu:
        torch.set_num_threads(1 if threads is None else threads)

    print("1/7 corpus: BBC News (embedded, nothing downloads)")
    docs = load_corpus("bbc")
    print(f"    {len(docs)} documents")
    print("2/7 tokenizer: WordPiece, 8192 tokens (cached after the first run)")
    tok = train_tokenizer(docs, vocab_size=8192)
    print("3/7 NSP examples + dynamic masking")
    train = pretraining_loader(docs, tok, split="train", batch_size=batch, seed=0,
                               pad_to_multiple_of=8 if gpu else None)
    # Shuffled in a fixed order (evaluate pins epoch 0), so the evaluated batches mix topics.
    val = pretraining_loader(docs, tok, split="validation", batch_size=batch, seed=0)
    print(f"    {len(train.dataset)} training pairs, {len(val.dataset)} validation pairs")
    config = BertConfig.preset(preset, vocab_size=tok.get_vocab_size())
    model = BertForPreTraining(config, generator=torch.Generator().manual_seed(0))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"4/7 model: {preset} ({config.num_layers} layers, hidden {config.hidden_size}, "
          f"{n_params / 1e6:.1f} M parameters) on {device}")
    before = [fill_mask(model, tok, text, top_k=3)[0] for text in EXAMPLES]

    run_dir = out / "run"
    if list_checkpoints(run_dir) or (run_dir / "history.json").exists():
        print(f"    replacing the previous demo run in {run_dir}")
        shutil.rmtree(run_dir)
    # Keep the whole demo <= 10 min: ~3 min after pretraining (fill-mask, fine-tuning, table).
    remaining = 10.0 - (time.perf_counter() - start) / 60 - 3.0
    minutes = min(minutes, max(0.5, remaining))
    print(f"5/7 pretraining for {minutes:.1f} min (MLM + NSP, AdamW, linear decay)")
    train_config = TrainConfig(max_steps=None, max_minutes=minutes, batch_size=batch,
                               lr=2e-3 if preset == "tiny" else 5e-4, eval_interval=50,
                               eval_batches=10, checkpoint_interval=None)
    result = pretrain(model, train, val, train_config, out_dir=run_dir)
    save_tokenizer(tok, run_dir / "tokenizer.json")
    after = [fill_mask(model, tok, text, top_k=3)[0] for text in EXAMPLES]
    baseline = unigram_baseline(train, val, max_batches=10)["mlm_accuracy"]

    print("6/7 pretraining results")
    print(history_table(result.history, baseline))
    print("\nfill-mask, top 3 guesses before -> after pretraining:")
    for text, b, a in zip(EXAMPLES, before, after, strict=True):
        print(f"  {text}")
        print(f"    before: {format_guesses(b)}")
        print(f"    after:  {format_guesses(a)}")

    print(f"\n7/7 downstream: BBC topics (5 classes) from the pooled [CLS] vector, "
          f"{finetune_epochs:g} fine-tuning epochs")
    downstream = compare_downstream(model, tok, "bbc-topic", config=FinetuneConfig(
        epochs=finetune_epochs, min_steps=1))
    print(f"    test split, {len(downstream[0].predictions)} documents")
    print(format_table(downstream))
    fig = plot_training_curves(result.history, baseline=baseline)
    fig.savefig(out / "curves.png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    results = {
        "preset": preset, "device": str(device), "history": result.history,
        "unigram_baseline": baseline,
        "downstream": [{k: v for k, v in r.to_dict().items() if k != "predictions"}
                       for r in downstream],
        "fill_mask": [{"text": t, "before": b, "after": a}
                      for t, b, a in zip(EXAMPLES, before, after, strict=True)]}
    atomic_write_json(out / "results.json", results)
    print(f"\nplots: {out / 'curves.png'}; history: {run_dir / 'history.csv'}; "
          f"model: {run_dir} (try: python -m bertlab fill-mask {run_dir} "
          f"\"the [MASK] rose sharply\")")
    print(f"demo finished in {(time.perf_counter() - start) / 60:.1f} min")
    return results
