"""Recipes, Muon beside AdamW, and the honest MLM metrics (accuracy at [MASK] positions)."""

from __future__ import annotations

import json
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bertlab.data import LoaderOptions, pretraining_loader
from bertlab.hf import save_hf
from bertlab.masking import IGNORE_INDEX, MaskingConfig
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.pairs import create_nsp_examples
from bertlab.pretraining import PretrainingObjective, evaluate, pretrain, unigram_bar
from bertlab.readers import load_corpus
from bertlab.recipes import RECIPES, Recipe, recipe
from bertlab.tokenizer import special_ids, train_tokenizer
from bertlab.train import MuonAdamW, TrainConfig, build_optimizer, lr_at, train_step
from tests.test_train import InterruptAt

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(load_corpus("bbc")[:200], vocab_size=500)


@pytest.fixture(scope="module")
def examples(tok):
    return create_nsp_examples(load_corpus("bbc")[:40], tok, max_seq_len=64, seed=0)


def tiny(tok, seed=0, **overrides):
    config = BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), hidden_size=32,
                               intermediate_size=64, max_position_embeddings=64, **overrides)
    return BertForPreTraining(config, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------
# Recipes


def test_bert_recipe_is_the_papers_choices_and_course_differs_only_in_training():
    bert, course = recipe("bert"), recipe("course")
    assert (bert.mlm_probability, bert.objectives, bert.dropout, bert.optimizer) == (0.15, ("mlm", "nsp"), 0.1,
                                                                                "adamw")
    assert bert.schedule == "linear"
    assert set(RECIPES) == {"bert", "course", "nsp", "gpu"} and course != bert
    # Both give the same architecture: a recipe changes how a model is trained, not what it is.
    a, b = bert.model_config("tiny", 100), course.model_config("tiny", 100)
    differ = {k for k, v in a.to_dict().items() if b.to_dict()[k] != v}
    assert differ <= {"hidden_dropout", "attention_dropout"}


def test_the_gpu_recipe_is_berts_tasks_with_pairs_drawn_afresh_and_a_twin_without_nsp():
    gpu = recipe("gpu")
    assert gpu.objectives == ("mlm", "nsp") and gpu.mlm_probability == 0.15
    assert gpu.pair_draws > 1 and gpu.loader_options().pair_draws == gpu.pair_draws
    assert (gpu.max_seq_len, gpu.dropout, gpu.optimizer) == (128, 0.1, "adamw")
    twin = gpu.with_objectives("mlm")
    # The twin reads the very same pairs; only its loss leaves NSP out.
    assert twin.objectives == ("mlm",) and twin.loader_options() == gpu.loader_options()
    assert {k: v for k, v in twin.to_dict().items() if gpu.to_dict()[k] != v} == {
        "objectives": ("mlm",)}
    # Records written before pair draws existed read back with one draw.
    old = {k: v for k, v in recipe("course").to_dict().items() if k != "pair_draws"}
    assert Recipe.from_dict(old) == recipe("course")
    assert Recipe.from_dict(gpu.to_dict()) == gpu


def test_the_nsp_recipe_is_the_course_recipe_with_nsp_longer_pairs_and_a_step_budget():
    nsp, course = recipe("nsp"), recipe("course")
    assert nsp.objectives == ("mlm", "nsp") and nsp.steps == 10_000
    # What the search changed from the course recipe, and nothing else.
    differ = {k for k, v in nsp.to_dict().items() if course.to_dict()[k] != v}
    assert differ == {"name", "summary", "objectives", "batch_size", "max_seq_len", "pair_draws",
                      "precision", "steps"}
    assert (nsp.batch_size, nsp.max_seq_len, nsp.pair_draws, nsp.precision) == (32, 128, 16,
                                                                               "fp32")
    # The step budget reaches TrainConfig unless the run sets its own.
    assert nsp.train_config().max_steps == 10_000
    assert nsp.train_config(max_steps=7).max_steps == 7
    # Its twins read the same pairs; the SOP twin reads the same documents cut into SOP pairs.
    assert nsp.with_objectives("mlm").loader_options() == nsp.loader_options()
    assert nsp.with_objectives("mlm,sop").loader_options().pairs == "sop"
    assert Recipe.from_dict(nsp.to_dict()) == nsp


def test_recipe_hands_its_settings_to_loader_model_and_train_config():
    r = recipe("course")
    assert r.loader_options() == LoaderOptions(
        batch_size=r.batch_size, max_seq_len=r.max_seq_len,
        masking=MaskingConfig(mlm_probability=r.mlm_probability), pairs="nsp", pair_draws=1)
    assert r.masking == MaskingConfig(mlm_probability=r.mlm_probability)
    assert r.with_objectives("mlm,sop").loader_options().pairs == "sop"
    assert r.loader_options(batch_size=8, pad_to_multiple_of=8) == LoaderOptions(
        batch_size=8, max_seq_len=r.max_seq_len, masking=r.masking, pairs="nsp", pair_draws=1,
        pad_to_multiple_of=8)  # overrides win
    assert r.model_config("tiny", 100).hidden_dropout == r.dropout
    assert r.model_config("tiny", 100, hidden_dropout=0.3).hidden_dropout == 0.3
    config = r.train_config(max_steps=50, lr=1e-4)
    assert (config.optimizer, config.muon_lr, config.batch_size) == (r.optimizer, r.muon_lr,
                                                                     r.batch_size)
    assert config.lr == 1e-4 and config.max_steps == 50  # overrides win


def test_unknown_recipe_is_named_with_the_choices():
    choices = "bert, course, nsp, gpu"
    with pytest.raises(ValueError, match=rf"unknown recipe 'fast'; choose one of {choices}"):
        recipe("fast")


def test_course_model_exports_to_a_transformers_model_with_the_same_outputs(tok, examples,
                                                                            tmp_path):
    transformers = pytest.importorskip("transformers")
    r = recipe("course")
    train = pretraining_loader(examples, tok, split=None, seed=0,
                               options=r.loader_options(batch_size=8))
    model = tiny(tok, hidden_dropout=r.dropout, attention_dropout=r.dropout)
    pretrain(model, train, None, r.train_config(max_steps=3, batch_size=8, progress=False,
                                                 checkpoint_interval=None, device="cpu"),
             objectives=r.objectives)
    save_hf(model, tok, tmp_path / "hf")
    theirs = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").eval()
    batch = next(iter(train))
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        ours = model.eval()(**inputs).mlm_logits  # (B, T, V): every position
        hf = theirs(**inputs).prediction_logits  # (B, T, V)
    assert torch.allclose(ours, hf, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Muon on the hidden matrices, AdamW on the rest


def test_muon_takes_exactly_the_encoder_layers_matrices(tok):
    model = tiny(tok)
    optimizer = build_optimizer(model, TrainConfig(optimizer="muon", lr=1e-3, muon_lr=0.02))
    assert isinstance(optimizer, MuonAdamW)
    muon, adamw = optimizer.parts
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    assert in_muon == {n for n, p in model.named_parameters()
                       if n.startswith("bert.layers.") and p.dim() == 2}
    in_adamw = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    assert "bert.embeddings.word_embeddings.weight" in in_adamw and not in_muon & in_adamw
    assert len(in_muon) + len(in_adamw) == len(list(model.parameters()))  # tied weights once
    # The loop scales each group's peak by the schedule: Muon peaks at muon_lr.
    assert [g["lr_scale"] for g in optimizer.param_groups] == [20.0, 1.0, 1.0]


def test_muon_run_resumes_exactly(tok, examples, tmp_path):
    config = TrainConfig(max_steps=6, batch_size=8, optimizer="muon", lr=3e-3,
                         checkpoint_interval=None, eval_interval=None, progress=False,
                         device="cpu")

    def loader():
        return pretraining_loader(examples, tok, split=None, seed=0,
                                  options=LoaderOptions(batch_size=8))

    full = pretrain(tiny(tok), loader(), None, config, out_dir=tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C when the 4th batch is asked for
        pretrain(tiny(tok), InterruptAt(loader(), 4), None, config, out_dir=tmp_path / "cut")
    resumed = pretrain(tiny(tok, seed=1), loader(), None, config, out_dir=tmp_path / "cut",
                       resume=True)
    assert resumed.first_step == 3
    assert resumed.step_losses == pytest.approx(full.step_losses[3:], abs=1e-6)


def test_muon_state_dict_round_trips(tok):
    model = tiny(tok)
    config = TrainConfig(optimizer="muon")
    optimizer = build_optimizer(model, config)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    again = build_optimizer(model, config)
    again.load_state_dict(optimizer.state_dict())
    a, b = optimizer.state_dict(), again.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert all(torch.equal(a["state"][i][k], b["state"][i][k])
               for i in a["state"] for k in a["state"][i] if torch.is_tensor(a["state"][i][k]))
    with pytest.raises(ValueError, match="parameter groups"):
        again.load_state_dict({"state": {}, "param_groups": a["param_groups"][:1]})


def test_schedule_scales_every_group_from_its_own_peak():
    # One real step at step 50 of 100: Muon's matrices and AdamW's rest each get their own peak
    # times the same point of the schedule.
    config = TrainConfig(max_steps=100, lr=1e-3, muon_lr=0.02, optimizer="muon", batch_size=2)
    model = BertForPreTraining(BertConfig.preset("tiny", vocab_size=64, hidden_size=32,
                                                 num_heads=2, intermediate_size=64))
    optimizer = build_optimizer(model, config)
    ids = torch.randint(5, 64, (2, 8))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "token_type_ids": torch.zeros_like(ids), "labels": ids,
             "next_sentence_label": torch.zeros(2, dtype=torch.long)}
    lr = lr_at(50, config)
    train_step(model, [batch], PretrainingObjective(("mlm", "nsp")), optimizer,
               torch.amp.GradScaler("cpu", enabled=False), lr=lr, grad_clip=None,
               precision="fp32")
    rates = sorted({group["lr"] for group in optimizer.param_groups})
    assert 0 < lr < 1e-3 and rates == pytest.approx([lr, lr * 20])  # 0.02 / 1e-3


def test_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match=r"optimizer='sgd' is not one of adamw, muon"):
        TrainConfig(optimizer="sgd")


# ---------------------------------------------------------------------------------------------
# The honest metrics: what the model saw at each target


class CopyInput(nn.Module):
    """A "model" that predicts each target to be the token it sees there: copying, no context."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.unused = nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, labels, next_sentence_label, **_):
        where = labels != IGNORE_INDEX
        logits = F.one_hot(input_ids[where], self.vocab_size).float() * 10
        nsp_logits = torch.zeros(len(input_ids), 2)
        sums = {"mlm": F.cross_entropy(logits, labels[where], reduction="sum"),
                "nsp": F.cross_entropy(nsp_logits, next_sentence_label, reduction="sum"),
                "targets": where.sum().float(), "sequences": torch.tensor(float(len(labels)))}
        return types.SimpleNamespace(target_logits=logits, nsp_logits=nsp_logits, loss_sums=sums)


def test_copying_scores_on_kept_targets_only(tok, examples):
    val = pretraining_loader(examples, tok, split=None, seed=0,
                             options=LoaderOptions(batch_size=8, mask_schedule="static"))
    metrics = evaluate(CopyInput(tok.get_vocab_size()), val)
    assert metrics["kept_accuracy"] == 1.0
    assert metrics["mask_accuracy"] == 0.0 and metrics["random_accuracy"] == 0.0
    # All targets mix the three: about 10% of targets are kept, so about 10% "right".
    assert 0.05 < metrics["mlm_accuracy"] < 0.16
    assert metrics["mask_unigram_accuracy"] > 0.0


def test_kinds_need_the_mask_id_of_a_plain_list_of_batches(tok, examples):
    batches = list(pretraining_loader(examples[:16], tok, split=None, seed=0,
                                      options=LoaderOptions(batch_size=8)))
    model = tiny(tok)
    assert "mask_accuracy" not in evaluate(model, batches)
    with_id = evaluate(model, batches, mask_id=special_ids(tok).mask)
    assert 0.0 <= with_id["mask_accuracy"] <= 1.0


def test_unigram_bar_is_the_top_share_and_the_entropy():
    bar = unigram_bar(torch.tensor([3, 3, 3, 5]))
    assert bar["mask_unigram_accuracy"] == 0.75
    assert bar["mask_unigram_loss"] == pytest.approx(-(0.75 * torch.log(torch.tensor(0.75))
                                                       + 0.25 * torch.log(torch.tensor(0.25))))


def test_mlm_only_leaves_pooler_and_nsp_head_out_of_the_run_and_gives_them_back(tok, examples):
    model = tiny(tok)
    pooler = model.bert.pooler.weight.detach().clone()
    train = pretraining_loader(examples, tok, split=None, seed=0,
                               options=LoaderOptions(batch_size=8))
    config = TrainConfig(max_steps=2, batch_size=8, progress=False, checkpoint_interval=None,
                         eval_interval=None, device="cpu", weight_decay=0.5)
    pretrain(model, train, None, config, objectives=("mlm",))
    assert torch.equal(model.bert.pooler.weight, pooler)  # not even weight decay touched it
    assert all(p.requires_grad for p in model.parameters())  # ready for fine-tuning


def test_a_recipe_record_reads_back_including_those_written_with_an_nsp_flag():
    for r in RECIPES.values():
        assert Recipe.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    legacy = {k: v for k, v in recipe("course").to_dict().items() if k != "objectives"}
    assert Recipe.from_dict({**legacy, "nsp": False}) == recipe("course")
    assert Recipe.from_dict({**legacy, "nsp": True}).objectives == ("mlm", "nsp")
