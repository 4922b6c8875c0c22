"""The BERT encoder, its two pretraining heads with their loss, and the classifier, in one file.

Read top to bottom: the config and its presets (`BertConfig`), then the modules in the order
data flows through them (embeddings -> attention -> feed-forward -> layer -> encoder `BertModel`
-> heads), then the pretraining loss (defined once, here) and `BertForPreTraining`, with
fill-mask on token ids beside it; last, `BertForSequenceClassification`, the same encoder with
a linear layer on [CLS], which fine-tuning trains. Numerics follow the original BERT (erf GELU,
post-LN, LayerNorm eps 1e-12, tanh pooler, MLM decoder tied to the word embeddings), so that
`bertlab.hf` can map weights to and from `transformers.BertForPreTraining` and get the same
numbers. Imports only torch and the label constant (`bertlab.masking.IGNORE_INDEX`); parameter
and FLOP counts are in `bertlab.counts`.

This is the textbook form: every forward takes the inputs a reader expects and returns one shape
per field. The training step runs the same weights through `bertlab.pretraining`, which adds
what only speed needs (the last block at the MLM targets only, a fixed number of MLM rows for
torch.compile, unpadding); tests keep the two equal.

Taught in notebooks/04_encoder.ipynb and notebooks/06_cls_and_downstream.ipynb.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.errors import check_type
from bertlab.masking import IGNORE_INDEX  # -100: a label that is not predicted

# BERT miniatures (Turc et al. 2019) plus BERT-base: (layers, hidden size, attention heads).
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
}


@dataclass
class BertConfig:
    """Every setting of the encoder, with BERT's defaults. `BertConfig.preset` fills in the sizes.

    Taught in notebooks/04_encoder.ipynb
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int | None = None  # None means 4 x hidden_size, as in every BERT
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0

    def __post_init__(self) -> None:
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"BertConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"BertConfig: hidden_size={self.hidden_size} is not divisible by "
                f"num_heads={self.num_heads}; each head gets hidden_size / num_heads dimensions"
            )
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"BertConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        # LayerNorm divides by sqrt(var + eps): eps <= 0 or NaN gives NaN logits; init draws
        # N(0, initializer_range): NaN or inf weights before the first step.
        for name, low, why in (("layer_norm_eps", "> 0", "BERT's is 1e-12"),
                               ("initializer_range", ">= 0", "BERT's is 0.02")):
            value = getattr(self, name)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not (number and math.isfinite(value) and (value > 0 or low == ">= 0" and value == 0)):
                raise ValueError(f"BertConfig.{name} must be a finite number {low}, got "
                                 f"{value!r} ({why})")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"BertConfig.pad_token_id={self.pad_token_id} is outside the vocabulary "
                f"(vocab_size={self.vocab_size})"
            )

    @property
    def head_dim(self) -> int:
        """Return the size of one attention head (hidden_size / num_heads)."""
        return self.hidden_size // self.num_heads

    @classmethod
    def preset(cls, name: str, vocab_size: int, **overrides) -> BertConfig:
        """Return the config of a named size (tiny, mini, small, medium, base); overrides win.

        Taught in notebooks/04_encoder.ipynb
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
        layers, hidden, heads = PRESETS[name]
        # intermediate_size stays None (4 x the final hidden_size) unless overridden.
        settings = dict(vocab_size=vocab_size, hidden_size=hidden, num_layers=layers,
                        num_heads=heads)
        settings.update(overrides)
        return cls.from_dict(settings)

    def to_dict(self) -> dict:
        """Return the settings as a plain dict (JSON-ready); `from_dict` reverses it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, settings: dict) -> BertConfig:
        """Return a config from a dict written by `to_dict`; unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ValueError(f"BertConfig has no setting(s) {unknown}; known: {sorted(known)}")
        return cls(**settings)


# ---------------------------------------------------------------------------------------------
# Outputs


@dataclass
class EncoderOutput:
    """What `BertModel` returns: per-token vectors, the pooled [CLS] vector, optional extras."""

    last_hidden_state: torch.Tensor  # (B, T, d)
    pooler_output: torch.Tensor  # (B, d)
    hidden_states: tuple[torch.Tensor, ...] | None = None  # embeddings, then each layer: (B, T, d)
    attentions: tuple[torch.Tensor, ...] | None = None  # L x (B, heads, T, T)


@dataclass
class PreTrainingOutput:
    """What `BertForPreTraining` returns. Exactly one of the MLM head's two outputs is set:
    without labels the head predicts every position (`mlm_logits`); with labels it runs at the
    targets alone (`target_logits`), since the loss needs no other row and the V-wide matmul is
    the head's cost."""

    loss: torch.Tensor | None  # () mlm_loss + nsp_loss, or whichever has labels
    mlm_loss: torch.Tensor | None  # () mean over the targets
    nsp_loss: torch.Tensor | None  # () mean over the pairs
    mlm_logits: torch.Tensor | None  # (B, T, V) without labels; None with labels
    nsp_logits: torch.Tensor  # (B, 2)
    loss_sums: dict[str, torch.Tensor] | None = None  # behind the means: `pretraining_loss_sums`
    # (N, V) with labels: N = the labels that are not -100, in row-major order, so row i pairs
    # with labels[labels != -100][i]; None without labels.
    target_logits: torch.Tensor | None = None


