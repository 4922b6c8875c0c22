"""Time to quality on CPU: bertlab vs transformers' BertForPreTraining, same data, same budget.

Both models have the same size (a BERT preset), see the same batches in the same order (the same
bertlab loader), use the same AdamW settings, gradient clipping and time-based linear schedule,
and get the same wall-clock budget each. bertlab trains with `bertlab.pretrain`; transformers'
model is driven by a plain loop built from the same pieces (`build_optimizer`, `lr_at`). Both
are evaluated on the same held-out batches: MLM accuracy over the masked targets and NSP
accuracy. The difference is the model's step cost: bertlab runs the MLM head only on the ~15%
masked positions; transformers computes full-vocabulary logits at every position.

Usage: python benchmarks/time_to_quality.py [--minutes 3] [--preset tiny]
Prints both curves, the final numbers, median step times and their ratio; writes JSON to
benchmarks/results/time_to_quality.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import bertlab as bl
from bertlab.data import pretraining_loader
from bertlab.model import IGNORE_INDEX, BertConfig, BertForPreTraining
from bertlab.pretraining import pretrain
from bertlab.train import TrainConfig, build_optimizer, lr_at


def hf_model(config: BertConfig):
    """Return transformers' BertForPreTraining with the same sizes and numerics as `config`."""
    import transformers

    hf_config = transformers.BertConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size, hidden_dropout_prob=config.hidden_dropout,
        attention_probs_dropout_prob=config.attention_dropout,
        layer_norm_eps=config.layer_norm_eps, initializer_range=config.initializer_range,
        hidden_act="gelu", pad_token_id=config.pad_token_id)
    hf_config._attn_implementation = "sdpa"  # fused attention, as bertlab uses
    return transformers.BertForPreTraining(hf_config)


@torch.no_grad()
def hf_evaluate(model, loader, max_batches: int) -> dict[str, float]:
    """Return MLM accuracy over targets and NSP accuracy of a transformers model (eval mode)."""
    loader.set_epoch(0)
    model.eval()
    correct = targets = nsp_correct = sequences = 0
    loss_sum = 0.0
    for i, batch in enumerate(loader):
        if i >= max_batches:
            break
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"])
        where = batch["labels"] != IGNORE_INDEX
        logits = out.prediction_logits[where]  # (B, T, V) -> (targets, V)
        labels = batch["labels"][where]
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += int((logits.argmax(-1) == labels).sum())
        targets += labels.numel()
        nsp_correct += int((out.seq_relationship_logits.argmax(-1)
                            == batch["next_sentence_label"]).sum())
        sequences += batch["next_sentence_label"].numel()
    model.train()
    return {"mlm_loss": loss_sum / targets, "mlm_accuracy": correct / targets,
            "nsp_accuracy": nsp_correct / sequences}


def hf_pretrain(model, train, val, config: TrainConfig) -> list[dict]:
    """Return the evaluation history of a plain training loop for a transformers model."""
    optimizer = build_optimizer(model, config, torch.device("cpu"))
    history = []
    step, epoch, start = 0, 0, time.perf_counter()

    def log(elapsed: float) -> None:
        history.append({"step": step, "elapsed_s": round(elapsed, 1),
                        **{f"val_{k}": v for k, v in hf_evaluate(model, val,
                                                                 config.eval_batches).items()}})

    log(0.0)
    model.train()
    while True:
        train.set_epoch(epoch)
        for batch in train:
            elapsed = time.perf_counter() - start
            if elapsed >= 60 * config.max_minutes:
                log(elapsed)
                return history
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, config, elapsed)
            out = model(**batch)  # the loss of transformers: mean MLM CE + mean NSP CE
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % config.eval_interval == 0:
                log(time.perf_counter() - start)
        epoch += 1


