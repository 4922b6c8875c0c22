"""bertlab.model (+ sizes, classifier): presets, counts, shapes, masking, the sparse MLM head, the loss."""

import dataclasses
import json

import pytest
import torch

from bertlab.counts import count_parameters, flops_per_token, parameter_table
from bertlab.masking import IGNORE_INDEX
from bertlab.model import BertConfig, BertForPreTraining, BertForSequenceClassification, BertModel

V = 97


def small_config(**overrides) -> BertConfig:
    settings = dict(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4,
                    max_position_embeddings=64)
    settings.update(overrides)
    return BertConfig(**settings)


def make_batch(B=3, T=12, seed=0, lengths=(12, 7, 4), target_share=0.3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids[mask == 0] = 0
    token_types = (torch.arange(T)[None, :] >= T // 2).long() * mask
    labels = torch.full((B, T), IGNORE_INDEX)
    chosen = (torch.rand(B, T, generator=g) < target_share) & mask.bool()
    chosen[0, 1] = True  # at least one target
    labels[chosen] = ids[chosen]
    nsp = torch.randint(0, 2, (B,), generator=g)
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=token_types, labels=labels,
                next_sentence_label=nsp)


def model_of(cls=BertForPreTraining, seed=0, num_labels=None, **overrides):
    extra = {} if num_labels is None else {"num_labels": num_labels}
    generator = torch.Generator().manual_seed(seed)
    return cls(small_config(**overrides), generator=generator, **extra).eval()


# --- config -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, layers, hidden, heads", [
    ("tiny", 2, 128, 2), ("mini", 4, 256, 4), ("small", 4, 512, 8), ("medium", 8, 512, 8),
    ("base", 12, 768, 12),
])
def test_presets_have_the_published_sizes(name, layers, hidden, heads):
    cfg = BertConfig.preset(name, vocab_size=8192)
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads) == (layers, hidden, heads)
    assert cfg.intermediate_size == 4 * hidden
    assert cfg.layer_norm_eps == 1e-12 and cfg.initializer_range == 0.02


def test_preset_overrides_and_json_round_trip():
    cfg = BertConfig.preset("tiny", vocab_size=500, hidden_dropout=0.0, max_position_embeddings=128)
    assert cfg.hidden_dropout == 0.0 and cfg.max_position_embeddings == 128
    assert BertConfig.preset("tiny", vocab_size=50, hidden_size=32).intermediate_size == 128
    assert BertConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="tiny, mini, small, medium, base"):
        BertConfig.preset("huge", vocab_size=100)


def test_bad_configs_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="not divisible by num_heads=3"):
        small_config(num_heads=3)
    with pytest.raises(ValueError, match="vocab_size"):
        small_config(vocab_size=0)
    with pytest.raises(ValueError, match="hidden_dropout"):
        small_config(hidden_dropout=1.0)
    with pytest.raises(ValueError, match="no setting"):
        BertConfig.from_dict({**small_config().to_dict(), "hidden_act": "relu"})


@pytest.mark.parametrize("name, value", [
    ("layer_norm_eps", 0.0), ("layer_norm_eps", -1e-12), ("layer_norm_eps", float("nan")),
    ("layer_norm_eps", float("inf")), ("initializer_range", -0.02),
    ("initializer_range", float("nan")), ("initializer_range", float("inf")),
])
def test_numerics_settings_must_be_finite_and_in_range(name, value):
    # eps <= 0 or NaN gave NaN logits; a NaN or negative init range, a traceback or NaN weights.
    with pytest.raises(ValueError, match=rf"BertConfig\.{name} must be a finite number"):
        small_config(**{name: value})
    assert small_config(initializer_range=0.0).initializer_range == 0.0


# --- counts -------------------------------------------------------------------------------------

def test_parameter_counts_from_config_match_the_model():
    cfg = small_config(intermediate_size=40)
    model = BertForPreTraining(cfg)
    counts = count_parameters(cfg)
    assert counts == count_parameters(model)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    # Embeddings: three tables + LayerNorm; the tied decoder adds nothing.
    assert counts["embeddings"] == (V + 64 + 2) * 32 + 2 * 32


def test_bert_base_has_110m_parameters():
    base = count_parameters(BertConfig.preset("base", vocab_size=30522))
    mlm_and_nsp = (768 * 768 + 768) + 2 * 768 + 30522 + (2 * 768 + 2)
    assert base["total"] - mlm_and_nsp == 109_482_240  # transformers' BertModel, bert-base-uncased
    assert base["encoder"] == 12 * 7_087_872
    rows = parameter_table(vocab_size=8192)
    assert [r["preset"] for r in rows] == ["tiny", "mini", "small", "medium", "base"]
    assert all(r["total"] == r["embeddings"] + r["encoder"] + r["heads"] for r in rows)


