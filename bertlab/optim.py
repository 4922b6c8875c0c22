"""Muon for the encoder's hidden matrices, AdamW for everything else: one optimizer to the loop.

Muon (Jordan et al. 2024; `torch.optim.Muon` since torch 2.9) keeps a momentum of the gradient
like SGD, but before it steps it replaces that momentum by the nearest orthogonal matrix (a few
Newton-Schulz iterations). Every direction of a weight matrix then moves by the same amount,
instead of the few directions that dominate a raw gradient. It is defined for 2-D weights only,
and it is meant for the hidden ones: the attention and feed-forward matrices inside the encoder
layers. Embeddings (a lookup table, and here tied to the output layer), the heads, biases and
LayerNorm gains stay on AdamW, as in Muon's reference setup.

`MuonAdamW` holds one of each and looks like a single optimizer to `bertlab.train.train_loop`:
its `param_groups` are both optimizers' groups (the loop sets their learning rates, and
`torch.amp.GradScaler` unscales and checks their gradients, skipping both steps together after an
overflow), and its state dict has the ordinary flat shape of one optimizer's, so checkpoints and
exact resume work unchanged.

Taught in notebooks/05_pretraining.ipynb
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn


def is_hidden_matrix(name: str, param: torch.Tensor) -> bool:
    """Return whether `param` is a 2-D weight inside an encoder layer (Muon's share)."""
    return param.dim() == 2 and ".layers." in f".{name}"


class MuonAdamW:
    """Muon on the hidden matrices, AdamW on the other parameters, stepped together.

    Not a `torch.optim.Optimizer` itself: it holds a `torch.optim.Muon` and a
    `torch.optim.AdamW` (`parts`, in that order) and offers what the loop, checkpoints and
    `torch.amp.GradScaler` use of an optimizer: `param_groups`, `step`, `zero_grad`,
    `state_dict` and `load_state_dict`. `muon_groups` and `adamw_groups` are parameter groups
    (lists of dicts) for each part; `muon_options` and `adamw_options` their constructor
    arguments (lr, weight_decay, ...).

    Taught in notebooks/05_pretraining.ipynb
    """

    def __init__(self, muon_groups: Iterable[dict], adamw_groups: Iterable[dict], *,
                 muon_options: dict[str, Any], adamw_options: dict[str, Any]) -> None:
        self.muon = torch.optim.Muon(list(muon_groups), **muon_options)
        self.adamw = torch.optim.AdamW(list(adamw_groups), **adamw_options)
        self.parts = (self.muon, self.adamw)

    # A property, not a list made once: load_state_dict gives each part new group dicts, and
    # the loop's lr updates (and GradScaler's unscaling) must reach the live ones.
    @property
    def param_groups(self) -> list[dict]:
        """Return both parts' parameter groups (the live dicts), Muon's first."""
        return [g for part in self.parts for g in part.param_groups]

    def step(self) -> None:
        """Step both parts (Muon, then AdamW) on the gradients their parameters hold."""
        for part in self.parts:
            part.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear both parts' gradients (to None by default, as torch's optimizers do)."""
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """Return one flat state dict: parameters numbered across both parts, Muon's first.

        The shape of a single optimizer's ({"state": {index: {...}}, "param_groups": [...]}),
        which is what `bertlab.checkpoint` splits into safetensors and JSON.
        """
        state, groups, offset = {}, [], 0
        for part in self.parts:
            sd = part.state_dict()
            groups += [{**g, "params": [i + offset for i in g["params"]]}
                       for g in sd["param_groups"]]
            state.update({i + offset: s for i, s in sd["state"].items()})
            offset += sum(len(g["params"]) for g in sd["param_groups"])
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict written by `state_dict`, splitting it back into the two parts."""
        groups, offset = list(state_dict["param_groups"]), 0
        if len(groups) != len(self.param_groups):
            raise ValueError(f"the state dict has {len(groups)} parameter groups, this "
                             f"MuonAdamW has {len(self.param_groups)}")
        for part in self.parts:
            mine, groups = groups[:len(part.param_groups)], groups[len(part.param_groups):]
            ids = {i for g in mine for i in g["params"]}
            part.load_state_dict({
                # Only this part's parameters: torch would keep state under unknown keys as is.
                "state": {i - offset: s for i, s in state_dict["state"].items() if i in ids},
                "param_groups": [{**g, "params": [i - offset for i in g["params"]]}
                                 for g in mine]})
            offset += len(ids)


def split_for_muon(model: nn.Module) -> tuple[list[nn.Parameter], list[tuple[str, nn.Parameter]]]:
    """Return (the hidden matrices, the other named trainable parameters) of `model`."""
    hidden, rest = [], []
    for name, p in model.named_parameters():  # tied weights appear once
        if p.requires_grad:
            (hidden.append(p) if is_hidden_matrix(name, p) else rest.append((name, p)))
    return hidden, rest
