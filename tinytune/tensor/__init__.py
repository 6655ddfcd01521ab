"""The lazy Tensor: PyTorch/tinygrad-like API over a UOp graph. Nothing runs before realize()/numpy()/tolist()/item().

This module holds what every op needs: construction, realization, broadcasting and the primitives (ALU, cast, view,
reduce). The ops live by job in creation, movement, indexing, elementwise, reduce, functional and losses; the end of the class
lists them. Those modules see `Tensor` as a global set at the bottom of this one."""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Union

import numpy as np

from tinytune.dtype import DType, dtypes, least_upper
from tinytune.errors import OpDTypeError
from tinytune.helpers import prod
from tinytune.runtime import Buffer, Device
from tinytune.shape import View
from tinytune.tensor import autograd, checks, creation, elementwise, functional, indexing, losses, movement, reduce
from tinytune.tensor.movement import view_uop
from tinytune.uop import Ops, UOp

Scalar = Union[int, float, bool]
TensorLike = Union["Tensor", Scalar]


@functools.lru_cache(maxsize=1024)
def _broadcast_const(dtype: DType, value: Scalar, negative_zero: bool, shape: tuple[int, ...]) -> UOp:
  """The node that reads one constant at every place of `shape` (the constant itself where shape is ()), kept for the next op with
  it: a step's graph is built again every step. Equal values are one constant of a dtype, but for -0.0, which equals 0.0.
  A constant never holds a buffer (see schedule.mark_realized), so those kept cost a few nodes."""
  c = UOp.const(dtype, value)
  return UOp(Ops.VIEW, dtype, (c,), View.create(shape, (0,) * len(shape))) if shape else c


