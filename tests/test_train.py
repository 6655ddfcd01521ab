"""Training end to end: scikit-learn's digits (real data, no download) with an MLP, Adam, the DataLoader and TinyJit reaches
95% held-out accuracy within a CI time budget."""
from __future__ import annotations

import time

import pytest

from tinytune import Tensor, TinyJit, dtypes
from tinytune.nn import DataLoader, datasets, optim
from tinytune.runtime import Device

pytest.importorskip("sklearn", reason='the digits dataset comes with scikit-learn: pip install "tinytune[data]"')


def test_digits_mlp_reaches_95_percent() -> None:
  if Device[Device.DEFAULT].emulated: pytest.skip(f"{Device.DEFAULT} emulates in NumPy: its 25 epochs take minutes (EMU 14), past this test's 30 s")
  st = time.perf_counter()
  X_train, Y_train, X_test, Y_test = datasets.digits()
  Tensor.manual_seed(0)
  w1, b1 = Tensor.uniform(64, 128, low=-0.125, high=0.125).requires_grad_(), Tensor.zeros(128).contiguous().requires_grad_()
  w2, b2 = Tensor.uniform(128, 10, low=-0.09, high=0.09).requires_grad_(), Tensor.zeros(10).contiguous().requires_grad_()
  opt = optim.Adam([w1, b1, w2, b2], lr=3e-3)
  classes = Tensor.arange(10)

  def forward(x: Tensor) -> Tensor: return (x.flatten(1) @ w1 + b1).relu() @ w2 + b2

  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = -(forward(x).log_softmax(-1) * (y.cast(dtypes.int32).unsqueeze(-1) == classes).cast(dtypes.float32)).sum(-1).mean()
    loss.backward()
    return loss.realize(*opt.schedule_step())

  loader = DataLoader(X_train, Y_train, batch_size=64, drop_last=True, seed=0)
  losses = [step(x, y).item() for _ in range(25) for x, y in loader]
  accuracy = (forward(X_test).argmax(-1) == Y_test.cast(dtypes.int64)).mean().item()
  assert losses[-1] < losses[0] / 5, losses[::50]
  assert accuracy >= 0.95, f"held-out accuracy {accuracy:.3f}"
  assert time.perf_counter() - st < 30
