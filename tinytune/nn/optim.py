"""Optimizers. step() realizes the update at once; schedule_step() returns the updated tensors unrealized, to realize together
with the loss (`loss.realize(*opt.schedule_step())`), so the update's kernels fuse with the backward's. Parameters and state
are written in place (Tensor.assign), so a TinyJit replay of a training step updates them. The learning rate is a tensor:
changing it (`opt.lr.assign(0.01)`) needs no recompile and a jitted step reads the new value."""
from __future__ import annotations

from typing import Sequence

from tinytune import no_grad
from tinytune.dtype import dtypes
from tinytune.tensor import Tensor


class Optimizer:
  def __init__(self, params: Sequence[Tensor], lr: float):
    if not isinstance(lr, (int, float)) or lr < 0: raise ValueError(f"a learning rate is a number >= 0, got {lr!r}")
    unique = list({id(p): p for p in params}.values())
    for p in unique:
      if p.requires_grad is None: p.requires_grad_()  # as tinygrad: a tensor handed to an optimizer is a parameter
    self.params = [p for p in unique if p.requires_grad]
    if not self.params: raise ValueError("an optimizer needs at least one tensor that requires grad")
    self.device = self.params[0].device
    self.lr = self._scalar(lr)

  def _scalar(self, v: float) -> Tensor:  # float64 hyperparameters for float64 parameters, else float32
    dtype = dtypes.float64 if any(p.dtype == dtypes.float64 for p in self.params) else dtypes.float32
    return Tensor(v, dtype=dtype, device=self.device).contiguous().realize()
  def _state(self, p: Tensor) -> Tensor: return p.zeros_like().contiguous().realize()

  def zero_grad(self) -> None:
    for p in self.params: p.grad = None

  def step(self) -> None:
    """Compute and write the update now."""
    if ts := self.schedule_step(): ts[0].realize(*ts[1:])

  def schedule_step(self) -> list[Tensor]:
    """Assign every parameter and state tensor its updated value, unrealized; return them. Parameters without a gradient
    (not reached by the last backward) are left as they are."""
    with no_grad():
      return self._update([(i, p, p.grad.detach().cast(p.dtype)) for i, p in enumerate(self.params) if p.grad is not None])

  def _update(self, grads: list[tuple[int, Tensor, Tensor]]) -> list[Tensor]:
    """The assigned tensors of one step, from (place in self.params, parameter, gradient) of each parameter that has one."""
    raise NotImplementedError


class SGD(Optimizer):
  """PyTorch's SGD: weight decay added to the gradient, then momentum (the first step's buffer is the gradient), optionally
  Nesterov's."""

  def __init__(self, params: Sequence[Tensor], lr: float = 0.001, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False):
    super().__init__(params, lr)
    if nesterov and momentum <= 0: raise ValueError("nesterov momentum needs momentum > 0")
    self.momentum, self.wd, self.nesterov = momentum, weight_decay, nesterov
    self.buf = [self._state(p) for p in self.params] if momentum else []

  def _update(self, grads: list[tuple[int, Tensor, Tensor]]) -> list[Tensor]:
    ret = []
    for i, p, g in grads:
      if self.wd: g = g + self.wd * p
      if self.momentum:
        b = self.buf[i]
        ret.append(b.assign(b * self.momentum + g))
        g = g + b * self.momentum if self.nesterov else b
      ret.append(p.assign(p - g * self.lr.cast(p.dtype)))
    return ret


class LAMB(Optimizer):
  """Adam's moments with bias correction, weight decay decoupled from them (AdamW), and LAMB's trust ratio |p| / |update| on
  each tensor's step; with adam=True, no trust ratio: AdamW."""

  def __init__(self, params: Sequence[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
               weight_decay: float = 0.0, adam: bool = False):
    super().__init__(params, lr)
    if not (0 <= b1 < 1 and 0 <= b2 < 1): raise ValueError(f"betas are in [0, 1), got {b1}, {b2}")
    self.b1, self.b2, self.eps, self.wd, self.adam = b1, b2, eps, weight_decay, adam
    self.b1_t, self.b2_t = self._scalar(1.0), self._scalar(1.0)  # b1 ** steps, b2 ** steps
    self.m = [self._state(p) for p in self.params]
    self.v = [self._state(p) for p in self.params]

  def _update(self, grads: list[tuple[int, Tensor, Tensor]]) -> list[Tensor]:
    b1_t, b2_t = self.b1_t.assign(self.b1_t * self.b1), self.b2_t.assign(self.b2_t * self.b2)
    ret = [b1_t, b2_t]
    for i, p, g in grads:
      m = self.m[i].assign(self.m[i] * self.b1 + g * (1 - self.b1))
      v = self.v[i].assign(self.v[i] * self.b2 + g * g * (1 - self.b2))
      up = (m / (1 - b1_t)).cast(p.dtype) / ((v / (1 - b2_t)).sqrt().cast(p.dtype) + self.eps)
      if self.wd: up = up + self.wd * p
      if not self.adam:  # the trust ratio, 1 where either norm is 0
        pn, un = p.square().sum().sqrt(), up.square().sum().sqrt()
        up = up * ((pn > 0) & (un > 0)).where(pn / un, 1.0)
      ret += [m, v, p.assign(p - up * self.lr.cast(p.dtype))]
    return ret


def AdamW(params: Sequence[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.01) -> LAMB:
  """PyTorch's AdamW: Adam with weight decay decoupled from the moments."""
  return LAMB(params, lr, b1, b2, eps, weight_decay, adam=True)


def Adam(params: Sequence[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> LAMB:
  """PyTorch's Adam (without weight decay)."""
  return LAMB(params, lr, b1, b2, eps, 0.0, adam=True)


class LARS(Optimizer):
  """SGD with momentum and layer-wise rate scaling (You et al., 2017): each tensor's gradient, weight decay added, is scaled by
  tcoef * |p| / (|g| + weight_decay * |p|), or 1 where either norm is 0."""

  def __init__(self, params: Sequence[Tensor], lr: float = 0.001, momentum: float = 0.9, weight_decay: float = 1e-4, nesterov: bool = False,
               tcoef: float = 0.001):
    super().__init__(params, lr)
    self.sgd = SGD(self.params, lr, momentum, 0.0, nesterov) if momentum else None
    self.lr = self.sgd.lr if self.sgd else self.lr
    self.momentum, self.wd, self.tcoef = momentum, weight_decay, tcoef

  def _update(self, grads: list[tuple[int, Tensor, Tensor]]) -> list[Tensor]:
    scaled = []
    for i, p, g in grads:
      pn, gn = p.square().sum().sqrt(), g.square().sum().sqrt()
      trust = ((pn > 0) & (gn > 0)).where(self.tcoef * pn / (gn + self.wd * pn), 1.0)
      scaled.append((i, p, (g + self.wd * p) * trust.cast(p.dtype)))
    if self.sgd is not None: return self.sgd._update(scaled)
    return [p.assign(p - g * self.lr.cast(p.dtype)) for _, p, g in scaled]
