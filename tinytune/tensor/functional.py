"""Neural-network functions: matmul, convolution, pooling, normalization, softmax, dropout."""
from __future__ import annotations

import functools
import math
import operator
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from tinytune.dtype import dtypes, least_upper
from tinytune.errors import OpError
from tinytune.helpers import FLASH, WINO, prod, round_up
from tinytune.runtime import Device
from tinytune.shape import View
from tinytune.tensor import autograd
from tinytune.tensor.movement import Moves, moved, view_uop
from tinytune.uop import Ops, UOp

if TYPE_CHECKING:
  from tinytune.tensor import Tensor


def dropout(self: Tensor, p: float = 0.5) -> Tensor:
  """While Tensor.training: zero each element with probability p and scale the rest by 1/(1-p); otherwise the tensor itself."""
  if not 0 <= p <= 1: raise ValueError(f"dropout probability {p} is not in [0, 1]")
  if not Tensor.training or p == 0: return self
  if p == 1: return self.zeros_like()
  return self * (Tensor.rand(*self.shape, device=self.device) >= p).cast(self.dtype) * (1 / (1 - p))


# softmax, log_softmax and layernorm of 16-bit floats compute in float32 and round once at the end, as PyTorch's do

def softmax(self: Tensor, axis: int = -1) -> Tensor:
  def fn(x: Tensor) -> Tensor:
    e = (x - x.detach().max(axis, keepdim=True)).exp()  # the shift cancels: no gradient through it
    return e / e.sum(axis, keepdim=True)
  return self._in_f32(fn)


def log_softmax(self: Tensor, axis: int = -1) -> Tensor:
  def fn(x: Tensor) -> Tensor:
    shifted = x - x.detach().max(axis, keepdim=True)  # the shift cancels: no gradient through it
    return shifted - shifted.exp().sum(axis, keepdim=True).log()
  return self._in_f32(fn)


