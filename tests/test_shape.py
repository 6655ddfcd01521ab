"""Views on their own: each movement op, and random compositions of them, index the source where NumPy's indexing does."""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tinytune.dtype import dtypes
from tinytune.helpers import prod
from tinytune.shape import View, strides_for
from tinytune.uop import UOp, simplify


def read(view: View, source: np.ndarray) -> np.ndarray:
  """Every element of `view` over the flat `source`, through the view's index and validity expressions (zero where not valid)."""
  out = np.zeros(view.shape, dtype=source.dtype)
  for idx in itertools.product(*[range(s) for s in view.shape]):
    off, valid = view.index(tuple(UOp.const(dtypes.int64, i) for i in idx))
    off, valid = simplify(off), simplify(valid)
    assert off.op.name == "CONST" and valid.op.name == "CONST", f"{off}, {valid} did not fold"
    if valid.arg: out[idx] = source[off.arg]
  return out


def test_strides_for() -> None:
  assert strides_for((2, 3, 4)) == (12, 4, 1) and strides_for((2, 1, 4)) == (4, 0, 1) and strides_for(()) == ()


def test_each_op_matches_numpy() -> None:
  a = np.arange(1, 25).reshape(2, 3, 4)
  v = View.create((2, 3, 4))
  assert v.contiguous and not v.expands
  np.testing.assert_array_equal(read(v.permute((2, 0, 1)), a.ravel()), a.transpose(2, 0, 1))
  np.testing.assert_array_equal(read(v.shrink(((0, 2), (1, 3), (1, 4))), a.ravel()), a[0:2, 1:3, 1:4])
  np.testing.assert_array_equal(read(v.flip((0, 2)), a.ravel()), a[::-1, :, ::-1])
  np.testing.assert_array_equal(read(v.pad(((1, 0), (0, 2), (1, 1))), a.ravel()), np.pad(a, ((1, 0), (0, 2), (1, 1))))
  reshaped = v.reshape((6, 4))
  assert reshaped is not None and reshaped.contiguous
  one = View.create((2, 1, 4))
  e = one.expand((2, 5, 4))
  assert e.expands and e.strides[1] == 0
  b = np.arange(1, 9).reshape(2, 1, 4)
  np.testing.assert_array_equal(read(e, b.ravel()), np.broadcast_to(b, (2, 5, 4)))


def test_reshape_of_a_transpose() -> None:
  a = np.arange(1, 13).reshape(3, 4)
  t = View.create((3, 4)).permute((1, 0))  # (4, 3), strides (1, 4)
  assert t.reshape((2, 2, 3)) is not None  # splitting a dim keeps one view
  np.testing.assert_array_equal(read(t.reshape((2, 2, 3)), a.ravel()), a.T.reshape(2, 2, 3))
  assert t.reshape((12,)) is None  # merging transposed dims does not: the caller realizes first


def test_padding_masks() -> None:
  p = View.create((3,)).pad(((2, 1),))
  assert p.mask == ((2, 5),) and p.expands
  np.testing.assert_array_equal(read(p, np.array([7, 8, 9])), [0, 0, 7, 8, 9, 0])
  s = p.shrink(((0, 2),))  # only the padding is left
  np.testing.assert_array_equal(read(s, np.array([7, 8, 9])), [0, 0])
  pad_only = View.create((0,)).pad(((0, 1),))  # one element, all padding: a 0-d view has no dim to carry that mask
  assert pad_only.reshape((1, 1)).mask == ((0, 0), (0, 0)) and pad_only.reshape(()) is None


# ***** random compositions against NumPy *****

@st.composite
def movements(draw: Any) -> tuple[tuple[int, ...], list[tuple[str, Any]]]:
  """A source shape and a list of movement ops that applies to it, each with its argument."""
  shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
  ops, cur = [], shape
  for _ in range(draw(st.integers(1, 5))):
    kind = draw(st.sampled_from(["permute", "expand", "pad", "shrink", "flip", "reshape"]))
    n = len(cur)
    if kind == "permute": arg: Any = tuple(draw(st.permutations(range(n))))
    elif kind == "expand":
      arg = tuple(draw(st.integers(2, 3)) if s == 1 and draw(st.booleans()) else s for s in cur)
    elif kind == "pad": arg = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in cur)
    elif kind == "shrink":
      arg = []
      for s in cur:
        lo = draw(st.integers(0, s - 1))
        arg.append((lo, draw(st.integers(lo + 1, s))))
      arg = tuple(arg)
    elif kind == "flip": arg = tuple(i for i in range(n) if draw(st.booleans()))
    else:  # reshape: split the total into 1 to 3 dims
      total, dims = prod(cur), []
      for _ in range(draw(st.integers(0, 2))):
        d = draw(st.sampled_from([f for f in range(1, total + 1) if total % f == 0]))
        dims.append(d)
        total //= d
      arg = tuple(dims + [total])
    ops.append((kind, arg))
    cur = apply_numpy(np.zeros(cur), kind, arg).shape
  return shape, ops


def apply_numpy(a: np.ndarray, kind: str, arg: Any) -> np.ndarray:
  if kind == "permute": return a.transpose(arg)
  if kind == "expand": return np.broadcast_to(a, arg)
  if kind == "pad": return np.pad(a, arg)
  if kind == "shrink": return a[tuple(slice(lo, hi) for lo, hi in arg)]
  if kind == "flip": return np.flip(a, arg) if arg else a
  return a.reshape(arg)


def apply_view(v: View, kind: str, arg: Any) -> View | None:
  if kind == "flip": return v.flip(arg)
  return v.reshape(arg) if kind == "reshape" else getattr(v, kind)(arg)


@settings(max_examples=300, deadline=None)
@given(movements())
def test_compositions_match_numpy(case: tuple[tuple[int, ...], list[tuple[str, Any]]]) -> None:
  shape, ops = case
  source = np.arange(1, prod(shape) + 1)  # 0 only where a view reads padding
  a, v = source.reshape(shape), View.create(shape)
  for kind, arg in ops:
    a, nv = apply_numpy(a, kind, arg), apply_view(v, kind, arg)
    assume(nv is not None)  # a reshape one view cannot express: the scheduler realizes the source first
    assert nv is not None
    v = nv
    assert v.shape == a.shape
  np.testing.assert_array_equal(read(v, source), a)


def test_split_offset_gives_back_each_dims_index() -> None:
  """A flat offset into a contiguous shape splits into the index along each dim, simplified (a view's index into its source)."""
  from tinytune.shape import split_offset
  x, y, z = UOp.var("x", 0, 1), UOp.var("y", 0, 2), UOp.var("z", 0, 3)
  assert split_offset(x * 12 + y * 4 + z, (2, 3, 4)) == (x, y, z)
  assert split_offset(y * 4 + z, (3, 1, 4)) == (y, UOp.const(dtypes.int64, 0), z)  # a size-1 dim is index 0
