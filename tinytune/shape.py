"""Views: shape, strides, offset and validity mask over a contiguous source. Movement ops compose without copying."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from tinytune.dtype import dtypes
from tinytune.helpers import prod
from tinytune.uop import UOp, simplify


def split_offset(off: UOp, shape: tuple[int, ...], simplified: Callable[[UOp], UOp] = simplify) -> tuple[UOp, ...]:
  """The index along each dim of a contiguous `shape` of the flat offset `off`, each simplified (a view's index into its source)."""
  return tuple(simplified((off // st) % s) if s != 1 else UOp.const(dtypes.int64, 0) for s, st in zip(shape, strides_for(shape)))


def masked_split(v: View, idxs: tuple[UOp, ...], shape: tuple[int, ...], simplified: Callable[[UOp], UOp] = simplify) -> tuple[UOp, ...]:
  """The index along each dim of a contiguous `shape` at which view `v` reads at `idxs`, right where v's mask holds: each dim is
  counted from its mask's start, so a padded copy's index splits with no division (outside the mask it may leave the source)."""
  assert v.mask is not None
  starts = [UOp.var(f"masked{d}", 0, hi - lo - 1) for d, (lo, hi) in enumerate(v.mask)]
  off = v.offset + sum(lo * st for (lo, _), st in zip(v.mask, v.strides))
  split = split_offset(simplified(sum((j * st for j, st in zip(starts, v.strides) if st != 0), UOp.const(dtypes.int64, off))), shape, simplified)
  back = {j: i - lo for j, i, (lo, _) in zip(starts, idxs, v.mask)}
  return tuple(simplified(i.substitute(back)) for i in split)


def strides_for(shape: tuple[int, ...]) -> tuple[int, ...]:
  strides, acc = [], 1
  for s in reversed(shape):
    strides.append(acc if s != 1 else 0)
    acc *= s
  return tuple(reversed(strides))


@dataclass(frozen=True)
class View:
  shape: tuple[int, ...]
  strides: tuple[int, ...]
  offset: int = 0
  mask: Optional[tuple[tuple[int, int], ...]] = None  # valid [lo, hi) per dim; reads outside are zero

  @staticmethod
  def create(shape: tuple[int, ...], strides: tuple[int, ...] | None = None, offset: int = 0, mask=None) -> View:
    strides = strides_for(shape) if strides is None else tuple(0 if s == 1 else st for s, st in zip(shape, strides))
    if mask is not None:
      if any(lo >= hi for lo, hi in mask): return View(shape, (0,) * len(shape), 0, tuple((0, 0) for _ in shape))
      if all(m == (0, s) for m, s in zip(mask, shape)): mask = None
    return View(shape, strides, offset, mask)

  def __hash__(self) -> int:
    """Kept on the view: a graph's node is looked up by a key that holds its view, every time one is built or freed."""
    if (ret := self.__dict__.get("_hash")) is None: object.__setattr__(self, "_hash", ret := hash((self.shape, self.strides, self.offset, self.mask)))
    return ret

  @property
  def contiguous(self) -> bool:
    """Kept on the view, as its hash: every realize asks of its target's."""
    if (ret := self.__dict__.get("_contiguous")) is None:
      object.__setattr__(self, "_contiguous", ret := self.offset == 0 and self.mask is None and self.strides == strides_for(self.shape))
    return ret
  @property
  def expands(self) -> bool:
    """True if some element of the source is read at two places, or zero padding is read (not cheap to recompute over)."""
    return self.mask is not None or any(st == 0 and s > 1 for s, st in zip(self.shape, self.strides))

  def index(self, idxs: tuple[UOp, ...]) -> tuple[UOp, UOp]:
    """(flat offset into the source, validity) at these indices."""
    offset = UOp.const(dtypes.int64, self.offset)
    for i, st in zip(idxs, self.strides):
      if st != 0: offset = offset + i * st
    valid = UOp.const(dtypes.bool, True)
    for i, (lo, hi), s in zip(idxs, self.mask or (), self.shape):
      if lo > 0: valid = valid.logical_and(i.ge(lo))
      if hi < s: valid = valid.logical_and(i.lt(hi))
    return offset, valid

  # ***** movement ops; each returns a new View or None when one View cannot express it *****

  def permute(self, order: tuple[int, ...]) -> View:
    return View.create(tuple(self.shape[i] for i in order), tuple(self.strides[i] for i in order), self.offset,
                       tuple(self.mask[i] for i in order) if self.mask else None)

  def expand(self, shape: tuple[int, ...]) -> View:
    mask = tuple(m if s == ns else ((0, ns) if m != (0, 0) else (0, 0)) for m, s, ns in zip(self.mask, self.shape, shape)) if self.mask else None
    return View.create(shape, tuple(st if s == ns else 0 for st, s, ns in zip(self.strides, self.shape, shape)), self.offset, mask)

  def shrink(self, arg: tuple[tuple[int, int], ...]) -> View:
    offset = self.offset + sum(b * st for (b, _), st in zip(arg, self.strides))
    mask = tuple((max(0, lo - b), max(0, min(hi - b, e - b))) for (lo, hi), (b, e) in zip(self.mask, arg)) if self.mask else None
    return View.create(tuple(e - b for b, e in arg), self.strides, offset, mask)

  def pad(self, arg: tuple[tuple[int, int], ...]) -> View:
    offset = self.offset - sum(b * st for (b, _), st in zip(arg, self.strides))
    old = self.mask or tuple((0, s) for s in self.shape)
    mask = tuple((lo + b, hi + b) for (lo, hi), (b, _) in zip(old, arg))
    return View.create(tuple(s + b + a for s, (b, a) in zip(self.shape, arg)), self.strides, offset, mask)

  def flip(self, axes: tuple[int, ...]) -> View:
    offset = self.offset + sum((s - 1) * st for i, (s, st) in enumerate(zip(self.shape, self.strides)) if i in axes)
    mask = tuple((s - hi, s - lo) if i in axes else (lo, hi) for i, ((lo, hi), s) in enumerate(zip(self.mask, self.shape))) if self.mask else None
    return View.create(self.shape, tuple(-st if i in axes else st for i, st in enumerate(self.strides)), offset, mask)

  def reshape(self, shape: tuple[int, ...]) -> View | None:
    if self.shape == shape: return self
    if self.contiguous or prod(self.shape) == 0: return View.create(shape, None, self.offset)
    old = [(s, st, m) for s, st, m in zip(self.shape, self.strides, self.mask or [None] * len(self.shape)) if s != 1]
    if any(m is not None and m != (0, s) for s, _, m in old): return None  # a mask on a real dim does not survive merging
    # merge source dims that are laid out contiguously one inside the other, then split the merged runs into the new dims
    runs: list[list[int]] = []  # [size, innermost stride]
    for s, st, _ in old:
      if runs and runs[-1][1] == st * s: runs[-1] = [runs[-1][0] * s, st]
      else: runs.append([s, st])
    strides: list[int] = []
    r, left = 0, runs[0][0] if runs else 1
    for s in shape:
      if s == 1: strides.append(0); continue
      while r < len(runs) and left == 1: r, left = r + 1, runs[r + 1][0] if r + 1 < len(runs) else 1
      if r >= len(runs) or left % s != 0: return None
      left //= s
      strides.append(runs[r][1] * left)
    if self.mask is not None and any(m == (0, 0) for m in self.mask):  # all zero padding: a 0-d view has no dim to mask
      return View.create(shape, None, 0, tuple((0, 0) for _ in shape)) if shape else None
    return View.create(shape, tuple(strides), self.offset)
