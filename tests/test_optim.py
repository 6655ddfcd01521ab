"""Optimizers against torch.optim (LAMB and LARS against their formulas in NumPy), in-place assign, and a whole training step
under TinyJit giving the same losses as without it."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from tinytune import Tensor, TinyJit
from tinytune.nn import optim

torch = pytest.importorskip("torch", reason="the optimizer tests compare with torch.optim: pip install torch")

SHAPES = [(5, 4), (4,)]


def run_tinytune(make: Callable[[list[Tensor]], optim.Optimizer], init: list[np.ndarray], steps: int) -> list[np.ndarray]:
  params = [Tensor(x, requires_grad=True) for x in init]
  opt = make(params)
  target = Tensor(np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4))
  for _ in range(steps):
    opt.zero_grad()
    ((params[0] * params[1] - target).square().sum() + params[1].sum() * 0.5).backward()
    opt.step()
  return [p.numpy() for p in params]


def run_torch(make: Callable[[list[Any]], Any], init: list[np.ndarray], steps: int) -> list[np.ndarray]:
  params = [torch.tensor(x, requires_grad=True) for x in init]
  opt = make(params)
  target = torch.linspace(-1, 1, 20).reshape(5, 4)
  for _ in range(steps):
    opt.zero_grad()
    ((params[0] * params[1] - target).square().sum() + params[1].sum() * 0.5).backward()
    opt.step()
  return [p.detach().numpy() for p in params]


@pytest.mark.parametrize("ours, theirs", [
  (lambda ps: optim.SGD(ps, lr=0.01), lambda ps: torch.optim.SGD(ps, lr=0.01)),
  (lambda ps: optim.SGD(ps, lr=0.01, momentum=0.9), lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9)),
  (lambda ps: optim.SGD(ps, lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.1),
   lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.1)),
  (lambda ps: optim.Adam(ps, lr=0.01), lambda ps: torch.optim.Adam(ps, lr=0.01)),
  (lambda ps: optim.Adam(ps, lr=0.05, b1=0.8, b2=0.99, eps=1e-6), lambda ps: torch.optim.Adam(ps, lr=0.05, betas=(0.8, 0.99), eps=1e-6)),
  (lambda ps: optim.AdamW(ps, lr=0.01, weight_decay=0.1), lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1)),
])
def test_against_torch(ours: Callable, theirs: Callable) -> None:
  rng = np.random.default_rng(0)
  init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
  for got, want in zip(run_tinytune(ours, init, 6), run_torch(theirs, init, 6)): np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)


def numpy_grads(p: list[np.ndarray]) -> list[np.ndarray]:
  target = np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4)
  r = 2 * (p[0] * p[1] - target)
  return [r * p[1], (r * p[0]).sum(0) + 0.5]


def test_lamb_and_lars_against_their_formulas() -> None:
  rng = np.random.default_rng(1)
  init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
  p, m, v = [x.astype(np.float64) for x in init], [np.zeros(s) for s in SHAPES], [np.zeros(s) for s in SHAPES]
  lr, b1, b2, eps, wd = 0.01, 0.9, 0.999, 1e-6, 0.01
  for t in range(1, 4):
    for i, g in enumerate(numpy_grads(p)):
      m[i], v[i] = b1 * m[i] + (1 - b1) * g, b2 * v[i] + (1 - b2) * g * g
      up = (m[i] / (1 - b1 ** t)) / (np.sqrt(v[i] / (1 - b2 ** t)) + eps) + wd * p[i]
      p[i] = p[i] - lr * np.linalg.norm(p[i]) / np.linalg.norm(up) * up
  for got, want in zip(run_tinytune(lambda ps: optim.LAMB(ps, lr, b1, b2, eps, wd), init, 3), p): np.testing.assert_allclose(got, want, rtol=1e-4)
  p, buf = [x.astype(np.float64) for x in init], [np.zeros(s) for s in SHAPES]
  lr, mom, wd, tc = 0.1, 0.9, 1e-4, 0.001
  for _ in range(3):
    for i, g in enumerate(numpy_grads(p)):
      trust = tc * np.linalg.norm(p[i]) / (np.linalg.norm(g) + wd * np.linalg.norm(p[i]))
      buf[i] = mom * buf[i] + (g + wd * p[i]) * trust
      p[i] = p[i] - lr * buf[i]
  for got, want in zip(run_tinytune(lambda ps: optim.LARS(ps, lr, mom, wd, tcoef=tc), init, 3), p): np.testing.assert_allclose(got, want, rtol=1e-4)


def test_updates_are_in_place_and_lr_is_a_tensor() -> None:
  w = Tensor(np.ones(3, np.float32), requires_grad=True)
  opt = optim.SGD([w], lr=0.5)
  (w * 2).sum().backward()
  opt.step()
  buffer = w.uop.src[0].arg  # the first assign gives w memory of its own; later steps write into it
  np.testing.assert_allclose(w.numpy(), [0.0, 0.0, 0.0])
  opt.lr.assign(0.25)
  opt.zero_grad()
  (w * 2).sum().backward()
  opt.step()
  assert w.uop.src[0].arg is buffer
  np.testing.assert_allclose(w.numpy(), [-0.5, -0.5, -0.5])


def test_equal_states_do_not_share_memory() -> None:
  a, b = Tensor.zeros(3).contiguous().realize(), Tensor.zeros(3).contiguous().realize()  # one memoized buffer
  a.assign(a + 1).realize()
  np.testing.assert_allclose(b.numpy(), [0.0, 0.0, 0.0])
  np.testing.assert_allclose(a.numpy(), [1.0, 1.0, 1.0])
  x = Tensor([1.0, 2.0])
  y = (x * 3).realize()
  x.assign(Tensor([5.0, 5.0])).realize()
  np.testing.assert_allclose((x * 3).numpy(), [15.0, 15.0])  # not the memoized result of before the write
  np.testing.assert_allclose(y.numpy(), [3.0, 6.0])


def test_assign_reads_old_values_when_realized_together() -> None:
  a, b = Tensor(np.array([1.0, 2.0], np.float32)), Tensor(np.array([10.0, 20.0], np.float32))
  old_a = Tensor(a.uop)
  a.assign(b * 1), b.assign(old_a * 1)
  a.realize(b)
  np.testing.assert_allclose(a.numpy(), [10.0, 20.0])
  np.testing.assert_allclose(b.numpy(), [1.0, 2.0])
  with pytest.raises(ValueError, match="shape"): a.assign(Tensor([1.0]))
  with pytest.raises(TypeError, match="cast"): a.assign(Tensor([1, 2]))


def mlp_losses(jit: bool, steps: int = 8) -> list[float]:
  rng = np.random.default_rng(0)
  X, Y = rng.standard_normal((64, 8)).astype(np.float32), rng.integers(0, 3, 64)
  w1 = Tensor(rng.standard_normal((8, 16)).astype(np.float32) * 0.3, requires_grad=True)
  w2 = Tensor(rng.standard_normal((16, 3)).astype(np.float32) * 0.3, requires_grad=True)
  opt = optim.Adam([w1, w2], lr=0.01)
  onehot = Tensor(np.eye(3, dtype=np.float32)[Y])

  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = -((x @ w1).relu() @ w2).log_softmax(-1).mul(y).sum(-1).mean()
    loss.backward()
    return loss.realize(*opt.schedule_step())
  run = TinyJit(step) if jit else step
  return [run(Tensor(X), onehot).item() for _ in range(steps)]


def test_training_step_under_tinyjit_matches_eager_and_torch() -> None:
  eager, jitted = mlp_losses(False), mlp_losses(True)
  np.testing.assert_allclose(jitted, eager, rtol=1e-5)
  rng = np.random.default_rng(0)
  X, Y = torch.tensor(rng.standard_normal((64, 8)).astype(np.float32)), torch.tensor(rng.integers(0, 3, 64))
  w1 = torch.tensor(rng.standard_normal((8, 16)).astype(np.float32) * 0.3, requires_grad=True)
  w2 = torch.tensor(rng.standard_normal((16, 3)).astype(np.float32) * 0.3, requires_grad=True)
  opt = torch.optim.Adam([w1, w2], lr=0.01)
  want = []
  for _ in range(8):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy((X @ w1).relu() @ w2, Y)
    loss.backward()
    opt.step()
    want.append(loss.item())
  np.testing.assert_allclose(eager, want, rtol=1e-4)
  assert want[-1] < want[0]


def test_updates_write_in_place_without_copies() -> None:
  from tinytune import GlobalCounters
  w = Tensor(np.arange(4, dtype=np.float32), requires_grad=True)
  opt = optim.Adam([w], lr=0.1)
  for _ in range(2):  # the first step also gives w and the moments memory of their own
    opt.zero_grad()
    (w * w).sum().backward()
    before = GlobalCounters.kernel_count
    opt.step()
  # b1**t, b2**t, m, v and w: each written by its own kernel, straight into its memory (w's update reads the new m and v there)
  assert GlobalCounters.kernel_count - before == 5


def test_float64_training_follows_default_float(monkeypatch: pytest.MonkeyPatch) -> None:
  from tinytune import dtypes, nn
  from tinytune.nn.data import DataLoader
  monkeypatch.setattr(dtypes, "default_float", dtypes.float64)
  lin, bn = nn.Linear(3, 2), nn.BatchNorm(2)
  assert {lin.weight.dtype, lin.bias.dtype, bn.weight.dtype, bn.running_mean.dtype} == {dtypes.float64}  # they were float32
  opt = optim.SGD([lin.weight, lin.bias], lr=0.1)
  w, b = lin.weight.numpy().copy(), lin.bias.numpy().copy()
  x = np.arange(12.0).reshape(4, 3) / 7
  lin(Tensor(x)).square().sum().backward()
  opt.step()
  assert lin.weight.dtype == dtypes.float64 and opt.lr.dtype == dtypes.float64
  np.testing.assert_allclose(lin.weight.numpy(), w - 0.1 * 2 * (x @ w.T + b).T @ x, rtol=1e-13)  # float32 anywhere would miss by 1e-7
  batch = next(iter(DataLoader(np.ones((4, 2), np.float64), np.arange(4, dtype=np.int16), batch_size=2)))
  assert [t.dtype for t in batch] == [dtypes.float64, dtypes.int16]  # the new int types are kept, as Tensor() keeps them
