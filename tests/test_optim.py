"""MuonAdamW as the loop, GradScaler, clipping and checkpoints use it (see also test_recipes)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

from bertlab.engine.checkpoint import load_checkpoint, save_checkpoint
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.precision import cpu_has_native_bf16, resolve_newton_schulz
from bertlab.train import Muon, MuonAdamW, TrainConfig, build_optimizer

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


# ---------------------------------------------------------------------------------------------
# Newton-Schulz in the dtype that is fast on the device (bertlab.train.Muon)


@pytest.mark.parametrize("options", [dict(), dict(nesterov=False, weight_decay=0.1),
                                     dict(adjust_lr_fn="match_rms_adamw", momentum=0.9)],
                         ids=["defaults", "plain-momentum-decay", "match-rms"])
def test_bertlabs_muon_in_bf16_is_torchs_bit_for_bit(options):
    # Wide, tall and square matrices: torch's Muon iterates a tall one as its transpose.
    shapes = [(32, 64), (64, 32), (32, 32)]
    start = [torch.randn(s, generator=torch.Generator().manual_seed(i)) for i, s in
             enumerate(shapes)]
    ours = [nn.Parameter(w.clone()) for w in start]
    torchs = [nn.Parameter(w.clone()) for w in start]
    mine = Muon(ours, newton_schulz="bf16", lr=0.02, **options)
    theirs = torch.optim.Muon(torchs, lr=0.02, **options)
    for seed in range(4):
        gen = torch.Generator().manual_seed(100 + seed)
        grads = [torch.randn(s, generator=gen) for s in shapes]
        for params, optimizer in ((ours, mine), (torchs, theirs)):
            for p, g in zip(params, grads, strict=True):
                p.grad = g.clone()
            optimizer.step()
    assert same(ours, torchs)
    assert mine.state_dict()["param_groups"] == theirs.state_dict()["param_groups"]
    assert all(torch.equal(mine.state[a]["momentum_buffer"], theirs.state[b]["momentum_buffer"])
               for a, b in zip(ours, torchs, strict=True))


def test_fp32_newton_schulz_orthogonalizes_and_leaves_the_gradient_alone():
    grad = torch.randn(48, 16, generator=torch.Generator().manual_seed(0))
    steps = {}
    for dtype in ("fp32", "bf16"):  # one step from zero, plain momentum: the update itself
        param = nn.Parameter(torch.zeros(48, 16))
        param.grad = grad.clone()
        Muon([param], newton_schulz=dtype, lr=1.0, momentum=0.0, nesterov=False,
             weight_decay=0.0).step()
        steps[dtype] = -param.detach() / 3 ** 0.5  # the lr scale of a 48 x 16 matrix
        singular = torch.linalg.svdvals(steps[dtype])
        assert singular.min() > 0.5 and singular.max() < 1.5  # every direction moves about equally
        assert torch.equal(param.grad, grad)
    assert (steps["fp32"] - steps["bf16"]).norm() / steps["fp32"].norm() < 0.05


def test_a_muon_run_builds_its_newton_schulz_in_the_dtype_it_resolves(monkeypatch):
    model = tiny()
    for setting, expected in (("bf16", "bf16"), ("fp32", "fp32")):
        config = TrainConfig(optimizer="muon", newton_schulz=setting)
        assert build_optimizer(model, config).muon.newton_schulz == expected
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # oneDNN may use no bf16 instructions
    monkeypatch.delenv("BERTLAB_NEWTON_SCHULZ", raising=False)
    assert build_optimizer(model, CONFIG).muon.newton_schulz == "fp32"


def test_auto_is_fp32_on_a_cpu_without_native_bf16_and_bf16_on_a_gpu(monkeypatch):
    monkeypatch.delenv("BERTLAB_NEWTON_SCHULZ", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not cpu_has_native_bf16()
    assert resolve_newton_schulz("auto", torch.device("cpu")) == "fp32"
    assert resolve_newton_schulz("auto", torch.device("cuda")) == "bf16"
    assert resolve_newton_schulz("bf16", torch.device("cpu")) == "bf16"  # said, not resolved
    monkeypatch.setenv("BERTLAB_NEWTON_SCHULZ", "bf16")  # how an old trace replays
    assert resolve_newton_schulz("auto", torch.device("cpu")) == "bf16"
    assert resolve_newton_schulz("fp32", torch.device("cpu")) == "fp32"
    monkeypatch.setenv("BERTLAB_NEWTON_SCHULZ", "fp16")
    with pytest.raises(ValueError, match="BERTLAB_NEWTON_SCHULZ='fp16' is not one of bf16, fp32"):
        resolve_newton_schulz("auto", torch.device("cpu"))


def test_this_cpus_answer_follows_its_own_flags(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    flags = set()
    for line in open("/proc/cpuinfo", encoding="utf-8"):
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags = set(value.split())
            break
    assert cpu_has_native_bf16() == bool(flags & {"amx_bf16", "avx512_bf16", "bf16"})


def test_a_bad_newton_schulz_setting_names_its_flag():
    with pytest.raises(ValueError, match=r"newton_schulz='fp16' is not one"):
        TrainConfig(newton_schulz="fp16")


def test_a_resume_on_a_machine_that_picks_the_other_dtype_goes_on_and_says_so(tmp_path, capsys):
    from faultlib import SMALL, corpus_folder

    from bertlab.cli import main

    corpus, run = corpus_folder(tmp_path / "corpus", 12), tmp_path / "run"
    argv = ["pretrain", "--corpus", str(corpus), "--out", str(run), *SMALL, "--max-steps", "4",
            "--optimizer", "muon"]
    assert main([*argv, "--stop-after", "2", "--newton-schulz", "bf16"]) == 0
    assert main([*argv, "--resume", "--newton-schulz", "fp32"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "newton_schulz bf16 -> fp32" in out
    record = json.loads((run / "run.json").read_text(encoding="utf-8"))
    assert record["resumes"][-1]["changed"]["newton_schulz"] == ["bf16", "fp32"]
    history = json.loads((run / "history.json").read_text(encoding="utf-8"))
    assert history[-1]["step"] == 4
    assert any("newton_schulz bf16 -> fp32" in row.get("resumed_with", "") for row in history)


def test_bf16_precision_on_a_cpu_that_emulates_it_warns_and_names_the_fix(monkeypatch):
    import bertlab.engine.session as hooks

    monkeypatch.setattr(hooks, "cpu_has_native_bf16", lambda: False)
    model = tiny()
    batch = {"input_ids": torch.randint(5, 100, (2, 8)), "token_type_ids": torch.zeros(2, 8, dtype=torch.long),
             "attention_mask": torch.ones(2, 8, dtype=torch.long),
             "labels": torch.full((2, 8), -100), "next_sentence_label": torch.zeros(2, dtype=torch.long)}
    batch["labels"][:, 2] = 7
    config = TrainConfig(max_steps=1, batch_size=2, precision="bf16", device="cpu",
                         eval_interval=None, progress=False, log_interval=0)
    from bertlab.pretraining import pretrain

    with pytest.warns(UserWarning, match="bf16 on a CPU without native bf16 .* --precision fp32"):
        pretrain(model, [batch], None, config, objectives=("mlm",))
