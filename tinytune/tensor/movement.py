"""Movement: reshape, permute, expand, pad, shrink, flip and what is built from them. No data moves; each composes a view."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from tinytune.dtype import dtypes, least_upper
from tinytune.helpers import argfix, prod
from tinytune.shape import View
from tinytune.uop import Ops, UOp

if TYPE_CHECKING:
  from tinytune.tensor import Scalar, Tensor


def view_uop(x: UOp, fn: Callable[[View], Optional[View]], shape: tuple[int, ...]) -> UOp:
  """Apply a movement to x: compose into x's own view when one view can express it, else view x as contiguous."""
  if x.op is Ops.VIEW and (v := fn(x.arg)) is not None: return UOp(Ops.VIEW, x.dtype, x.src, v)
  v = fn(View.create(x.shape))
  assert v is not None and v.shape == shape
  return UOp(Ops.VIEW, x.dtype, (x,), v)


def reshape(self: Tensor, *shape: Any) -> Tensor:
  shape = argfix(*shape)
  if not all(isinstance(s, int) and s >= -1 for s in shape) or shape.count(-1) > 1: raise ValueError(f"bad shape {shape}")
  if -1 in shape:
    known = prod(s for s in shape if s != -1)
    if known == 0 or self.numel() % known: raise ValueError(f"cannot reshape {self.shape} to {shape}")
    shape = tuple(self.numel() // known if s == -1 else s for s in shape)
  if prod(shape) != self.numel(): raise ValueError(f"cannot reshape {self.shape} ({self.numel()} elements) to {shape}")
  return self if shape == self.shape else self._move("reshape", shape, shape)


def permute(self: Tensor, *order: Any) -> Tensor:
  order = tuple(self._axis(o) for o in argfix(*order)) if self.ndim else argfix(*order)
  if sorted(order) != list(range(self.ndim)): raise ValueError(f"permute needs a permutation of {self.ndim} axes, got {order}")
  return self._move("permute", order, tuple(self.shape[i] for i in order))


def transpose(self: Tensor, dim0: int = -2, dim1: int = -1) -> Tensor:
  order = list(range(self.ndim))
  a, b = self._axis(dim0), self._axis(dim1)
  order[a], order[b] = order[b], order[a]
  return self.permute(order)


def T(self: Tensor) -> Tensor: return self.transpose(0, 1) if self.ndim == 2 else self.permute(list(reversed(range(self.ndim))))


def expand(self: Tensor, *shape: Any) -> Tensor:
  shape = argfix(*shape)
  if not all(isinstance(s, int) and s >= -1 for s in shape): raise ValueError(f"cannot expand {self.shape} to {shape}: sizes are ints >= -1")
  if len(shape) < self.ndim: raise ValueError(f"cannot expand {self.shape} to fewer dims {shape}")
  x = self.reshape((1,) * (len(shape) - self.ndim) + self.shape)
  new = tuple(s if n == -1 else n for s, n in zip(x.shape, shape))
  if any(s != n and s != 1 for s, n in zip(x.shape, new)): raise ValueError(f"cannot expand {self.shape} to {shape}")
  return x if new == x.shape else x._move("expand", new, new)


def _pairs(self: Tensor, arg: Sequence, what: str) -> tuple[tuple[int, int], ...]:
  if len(arg) != self.ndim: raise ValueError(f"{what} needs one entry per dim ({self.ndim}), got {len(arg)}")
  return tuple(tuple(p) if p is not None else None for p in arg)  # type: ignore[misc]


def pad(self: Tensor, padding: Sequence, value: Scalar = 0.0) -> Tensor:
  """padding: ((before, after) or None per dim), or PyTorch's flat (last_before, last_after, ...)."""
  if padding and all(isinstance(p, int) for p in padding):
    if len(padding) % 2 or len(padding) > 2 * self.ndim: raise ValueError(f"flat padding needs pairs for at most {self.ndim} dims, got {padding}")
    flat = list(padding) + [0] * (2 * self.ndim - len(padding))
    pairs = tuple((flat[2 * i], flat[2 * i + 1]) for i in reversed(range(self.ndim)))
  else: pairs = tuple(p or (0, 0) for p in self._pairs(padding, "pad"))
  if any(b < 0 or a < 0 for b, a in pairs): return self.shrink(tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(pairs, self.shape))).pad(
    tuple((max(b, 0), max(a, 0)) for b, a in pairs), value)
  shape = tuple(s + b + a for s, (b, a) in zip(self.shape, pairs))
  ret = self._move("pad", pairs, shape)
  if value == 0: return ret
  inside = Tensor.full(self.shape, True, dtypes.bool, self.device)._move("pad", pairs, shape)
  return inside.where(ret, value)