# ---------------------------------------------------------------------------------------------
# Modules


def init_weights(module: nn.Module, std: float, generator: torch.Generator | None) -> None:
    """Initialise one module as BERT does: N(0, std) weights, zero biases, LayerNorm at identity.

    The padding row of the word embeddings is an ordinary row (as in Google's BERT).
    """
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std, generator=generator)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class Embeddings(nn.Module):
    """Token + learned position + segment embeddings, then LayerNorm and dropout.

    Taught in notebooks/04_encoder.ipynb
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        d = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, d)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, d)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, d)
        self.norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        """Return the embedded tokens, (B, T) -> (B, T, d)."""
        T = input_ids.shape[1]
        x = self.word_embeddings(input_ids)  # (B, T) -> (B, T, d)
        if token_type_ids is None:  # every token in segment 0
            x = x + self.token_type_embeddings.weight[0]  # (d,) broadcasts over (B, T)
        else:
            x = x + self.token_type_embeddings(token_type_ids)  # (B, T) -> (B, T, d)
        # Positions 0..T-1 are the same for every sequence: slice the table, no lookup needed.
        x = x + self.position_embeddings.weight[:T]  # (T, d) broadcasts over B
        return self.dropout(self.norm(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention; query, key and value come from one fused (d -> 3d) Linear.

    Taught in notebooks/04_encoder.ipynb
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        d = config.hidden_size
        # One matmul instead of three; output rows are [query; key; value] (hf.py splits them).
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.dropout_p = config.attention_dropout

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None,
                output_attentions: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return the attended vectors (B, T, d) and, if asked, the probabilities (B, h, T, T)."""
        context, probs = self.attend(self.qkv(x), key_mask, output_attentions)
        return self.out(context), probs

    def attend(self, qkv: torch.Tensor, key_mask: torch.Tensor | None,
               output_attentions: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return each token's mix of the values, (B, T, 3d) -> (B, T, d), before the output
        projection; and the attention probabilities if asked."""
        B, T, d = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
        qkv = qkv.view(B, T, 3, self.num_heads, self.head_dim)  # -> (B, T, 3, h, d/h)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # -> 3 x (B, h, T, d/h)
        dropout_p = self.dropout_p if self.training else 0.0
        probs = None
        if output_attentions:
            # The explicit form, so the probabilities can be returned (slower; for pictures).
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # -> (B, h, T, T)
            if key_mask is not None:  # (B, 1, 1, T): True where the key is a real token
                scores = scores.masked_fill(~key_mask, float("-inf"))
            probs = scores.softmax(dim=-1)
            context = F.dropout(probs, dropout_p, self.training) @ v  # -> (B, h, T, d/h)
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask,
                                                     dropout_p=dropout_p)  # -> (B, h, T, d/h)
        return context.transpose(1, 2).reshape(B, T, d), probs  # (B, h, T, d/h) -> (B, T, d)


class EncoderLayer(nn.Module):
    """One post-LN transformer block: x = LN(x + attention(x)); x = LN(x + feed_forward(x)).

    Taught in notebooks/04_encoder.ipynb
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        d, ff, eps = config.hidden_size, config.intermediate_size, config.layer_norm_eps
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(d, eps=eps)
        self.ffn_in = nn.Linear(d, ff)
        self.ffn_out = nn.Linear(ff, d)
        self.ffn_norm = nn.LayerNorm(d, eps=eps)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None,
                output_attentions: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return the block's output (B, T, d) and the attention probabilities if asked."""
        attended, probs = self.attention(x, key_mask, output_attentions)
        return self.feed_forward(x, attended), probs

    def feed_forward(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Return the block's output from its input and the attention's: the two residual
        sums, each followed by LayerNorm, with the feed-forward between; (..., d) -> (..., d)."""
        x = self.attention_norm(x + self.dropout(attended))
        h = F.gelu(self.ffn_in(x))  # (..., d) -> (..., 4d), exact erf GELU
        return self.ffn_norm(x + self.dropout(self.ffn_out(h)))  # (..., 4d) -> (..., d)


def check_inputs(input_ids: torch.Tensor, config: BertConfig, **same_shape: torch.Tensor | None):
    """Raise ValueError, naming the input, for ids that are not a (batch, seq_len) integer
    tensor within the model's positions, or a tensor in `same_shape` of another shape."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, seq_len), got shape {tuple(input_ids.shape)}")
    if input_ids.dtype not in (torch.long, torch.int32):
        raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.shape[1] > config.max_position_embeddings:
        raise ValueError(
            f"input_ids has {input_ids.shape[1]} positions but the model has only "
            f"max_position_embeddings={config.max_position_embeddings}; truncate the sequences"
        )
    for name, tensor in same_shape.items():
        if tensor is not None and tensor.shape != input_ids.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} but input_ids has "
                f"{tuple(input_ids.shape)}; they must match"
            )


