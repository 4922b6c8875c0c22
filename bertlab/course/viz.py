"""Matplotlib figures used by the notebooks. Nothing here runs on import.

Each section belongs to one lesson; functions return the matplotlib Figure they draw.
matplotlib is imported on first use (`_pyplot`), not with this module: it is slow to import,
and `python -m bertlab` loads this module (for the demo) on every command.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from bertlab.config import lr_at
from bertlab.masking import BERT_MASKING, MaskingConfig


def _pyplot():
    import matplotlib.pyplot as plt  # lazy: see the module docstring

    return plt


# --- corpus and tokenizer (notebooks/01_corpus_and_tokenizer.ipynb) ---------------------------
def plot_corpus_overview(docs):
    """Return a figure with three panels: documents per label, sentences per document, words per sentence.

    `docs` is a list of `bertlab.corpus.Document`; documents without a label count as "(none)".

    Taught in notebooks/01_corpus_and_tokenizer.ipynb.
    """
    docs = list(docs)
    if not docs:
        raise ValueError("plot_corpus_overview: no documents; pass the list load_corpus returns")
    labels = Counter(d.label or "(none)" for d in docs)
    per_doc = [len(d.sentences) for d in docs]
    words = [len(s.split()) for d in docs for s in d.sentences]
    fig, axes = _pyplot().subplots(1, 3, figsize=(13, 3.4))
    names = sorted(labels)
    axes[0].bar(names, [labels[n] for n in names], color="#4c78a8")
    axes[0].set_title("documents per label")
    axes[0].tick_params(axis="x", rotation=30)
    for ax, values, what, unit, color in (
            (axes[1], per_doc, "sentences per document", "sentences", "#f58518"),
            (axes[2], words, "words per sentence", "words (split on spaces)", "#54a24b")):
        ax.hist(values, bins=range(0, min(max(values), 80) + 2), color=color)
        ax.set_title(f"{what} (median {sorted(values)[len(values) // 2]})")
        ax.set_xlabel(unit)
    fig.tight_layout()
    return fig


def plot_wordpiece_stats(tokenizer, sentences):
    """Return a figure: how many pieces each word is cut into, and token frequency by rank (log-log).

    `sentences` are encoded without special tokens; a "word" is what BERT's pre-tokenizer
    produces (split on spaces and punctuation).

    Taught in notebooks/01_corpus_and_tokenizer.ipynb.
    """
    encodings = tokenizer.encode_batch(list(sentences), add_special_tokens=False)
    pieces_per_word: Counter = Counter()
    token_counts: Counter = Counter()
    for enc in encodings:
        pieces_per_word.update(Counter(w for w in enc.word_ids if w is not None).values())
        token_counts.update(enc.ids)
    if not token_counts:
        raise ValueError("plot_wordpiece_stats: the sentences produced no tokens")
    fig, axes = _pyplot().subplots(1, 2, figsize=(11, 3.4))
    total = sum(pieces_per_word.values())
    shares = [pieces_per_word[k] / total for k in (1, 2, 3)]
    shares.append(sum(v for k, v in pieces_per_word.items() if k >= 4) / total)
    axes[0].bar(["1", "2", "3", "4+"], shares, color="#4c78a8")
    for x, share in enumerate(shares):
        axes[0].text(x, share, f"{share:.1%}", ha="center", va="bottom", fontsize=9)
    axes[0].set_ylim(0, 1.08)
    axes[0].set_title("pieces per word")
    axes[0].set_ylabel("share of words")
    counts = sorted(token_counts.values(), reverse=True)
    axes[1].loglog(range(1, len(counts) + 1), counts, color="#e45756")
    axes[1].set_title(f"token frequency by rank ({len(counts)} distinct tokens used)")
    axes[1].set_xlabel("rank")
    axes[1].set_ylabel("count")
    fig.tight_layout()
    return fig


# --- masked LM (notebooks/02_masked_lm.ipynb) ----------------------------------------------------
# One colour per masking decision, indexed by bertlab.masking.Decision (shared with widgets.py).
MASKING_COLORS = ("#e5e7eb", "#d62728", "#ff7f0e", "#2ca02c")
MASKING_NAMES = ("not a target", "target → [MASK]", "target → random", "target, kept")


def plot_mask_strip(tokens, masked_tokens, decisions, *, title: str | None = None,
                    per_line: int = 14):
    """Return a figure: one box per token, coloured by its masking decision.

    Each box shows what the model reads (the masked input); the line under it shows the label,
    the original token for a target and -100 elsewhere. `decisions` holds one
    `bertlab.masking.Decision` per token (`mask_tokens(..., return_decisions=True)`).

    Taught in notebooks/02_masked_lm.ipynb.
    """
    from matplotlib.patches import Patch, Rectangle  # lazy: see the module docstring

    decisions = [int(d) for d in decisions]
    if not len(tokens) == len(masked_tokens) == len(decisions):
        raise ValueError(f"plot_mask_strip: got {len(tokens)} tokens, {len(masked_tokens)} masked "
                         f"tokens and {len(decisions)} decisions; pass one of each per position")
    lines = max(1, -(-len(tokens) // per_line))
    fig, ax = _pyplot().subplots(figsize=(per_line * 0.95, 0.3 + 1.05 * lines))
    for i, (token, shown, decision) in enumerate(zip(tokens, masked_tokens, decisions,
                                                     strict=True)):
        x, y = i % per_line, -(i // per_line) * 1.05
        ax.add_patch(Rectangle((x + 0.03, y), 0.94, 0.5, color=MASKING_COLORS[decision]))
        dark = decision in (1, 3)  # white text on the strong colours
        ax.text(x + 0.5, y + 0.25, _clip(shown), ha="center", va="center", fontsize=9,
                color="white" if dark else "black", family="monospace")
        ax.text(x + 0.5, y - 0.17, _clip(token) if decision else "-100", ha="center", va="center",
                fontsize=8, color="black" if decision else "#9ca3af", family="monospace")
    ax.set_xlim(0, per_line)
    ax.set_ylim(-(lines - 1) * 1.05 - 0.4, 0.55)
    ax.axis("off")
    ax.legend(handles=[Patch(color=c, label=n) for c, n in zip(MASKING_COLORS, MASKING_NAMES,
                                                                 strict=True)],
              loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, fontsize=8, frameon=False)
    if title:
        ax.set_title(title, pad=22, fontsize=10)
    fig.tight_layout()
    return fig


def _clip(token: str, width: int = 9) -> str:
    return token if len(token) <= width else token[: width - 1] + "…"


def plot_masking_rates(decision_counts, masking: MaskingConfig = BERT_MASKING):
    """Return a bar chart of measured vs expected masking rates, with spread over samples.

    `decision_counts` is an (S, 4) array: per sample (e.g. one batch), how many candidate
    positions got each `Decision` (NOT_TARGET, MASK, RANDOM, KEEP). Bars show the mean over
    samples of the selected share (of candidates) and of each perturbation (of targets); error
    bars are ± one standard deviation across samples (how much one sample wanders), and the black
    arrows mark the values `masking` (BERT's by default) expects.

    Taught in notebooks/02_masked_lm.ipynb.
    """
    counts = np.asarray(decision_counts, dtype=float)
    if counts.ndim != 2 or counts.shape[1] != 4:
        raise ValueError(f"decision_counts has shape {counts.shape}; pass (samples, 4) counts of "
                         f"NOT_TARGET, MASK, RANDOM, KEEP")
    targets = counts[:, 1:].sum(axis=1)
    shares = np.column_stack([targets / counts.sum(axis=1),
                              counts[:, 1:] / np.maximum(targets, 1)[:, None]])  # (S, 4)
    expected = [masking.mlm_probability, masking.mask_replace_prob, masking.random_replace_prob,
                1 - masking.mask_replace_prob - masking.random_replace_prob]
    names = ["selected\n(of candidates)", "[MASK]\n(of targets)", "random\n(of targets)",
             "kept\n(of targets)"]
    colors = ["#6b7280", *MASKING_COLORS[1:]]
    fig, ax = _pyplot().subplots(figsize=(7, 3.2))
    x = np.arange(4)
    ax.bar(x, shares.mean(axis=0), yerr=shares.std(axis=0), color=colors, capsize=4,
           label=f"measured (mean ± sd over {len(shares)} samples)")
    ax.scatter(x + 0.3, expected, marker="<", s=60, color="black", label="expected", zorder=3)
    for xi, value in zip(x, shares.mean(axis=0), strict=True):
        ax.text(xi - 0.38, value + 0.03, f"{value:.3f}", fontsize=8)
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


# --- NSP data (notebooks/03_nsp_data.ipynb) ------------------------------------------------------
def plot_nsp_lengths(examples, max_seq_len: int = 128):
    """Return a figure: histograms of len(A), len(B) and the total, plus how often truncation cut.

    Taught in notebooks/03_nsp_data.ipynb.
    """
    a = [e.a_len for e in examples]
    b = [e.b_len for e in examples]
    total = [len(e.input_ids) for e in examples]
    cut = [e.tokens_dropped for e in examples if e.truncated]
    fig, axes = _pyplot().subplots(1, 4, figsize=(15, 3.2))
    for ax, values, title, color in ((axes[0], a, "len(A)", "tab:blue"),
                                     (axes[1], b, "len(B)", "tab:orange"),
                                     (axes[2], total, "[CLS] A [SEP] B [SEP]", "tab:green")):
        ax.hist(values, bins=range(0, max_seq_len + 2, 4), color=color)
        ax.set_title(title)
        ax.set_xlabel("tokens")
    axes[2].axvline(max_seq_len, color="black", linestyle="--", label=f"max_seq_len={max_seq_len}")
    axes[2].legend(loc="upper left", fontsize=8)
    axes[0].set_ylabel("examples")
    share = len(cut) / max(1, len(examples))
    axes[3].hist(cut, bins=40, color="tab:red")
    axes[3].set_yscale("log")
    axes[3].set_title(f"tokens cut ({share:.0%} of examples truncated)")
    axes[3].set_xlabel("tokens dropped per truncated example")
    fig.tight_layout()
    return fig


def plot_nsp_balance(label_shares: dict[str, float]):
    """Return a bar chart of the NotNext share per setting (e.g. {"exact": 0.50, "google": 0.56}).

    Taught in notebooks/03_nsp_data.ipynb.
    """
    names = list(label_shares)
    not_next = [label_shares[n] for n in names]
    fig, ax = _pyplot().subplots(figsize=(5, 3))
    ax.bar(names, [1 - s for s in not_next], color="tab:blue", label="IsNext (label 0)")
    ax.bar(names, not_next, bottom=[1 - s for s in not_next], color="tab:orange",
           label="NotNext (label 1)")
    ax.axhline(0.5, color="black", linestyle="--", linewidth=1)
    for i, s in enumerate(not_next):
        ax.text(i, 1 - s / 2, f"{s:.3f}", ha="center", va="center", color="white")
    ax.set_ylabel("share of examples")
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("label balance")
    fig.tight_layout()
    return fig


# --- pretraining (notebooks/05_pretraining.ipynb) ------------------------------------------------
def plot_lr_schedule(config, steps: int | None = None):
    """Return a Figure of the learning rate over the optimizer steps of `config` (a TrainConfig).

    Taught in notebooks/05_pretraining.ipynb
    """
    steps = steps or config.max_steps
    if not steps:
        raise ValueError("plot_lr_schedule needs a step count: set config.max_steps or pass steps")
    xs = list(range(steps))
    fig, ax = _pyplot().subplots(figsize=(6, 2.8))
    ax.plot(xs, [lr_at(s, config) for s in xs])
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.set_title(f"warmup, then {config.schedule} decay")
    fig.tight_layout()
    return fig


def plot_training_curves(history: list[dict], baseline: float | None = None):
    """Return a Figure with three panels over training steps: losses, MLM accuracy, NSP accuracy.

    `history` is `TrainResult.history`. The accuracy panel shows the accuracy at [MASK] positions
    and over all targets (with the copied kept ones), and the no-context bar dashed: `baseline`,
    else the history's `val_mask_unigram_accuracy` (the most frequent [MASK] target).

    Taught in notebooks/05_pretraining.ipynb
    """
    steps = [row["step"] for row in history]
    fig, axes = _pyplot().subplots(1, 3, figsize=(12, 3.2))

    def curve(ax, key: str, label: str) -> None:
        ax.plot(steps, [row.get(key) for row in history], marker=".", label=label)

    train = [(row["step"], row["train_loss"]) for row in history if row.get("train_loss") is not None]
    if train:
        axes[0].plot(*zip(*train, strict=True), marker=".", label="train loss")
    curve(axes[0], "val_mlm_loss", "val MLM loss")
    pair = next((p for p in ("nsp", "sop") if any(f"val_{p}_accuracy" in r for r in history)),
                None)  # the pair head's task, if one was trained
    if pair:
        curve(axes[0], f"val_{pair}_loss", f"val {pair.upper()} loss")
    axes[0].set_title("loss")
    curve(axes[1], "val_mask_accuracy", "at [MASK] positions")
    curve(axes[1], "val_mlm_accuracy", "all targets (incl. kept)")
    baseline = (history or [{}])[-1].get("val_mask_unigram_accuracy") if baseline is None else baseline
    if baseline is not None:
        axes[1].axhline(baseline, linestyle="--", color="gray", label="no context (unigram)")
    axes[1].set_title("masked-token accuracy")
    if pair:
        curve(axes[2], f"val_{pair}_accuracy", f"val {pair.upper()} accuracy")
        axes[2].axhline(0.5, linestyle="--", color="gray", label="chance")
    else:  # no pair objective: the head was never trained, so there is nothing to plot
        axes[2].text(0.5, 0.5, "NSP not trained\n(no pair objective)", ha="center",
                     va="center", transform=axes[2].transAxes, color="gray")
    axes[2].set_title("next-sentence accuracy")
    for ax in axes:
        ax.set_xlabel("optimizer step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --- [CLS] and downstream (notebooks/06_cls_and_downstream.ipynb) --------------------------------
def plot_cls_gradient_path():
    """Return a diagram of where [CLS] sits and which losses send gradient into its vector.

    Forward arrows are grey; gradient paths are red. The NSP loss reaches the last-layer [CLS]
    vector directly (through the NSP head and the pooler); the MLM loss reads only masked
    positions, so it reaches [CLS] only indirectly, through attention in the layers below.

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # lazy: module docstring

    fig, ax = _pyplot().subplots(figsize=(11, 5.2))
    ax.set_xlim(0, 12.0)
    ax.set_ylim(0, 6.4)
    ax.axis("off")
    tokens = ["[CLS]", "the", "[MASK]", "rose", "[SEP]", "shares", "fell", "[SEP]"]
    xs = [1.9 + 1.25 * i for i in range(len(tokens))]

    def box(x, y, w, h, text, color, size=10):
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.05",
                                    fc=color, ec="#333333", lw=1))
        ax.text(x, y, text, ha="center", va="center", fontsize=size)

    def arrow(a, b, color="#999999", style="-|>", ls="-", rad=0.0, lw=1.2):
        ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, color=color, lw=lw, linestyle=ls,
                                     mutation_scale=12, connectionstyle=f"arc3,rad={rad}"))

    for i, (x, t) in enumerate(zip(xs, tokens, strict=True)):
        box(x, 0.5, 1.05, 0.5, t, "#fde2c4" if i == 0 else "#e8e8e8", 9)
        arrow((x, 0.78), (x, 1.35))
    box((xs[0] + xs[-1]) / 2, 1.95, xs[-1] - xs[0] + 1.2, 1.1, "encoder: every position attends to every other (L layers)",
        "#dbe8f5")
    for i, x in enumerate(xs):
        arrow((x, 2.55), (x, 3.05))
        box(x, 3.3, 1.05, 0.45, "h[CLS]" if i == 0 else f"h{i}", "#fde2c4" if i == 0 else "#f4f4f4", 9)
    # [CLS] -> pooler -> NSP head -> NSP loss; the masked position -> MLM head -> MLM loss
    c = xs[0]
    for x, y, w, text, color in ((c, 4.35, 1.5, "pooler: tanh(W h)", "#fff3b0"),
                                 (c, 5.2, 1.5, "NSP head (2-way)", "#fff3b0"),
                                 (c, 6.0, 2.1, "NSP loss: IsNext / NotNext", "#f8c4c4"),
                                 (xs[2], 4.35, 1.6, "MLM head (tied)", "#d7f0d0"),
                                 (xs[2], 5.2, 2.2, "MLM loss: predict 'stock'", "#f8c4c4")):
        box(x, y, w, 0.5, text, color, 9)
    for x, y0, y1 in ((c, 3.55, 4.08), (c, 4.62, 4.93), (c, 5.47, 5.73), (xs[2], 3.55, 4.08),
                      (xs[2], 4.62, 4.93)):
        arrow((x, y0), (x, y1))
    # gradients
    red = "#c0392b"
    arrow((c - 0.9, 5.75), (c - 0.56, 3.35), color=red, ls="--", lw=2, rad=0.25)
    ax.text(c - 1.05, 4.7, "direct\ngradient", color=red, fontsize=9, ha="right", va="center")
    arrow((xs[2] + 1.15, 5.0), (xs[2] + 0.55, 3.55), color=red, ls="--", lw=2)
    arrow((xs[2] - 0.2, 3.05), (xs[0] + 0.3, 2.2), color=red, ls=":", lw=2, rad=-0.2)
    ax.text(xs[3] + 0.2, 4.45, "MLM reaches [CLS] only through\nattention in lower layers",
            color=red, fontsize=9, va="center")
    ax.text(xs[-1], 6.0, "fine-tuning: a new head on the\npooled [CLS], all weights trained",
            fontsize=9, ha="right", va="center", style="italic")
    ax.set_title("Where [CLS] sits, and which losses train it", fontsize=12)
    fig.tight_layout()
    return fig


