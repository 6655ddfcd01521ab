"""Two linear layers with a ReLU between them: a workload of several kernels."""
from __future__ import annotations

from typing import Any

import numpy as np

from tinytune.kernels.workload import Params, Workload, register


def _torch(p: Params, x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
  import torch
  return torch.relu(x @ w1 + b1) @ w2 + b2


mlp = register(Workload(
  "mlp", "relu(x @ w1 + b1) @ w2 + b2 with x (batch, din), w1 (din, hidden), w2 (hidden, dout)",
  {"batch": 64, "din": 512, "hidden": 1024, "dout": 512},
  inputs=lambda p: [(p["batch"], p["din"]), (p["din"], p["hidden"]), (p["hidden"],), (p["hidden"], p["dout"]), (p["dout"],)],
  build=lambda p, x, w1, b1, w2, b2: (x @ w1 + b1).relu() @ w2 + b2,
  reference=lambda p, x, w1, b1, w2, b2: np.maximum(x @ w1 + b1, 0) @ w2 + b2,
  flops=lambda p: 2 * p["batch"] * (p["din"] * p["hidden"] + p["hidden"] * p["dout"]) + 2 * p["batch"] * p["hidden"] + p["batch"] * p["dout"],
  output=lambda p: (p["batch"], p["dout"]),
  torch=_torch,
  gpu={"batch": 4096, "din": 1024, "hidden": 4096, "dout": 1024}))
