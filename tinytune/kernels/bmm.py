"""A batch of independent matmuls."""
from __future__ import annotations

from tinytune.kernels.workload import Workload, numbers, register

bmm = register(Workload(
  "bmm", "C[i] = A[i] @ B[i] with A (batch, m, k) and B (batch, k, n)", {"batch": 8, "m": 128, "n": 128, "k": 128},
  inputs=lambda p: [(p["batch"], p["m"], p["k"]), (p["batch"], p["k"], p["n"])],
  build=lambda p, a, b: a @ b,
  reference=lambda p, a, b: a @ b,
  flops=lambda p: 2 * p["batch"] * p["m"] * p["n"] * p["k"],
  output=lambda p: (p["batch"], p["m"], p["n"]),
  torch=lambda p, a, b: a @ b,
  takes=numbers,
  gpu={"batch": 32, "m": 512, "n": 512, "k": 512}))