def matmul(self: Tensor, w: Tensor) -> Tensor:
  if not isinstance(w, Tensor): raise TypeError(f"matmul needs a Tensor, got {type(w).__name__}")
  xd, wd = len(self.shape), len(w.shape)
  if xd == 0 or wd == 0: raise OpError("matmul needs tensors of at least one dim")
  if autograd.deferred(self, w): return autograd.lazily(matmul, self, w)
  x, y = (self.unsqueeze(0) if xd == 1 else self), (w.unsqueeze(-1) if wd == 1 else w)
  xs, ys = x.shape, y.shape
  if xs[-1] != ys[-2]: raise OpError(f"matmul shapes {self.shape} and {w.shape} do not match (inner {xs[-1]} != {ys[-2]})")
  if xd > 2 or wd > 2:
    if any(a != b and 1 not in (a, b) for a, b in zip(xs[-3::-1], ys[-3::-1])):
      raise OpError(f"matmul shapes {self.shape} and {w.shape}: batch dims {xs[:-2]} and {ys[:-2]} do not broadcast")
  if prod(xs[:-1]) >= max(PACK_ROWS, xs[-1] // PACK_K_PER_ROW) and _strided_rows(y, PACK_STRIDE_16 if y.dtype.is_half else PACK_STRIDE):
    y = y.contiguous()  # pack a transposed B (x @ w.T), read by many rows
  if x.dtype is y.dtype and x.dtype.is_float and not autograd.training(x, y): ret = _products_summed(x, y)
  else:
    a, b = x.unsqueeze(-2)._broadcasted(y.transpose(-1, -2).unsqueeze(-3))
    ret = (a.float() * b.float()).sum(-1).cast(a.dtype) if a.dtype.is_half else (a * b).sum(-1, dtype=a.dtype)
  if xd == 1: ret = ret.squeeze(-2)
  return ret.squeeze(-1) if wd == 1 else ret


def _products_summed(x: Tensor, y: Tensor) -> Tensor:
  """The graph the general path of matmul builds, node for node, without its Tensors in between: a matmul's Python cost is that
  of building its graph, and this builds only its five nodes, with their views worked out once per shapes and views. 16-bit floats
  multiply in float32, where their products are exact, and sum there, so only the sum rounds to their type (as NumPy's and
  PyTorch's matmuls do); their casts come after the views, so the kernel reads A and B straight from memory (TC)."""
  xmoves, ymoves, rest, axis = _matmul_moves(x.shape, y.shape)
  dt = dtypes.float32 if x.dtype.is_half else x.dtype
  summed = UOp(Ops.REDUCE, dt, (moved(x.uop, xmoves).cast(dt).alu(Ops.MUL, moved(y.uop, ymoves).cast(dt)),), (Ops.ADD, (axis,)))
  return Tensor(moved(summed, rest).cast(x.dtype), device=x.device)


@functools.lru_cache(maxsize=1024)
def _matmul_moves(xshape: tuple[int, ...], yshape: tuple[int, ...]) -> tuple[Moves, Moves, Moves, int]:
  """The movements of x and y to (..., M, N, K) whose product is summed over its last axis, and the one from that sum to (..., M, N)."""
  order = (*range(len(yshape) - 2), len(yshape) - 1, len(yshape) - 2)
  xr, yt = (*xshape[:-1], 1, xshape[-1]), tuple(yshape[i] for i in order)
  yr = (*yt[:-2], 1, *yt[-2:])
  nd = max(len(xr), len(yr))
  xs, ys = (1,) * (nd - len(xr)) + xr, (1,) * (nd - len(yr)) + yr
  out = tuple(max(a, b) if 0 not in (a, b) else 0 for a, b in zip(xs, ys))
  return ((("reshape", xr, xr), ("reshape", xs, xs), ("expand", out, out)),
          (("permute", order, yt), ("reshape", yr, yr), ("reshape", ys, ys), ("expand", out, out)), (("reshape", out[:-1], out[:-1]),), nd - 1)


# B's elements apart along its rows, its size, and the rows of A that read it, from which a packed copy of B pays (an MLP step's
# 128 x 784 @ 784 x 128 does not: its extra kernel measured 5-10% of the step)
PACK_STRIDE, PACK_SIZE, PACK_ROWS = 256, 1 << 16, 256
# ... and no fewer rows than K / this: with fewer, dot products along K on B as it is beat the copy and the tile (x @ W.T, float32,
# 256x4096 @ (4096^2).T 64.7 -> 48.5 ms, 256x2048 @ (2048^2).T 17.6 -> 12.3, bfloat16 48.8 -> 26.1 and 10.2 -> 6.4; 1024x4096 @
# (1024x4096).T: 44.5 packed, 72.5 not)
PACK_K_PER_ROW = 4
# a 16-bit B gathered costs a scalar load and a conversion per lane: packed from a stride of 16 (attention's K^T, 4x512x64 in
# float16: Q @ K^T 1.6 -> 0.9 ms with its packing, float32's gathered 0.7)
PACK_STRIDE_16 = 16


def _strided_rows(y: Tensor, stride: int) -> bool:
  """Whether y, B of a matmul, is a large view that is contiguous down its columns but strided along its rows (a transpose): each of the
  product's vectors along a row of B would gather elements `stride` or more apart, from as many cache lines (x @ w.T of nn.Linear)."""
  u = y.uop
  if u.op is not Ops.VIEW or u.arg.mask is not None or y.ndim < 2 or prod(y.shape) < PACK_SIZE: return False
  return u.arg.strides[-2] == 1 and abs(u.arg.strides[-1]) >= stride and y.shape[-1] > 1


def dot(self: Tensor, w: Tensor) -> Tensor: return self.matmul(w)


def _windows(self: Tensor, k: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
  """(..., *spatial) -> (..., *out, *k) sliding windows over the last len(k) dims, as one strided view."""
  d = len(k)
  lead, spatial = self.shape[:-d], self.shape[-d:]
  out = tuple((n - dl * (kk - 1) - 1) // st + 1 for n, kk, st, dl in zip(spatial, k, stride, dilation))
  if any(o <= 0 for o in out): raise OpError(f"window {k} with dilation {dilation} does not fit input {'x'.join(map(str, spatial))}")
  if stride == k and all(dl == 1 for dl in dilation):  # windows side by side (a pool): a reshape, whose gradient is one too
    x = self.shrink((*((0, s) for s in lead), *((0, o * kk) for o, kk in zip(out, k))))
    x = x.reshape(*lead, *(n for o, kk in zip(out, k) for n in (o, kk)))
    return x.permute(*range(len(lead)), *(len(lead) + 2 * i for i in range(d)), *(len(lead) + 2 * i + 1 for i in range(d)))
  strides = [prod(self.shape[i + 1:]) for i in range(self.ndim)]
  view = View.create((*lead, *out, *k), (*strides[:len(lead)], *(st * s for st, s in zip(stride, strides[len(lead):])),
                                         *(dl * s for dl, s in zip(dilation, strides[len(lead):]))))
  windows = view_uop(self.uop, lambda v: None if not v.contiguous else View.create(view.shape, view.strides, v.offset), view.shape)
  ret = Tensor(windows, device=self.device)
  return autograd.record(ret, (self,), autograd.window_rule(self, k, stride, dilation)) if autograd.tracking(self) else autograd.untracked(ret)


_SPATIAL = {1: ("L",), 2: ("H", "W"), 3: ("D", "H", "W")}


def _dims(d: int, prefix: str = "") -> str: return ", ".join(prefix + n for n in _SPATIAL.get(d, ("*spatial",)))


def conv2d(self: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Tensor:
  """Convolution of a (N, C, *spatial) input with a (O, C/groups, *kernel) weight; the weight's dims say how many spatial dims
  (1-D, 2-D, 3-D, ...). padding: an int, one per spatial dim, or two per spatial dim, last dim first (left, right, top, bottom);
  negative padding crops."""
  if not isinstance(weight, Tensor): raise TypeError(f"conv2d weight is a Tensor, got {type(weight).__name__}")
  d = weight.ndim - 2
  if d < 1 or self.ndim != d + 2:
    raise OpError(f"conv2d needs a (N, C, {_dims(d)}) input and (O, C/groups, {_dims(d, 'K')}) weight, got {self.shape} and {weight.shape}")
  (n, cin), (cout, cg), k = self.shape[:2], weight.shape[:2], weight.shape[2:]
  if not isinstance(groups, int) or groups < 1: raise ValueError(f"conv2d groups is a positive int, got {groups!r}")
  if cin % groups or cout % groups or cin // groups != cg:
    raise OpError(f"conv2d: {cin} input channels, weight {weight.shape} and groups {groups} do not match")
  if bias is not None and bias.shape != (cout,): raise OpError(f"conv2d bias needs shape ({cout},), got {bias.shape}")
  if (dt := least_upper(self.dtype, *(t.dtype for t in (weight, bias) if t is not None))).is_half:
    # 16-bit floats in float32 (exact products, the float32 kernels: Winograd's, the strided one), rounded once, as PyTorch's
    return self.float().conv2d(weight.float(), None if bias is None else bias.float(), stride, padding, dilation, groups).cast(dt)
  if autograd.deferred(self, weight):  # inference's kernels (Winograd's, the wide and strided ones), the gradient only if asked
    ret = autograd.lazily(lambda x, w: x.conv2d(w, None, stride, padding, dilation, groups), self, weight)
    return ret if bias is None else ret + bias.reshape(1, cout, *(1,) * d)
  st, pd, dl = _tuple(stride, d, 1), _pads(padding, d, "conv2d"), _tuple(dilation, d, 1)
  # gradients by their own convolutions: the input's a transposed convolution of the output's (through the sliding windows it
  # would be a (N, C, *out, *k) tensor summed back in place, k times the input's size), the weight's a sum over the batch and
  # positions with the output's gradient channels-last, so its kernel vectorizes along the output channels
  custom = autograd.training(self, weight) and all(b == a >= 0 for b, a in pd)
  src = (self.detach() if custom else self).pad(((0, 0), (0, 0), *pd))
  untracked = custom or not autograd.training(self, weight)
  if untracked and (m := _winograd_tile(self, weight, st, dl, groups)):
    ret = _winograd(src, weight.detach() if custom else weight, m)
    if custom: return _conv_grad(self, weight, bias, ret, src._windows(k, st, dl).reshape(n, 1, 1, cin, *ret.shape[2:], *k), st, pd, dl, groups)
    return ret if bias is None else ret + bias.reshape(1, cout, 1, 1)
  # with unit strides and no gradient through the graph: the convolution over the rows laid end to end (see _wide), its padding
  # in the copy that lays them out, with a few more columns of zeros where the rows' span is not a multiple of 16 (its lanes)
  if wide := all(s == 1 for s in st) and untracked:
    lines = (src.shape[2] - dl[0] * (k[0] - 1)) * prod(src.shape[3:-1])  # the output's rows (times any middle dims)
    cols = src.shape[-1]
    more = 0 if lines * cols % 16 == 0 or d == 1 else next((e for e in range(cols // 4) if lines * (cols + e) % 32 == 0), 0)
    padded, flat = _flat_rows(src.pad(((0, 0),) * (src.ndim - 1) + ((0, more),)))
    src = padded.shrink(tuple((0, sz) for sz in src.shape))
  x = src._windows(k, st, dl)  # (N, C, *out, *k)
  out = x.shape[2:2 + d]
  x = x.reshape(n, groups, 1, cg, *out, *k)
  wt = (weight.detach() if custom else weight).reshape(1, groups, cout // groups, cg, *(1,) * d, *k)
  if wide: ret = _wide(flat, wt, padded.shape, out, k, dl)
  elif groups == 1 and untracked and d > 1 and cout >= 16 and x.dtype == dtypes.float32 and weight.dtype == dtypes.float32:
    # strided: a matmul of the windows copied out (a row per output position) by the weight laid out channels last, its lanes along
    # the output channels (the input's strided rows would give lanes along the output nothing contiguous to load)
    rows = x.reshape(n, cin, *out, *k).permute(0, *range(2, 2 + d), 1, *range(2 + d, 2 + 2 * d)).contiguous().reshape(n * prod(out), 1, cin, *k)
    wl = (weight.detach() if custom else weight).permute(*range(1, 2 + d), 0).contiguous().permute(d + 1, *range(d + 1)).unsqueeze(0)
    ret = (rows * wl).sum(tuple(range(2, 3 + d))).contiguous().reshape(n, *out, cout).permute(0, d + 1, *range(1, d + 1))
  else:
    order = (0, 1, 2, *range(4, 4 + d), 3, *range(4 + d, 4 + 2 * d))  # (N, G, O/G, *out, C/G, *k): the reduced axes last
    ret = (x * wt).permute(order).sum(tuple(range(3 + d, 4 + 2 * d)), dtype=least_upper(x.dtype, wt.dtype)).reshape(n, cout, *out)
  if custom: return _conv_grad(self, weight, bias, ret, x, st, pd, dl, groups)
  return ret if bias is None else ret + bias.reshape(1, cout, *(1,) * d)


def _conv_grad(self: Tensor, weight: Tensor, bias: Tensor | None, ret: Tensor, x: Tensor, st: tuple[int, ...], pd: tuple[tuple[int, int], ...],
               dl: tuple[int, ...], groups: int) -> Tensor:
  """The convolution's output `ret` (computed from detached inputs) with its gradient rule, plus the bias: the input's gradient by
  a transposed convolution, the weight's from the input windows x (N, G, 1, C/G, *out, *k)."""
  k, out = weight.shape[2:], ret.shape[2:]
  extra = tuple(sz + 2 * p - dd * (kk - 1) - 1 - (o - 1) * s for sz, (p, _), dd, kk, o, s in zip(self.shape[2:], pd, dl, k, out, st))
  def rule(g: Tensor) -> tuple[Tensor | None, Tensor | None]:
    dx = g.conv_transpose2d(weight, None, st, tuple(p for p, _ in pd), extra, groups, dl).cast(self.dtype) if autograd.wanted(self) else None
    return dx, _conv_weight_grad(g, x, weight.shape).cast(weight.dtype) if autograd.wanted(weight) else None
  ret = autograd.record(ret, (self, weight), rule)
  return ret if bias is None else ret + bias.reshape(1, ret.shape[1], *(1,) * len(k))


@functools.cache
def _winograd_matrices(m: int, r: int = 3) -> tuple[list[list[Fraction]], list[list[Fraction]], list[list[Fraction]]]:
  """Winograd's minimal filtering F(m, r) as (Bt, G, At): a correlation y[i] = sum_k g[k] d[i + k] of a tile d of n = m + r - 1
  inputs is At ((G g) * (Bt d)). From Toom-Cook: a product of polynomials c = a b (of m and r coefficients) is C ((A a) * (G b)),
  with A and G evaluating them at n points (here 0, 1, -1, 2, -2, ... and infinity, which takes the leading coefficient) and C the
  inverse of that evaluation for n coefficients. y is the gradient of sum_l d[l] c[l] with respect to a, so y = A^T ((G g) * (C^T d)).
  Each column of C is scaled to integers and the row of G divided by the same factor, so only the weight's transform has fractions."""
  n = m + r - 1
  points = [Fraction(0)] + [Fraction((i // 2 + 1) * (-1) ** i) for i in range(n - 2)]
  def evaluate(cols: int) -> list[list[Fraction]]:
    return [[p ** i for i in range(cols)] for p in points] + [[Fraction(i == cols - 1) for i in range(cols)]]
  a, g, c = evaluate(m), evaluate(r), _inverse(evaluate(n))
  scale = [math.lcm(*(c[i][j].denominator for i in range(n))) for j in range(n)]
  return [[c[i][j] * scale[j] for i in range(n)] for j in range(n)], [[x / s for x in row] for row, s in zip(g, scale)], \
    [[a[j][i] for j in range(n)] for i in range(m)]


def _inverse(mat: list[list[Fraction]]) -> list[list[Fraction]]:
  """The inverse of an invertible square matrix of Fractions, by Gauss-Jordan elimination."""
  n = len(mat)
  rows = [row + [Fraction(i == j) for j in range(n)] for i, row in enumerate(mat)]
  for col in range(n):
    pivot = next(r for r in range(col, n) if rows[r][col] != 0)
    rows[col], rows[pivot] = rows[pivot], rows[col]
    rows[col] = [x / rows[col][col] for x in rows[col]]
    for r in range(n):
      if r != col and rows[r][col] != 0: rows[r] = [x - rows[r][col] * y for x, y in zip(rows[r], rows[col])]
  return [row[n:] for row in rows]


def _transform(t: Tensor, mat: list[list[Fraction]], axis: int) -> Tensor:
  """mat (rows x t.shape[axis]) times t along axis: each row a sum of t's slices by its nonzero coefficients, the rows stacked (an
  upcast of the stacked dim makes each row's place known when the kernel is built, so only its own terms are computed)."""
  parts = [t.shrink(tuple((j, j + 1) if i == axis else None for i in range(t.ndim))) for j in range(t.shape[axis])]
  def term(j: int, c: Fraction) -> Tensor: return parts[j] if c == 1 else -parts[j] if c == -1 else parts[j] * float(c)
  rows = [functools.reduce(operator.add, [term(j, c) for j, c in enumerate(row) if c]) for row in mat]
  return rows[0].cat(*rows[1:], dim=axis)


def _winograd_tile(x: Tensor, weight: Tensor, stride: tuple[int, ...], dilation: tuple[int, ...], groups: int) -> int:
  """The output tile m of Winograd's F(m, 3) for this convolution, or 0 where a direct sum is the better (or the only) way."""
  if not WINO or weight.shape[2:] != (3, 3) or stride != (1, 1) or dilation != (1, 1) or groups != 1: return 0
  if x.dtype != dtypes.float32 or weight.dtype != dtypes.float32: return 0
  if WINO >= 2: return 4  # WINO=2: wherever it can
  # its transforms cost a few passes over the input and output, its matmuls a quarter of the direct sum's multiply-adds: with
  # fewer than 16 channels in or out the passes cost more than they save (measured on a 2-core Zen 4: 8x3x32x32 -> 32 channels
  # 0.28 ms against 0.13 direct, 16 -> 16 channels 0.33 ms against 0.56); measured on CPUs only, so not on devices with workgroups
  return 4 if min(x.shape[1], weight.shape[0]) >= 16 and not Device[x.device].caps.has_local else 0


def _winograd(x: Tensor, weight: Tensor, m: int) -> Tensor:
  """A 3x3, stride-1 convolution of the (N, C, H, W) input x (padded already) with the (O, C, 3, 3) weight by Winograd's F(m, 3):
  the output in m x m tiles, each from an (m + 2) x (m + 2) tile d of the input as At ((G w G^T) * (Bt d B)) A, where the sum over
  the input channels of the pointwise products is a batched matmul over the (m + 2)^2 tile points, so it gets matmul's tiling.
  The work goes channels last: the transforms' vector lanes run along the channels, and each tile's a^2 points lie together."""
  bt, g, at = _winograd_matrices(m)
  (n, c, h, w), o, a = x.shape, weight.shape[0], m + 2
  oh, ow = h - 2, w - 2
  th, tw = -(-oh // m), -(-ow // m)
  tw = next((t for t in range(tw, tw + max(1, tw // 4) + 1) if n * th * t % 16 == 0), tw)  # a round count of tiles: the matmul's rows
  # padded and channels last in memory first: the transform's many loads go unmasked, a vector of channels each
  xp = x.pad(((0, 0), (0, 0), (0, th * m + 2 - h), (0, tw * m + 2 - w))).permute(0, 2, 3, 1).contiguous()  # (N, H', W', C)
  d = xp.permute(0, 3, 1, 2)._windows((a, a), (m, m), (1, 1))  # (N, C, TH, TW, a, a)
  # (a, tiles, a, C): each of the a^2 matmuls reads its tile point's rows from one slab (not a page each), and the transforms
  # write or read a runs of a rows, not a^2 streams a multiple of 4 KiB apart, which would all fall in the same L1 cache sets
  v = _transform(_transform(d, bt, 4), bt, 5).permute(4, 0, 2, 3, 5, 1).contiguous().reshape(a, n * th * tw, a, 1, c)
  u = _transform(_transform(weight, g, 2), g, 3).permute(1, 2, 3, 0).contiguous()  # (C, a, a, O): its a^2 stores a row apart
  u = u.permute(1, 2, 3, 0).reshape(a, 1, a, o, c)
  y = (v * u).sum(-1).contiguous().reshape(a, n, th, tw, a, o)  # (a, tiles, a, O): a matmul per tile point
  y = _transform(_transform(y, at, 0), at, 4).permute(1, 2, 0, 3, 4, 5).contiguous().reshape(n, th * m, tw * m, o)
  return y.shrink(((0, n), (0, oh), (0, ow), (0, o))).permute(0, 3, 1, 2)  # the tiles can overhang the output


def _flat_rows(x: Tensor) -> tuple[Tensor, Tensor]:
  """x (N, C, *spatial) in memory with one more image of zeros after it, which the wide convolution's last windows reach into
  (the copy keeps x's dims, so its kernel indexes without splitting a flat offset): (x as a view of that memory, the memory flat)."""
  padded = x.pad(((0, 1),) + ((0, 0),) * (x.ndim - 1)).contiguous()
  return padded.shrink(tuple((0, s) for s in x.shape)), padded.reshape(-1)


WIDE_GPU_POSITIONS = 128  # a warp of 32 threads, each 4 positions


def _wide(flat: Tensor, wt: Tensor, shape: tuple[int, ...], out: tuple[int, ...], k: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
  """A stride-1 convolution of the (N, C, *spatial) input held flat in `flat` with wt (1, G, O/G, C/G, *1, *k), computed at every
  position j < out[0] * (the first spatial dim's stride), with the input at j + the kernel position's offset: the windows are one
  view linear in j, so the kernel's lanes run along j with plain vector loads however narrow the image; the positions past each
  row's end are computed and never read."""
  (n, c), spatial, d = shape[:2], shape[2:], len(k)
  sstr = [prod(spatial[i + 1:]) for i in range(d)]
  size, length = prod(spatial), out[0] * sstr[0]
  # a GPU computes whole warps of 4 positions a thread (see heuristic.gpu_conv): up to an eighth more positions, where the last
  # image's windows stay inside the zeros after it
  reach, more = sum((kk - 1) * dl * s for kk, dl, s in zip(k, dilation, sstr)), round_up(length, WIDE_GPU_POSITIONS)
  if Device[flat.device].caps.has_local and (more - length) * 8 <= length and more + reach <= (c + 1) * size: length = more
  view = View.create((n, c, length, *k), (c * size, size, 1, *(dl * s for dl, s in zip(dilation, sstr))))
  x = Tensor(view_uop(flat.uop, lambda v: View.create(view.shape, view.strides, v.offset) if v.contiguous else None, view.shape), device=flat.device)
  groups, og, cg = wt.shape[1], wt.shape[2], wt.shape[3]
  x = x.reshape(n, groups, 1, cg, length, *k)
  wt = wt.reshape(1, groups, og, cg, 1, *k)
  ret = (x * wt).permute(0, 1, 2, 4, 3, *range(5, 5 + d)).sum(tuple(range(4, 5 + d)), dtype=least_upper(x.dtype, wt.dtype))
  ret = ret.reshape(n, groups * og, length).contiguous()
  shape_out = (n, groups * og, *out)
  return Tensor(view_uop(ret.uop, lambda v: View.create(shape_out, (groups * og * length, length, *sstr), v.offset) if v.contiguous else None,
                         shape_out), device=ret.device)


def _conv_weight_grad(g: Tensor, x: Tensor, shape: tuple[int, ...]) -> Tensor:
  """A convolution's weight gradient from its output's gradient g (N, O, *out) and its input windows x (N, G, 1, C/G, *out, *k):
  a (G, *k, C/G, O/G) sum over the batch and positions of g channels-last (contiguous along the output channels) times the
  windows, so the kernel's lanes run along O/G and its register rows along C/G."""
  n, groups, cg, d = x.shape[0], x.shape[1], x.shape[3], len(shape) - 2
  out, k, og = x.shape[4:4 + d], x.shape[4 + d:], shape[0] // x.shape[1]
  gl = g.reshape(n, groups, og, *out).permute(1, 0, *range(3, 3 + d), 2).contiguous()  # (G, N, *out, O/G)
  xs = x.reshape(n, groups, cg, *out, *k).permute(1, *range(3 + d, 3 + 2 * d), 2, 0, *range(3, 3 + d))  # (G, *k, C/G, N, *out)
  prod_ = xs.unsqueeze(2 + d) * gl.permute(0, 2 + d, 1, *range(2, 2 + d)).reshape(groups, *(1,) * (d + 1), og, n, *out)
  dw = prod_.sum(tuple(range(3 + d, 4 + 2 * d)), dtype=least_upper(x.dtype, g.dtype))  # (G, *k, C/G, O/G)
  return dw.permute(0, 2 + d, 1 + d, *range(1, 1 + d)).reshape(shape)


def conv_transpose2d(self: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0, output_padding: Any = 0,
                     groups: int = 1, dilation: Any = 1) -> Tensor:
  """The transpose (gradient) of conv2d, for a (N, C, *spatial) input and a (C, O/groups, *kernel) weight: the input spread out by
  stride, padded, and convolved with the flipped kernel."""
  if not isinstance(weight, Tensor): raise TypeError(f"conv_transpose2d weight is a Tensor, got {type(weight).__name__}")
  d = weight.ndim - 2
  if d < 1 or self.ndim != d + 2:
    raise ValueError(f"conv_transpose2d needs a (N, C, {_dims(d)}) input and (C, O/groups, {_dims(d, 'K')}) weight, "
                     f"got {self.shape} and {weight.shape}")
  (cin, cog), k = weight.shape[:2], weight.shape[2:]
  if not isinstance(groups, int) or groups < 1: raise ValueError(f"conv_transpose2d groups is a positive int, got {groups!r}")
  if self.shape[1] != cin or cin % groups:
    raise ValueError(f"conv_transpose2d: {self.shape[1]} input channels, weight {weight.shape} and groups {groups} do not match")
  st, pd, dl, op = _tuple(stride, d, 1), _pads(padding, d, "conv_transpose2d"), _tuple(dilation, d, 1), _tuple(output_padding, d)
  if any(o >= max(s, dd) for o, s, dd in zip(op, st, dl)):
    raise ValueError(f"conv_transpose2d output_padding {op} must be smaller than stride {st} or dilation {dl}")
  x = self
  for i, s in enumerate(st): x = autograd._spread(x, 2 + i, s)
  x = x.pad(((0, 0), (0, 0), *((dd * (kk - 1) - b, dd * (kk - 1) - a + o) for kk, dd, (b, a), o in zip(k, dl, pd, op))))
  w = weight.reshape(groups, cin // groups, cog, *k).transpose(1, 2).reshape(groups * cog, cin // groups, *k).flip(tuple(range(2, 2 + d)))
  return x.conv2d(w, bias, 1, 0, dl, groups)


def _pool_args(self: Tensor, what: str, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool):
  """The pool's kernel, stride, dilation and (before, after) padding per spatial dim; an int kernel means 2 spatial dims."""
  d = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2
  if self.ndim < d: raise ValueError(f"{what} needs a tensor of at least {d} dims (..., {_dims(d)}), got {self.shape}")
  k = _tuple(kernel_size, d, 1)
  st, dl, pd = _tuple(stride, d, 1) if stride is not None else k, _tuple(dilation, d, 1), _pads(padding, d, what)
  if ceil_mode: pd = _ceil_pads(self.shape[-d:], pd, k, st, dl)
  return k, st, dl, pd


def _ceil_pads(spatial: tuple[int, ...], pads: tuple[tuple[int, int], ...], k: tuple[int, ...], stride: tuple[int, ...],
               dilation: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
  """More padding after each dim for ceil_mode's last, partial window; as in torch, no window starts in the padding after."""
  ret = []
  for n, (b, a), kk, s, dl in zip(spatial, pads, k, stride, dilation):
    span = n + b + a - dl * (kk - 1) - 1
    out = -(-span // s) + 1
    if (out - 1) * s >= n + b: out -= 1
    ret.append((b, a + max(0, (out - 1) * s - span)))
  return tuple(ret)


def max_pool2d(self: Tensor, kernel_size: Any = 2, stride: Any = None, padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
  """Max over windows of the last len(kernel_size) dims (2 for an int kernel), arguments in torch's order. return_indices: also the
  index of each max in its flattened spatial dims as torch gives it (the first one on ties, the last NaN where there is one), int32 as
  tinygrad's and argmax's (int64 past int32's range)."""
  k, st, dl, pd = _pool_args(self, "max_pool2d", kernel_size, stride, padding, dilation, ceil_mode)
  d = len(k)
  fill = -math.inf if self.dtype.is_float else dtypes.min(self.dtype)
  windows = self.pad(((0, 0),) * (self.ndim - d) + pd, value=fill)._windows(k, st, dl)
  axes = tuple(range(-d, 0))
  pooled = windows.max(axes)
  if not return_indices: return pooled
  size = prod(self.shape[-d:])
  where = Tensor.arange(size, dtype=dtypes.int32 if size < 2**31 else dtypes.int64, device=self.device).reshape(self.shape[-d:])
  where = where.pad(pd, value=size)._windows(k, st, dl)
  first = (windows == pooled.reshape(*pooled.shape, *(1,) * d)).where(where, size).min(axes)
  if not self.dtype.is_float: return pooled, first.detach()
  last_nan = windows.isnan().where(where, -1).max(axes)  # torch's scan takes each NaN it meets: a window's last NaN
  return pooled, (last_nan >= 0).where(last_nan, first).detach()


def avg_pool2d(self: Tensor, kernel_size: Any = 2, stride: Any = None, padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None, dilation: Any = 1) -> Tensor:
  """Mean over windows of the last len(kernel_size) dims (2 for an int kernel), arguments in torch's order. The divisor counts the
  padding when count_include_pad, never ceil_mode's extra padding, as in torch."""
  k, st, dl, pd = _pool_args(self, "avg_pool2d", kernel_size, stride, padding, dilation, ceil_mode)
  d = len(k)
  windows = self.pad(((0, 0),) * (self.ndim - d) + pd)._windows(k, st, dl)
  axes = tuple(range(-d, 0))
  if divisor_override is not None: return windows.sum(axes) / divisor_override
  if count_include_pad and not ceil_mode: return windows.mean(axes)
  spatial, asked = self.shape[-d:], _pads(padding, d, "avg_pool2d")
  if count_include_pad:  # the asked-for padding counts, ceil_mode's extra does not
    ones = Tensor.ones(*(s + b + a for s, (b, a) in zip(spatial, asked)), device=self.device)
    ones = ones.pad(tuple((0, a - aa) for (_, a), (_, aa) in zip(pd, asked)))
  else: ones = Tensor.ones(*spatial, device=self.device).pad(pd)
  return windows._float().sum(axes) / ones._windows(k, st, dl).sum(axes)


def max_unpool2d(self: Tensor, indices: Tensor, kernel_size: Any = 2, stride: Any = None, padding: Any = 0, output_size: Any = None) -> Tensor:
  """The inverse of max_pool2d(..., return_indices=True): each value put at its index in zeros of the pooled input's size."""
  d = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2
  if self.ndim < d or indices.shape != self.shape:
    raise ValueError(f"max_unpool2d needs values and indices of one shape with {d} spatial dims, got {self.shape} and {indices.shape}")
  if indices.dtype.is_float: raise TypeError(f"max_unpool2d indices are ints, got {indices.dtype.name}")
  k, pd = _tuple(kernel_size, d, 1), _pads(padding, d, "max_unpool2d")
  st = _tuple(stride, d, 1) if stride is not None else k
  size = tuple((n - 1) * s - b - a + kk for n, s, (b, a), kk in zip(self.shape[-d:], st, pd, k))
  if output_size is not None: size = tuple(output_size)[-d:]
  lead = self.shape[:-d]
  spots = Tensor.arange(prod(size), dtype=indices.dtype, device=self.device)
  hit = indices.reshape(*lead, -1, 1) == spots
  # overlapping windows can name one spot twice, with the same value: the mean of the hits puts it there once
  ret = hit.where(self.reshape(*lead, -1, 1), 0).sum(-2) / hit.sum(-2).maximum(1)
  return ret.cast(self.dtype).reshape(*lead, *size)


def interpolate(self: Tensor, size: Any, mode: str = "linear", align_corners: bool = False) -> Tensor:
  """Resize the last len(size) dims. mode: "nearest", "nearest-exact", or "linear" ("bilinear", "trilinear"): each output is a
  fixed weighted sum of the inputs along each dim, so this is one small matmul per resized dim. A uint8 image stays uint8, as in torch."""
  size = tuple(size) if isinstance(size, (tuple, list)) else (size,)
  if not all(isinstance(s, int) and s > 0 for s in size) or len(size) > self.ndim:
    raise ValueError(f"interpolate size is up to {self.ndim} positive ints, got {size!r}")
  if mode not in ("nearest", "nearest-exact", "linear", "bilinear", "trilinear"): raise ValueError(f"interpolate has no mode {mode!r}")
  if align_corners and mode.startswith("nearest"): raise ValueError("align_corners is only for the linear modes")
  if self.dtype == dtypes.uint8 and not mode.startswith("nearest"): return _interpolate_uint8(self, size, mode, align_corners)
  x = self._float()
  for axis, m in zip(range(self.ndim - len(size), self.ndim), size):
    n = x.shape[axis]
    if n == m and not mode.startswith("nearest"): continue
    mix = Tensor(_resize_matrix(n, m, mode, align_corners), dtype=x.dtype, device=x.device)
    x = (x.transpose(axis, -1) @ mix).transpose(axis, -1)
  return x.cast(self.dtype) if mode.startswith("nearest") else x  # nearest picks elements: an int image stays int


def _interpolate_uint8(self: Tensor, size: tuple[int, ...], mode: str, align_corners: bool) -> Tensor:
  """A uint8 image resized as torch's CPU kernel does: the last dim first, each pass in int32 with the weights as fixed-point ints
  (the most bits that keep them under 2^15), rounded half up and clamped to uint8 before the next pass."""
  x = self
  for axis, m in reversed(list(zip(range(self.ndim - len(size), self.ndim), size))):
    n = x.shape[axis]
    if n == m: continue
    mix = _resize_matrix(n, m, mode, align_corners)
    bits = next(b for b in range(23) if b == 22 or int(0.5 + mix.max() * (1 << (b + 1))) >= 1 << 15)
    fixed = Tensor(np.floor(mix * (1 << bits) + 0.5).astype(np.int32), dtype=dtypes.int32, device=x.device)
    x = ((x.cast(dtypes.int32).transpose(axis, -1) @ fixed).transpose(axis, -1) + (1 << (bits - 1)) >> bits).clip(0, 255).cast(dtypes.uint8)
  return x


def _resize_matrix(n: int, m: int, mode: str, align_corners: bool) -> np.ndarray:
  """(n, m): column j holds the weights of the n inputs in output j (torch's source positions)."""
  j, ret = np.arange(m), np.zeros((n, m), np.float32)
  if mode.startswith("nearest"):
    src = np.floor(((j + 0.5) if mode == "nearest-exact" else j) * np.float32(n / m)).astype(np.int64)
    ret[np.minimum(src, n - 1), j] = 1
    return ret
  src = j * ((n - 1) / (m - 1) if m > 1 else 0.0) if align_corners else np.maximum((j + 0.5) * (n / m) - 0.5, 0)
  lo = np.minimum(np.floor(src).astype(np.int64), n - 1)
  frac = src - lo
  np.add.at(ret, (lo, j), 1 - frac)
  np.add.at(ret, (np.minimum(lo + 1, n - 1), j), frac)
  return ret


def batchnorm(self: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor, axis: Any = 1,
              batch: bool = False) -> Tensor:
  """(self - mean) * invstd * weight + bias, with the 1-d statistics and parameters laid along `axis` (an int or a tuple).
  batch=True says mean and invstd are self's own mean and 1/sqrt(variance + eps) (correction 0) over the other axes, as in
  training: the gradient is then its closed form, two sums per channel, instead of the chain rule through both statistics."""
  axes = self._reduce_axes(axis)
  shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
  custom = batch and invstd.ndim == len(axes) and autograd.training(self, *(t for t in (weight, bias) if t is not None))
  x, m, s = (self.detach(), mean.detach(), invstd.detach()) if custom else (self, mean, invstd)
  xhat = (x - m.reshape(shape)) * (s.reshape(shape) if s.ndim == len(axes) else s)
  w, b = (weight.detach() if custom and weight is not None else weight), (bias.detach() if custom and bias is not None else bias)
  y = xhat if w is None else xhat * w.reshape(shape)
  if b is not None: y = y + b.reshape(shape)
  if not custom: return y
  others = tuple(i for i in range(self.ndim) if i not in axes)
  count = prod(self.shape[i] for i in others)
  def rule(g: Tensor) -> tuple[Tensor | None, ...]:
    g = g.contiguous()  # read by both sums and the input's gradient: computed once
    total, along = g.sum(others), (g * xhat).sum(others)  # per channel: the bias's and the weight's gradients
    scale = s if w is None else s * w
    dx = (g - total.reshape(shape) / count - xhat * (along.reshape(shape) / count)) * scale.reshape(shape) if autograd.wanted(self) else None
    return (dx, *(grad for t, grad in ((weight, along), (bias, total)) if t is not None))
  return autograd.record(y, (self, *(t for t in (weight, bias) if t is not None)), rule)


def layernorm(self: Tensor, axis: Any = -1, eps: float = 1e-5, weight: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
  x = self._float()
  dt = least_upper(x.dtype, *(t.dtype for t in (weight, bias) if t is not None))  # the result's dtype
  if dt.is_half: x = x.cast(dtypes.float32)
  y = (x - x.mean(axis, keepdim=True)) * (x.var(axis, keepdim=True, correction=0) + eps).rsqrt()
  if weight is not None: y = y * weight
  return (y if bias is None else y + bias).cast(dt)


def _tuple(x: Any, n: int, lo: int = 0) -> tuple[int, ...]:
  ret = tuple(x) if isinstance(x, (tuple, list)) else (x,) * n
  if len(ret) != n or not all(isinstance(v, int) and v >= lo for v in ret):
    raise ValueError(f"expected an int >= {lo} or {'a pair' if n == 2 else f'a tuple of {n}'} of them, got {x!r}")
  return ret


def _pads(padding: Any, d: int, what: str) -> tuple[tuple[int, int], ...]:
  """(before, after) per spatial dim from an int, one int per dim, or two per dim with the last dim first (tinygrad's order)."""
  if isinstance(padding, int) and not isinstance(padding, bool): return ((padding, padding),) * d
  if isinstance(padding, (tuple, list)) and all(isinstance(p, int) for p in padding):
    if len(padding) == d: return tuple((p, p) for p in padding)
    if len(padding) == 2 * d: return tuple((padding[2 * i], padding[2 * i + 1]) for i in reversed(range(d)))
  raise OpError(f"{what} padding is an int, {d} ints or {2 * d} ints, got {padding!r}")


def scaled_dot_product_attention(self: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, enable_gqa: bool = False) -> Tensor:
  """softmax(self @ key^T / sqrt(head size) + mask) @ value for queries self (..., L, E), keys (..., S, E) and values (..., S, Ev).
  A bool attn_mask keeps the scores where it is True, a float one is added; is_causal keeps query i to keys 0..i. dropout_p drops
  attention weights while Tensor.training. enable_gqa shares each key and value head among a group of query heads (dim -3)."""
  if is_causal and attn_mask is not None: raise OpError("scaled_dot_product_attention takes attn_mask or is_causal, not both")
  if self.ndim < 2 or key.ndim < 2 or value.ndim < 2:
    raise ValueError(f"scaled_dot_product_attention needs queries, keys and values of at least 2 dims, got {self.shape}, {key.shape}, {value.shape}")
  if enable_gqa and self.ndim >= 3 and key.ndim >= 3 and key.shape[-3] != self.shape[-3]:
    heads, kv = self.shape[-3], key.shape[-3]
    if heads % kv: raise ValueError(f"scaled_dot_product_attention: {heads} query heads are not a multiple of {kv} key heads")
    def share(t: Tensor) -> Tensor:  # (..., kv, S, E) -> (..., kv, group, S, E) -> (..., heads, S, E)
      *lead, s, e = t.shape
      return t.unsqueeze(-3).expand(*lead, heads // kv, s, e).reshape(*lead[:-1], heads, s, e)
    key, value = share(key), share(value)
  if not (dropout_p and Tensor.training) and _flash(self, key, value, attn_mask): return _attention(self, key, value, attn_mask, is_causal)
  return _attention_graph(self, key, value, attn_mask, dropout_p, is_causal)


# the devices, and the dtypes there, whose default (FLASH=1) is attention in one kernel. The CPU's is the graph: one kernel measured
# 0.6-0.7x its speed at 1x8x1024x64 and 0.8-0.9x at 2x8x512x64 (bench/kernels.py --target x86-64-v3). On an H200 at 4x16x1024x64,
# attention in tiles (a workgroup's query rows and each tile of keys and values in shared memory) took 0.546 ms in float32 (causal
# 0.393), the graph 0.809 (0.816), SDPA 0.541 (0.346); in float16, with no tensor cores in it yet, 0.581 (0.412) against the graph's
# 0.394 (0.449), whose products take them. EMU stands for CUDA; AMD runs the same kernel, unmeasured.
FLASH_DEVICES: dict[str, tuple[str, ...]] = {"CUDA": ("float32",), "EMU": ("float32",)}


def _flash(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> bool:
  """Whether attention runs in one kernel (see helpers.FLASH): queries, keys and values of one float dtype, the same leading dims,
  and a mask, if any, that broadcasts to the scores and wants no gradient."""
  if not FLASH or q.ndim < 2 or not (q.ndim == k.ndim == v.ndim and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]): return False
  if not (q.dtype == k.dtype == v.dtype and q.dtype.is_float and q.dtype.itemsize <= 4) or k.shape[-2] != v.shape[-2]: return False
  if 0 in q.shape + k.shape: return False
  scores = (*q.shape[:-1], k.shape[-2])
  if mask is not None and (mask.requires_grad or mask.ndim > len(scores) or any(m not in (1, s) for m, s in zip(mask.shape[::-1], scores[::-1]))):
    return False
  return FLASH >= 2 or q.dtype.name in FLASH_DEVICES.get(q.device.split(":")[0], ())


def _attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
  """Attention in one kernel (Ops.ATTENTION; a mask is its fourth source, broadcast to the scores); its gradient is the graph's
  (_attention_graph), built only when one is asked."""
  scores = (*q.shape[:-1], k.shape[-2])
  masks = () if mask is None else (mask.reshape(*(1,) * (len(scores) - mask.ndim), *mask.shape).expand(*scores).uop,)
  def fused(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return Tensor._of(UOp(Ops.ATTENTION, q.dtype, (q.uop, k.uop, v.uop, *masks), (1 / math.sqrt(q.shape[-1]), bool(causal))), q.device)
  if not autograd.tracking(q, k, v): return autograd.untracked(fused(q, k, v))
  def rule(g: Tensor) -> list[Tensor | None]:
    leaves = [t.detach().requires_grad_(autograd.wanted(t)) for t in (q, k, v)]
    with autograd.Switch("no_grad", False): out = _attention_graph(leaves[0], leaves[1], leaves[2], mask, 0.0, causal)
    return autograd.gradient(out, leaves, g.cast(out.dtype))
  return autograd.record(fused(q.detach(), k.detach(), v.detach()), (q, k, v), rule)


def _attention_graph(self: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, dropout_p: float, is_causal: bool) -> Tensor:
  scores = self.matmul(key.transpose(-2, -1)) * (1 / math.sqrt(self.shape[-1]))
  if is_causal:
    n, m = scores.shape[-2:]
    attn_mask = Tensor.arange(n, device=self.device).reshape(n, 1) >= Tensor.arange(m, device=self.device).reshape(1, m)
  if attn_mask is not None: scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype == dtypes.bool else scores + attn_mask
  probs = scores.softmax(-1)  # one kernel on the CPU: the max, the sum of exps and the probabilities, each exp computed once
  return (probs.dropout(dropout_p) if dropout_p and Tensor.training else probs).matmul(value)
