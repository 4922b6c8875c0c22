"""MuonAdamW as the loop, GradScaler, clipping and checkpoints use it (see also test_recipes)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

from bertlab.engine.checkpoint import load_checkpoint, save_checkpoint
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.train import MuonAdamW, TrainConfig, build_optimizer

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIG = TrainConfig(optimizer="muon", lr=1e-3, muon_lr=0.02)


def tiny(seed=0):
    config = BertConfig.preset("tiny", vocab_size=100, hidden_size=32, intermediate_size=64,
                               max_position_embeddings=16)
    return BertForPreTraining(config, generator=torch.Generator().manual_seed(seed))


def grads_for(model, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=gen) for p in model.parameters()]


def step_on(model, optimizer, grads):
    for p, g in zip(model.parameters(), grads, strict=True):
        p.grad = g.clone()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def loss_with_grads(model, grads):  # its gradient with respect to the parameters is `grads`
    return sum((p * g).sum() for p, g in zip(model.parameters(), grads, strict=True))


def test_grad_scaler_unscales_clips_and_skips_both_parts_together():
    model, reference = tiny(), tiny()
    optimizer, plain = build_optimizer(model, CONFIG), build_optimizer(reference, CONFIG)
    assert isinstance(optimizer, MuonAdamW)
    scaler = torch.amp.GradScaler("cpu", enabled=True)  # enabled: as train_loop makes it for fp16
    grads, start = grads_for(model, seed=1), weights(model)

    # The scaled loss whose gradient is `grads` times the scale; the scale is a power of two,
    # so unscaling gives back `grads` exactly and both runs must agree bit for bit.
    scaler.scale(loss_with_grads(model, grads)).backward()
    scaler.unscale_(optimizer)
    assert same([p.grad for p in model.parameters()], grads)
    nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    for p, g in zip(reference.parameters(), grads, strict=True):
        p.grad = g.clone()
    nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
    plain.step()
    assert same(model.parameters(), reference.parameters())
    assert not any(torch.equal(a, b) for a, b in zip(model.parameters(), start, strict=True))

    # An overflow in one Muon matrix skips the whole step (AdamW's share too), halving the scale.
    before, scale = weights(model), scaler.get_scale()
    hidden = optimizer.muon.param_groups[0]["params"][0]
    grads[next(i for i, p in enumerate(model.parameters()) if p is hidden)][0, 0] = float("inf")
    scaler.scale(loss_with_grads(model, grads)).backward()
    scaler.step(optimizer)
    scaler.update()
    assert same(model.parameters(), before)
    assert scaler.get_scale() == scale / 2


def test_state_survives_a_checkpoint_and_the_next_steps_are_bit_exact(tmp_path):
    model = tiny()
    optimizer = build_optimizer(model, CONFIG)
    for seed in (1, 2):
        step_on(model, optimizer, grads_for(model, seed))
    path = save_checkpoint(tmp_path / "ck", model, optimizer, state={"step": 2})

    again = tiny(seed=5)
    restored = build_optimizer(again, CONFIG)
    load_checkpoint(path, again, restored)
    # Compared as JSON: the checkpoint stored Muon's ns_coefficients tuple as a list.
    assert (json.dumps(restored.state_dict()["param_groups"])
            == json.dumps(optimizer.state_dict()["param_groups"]))
    for seed in (3, 4):
        step_on(model, optimizer, grads_for(model, seed))
        step_on(again, restored, grads_for(again, seed))
    assert same(model.parameters(), again.parameters())


def test_state_dict_keeps_the_flat_layout_earlier_checkpoints_hold():
    # Checkpoints written by bertlab before MuonAdamW became a wrapper hold this layout, built
    # here from the two torch optimizers: Muon's parameters numbered first, then AdamW's. It
    # must stay the layout, or those runs could no longer resume.
    model = tiny()
    optimizer = build_optimizer(model, CONFIG)
    step_on(model, optimizer, grads_for(model, 1))
    muon, adamw = (part.state_dict() for part in optimizer.parts)
    n_muon = sum(len(g["params"]) for g in muon["param_groups"])
    old = {"state": {**muon["state"], **{i + n_muon: s for i, s in adamw["state"].items()}},
           "param_groups": muon["param_groups"] + [
               {**g, "params": [i + n_muon for i in g["params"]]}
               for g in adamw["param_groups"]]}
    new = optimizer.state_dict()
    assert new["param_groups"] == old["param_groups"]
    assert new["state"].keys() == old["state"].keys()
    assert all(torch.equal(new["state"][i][k], old["state"][i][k])
               for i in old["state"] for k in old["state"][i])

    again = tiny()
    again.load_state_dict(model.state_dict())
    restored = build_optimizer(again, CONFIG)
    restored.load_state_dict(copy.deepcopy(old))  # torch would share the tensors otherwise
    step_on(model, optimizer, grads_for(model, 2))
    step_on(again, restored, grads_for(again, 2))
    assert same(model.parameters(), again.parameters())
