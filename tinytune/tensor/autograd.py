"""Reverse-mode autograd. A Tensor computed from ones that require grad remembers its inputs and the rule that maps its gradient
to theirs; backward() walks those records from the output. Gradients are lazy Tensors like any other, so the backward
kernels fuse with each other and with an optimizer's update, and can be tuned.

The rules are written for the primitives only (ALU ops, cast, reduce, gather, the six movements, sliding windows); every other op
is a composition of them and is differentiated through them."""
from __future__ import annotations

import contextlib
import itertools
import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

from tinytune.uop import Ops

if TYPE_CHECKING:
  from tinytune.tensor import Tensor

Rule = Callable[["Tensor"], Sequence["Tensor | None"]]  # the output's gradient -> one gradient (or None) per input


def tracking(*inputs: Tensor) -> bool:
  """Whether an op on these inputs records itself: grad is on and one of them may need a gradient (requires_grad True, or None
  as by default: gradient() may be asked of any tensor, as in tinygrad; False stops it)."""
  if inputs[0].no_grad: return False
  for t in inputs:  # (a loop, not any() over a generator: every op asks)
    if t.requires_grad is not False: return True
  return False


def training(*inputs: Tensor) -> bool:
  """Whether one of these inputs requires grad (True): ops then take the forms built for backward, which inference would pay for."""
  return not inputs[0].no_grad and any(t.requires_grad for t in inputs)


def record(ret: Tensor, inputs: tuple[Tensor, ...], rule: Rule) -> Tensor:
  """ret with its rule; it requires grad where an input does, else None (a gradient may still be asked of it)."""
  if ret.uop.dtype.kind == "f": ret.requires_grad, ret._ctx = True if True in [t.requires_grad for t in inputs] else None, (rule, inputs)
  return ret


def untracked(ret: Tensor) -> Tensor:
  """ret of an op that records nothing (grad off, or no input may need a gradient): as in PyTorch, it does not require grad."""
  ret.requires_grad = False
  return ret


def deferred(*inputs: Tensor) -> bool:
  """Whether an op takes its inference form and differentiates its training form only if asked (see lazily)."""
  return tracking(*inputs) and not training(*inputs)


def lazily(fn: Callable[..., Tensor], *inputs: Tensor) -> Tensor:
  """fn(*inputs) computed by its inference form (inputs detached), with a rule that builds fn's training form, on inputs that
  require grad, only when a gradient is asked of it: tensors that do not require grad keep inference's kernels."""
  ret = fn(*(t.detach() for t in inputs))
  def rule(g: Tensor) -> list[Tensor | None]:
    leaves = [t.detach().requires_grad_(t.dtype.is_float and wanted(t)) for t in inputs]
    with Switch("no_grad", False): out = fn(*leaves)
    return gradient(out, leaves, g.cast(out.dtype))
  return record(ret, inputs, rule)


_needed: set[int] = set()  # ids of the tensors the running gradient() reaches a target through


def wanted(t: Tensor) -> bool:
  """Whether the running gradient() needs t's gradient: a rule skips the work of one that is not."""
  return id(t) in _needed


def alu_rule(op: Ops, inputs: tuple[Tensor, ...], out: Tensor) -> Rule:
  """The gradient rule of one ALU op, given its inputs and output."""
  x = inputs[0]
  if op is Ops.ADD: return lambda g: (g, g)
  if op is Ops.MUL: return lambda g: (g * inputs[1], g * x)
  if op is Ops.NEG: return lambda g: (-g,)
  if op is Ops.RECIP: return lambda g: (-g * out * out,)
  if op is Ops.SQRT: return lambda g: (g / (out * 2),)
  if op is Ops.EXP2: return lambda g: (g * out * math.log(2),)
  if op is Ops.LOG2: return lambda g: (g / (x * math.log(2)),)
  if op is Ops.SIN: return lambda g: (g * (math.pi / 2 - x).sin(),)
  if op is Ops.MAX:  # ties share the gradient evenly, as torch does
    def max_rule(g: Tensor) -> tuple[Tensor, Tensor]:
      y = inputs[1]
      share = (x > y).where(1.0, (x == y).where(0.5, 0.0)).cast(g.dtype)
      # into memory: a matmul's backward reads this gradient once per output tile, and comparisons do not vectorize there
      return (g * share).contiguous(), (g * (1 - share)).contiguous()
    return max_rule
  if op is Ops.WHERE: return lambda g: (None, x.where(g, 0.0), x.where(0.0, g))
  return lambda g: (None,) * len(inputs)  # comparisons, integer and bitwise ops have no gradient