def shrink(self: Tensor, arg: Sequence) -> Tensor:
  pairs = tuple(p if p is not None else (0, s) for p, s in zip(self._pairs(arg, "shrink"), self.shape))
  if any(not 0 <= b <= e <= s for (b, e), s in zip(pairs, self.shape)): raise ValueError(f"shrink {pairs} is out of bounds for {self.shape}")
  return self._move("shrink", pairs, tuple(e - b for b, e in pairs))


def flip(self: Tensor, *axis: Any) -> Tensor:
  axes = tuple(self._axis(a) for a in argfix(*axis))
  if len(set(axes)) != len(axes): raise ValueError(f"flip axes {argfix(*axis)} name a dim twice")
  return self._move("flip", axes, self.shape)


def flatten(self: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
  if self.ndim == 0: return self.reshape(1)
  s, e = self._axis(start_dim), self._axis(end_dim)
  return self.reshape(self.shape[:s] + (prod(self.shape[s:e + 1]),) + self.shape[e + 1:])


def squeeze(self: Tensor, dim: int | None = None) -> Tensor:
  if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
  d = self._axis(dim)
  return self if self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1:])


def unsqueeze(self: Tensor, dim: int) -> Tensor:
  d = self._axis(dim, self.ndim + 1)
  return self.reshape(self.shape[:d] + (1,) + self.shape[d:])


def cat(self: Tensor, *others: Tensor, dim: int = 0) -> Tensor:
  ts = [self, *others]
  if not all(isinstance(t, Tensor) for t in ts): raise TypeError(f"cat needs Tensors, got {[type(t).__name__ for t in ts]}")
  if self.ndim == 0: raise ValueError("cat needs tensors of at least one dim; use stack for 0-d tensors")
  d = self._axis(dim)
  if not all(t.ndim == self.ndim and all(a == b for i, (a, b) in enumerate(zip(t.shape, self.shape)) if i != d) for t in ts):
    raise ValueError(f"cat needs equal shapes except along dim {d}, got {[t.shape for t in ts]}")
  dt = least_upper(*(t.dtype for t in ts))
  total, at, ret = sum(t.shape[d] for t in ts), 0, None
  for t in ts:
    piece = t.cast(dt).pad(tuple((at, total - at - t.shape[d]) if i == d else (0, 0) for i in range(self.ndim)))
    ret, at = piece if ret is None else (ret | piece if dt == dtypes.bool else ret + piece), at + t.shape[d]
  return ret  # type: ignore[return-value]


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
  if not tensors: raise ValueError("stack needs at least one tensor")
  if not all(isinstance(t, Tensor) for t in tensors): raise TypeError(f"stack needs Tensors, got {[type(t).__name__ for t in tensors]}")
  if not all(t.shape == tensors[0].shape for t in tensors): raise ValueError(f"stack needs equal shapes, got {[t.shape for t in tensors]}")
  d = tensors[0]._axis(dim, tensors[0].ndim + 1)
  return tensors[0].unsqueeze(d).cat(*[t.unsqueeze(d) for t in tensors[1:]], dim=d)
