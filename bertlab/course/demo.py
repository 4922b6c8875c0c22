"""`python -m bertlab demo`: the whole pipeline on BBC news in a few minutes, told step by step.

Corpus -> tokenizer -> NSP data -> pretrain with the course recipe (tiny on CPU, small on a GPU)
-> fill-mask before and after, the cloze set -> [CLS] fine-tuning on BBC topics against TF-IDF
and from scratch, with all labels and with few. It prints each stage,
then writes `run/` (the pretraining run), `curves.png` and `results.json` into its folder.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import torch

from bertlab.artefacts import LOCK_NAME
from bertlab.atomic import atomic_write_json
from bertlab.config import cpu_threads
from bertlab.course.cloze import cloze_score
from bertlab.course.doctor import load_note
from bertlab.course.viz import plot_training_curves
from bertlab.data import LoaderOptions, pretraining_loader
from bertlab.downstream import compare_downstream
from bertlab.engine.device import resolve_device
from bertlab.engine.outputs import check_output
from bertlab.finetune import FinetuneConfig, format_table
from bertlab.loading import list_checkpoints
from bertlab.model import BertForPreTraining
from bertlab.pretraining import fill_mask, pretrain
from bertlab.readers import load_corpus
from bertlab.recipes import DEMO_STEPS, VAL_SEQ_LEN, Recipe, recipe
from bertlab.tokenizer import save_tokenizer, train_tokenizer
from bertlab.train import TrainResult

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
    evaluation, led by the accuracy at [MASK] positions (can it fill a blank from context?).

    Then the bar a model without context reaches on the same [MASK] targets: always the most
    frequent one (`baseline`, else the history's `val_mask_unigram_accuracy`, with how many
    targets it counts), and their unigram entropy as a loss. A run without a pair objective has
    no NSP column, and says so: an untrained head's accuracy is not a result. "all targets" also counts the 10% kept targets, which can
    be copied from the input, as BERT's own evaluation does.
    """
    # The pair head's column, named by its task; none for an untrained head.
    pair = next((p for p in ("nsp", "sop") if any(f"val_{p}_accuracy" in r for r in history)),
                None)
    lines = [f"{'step':>6} {'tokens':>10} {'train loss':>10} {'[MASK] acc':>10} "
             f"{'[MASK] loss':>11} {'all targets':>11}"
             + (f" {pair.upper() + ' acc':>8}" if pair else "")]
    nan = float("nan")
    for row in history:
        train_loss = row.get("train_loss")
        lines.append(
            f"{row['step']:>6} {row['tokens']:>10} "
            f"{'-' if train_loss is None else f'{train_loss:.3f}':>10} "
            f"{row.get('val_mask_accuracy', nan):>10.3f} {row.get('val_mask_loss', nan):>11.3f} "
            f"{row.get('val_mlm_accuracy', nan):>11.3f}"
            + (f" {row.get(f'val_{pair}_accuracy', nan):>8.3f}" if pair else ""))
    last = history[-1] if history else {}
    bar = last.get("val_mask_unigram_accuracy") if baseline is None else baseline
    if bar is not None:
        entropy, n = last.get("val_mask_unigram_loss"), last.get("val_mask_targets")
        lines.append("no context (always the most frequent [MASK] target"
                     + ("" if n is None or baseline is not None else f", on these {n:,} targets")
                     + f"): [MASK] acc {bar:.3f}"
                     + ("" if entropy is None else f", loss {entropy:.3f} (unigram entropy)"))
    if history and not pair:
        lines.append("NSP: not trained (no pair objective in this run, so no NSP figure)")
    return "\n".join(lines)


def format_guesses(options: list[tuple[str, float]]) -> str:
    """Return one [MASK]'s guesses as "token prob, token prob, ..." (as `fill_mask` gives them)."""
    return ", ".join(f"{token} {prob:.2f}" for token, prob in options)