def cast_rule(x: Tensor) -> Rule: return lambda g: (g.cast(x.dtype) if x.dtype.is_float else None,)


def reduce_rule(op: Ops, x: Tensor, out: Tensor, axes: tuple[int, ...]) -> Rule:
  if op is Ops.ADD: return lambda g: (g.expand(x.shape),)
  def max_rule(g: Tensor) -> tuple[Tensor]:  # every element equal to the max shares its gradient evenly, as torch's amax does
    xs, m = x, out
    if not (x.uop.op is Ops.CONTIGUOUS or x.uop.op is Ops.VIEW and x.uop.src[0].op is Ops.BUFFER):
      # an expression computed again in another kernel may round otherwise (see Tensor._reduce): here, once, into memory
      xs = x.contiguous()
      m = xs.max(axes, keepdim=True)
    hit = (xs == m.expand(x.shape)).cast(g.dtype)
    return (hit * (g / hit.sum(axes, keepdim=True)).expand(x.shape),)
  return max_rule


def move_rule(op: str, x: Tensor, arg: Any) -> Rule:
  """The gradient of a movement is the opposite movement of the output's gradient; an expand's is a sum."""
  if op == "reshape": return lambda g: (g.reshape(x.shape),)
  if op == "permute": return lambda g: (g.permute(tuple(sorted(range(len(arg)), key=lambda i: arg[i]))),)
  if op == "expand": return lambda g: (g.sum(tuple(i for i, (a, b) in enumerate(zip(x.shape, arg)) if a != b), keepdim=True),)
  if op == "pad": return lambda g: (g.shrink(tuple((b, b + s) for (b, _), s in zip(arg, x.shape))),)
  if op == "shrink": return lambda g: (g.pad(tuple((b, s - e) for (b, e), s in zip(arg, x.shape))),)
  if op == "flip": return lambda g: (g.flip(arg),)
  raise ValueError(f"no movement {op!r}")


def gather_rule(x: Tensor, dim: int, index: Tensor) -> Rule:
  """A gather's gradient adds each output's gradient back at the place it read: a sum over the index's dim d of where(index == i, g, 0)
  for each i of x's dim d, a composition that costs one compare per output and place (out of range indices read 0 and get nothing)."""
  def rule(g: Tensor) -> tuple[Tensor]:
    hit = index.unsqueeze(-1) == type(x).arange(x.shape[dim], device=x.device)  # index's shape + (n,)
    got = hit.where(g.unsqueeze(-1), 0.0).sum(dim, keepdim=True)  # 1 at dim d, + (n,)
    return (got.transpose(dim, -1).reshape(x.shape),)
  return rule


