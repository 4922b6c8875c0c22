"""BERT for sequence classification: the encoder, then dropout and a linear layer on [CLS].

The same layer names as `transformers.BertForSequenceClassification` (`bert.*`, `classifier.*`),
so `bertlab.hf` exports and imports it; `bertlab.finetune` trains it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.model import BertConfig, BertModel, init_weights


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
