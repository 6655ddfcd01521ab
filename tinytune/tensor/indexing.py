"""Indexing: tensor[...] with ints, slices, None, Ellipsis, int Tensors, lists and bool masks; gather, scatter and masks.

A Tensor index reads by address: x[idx] is one GATHER (the one primitive that loads at a place computed from data), O(outputs)
and fused with what surrounds it; its gradient, and scatter, compare each index with each place. x[index] = value writes the
region by inverse views and one where(), in place through Tensor.assign."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from tinytune.dtype import dtypes
from tinytune.errors import OpError
from tinytune.helpers import prod
from tinytune.tensor.checks import checked, require
from tinytune.uop import Ops

if TYPE_CHECKING:
  from tinytune.tensor import Scalar, Tensor


def _pick(hit: Tensor, x: Tensor, axis: int = -1, keepdim: bool = False) -> Tensor:
  """The sum of x where hit along axis: the selected value where hit is one-hot, 0 where it is all False. Keeps x's dtype."""
  v = x.cast(dtypes.uint8) if x.dtype == dtypes.bool else x
  return hit.where(v, 0)._reduce(Ops.ADD, axis, keepdim).cast(x.dtype)


def _index_arrays(i: Any) -> list[tuple[Any, int | None]]:
  """A list, array or bool Tensor index as int arrays, one per dim it indexes, each with the size its dim must have (masks)."""
  arr = i.numpy() if isinstance(i, Tensor) else np.asarray(i)
  if arr.dtype == np.bool_:
    if arr.ndim == 0: raise IndexError("a 0-d bool index is not supported; use None to add a dim")
    return [(a, n) for a, n in zip(np.nonzero(arr), arr.shape)]
  if arr.size == 0: arr = arr.astype(np.int64)
  if arr.dtype.kind not in "iu": raise IndexError(f"indices are ints or bools, got {arr.dtype} from {type(i).__name__}")
  return [(arr, None)]


def getitem(self: Tensor, index: Any) -> Tensor:
  """x[index] like PyTorch: ints, slices, None, Ellipsis, int Tensors and lists (advanced indexing, broadcast together).
  A bool mask (a Tensor or a list) realizes itself to find its True positions. An index out of range raises IndexError, as in torch:
  at the realize of the kernel that reads it (see tinytune.tensor.checks)."""
  x, tensors, _ = _basic(self, index)
  return _take(x, tensors) if tensors else x


def _basic(self: Tensor, index: Any, write: bool = False) -> tuple[Tensor, list[tuple[int, Tensor]], list[tuple[int, int, int]]]:
  """self[index] before its Tensor indices: self sliced, its int dims dropped, its None dims added and its Tensor-indexed dims
  whole; the Tensor indices with the dim each indexes there; and the part of each of self's dims the index reads, as
  (start, length, step) (whole where a Tensor indexes it; a negative step reads from start down). The Tensor indices are checked
  in the kernel that reads them, but a write's (`write`) before it writes anything, on the host (see tinytune.tensor.checks)."""
  x, dim, out_shape, tensors, parts = self, 0, [], [], []
  for i, size in _items(index, self.ndim):
    if i is None: out_shape.append(1); continue
    n = x.shape[dim]
    if isinstance(i, np.ndarray):
      if size is not None and size != n: raise IndexError(f"a mask of size {size} does not match dim {dim} of size {n}")
      if i.size and not (-n <= i.min() and i.max() < n):
        raise IndexError(f"index {i.max() if i.max() >= n else i.min()} is out of bounds for dimension {dim} with size {n}")
      i = Tensor(np.where(i < 0, i + n, i).astype(np.int32 if n < 2**31 else np.int64), device=self.device)
    if isinstance(i, Tensor):
      if i.dtype.is_float: raise IndexError(f"tensors used as indices must be int or bool tensors, got {i.dtype.name}")
      if write: require(i, _outside(-n, n), _out_of_bounds(dim, n, IndexError))
      else: i = checked(i, -n, n, _out_of_bounds(dim, n, IndexError))
      tensors.append((len(out_shape), i))
      out_shape.append(n)  # kept whole here; the Tensor index selects from it
      parts.append((0, n, 1))
    elif isinstance(i, (int, np.integer)) and not isinstance(i, bool):
      if not -n <= i < n: raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {n}")
      x = x.shrink(tuple((int(i) % n, int(i) % n + 1) if j == dim else None for j in range(x.ndim)))
      parts.append((int(i) % n, 1, 1))
    elif isinstance(i, slice):
      x, part = _slice(x, dim, i)
      parts.append(part)
      out_shape.append(part[1])
    else: raise IndexError(f"unsupported index {i!r}: use ints, slices, None, ..., int or bool Tensors, or lists")
    dim += 1
  if x is self: x = self._move("reshape", self.shape, self.shape)  # x[:] is a view of x (the same node), as in torch, not x
  return x.reshape(tuple(out_shape)), tensors, parts


