"""Scaled dot-product attention, optionally causal."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from tinytune.kernels.workload import Params, Workload, register
from tinytune.tensor import Tensor


def build(p: Params, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
  return q.scaled_dot_product_attention(k, v, is_causal=bool(p["causal"]))


def reference(p: Params, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
  scores = q @ k.swapaxes(-1, -2) / np.float32(math.sqrt(p["dim"]))
  if p["causal"]: scores = np.where(np.triu(np.ones((p["seq"],) * 2, bool), 1), -np.inf, scores)
  e = np.exp(scores - scores.max(-1, keepdims=True))
  return (e / e.sum(-1, keepdims=True)) @ v


def _torch(p: Params, q: Any, k: Any, v: Any) -> Any:
  import torch.nn.functional as F
  return F.scaled_dot_product_attention(q, k, v, is_causal=bool(p["causal"]))


def flops(p: Params) -> int:
  b, s, d = p["batch"] * p["heads"], p["seq"], p["dim"]
  return b * (4 * s * s * d + 5 * s * s)  # two matmuls and a softmax


attention = register(Workload(
  "attention", "softmax(Q K^T / sqrt(dim)) V with Q, K, V (batch, heads, seq, dim)", {"batch": 1, "heads": 4, "seq": 256, "dim": 64, "causal": 0},
  inputs=lambda p: [(p["batch"], p["heads"], p["seq"], p["dim"])] * 3,
  build=build,
  reference=reference,
  flops=flops,
  output=lambda p: (p["batch"], p["heads"], p["seq"], p["dim"]),
  torch=_torch,
  help={"causal": "1 masks out later positions"},
  may_be_zero=("causal",),
  gpu={"batch": 4, "heads": 16, "seq": 1024, "dim": 64}))
