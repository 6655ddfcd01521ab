"""The lazy Tensor: PyTorch/tinygrad-like API over a UOp graph. Nothing runs before realize()/numpy()/tolist()/item()."""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from tinytune import rng
from tinytune.dtype import DType, dtypes, least_upper
from tinytune.helpers import argfix, prod
from tinytune.runtime import Buffer, Device
from tinytune.shape import View
from tinytune.uop import Ops, UOp

Scalar = Union[int, float, bool]
TensorLike = Union["Tensor", Scalar]


def _view(x: UOp, fn: Callable[[View], Optional[View]], shape: tuple[int, ...]) -> UOp:
  """Apply a movement to x: compose into x's own view when one view can express it, else view x as contiguous."""
  if x.op is Ops.VIEW and (v := fn(x.arg)) is not None: return UOp(Ops.VIEW, x.dtype, x.src, v)
  v = fn(View.create(x.shape))
  assert v is not None and v.shape == shape
  return UOp(Ops.VIEW, x.dtype, (x,), v)


class Tensor:
  """A lazy n-dimensional array on a device."""

  def __init__(self, data: Any, dtype: Any = None, device: str | None = None):
    self.device = Device.canonicalize(device)
    dt = dtypes.from_any(dtype) if dtype is not None else None
    if isinstance(data, UOp): self.uop = data if dt is None else data.cast(dt)
    elif isinstance(data, Tensor): self.uop = data.cast(dt).uop if dt else data.uop
    elif isinstance(data, (bool, int, float)) and not isinstance(data, np.generic):
      dt = dt or (dtypes.bool if isinstance(data, bool) else dtypes.default_float if isinstance(data, float) else
                  dtypes.default_int if -2**31 <= data < 2**31 else dtypes.int64)
      self.uop = UOp.const(dt, data)
    else:
      arr = np.asarray(data)
      if arr.dtype == object: raise TypeError(f"cannot make a Tensor from {type(data).__name__} with ragged or non-numeric items")
      if dt is None: dt = dtypes.int64 if arr.dtype.kind in "iu" and arr.dtype not in (np.uint8, np.int32) else dtypes.from_any(arr.dtype)
      buf = Buffer(self.device, arr.size, dt).copyin(arr.astype(dt.np))
      self.uop = UOp(Ops.VIEW, dt, (UOp(Ops.BUFFER, dt, (), buf),), View.create(arr.shape))

  # ***** properties *****
  @property
  def shape(self) -> tuple[int, ...]: return self.uop.shape
  @property
  def dtype(self) -> DType: return self.uop.dtype
  @property
  def ndim(self) -> int: return len(self.shape)
  def numel(self) -> int: return prod(self.shape)
  def size(self, dim: int | None = None) -> Any: return self.shape if dim is None else self.shape[self._axis(dim)]
  def __len__(self) -> int:
    if not self.shape: raise TypeError("len() of a 0-d tensor")
    return self.shape[0]
  def __repr__(self) -> str: return f"<Tensor {self.shape} {self.dtype.name} on {self.device}>"

  # ***** realization *****
  def realize(self) -> Tensor:
    from tinytune.engine.realize import realize
    self.uop = realize(self.uop, self.device)
    return self

  def numpy(self) -> np.ndarray:
    self.realize()
    view, buf = self.uop.arg, self.uop.src[0].arg
    return buf.numpy_view()[:prod(self.shape)].reshape(self.shape).copy() if view.contiguous else self.contiguous().numpy()

  def tolist(self) -> Any: return self.numpy().tolist()
  def item(self) -> Any:
    if self.numel() != 1: raise ValueError(f"item() needs a tensor with one element, this one has shape {self.shape}")
    return self.numpy().reshape(()).item()
  def to(self, device: str) -> Tensor:
    device = Device.canonicalize(device)
    return self if device == self.device else Tensor(self.numpy(), device=device)
  def contiguous(self) -> Tensor: return Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)), device=self.device)

  # ***** creation *****
  @staticmethod
  def _shape_arg(shape: tuple) -> tuple[int, ...]:
    shape = argfix(*shape)
    if not all(isinstance(s, int) and s >= 0 for s in shape): raise ValueError(f"a shape is non-negative ints, got {shape}")
    return shape

  @staticmethod
  def full(shape: tuple[int, ...] | int, fill_value: Scalar, dtype: Any = None, device: str | None = None) -> Tensor:
    shape = Tensor._shape_arg(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,))
    return Tensor(fill_value, dtype=dtype, device=device).reshape((1,) * len(shape)).expand(shape)

  @staticmethod
  def zeros(*shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
    return Tensor.full(argfix(*shape), 0.0, dtype or dtypes.default_float, device)
  @staticmethod
  def ones(*shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
    return Tensor.full(argfix(*shape), 1.0, dtype or dtypes.default_float, device)

  @staticmethod
  def arange(start: Scalar, stop: Scalar | None = None, step: Scalar = 1, dtype: Any = None, device: str | None = None) -> Tensor:
    if stop is None: start, stop = 0, start
    if step == 0: raise ValueError("arange step must not be zero")
    dt = dtypes.from_any(dtype) if dtype else dtypes.default_int if all(isinstance(x, int) for x in (start, stop, step)) else dtypes.default_float
    return Tensor(np.arange(start, stop, step, dtype=dt.np), dtype=dt, device=device)

  @staticmethod
  def eye(n: int, m: int | None = None, dtype: Any = None, device: str | None = None) -> Tensor:
    m = n if m is None else m
    return (Tensor.arange(n, device=device).reshape(n, 1) == Tensor.arange(m, device=device).reshape(1, m)).cast(dtype or dtypes.default_float)

  @staticmethod
  def manual_seed(seed: int = 0) -> None:
    """Restart the random numbers of Tensor.rand and everything built on it at this seed."""
    rng.manual_seed(seed)

  @staticmethod
  def rand(*shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
    """Uniform numbers in [0, 1), drawn by a kernel (Threefry on a counter, see tinytune.rng) and realized at once."""
    shape, device = Tensor._shape_arg(shape), Device.canonicalize(device)
    bits = Tensor(rng.uniform_bits(prod(shape), device), device=device).reshape(shape)
    return bits.cast(dtype or dtypes.default_float).realize()
  @staticmethod
  def randn(*shape: Any, dtype: Any = None, device: str | None = None) -> Tensor:
    """Standard normal numbers, by the Box-Muller transform of two uniform draws."""
    u = Tensor.rand(2, *Tensor._shape_arg(shape), device=device)
    return ((1 - u[0]).log() * -2).sqrt().mul((u[1] * (2 * math.pi)).cos()).cast(dtype or dtypes.default_float).realize()
  @staticmethod
  def uniform(*shape: Any, low: float = 0.0, high: float = 1.0, dtype: Any = None, device: str | None = None) -> Tensor:
    return (Tensor.rand(*shape, device=device) * (high - low) + low).cast(dtype or dtypes.default_float).realize()
  @staticmethod
  def randint(*shape: Any, low: int = 0, high: int = 10, dtype: Any = None, device: str | None = None) -> Tensor:
    """Integers in [low, high), uniform."""
    if not high > low: raise ValueError(f"randint needs low < high, got low={low} high={high}")
    return ((Tensor.rand(*shape, device=device) * (high - low)).cast(dtypes.int64) + low).cast(dtype or dtypes.default_int).realize()

  training = False  # dropout only drops while training

  def dropout(self, p: float = 0.5) -> Tensor:
    """While Tensor.training: zero each element with probability p and scale the rest by 1/(1-p); otherwise the tensor itself."""
    if not 0 <= p <= 1: raise ValueError(f"dropout probability {p} is not in [0, 1]")
    if not Tensor.training or p == 0: return self
    if p == 1: return self.zeros_like()
    return self * (Tensor.rand(*self.shape, device=self.device) >= p).cast(self.dtype) * (1 / (1 - p))

  def full_like(self, fill_value: Scalar, dtype: Any = None) -> Tensor: return Tensor.full(self.shape, fill_value, dtype or self.dtype, self.device)
  def zeros_like(self, dtype: Any = None) -> Tensor: return self.full_like(0, dtype)
  def ones_like(self, dtype: Any = None) -> Tensor: return self.full_like(1, dtype)
  def rand_like(self, dtype: Any = None) -> Tensor: return Tensor.rand(*self.shape, dtype=dtype or self.dtype, device=self.device)
  def randn_like(self, dtype: Any = None) -> Tensor: return Tensor.randn(*self.shape, dtype=dtype or self.dtype, device=self.device)

  # ***** movement *****
  def _axis(self, axis: int, ndim: int | None = None) -> int:
    ndim = self.ndim if ndim is None else ndim
    if not isinstance(axis, int): raise TypeError(f"an axis is an int, got {axis!r}")
    if not -max(ndim, 1) <= axis < max(ndim, 1): raise ValueError(f"axis {axis} is out of range for {ndim} dims")
    return axis % max(ndim, 1)

  def _move(self, fn: Callable[[View], Optional[View]], shape: tuple[int, ...]) -> Tensor:
    return Tensor(_view(self.uop, fn, shape), device=self.device)

  def reshape(self, *shape: Any) -> Tensor:
    shape = argfix(*shape)
    if not all(isinstance(s, int) and s >= -1 for s in shape) or shape.count(-1) > 1: raise ValueError(f"bad shape {shape}")
    if -1 in shape:
      known = prod(s for s in shape if s != -1)
      if known == 0 or self.numel() % known: raise ValueError(f"cannot reshape {self.shape} to {shape}")
      shape = tuple(self.numel() // known if s == -1 else s for s in shape)
    if prod(shape) != self.numel(): raise ValueError(f"cannot reshape {self.shape} ({self.numel()} elements) to {shape}")
    return self if shape == self.shape else self._move(lambda v: v.reshape(shape), shape)

  def permute(self, *order: Any) -> Tensor:
    order = tuple(self._axis(o) for o in argfix(*order)) if self.ndim else argfix(*order)
    if sorted(order) != list(range(self.ndim)): raise ValueError(f"permute needs a permutation of {self.ndim} axes, got {order}")
    return self._move(lambda v: v.permute(order), tuple(self.shape[i] for i in order))

  def transpose(self, dim0: int = -2, dim1: int = -1) -> Tensor:
    order = list(range(self.ndim))
    a, b = self._axis(dim0), self._axis(dim1)
    order[a], order[b] = order[b], order[a]
    return self.permute(order)
  @property
  def T(self) -> Tensor: return self.transpose(0, 1) if self.ndim == 2 else self.permute(list(reversed(range(self.ndim))))

  def expand(self, *shape: Any) -> Tensor:
    shape = argfix(*shape)
    if not all(isinstance(s, int) and s >= -1 for s in shape): raise ValueError(f"cannot expand {self.shape} to {shape}: sizes are ints >= -1")
    if len(shape) < self.ndim: raise ValueError(f"cannot expand {self.shape} to fewer dims {shape}")
    x = self.reshape((1,) * (len(shape) - self.ndim) + self.shape)
    new = tuple(s if n == -1 else n for s, n in zip(x.shape, shape))
    if any(s != n and s != 1 for s, n in zip(x.shape, new)): raise ValueError(f"cannot expand {self.shape} to {shape}")
    return x if new == x.shape else x._move(lambda v: v.expand(new), new)

  def _pairs(self, arg: Sequence, what: str) -> tuple[tuple[int, int], ...]:
    if len(arg) != self.ndim: raise ValueError(f"{what} needs one entry per dim ({self.ndim}), got {len(arg)}")
    return tuple(tuple(p) if p is not None else None for p in arg)  # type: ignore[misc]

  def pad(self, padding: Sequence, value: Scalar = 0.0) -> Tensor:
    """padding: ((before, after) or None per dim), or PyTorch's flat (last_before, last_after, ...)."""
    if padding and all(isinstance(p, int) for p in padding):
      if len(padding) % 2 or len(padding) > 2 * self.ndim: raise ValueError(f"flat padding needs pairs for at most {self.ndim} dims, got {padding}")
      flat = list(padding) + [0] * (2 * self.ndim - len(padding))
      pairs = tuple((flat[2 * i], flat[2 * i + 1]) for i in reversed(range(self.ndim)))
    else: pairs = tuple(p or (0, 0) for p in self._pairs(padding, "pad"))
    if any(b < 0 or a < 0 for b, a in pairs): return self.shrink(tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(pairs, self.shape))).pad(
      tuple((max(b, 0), max(a, 0)) for b, a in pairs), value)
    shape = tuple(s + b + a for s, (b, a) in zip(self.shape, pairs))
    ret = self._move(lambda v: v.pad(pairs), shape)
    if value == 0: return ret
    inside = Tensor.full(self.shape, True, dtypes.bool, self.device)._move(lambda v: v.pad(pairs), shape)
    return inside.where(ret, value)

  def shrink(self, arg: Sequence) -> Tensor:
    pairs = tuple(p if p is not None else (0, s) for p, s in zip(self._pairs(arg, "shrink"), self.shape))
    if any(not 0 <= b <= e <= s for (b, e), s in zip(pairs, self.shape)): raise ValueError(f"shrink {pairs} is out of bounds for {self.shape}")
    return self._move(lambda v: v.shrink(pairs), tuple(e - b for b, e in pairs))

  def flip(self, *axis: Any) -> Tensor:
    axes = tuple(self._axis(a) for a in argfix(*axis))
    if len(set(axes)) != len(axes): raise ValueError(f"flip axes {argfix(*axis)} name a dim twice")
    return self._move(lambda v: v.flip(axes), self.shape)

  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if self.ndim == 0: return self.reshape(1)
    s, e = self._axis(start_dim), self._axis(end_dim)
    return self.reshape(self.shape[:s] + (prod(self.shape[s:e + 1]),) + self.shape[e + 1:])

  def squeeze(self, dim: int | None = None) -> Tensor:
    if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
    d = self._axis(dim)
    return self if self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1:])

  def unsqueeze(self, dim: int) -> Tensor:
    d = self._axis(dim, self.ndim + 1)
    return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

  def cat(self, *others: Tensor, dim: int = 0) -> Tensor:
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

  @staticmethod
  def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    if not tensors: raise ValueError("stack needs at least one tensor")
    if not all(isinstance(t, Tensor) for t in tensors): raise TypeError(f"stack needs Tensors, got {[type(t).__name__ for t in tensors]}")
    if not all(t.shape == tensors[0].shape for t in tensors): raise ValueError(f"stack needs equal shapes, got {[t.shape for t in tensors]}")
    d = tensors[0]._axis(dim, tensors[0].ndim + 1)
    return tensors[0].unsqueeze(d).cat(*[t.unsqueeze(d) for t in tensors[1:]], dim=d)

  def __getitem__(self, index: Any) -> Tensor:
    index = index if isinstance(index, tuple) else (index,)
    ellipsis = [at for at, i in enumerate(index) if i is Ellipsis]  # `is`, never ==: Tensor == builds a Tensor
    if len(ellipsis) > 1: raise ValueError("an index has at most one Ellipsis")
    real = [i for i in index if i is not None and i is not Ellipsis]
    if len(real) > self.ndim: raise ValueError(f"too many indices ({len(real)}) for a tensor of {self.ndim} dims")
    at = ellipsis[0] if ellipsis else len(index)
    index = index[:at] + (slice(None),) * (self.ndim - len(real)) + index[at + 1:]
    x, dim, out_shape = self, 0, []
    for i in index:
      if i is None: out_shape.append(1); continue
      n = x.shape[dim]
      if isinstance(i, (int, np.integer)) and not isinstance(i, bool):
        if not -n <= i < n: raise IndexError(f"index {i} is out of range for dim {dim} of size {n}")
        x = x.shrink(tuple((int(i) % n, int(i) % n + 1) if j == dim else None for j in range(x.ndim)))
      elif isinstance(i, slice):
        start, stop, step = i.indices(n)
        if step < 0: x, start, stop, step = x.flip(dim), n - 1 - start, n - 1 - stop, -step
        length = max(0, -(-(stop - start) // step))
        x = x.shrink(tuple((start, start + (length - 1) * step + 1 if length else start) if j == dim else None for j in range(x.ndim)))
        if step > 1 and length:
          shp = x.shape
          x = x.pad(tuple((0, length * step - shp[dim]) if j == dim else None for j in range(x.ndim)))
          x = x.reshape(shp[:dim] + (length, step) + shp[dim + 1:]).shrink(
            tuple((0, 1) if j == dim + 1 else None for j in range(x.ndim + 1))).reshape(shp[:dim] + (length,) + shp[dim + 1:])
        out_shape.append(length)
      else: raise TypeError(f"unsupported index {i!r}: use ints, slices, None or ...")
      dim += 1
    return x.reshape(tuple(out_shape))

  # ***** elementwise *****
  def _const_like(self, v: Scalar, dtype: DType | None = None) -> Tensor:
    return Tensor(UOp.const(dtype or self.dtype, v), device=self.device).reshape((1,) * self.ndim).expand(self.shape)

  def _broadcasted(self, y: TensorLike, reverse: bool = False) -> tuple[Tensor, Tensor]:
    x: Tensor = self
    if not isinstance(y, Tensor):
      if isinstance(y, (np.bool_, np.integer, np.floating, dtypes.bfloat16.np)): y = y.item()  # numpy scalars combine like python numbers
      if not isinstance(y, (int, float, bool)): raise TypeError(f"cannot combine a Tensor with {type(y).__name__}")
      dt = x.dtype if not (isinstance(y, float) and not x.dtype.is_float) else dtypes.default_float
      if isinstance(y, int) and not isinstance(y, bool) and x.dtype == dtypes.bool: dt = dtypes.default_int
      c = UOp.const(dt, y)  # broadcast at once: the node reshape and expand would build, without building them
      y = Tensor(UOp(Ops.VIEW, dt, (c,), View.create(x.shape, (0,) * x.ndim)) if x.ndim else c, device=x.device)
    if y.device != x.device: raise ValueError(f"tensors on different devices: {x.device} and {y.device}")
    dt = least_upper(x.dtype, y.dtype)
    x, y = x.cast(dt), y.cast(dt)
    if reverse: x, y = y, x
    if x.shape == y.shape: return x, y
    nd = max(x.ndim, y.ndim)
    xs, ys = (1,) * (nd - x.ndim) + x.shape, (1,) * (nd - y.ndim) + y.shape
    if any(a != b and a != 1 and b != 1 for a, b in zip(xs, ys)): raise ValueError(f"shapes {x.shape} and {y.shape} do not broadcast")
    out = tuple(max(a, b) if 0 not in (a, b) else 0 for a, b in zip(xs, ys))
    return x.reshape(xs).expand(out), y.reshape(ys).expand(out)

  def _alu(self, op: Ops, *srcs: Tensor) -> Tensor: return Tensor(self.uop.alu(op, *[s.uop for s in srcs]), device=self.device)
  def _binop(self, op: Ops, y: TensorLike, reverse: bool = False) -> Tensor:
    a, b = self._broadcasted(y, reverse)
    return a._alu(op, b)

  def cast(self, dtype: Any) -> Tensor:
    dt = dtypes.from_any(dtype)
    return self if dt == self.dtype else Tensor(self.uop.cast(dt), device=self.device)

  def add(self, y: TensorLike, reverse: bool = False) -> Tensor: return self._binop(Ops.ADD, y, reverse)
  def mul(self, y: TensorLike, reverse: bool = False) -> Tensor: return self._binop(Ops.MUL, y, reverse)
  def sub(self, y: TensorLike, reverse: bool = False) -> Tensor:
    a, b = self._broadcasted(y, reverse)
    if a.dtype == dtypes.bool: raise TypeError("subtracting bool tensors is not supported; use ^ or logical_not")
    return a + (-b)
  def div(self, y: TensorLike, reverse: bool = False) -> Tensor:
    a, b = self._broadcasted(y, reverse)
    if not a.dtype.is_float: a, b = a.cast(dtypes.float32), b.cast(dtypes.float32)
    return a * b.reciprocal()
  def neg(self) -> Tensor:
    if self.dtype == dtypes.bool: return self.logical_not()
    return self._alu(Ops.NEG)
  def logical_not(self) -> Tensor: return self.cast(dtypes.bool)._alu(Ops.CMPNE, self._const_like(True, dtypes.bool))
  def __neg__(self) -> Tensor: return self.neg()
  def __add__(self, y: TensorLike) -> Tensor: return self.add(y)
  def __radd__(self, y: TensorLike) -> Tensor: return self.add(y, True)
  def __sub__(self, y: TensorLike) -> Tensor: return self.sub(y)
  def __rsub__(self, y: TensorLike) -> Tensor: return self.sub(y, True)
  def __mul__(self, y: TensorLike) -> Tensor: return self.mul(y)
  def __rmul__(self, y: TensorLike) -> Tensor: return self.mul(y, True)
  def __truediv__(self, y: TensorLike) -> Tensor: return self.div(y)
  def __rtruediv__(self, y: TensorLike) -> Tensor: return self.div(y, True)
  def __pow__(self, y: TensorLike) -> Tensor: return self.pow(y)
  def __rpow__(self, y: TensorLike) -> Tensor: return self.pow(y, True)
  def __matmul__(self, y: Tensor) -> Tensor: return self.matmul(y)
  def _bitwise(self, op: Ops, y: TensorLike) -> Tensor:
    a, b = self._broadcasted(y)
    if a.dtype.is_float: raise TypeError(f"bitwise {op.name.lower()} needs bool or int tensors, got {a.dtype.name}")
    return a._alu(op, b)
  def __and__(self, y: TensorLike) -> Tensor: return self._bitwise(Ops.AND, y)
  def __or__(self, y: TensorLike) -> Tensor: return self._bitwise(Ops.OR, y)
  def __xor__(self, y: TensorLike) -> Tensor: return self._bitwise(Ops.XOR, y)
  def __invert__(self) -> Tensor:
    if self.dtype.is_float: raise TypeError(f"bitwise not needs a bool or int tensor, got {self.dtype.name}")
    return self.logical_not() if self.dtype == dtypes.bool else self ^ -1

  def __lt__(self, y: TensorLike) -> Tensor: return self._binop(Ops.CMPLT, y)
  def __gt__(self, y: TensorLike) -> Tensor: return self._binop(Ops.CMPLT, y, True)
  def __le__(self, y: TensorLike) -> Tensor: return self._le(y)
  def __ge__(self, y: TensorLike) -> Tensor: return self._le(y, True)
  def _le(self, y: TensorLike, reverse: bool = False) -> Tensor:
    a, b = self._broadcasted(y, reverse)
    return (b < a).logical_not() if not a.dtype.is_float else (a < b) | (a == b)  # not (b < a) is wrong for NaN
  def __ne__(self, y: TensorLike) -> Tensor: return self._binop(Ops.CMPNE, y)  # type: ignore[override]
  def __eq__(self, y: TensorLike) -> Tensor: return (self != y).logical_not()  # type: ignore[override]
  __hash__ = object.__hash__
  __array_ufunc__ = None  # numpy defers to our reflected ops: np.float32(2) * t is a Tensor, not an object array of 0-d Tensors
  def __bool__(self) -> bool: raise TypeError("the truth value of a Tensor is ambiguous; use .item() or .numpy()")
  def lt(self, y: TensorLike) -> Tensor: return self < y
  def eq(self, y: TensorLike) -> Tensor: return self == y

  def where(self, x: TensorLike, y: TensorLike) -> Tensor:
    """self ? x : y, elementwise with broadcasting."""
    if isinstance(x, Tensor): x, y = x._broadcasted(y)
    elif isinstance(y, Tensor): y, x = y._broadcasted(x)
    else: x, y = Tensor(x, device=self.device)._broadcasted(y)
    cond, x = self.cast(dtypes.bool)._broadcasted(x)
    cond, y = cond._broadcasted(y)
    x, y = x._broadcasted(y)
    return Tensor(cond.cast(dtypes.bool).uop.alu(Ops.WHERE, x.uop, y.uop), device=self.device)

  def maximum(self, y: TensorLike) -> Tensor: return self._binop(Ops.MAX, y)
  def minimum(self, y: TensorLike) -> Tensor:
    a, b = self._broadcasted(y)
    take_b = b < a if not a.dtype.is_float else (b < a) | (b != b)  # a NaN in either wins, like numpy
    return take_b.where(b, a)
  def abs(self) -> Tensor: return (self < 0).where(-self, self) if self.dtype not in (dtypes.bool, dtypes.uint8) else self
  def _float(self) -> Tensor: return self if self.dtype.is_float else self.cast(dtypes.default_float)
  def exp2(self) -> Tensor: return self._float()._alu(Ops.EXP2)
  def log2(self) -> Tensor: return self._float()._alu(Ops.LOG2)
  def _in_f32(self, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """fn of self as a float, computed in float32 and cast back: in float16 every step of a composite would round."""
    x = self._float()
    return fn(x) if x.dtype == dtypes.float32 else fn(x.cast(dtypes.float32)).cast(x.dtype)
  def exp(self) -> Tensor: return self._in_f32(lambda x: (x * (1 / math.log(2))).exp2())
  def log(self) -> Tensor: return self._in_f32(lambda x: x.log2() * math.log(2))
  def sqrt(self) -> Tensor: return self._float()._alu(Ops.SQRT)
  def rsqrt(self) -> Tensor: return self.sqrt().reciprocal()
  def sin(self) -> Tensor: return self._float()._alu(Ops.SIN)
  def cos(self) -> Tensor: return self._in_f32(lambda x: (math.pi / 2 - x).sin())
  def reciprocal(self) -> Tensor: return self._float()._alu(Ops.RECIP)
  def relu(self) -> Tensor: return self.maximum(0)
  def sigmoid(self) -> Tensor: return self._in_f32(lambda x: (1 + (-x).exp()).reciprocal())
  def tanh(self) -> Tensor: return self._in_f32(lambda x: 2.0 * (2.0 * x).sigmoid() - 1.0)
  def silu(self) -> Tensor: return self * self.sigmoid()
  def square(self) -> Tensor: return self * self
  def sign(self) -> Tensor: return self if self.dtype == dtypes.bool else (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype)
  def clip(self, min_: Scalar | None = None, max_: Scalar | None = None) -> Tensor:
    if min_ is None and max_ is None: raise ValueError("clip needs min_ or max_")
    ret = self if min_ is None else self.maximum(min_)
    return ret if max_ is None else ret.minimum(max_)

  def erf(self) -> Tensor: return self._in_f32(_erf)

  def gelu(self, approximate: str = "none") -> Tensor:
    if approximate == "tanh": return self._in_f32(lambda x: 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh()))
    if approximate != "none": raise ValueError(f"gelu approximate is 'none' or 'tanh', got {approximate!r}")
    return self._in_f32(lambda x: 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf()))

  def pow(self, y: TensorLike, reverse: bool = False) -> Tensor:
    if not reverse and isinstance(y, (int, float)) and not isinstance(y, bool) and math.isfinite(y) and y == int(y):
      base = self if isinstance(y, int) else self._float()  # an int tensor to an int power stays int, like torch
      ret, sq, n = None, base, abs(int(y))
      while n:  # square and multiply: exact for ints, one rounding per multiply for floats
        if n & 1: ret = sq if ret is None else ret * sq
        if n := n >> 1: sq = sq * sq
      ret = base.ones_like() if ret is None else ret
      return ret.reciprocal() if y < 0 else ret
    base, exp = self._broadcasted(y, reverse)
    dt, base, exp = base.dtype, base._float(), exp._float()
    mag = (exp * base.abs().log2()).exp2()
    is_int = exp == exp.cast(dtypes.int64).cast(exp.dtype)
    odd = (exp * 0.5) != (exp * 0.5).cast(dtypes.int64).cast(exp.dtype)
    neg = (base < 0).where(is_int.where(odd.where(-mag, mag), math.nan), mag)
    ret = (exp == 0).where(1.0, neg)
    # int ** int is int, like torch: the float result is within 1/4 of the answer, or under 1/2 in size where it truncates to 0
    return ret if dt.is_float else (ret + ret.sign() * 0.25).cast(dt)

  # ***** reductions *****
  def _reduce_axes(self, axis: Any) -> tuple[int, ...]:
    if axis is None: return tuple(range(self.ndim))
    return tuple(sorted({self._axis(a) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))}))

  def _reduce(self, op: Ops, axis: Any, keepdim: bool) -> Tensor:
    axes = self._reduce_axes(axis)
    if not self.ndim: return self
    ret = Tensor(UOp(Ops.REDUCE, self.dtype, (self.uop,), (op, axes)), device=self.device) if axes else self
    return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  def sum(self, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    dt = dtypes.from_any(dtype) if dtype else dtypes.int64 if self.dtype in (dtypes.bool, dtypes.uint8, dtypes.int32) else self.dtype
    if dt.is_float and dt.itemsize == 2:  # a float16 sum stalls at 2048 + 1, a bfloat16 one at 256 + 1
      return self.cast(dtypes.float32)._reduce(Ops.ADD, axis, keepdim).cast(dt)
    return self.cast(dt)._reduce(Ops.ADD, axis, keepdim)

  def _flip_order(self) -> Tensor:
    """An order-reversing map (its own inverse) used to build min from max."""
    if self.dtype.is_float: return -self
    return self ^ (True if self.dtype == dtypes.bool else -1 if self.dtype != dtypes.uint8 else 255)

  def max(self, axis: Any = None, keepdim: bool = False) -> Tensor: return self._reduce(Ops.MAX, axis, keepdim)
  def min(self, axis: Any = None, keepdim: bool = False) -> Tensor: return self._flip_order().max(axis, keepdim)._flip_order()
  def mean(self, axis: Any = None, keepdim: bool = False) -> Tensor:
    n = prod(s for i, s in enumerate(self.shape) if i in self._reduce_axes(axis))
    return self._float().sum(axis, keepdim) * (1 / n if n else math.nan)
  def var(self, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Tensor:
    n = prod(s for i, s in enumerate(self.shape) if i in self._reduce_axes(axis))
    sq = (self._float() - self.mean(axis, keepdim=True)).square().sum(axis, keepdim)
    return sq * (1 / (n - correction) if n - correction > 0 else math.nan)
  def std(self, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Tensor: return self.var(axis, keepdim, correction).sqrt()

  def argmax(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
    if axis is None: return self.flatten().argmax(0) if self.ndim else Tensor(0, dtypes.int64, self.device)
    if not self.ndim: return self.reshape(1).argmax(self._axis(axis))
    d = self._axis(axis)
    n = self.shape[d]
    is_max = self == self.max(d, keepdim=True)
    if self.dtype.is_float: is_max = is_max | (self != self)  # a NaN is the max wherever it is, like numpy
    rev = Tensor.arange(n, 0, -1, dtype=dtypes.int64, device=self.device).reshape((n,) + (1,) * (self.ndim - d - 1))
    return n - (is_max.where(rev, 0)).max(d, keepdim)
  def argmin(self, axis: int | None = None, keepdim: bool = False) -> Tensor: return self._flip_order().argmax(axis, keepdim)

  def softmax(self, axis: int = -1) -> Tensor:
    x = self._float()
    e = (x - x.max(axis, keepdim=True)).exp()
    return e / e.sum(axis, keepdim=True)
  def log_softmax(self, axis: int = -1) -> Tensor:
    x = self._float()
    shifted = x - x.max(axis, keepdim=True)
    return shifted - shifted.exp().sum(axis, keepdim=True).log()

  # ***** composites *****
  def matmul(self, w: Tensor) -> Tensor:
    if not isinstance(w, Tensor): raise TypeError(f"matmul needs a Tensor, got {type(w).__name__}")
    if self.ndim == 0 or w.ndim == 0: raise ValueError("matmul needs tensors of at least one dim")
    x, y = (self.unsqueeze(0) if self.ndim == 1 else self), (w.unsqueeze(-1) if w.ndim == 1 else w)
    if x.shape[-1] != y.shape[-2]: raise ValueError(f"matmul shapes {self.shape} and {w.shape} do not match (inner {x.shape[-1]} != {y.shape[-2]})")
    bx, by = x.shape[:-2], y.shape[:-2]
    if any(a != b and 1 not in (a, b) for a, b in zip(bx[::-1], by[::-1])):
      raise ValueError(f"matmul shapes {self.shape} and {w.shape}: batch dims {bx} and {by} do not broadcast")
    ret = (x.unsqueeze(-2) * y.transpose(-1, -2).unsqueeze(-3)).sum(-1, dtype=least_upper(x.dtype, y.dtype))
    if self.ndim == 1: ret = ret.squeeze(-2)
    return ret.squeeze(-1) if w.ndim == 1 else ret
  def dot(self, w: Tensor) -> Tensor: return self.matmul(w)

  def _windows(self, k: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int]) -> Tensor:
    """(..., H, W) -> (..., OH, OW, KH, KW) sliding windows as one strided view."""
    *lead, h, w = self.shape
    oh, ow = (h - dilation[0] * (k[0] - 1) - 1) // stride[0] + 1, (w - dilation[1] * (k[1] - 1) - 1) // stride[1] + 1
    if oh <= 0 or ow <= 0: raise ValueError(f"window {k} with dilation {dilation} does not fit input {h}x{w}")
    lead_strides = [prod(self.shape[i + 1:]) for i in range(len(lead))]
    view = View.create((*lead, oh, ow, *k), (*lead_strides, stride[0] * w, stride[1], dilation[0] * w, dilation[1]))
    windows = _view(self.uop, lambda v: None if not v.contiguous else View.create(view.shape, view.strides, v.offset), view.shape)
    return Tensor(windows, device=self.device)

  def conv2d(self, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Tensor:
    if self.ndim != 4 or weight.ndim != 4:
      raise ValueError(f"conv2d needs a (N, C, H, W) input and (O, C/groups, KH, KW) weight, got {self.shape} and {weight.shape}")
    (n, cin, _, _), (cout, cg, kh, kw) = self.shape, weight.shape
    if not isinstance(groups, int) or groups < 1: raise ValueError(f"conv2d groups is a positive int, got {groups!r}")
    if cin % groups or cout % groups or cin // groups != cg:
      raise ValueError(f"conv2d: {cin} input channels, weight {weight.shape} and groups {groups} do not match")
    if bias is not None and bias.shape != (cout,): raise ValueError(f"conv2d bias needs shape ({cout},), got {bias.shape}")
    st, pd, dl = (_pair(stride, 1), _pair(padding), _pair(dilation, 1))
    x = self.pad(((0, 0), (0, 0), (pd[0], pd[0]), (pd[1], pd[1])))._windows((kh, kw), st, dl)  # (N, C, OH, OW, KH, KW)
    oh, ow = x.shape[2:4]
    x = x.reshape(n, groups, 1, cg, oh, ow, kh, kw)
    wt = weight.reshape(1, groups, cout // groups, cg, 1, 1, kh, kw)
    ret = (x * wt).permute(0, 1, 2, 4, 5, 3, 6, 7).sum((5, 6, 7), dtype=least_upper(x.dtype, wt.dtype)).reshape(n, cout, oh, ow)
    return ret if bias is None else ret + bias.reshape(1, cout, 1, 1)

  def max_pool2d(self, kernel_size: Any = 2, stride: Any = None, padding: Any = 0, dilation: Any = 1) -> Tensor:
    if self.ndim < 2: raise ValueError(f"max_pool2d needs a tensor of at least 2 dims (..., H, W), got {self.shape}")
    k, pd = _pair(kernel_size, 1), _pair(padding)
    fill = -math.inf if self.dtype.is_float else dtypes.min(self.dtype)
    x = self.pad(((0, 0),) * (self.ndim - 2) + ((pd[0], pd[0]), (pd[1], pd[1])), value=fill)
    return x._windows(k, _pair(stride, 1) if stride is not None else k, _pair(dilation, 1)).max((-2, -1))

  def avg_pool2d(self, kernel_size: Any = 2, stride: Any = None, padding: Any = 0) -> Tensor:
    if self.ndim < 2: raise ValueError(f"avg_pool2d needs a tensor of at least 2 dims (..., H, W), got {self.shape}")
    k, pd = _pair(kernel_size, 1), _pair(padding)
    x = self.pad(((0, 0),) * (self.ndim - 2) + ((pd[0], pd[0]), (pd[1], pd[1])))
    return x._windows(k, _pair(stride, 1) if stride is not None else k, (1, 1)).mean((-2, -1))

  def layernorm(self, axis: Any = -1, eps: float = 1e-5, weight: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    x = self._float()
    y = (x - x.mean(axis, keepdim=True)) * (x.var(axis, keepdim=True, correction=0) + eps).rsqrt()
    if weight is not None: y = y * weight
    return y if bias is None else y + bias


def _erf(x: Tensor) -> Tensor:
  # Abramowitz & Stegun 7.1.26, absolute error under 1.5e-7
  t = 1.0 / (1.0 + 0.3275911 * x.abs())
  poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
  return x.sign() * (1.0 - poly * (-x * x).exp())


def _pair(x: Any, lo: int = 0) -> tuple[int, int]:
  ret = tuple(x) if isinstance(x, (tuple, list)) else (x, x)
  if len(ret) != 2 or not all(isinstance(v, int) and v >= lo for v in ret): raise ValueError(f"expected an int >= {lo} or a pair of them, got {x!r}")
  return ret  # type: ignore[return-value]
