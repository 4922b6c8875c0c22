"""How big a BERT is: parameter counts per part, training FLOPs per token, the presets' table.

Counts come from a config alone (no weights are built), so BERT-base can be sized on any
laptop; for a built model, `count_parameters` counts its actual parameters.

Taught in notebooks/04_encoder.ipynb
"""

from __future__ import annotations

from torch import nn

from bertlab.model import PRESETS, BertConfig


def _count_from_config(config: BertConfig) -> dict[str, int]:
    d, ff, V = config.hidden_size, config.intermediate_size, config.vocab_size
    embeddings = (V + config.max_position_embeddings + config.type_vocab_size) * d + 2 * d
    per_layer = (
        3 * (d * d + d)  # query, key, value
        + (d * d + d) + 2 * d  # attention output projection + LayerNorm
        + (d * ff + ff) + (ff * d + d) + 2 * d  # feed-forward + LayerNorm
    )
    heads = (
        (d * d + d)  # pooler
        + (d * d + d) + 2 * d + V  # MLM transform, LayerNorm, output bias (decoder is tied)
        + (2 * d + 2)  # NSP
    )
    return {"embeddings": embeddings, "encoder": config.num_layers * per_layer, "heads": heads}


def count_parameters(model_or_config: nn.Module | BertConfig) -> dict[str, int]:
    """Return parameter counts split into embeddings / encoder / heads, plus the total.

    For a config the counts are those of `BertForPreTraining(config)`. "heads" holds the pooler
    and every head; the tied MLM decoder is counted once, with the word embeddings.

    Taught in notebooks/04_encoder.ipynb
    """
    if isinstance(model_or_config, BertConfig):
        counts = _count_from_config(model_or_config)
    else:
        counts = {"embeddings": 0, "encoder": 0, "heads": 0}
        for name, p in model_or_config.named_parameters():  # tied parameters are listed once
            if "embeddings." in name:
                counts["embeddings"] += p.numel()
            elif "layers." in name:
                counts["encoder"] += p.numel()
            else:
                counts["heads"] += p.numel()
    counts["total"] = sum(counts.values())
    return counts


def flops_per_token(config: BertConfig, seq_len: int, mlm_fraction: float = 0.15) -> float:
    """Return the training FLOPs (forward + backward) per token of one pretraining step.

    6 x encoder parameters (a multiply-add per weight, forward 2 and backward 4), plus
    12 x layers x hidden x seq_len for the attention scores and their weighted sum, plus the MLM
    head 6 x (d^2 + d V) run on `mlm_fraction` of the tokens only. Embedding lookups, LayerNorm,
    softmax and the per-sequence pooler/NSP are left out (small).

    Taught in notebooks/04_encoder.ipynb
    """
    d, V = config.hidden_size, config.vocab_size
    encoder = _count_from_config(config)["encoder"]
    attention = 12 * config.num_layers * d * seq_len
    mlm_head = 6 * (d * d + d * V) * mlm_fraction
    return float(6 * encoder + attention + mlm_head)


def parameter_table(vocab_size: int) -> list[dict[str, int | str]]:
    """Return one row per preset: its sizes and parameter counts (embeddings / encoder / heads).

    Taught in notebooks/04_encoder.ipynb
    """
    rows = []
    for name, (layers, hidden, heads) in PRESETS.items():
        counts = count_parameters(BertConfig.preset(name, vocab_size=vocab_size))
        rows.append({"preset": name, "layers": layers, "hidden": hidden, "attention_heads": heads,
                     **counts})
    return rows