def _items(index: Any, ndim: int) -> list[tuple[Any, int | None]]:
  """An index as one item per dim it reads or adds (a list, array or mask as its int arrays, see _index_arrays; the ellipsis, or the
  end, as the whole dims the index leaves out), each with the size its dim must have (masks) or None."""
  items: list[tuple[Any, int | None]] = []
  for i in index if isinstance(index, tuple) else (index,):
    if isinstance(i, (list, tuple, np.ndarray)) or (isinstance(i, Tensor) and i.dtype == dtypes.bool): items += _index_arrays(i)
    else: items.append((i, None))
  ellipsis = [at for at, (i, _) in enumerate(items) if i is Ellipsis]  # `is`, never ==: Tensor == builds a Tensor
  if len(ellipsis) > 1: raise IndexError("an index can only have a single ellipsis ('...')")
  real = [i for i, _ in items if i is not None and i is not Ellipsis]
  if len(real) > ndim: raise IndexError(f"too many indices ({len(real)}) for a tensor of {ndim} dims")
  at = ellipsis[0] if ellipsis else len(items)
  return items[:at] + [(slice(None), None)] * (ndim - len(real)) + items[at + 1:]


def _slice(x: Tensor, dim: int, i: slice) -> tuple[Tensor, tuple[int, int, int]]:
  """x sliced along dim by `i`, and the part of the dim it reads: (start, length, step)."""
  n = x.shape[dim]
  start, stop, step = i.indices(n)
  length = max(0, -(-(stop - start) // step))
  part = (start, length, step)
  if step < 0: x, start, stop, step = x.flip(dim), n - 1 - start, n - 1 - stop, -step
  if (start, length, step) != (0, n, 1):  # a whole dim (the dims an index leaves out) needs no shrink
    x = x.shrink(tuple((start, start + (length - 1) * step + 1 if length else start) if j == dim else None for j in range(x.ndim)))
  if step > 1 and length:
    shp = x.shape
    x = x.pad(tuple((0, length * step - shp[dim]) if j == dim else None for j in range(x.ndim)))
    x = x.reshape(shp[:dim] + (length, step) + shp[dim + 1:]).shrink(
      tuple((0, 1) if j == dim + 1 else None for j in range(x.ndim + 1))).reshape(shp[:dim] + (length,) + shp[dim + 1:])
  return x, part


def setitem(self: Tensor, index: Any, value: Tensor | Scalar) -> None:
  """x[index] = value like PyTorch, for every index x[index] takes; value broadcasts to x[index]'s shape and is cast to x's dtype.
  Written in place (Tensor.assign, then realized), so a TinyJit replay writes it too. Not where x or value requires grad, but
  under no_grad() (as initializers write). Where an int Tensor index holds one place twice, the last write in the index's
  row-major order wins (torch leaves it undefined); an int Tensor index out of range raises before anything is written, as in torch.
  A tensor made by a movement of another's memory (a view) writes through to it, as torch's views do (see Tensor.assign)."""
  if not isinstance(value, Tensor):
    if not isinstance(value, (int, float, bool, np.generic, np.ndarray, list, tuple)):
      raise TypeError(f"can't assign a {type(value).__name__} to a Tensor; use a Tensor, a number or a list")
    value = Tensor(np.asarray(value), device=self.device) if isinstance(value, (np.ndarray, list, tuple)) else \
      Tensor(value.item() if isinstance(value, np.generic) else value, dtype=self.dtype, device=self.device)
  if value.device != self.device: raise ValueError(f"setitem of a tensor on {value.device} into one on {self.device}")
  if self.requires_grad and self._ctx is None and not self.no_grad:
    raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
  u = self.uop
  if u.op is Ops.VIEW and u.src[0].op is Ops.BUFFER and not (u.arg.contiguous and prod(u.shape) == u.src[0].arg.size):
    if any(st == 0 and s > 1 for st, s in zip(u.arg.strides, u.shape)):
      raise RuntimeError("unsupported operation: more than one element of the written-to tensor refers to a single memory location. "
                         "Please clone() the tensor before performing the operation.")
    if self._view is None:  # a view assign can't write through (see Tensor.assign)
      raise RuntimeError("setitem into a view of another tensor's memory would write a copy, not that tensor: index the tensor "
                         "once (x[0, 1] = v, not x[0][1] = v), or clone() the view to write it on its own")
  if not self.no_grad and (self.requires_grad or value.requires_grad):
    raise NotImplementedError("setitem of a tensor or value that requires grad: tinytune's autograd records tensors, not versions of "
                              "them; build the new value out of place (Tensor.where, masked_fill, scatter), or write under no_grad()")
  self.assign(_written(self, index, value.cast(self.dtype))).realize()


def _written(self: Tensor, index: Any, value: Tensor) -> Tensor:
  """self with value written at self[index]: one where() over self, O(self's size) (plus the index's size times the size of the
  dims it indexes, for Tensor indices)."""
  region, tensors, parts = _basic(self, index, write=True)
  shape = _take(region, tensors).shape if tensors else region.shape
  while value.ndim > len(shape) and value.shape[0] == 1: value = value.reshape(value.shape[1:])  # torch drops leading 1s
  try: value = value.expand(shape)
  except ValueError: raise ValueError(f"shape mismatch: value tensor of shape {value.shape} cannot be broadcast to indexing result "
                                      f"of shape {shape}") from None
  new = _put(region, tensors, value) if tensors else value
  def place(t: Tensor, fill: Scalar) -> Tensor:  # the region's values at their places in self, fill elsewhere
    t = t.reshape(tuple(length for _, length, _ in parts))
    for d, ((start, length, step), n) in enumerate(zip(parts, self.shape)):
      if step < 0: t, start, step = t.flip(d), start + (length - 1) * step, -step
      span = (length - 1) * step + 1 if length else 0
      if step > 1 and length > 1:
        t = t.unsqueeze(d + 1).pad(tuple((0, step - 1) if j == d + 1 else None for j in range(t.ndim + 1)), value=fill)
        t = t.reshape(t.shape[:d] + (length * step,) + t.shape[d + 2:]).shrink(tuple((0, span) if j == d else None for j in range(t.ndim - 1)))
      if (start, span) != (0, n): t = t.pad(tuple((start, n - start - span) if j == d else None for j in range(t.ndim)), value=fill)
    return t
  inside = place(Tensor.full(new.shape, True, dtypes.bool, self.device), False)
  return inside.where(place(new, 0), self)


def _put(x: Tensor, tensors: list[tuple[int, Tensor]], value: Tensor) -> Tensor:
  """x with value (shaped as _take(x, tensors)) written at the places those Tensor indices select: for each place, the last
  write that hits it (found by comparing each index with each place of the indexed dims), gathered from value."""
  dims = [d for d, _ in tensors]
  idx = _broadcast([t for _, t in tensors])
  rest, sizes, bshape = [d for d in range(x.ndim) if d not in dims], [x.shape[d] for d in dims], idx[0].shape
  n, writes, nb = prod(sizes), prod(bshape), len(bshape)
  if writes == 0: return x
  lin = _flat_index(idx, sizes)
  at = dims[0] if dims == list(range(dims[0], dims[0] + len(dims))) else 0
  order = list(range(at, at + nb)) + list(range(at)) + list(range(at + nb, value.ndim))
  rest_shape = tuple(x.shape[d] for d in rest)
  vals = value.permute(order).reshape((writes,) + rest_shape).permute(list(range(1, len(rest) + 1)) + [0])  # rest + (writes,)
  hit = lin.reshape(writes, 1) == Tensor.arange(n, device=x.device)
  last = hit.where(Tensor.arange(1, writes + 1, device=x.device).reshape(writes, 1), 0).max(0)  # (n,): the last write to each, from 1
  got = vals._gather(len(rest), (last - 1).reshape((1,) * len(rest) + (n,)).expand(rest_shape + (n,)))
  flat = x.permute(rest + dims).reshape(rest_shape + (n,))
  new = (last > 0).where(got, flat).reshape(rest_shape + tuple(sizes))
  return new.permute([(rest + dims).index(d) for d in range(x.ndim)])


def _flat_index(idx: list[Tensor], sizes: list[int]) -> Tensor:
  """Broadcast int Tensor indices of dims of these sizes as one flat position in them (row-major); -1 where any is out of range.
  Negative indices count from the end."""
  n = prod(sizes)
  lin, bad = None, None
  for t, size, stride in zip(idx, sizes, [prod(sizes[j + 1:]) for j in range(len(sizes))]):
    t = t.cast(dtypes.int64) if n >= 2**31 else t
    t = (t < 0).where(t + size, t)
    out_of_range = (t < 0) | (t >= size)
    t = t * stride if stride != 1 else t
    lin, bad = (t, out_of_range) if lin is None or bad is None else (lin + t, bad | out_of_range)
  assert lin is not None and bad is not None
  return bad.where(-1, lin) if len(sizes) > 1 else lin  # each dim's index in range, not only their flat position


def _take(x: Tensor, tensors: list[tuple[int, Tensor]]) -> Tensor:
  """Advanced indexing of x's dims by int Tensors: their dims go where the first one was if they are adjacent, else first.
  One gather of the indexed dims flattened, each output reading its one element: O(outputs), whatever the indexed dims' size."""
  dims = [d for d, _ in tensors]
  try: idx = _broadcast([t for _, t in tensors])
  except ValueError: raise IndexError(f"shape mismatch: index tensors of shapes {[t.shape for _, t in tensors]} do not broadcast") from None
  rest, sizes, bshape = [d for d in range(x.ndim) if d not in dims], [x.shape[d] for d in dims], idx[0].shape
  n = prod(sizes)
  lin = _flat_index(idx, sizes)
  rest_shape = tuple(x.shape[d] for d in rest)
  flat = x.permute(rest + dims).reshape((1,) * len(bshape) + rest_shape + (n,)).expand(bshape + rest_shape + (n,))
  out = flat._gather(flat.ndim - 1, lin.reshape(bshape + (1,) * (len(rest) + 1)).expand(bshape + rest_shape + (1,)))
  out = out.reshape(bshape + rest_shape)
  nb, at = len(bshape), dims[0] if dims == list(range(dims[0], dims[0] + len(dims))) else 0
  return out.permute(list(range(nb, nb + at)) + list(range(nb)) + list(range(nb + at, out.ndim)))


def _broadcast(ts: list[Tensor]) -> list[Tensor]:
  nd = max(t.ndim for t in ts)
  shapes = [(1,) * (nd - t.ndim) + t.shape for t in ts]
  out = tuple(max(s) if 0 not in s else 0 for s in zip(*shapes))
  if any(a not in (1, b) for s in shapes for a, b in zip(s, out)): raise ValueError(f"shapes {[t.shape for t in ts]} do not broadcast")
  return [t.reshape(s).expand(out) for t, s in zip(ts, shapes)]


def _check_index(self: Tensor, dim: int, index: Tensor, what: str, src: Tensor | None = None) -> int:
  """dim as an axis of self, after torch's checks of index (and src): one dims count (0-d counting as 1-d), and index no larger
  than self outside dim (than src along every dim)."""
  if not isinstance(index, Tensor): raise TypeError(f"{what} index is a Tensor, got {type(index).__name__}")
  if not (index.dtype.is_int or index.dtype == dtypes.uint8): raise TypeError(f"{what} index must be an int tensor, got {index.dtype.name}")
  d = self._axis(dim)
  if max(index.ndim, 1) != max(self.ndim, 1):
    raise OpError(f"Index tensor must have the same number of dimensions as {'input' if what == 'gather' else 'self'} tensor")
  if src is not None and max(src.ndim, 1) != max(index.ndim, 1):
    raise OpError("Index tensor must have the same number of dimensions as src tensor")
  if not self.ndim: return d
  over = [k for k, (a, b) in enumerate(zip(index.shape, self.shape)) if k != d and a > b]
  if what == "gather" and over:
    raise OpError(f"Size does not match at dimension {over[0]} expected index {list(index.shape)} to be no larger than self "
                     f"{list(self.shape)} apart from dimension {d}")
  if over or (src is not None and any(a > b for a, b in zip(index.shape, src.shape))):
    raise OpError(f"Expected index {list(index.shape)} to be no larger than self {list(self.shape)} apart from dimension {d}" +
                     (f" and to be no larger size than src {list(src.shape)}" if src is not None else ""))
  return d


def _outside(lo: int, hi: int) -> Callable[[Any], Any]: return lambda v: (v < lo) | (v >= hi)


def _out_of_bounds(d: int, n: int, error: type[Exception] = RuntimeError) -> Callable[[int], Exception]:
  return lambda v: error(f"index {v} is out of bounds for dimension {d} with size {n}")


def gather(self: Tensor, dim: int, index: Tensor) -> Tensor:
  """out[i][j][k] = self[i][index[i][j][k]][k] for dim=1, like torch.gather. An index out of range raises RuntimeError, as in torch."""
  d = _check_index(self, dim, index, "gather")
  if self.ndim == 0: return self.reshape(1).gather(d, index.reshape(-1)).reshape(index.shape)
  index = checked(index, 0, self.shape[d], _out_of_bounds(d, self.shape[d]))
  return self.shrink(tuple(None if k == d else (0, s) for k, s in enumerate(index.shape)))._gather(d, index)


def scatter(self: Tensor, dim: int, index: Tensor, src: Tensor | Scalar, reduce: str | None = None) -> Tensor:
  """self with src written at index along dim, like torch.scatter: where two writes hit one place, the last one wins.
  reduce='add' or 'multiply' combines them, with self, instead."""
  if reduce not in (None, "add", "multiply"): raise ValueError(f"scatter reduce is 'add', 'multiply' or None, got {reduce!r}")
  return _scatter(self, dim, index, src, {None: "replace", "add": "sum", "multiply": "prod"}[reduce], True)


def scatter_reduce(self: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, include_self: bool = True) -> Tensor:
  """self with src combined at index along dim by reduce: 'sum', 'prod', 'mean', 'amax' or 'amin', like torch.scatter_reduce."""
  if reduce not in ("sum", "prod", "mean", "amax", "amin"):
    raise OpError(f"scatter_reduce reduce is sum, prod, mean, amax or amin, got {reduce!r}")
  if not isinstance(src, Tensor): raise TypeError(f"scatter_reduce(): argument 'src' (position 3) must be Tensor, not {type(src).__name__}")
  return _scatter(self, dim, index, src, reduce, include_self)


def _scatter(self: Tensor, dim: int, index: Tensor, src: Tensor | Scalar, how: str, include_self: bool) -> Tensor:
  d = _check_index(self, dim, index, "scatter", src if isinstance(src, Tensor) else None)
  if isinstance(src, Tensor) and src.dtype != self.dtype: raise OpError("scatter(): Expected self.dtype to be equal to src.dtype")
  if self.ndim == 0:
    return _scatter(self.reshape(1), d, index.reshape(-1), src.reshape(-1) if isinstance(src, Tensor) else src, how, include_self).reshape(())
  index = checked(index, 0, self.shape[d], _out_of_bounds(d, self.shape[d]))
  if not isinstance(src, Tensor): src = Tensor.full(index.shape, src, self.dtype, self.device)
  vals = src.shrink(tuple((0, s) for s in index.shape)).unsqueeze(-1)  # index's shape + (1,)
  hit = index.unsqueeze(-1) == Tensor.arange(self.shape[d], device=self.device)  # index's shape + (n,): which place each write hits

  def place(t: Tensor) -> Tensor:  # index's shape with dim d reduced to 1, + (n,) -> self's shape (0 outside the index's extent)
    t = t.transpose(d, -1).reshape(t.shape[:d] + (t.shape[-1],) + t.shape[d + 1:-1])
    return t.pad(tuple((0, 0) if k == d else (0, s - t.shape[k]) for k, s in enumerate(self.shape)))
  written = place(hit.any(d, keepdim=True))
  if how == "replace":
    order = Tensor.arange(1, index.shape[d] + 1, device=self.device).reshape(tuple(index.shape[d] if k == d else 1 for k in range(self.ndim + 1)))
    last = hit.where(order, 0).max(d, keepdim=True)  # the last write to each place, counting from 1
    return written.where(place(_pick(hit & (order == last), vals, d, keepdim=True)), self)
  if how in ("amax", "amin"):
    flip = (lambda t: t) if how == "amax" else (lambda t: t._flip_order())
    got = flip(place(hit.where(flip(vals), dtypes.min(self.dtype)).max(d, keepdim=True)))
    return written.where(got.maximum(self) if how == "amax" else got.minimum(self), self) if include_self else written.where(got, self)
  if how == "prod":
    got = place(hit.where(vals, 1).prod(d, keepdim=True, dtype=self.dtype))
    return written.where(got * self if include_self else got, self)
  total = place(hit.where(vals, 0).sum(d, keepdim=True)).cast(self.dtype)
  if how == "sum": return written.where(total + self if include_self else total, self)
  count = place(hit.sum(d, keepdim=True)) + int(include_self)
  mean = (total + self if include_self else total) / count.maximum(1)
  return written.where(mean.cast(self.dtype), self)  # an int mean truncates


def one_hot(self: Tensor, num_classes: int = -1) -> Tensor:
  """A one-hot encoding along a new last dim. num_classes=-1 takes max + 1, which realizes self."""
  if self.dtype.is_float or self.dtype == dtypes.bool: raise TypeError(f"one_hot needs an int tensor, got {self.dtype.name}")
  if num_classes == -1: num_classes = int(self.max().item()) + 1 if self.numel() else 0
  if not isinstance(num_classes, int) or num_classes < 0: raise ValueError(f"one_hot num_classes is an int >= 0 or -1, got {num_classes!r}")
  self = checked(self, 0, num_classes, lambda v: RuntimeError(f"Class values must be {'non-negative' if v < 0 else 'smaller than num_classes'}."))
  return (self.unsqueeze(-1) == Tensor.arange(num_classes, device=self.device)).where(1, 0)


def masked_fill(self: Tensor, mask: Tensor, value: Scalar | Tensor) -> Tensor:
  """value where mask is True, self elsewhere; mask broadcasts to self's shape."""
  if not isinstance(mask, Tensor) or mask.dtype != dtypes.bool: raise TypeError("masked_fill mask must be a bool Tensor")
  return mask.where(value, self).cast(self.dtype).expand(self.shape)


def masked_select(self: Tensor, mask: Tensor, size: int | None = None, fill_value: Scalar = 0) -> Tensor:
  """The elements of self where mask (broadcast together) is True, as a 1-d tensor; the gradient flows to self. With size None its
  length depends on the data, so this realizes mask; with size (as tinygrad) it stays lazy: the first size picked, then fill_value."""
  if not isinstance(mask, Tensor) or mask.dtype != dtypes.bool: raise TypeError("masked_select mask must be a bool Tensor")
  x, m = _broadcast([self, mask])
  if size is None: return x.reshape(-1)[m.reshape(-1)]
  return _first_picked(x.reshape(-1, 1), m.reshape(-1), size, fill_value).reshape(size)


def nonzero(self: Tensor, size: int | None = None, fill_value: Scalar = 0) -> Tensor:
  """The indices of the nonzero elements, shape (count, ndim), int64 like torch. With size None this realizes self (its size depends
  on the data); with size (as tinygrad, or torch.nonzero_static) it stays lazy: size rows, the first found, then rows of fill_value."""
  if size is None: return Tensor(np.argwhere(self.numpy()).astype(np.int64).reshape(-1, self.ndim), dtype=dtypes.int64, device=self.device)
  flat = Tensor.arange(self.numel(), dtype=dtypes.int64, device=self.device).reshape(-1, 1)
  coords = [flat // prod(self.shape[k + 1:]) % self.shape[k] for k in range(self.ndim)]
  at = coords[0].cat(*coords[1:], dim=1) if coords else flat.shrink((None, (0, 0)))
  return _first_picked(at, (self != 0).reshape(-1), size, fill_value)


def _first_picked(rows: Tensor, picked: Tensor, size: int, fill_value: Scalar) -> Tensor:
  """(size, k): the first size rows of rows (n, k) where picked (n,) is True, then rows of fill_value. O(size * n * k) work, no realize."""
  if not isinstance(size, int) or size < 0: raise ValueError(f"size must be an int >= 0, got {size!r}")
  slot = picked.cumsum(0) - 1  # where each picked row goes
  hit = picked & (slot == Tensor.arange(size, device=rows.device).reshape(-1, 1))  # (size, n)
  got = _pick(hit.unsqueeze(-1), rows.unsqueeze(0), 1)
  return (Tensor.arange(size, device=rows.device) < picked.sum()).reshape(-1, 1).where(got, fill_value).cast(rows.dtype)
