"""Print SHA-256 digests of what training computes: masks, batches and optimizer steps.

A change that should not move a single number (moving code between modules, renaming) runs this
before and after and compares the lines; any line that differs names the stage that moved.

- masks: `mask_tokens` on a fixed batch, four seeds, with and without whole-word masking;
- batches: the first 12 batches of `pretraining_loader` (NSP, SOP and single segments, the
  course corpus and tokenizer), every tensor;
- steps: 6 optimizer steps of a tiny BERT through `pretrain` with gradient accumulation 2, for
  AdamW, Muon with Newton-Schulz in fp32 and in bf16: every weight after the last step, and the
  history rows.

Usage: python tools/digest.py      (one thread; about a minute on a laptop)
"""

from __future__ import annotations

import hashlib
import itertools
import json
import tempfile

import torch

import bertlab as bl
from bertlab.data import LoaderOptions


def digest_tensors(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(str((t.dtype, tuple(t.shape))).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def masks(tok) -> dict[str, str]:
    ids = torch.randint(5, tok.get_vocab_size(), (8, 48), generator=torch.Generator().manual_seed(1))
    out = {}
    for seed in range(4):
        for whole_word in (False, True):
            words = [[i // 2 for i in range(48)] for _ in range(8)] if whole_word else None
            got = bl.mask_tokens(ids, tok, generator=torch.Generator().manual_seed(seed),
                                 word_ids=words)
            out[f"mask seed={seed} whole_word={whole_word}"] = digest_tensors(*got)
    return out


def batches(docs, tok) -> dict[str, str]:
    out = {}
    for pairs in ("nsp", "sop", "single"):
        loader = bl.pretraining_loader(docs, tok, seed=3, options=LoaderOptions(
            pairs=pairs, max_seq_len=64, batch_size=8, whole_word=True))
        tensors = [t for b in itertools.islice(loader, 12) for t in b.values()]
        out[f"batches {pairs}"] = digest_tensors(*tensors)
    return out


def steps(docs, tok) -> dict[str, str]:
    out = {}
    for optimizer, newton_schulz in (("adamw", "auto"), ("muon", "fp32"), ("muon", "bf16")):
        torch.manual_seed(0)
        config = bl.BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, num_layers=2,
                               num_heads=2, intermediate_size=128, max_position_embeddings=64)
        model = bl.BertForPreTraining(config)
        options = LoaderOptions(max_seq_len=64, batch_size=4)  # 8 per step in 2 pieces
        train = bl.pretraining_loader(docs, tok, seed=0, options=options)
        val = bl.pretraining_loader(docs, tok, split="validation", seed=0, options=options)
        run = bl.TrainConfig(max_steps=6, batch_size=8, grad_accum=2, warmup_steps=2,
                             optimizer=optimizer, newton_schulz=newton_schulz, eval_interval=3,
                             eval_batches=2, checkpoint_interval=None, device="cpu",
                             precision="fp32", progress=False, log_interval=0)
        with tempfile.TemporaryDirectory() as folder:
            result = bl.pretrain(model, train, val, run, out_dir=folder)
        weights = digest_tensors(*(p for _, p in sorted(model.state_dict().items())))
        history = hashlib.sha256(json.dumps(
            [{k: v for k, v in row.items() if not k.endswith("_s") and k != "elapsed"}
             for row in result.history], sort_keys=True, default=str).encode()).hexdigest()[:16]
        out[f"steps {optimizer} newton_schulz={newton_schulz}"] = f"{weights} history {history}"
    return out


def main() -> None:
    torch.set_num_threads(1)
    docs = bl.load_corpus("bbc")[:120]
    tok = bl.train_tokenizer(docs, vocab_size=2000, cache=False)
    for name, value in {**masks(tok), **batches(docs, tok), **steps(docs, tok)}.items():
        print(f"{name:40s} {value}")


if __name__ == "__main__":
    main()
