"""Movement: reshape, permute, expand, pad, shrink, flip and what is built from them (joining, splitting, tiling, padding
modes, windows, einsum). No data moves but in cat (a sum of padded pieces) and einsum (a product summed); the rest compose views."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from tinytune.dtype import dtypes, least_upper
from tinytune.errors import OpError, OpIndexError, OpUnsupported
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


Moves = tuple[tuple[str, Any, tuple[int, ...]], ...]  # (View method, its argument, the shape after it) of each movement


def moved(x: UOp, moves: Moves) -> UOp:
  """x after a run of movements, the node view_uop would leave after each in turn (a reshape or expand to the shape x has is
  none), with the views worked out once per (x's view, moves) and no node built for the steps between: a matmul's graph."""
  own, views = _view_chain(x.arg if x.op is Ops.VIEW else None, x.shape, moves)
  src = x.src if own else (x,)
  for v in views: x = UOp(Ops.VIEW, x.dtype, src, v); src = (x,)
  return x


@functools.lru_cache(maxsize=4096)
def _view_chain(view: View | None, shape: tuple[int, ...], moves: Moves) -> tuple[bool, tuple[View, ...]]:
  """Whether the first view composes into `view` (the node's own, None where it is no VIEW), and the views of the nodes left."""
  own, views = False, list[View]()
  for op, arg, new in moves:
    if op != "permute" and new == shape: continue
    if (cur := views[-1] if views else view) is not None and (v := getattr(cur, op)(arg)) is not None:
      if views: views[-1] = v
      else: own = True; views.append(v)
    else:
      v = getattr(View.create(shape), op)(arg)
      assert v is not None and v.shape == new
      views.append(v)
    shape = new
  return own, tuple(views)


def reshape(self: Tensor, *shape: Any) -> Tensor:
  """self's elements in a new shape: one entry may be -1 (the rest of the elements), and None keeps that dim's size (as tinygrad)."""
  shape = argfix(*shape)
  if None in shape and len(shape) == self.ndim: shape = tuple(self.shape[i] if s is None else s for i, s in enumerate(shape))
  if not all(isinstance(s, int) and s >= -1 for s in shape) or shape.count(-1) > 1: raise OpError(f"bad shape {shape}")
  if -1 in shape:
    known = prod(s for s in shape if s != -1)
    if known == 0 or self.numel() % known: raise OpError(f"cannot reshape {self.shape} to {shape}")
    shape = tuple(self.numel() // known if s == -1 else s for s in shape)
  if prod(shape) != self.numel(): raise OpError(f"cannot reshape {self.shape} ({self.numel()} elements) to {shape}")
  return self if shape == self.shape else self._move("reshape", shape, shape)


def permute(self: Tensor, *order: Any) -> Tensor:
  order = argfix(*order)
  if len(order) != self.ndim: raise OpError(f"permute needs one dim per dim of the tensor ({self.ndim}), got {len(order)}: {order}")
  order = tuple(self._axis(o) for o in order)
  if len(set(order)) != len(order): raise OpError(f"permute: duplicate dims are not allowed, got {argfix(*order)}")
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
  if any(s != n and s != 1 for s, n in zip(x.shape, new)): raise OpError(f"cannot expand {self.shape} to {shape}")
  return x if new == x.shape else x._move("expand", new, new)


def _pairs(self: Tensor, arg: Sequence, what: str) -> tuple[tuple[int, int], ...]:
  if len(arg) != self.ndim: raise ValueError(f"{what} needs one entry per dim ({self.ndim}), got {len(arg)}")
  return tuple(tuple(p) if p is not None else None for p in arg)  # type: ignore[misc]


def pad(self: Tensor, padding: Sequence, mode: str = "constant", value: Scalar = 0.0) -> Tensor:
  """padding: ((before, after) or None per dim), or PyTorch's flat (last_before, last_after, ...); a negative amount crops.
  mode: 'constant' (value), 'reflect' (mirrored, without the edge), 'replicate' (the edge repeated) or 'circular' (wrapped)."""
  if mode not in ("constant", "reflect", "replicate", "circular"):
    raise OpUnsupported(f"pad mode is constant, reflect, replicate or circular, got {mode!r}")
  if mode != "constant" and value != 0: raise ValueError(f"padding mode {mode!r} doesn't take a value")
  if padding and all(not isinstance(p, (tuple, list)) and p is not None for p in padding):  # torch's flat form
    if (bad := next((i for i, p in enumerate(padding) if not isinstance(p, int)), None)) is not None:
      raise TypeError(f"pad(): argument 'pad' must be tuple of ints, but found element of type {type(padding[bad]).__name__} at pos {bad}")
    if len(padding) % 2: raise OpError("Padding length must be divisible by 2")
    if len(padding) > 2 * self.ndim: raise OpError("Padding length should be less than or equal to two times the input dimension but got "
                                                      f"padding length {len(padding)} and input of dimension {self.ndim}")
    flat = list(padding) + [0] * (2 * self.ndim - len(padding))
    pairs = tuple((flat[2 * i], flat[2 * i + 1]) for i in reversed(range(self.ndim)))
  else: pairs = tuple(p or (0, 0) for p in self._pairs(padding, "pad"))
  if any(b + a + s < 0 for (b, a), s in zip(pairs, self.shape)): raise OpError(f"padding {pairs} crops more than the shape {self.shape}")
  if mode in ("reflect", "replicate") and any(b < 0 or a < 0 for b, a in pairs):  # pad, then crop, like torch (circular crops first)
    x = _pad_from_edges(self, tuple((max(b, 0), max(a, 0)) for b, a in pairs), mode)
    return x.shrink(tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(pairs, x.shape)))
  if mode == "circular" and any(min(b, a) < 0 < max(b, a) > s + min(b, 0) + min(a, 0) for (b, a), s in zip(pairs, self.shape)):
    raise OpUnsupported(f"circular padding {pairs} wraps past what it crops of {self.shape} (torch reads outside the tensor there)")
  if any(b < 0 or a < 0 for b, a in pairs): return self.shrink(tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(pairs, self.shape))).pad(
    tuple((max(b, 0), max(a, 0)) for b, a in pairs), mode, value)
  if mode != "constant": return _pad_from_edges(self, pairs, mode)
  shape = tuple(s + b + a for s, (b, a) in zip(self.shape, pairs))
  ret = self._move("pad", pairs, shape)
  if value == 0: return ret
  inside = Tensor.full(self.shape, True, dtypes.bool, self.device)._move("pad", pairs, shape)
  return inside.where(ret, value)


def _pad_from_edges(x: Tensor, pairs: tuple[tuple[int, int], ...], mode: str) -> Tensor:
  for d, (b, a) in enumerate(pairs):
    if not (b or a): continue
    n = x.shape[d]
    def part(lo: int, hi: int) -> Tensor: return x.shrink(tuple((lo, hi) if i == d else None for i in range(x.ndim)))
    if mode == "reflect":
      if b >= n or a >= n: raise OpError(f"reflect padding ({b}, {a}) must be smaller than dim {d} of size {n}")
      left, right = part(1, b + 1).flip(d), part(n - 1 - a, n - 1).flip(d)
    elif mode == "replicate":
      if n == 0: raise OpError(f"replicate padding needs a nonempty dim {d}")
      left, right = (part(e, e + 1).expand(tuple(k if i == d else s for i, s in enumerate(x.shape))) for e, k in ((0, b), (n - 1, a)))
    else:
      if b > n or a > n: raise OpError(f"circular padding ({b}, {a}) must be at most dim {d}'s size {n}")
      left, right = part(n - b, n), part(0, a)
    x = left.cat(x, right, dim=d)
  return x


def shrink(self: Tensor, arg: Sequence) -> Tensor:
  pairs = tuple(p if p is not None else (0, s) for p, s in zip(self._pairs(arg, "shrink"), self.shape))
  if any(not 0 <= b <= e <= s for (b, e), s in zip(pairs, self.shape)): raise ValueError(f"shrink {pairs} is out of bounds for {self.shape}")
  return self._move("shrink", pairs, tuple(e - b for b, e in pairs))


def flip(self: Tensor, *axis: Any) -> Tensor:
  axes = tuple(self._axis(a) for a in argfix(*axis))
  if len(set(axes)) != len(axes):
    raise OpError(f"flip: dim {next(a for a in axes if axes.count(a) > 1)} appears multiple times in the list of dims")
  return self._move("flip", axes, self.shape)


def flatten(self: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
  if self.ndim == 0: return self.reshape(1)
  s, e = self._axis(start_dim), self._axis(end_dim)
  return self.reshape(self.shape[:s] + (prod(self.shape[s:e + 1]),) + self.shape[e + 1:])


def squeeze(self: Tensor, dim: Any = None) -> Tensor:
  """self without its size-1 dims: all of them, those of dim (an int or a tuple of them, as torch); a named dim of another size stays."""
  if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
  dims = {self._axis(d) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
  return self.reshape(tuple(s for i, s in enumerate(self.shape) if not (i in dims and s == 1)))


def unsqueeze(self: Tensor, dim: int) -> Tensor:
  d = self._axis(dim, self.ndim + 1)
  return self.reshape(self.shape[:d] + (1,) + self.shape[d:])


def _joined(first: Tensor | Sequence[Tensor], others: tuple, dim: int, what: str) -> tuple[list[Tensor], int]:
  """The tensors and dim of cat(x, y, ..., dim=d), cat([x, y], dim=d) or torch's cat([x, y], d)."""
  if not isinstance(first, (list, tuple)): return [first, *others], dim
  if len(others) == 1 and isinstance(others[0], int): return list(first), others[0]
  if others: raise ValueError(f"{what} takes tensors or one sequence of them, not both: got a {type(first).__name__} then {len(others)} more")
  return list(first), dim


def cat(self: Tensor | Sequence[Tensor], *others: Tensor, dim: int = 0) -> Tensor:
  """Join tensors along an existing dim: x.cat(y, z, dim=0), Tensor.cat(x, y) or Tensor.cat([x, y])."""
  ts, dim = _joined(self, others, dim, "cat")
  if not ts: raise ValueError("cat needs at least one tensor")
  if not all(isinstance(t, Tensor) for t in ts): raise TypeError(f"cat needs Tensors, got {[type(t).__name__ for t in ts]}")
  if any(t.ndim == 0 for t in ts):
    raise OpIndexError(f"zero-dimensional tensor (at position {[t.ndim for t in ts].index(0)}) cannot be concatenated; use stack")
  x = ts[0]
  d = x._axis(dim)
  if not all(t.ndim == x.ndim and all(a == b for i, (a, b) in enumerate(zip(t.shape, x.shape)) if i != d) for t in ts):
    raise OpError(f"cat needs equal shapes except along dim {d}, got {[t.shape for t in ts]}")
  dt = least_upper(*(t.dtype for t in ts))
  total, at, ret = sum(t.shape[d] for t in ts), 0, None
  for t in ts:
    piece = t.cast(dt).pad(tuple((at, total - at - t.shape[d]) if i == d else (0, 0) for i in range(x.ndim)))
    ret, at = piece if ret is None else (ret | piece if dt == dtypes.bool else ret + piece), at + t.shape[d]
  return ret  # type: ignore[return-value]


def stack(self: Tensor | Sequence[Tensor], *others: Tensor, dim: int = 0) -> Tensor:
  """Join tensors of one shape along a new dim: x.stack(y, z, dim=0), Tensor.stack(x, y), Tensor.stack([x, y]) or Tensor.stack([x, y], 1)."""
  ts, dim = _joined(self, others, dim, "stack")
  if not ts: raise ValueError("stack expects a non-empty TensorList")
  if not all(isinstance(t, Tensor) for t in ts): raise TypeError(f"stack needs Tensors, got {[type(t).__name__ for t in ts]}")
  if (k := next((k for k, t in enumerate(ts) if t.shape != ts[0].shape), None)) is not None:
    raise OpError(f"stack expects each tensor to be equal size, but got {list(ts[0].shape)} at entry 0 and {list(ts[k].shape)} at entry {k}")
  d = ts[0]._axis(dim, ts[0].ndim + 1)
  return ts[0].unsqueeze(d).cat(*[t.unsqueeze(d) for t in ts[1:]], dim=d)


def clone(self: Tensor) -> Tensor: return self.contiguous()
def view(self: Tensor, *shape: Any) -> Tensor: return self.reshape(*shape)


def unflatten(self: Tensor, dim: int, sizes: Sequence[int]) -> Tensor:
  d = self._axis(dim)
  return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1:])


def repeat(self: Tensor, repeats: Any, *args: int) -> Tensor:
  """Tile the tensor: repeats[i] copies along dim i (leading repeats add dims), like torch.Tensor.repeat."""
  reps = argfix(repeats, *args)
  if len(reps) < self.ndim: raise ValueError(f"repeat needs at least one count per dim ({self.ndim}), got {reps}")
  if not all(isinstance(r, int) and r >= 0 for r in reps): raise ValueError(f"repeat counts are ints >= 0, got {reps}")
  base = (1,) * (len(reps) - self.ndim) + self.shape
  x = self.reshape(tuple(v for s in base for v in (1, s))).expand(tuple(v for r, s in zip(reps, base) for v in (r, s)))
  return x.reshape(tuple(r * s for r, s in zip(reps, base)))


def repeat_interleave(self: Tensor, repeats: int, dim: int | None = None) -> Tensor:
  """Each element repeats times in a row along dim (of the flattened tensor where None)."""
  if not isinstance(repeats, int) or repeats < 0: raise TypeError(f"repeat_interleave repeats is an int >= 0, got {repeats!r}")
  x, d = (self.flatten(), 0) if dim is None else (self, self._axis(dim))
  if x.ndim == 0: x = x.reshape(1)
  return x.unsqueeze(d + 1).expand(x.shape[:d + 1] + (repeats,) + x.shape[d + 1:]).flatten(d, d + 1)


def roll(self: Tensor, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
  """Shift elements along dims, wrapping around; with dims None, along the flattened tensor."""
  if dims is None: return self.flatten().roll(shifts, 0).reshape(self.shape)
  sh, ds = argfix(shifts), argfix(dims)
  if len(sh) != len(ds): raise OpError(f"roll needs one shift per dim, got shifts {sh} and dims {ds}")
  x = self
  for s, d in zip(sh, ds):
    d, n = x._axis(d), x.shape[x._axis(d)] if x.ndim else 1
    if n and s % n: x = x.shrink(tuple((n - s % n, n) if i == d else None for i in range(x.ndim))).cat(
      x.shrink(tuple((0, n - s % n) if i == d else None for i in range(x.ndim))), dim=d)
  return x


def split(self: Tensor, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
  """Pieces along dim: of sizes each (the last may be smaller) for an int, else of the sizes given (they must sum to the dim)."""
  d = self._axis(dim)
  n = self.shape[d]
  if isinstance(sizes, int):
    if sizes <= 0: raise ValueError(f"split size must be a positive int, got {sizes}")
    sizes = [min(sizes, n - at) for at in range(0, n, sizes)] or [0]
  elif sum(sizes) != n or any(s < 0 for s in sizes): raise OpError(f"split sizes {list(sizes)} must be >= 0 and sum to dim {d}'s size {n}")
  ends = [sum(sizes[:i + 1]) for i in range(len(sizes))]
  return tuple(self.shrink(tuple((e - s, e) if i == d else None for i in range(self.ndim))) for s, e in zip(sizes, ends))


def chunk(self: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
  """At most chunks pieces of ceil(n / chunks) along dim, like torch.chunk."""
  if not isinstance(chunks, int) or chunks <= 0: raise ValueError(f"chunk expects a positive int of chunks, got {chunks!r}")
  n = self.shape[self._axis(dim)]
  return self.split(-(-n // chunks), dim) if n else (self,) * chunks


def unfold(self: Tensor, dim: int, size: int, step: int) -> Tensor:
  """Windows of size with stride step along dim, as a new last dim (one strided view, nothing copied), like torch.Tensor.unfold."""
  d = self._axis(dim)
  n = self.shape[d] if self.ndim else 1
  if not isinstance(size, int) or not isinstance(step, int): raise TypeError(f"unfold(): size and step must be ints, got {size!r} and {step!r}")
  if size < 0: raise OpError(f"size is {size} but must be >= 0")
  if size > n: raise OpError(f"maximum size for tensor at dimension {d} is {n} but size is {size}")
  if step <= 0: raise OpError(f"step is {step} but must be > 0")
  if not self.ndim: return self.reshape(1).shrink(((0, size),))
  shape = self.shape[:d] + ((n - size) // step + 1,) + self.shape[d + 1:] + (size,)
  if 0 in shape: return self.shrink(tuple((0, 0) for _ in self.shape)).reshape(shape)  # empty, but still a view of self for the gradient
  last = self.ndim - 1  # sliding windows along the last dim (one strided view, with a gradient), then dim back in place
  moved = self.permute(*[i for i in range(self.ndim) if i != d], d)._windows((size,), (step,), (1,))
  return moved.permute(*range(d), last, *range(d, last), last + 1)


def einsum(formula: str, *operands: Any, dtype: Any = None) -> Tensor:
  """Einstein summation ('ij,jk->ik', '...ij->...ji', 'ii->i'): the operands broadcast to all the letters, multiply, and the
  letters not in the output are summed. A letter repeated within one operand takes its diagonal."""
  xs: list[Tensor] = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else list(operands)
  lhs, arrow, rhs = formula.replace(" ", "").partition("->")
  ins = lhs.split(",")
  if len(ins) != len(xs): raise OpError(f"einsum {formula!r} names {len(ins)} operands, got {len(xs)}")
  named = [len(s.replace("...", "")) for s in ins]
  if any(n > x.ndim or ("..." not in s and n != x.ndim) for s, n, x in zip(ins, named, xs)):
    raise OpError(f"einsum {formula!r} does not match the operands' dims {[x.ndim for x in xs]}")
  n_ell = max((x.ndim - n for s, n, x in zip(ins, named, xs) if "..." in s), default=0)
  fresh = "".join(chr(0x3b1 + i) for i in range(n_ell))  # greek letters stand for the dims of '...', aligned right
  ins = [s.replace("...", fresh[n_ell - (x.ndim - n):]) for s, n, x in zip(ins, named, xs)]
  if not all(c.isalpha() for s in ins for c in s): raise ValueError(f"einsum {formula!r}: subscripts are letters")
  out = rhs.replace("...", fresh) if arrow else fresh + "".join(sorted(c for c in set("".join(ins)) if "".join(ins).count(c) == 1 and c not in fresh))
  for i, (s, x) in enumerate(zip(ins, xs)):  # a letter twice in one operand: its diagonal
    while (c := next((c for c in s if s.count(c) > 1), None)) is not None:
      a = s.index(c)
      b = s.index(c, a + 1)
      x, s = x.diagonal(0, a, b), s[:a] + s[a + 1:b] + s[b + 1:] + c
    ins[i], xs[i] = s, x
  sizes: dict[str, int] = {}
  for s, x in zip(ins, xs):
    for c, n in zip(s, x.shape):
      if sizes.setdefault(c, n) != n and 1 not in (n, sizes[c]): raise OpError(f"einsum {formula!r}: letter {c!r} has sizes {sizes[c]} and {n}")
  letters = list(out) + sorted(set(sizes) - set(out))
  if any(c not in "".join(ins) for c in out): raise OpError(f"einsum {formula!r}: output letter not in the inputs")
  ret = None
  for s, x in zip(ins, xs):
    x = x.permute([s.index(c) for c in letters if c in s]).reshape(tuple(x.shape[s.index(c)] if c in s else 1 for c in letters))
    ret = x if ret is None else ret * x
  assert ret is not None
  summed = tuple(range(len(out), len(letters)))
  return ret.sum(summed, dtype=dtype or ret.dtype) if summed else ret.cast(dtype or ret.dtype)