class Tensor:
  """A lazy n-dimensional array on a device."""
  # class-wide defaults, so that a tensor which never meets autograd carries nothing for it
  requires_grad: bool | None = None
  grad: Tensor | None = None
  _ctx: tuple[autograd.Rule, tuple[Tensor, ...]] | None = None  # how this tensor was computed from ones that require grad
  _memory: Buffer | None = None  # memory of its own that assign writes, once it has had one
  _pending = False  # an assign waits for realize to write it
  _view: tuple[Tensor, str, Any] | None = None  # (base, movement, arg) where this tensor is a movement of memory: assign writes through
  no_grad = False  # True: ops record nothing for backward (see tinytune.no_grad())
  training = False  # dropout only drops while training (see Tensor.train())

  def __init__(self, data: Any, dtype: Any = None, device: str | None = None, requires_grad: bool | None = None):
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
      if dt is None:  # an array keeps its dtype (as torch.from_numpy); Python lists of floats give default_float, of ints int64
        dt = dtypes.from_any(arr.dtype) if isinstance(data, (np.ndarray, np.generic)) or arr.dtype.kind not in "fiu" else \
          dtypes.default_float if arr.dtype.kind == "f" else dtypes.int64
      buf = Buffer(self.device, arr.size, dt).copyin(arr.astype(dt.np))
      self.uop = UOp(Ops.VIEW, dt, (UOp(Ops.BUFFER, dt, (), buf),), View.create(arr.shape))
    if requires_grad is not None: self.requires_grad_(requires_grad)

  @staticmethod
  def _of(uop: UOp, device: str) -> Tensor:
    """A Tensor of an op's node on a canonical device: what Tensor(uop, device=device) makes, without its checks (every op calls it)."""
    ret = object.__new__(Tensor)
    ret.uop, ret.device = uop, device
    return ret

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
  def realize(self, *others: Tensor) -> Tensor:
    """Compute this tensor and `others` together: every value first, from the memory as it was, then the pending assigns'
    writes. Returns self."""
    if checks.pending: checks.run_pending()
    if not others and not self._pending:  # the common case: one value, nothing to write
      self.uop = realize(self.uop, self.device)
      if not self.requires_grad: self._ctx = None  # as tinygrad: a realized tensor that does not require grad is where gradients stop
      return self
    tensors = (self, *others)
    try: values = realize_all([(t.uop, t.device, t._memory if t._pending else None) for t in tensors])
    except BaseException:  # a bad index raises before any write (see plan_order): each pending assign is dropped, its memory as it was
      for t in tensors:
        if t._pending: t.uop, t._pending = buffer_view(t._memory, t.shape), False  # type: ignore[arg-type]
      raise
    for t, u in zip(tensors, values):
      t.uop, t._pending = u, False
      if not t.requires_grad: t._ctx = None
    return self

  def assign(self, x: Tensor | Scalar) -> Tensor:
    """Give this tensor x's values, written into its own memory once realized (so a TinyJit replay updates it in place: how the
    optimizers update parameters). Until then it reads as x."""
    if not isinstance(x, Tensor): x = self.full_like(x)
    if x.shape != self.shape: raise ValueError(f"assign of shape {x.shape} to a tensor of shape {self.shape}")
    if x.device != self.device: raise ValueError(f"assign from {x.device} to a tensor on {self.device}")
    if x.dtype != self.dtype: raise TypeError(f"assign of {x.dtype.name} to a {self.dtype.name} tensor; cast it first")
    if self._view is not None: return self._assign_through(x)
    if not self._pending and (self._memory is None or self.uop is not buffer_view(self._memory, self.shape)):
      # first a copy in memory of its own: realizes of equal graphs share their buffers
      self._memory = Buffer(self.device, self.numel(), self.dtype)
      self.uop = realize(self.uop, self.device, into=self._memory)
    self.uop, self._pending = x.uop, True
    if not self.requires_grad: self._ctx = None  # no gradient through an assign, as tinygrad
    return self

  def _assign_through(self, x: Tensor) -> Tensor:
    """assign to a view of another tensor's memory (a slice, reshape, permute, flip): the base gets x's values at the view's places,
    written at once (as setitem), and this tensor reads the base again, as torch's views do. An expanded view raises, as in torch."""
    chain, t = [], self
    while t._view is not None:
      base, op, arg = t._view
      if op == "expand" and arg != base.shape:
        raise RuntimeError("unsupported operation: more than one element of the written-to tensor refers to a single memory location. "
                           "Please clone() the tensor before performing the operation.")
      chain.append((base, op, arg, t.shape))
      t = base
    with autograd.no_grad():
      val, hit = x, x._const_like(True, dtypes.bool)
      for base, op, arg, _ in chain:  # each movement undone, as its gradient is: a slice's places padded back with False
        undo = autograd.move_rule(op, base, arg)
        val, hit = undo(val)[0], undo(hit)[0]  # type: ignore[assignment]  # a movement's rule always gives its input's
      t.assign(hit.where(val, t)).realize()
      for base, op, arg, shape in reversed(chain): t = t._move(op, arg, shape)
    self.uop = t.uop
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
  def contiguous(self) -> Tensor:
    ret = Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)), device=self.device)
    return autograd.record(ret, (self,), lambda g: (g,)) if autograd.tracking(self) else autograd.untracked(ret)

  # ***** autograd *****
  def requires_grad_(self, requires_grad: bool = True) -> Tensor:
    if requires_grad and not self.dtype.is_float: raise TypeError(f"only float tensors can require grad, this one is {self.dtype.name}")
    if not self.requires_grad: self._ctx = None  # a tensor made to require grad is a leaf (a parameter), not the ops that made it
    self.requires_grad = requires_grad
    return self

  @staticmethod
  def train(mode: bool = True) -> autograd.Switch:
    """Tensor.training is `mode` inside: `with Tensor.train():` or `@Tensor.train()` (dropout and batchnorm read it)."""
    return autograd.Switch("training", mode)
  @staticmethod
  def test() -> autograd.Switch: return Tensor.train(False)

  def detach(self) -> Tensor:
    """The same values, cut from the graph: no gradient flows through it (requires_grad False)."""
    ret = Tensor(self.uop, device=self.device)
    ret.requires_grad = False
    return ret

  def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
    """d(self)/d(target) for each target as lazy tensors (zeros where self does not depend on one), whatever the targets'
    requires_grad says (as tinygrad) but False, which stops the graph there; self must have one element unless `gradient`,
    d(loss)/d(self), is given."""
    if self.requires_grad is False: raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
    if any(t.requires_grad is False for t in targets): raise RuntimeError("One of the differentiated Tensors does not require grad")
    grads = autograd.gradient(self, targets, autograd.check_seed(self, gradient))
    return [g if g is not None else t.zeros_like() for g, t in zip(grads, targets)]

  def backward(self, gradient: Tensor | None = None) -> Tensor:
    """Add d(self)/d(t) to the .grad of every float tensor t that self is computed from (self too), up to those that do not require
    grad (False), whether t requires grad (True) or may (None), as tinygrad: parameters, inputs and the ops between them (lazily: nothing
    runs until realized). A tensor that self does not depend on through its gradient rules (an index) gets none."""
    if self.requires_grad is False: raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
    seed = autograd.check_seed(self, gradient)
    targets = autograd.in_graph(self)
    for t, g in zip(targets, autograd.gradient(self, targets, seed)):
      if g is not None: t.grad = g if t.grad is None else t.grad + g
    return self

  # ***** the primitives every op is built from *****
  def _axis(self, axis: int, ndim: int | None = None) -> int:
    ndim = self.ndim if ndim is None else ndim
    if not isinstance(axis, int): raise TypeError(f"an axis is an int, got {axis!r}")
    if not -max(ndim, 1) <= axis < max(ndim, 1): raise IndexError(f"axis {axis} is out of range for {ndim} dims")
    return axis % max(ndim, 1)

  def _move(self, op: str, arg: Any, shape: tuple[int, ...]) -> Tensor:
    """A movement (a View method: reshape, permute, expand, pad, shrink, flip) to `shape`; no data moves."""
    ret = Tensor._of(view_uop(self.uop, lambda v: getattr(v, op)(arg), shape), self.device)
    if self._view is not None or self.uop.op is Ops.VIEW and self.uop.src[0].op is Ops.BUFFER: ret._view = (self, op, arg)
    return autograd.record(ret, (self,), autograd.move_rule(op, self, arg)) if autograd.tracking(self) else autograd.untracked(ret)

  def _const_like(self, v: Scalar, dtype: DType | None = None) -> Tensor:
    return Tensor(UOp.const(dtype or self.dtype, v), device=self.device).reshape((1,) * self.ndim).expand(self.shape)

  def _broadcasted(self, y: TensorLike, reverse: bool = False) -> tuple[Tensor, Tensor]:
    x: Tensor = self
    if not isinstance(y, Tensor):
      if type(y) not in (float, int, bool):
        if isinstance(y, (np.bool_, np.integer, np.floating, dtypes.bfloat16.np)): y = y.item()  # numpy scalars combine like python numbers
        if not isinstance(y, (int, float, bool)): raise TypeError(f"cannot combine a Tensor with {type(y).__name__}")
      xdt = x.uop.dtype
      dt = xdt if not (isinstance(y, float) and xdt.kind != "f") else dtypes.default_float
      if isinstance(y, int) and not isinstance(y, bool) and xdt is dtypes.bool: dt = dtypes.default_int
      # broadcast at once: the node reshape and expand would build, without building them
      y = Tensor._of(_broadcast_const(dt, y, y == 0 and math.copysign(1.0, y) < 0, x.uop.shape), x.device)
      y.requires_grad = False  # a number: no gradient goes to it
      if dt is xdt: return (y, x) if reverse else (x, y)  # the common case: nothing to cast or broadcast
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

  def _alu(self, op: Ops, *srcs: Tensor) -> Tensor:
    ret = Tensor._of(self.uop.alu(op, srcs[0].uop) if len(srcs) == 1 else self.uop.alu(op, *[s.uop for s in srcs]), self.device)
    if not autograd.tracking(self, *srcs): return autograd.untracked(ret)
    return autograd.record(ret, inputs := (self, *srcs), autograd.alu_rule(op, inputs, ret))
  def _binop(self, op: Ops, y: TensorLike, reverse: bool = False) -> Tensor:
    a, b = self._broadcasted(y, reverse)
    return a._alu(op, b)

  def cast(self, dtype: Any) -> Tensor:
    if dtype is self.dtype: return self
    dt = dtypes.from_any(dtype)
    if dt == self.dtype: return self
    ret = Tensor._of(self.uop.cast(dt), self.device)
    return autograd.record(ret, (self,), autograd.cast_rule(self)) if autograd.tracking(self) else autograd.untracked(ret)

  # ***** operators *****
  def __neg__(self) -> Tensor: return self.neg()
  def __add__(self, y: TensorLike) -> Tensor: return self._binop(Ops.ADD, y)  # add's body: the commonest ops take one call less
  def __radd__(self, y: TensorLike) -> Tensor: return self._binop(Ops.ADD, y, True)
  def __sub__(self, y: TensorLike) -> Tensor: return self.sub(y)
  def __rsub__(self, y: TensorLike) -> Tensor: return self.sub(y, True)
  def __mul__(self, y: TensorLike) -> Tensor: return self._binop(Ops.MUL, y)
  def __rmul__(self, y: TensorLike) -> Tensor: return self._binop(Ops.MUL, y, True)
  def __truediv__(self, y: TensorLike) -> Tensor: return self.div(y)
  def __rtruediv__(self, y: TensorLike) -> Tensor: return self.div(y, True)
  def __pow__(self, y: TensorLike) -> Tensor: return self.pow(y)
  def __rpow__(self, y: TensorLike) -> Tensor: return self.pow(y, True)
  def __matmul__(self, y: Tensor) -> Tensor: return self.matmul(y)
  def __and__(self, y: TensorLike) -> Tensor: return self._bitwise(Ops.AND, y)
  def __or__(self, y: TensorLike) -> Tensor: return self._bitwise(Ops.OR, y)
  def __xor__(self, y: TensorLike) -> Tensor: return self._bitwise(Ops.XOR, y)
  def __rand__(self, y: TensorLike) -> Tensor: return self.bitwise_and(y, True)
  def __ror__(self, y: TensorLike) -> Tensor: return self.bitwise_or(y, True)
  def __rxor__(self, y: TensorLike) -> Tensor: return self.bitwise_xor(y, True)
  def __floordiv__(self, y: TensorLike) -> Tensor: return self.div(y, rounding_mode="floor")
  def __rfloordiv__(self, y: TensorLike) -> Tensor: return self.div(y, True, rounding_mode="floor")
  def __mod__(self, y: TensorLike) -> Tensor: return self.mod(y)
  def __rmod__(self, y: TensorLike) -> Tensor: return self.mod(y, True)
  def __lshift__(self, y: TensorLike) -> Tensor: return self.lshift(y)
  def __rlshift__(self, y: TensorLike) -> Tensor: return self.lshift(y, True)
  def __rshift__(self, y: TensorLike) -> Tensor: return self.rshift(y)
  def __rrshift__(self, y: TensorLike) -> Tensor: return self.rshift(y, True)
  def __invert__(self) -> Tensor:
    if self.dtype.is_float: raise OpDTypeError(f"bitwise not needs a bool or int tensor, got {self.dtype.name}")
    return self.logical_not() if self.dtype == dtypes.bool else self ^ -1

  def __lt__(self, y: TensorLike) -> Tensor: return self._binop(Ops.CMPLT, y)
  def __gt__(self, y: TensorLike) -> Tensor: return self._binop(Ops.CMPLT, y, True)
  def __le__(self, y: TensorLike) -> Tensor: return self._le(y)
  def __ge__(self, y: TensorLike) -> Tensor: return self._le(y, True)
  def __ne__(self, y: TensorLike) -> Tensor: return self._binop(Ops.CMPNE, y)  # type: ignore[override]
  def __eq__(self, y: TensorLike) -> Tensor: return (self != y).logical_not()  # type: ignore[override]
  __hash__ = object.__hash__
  __array_ufunc__ = None  # numpy defers to our reflected ops: np.float32(2) * t is a Tensor, not an object array of 0-d Tensors
  def __bool__(self) -> bool: raise TypeError("the truth value of a Tensor is ambiguous; use .item() or .numpy()")

  def _float(self) -> Tensor: return self if self.dtype.is_float else self.cast(dtypes.default_float)
  def _in_f32(self, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """fn of self as a float, a 16-bit float computed in float32 and cast back: in float16 every step of a composite would round."""
    x = self._float()
    return fn(x) if x.dtype.itemsize >= 4 else fn(x.cast(dtypes.float32)).cast(x.dtype)

  def _reduce_axes(self, axis: Any) -> tuple[int, ...]:
    if axis is None: return tuple(range(self.ndim))
    return tuple(sorted({self._axis(a) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))}))

  def _reduce(self, op: Ops, axis: Any, keepdim: bool) -> Tensor:
    axes = self._reduce_axes(axis)
    if not self.ndim: return self
    if not axes: return self
    x = self
    # max's gradient finds the maximum by comparing the input with the result: computed again in another kernel, an input
    # expression may round otherwise (a contracted multiply-add), so the input is computed once, into memory, and both read it
    if op is Ops.MAX and autograd.training(self) and not (self.uop.op is Ops.VIEW and self.uop.src[0].op is Ops.BUFFER): x = self.contiguous()
    ret = Tensor(UOp(Ops.REDUCE, x.dtype, (x.uop,), (op, axes)), device=self.device)
    if autograd.tracking(x): autograd.record(ret, (x,), autograd.reduce_rule(op, x, ret, axes))
    else: autograd.untracked(ret)
    return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  def _gather(self, dim: int, index: Tensor) -> Tensor:
    """out[p] = self[p with p[dim] = index[p]]: index (an int tensor) has self's shape but at dim; an index out of range reads 0.
    The one op that reads at a place computed from data, in O(outputs): X[idx] and gather are built on it."""
    ret = Tensor(UOp(Ops.GATHER, self.dtype, (self.uop, index.uop), dim), device=self.device)
    return autograd.record(ret, (self,), autograd.gather_rule(self, dim, index)) if autograd.tracking(self) else autograd.untracked(ret)

  # ***** the ops, by job: each lives in the module named here *****
  # creation.py
  _shape_arg = staticmethod(creation._shape_arg); full = staticmethod(creation.full); zeros = staticmethod(creation.zeros)
  ones = staticmethod(creation.ones); arange = staticmethod(creation.arange); eye = staticmethod(creation.eye)
  manual_seed = staticmethod(creation.manual_seed); rand = staticmethod(creation.rand); randn = staticmethod(creation.randn)
  uniform = staticmethod(creation.uniform); randint = staticmethod(creation.randint)
  full_like = creation.full_like; zeros_like = creation.zeros_like; ones_like = creation.ones_like
  rand_like = creation.rand_like; randn_like = creation.randn_like
  empty = staticmethod(creation.empty); linspace = staticmethod(creation.linspace); meshgrid = creation.meshgrid
  tril = creation.tril; triu = creation.triu; diagonal = creation.diagonal; diag = creation.diag
  normal = staticmethod(creation.normal); kaiming_uniform = staticmethod(creation.kaiming_uniform)
  kaiming_normal = staticmethod(creation.kaiming_normal); glorot_uniform = staticmethod(creation.glorot_uniform)
  scaled_uniform = staticmethod(creation.scaled_uniform)
  # movement.py
  reshape = movement.reshape; permute = movement.permute; transpose = movement.transpose; T = property(movement.T)
  expand = movement.expand; _pairs = movement._pairs; pad = movement.pad; shrink = movement.shrink; flip = movement.flip
  flatten = movement.flatten; squeeze = movement.squeeze; unsqueeze = movement.unsqueeze; cat = movement.cat
  stack = movement.stack; clone = movement.clone; view = movement.view; unflatten = movement.unflatten; repeat = movement.repeat
  repeat_interleave = movement.repeat_interleave; roll = movement.roll; split = movement.split; chunk = movement.chunk
  unfold = movement.unfold; einsum = staticmethod(movement.einsum)
  # indexing.py
  __getitem__ = indexing.getitem; __setitem__ = indexing.setitem; _pick = staticmethod(indexing._pick); gather = indexing.gather
  scatter = indexing.scatter; scatter_reduce = indexing.scatter_reduce; one_hot = indexing.one_hot; masked_fill = indexing.masked_fill
  masked_select = indexing.masked_select; nonzero = indexing.nonzero
  # elementwise.py
  add = elementwise.add; mul = elementwise.mul; sub = elementwise.sub; div = elementwise.div; neg = elementwise.neg; idiv = elementwise.idiv
  logical_not = elementwise.logical_not; _bitwise = elementwise._bitwise; _le = elementwise._le; lt = elementwise.lt; eq = elementwise.eq
  where = elementwise.where; maximum = elementwise.maximum; minimum = elementwise.minimum; abs = elementwise.abs
  exp2 = elementwise.exp2; log2 = elementwise.log2; exp = elementwise.exp; log = elementwise.log; sqrt = elementwise.sqrt
  rsqrt = elementwise.rsqrt; sin = elementwise.sin; cos = elementwise.cos; reciprocal = elementwise.reciprocal
  relu = elementwise.relu; sigmoid = elementwise.sigmoid; tanh = elementwise.tanh; silu = elementwise.silu; _scaled_silu = elementwise._scaled_silu
  square = elementwise.square; sign = elementwise.sign; clip = elementwise.clip; erf = elementwise.erf; gelu = elementwise.gelu
  pow = elementwise.pow; clamp = elementwise.clip; trunc = elementwise.trunc; floor = elementwise.floor; ceil = elementwise.ceil
  round = elementwise.round; fmod = elementwise.fmod; mod = elementwise.mod; isnan = elementwise.isnan; isinf = elementwise.isinf
  isfinite = elementwise.isfinite; isclose = elementwise.isclose; copysign = elementwise.copysign; lerp = elementwise.lerp
  float = elementwise.float_; half = elementwise.half; int = elementwise.int_; bool = elementwise.bool_; double = elementwise.double
  long = elementwise.long; short = elementwise.short; char = elementwise.char; byte = elementwise.byte; bfloat16 = elementwise.bfloat16
  bitcast = elementwise.bitcast; signbit = elementwise.signbit
  bitwise_and = elementwise.bitwise_and; bitwise_or = elementwise.bitwise_or; bitwise_xor = elementwise.bitwise_xor
  bitwise_not = elementwise.bitwise_not; lshift = elementwise.lshift; rshift = elementwise.rshift
  tan = elementwise.tan; atan = elementwise.atan; asin = elementwise.asin; acos = elementwise.acos; sinh = elementwise.sinh
  cosh = elementwise.cosh; asinh = elementwise.asinh; acosh = elementwise.acosh; atanh = elementwise.atanh; log10 = elementwise.log10
  logaddexp = elementwise.logaddexp; elu = elementwise.elu; celu = elementwise.celu; selu = elementwise.selu
  softplus = elementwise.softplus; logsigmoid = elementwise.logsigmoid; mish = elementwise.mish; softsign = elementwise.softsign
  hardsigmoid = elementwise.hardsigmoid; hardswish = elementwise.hardswish; hardtanh = elementwise.hardtanh; relu6 = elementwise.relu6
  leaky_relu = elementwise.leaky_relu; quick_gelu = elementwise.quick_gelu; swish = elementwise.swish; softmin = elementwise.softmin
  normalize = elementwise.normalize
  # reduce.py
  sum = reduce.sum; _flip_order = reduce._flip_order; max = reduce.max; min = reduce.min; mean = reduce.mean; var = reduce.var
  std = reduce.std; argmax = reduce.argmax; argmin = reduce.argmin; prod = reduce.prod; all = reduce.all; any = reduce.any
  logsumexp = reduce.logsumexp; std_mean = reduce.std_mean; cumsum = reduce.cumsum; cumprod = reduce.cumprod
  cummax = reduce.cummax; cummin = reduce.cummin; logcumsumexp = reduce.logcumsumexp; sort = reduce.sort
  argsort = reduce.argsort; topk = reduce.topk
  # functional.py
  dropout = functional.dropout; softmax = functional.softmax; log_softmax = functional.log_softmax; matmul = functional.matmul
  dot = functional.dot; _windows = functional._windows; conv2d = functional.conv2d; max_pool2d = functional.max_pool2d
  avg_pool2d = functional.avg_pool2d; layernorm = functional.layernorm
  conv_transpose2d = functional.conv_transpose2d; max_unpool2d = functional.max_unpool2d; interpolate = functional.interpolate
  batchnorm = functional.batchnorm
  scaled_dot_product_attention = functional.scaled_dot_product_attention
  # losses.py
  cross_entropy = losses.cross_entropy; nll_loss = losses.nll_loss; binary_crossentropy = losses.binary_crossentropy
  binary_crossentropy_logits = losses.binary_crossentropy_logits; sparse_categorical_crossentropy = losses.sparse_categorical_crossentropy


for _job in (creation, movement, indexing, elementwise, reduce, functional, losses): setattr(_job, "Tensor", Tensor)  # their ops build Tensors
# the engine imports this module (TinyJit's replay returns Tensors): bound here, once Tensor exists, not by an import statement in
# realize(), which cost 1.3 us of every realize (a one-kernel step's 27 on a loaded Zen 4)
from tinytune.engine.realize import realize, realize_all  # noqa: E402
from tinytune.engine.schedule import buffer_view  # noqa: E402