def key_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """Return attention's mask of the keys, (B, T) -> (B, 1, 1, T), True at real tokens; None
    when there is no padding, so attention runs unmasked (its fastest path)."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    mask = attention_mask.bool()
    if not bool(mask.any(dim=1).all()):
        raise ValueError("attention_mask has a sequence with no real token (a row of zeros)")
    return mask[:, None, None, :]  # (B, T) -> (B, 1, 1, T): broadcasts over heads and queries


class BertModel(nn.Module):
    """The bare encoder: embeddings, `num_layers` blocks and the tanh pooler on [CLS].

    Taught in notebooks/04_encoder.ipynb
    """

    def __init__(self, config: BertConfig, generator: torch.Generator | None = None):
        super().__init__()
        check_type(config, BertConfig, "config", "a bertlab BertConfig",
                   "pass BertConfig.preset('tiny', vocab_size=...) or a BertConfig(...)")
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_layers))
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.apply(lambda m: init_weights(m, config.initializer_range, generator))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> EncoderOutput:
        """Return an `EncoderOutput`: last_hidden_state (B, T, d), pooler_output (B, d), extras.

        `attention_mask` is 1 for real tokens and 0 for padding (keys at padding are ignored).
        """
        check_inputs(input_ids, self.config, attention_mask=attention_mask,
                     token_type_ids=token_type_ids)
        mask = key_mask(attention_mask)
        x = self.embeddings(input_ids, token_type_ids)  # (B, T) -> (B, T, d)
        hidden_states, attentions = [x], []
        for layer in self.layers:
            x, probs = layer(x, mask, output_attentions)  # (B, T, d) -> (B, T, d)
            hidden_states.append(x)
            attentions.append(probs)
        pooled = torch.tanh(self.pooler(x[:, 0]))  # the [CLS] vector: (B, T, d) -> (B, d)
        return EncoderOutput(
            last_hidden_state=x,
            pooler_output=pooled,
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )


class MaskedLMHead(nn.Module):
    """dense + GELU + LayerNorm, then scores against the (tied) word embeddings plus a bias."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        """Return vocabulary logits, (..., d) -> (..., V); `word_embeddings` is the (V, d) table."""
        h = self.norm(F.gelu(self.dense(h)))
        return F.linear(h, word_embeddings, self.bias)  # (..., d) @ (d, V) -> (..., V)


# ---------------------------------------------------------------------------------------------
# The pretraining loss, defined once


def loss_counts(labels: torch.Tensor | None,
                next_sentence_label: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Return how many terms each pretraining loss sums: "targets" (MLM labels that are not
    -100) with `labels`, "sequences" (NSP labels) with `next_sentence_label`."""
    counts = {}
    if labels is not None:
        counts["targets"] = (labels != IGNORE_INDEX).sum()
    if next_sentence_label is not None:
        counts["sequences"] = (next_sentence_label != IGNORE_INDEX).sum()
    return counts


