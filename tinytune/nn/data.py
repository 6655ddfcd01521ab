"""Batches of in-memory data as Tensors, in a fresh random order each epoch."""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from tinytune.dtype import dtypes
from tinytune.tensor import Tensor


class DataLoader:
  """Batches of `batch_size` rows of each array (numpy arrays or Tensors, all of one length), as a tuple of Tensors on `device`.
  Each epoch (each `iter()`) takes the rows in a fresh permutation, so every row comes exactly once per epoch; `seed` makes the
  permutations the same run to run. The last batch is smaller unless drop_last, which a TinyJit step needs: its inputs keep one shape.
  The data stays in host memory; a batch is gathered into a reused array and copied to the device in one go."""

  def __init__(self, *arrays: Any, batch_size: int, shuffle: bool = True, drop_last: bool = False, seed: int | None = None,
               device: str | None = None):
    if not arrays: raise ValueError("DataLoader needs at least one array")
    if not isinstance(batch_size, int) or batch_size < 1: raise ValueError(f"batch_size is a positive int, got {batch_size!r}")
    if device is None: device = next((a.device for a in arrays if isinstance(a, Tensor)), None)
    self.arrays = [_host(a) for a in arrays]
    if any(a.ndim == 0 for a in self.arrays): raise ValueError("DataLoader arrays need a first dim to batch along, got a 0-d array")
    if len({len(a) for a in self.arrays}) != 1: raise ValueError(f"DataLoader arrays differ in length: {[len(a) for a in self.arrays]}")
    self.batch_size, self.shuffle, self.drop_last, self.device = batch_size, shuffle, drop_last, device
    self.rng = np.random.default_rng(seed)
    self.scratch = [np.empty((batch_size, *a.shape[1:]), a.dtype) for a in self.arrays]  # reused: Tensor() copies out of it

  @property
  def samples(self) -> int: return len(self.arrays[0])

  def __len__(self) -> int: return self.samples // self.batch_size if self.drop_last else -(-self.samples // self.batch_size)

  def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
    order = self.rng.permutation(self.samples) if self.shuffle else np.arange(self.samples)
    for start in range(0, len(self) * self.batch_size, self.batch_size):
      rows = order[start:start + self.batch_size]  # in range: mode="clip" only spares np.take its buffered bounds check
      yield tuple(Tensor(np.take(a, rows, axis=0, out=s[:len(rows)], mode="clip"), device=self.device) for a, s in zip(self.arrays, self.scratch))

  def __repr__(self) -> str:
    return f"<DataLoader {self.samples} samples in {len(self)} batches of {self.batch_size}{', shuffled' if self.shuffle else ''}>"


def _host(a: Any) -> np.ndarray:
  """`a` as a contiguous numpy array already in the dtype its batches' Tensors take, so a batch converts nothing."""
  arr = a.numpy() if isinstance(a, Tensor) else np.asarray(a)
  return np.asarray(arr, dtypes.from_any(arr.dtype).np, order="C")
