"""y = x @ W.T: nn.Linear's product, its weight (out_features, in_features) read transposed."""
from __future__ import annotations

from tinytune.kernels.workload import Workload, numbers, register

linear = register(Workload(
  "linear", "y = x @ w.T with x (m, k) and w (n, k), nn.Linear's weight layout", {"m": 64, "n": 1024, "k": 1024},
  inputs=lambda p: [(p["m"], p["k"]), (p["n"], p["k"])],
  build=lambda p, x, w: x @ w.T,
  reference=lambda p, x, w: x @ w.T,
  flops=lambda p: 2 * p["m"] * p["n"] * p["k"],
  output=lambda p: (p["m"], p["n"]),
  torch=lambda p, x, w: x @ w.T,
  takes=numbers,
  gpu={"m": 4096, "n": 4096, "k": 4096}))