def pretraining_loss_sums(target_logits: torch.Tensor, labels: torch.Tensor | None,
                          nsp_logits: torch.Tensor,
                          next_sentence_label: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Return BERT's two cross-entropies as sums, with their counts (`loss_counts`).

    "mlm" with `labels` (`target_logits` (N, V) pairs row by row with `labels` (N,); a -100 adds
    nothing), "nsp" with `next_sentence_label`. Sums, not means: the model reports each loss as
    its sum over its own count (the mean, as `transformers` does), while a training step made of
    several batches (accumulation, DDP) divides each batch's sums by the whole step's counts, so
    every target weighs the same however the step is split. fp32 even under autocast.
    """
    sums = loss_counts(labels, next_sentence_label)
    if labels is not None:
        sums["mlm"] = F.cross_entropy(target_logits.float(), labels, ignore_index=IGNORE_INDEX,
                                      reduction="sum")
    if next_sentence_label is not None:
        sums["nsp"] = F.cross_entropy(nsp_logits.float(), next_sentence_label,
                                      ignore_index=IGNORE_INDEX, reduction="sum")
    return sums


def pretraining_output(logits: torch.Tensor, labels: torch.Tensor | None,
                       nsp_logits: torch.Tensor,
                       next_sentence_label: torch.Tensor | None) -> PreTrainingOutput:
    """Return the `PreTrainingOutput` of these logits: the loss sums and their means.

    `logits` are the MLM head's: with `labels` (N,) they are (N, V), one row per label, and come
    back as `target_logits`; without labels they are (B, T, V) and come back as `mlm_logits`.
    A batch with no MLM target gives mlm_loss = 0 (attached to the graph), not NaN.
    """
    sums = pretraining_loss_sums(logits, labels, nsp_logits, next_sentence_label)
    # Means. With no target at all, cross_entropy's mean is 0/0 = NaN (transformers#16711);
    # the sum over max(count, 1) gives 0 instead, attached to the graph so backward() works,
    # and without a data-dependent branch (which would split a torch.compile graph).
    mlm_loss = sums["mlm"] / sums["targets"].clamp(min=1) if "mlm" in sums else None
    nsp_loss = sums["nsp"] / sums["sequences"].clamp(min=1) if "nsp" in sums else None
    present = [x for x in (mlm_loss, nsp_loss) if x is not None]
    loss = sum(present[1:], present[0]) if present else None
    mlm_logits, target_logits = (None, logits) if labels is not None else (logits, None)
    return PreTrainingOutput(loss, mlm_loss, nsp_loss, mlm_logits, nsp_logits, sums or None,
                             target_logits)


class BertForPreTraining(nn.Module):
    """BERT with its two pretraining heads: masked LM (tied decoder) and next-sentence prediction.

    Taught in notebooks/04_encoder.ipynb
    """

    def __init__(self, config: BertConfig, generator: torch.Generator | None = None):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, generator=generator)
        self.mlm = MaskedLMHead(config)
        self.nsp = nn.Linear(config.hidden_size, 2)  # IS_NEXT = 0, NOT_NEXT = 1
        for head in (self.mlm, self.nsp):
            head.apply(lambda m: init_weights(m, config.initializer_range, generator))

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Return vocabulary logits for hidden vectors, (..., d) -> (..., V)."""
        return self.mlm(hidden, self.bert.embeddings.word_embeddings.weight)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None) -> PreTrainingOutput:
        """Return a `PreTrainingOutput` with logits and, when labels are given, the losses.

        With `labels` (B, T) (-100 = not predicted), the MLM head runs only at the targets:
        `target_logits` is (num_targets, V), the targets in row-major order, which is where a
        loss needs it (about 15% of the positions, and the V-wide matmul is the head's cost), and
        `mlm_logits` is None. Without labels every position is predicted: `mlm_logits` is
        (B, T, V). `loss` = mlm_loss + nsp_loss, or whichever of the two has labels.
        """
        check_inputs(input_ids, self.config, labels=labels)
        if next_sentence_label is not None and next_sentence_label.shape != input_ids.shape[:1]:
            raise ValueError(f"next_sentence_label must be (batch,) = {tuple(input_ids.shape[:1])}"
                             f", got {tuple(next_sentence_label.shape)}")
        encoded = self.bert(input_ids, attention_mask, token_type_ids)
        h = encoded.last_hidden_state.flatten(0, 1)  # (B, T, d) -> (B*T, d)
        if labels is not None:  # only the targets: (B*T, d) -> (N, d)
            where = (labels.flatten() != IGNORE_INDEX).nonzero().squeeze(1)  # (N,)
            h, labels = h.index_select(0, where), labels.flatten().index_select(0, where)
        logits = self.mlm_logits(h)  # (N, d) -> (N, V), or (B*T, d) -> (B*T, V) without labels
        if labels is None:
            logits = logits.unflatten(0, input_ids.shape)  # (B*T, V) -> (B, T, V)
        nsp_logits = self.nsp(encoded.pooler_output)  # (B, d) -> (B, 2)
        return pretraining_output(logits, labels, nsp_logits, next_sentence_label)

    @torch.no_grad()
    def fill_mask(self, input_ids: torch.Tensor, mask_id: int, top_k: int = 5,
                  token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (probabilities, token ids), each (masks, top_k), best first, at each `mask_id`.

        `input_ids` (B, T) are unpadded sequences; the masks come in row-major order. Runs
        without dropout, then restores the mode; non-finite probabilities raise a ValueError.
        """
        device, was_training = next(self.parameters()).device, self.training
        out = self.eval()(input_ids.to(device), token_type_ids=None if token_type_ids is None
                          else token_type_ids.to(device))
        self.train(was_training)
        masks = (input_ids == mask_id).to(device)  # (B, T)
        probs = out.mlm_logits[masks].float().softmax(-1)  # (B, T, V) -> (masks, V), row-major
        if not torch.isfinite(probs).all():  # finite weights can still overflow inside the model
            raise ValueError("the model gives NaN or inf probabilities: its weights are non-finite "
                             "or overflow (a corrupt checkpoint, or a run that diverged); use an "
                             "earlier checkpoint or train again")
        top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)  # (masks, V) -> 2 x (masks, k)
        return top.values, top.indices


# ---------------------------------------------------------------------------------------------
# Sequence classification: the encoder, then dropout and a linear layer on [CLS]
#
# The same layer names as `transformers.BertForSequenceClassification` (`bert.*`, `classifier.*`),
# so `bertlab.hf` exports and imports it; `bertlab.finetune` trains it.


@dataclass
class ClassificationOutput:
    """What `BertForSequenceClassification` returns."""

    loss: torch.Tensor | None  # the mean over the batch, as transformers reports it
    logits: torch.Tensor  # (B, num_labels)
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    loss_sum: torch.Tensor | None = None  # the sum, for a step that spans several batches


class BertForSequenceClassification(nn.Module):
    """BERT with dropout + a linear classifier on the pooled [CLS] vector.

    `num_labels=1` means regression (mean squared error), as in `transformers`.
    """

    def __init__(self, config: BertConfig, num_labels: int,
                 generator: torch.Generator | None = None):
        super().__init__()
        check_type(num_labels, int, "num_labels", "a whole number", "pass the number of classes")
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        self.config = config
        self.num_labels = num_labels
        self.bert = BertModel(config, generator=generator)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_weights(self.classifier, config.initializer_range, generator)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_hidden_states: bool = False,
                output_attentions: bool = False) -> ClassificationOutput:
        """Return a `ClassificationOutput`: logits (B, num_labels) and the loss if labels given."""
        encoded = self.bert(input_ids, attention_mask, token_type_ids,
                            output_hidden_states=output_hidden_states,
                            output_attentions=output_attentions)
        logits = self.classifier(self.dropout(encoded.pooler_output))  # (B, d) -> (B, labels)
        loss = loss_sum = None
        if labels is not None:  # fp32 even under autocast
            if self.num_labels == 1:
                loss_sum = F.mse_loss(logits.float().squeeze(-1), labels.float(), reduction="sum")
            else:
                loss_sum = F.cross_entropy(logits.float(), labels, reduction="sum")
            loss = loss_sum / labels.numel()
        return ClassificationOutput(loss, logits, encoded.hidden_states, encoded.attentions,
                                    loss_sum)