def test_flops_per_token_formula():
    cfg = BertConfig.preset("tiny", vocab_size=8192)
    d, L, seq = 128, 2, 128
    encoder = L * (12 * d * d + 13 * d)  # 4d^2 attention + 8d^2 feed-forward, biases, LayerNorms
    expected = 6 * encoder + 12 * L * d * seq + 6 * (d * d + d * 8192) * 0.15
    assert flops_per_token(cfg, seq_len=seq) == pytest.approx(expected)
    assert flops_per_token(cfg, seq, mlm_fraction=1.0) > flops_per_token(cfg, seq)


# --- the encoder --------------------------------------------------------------------------------

def test_init_follows_bert():
    model = BertForPreTraining(BertConfig.preset("mini", vocab_size=1000))
    qkv = model.bert.layers[0].attention.qkv
    assert abs(qkv.weight.std().item() - 0.02) < 0.001
    assert torch.all(qkv.bias == 0) and torch.all(model.mlm.bias == 0)
    assert torch.all(model.bert.layers[0].ffn_norm.weight == 1)
    # The padding row is an ordinary row, not zeros.
    assert model.bert.embeddings.word_embeddings.weight[0].abs().sum() > 0
    same = BertForPreTraining(small_config(), generator=torch.Generator().manual_seed(3))
    again = BertForPreTraining(small_config(), generator=torch.Generator().manual_seed(3))
    pairs = zip(same.parameters(), again.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_encoder_shapes_hidden_states_and_attentions():
    model = model_of(BertModel)
    batch = make_batch()
    out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                output_hidden_states=True, output_attentions=True)
    assert out.last_hidden_state.shape == (3, 12, 32)
    assert out.pooler_output.shape == (3, 32)
    assert len(out.hidden_states) == 3 and torch.equal(out.hidden_states[-1], out.last_hidden_state)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (3, 4, 12, 12)
    probs = out.attentions[1]
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 4, 12))
    assert torch.all(probs[2, :, :, 4:] == 0), "padded keys must get zero attention"
    # The explicit path (for pictures) and the SDPA path agree.
    fast = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    torch.testing.assert_close(fast.last_hidden_state, out.last_hidden_state, atol=1e-5, rtol=0)


