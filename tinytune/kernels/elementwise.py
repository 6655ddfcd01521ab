"""A chain of elementwise ops that fuses into one kernel (PyTorch runs one kernel per op)."""
from __future__ import annotations

from tinytune.kernels.workload import Workload, register

elementwise = register(Workload(
  "elementwise", "relu(a * b + c) * 0.5 - a over n elements: one fused kernel", {"n": 1 << 20},
  inputs=lambda p: [(p["n"],)] * 3,
  build=lambda p, a, b, c: (a * b + c).relu() * 0.5 - a,
  reference=lambda p, a, b, c: (a * b + c).clip(0, None) * 0.5 - a,
  flops=lambda p: 5 * p["n"],
  output=lambda p: (p["n"],),
  torch=lambda p, a, b, c: (a * b + c).relu() * 0.5 - a,
  gpu={"n": 1 << 26}))
