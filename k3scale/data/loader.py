"""Training and evaluation windows over one split's tokens (numpy only, no torch).

A split of n tokens holds `windows_per_epoch = (n - 1) // seq_len` windows: window k covers
tokens [k * seq_len, k * seq_len + seq_len + 1), inputs and shifted targets together. Windows
never leave their split (each split is its own shard). Training visits the windows of an epoch
in a seeded order; a run that needs more windows than an epoch starts the next epoch with a new
order, and `epoch_of` says which epoch a window belongs to.
"""

from __future__ import annotations

import hashlib

import numpy as np

from k3scale.data.dataset import PreparedDataset
from k3scale.errors import K3ScaleError

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser (Steele et al., 2014), vectorised over uint64: a fixed bijective hash.

    Used instead of a numpy RNG so the window order cannot change with the numpy version.
    """
    with np.errstate(over="ignore"):
        z = (values + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
        return z ^ (z >> np.uint64(31))


def window_order(num_windows: int, seed: int, epoch: int) -> np.ndarray:
    """The seeded permutation of window indices [0, num_windows) for one epoch."""
    key = np.uint64(
        int.from_bytes(hashlib.sha256(f"{seed}:{epoch}".encode()).digest()[:8], "little")
    )
    keys = _splitmix64(np.arange(num_windows, dtype=np.uint64) ^ key)
    return np.argsort(keys, kind="stable")


def count_windows(num_tokens: int, seq_len: int) -> int:
    """Windows of seq_len + 1 tokens at stride seq_len that fit in num_tokens."""
    return max(0, (num_tokens - 1) // seq_len)


class TrainWindows:
    """Deterministic, seekable random windows of one split.

    `batch(window_index, count)` returns the windows number window_index ... window_index +
    count - 1 of the run's stream, so a resumed run asks for the index it stopped at and gets
    exactly what an uninterrupted run would have seen.
    """

    def __init__(self, dataset: PreparedDataset, split: str = "train", *, seq_len: int, seed: int):
        if seq_len < 1:
            raise ValueError(f"seq_len: must be >= 1, got {seq_len}")
        self.tokens = dataset.split(split)
        self.seq_len = seq_len
        self.seed = seed
        self.windows_per_epoch = count_windows(self.tokens.size, seq_len)
        if self.windows_per_epoch == 0:
            raise K3ScaleError(
                f"load {split}: {self.tokens.size} tokens cannot fill one window of "
                f"{seq_len + 1}; lower data.seq_len or prepare more text"
            )
        self._orders: dict[int, np.ndarray] = {}

    @property
    def tokens_per_epoch(self) -> int:
        """Training tokens (targets) in one pass: windows_per_epoch * seq_len."""
        return self.windows_per_epoch * self.seq_len

    def epochs_seen(self, window_index: int) -> float:
        """Passes over the split after window_index windows (1.5 = one and a half epochs)."""
        return window_index / self.windows_per_epoch

    def epoch_of(self, window_index: int) -> int:
        """0-based epoch of the window_index-th window of the stream."""
        return window_index // self.windows_per_epoch

    def batch(self, window_index: int, count: int) -> np.ndarray:
        """Windows window_index ... window_index + count - 1: int64 [count, seq_len + 1]."""
        if window_index < 0 or count < 0:
            raise ValueError(f"window_index and count: must be >= 0, got {window_index}, {count}")
        indices = np.arange(window_index, window_index + count, dtype=np.int64)
        epochs = indices // self.windows_per_epoch
        starts = np.empty(count, dtype=np.int64)
        for epoch in np.unique(epochs):
            mask = epochs == epoch
            positions = indices[mask] - epoch * self.windows_per_epoch
            starts[mask] = self._order(int(epoch))[positions] * self.seq_len
        return _gather(self.tokens, starts, self.seq_len + 1)

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            # Keep the current and next epoch only: a run moves forward through epochs.
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = window_order(self.windows_per_epoch, self.seed, epoch)
        return self._orders[epoch]


def eval_windows(dataset: PreparedDataset, split: str, seq_len: int, num_tokens: int) -> np.ndarray:
    """Fixed evaluation windows, identical for every run: int64 [n, seq_len + 1].

    n = min(num_tokens // seq_len, windows in the split), at least 1; the windows are spread
    evenly over the whole split (no seed), so every run evaluates on the same tokens.
    """
    tokens = dataset.split(split)
    available = count_windows(tokens.size, seq_len)
    if available == 0:
        raise K3ScaleError(
            f"eval {split}: {tokens.size} tokens cannot fill one window of {seq_len + 1}; "
            "lower data.seq_len or prepare more text"
        )
    n = min(max(1, num_tokens // seq_len), available)
    chosen = (np.arange(n, dtype=np.int64) * available) // n
    return _gather(tokens, chosen * seq_len, seq_len + 1)


def _gather(tokens: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """Rows tokens[start : start + length] as int64 [len(starts), length] (reads only those pages)."""
    index = starts[:, None] + np.arange(length, dtype=np.int64)[None, :]
    return np.asarray(tokens[index], dtype=np.int64)