def check_demo_folder(out: Path) -> None:
    """Raise a ValueError unless `out` is missing, empty or a previous demo's folder."""
    if check_output(out, "--out", folder=True, accept=("other",)) == "other":
        foreign = sorted(p.name for p in out.iterdir() if p.name not in DEMO_FILES)
        if foreign:
            shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            raise ValueError(f"--out {out} holds files the demo did not write ({shown}); choose "
                             f"a new folder or a previous demo's (nothing was written)")


def _demo_data(course: Recipe) -> tuple[Any, Any, Any]:
    """Stages 1-3: return (tokenizer, train loader, validation loader) of BBC News."""
    print("1/7 corpus: BBC News (embedded, nothing downloads)")
    docs = load_corpus("bbc")
    print(f"    {len(docs)} documents")
    print("2/7 tokenizer: WordPiece, 8192 tokens (cached after the first run)")
    tok = train_tokenizer(docs, vocab_size=8192)
    print(f"3/7 NSP examples + dynamic masking ({course.mlm_probability:.0%} of the training "
          f"tokens; validation masked BERT's way, 15%)")
    train = pretraining_loader(docs, tok, split="train", seed=0, options=course.loader_options())
    # BERT's masking (the defaults), shuffled in a fixed order: one yardstick for every recipe.
    val = pretraining_loader(docs, tok, split="validation", seed=0,
                             options=LoaderOptions(batch_size=32, max_seq_len=VAL_SEQ_LEN))
    print(f"    {len(train.dataset)} training pairs, {len(val.dataset)} validation pairs")
    return tok, train, val


def _demo_model(course: Recipe, preset: str, tok: Any, device: torch.device) -> BertForPreTraining:
    """Stage 4: return the untrained model (seed 0), after saying its size."""
    config = course.model_config(preset, tok.get_vocab_size())
    model = BertForPreTraining(config, generator=torch.Generator().manual_seed(0))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"4/7 model: {preset} ({config.num_layers} layers, hidden {config.hidden_size}, "
          f"{n_params / 1e6:.1f} M parameters) on {device}")
    return model