def plot_cls_pca(features: dict, labels, label_names=None):
    """Return one scatter per stage: the 2-D PCA of [CLS] vectors, coloured by label.

    `features` maps a stage name ("random init", "MLM + NSP", ...) to an (N, d) array of
    vectors (`bertlab.finetune.cls_features`); `labels` holds the N labels.

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    labels = list(labels)
    names = sorted(set(labels)) if label_names is None else list(label_names)
    colors = _pyplot().get_cmap("tab10")
    fig, axes = _pyplot().subplots(1, len(features), figsize=(4.2 * len(features), 3.9), squeeze=False)
    for ax, (stage, x) in zip(axes[0], features.items(), strict=True):
        if len(x) != len(labels):
            raise ValueError(f"plot_cls_pca: stage {stage!r} has {len(x)} vectors for "
                             f"{len(labels)} labels")
        x = np.asarray(x, dtype=np.float64)
        x = x - x.mean(0)
        _, _, vt = np.linalg.svd(x, full_matrices=False)  # rows of vt: principal directions
        xy = x @ vt[:2].T  # (N, d) -> (N, 2)
        for i, name in enumerate(names):
            keep = np.array([y == name for y in labels])
            ax.scatter(xy[keep, 0], xy[keep, 1], s=8, alpha=0.6, color=colors(i), label=name)
        ax.set_title(stage)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0][-1].legend(loc="best", fontsize=8, markerscale=2)
    fig.suptitle("[CLS] vectors, first two principal components, coloured by topic")
    fig.tight_layout()
    return fig


def plot_confusion(confusion, label_names, title: str = "confusion matrix"):
    """Return a heatmap of a confusion matrix (rows: true class, columns: predicted), with counts.

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    m = np.asarray(confusion)
    fig, ax = _pyplot().subplots(figsize=(5.2, 4.4))
    ax.imshow(m, cmap="Blues")
    ax.set_xticks(range(len(label_names)), label_names, rotation=35, ha="right")
    ax.set_yticks(range(len(label_names)), label_names)
    for i in range(m.shape[0]):
        for j in range(m.shape[1]):
            ax.text(j, i, int(m[i, j]), ha="center", va="center",
                    color="white" if m[i, j] > m.max() / 2 else "black")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def plot_low_label_curves(rows, num_classes: int):
    """Return accuracy against labelled documents per class, one line per method, ± std bars.

    `rows` are `bertlab.finetune.summarize` rows; a run on the whole train split (k_per_class
    None) is placed at its average number of documents per class, num_train / num_classes.

    Taught in notebooks/06_cls_and_downstream.ipynb
    """
    fig, ax = _pyplot().subplots(figsize=(6.4, 4))
    for method in dict.fromkeys(r["method"] for r in rows):
        points = sorted(
            (r["k_per_class"] or r["num_train"] / num_classes, 100 * r["accuracy_mean"],
             100 * r["accuracy_std"]) for r in rows if r["method"] == method)
        xs, ys, errors = zip(*points, strict=True)
        ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=method)
    ax.set_xscale("log")
    ax.set_xlabel("labelled documents per class (log scale)")
    ax.set_ylabel("test accuracy (%)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# --- ablations (notebooks/07_ablations_and_insights.ipynb) ---------------------------------------
def plot_ablation_vs_paper(rows, group: str, metrics, paper: dict, paper_metrics,
                           baseline: str, z: float = 2.0):
    """Return a two-panel figure: each variant's change from `baseline`, ours (left) and the paper's.

    `rows` are `bertlab.course.ablations.summarize_records` rows; our bars are mean differences in
    points with error bars of z standard errors of the difference (seed noise), so a bar whose
    error bar crosses zero is within the noise. `paper` maps variant name -> {metric: value}.

    Taught in notebooks/07_ablations_and_insights.ipynb
    """
    mine = {r["name"]: r for r in rows if r["group"] == group}
    names = [n for n in paper if n in mine and n != baseline]
    fig, (ax_ours, ax_paper) = _pyplot().subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(names))
    base = mine[baseline]

    def bars(ax, k: int, count: int, values: list[float], **kwargs) -> None:
        width = 0.8 / count  # the k-th of `count` bars side by side at each variant
        ax.bar(x + (k - (count - 1) / 2) * width, values, width, **kwargs)

    for k, metric in enumerate(metrics):
        diffs = [100 * (mine[n][f"{metric}_mean"] - base[f"{metric}_mean"]) for n in names]
        errors = [100 * z * math.sqrt(mine[n][f"{metric}_std"] ** 2 / len(mine[n]["seeds"])
                                      + base[f"{metric}_std"] ** 2 / len(base["seeds"]))
                  for n in names]  # z standard errors of the difference
        bars(ax_ours, k, len(metrics), diffs, yerr=errors, capsize=3, label=metric)
    for k, metric in enumerate(paper_metrics):
        bars(ax_paper, k, len(paper_metrics),
             [paper[n][metric] - paper[baseline][metric] for n in names], label=metric)
    for ax, title in ((ax_ours, f"ours (±{z:g} standard errors over seeds)"),
                      (ax_paper, "paper (dev sets, one run each)")):
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(x, names)
        ax.set_ylabel(f"change from {baseline} (points)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{group}: each variant minus {baseline}")
    fig.tight_layout()
    return fig


