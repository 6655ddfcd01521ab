"""C = A @ B."""
from __future__ import annotations

from tinytune.kernels.workload import Workload, numbers, register

matmul = register(Workload(
  "matmul", "C = A @ B with A (m, k) and B (k, n)", {"m": 512, "n": 512, "k": 512},
  inputs=lambda p: [(p["m"], p["k"]), (p["k"], p["n"])],
  build=lambda p, a, b: a @ b,
  reference=lambda p, a, b: a @ b,
  flops=lambda p: 2 * p["m"] * p["n"] * p["k"],
  output=lambda p: (p["m"], p["n"]),
  torch=lambda p, a, b: a @ b,
  takes=numbers,
  gpu={"m": 4096, "n": 4096, "k": 4096}))
