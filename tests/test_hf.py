"""bertlab.hf: number-for-number parity with transformers, export/import round trips, errors."""

import json
import subprocess
import sys
import warnings

import pytest
import torch

from bertlab.hf import (
    from_hf_state_dict,
    hf_config_fields,
    load_hf,
    load_hf_tokenizer,
    save_hf,
    to_hf_state_dict,
)
from bertlab.masking import IGNORE_INDEX
from bertlab.model import BertConfig, BertForPreTraining, BertForSequenceClassification
from bertlab.tokenizer import train_tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = [
    "The shares of the company rose sharply after the announcement.",
    "Markets fell in early trading, then recovered by the afternoon.",
    "The minister said the economy would grow faster next year.",
    "Players celebrated the win with their fans in the stadium.",
    "A new film about the history of jazz opened on Friday.",
] * 4


def hf_config(cfg: BertConfig, **extra):
    return transformers.BertConfig(**{**hf_config_fields(cfg), **extra})


def hf_twin(cfg: BertConfig, cls_name="BertForPreTraining", seed=0, **extra):
    """Return a seeded random transformers model and our copy of it (both in eval mode)."""
    torch.manual_seed(seed)  # transformers initialises from the global generator
    theirs = getattr(transformers, cls_name)(hf_config(cfg, **extra)).eval()
    task = "pretraining" if cls_name == "BertForPreTraining" else "classification"
    state, missing = from_hf_state_dict(theirs.state_dict(), cfg, task)
    assert missing == []
    ours = (BertForPreTraining(cfg) if task == "pretraining"
            else BertForSequenceClassification(cfg, extra.get("num_labels", 2)))
    ours.load_state_dict(state)
    return theirs, ours.eval()