def table(name: str, history: list[dict]) -> str:
    lines = [f"{name}", f"{'step':>6} {'elapsed s':>9} {'MLM loss':>9} {'MLM acc':>8} "
                        f"{'NSP acc':>8}"]
    lines += [f"{r['step']:>6} {r['elapsed_s']:>9.1f} {r['val_mlm_loss']:>9.3f} "
              f"{r['val_mlm_accuracy']:>8.3f} {r['val_nsp_accuracy']:>8.3f}" for r in history]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="budget per model")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-len", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--lr", type=float, default=2e-3)  # the demo's tiny-model rate
    parser.add_argument("--eval-interval", type=int, default=50)
    parser.add_argument("--eval-batches", type=int, default=20)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"
                                             / "time_to_quality.json"))
    args = parser.parse_args()

    docs = bl.load_corpus("bbc")
    tok = bl.train_tokenizer(docs, vocab_size=args.vocab_size)

    def loaders():
        train = pretraining_loader(docs, tok, split="train", batch_size=args.batch_size,
                                   max_seq_len=args.max_seq_len, seed=0)
        val = pretraining_loader(docs, tok, split="validation", batch_size=args.batch_size,
                                 max_seq_len=args.max_seq_len, seed=0)
        return train, val

    config = TrainConfig(max_steps=None, max_minutes=args.minutes, batch_size=args.batch_size,
                         lr=args.lr, eval_interval=args.eval_interval,
                         eval_batches=args.eval_batches, checkpoint_interval=None,
                         progress=False, log_interval=0, device="cpu")
    model_config = BertConfig.preset(args.preset, vocab_size=tok.get_vocab_size())
    print(f"preset {args.preset}, vocab {tok.get_vocab_size()}, batch {args.batch_size} x "
          f"{args.max_seq_len}, {args.minutes} min each on {torch.get_num_threads()} CPU "
          f"thread(s), torch {torch.__version__}")

    train, val = loaders()
    ours = BertForPreTraining(model_config, generator=torch.Generator().manual_seed(0))
    result = pretrain(ours, train, val, config)
    ours_history = [{k: r[k] for k in ("step", "elapsed_s", "val_mlm_loss", "val_mlm_accuracy",
                                       "val_nsp_accuracy")} for r in result.history]
    torch.manual_seed(0)
    train, val = loaders()
    theirs = hf_model(model_config)
    theirs_history = hf_pretrain(theirs, train, val, config)

    # Step times side by side: the same 20 batches, the two models alternating batch by batch.
    train, _ = loaders()
    times: dict[str, list[float]] = {"bertlab": [], "transformers": []}
    optimizers = {"bertlab": build_optimizer(ours, config, torch.device("cpu")),
                  "transformers": build_optimizer(theirs, config, torch.device("cpu"))}
    for i, batch in enumerate(train):
        if i >= 20:
            break
        for name, model in (("bertlab", ours), ("transformers", theirs)):
            t0 = time.perf_counter()
            model(**batch).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            times[name].append(time.perf_counter() - t0)

    print(table("bertlab (bertlab.pretrain)", ours_history))
    print(table("transformers BertForPreTraining (plain loop)", theirs_history))
    a, b = ours_history[-1], theirs_history[-1]
    med_ours, med_theirs = statistics.median(times["bertlab"]), statistics.median(times["transformers"])
    print(f"\nafter {args.minutes} min each: MLM accuracy bertlab {a['val_mlm_accuracy']:.3f} vs "
          f"transformers {b['val_mlm_accuracy']:.3f} "
          f"({100 * (a['val_mlm_accuracy'] - b['val_mlm_accuracy']):+.1f} points); "
          f"NSP accuracy {a['val_nsp_accuracy']:.3f} vs {b['val_nsp_accuracy']:.3f}")
    print(f"steps: bertlab {a['step']} vs transformers {b['step']}; median step time "
          f"{1000 * med_ours:.0f} ms vs {1000 * med_theirs:.0f} ms (transformers / bertlab = "
          f"{med_theirs / med_ours:.2f}x)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "settings": vars(args), "machine": platform.platform(), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "bertlab": ours_history, "transformers": theirs_history,
        "median_step_s": {"bertlab": med_ours, "transformers": med_theirs},
        "mlm_accuracy_gap_points": 100 * (a["val_mlm_accuracy"] - b["val_mlm_accuracy"]),
    }, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
