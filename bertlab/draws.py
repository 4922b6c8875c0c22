"""Counter-based random draws for masking: splitmix64 hashes of (row seed, position, kind of draw).

A row's draws depend only on its seed, never on which batch, worker, process or device the row
lands in, so masks are reproducible however the data is split. `example_seed` builds the row
seeds; `Draws` hands `mask_tokens` its random numbers, from a `torch.Generator` or from the hash.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

# splitmix64 (Steele, Lea & Flood 2014) turns a counter into 64 well-mixed bits. Multiplication on
# int64 tensors wraps modulo 2**64, which is exactly the arithmetic the mix needs; right shifts on
# signed tensors are arithmetic, so each shift is masked to behave as a logical one.

_MASK64 = (1 << 64) - 1


def _signed64(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


_GAMMA = _signed64(0x9E3779B97F4A7C15)  # splitmix64's counter increment (golden ratio)
_MIX1 = _signed64(0xBF58476D1CE4E5B9)
_MIX2 = _signed64(0x94D049BB133111EB)
_LOW53 = (1 << 53) - 1
_LOW32 = (1 << 32) - 1
_KIND_BITS = 3  # each position owns 2**3 stream slots: up to 8 independent kinds of draw


def _mix_tensor(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ ((z >> 30) & ((1 << 34) - 1))) * _MIX1
    z = (z ^ ((z >> 27) & ((1 << 37) - 1))) * _MIX2
    return z ^ ((z >> 31) & ((1 << 33) - 1))


def _mix_int(z: int) -> int:
    z &= _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return _signed64(z ^ (z >> 31))


def _mix_numpy(z: np.ndarray) -> np.ndarray:
    # The same splitmix64 finalizer on uint64 arrays, whose shifts are logical and whose products
    # wrap: fewer and cheaper steps than on int64 tensors, the same numbers.
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def example_seed(seed: int, epoch_or_dupe: int, index: int | torch.Tensor) -> int | torch.Tensor:
    """Return the row seed of example `index` for pass `epoch_or_dupe` of a run seeded with `seed`.

    Pass the result as `mask_tokens(..., row_seeds=...)`. Dynamic masking (RoBERTa): use the epoch,
    so every epoch gets a fresh mask, identical on any number of processes or workers. Static
    masking with a dupe factor (Google's `create_pretraining_data.py`): use the copy number
    0..dupe_factor-1 and keep it fixed across epochs. `index` may be an int (returns an int) or a
    LongTensor of indices (returns a LongTensor of seeds, same values). Seeds are non-negative.

    Taught in notebooks/02_masked_lm.ipynb.
    """
    # Chained splitmix64 steps: each input moves the state along the golden-ratio counter.
    inner = _mix_int(_mix_int(seed * _GAMMA + _GAMMA) + (epoch_or_dupe + 1) * _GAMMA)
    if isinstance(index, torch.Tensor):
        if index.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"example_seed: index has dtype {index.dtype}; pass integer indices")
        return _mix_tensor(inner + (index.long() + 1) * _GAMMA) & ((1 << 63) - 1)
    return _mix_int(inner + (index + 1) * _GAMMA) & ((1 << 63) - 1)


class Draws:
    """The random numbers of one `mask_tokens` call: from a generator, or hashed from row seeds.

    Keys are uniforms in [0, 1): float32 from the generator, or 53-bit integers k (standing for
    k / 2**53) from the hash, compared with thresholds in their own units. In hash mode, draw
    `kind` (0..7) at index j of row i is output number j * 8 + kind + 1 of the splitmix64 stream
    that starts at row i's mixed seed. On the CPU the hash runs on numpy uint64 arrays (about
    three times cheaper per step at batch sizes); on other devices on int64 tensors (same numbers).
    """

    def __init__(self, generator: torch.Generator | None, row_seeds: torch.Tensor | None,
                 device: torch.device, use_numpy: bool | None = None) -> None:
        self.generator, self.device = generator, device
        self.hashed = row_seeds is not None
        self.last = 1 << 62 if self.hashed else 2.0  # sorts after every key
        self.numpy = device.type == "cpu" if use_numpy is None else use_numpy
        self._starts: dict[int, Any] = {}
        if self.hashed:
            if self.numpy:
                self.state = _mix_numpy(row_seeds.cpu().contiguous().numpy().view(np.uint64))
            else:
                self.state = _mix_tensor(row_seeds)  # (B,)

    def _start(self, length: int) -> Any:
        """Stream position of kind 0 at every (row, index), shape (B, L)."""
        if length not in self._starts:
            if self.numpy:
                index = np.arange(length, dtype=np.uint64)
                offset = ((index << np.uint64(_KIND_BITS)) + np.uint64(1)) * np.uint64(_GAMMA & _MASK64)
            else:
                index = torch.arange(length, device=self.device)
                offset = ((index << _KIND_BITS) + 1) * _GAMMA  # (L,)
            self._starts[length] = self.state[:, None] + offset[None, :]  # (B, 1) + (1, L)
        return self._starts[length]

    def _hash(self, kind: int, length: int, flat: torch.Tensor | None = None) -> Any:
        """64 hashed bits at every (row, index) of (B, L), or at the listed flat positions only."""
        start = self._start(length)
        if self.numpy:
            if flat is not None:
                start = start.reshape(-1)[flat.cpu().numpy()]
            return _mix_numpy(start + np.uint64((kind * _GAMMA) & _MASK64))
        if flat is not None:
            start = start.take(flat)
        return _mix_tensor(start + _signed64(kind * _GAMMA))

    def grid(self, kind: int, batch: int, length: int) -> torch.Tensor:
        """Keys for every (row, index), shape (B, L)."""
        if not self.hashed:
            return torch.rand((batch, length), generator=self.generator, device=self.device)
        z = self._hash(kind, length)
        if self.numpy:
            return torch.from_numpy((z >> np.uint64(11)).view(np.int64)).to(self.device)
        return (z >> 11) & _LOW53

    def below(self, keys: torch.Tensor, probability: float) -> torch.Tensor:
        """Where a key, read as a uniform in [0, 1), is below `probability`."""
        if keys.is_floating_point():
            return keys < probability
        return keys < math.ceil(probability * (1 << 53))  # exact: scaling by 2**53 loses nothing

    def uniform(self, keys: torch.Tensor) -> torch.Tensor:
        """The keys as float64 uniforms in [0, 1)."""
        if keys.is_floating_point():
            return keys.double()
        return keys.double() * (1.0 / (1 << 53))

    def at(self, kind: int, flat: torch.Tensor, length: int,
           n: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A uniform in [0, 1) and an integer in [0, n) at each listed flat position of (B, L).

        Both come from one 64-bit hash: the uniform from its high 32 bits, the integer from
        its low 32 bits by multiply-shift (off from uniform by at most n / 2**32 per value).
        """
        if not self.hashed:
            u = torch.rand(flat.shape, generator=self.generator, device=self.device)
            if n is None:
                return u, None
            return u, torch.randint(n, flat.shape, generator=self.generator, device=self.device)
        z = self._hash(kind, length, flat)  # (k,)
        if self.numpy:
            u = torch.from_numpy((z >> np.uint64(32)).astype(np.float64) * (1.0 / (1 << 32)))
            if n is None:
                return u.to(self.device), None
            pick = ((z & np.uint64(_LOW32)) * np.uint64(n)) >> np.uint64(32)
            return u.to(self.device), torch.from_numpy(pick.view(np.int64)).to(self.device)
        u = ((z >> 32) & _LOW32).double() * (1.0 / (1 << 32))
        return u, None if n is None else ((z & _LOW32) * n) >> 32