def make_batch(cfg, B, T, lengths, seed=1, token_types=True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, cfg.vocab_size, (B, T), generator=g)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids[mask == 0] = cfg.pad_token_id
    types = ((torch.arange(T)[None, :] >= T // 2).long() * mask) if token_types else None
    labels = torch.full((B, T), IGNORE_INDEX)
    chosen = (torch.rand(B, T, generator=g) < 0.2) & mask.bool()
    chosen[:, 1] = True
    labels[chosen] = ids[chosen]
    nsp = torch.randint(0, 2, (B,), generator=g)
    batch = dict(input_ids=ids, attention_mask=mask, token_type_ids=types)
    return batch, labels, nsp


CONFIGS = [  # (config, batch size, length, lengths of the real tokens, token types?)
    (BertConfig(vocab_size=101, hidden_size=32, num_layers=2, num_heads=2), 2, 16, [16, 16], False),
    (BertConfig(vocab_size=120, hidden_size=48, num_layers=3, num_heads=4, intermediate_size=100),
     4, 20, [20, 13, 7, 3], True),
    (BertConfig(vocab_size=90, hidden_size=64, num_layers=1, num_heads=8, type_vocab_size=3,
                max_position_embeddings=40), 3, 40, [40, 25, 9], True),
]


@pytest.mark.parametrize("cfg, B, T, lengths, types", CONFIGS)
def test_pretraining_parity_outputs_losses_and_gradients(cfg, B, T, lengths, types):
    theirs, ours = hf_twin(cfg)
    batch, labels, nsp = make_batch(cfg, B, T, lengths, token_types=types)
    real = batch["attention_mask"].bool()

    h_theirs, h_ours = theirs.bert(**batch), ours.bert(**batch)
    diff = (h_theirs.last_hidden_state - h_ours.last_hidden_state)[real].abs().max()
    assert diff <= 1e-5
    torch.testing.assert_close(h_ours.pooler_output, h_theirs.pooler_output, atol=1e-5, rtol=0)

    out_theirs = theirs(**batch, labels=labels, next_sentence_label=nsp)
    out_ours = ours(**batch, labels=labels, next_sentence_label=nsp)
    targets = labels != IGNORE_INDEX
    torch.testing.assert_close(out_ours.target_logits, out_theirs.prediction_logits[targets],
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(out_ours.nsp_logits, out_theirs.seq_relationship_logits,
                               atol=1e-5, rtol=0)
    # 1e-6 absolute plus 1e-6 relative: a few float32 steps at a loss of ~5.
    torch.testing.assert_close(out_ours.loss, out_theirs.loss, atol=1e-6, rtol=1e-6)

    out_theirs.loss.backward()
    out_ours.loss.backward()
    our_grads = to_hf_state_dict({n: p.grad for n, p in ours.named_parameters()})
    their_grads = dict(theirs.named_parameters())  # tied decoder listed once, as ours
    assert set(our_grads) == set(their_grads)
    for name, p in their_grads.items():
        torch.testing.assert_close(our_grads[name], p.grad, atol=1e-5, rtol=0, msg=name)


def test_classification_parity():
    cfg = CONFIGS[1][0]
    theirs, ours = hf_twin(cfg, "BertForSequenceClassification", num_labels=3)
    batch, _, _ = make_batch(cfg, 4, 20, [20, 13, 7, 3])
    y = torch.tensor([0, 2, 1, 2])
    a, b = theirs(**batch, labels=y), ours(**batch, labels=y)
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(b.loss, a.loss, atol=1e-6, rtol=1e-6)
    a.loss.backward()
    b.loss.backward()
    our_grads = to_hf_state_dict({n: p.grad for n, p in ours.named_parameters()})
    for name, p in theirs.named_parameters():
        torch.testing.assert_close(our_grads[name], p.grad, atol=1e-5, rtol=0, msg=name)


# --- folders ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS, vocab_size=120, cache=False)


def test_save_hf_loads_in_transformers_with_the_same_outputs(tmp_path, tokenizer):
    cfg = BertConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=32, num_layers=2,
                     num_heads=4, max_position_embeddings=64)
    ours = BertForPreTraining(cfg, generator=torch.Generator().manual_seed(0)).eval()
    folder = save_hf(ours, tokenizer, tmp_path / "export")
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json",
        "tokenizer_config.json", "vocab.txt"]
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["hidden_act"] == "gelu"
    assert config["architectures"] == ["BertForPreTraining"]

    theirs = transformers.BertForPreTraining.from_pretrained(folder).eval()
    batch, labels, nsp = make_batch(cfg, 3, 12, [12, 8, 5])
    a = theirs(**batch, labels=labels, next_sentence_label=nsp)
    b = ours(**batch, labels=labels, next_sentence_label=nsp)
    torch.testing.assert_close(b.target_logits, a.prediction_logits[labels != IGNORE_INDEX],
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(b.loss, a.loss, atol=1e-6, rtol=1e-6)
    # The decoder came back tied to the word embeddings.
    assert theirs.cls.predictions.decoder.weight.data_ptr() == \
        theirs.bert.embeddings.word_embeddings.weight.data_ptr()

    # Their tokenizer, loaded from our files, cuts text exactly like ours.
    hf_tok = transformers.BertTokenizerFast.from_pretrained(folder)
    for a_text, b_text in [(TEXTS[0], None), (TEXTS[1], TEXTS[2]), ("Zebras café ÉLAN!", None)]:
        mine = tokenizer.encode(a_text, b_text)
        got = hf_tok(a_text, b_text)
        assert got["input_ids"] == mine.ids
        assert got["token_type_ids"] == mine.type_ids
    assert hf_tok.mask_token_id == tokenizer.token_to_id("[MASK]")
    assert hf_tok.pad_token_id == tokenizer.token_to_id("[PAD]")
    back = load_hf_tokenizer(folder)
    assert back.encode(TEXTS[3]).ids == tokenizer.encode(TEXTS[3]).ids
    (folder / "tokenizer.json").unlink()  # vocab.txt alone is enough
    assert load_hf_tokenizer(folder).encode(TEXTS[3]).ids == tokenizer.encode(TEXTS[3]).ids


def test_save_pretrained_loads_in_bertlab_with_the_same_outputs(tmp_path):
    cfg = CONFIGS[1][0]
    torch.manual_seed(0)
    theirs = transformers.BertForPreTraining(hf_config(cfg)).eval()
    theirs.save_pretrained(tmp_path / "hf")
    ours = load_hf(tmp_path / "hf")
    assert isinstance(ours, BertForPreTraining) and not ours.training
    assert ours.config == cfg
    batch, labels, nsp = make_batch(cfg, 4, 20, [20, 13, 7, 3])
    a = theirs(**batch, labels=labels, next_sentence_label=nsp)
    b = ours(**batch, labels=labels, next_sentence_label=nsp)
    torch.testing.assert_close(b.nsp_logits, a.seq_relationship_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(b.loss, a.loss, atol=1e-6, rtol=1e-6)
    # A checkpoint split into shards (model.safetensors.index.json) loads the same.
    theirs.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    sharded = load_hf(tmp_path / "sharded")
    assert all(torch.equal(x, y) for x, y in
               zip(ours.state_dict().values(), sharded.state_dict().values(), strict=True))


def test_classifier_round_trip_keeps_labels(tmp_path):
    cfg = BertConfig(vocab_size=60, hidden_size=32, num_layers=1, num_heads=2)
    ours = BertForSequenceClassification(cfg, num_labels=3).eval()
    save_hf(ours, None, tmp_path / "clf", label_names=["business", "sport", "tech"])
    theirs = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "clf").eval()
    assert theirs.config.id2label == {0: "business", 1: "sport", 2: "tech"}
    back = load_hf(tmp_path / "clf", task="classification")
    ids = torch.randint(5, 60, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(theirs(ids).logits, ours(ids).logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(back(ids).logits, ours(ids).logits, atol=0, rtol=0)
    # A pretraining export is a fine start for a classifier: new classifier, with a warning.
    save_hf(BertForPreTraining(cfg), None, tmp_path / "pre")
    with pytest.warns(UserWarning, match="classifier"):
        clf = load_hf(tmp_path / "pre", task="classification", num_labels=4)
    assert clf.classifier.out_features == 4


def test_bert_model_only_checkpoint_loads_with_fresh_heads(tmp_path):
    cfg = CONFIGS[0][0]
    torch.manual_seed(0)
    bare = transformers.BertModel(hf_config(cfg)).eval()
    bare.save_pretrained(tmp_path / "bare")
    with pytest.warns(UserWarning, match=r"mlm\.dense, mlm\.norm, nsp: they are freshly init"):
        ours = load_hf(tmp_path / "bare")
    ids = torch.randint(5, 101, (2, 8), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ours.bert(ids).last_hidden_state, bare(ids).last_hidden_state,
                               atol=1e-5, rtol=0)


def test_old_checkpoint_names_and_pickled_weights(tmp_path):
    cfg = CONFIGS[0][0]
    theirs, ours = hf_twin(cfg)
    old = {}
    for key, tensor in theirs.state_dict().items():
        key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                           "LayerNorm.beta")
        old[key] = tensor.clone()
    old["bert.embeddings.position_ids"] = torch.arange(cfg.max_position_embeddings)[None]
    folder = tmp_path / "old"
    folder.mkdir()
    torch.save(old, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(theirs.config.to_json_string())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every weight is there: no warning
        back = load_hf(folder)
    for (name, a), b in zip(ours.state_dict().items(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_hf(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="does not exist"):  # bad input, like every refusal
        load_hf(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_hf(tmp_path / "empty")
    cfg = BertConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=2)
    save_hf(BertForPreTraining(cfg), None, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["vocab_size"] = 60
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"bert\.embeddings\.word_embeddings\.weight.*\(50, 32\).*"
                                         r"\(60, 32\)"):
        load_hf(tmp_path / "m")
    config.update(vocab_size=50, hidden_act="relu")
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="hidden_act"):
        load_hf(tmp_path / "m")
    config.update(hidden_act="gelu")
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    (tmp_path / "m" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_hf(tmp_path / "m")


@pytest.mark.parametrize("text, message", [
    ('{"vocab_size": 50,\n "hidden_size": }', r"config\.json is not valid JSON \(Expecting value "
                                              r"at line 2, column 17\)"),
    ("[1, 2]", r"config\.json holds a JSON list, not an object"),
    ('{"vocab_size": 50, "num_hidden_layers": 1, "num_attention_heads": 2, '
     '"intermediate_size": 128}', r"config\.json lacks hidden_size"),
    ('{"vocab_size": 50, "hidden_size": 32, "num_hidden_layers": "one", '
     '"num_attention_heads": 2, "intermediate_size": 128}',
     r"config\.json: num_hidden_layers must be a whole number, got 'one'"),
    ('{"vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, '
     '"intermediate_size": 128, "layer_norm_eps": "small"}',
     r"config\.json: layer_norm_eps must be a number, got 'small'"),
    ('{"vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 3, '
     '"intermediate_size": 128}', r"config\.json: BertConfig: hidden_size=32 is not divisible"),
])
def test_a_broken_config_json_is_named_in_the_error(tmp_path, text, message):
    cfg = BertConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=2)
    folder = save_hf(BertForPreTraining(cfg), None, tmp_path / "m")
    (folder / "config.json").write_text(text)
    with pytest.raises(ValueError, match=message) as caught:
        load_hf(folder)
    assert str(folder / "config.json") in str(caught.value)


def test_save_hf_refuses_bad_targets_before_writing(tmp_path):
    cfg = BertConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=2)
    model = BertForPreTraining(cfg)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        save_hf(model, None, tmp_path / "file")
    with pytest.raises(ValueError, match=r"file is a file, not a folder; choose a path under"):
        save_hf(model, None, tmp_path / "file" / "hf")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="holds a pretraining run"):
        save_hf(model, None, tmp_path / "run")
    from tokenizers import Tokenizer, models

    small = Tokenizer(models.WordLevel({f"w{i}": i for i in range(40)}, unk_token="w0"))
    with pytest.raises(ValueError, match="tokenizer has 40 tokens but the model's vocab_size is 50"):
        save_hf(model, small, tmp_path / "hf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "run"]
    assert (tmp_path / "file").read_text() == "x"
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["checkpoints"]


def test_save_hf_replaces_an_export_but_not_other_folders(tmp_path):
    cfg = BertConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=2)
    first, second = BertForPreTraining(cfg), BertForPreTraining(cfg)
    save_hf(first, None, tmp_path / "out")
    save_hf(second, None, tmp_path / "out")
    back = load_hf(tmp_path / "out")
    assert torch.equal(back.nsp.weight, second.nsp.weight)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp folders left behind
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a model folder"):
        save_hf(first, None, tmp_path / "notes")
    assert (tmp_path / "notes" / "todo.txt").exists()


def test_an_export_is_readable_by_others_as_any_new_file_is(tmp_path):
    # A shared workshop machine: teammates must be able to read an export. Every file gets the
    # mode a new file gets here (0o666 less the umask), never the owner-only mode of a temp file.
    import os

    umask = os.umask(0o022)
    try:
        save_hf(BertForPreTraining(BertConfig(vocab_size=50, hidden_size=32, num_layers=1,
                                              num_heads=2)), None, tmp_path / "out")
    finally:
        os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "out").iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes


def test_bertlab_imports_and_exports_without_transformers(tmp_path):
    code = f"""
import sys
sys.modules["transformers"] = None  # any import of it now fails
import torch
from bertlab.model import BertConfig, BertForPreTraining
from bertlab.hf import save_hf
from bertlab.hf import load_hf
m = BertForPreTraining(BertConfig(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2))
save_hf(m, None, {str(tmp_path / "x")!r})
assert torch.equal(load_hf({str(tmp_path / "x")!r}).nsp.weight, m.nsp.weight)
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_two_configs_meet_in_one_mapping():
    from bertlab.hf import config_from_hf

    cfg = BertConfig(vocab_size=77, hidden_size=48, num_layers=3, num_heads=4, intermediate_size=96,
                     hidden_dropout=0.05, attention_dropout=0.2, layer_norm_eps=1e-7)
    theirs = transformers.BertConfig(**hf_config_fields(cfg))
    assert config_from_hf(theirs.to_dict()) == cfg  # and back, field for field
    assert theirs.hidden_act == "gelu"  # erf GELU, BERT's


# The NSP twins shipped with the course (benchmarks/twins.py --ship): transformers loads both, and
# its heads give bertlab's numbers, the NSP head included.
TWINS = ("course-nsp", "course-mlm")


@pytest.mark.parametrize("name", TWINS)
def test_the_shipped_twins_load_in_transformers_with_bertlabs_nsp_logits(name):
    from pathlib import Path

    from bertlab.loading import load_model

    transformers = pytest.importorskip("transformers")
    folder = Path(__file__).resolve().parents[1] / "models" / name
    manifest = json.loads((folder / "MANIFEST.json").read_text(encoding="utf-8"))
    assert manifest["objectives"] == (["mlm", "nsp"] if name == "course-nsp" else ["mlm"])
    assert manifest["device"] == "cpu" and manifest["steps"] == 10_000
    assert max(f.stat().st_size for f in folder.iterdir()) <= 16 * 2**20
    theirs = transformers.BertForPreTraining.from_pretrained(folder).eval()
    ours, tok = load_model(folder, require_tokenizer=True)
    pair = tok.encode("Shares rose sharply on Monday.", "Investors welcomed the [MASK] figures.")
    ids, segments = torch.tensor([pair.ids]), torch.tensor([pair.type_ids])
    with torch.no_grad():
        a = theirs(input_ids=ids, token_type_ids=segments)
        b = ours.eval()(ids, token_type_ids=segments)
    torch.testing.assert_close(b.nsp_logits, a.seq_relationship_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.mlm_logits, a.prediction_logits, atol=1e-4, rtol=1e-5)