def plot_ablation_curves(records, groups, baseline: float | None = None,
                         metric: str = "mask_accuracy"):
    """Return one panel per group: a held-out accuracy against step, one line per variant.

    `records` are `bertlab.course.ablations` cell records whose metrics hold a `curve` (step, `metric`:
    "mask_accuracy" at [MASK] targets or "mlm_accuracy" at all); a line is the mean over seeds,
    the seeds' range shaded. `baseline` (the unigram guess) is dashed: while the curves sit on
    it, the models predict frequent words, not words in context.

    Taught in notebooks/07_ablations_and_insights.ipynb
    """
    groups = list(groups)
    fig, axes = _pyplot().subplots(1, len(groups), figsize=(4.2 * len(groups), 3.6), squeeze=False)
    for ax, group in zip(axes[0], groups, strict=True):
        curves: dict[str, list] = {}
        for r in records:
            if r["cell"]["group"] == group and r["metrics"].get("curve"):
                curves.setdefault(r["cell"]["name"], []).append(r["metrics"]["curve"])
        if not curves:
            raise ValueError(f"plot_ablation_curves: no record of group {group!r} has a learning "
                             f"curve; run the sweep with a bertlab that records one")
        for name, runs in curves.items():
            steps = [p["step"] for p in runs[0]]
            acc = 100 * np.array([[p[metric] for p in run] for run in runs])
            line, = ax.plot(steps, acc.mean(0), marker=".", label=f"{name} (n={len(runs)})")
            if len(runs) > 1:
                ax.fill_between(steps, acc.min(0), acc.max(0), color=line.get_color(), alpha=0.15)
        if baseline is not None:
            ax.axhline(100 * baseline, color="grey", linestyle="--", linewidth=1,
                       label="unigram guess")
        ax.set_title(group, fontsize=10)
        ax.set(xlabel="step", ylabel=f"held-out {metric} (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
