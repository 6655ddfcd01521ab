"""Softmax over the last axis."""
from __future__ import annotations

import numpy as np

from tinytune.kernels.workload import Params, Workload, register


def reference(p: Params, x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


softmax = register(Workload(
  "softmax", "softmax over the last axis of (rows, cols)", {"rows": 1024, "cols": 1024},
  inputs=lambda p: [(p["rows"], p["cols"])],
  build=lambda p, x: x.softmax(-1),
  reference=reference,
  flops=lambda p: 5 * p["rows"] * p["cols"],  # max, subtract, exp, sum, divide
  output=lambda p: (p["rows"], p["cols"]),
  torch=lambda p, x: x.softmax(-1),
  gpu={"rows": 8192, "cols": 8192}))