def _demo_pretrain(course: Recipe, model: BertForPreTraining, tok: Any, train: Any, val: Any,
                   run_dir: Path, steps: int) -> TrainResult:
    """Stage 5: pretrain `model` for `steps` into `run_dir` (replacing a previous demo's run)."""
    if list_checkpoints(run_dir) or (run_dir / "history.json").exists():
        print(f"    replacing the previous demo run in {run_dir}")
        shutil.rmtree(run_dir)
    print(f"5/7 pretraining, {steps} steps, the course recipe: {course.summary}")
    train_config = course.train_config(max_steps=steps, eval_interval=max(1, steps // 10),
                                       eval_batches=20, checkpoint_interval=None)
    result = pretrain(model, train, val, train_config, out_dir=run_dir, objectives=course.objectives)
    save_tokenizer(tok, run_dir / "tokenizer.json")
    return result


def _show_pretraining(result: TrainResult, cloze: dict, before: list, after: list) -> None:
    """Stage 6: print the history table, the cloze score and the fill-mask guesses."""
    print("6/7 pretraining results (validation pairs; accuracy at [MASK] positions first)")
    print(history_table(result.history))
    print(f"cloze set ({cloze['items']} sentences of our own, one blank each): top-1 "
          f"{cloze['top1']:.0%}, top-5 {cloze['top5']:.0%}")
    print("\nfill-mask, top 3 guesses before -> after pretraining:")
    for text, b, a in zip(EXAMPLES, before, after, strict=True):
        print(f"  {text}")
        print(f"    before: {format_guesses(b)}")
        print(f"    after:  {format_guesses(a)}")


def _demo_downstream(model: BertForPreTraining, tok: Any, finetune_epochs: float,
                     max_seq_len: int) -> list:
    """Stage 7: return compare_downstream's results on BBC topics, all labels and few; print them.

    Every method reads the first `max_seq_len` tokens of each story: the length the demo
    pretrained at, since the positions past it never had a gradient.
    """
    print(f"\n7/7 downstream: BBC topics (5 classes) from the pooled [CLS] vector, "
          f"{finetune_epochs:g} fine-tuning epochs, first {max_seq_len} tokens of each story; "
          f"all labels (1 run) and 8 or 32 labelled documents per class (3 runs each)")
    downstream = compare_downstream(model, tok, "bbc-topic", config=FinetuneConfig(
        epochs=finetune_epochs, min_steps=1, max_seq_len=max_seq_len))
    # Few labels: at least FinetuneConfig's min_steps updates, or 40 documents give 4 steps.
    downstream += compare_downstream(model, tok, "bbc-topic", config=FinetuneConfig(
        epochs=finetune_epochs, max_seq_len=max_seq_len), k_per_class=(8, 32), seeds=(0, 1, 2))
    print(f"    test split, {len(downstream[0].predictions)} documents")
    print(format_table(downstream))
    return downstream


def run_demo(out: str | Path, steps: int | None = None, finetune_epochs: float = 3.0,
             threads: int | None = None) -> dict:
    """Return the results written to `out/results.json` after running the demo into `out`.

    Pretrains with the course recipe (`bertlab.recipes`) for `steps` optimizer steps (default
    `DEMO_STEPS`: about 4 minutes on a 2-core CPU, so the whole demo stays within about 10; a
    step budget, not a time budget, gives the same model on every run of one machine), then fine-tunes
    its [CLS] for `finetune_epochs` on BBC topics with all labels and with 8 and 32 per class
    (3 seeds). `threads`: torch CPU threads (default on a CPU: `cpu_threads` of the preset).
    The caller checks `out` (see DEMO_FILES): a previous demo's run inside it is replaced.
    """
    import matplotlib.pyplot as plt  # lazy: slow to import, needed only to close the figure

    out = Path(out)
    start = time.perf_counter()
    device = resolve_device("auto")
    preset = "small" if device.type == "cuda" else "tiny"
    steps = DEMO_STEPS if steps is None else steps
    if threads is None and device.type == "cpu":
        threads = cpu_threads(preset)  # a fixed count, so a busy machine does not stall it
    if threads is not None:
        torch.set_num_threads(threads)
    course = recipe("course")

    tok, train, val = _demo_data(course)
    model = _demo_model(course, preset, tok, device)
    before = [fill_mask(model, tok, text, top_k=3)[0] for text in EXAMPLES]
    run_dir = out / "run"
    result = _demo_pretrain(course, model, tok, train, val, run_dir, steps)
    after = [fill_mask(model, tok, text, top_k=3)[0] for text in EXAMPLES]
    cloze = cloze_score(model, tok)
    _show_pretraining(result, cloze, before, after)
    downstream = _demo_downstream(model, tok, finetune_epochs,
                                  train.max_seq_len or course.max_seq_len)

    fig = plot_training_curves(result.history)
    fig.savefig(out / "curves.png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    results = {
        "preset": preset, "device": str(device), "recipe": course.to_dict(),
        "history": result.history,
        "cloze": {k: v for k, v in cloze.items() if k != "guesses"},
        "downstream": [{k: v for k, v in r.to_dict().items() if k != "predictions"}
                       for r in downstream],
        "fill_mask": [{"text": t, "before": b, "after": a}
                      for t, b, a in zip(EXAMPLES, before, after, strict=True)]}
    atomic_write_json(out / "results.json", results)
    print(f"\nplots: {out / 'curves.png'}; history: {run_dir / 'history.csv'}; "
          f"model: {run_dir} (try: python -m bertlab fill-mask {run_dir} "
          f"\"the [MASK] rose sharply\")")
    print(f"demo finished in {(time.perf_counter() - start) / 60:.1f} min ({load_note()})")
    return results
