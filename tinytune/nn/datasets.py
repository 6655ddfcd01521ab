"""Datasets as Tensors, from local files only: MNIST and Fashion-MNIST from their IDX files, and scikit-learn's bundled digits."""
from __future__ import annotations

import gzip
import math
import os
import zlib
from pathlib import Path

import numpy as np

from tinytune.tensor import Tensor

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
# IDX element type codes -> numpy, big-endian as the format stores them
_IDX_TYPES = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
  """The array in an IDX file (gzipped when its name ends in .gz); ValueError for a file whose header and size do not agree."""
  path = Path(path)
  data = path.read_bytes()
  try: data = gzip.decompress(data) if path.suffix == ".gz" else data
  except (OSError, EOFError, zlib.error) as e: raise ValueError(f"{path}: not a whole gzip file ({e})") from None
  if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
    raise ValueError(f"{path}: not an IDX file (its magic number is {data[:4].hex() or 'missing'}, expected 0000 then a type code and a dim count)")
  dtype, ndim = np.dtype(_IDX_TYPES[data[2]]), data[3]
  if len(data) < 4 + 4 * ndim: raise ValueError(f"{path}: truncated IDX header ({len(data)} bytes for {ndim} dims)")
  shape = tuple(int(d) for d in np.frombuffer(data, ">u4", ndim, 4))
  if len(data) != (want := 4 + 4 * ndim + math.prod(shape) * dtype.itemsize):
    raise ValueError(f"{path}: {'truncated' if len(data) < want else 'trailing bytes'}: {len(data)} bytes where an IDX array of shape {shape} "
                     f"takes {want}")
  return np.frombuffer(data, dtype, offset=4 + 4 * ndim).reshape(shape).astype(dtype.newbyteorder("="))


def mnist(fashion: bool = False, path: str | os.PathLike | None = None, device: str | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
  """(X_train, Y_train, X_test, Y_test) of MNIST, or Fashion-MNIST, from the four standard IDX files (each gzipped or not) in `path`,
  by default ~/.cache/tinytune/mnist or ~/.cache/tinytune/fashion-mnist: uint8 images (N, 1, 28, 28) and uint8 labels (N,).
  Nothing is downloaded."""
  folder = Path(path).expanduser() if path is not None else Path.home() / ".cache" / "tinytune" / ("fashion-mnist" if fashion else "mnist")
  found = {name: next((p for p in (folder / name, folder / f"{name}.gz") if p.is_file()), None) for name in MNIST_FILES}
  if missing := [name for name, p in found.items() if p is None]:
    raise FileNotFoundError(f"{'Fashion-MNIST' if fashion else 'MNIST'} files missing: put {', '.join(missing)} (gzipped as .gz or not) in {folder}, "
                            "or pass path= to the folder that has them")
  arrays = [read_idx(p) for p in found.values() if p is not None]
  for (name, p), arr in zip(found.items(), arrays):
    want = (3, (28, 28)) if "images" in name else (1, ())
    if arr.dtype != np.uint8 or arr.ndim != want[0] or arr.shape[1:] != want[1]:
      what = "(N, 28, 28) images" if want[0] == 3 else "(N,) labels"
      raise ValueError(f"{p}: holds a {arr.dtype} array of shape {arr.shape}, not the uint8 {what}")
  for images, labels in ((0, 1), (2, 3)):
    if len(arrays[images]) != len(arrays[labels]):
      raise ValueError(f"{found[MNIST_FILES[images]]} has {len(arrays[images])} images but {found[MNIST_FILES[labels]]} {len(arrays[labels])} labels")
  x_train, y_train, x_test, y_test = arrays
  return (Tensor(x_train.reshape(-1, 1, 28, 28), device=device), Tensor(y_train, device=device),
          Tensor(x_test.reshape(-1, 1, 28, 28), device=device), Tensor(y_test, device=device))


def digits(test_fraction: float = 0.2, seed: int = 0, device: str | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
  """(X_train, Y_train, X_test, Y_test) of scikit-learn's bundled 8x8 digits (1797 images, no download): float32 images (N, 1, 8, 8)
  scaled to [0, 1] and uint8 labels (N,), split by a permutation drawn from `seed`, the same split every call."""
  try:
    from sklearn.datasets import load_digits
  except ImportError: raise ImportError('digits() needs scikit-learn: pip install "tinytune[data]"') from None
  if not 0 < test_fraction < 1: raise ValueError(f"test_fraction is in (0, 1), got {test_fraction}")
  data = load_digits()
  x, y = (data.images / 16).astype(np.float32).reshape(-1, 1, 8, 8), data.target.astype(np.uint8)
  order, n_test = np.random.default_rng(seed).permutation(len(x)), math.ceil(len(x) * test_fraction)
  test, train = order[:n_test], order[n_test:]
  return Tensor(x[train], device=device), Tensor(y[train], device=device), Tensor(x[test], device=device), Tensor(y[test], device=device)
