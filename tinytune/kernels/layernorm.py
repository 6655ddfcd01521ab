"""Layer normalization over the last axis, with weight and bias."""
from __future__ import annotations

from typing import Any

import numpy as np

from tinytune.kernels.workload import Params, Workload, register

EPS = 1e-5


def reference(p: Params, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
  return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + EPS) * w + b


def _torch(p: Params, x: Any, w: Any, b: Any) -> Any:
  import torch.nn.functional as F
  return F.layer_norm(x, (p["cols"],), w, b, EPS)


layernorm = register(Workload(
  "layernorm", "layer norm over the last axis of (rows, cols), then * weight + bias", {"rows": 1024, "cols": 1024},
  inputs=lambda p: [(p["rows"], p["cols"]), (p["cols"],), (p["cols"],)],
  build=lambda p, x, w, b: x.layernorm(-1, EPS, w, b),
  reference=reference,
  flops=lambda p: 8 * p["rows"] * p["cols"],  # mean, subtract, square, mean, scale, weight, bias
  output=lambda p: (p["rows"], p["cols"]),
  torch=_torch,
  gpu={"rows": 8192, "cols": 8192}))
