"""The workload catalog: named tensor programs with parameters, FLOP counts and NumPy references."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tinytune.dtype import DType, dtypes
from tinytune.tensor import Tensor


@dataclass(frozen=True)
class Workload:
  name: str
  doc: str
  defaults: dict[str, int]
  inputs: Callable[[dict[str, int]], list[tuple[int, ...]]]  # input shapes
  build: Callable[..., Tensor]  # (params, *input tensors) -> output tensor, lazily
  reference: Callable[..., np.ndarray]  # (params, *input arrays) -> output array
  flops: Callable[[dict[str, int]], int]

  def params(self, overrides: dict[str, int]) -> dict[str, int]:
    if unknown := sorted(set(overrides) - set(self.defaults)):
      known = ", ".join(f"{k}={v}" for k, v in self.defaults.items())
      raise ValueError(f"{self.name} has no parameter {', '.join(unknown)}; its parameters (with defaults): {known}")
    if bad := [k for k, v in overrides.items() if v < 0]: raise ValueError(f"{self.name} parameters are non-negative integers: {', '.join(bad)}")
    return {**self.defaults, **overrides}

  def instantiate(self, params: dict[str, int], dtype: DType = dtypes.float32, device: str | None = None,
                  seed: int = 0) -> tuple[Tensor, list[np.ndarray]]:
    """Random inputs (realized) and the lazy output tensor."""
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(shape).astype(dtype.np) for shape in self.inputs(params)]
    return self.build(params, *[Tensor(a, dtype=dtype, device=device) for a in arrays]), arrays


def _conv_out(p: dict[str, int]) -> tuple[int, int]:
  return ((p["size"] + 2 * p["padding"] - p["kernel"]) // p["stride"] + 1,) * 2  # type: ignore[return-value]


def _conv_ref(p: dict[str, int], x: np.ndarray, w: np.ndarray) -> np.ndarray:
  k, s, pad = p["kernel"], p["stride"], p["padding"]
  xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  oh, ow = _conv_out(p)
  win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::s, ::s][:, :, :oh, :ow]
  return np.einsum("nchwij,ocij->nohw", win, w, optimize=True)


def _softmax_ref(p: dict[str, int], x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
  Workload("matmul", "C = A @ B with A (m, k) and B (k, n)", {"m": 512, "n": 512, "k": 512},
           lambda p: [(p["m"], p["k"]), (p["k"], p["n"])], lambda p, a, b: a @ b, lambda p, a, b: a @ b,
           lambda p: 2 * p["m"] * p["n"] * p["k"]),
  Workload("conv2d", "2-d convolution, NCHW input (batch, cin, size, size) and (cout, cin, kernel, kernel) weights",
           {"batch": 4, "cin": 32, "cout": 32, "size": 32, "kernel": 3, "stride": 1, "padding": 1},
           lambda p: [(p["batch"], p["cin"], p["size"], p["size"]), (p["cout"], p["cin"], p["kernel"], p["kernel"])],
           lambda p, x, w: x.conv2d(w, stride=p["stride"], padding=p["padding"]), _conv_ref,
           lambda p: 2 * p["batch"] * p["cout"] * p["cin"] * p["kernel"] ** 2 * _conv_out(p)[0] * _conv_out(p)[1]),
  Workload("softmax", "softmax over the last axis of (rows, cols)", {"rows": 1024, "cols": 1024},
           lambda p: [(p["rows"], p["cols"])], lambda p, x: x.softmax(-1), _softmax_ref, lambda p: 5 * p["rows"] * p["cols"]),
  Workload("reduce", "sum over one axis of (rows, cols)", {"rows": 1024, "cols": 1024, "axis": 1},
           lambda p: [(p["rows"], p["cols"])], lambda p, x: x.sum(p["axis"]), lambda p, x: x.sum(p["axis"]), lambda p: p["rows"] * p["cols"]),
]}


def get_workload(name: str) -> Workload:
  if name not in WORKLOADS: raise ValueError(f"unknown workload {name!r}; available: {', '.join(WORKLOADS)}")
  return WORKLOADS[name]