def test_padding_does_not_change_real_tokens():
    model = model_of(BertModel)
    ids = torch.randint(5, V, (1, 6), generator=torch.Generator().manual_seed(1))
    alone = model(ids).last_hidden_state
    padded = torch.cat([ids, torch.zeros(1, 5, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 6), torch.zeros(1, 5)], dim=1).long()
    with_pad = model(padded, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(with_pad[:, :6], alone, atol=1e-5, rtol=0)
    # Without the mask the padding leaks in: the mask is what makes the two agree.
    assert not torch.allclose(model(padded).last_hidden_state[:, :6], alone, atol=1e-3)
    # An all-ones mask is the same as no mask.
    torch.testing.assert_close(model(ids, torch.ones_like(ids)).last_hidden_state, alone)


def test_dropout_only_in_training():
    model = model_of()
    batch = make_batch()
    a, b = model(**batch).loss, model(**batch).loss
    assert torch.equal(a, b)
    model.train()
    assert not torch.equal(model(**batch).loss, model(**batch).loss)


# --- pretraining heads --------------------------------------------------------------------------

def test_the_mlm_head_runs_at_the_targets_only_with_the_logits_it_would_give_everywhere():
    model = model_of()
    batch = make_batch()
    sparse = model(**batch)
    everywhere = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    targets = batch["labels"] != IGNORE_INDEX  # (B, T)
    assert everywhere.mlm_logits.shape == (3, 12, V) and everywhere.target_logits is None
    assert sparse.target_logits.shape == (int(targets.sum()), V) and sparse.mlm_logits is None
    # Without labels: the head at every position of the encoder's output.
    hidden = model.bert(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    torch.testing.assert_close(everywhere.mlm_logits, model.mlm_logits(hidden.last_hidden_state),
                               atol=1e-5, rtol=0)
    # With labels: those rows at the targets, in row-major order.
    torch.testing.assert_close(sparse.target_logits, everywhere.mlm_logits[targets], atol=1e-5,
                               rtol=0)
    torch.testing.assert_close(sparse.loss, sparse.mlm_loss + sparse.nsp_loss)
    assert all(f.name not in ("hidden_states", "attentions")
               for f in dataclasses.fields(sparse)), "one return shape per field, no extras"


def test_losses_present_only_with_their_labels():
    model = model_of()
    batch = make_batch()
    only_mlm = model(batch["input_ids"], labels=batch["labels"])
    assert only_mlm.nsp_loss is None and torch.equal(only_mlm.loss, only_mlm.mlm_loss)
    only_nsp = model(batch["input_ids"], next_sentence_label=batch["next_sentence_label"])
    assert only_nsp.mlm_loss is None and torch.equal(only_nsp.loss, only_nsp.nsp_loss)
    assert model(batch["input_ids"]).loss is None


def test_loss_sums_and_counts_behind_the_mean_losses():
    model = model_of().eval()
    batch = make_batch()
    out = model(**batch)
    sums = out.loss_sums
    assert int(sums["targets"]) == int((batch["labels"] != IGNORE_INDEX).sum())
    assert int(sums["sequences"]) == 3
    torch.testing.assert_close(out.mlm_loss, sums["mlm"] / sums["targets"], atol=0, rtol=0)
    torch.testing.assert_close(out.nsp_loss, sums["nsp"] / sums["sequences"], atol=0, rtol=0)
    # The same sum from the logits at every position, with every label (-100s add nothing).
    everywhere = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    full = torch.nn.functional.cross_entropy(everywhere.mlm_logits.flatten(0, 1),
                                             batch["labels"].flatten(), reduction="sum")
    torch.testing.assert_close(full, sums["mlm"], atol=1e-5, rtol=1e-6)
    assert model(batch["input_ids"]).loss_sums is None


def test_zero_targets_give_a_finite_loss_and_zero_mlm_gradient():
    model = model_of()
    batch = make_batch()
    batch["labels"] = torch.full_like(batch["labels"], IGNORE_INDEX)
    out = model(**batch)
    assert out.mlm_loss.item() == 0.0 and torch.isfinite(out.loss)
    out.loss.backward()
    assert torch.all(model.mlm.bias.grad == 0)
    assert model.nsp.weight.grad.abs().sum() > 0


def test_decoder_is_tied_to_the_word_embeddings():
    model = model_of()
    assert "mlm.decoder.weight" not in model.state_dict()
    model(**make_batch()).loss.backward()
    grad = model.bert.embeddings.word_embeddings.weight.grad
    # Rows of words that appear nowhere in the input still learn, through the decoder.
    assert grad[1].abs().sum() > 0


def test_a_few_steps_overfit_one_batch():
    model = model_of(hidden_dropout=0.0, attention_dropout=0.0).train()
    batch = make_batch()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = model(**batch).loss.item()
    for _ in range(25):
        opt.zero_grad()
        model(**batch).loss.backward()
        opt.step()
    assert model(**batch).loss.item() < 0.5 * first


def test_classification_head():
    model = model_of(BertForSequenceClassification, num_labels=3)
    batch = make_batch()
    out = model(batch["input_ids"], batch["attention_mask"], labels=torch.tensor([0, 2, 1]))
    assert out.logits.shape == (3, 3) and out.loss.ndim == 0
    expected = torch.nn.functional.cross_entropy(out.logits, torch.tensor([0, 2, 1]))
    torch.testing.assert_close(out.loss, expected)
    reg = model_of(BertForSequenceClassification, num_labels=1)
    assert reg(batch["input_ids"], labels=torch.tensor([0.5, 1.0, 2.0])).loss.ndim == 0
    with pytest.raises(ValueError, match="num_labels"):
        BertForSequenceClassification(small_config(), num_labels=0)


# --- bad input ------------------------------------------------------------------------------------

def test_bad_inputs_get_clear_errors():
    model = model_of()
    batch = make_batch()
    ids = batch["input_ids"]
    with pytest.raises(ValueError, match=r"input_ids must be \(batch, seq_len\)"):
        model(ids[0])
    with pytest.raises(ValueError, match="integer token ids"):
        model(ids.float())
    with pytest.raises(ValueError, match="attention_mask has shape"):
        model(ids, attention_mask=batch["attention_mask"][:, :5])
    with pytest.raises(ValueError, match="labels has shape"):
        model(ids, labels=batch["labels"][:2])
    with pytest.raises(ValueError, match="next_sentence_label must be"):
        model(ids, next_sentence_label=torch.tensor([0]))
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        model(torch.ones(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="no real token"):
        model(ids, attention_mask=torch.zeros_like(ids))


def test_the_textbook_forward_takes_the_five_inputs_a_reader_expects():
    import inspect

    assert list(inspect.signature(BertForPreTraining.forward).parameters) == [
        "self", "input_ids", "attention_mask", "token_type_ids", "labels", "next_sentence_label"]