def window_rule(x: Tensor, k: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Rule:
  """Sliding windows read each input element once per window that covers it: the gradient adds the windows' gradients back in
  place, one strided, padded slice of the output's gradient per kernel position."""
  d = len(k)
  spatial = x.shape[-d:]
  def rule(g: Tensor) -> tuple[Tensor]:
    total = None
    for at in itertools.product(*(range(n) for n in k)):
      piece = g[(Ellipsis, *at)]
      for i, s in enumerate(stride): piece = _spread(piece, i - d, s)
      starts = [a * dl for a, dl in zip(at, dilation)]
      piece = piece.pad(((0, 0),) * (x.ndim - d) + tuple((b, n - b - p) for b, n, p in zip(starts, spatial, piece.shape[-d:])))
      total = piece if total is None else total + piece
    assert total is not None
    return (total,)
  return rule


def _spread(x: Tensor, axis: int, step: int) -> Tensor:
  """x with step - 1 zeros between its elements along axis."""
  if step == 1 or x.shape[axis] <= 1: return x
  axis, n = axis % x.ndim, x.shape[axis]
  x = x.unsqueeze(axis + 1).pad(tuple((0, step - 1) if i == axis + 1 else (0, 0) for i in range(x.ndim + 1)))
  x = x.reshape(x.shape[:axis] + (n * step,) + x.shape[axis + 2:])
  return x.shrink(tuple((0, (n - 1) * step + 1) if i == axis else None for i in range(x.ndim)))


def gradient(out: Tensor, targets: Sequence[Tensor], seed: Tensor) -> list[Tensor | None]:
  """d(out)/d(target) for each target, as lazy Tensors (None where a target does not affect out); seed is d(loss)/d(out)."""
  order: list[Tensor] = []
  seen: set[int] = set()
  stack: list[tuple[Tensor, bool]] = [(out, False)]
  while stack:  # tensors in dependency order, inputs first
    t, done = stack.pop()
    if done: order.append(t); continue
    if id(t) in seen: continue
    seen.add(id(t))
    stack.append((t, True))
    if t._ctx is not None: stack.extend((s, False) for s in t._ctx[1] if s.requires_grad is not False and id(s) not in seen)
  targeted = {id(t) for t in targets}
  needed = set()  # the tensors a target is reached through: only their gradients are built
  for t in order:
    if id(t) in targeted or t._ctx is not None and any(id(s) in needed for s in t._ctx[1]): needed.add(id(t))
  grads: dict[int, Tensor] = {id(out): seed}
  found: dict[int, Tensor] = {}
  before = set(_needed)
  _needed.clear(); _needed.update(needed)
  try:
    with no_grad():
      for t in reversed(order):
        if (g := grads.pop(id(t), None)) is None: continue
        if id(t) in targeted: found[id(t)] = g
        if t._ctx is None or id(t) not in needed: continue
        rule, inputs = t._ctx
        for s, gs in zip(inputs, rule(g)):
          if gs is None or id(s) not in needed: continue
          if gs.dtype != s.dtype: gs = gs.cast(s.dtype)
          grads[id(s)] = gs if (prev := grads.get(id(s))) is None else prev + gs
  finally: _needed.clear(); _needed.update(before)
  return [found.get(id(t)) for t in targets]


def in_graph(out: Tensor) -> list[Tensor]:
  """The float tensors out is computed from, out too, up to those that do not require grad (False): what backward() gives a .grad,
  as tinygrad does (requires_grad None or True, parameters, inputs and the ops between them alike)."""
  ret, seen, stack = [], set(), [out]
  while stack:
    t = stack.pop()
    if id(t) in seen or t.requires_grad is False or not t.dtype.is_float: continue
    seen.add(id(t))
    ret.append(t)
    if t._ctx is not None: stack.extend(t._ctx[1])
  return ret


class Switch(contextlib.ContextDecorator):
  """Sets a class-wide Tensor flag inside a with block or a decorated function, and puts back what it was."""
  def __init__(self, flag: str, value: bool): self.flag, self.value, self.before = flag, value, list[bool]()

  def __enter__(self) -> Switch:
    from tinytune.tensor import Tensor
    self.before.append(getattr(Tensor, self.flag))
    setattr(Tensor, self.flag, self.value)
    return self

  def __exit__(self, *exc: Any) -> None:
    from tinytune.tensor import Tensor
    setattr(Tensor, self.flag, self.before.pop())


def no_grad() -> Switch:
  """Ops inside record nothing for backward (Tensor.no_grad is True there): `with tinytune.no_grad():` or `@tinytune.no_grad()`."""
  return Switch("no_grad", True)


def check_seed(out: Tensor, seed: Tensor | None) -> Tensor:
  if seed is None:
    if out.numel() != 1: raise ValueError(f"backward() of a tensor of shape {out.shape} needs a gradient; only a one-element tensor implies it")
    return out.ones_like()
  if seed.shape != out.shape: raise ValueError(f"backward gradient shape {seed.shape} does not match the tensor's {out.shape}")
  return seed.cast(out.dtype) if seed.dtype != out.dtype else seed

