"""Random expression trees against NumPy: floats carry an error bound along with the float64 reference value, so the comparison is
tight (a few float32 roundings per op) and examples whose float32 result may fall on either side of a comparison or an int cast
are rejected instead of flaking; ints and bools are exact. Set TT_FUZZ_SCALE=10 to run ten times more examples. Every buffer
gets canary bytes on both sides (ops_support.oob_guard)."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from hypothesis import assume, given, reject, settings
from hypothesis import strategies as st
from ops_support import (
  FUZZ,
  _axes,
  _axis_arg,
  _idx_code,
  _index_for,
  device_examples,
  oob_guard,  # noqa: F401  (autouse: canary bytes around every buffer)
  realize_or_reject,
)

from tinytune import Tensor, dtypes
from tinytune.dtype import DType, least_upper

# ***** reference values with error bounds *****

EPS = 2.0 ** -23  # one float32 rounding, relative
FEPS = 2.0 ** -19  # a libm call (exp2f, log2f, sinf, sqrtf) with the roundings around it, relative
TINY = 1e-36  # absolute slack for float32 underflow
MAX_NUMEL = 2048


class Ambiguous(Exception):
  """The float32 result may land on either side of a discontinuity (a comparison, an int cast): reject the example."""


@dataclass
class Ref:
  v: np.ndarray  # the exact value, float64
  e: np.ndarray  # a bound on |float32 result - v|

  def map(self, fn: Callable[[np.ndarray], np.ndarray]) -> Ref: return Ref(np.asarray(fn(self.v)), np.asarray(fn(self.e)))


def _ref(v: Any, e: Any) -> Ref: return Ref(np.asarray(v, dtype=np.float64), np.asarray(e, dtype=np.float64))
def _round(v: np.ndarray, e: np.ndarray, n: float = 1) -> Ref: return _ref(v, e + n * EPS * np.abs(v) + TINY)


def r_add(a: Ref, b: Ref) -> Ref: return _round(a.v + b.v, a.e + b.e)
def r_sub(a: Ref, b: Ref) -> Ref: return _round(a.v - b.v, a.e + b.e)
def r_mul(a: Ref, b: Ref) -> Ref: return _round(a.v * b.v, np.abs(a.v) * b.e + np.abs(b.v) * a.e + a.e * b.e)
def r_div(a: Ref, d: Ref) -> Ref:  # d > 0 and far from 0
  v = a.v / d.v
  return _round(v, (a.e + np.abs(v) * d.e) / (d.v - d.e), 2)
def r_max(a: Ref, b: Ref) -> Ref: return _ref(np.maximum(a.v, b.v), np.maximum(a.e, b.e))
def r_min(a: Ref, b: Ref) -> Ref: return _ref(np.minimum(a.v, b.v), np.maximum(a.e, b.e))
def r_abs1(x: Ref) -> Ref: return _round(np.abs(x.v) + 1, x.e)
def r_exp(x: Ref) -> Ref:  # of x clipped to [-4, 4]
  c = np.clip(x.v, -4, 4)
  v = np.exp(c)
  return _ref(v, v * np.expm1(x.e + FEPS * (1 + np.abs(c))) + TINY)
def r_log(a: Ref) -> Ref:  # a >= 1
  v = np.log(a.v)
  return _ref(v, a.e / (a.v - np.minimum(a.e, a.v / 2)) + FEPS * np.abs(v) + TINY)
def r_sqrt(a: Ref) -> Ref:  # a >= 1
  v = np.sqrt(a.v)
  return _ref(v, a.e / np.sqrt(a.v - np.minimum(a.e, a.v / 2)) + FEPS * v + TINY)
def r_sin(x: Ref) -> Ref: return _ref(np.sin(x.v), x.e + FEPS)
def r_cos(x: Ref) -> Ref: return _ref(np.cos(x.v), x.e + EPS * (np.abs(x.v) + 2) + FEPS)  # cos(x) is sin(pi/2 - x)
def r_sigmoid(x: Ref) -> Ref:
  v = 1 / (1 + np.exp(-x.v))
  return _ref(v, 0.25 * x.e + FEPS * (2 + np.abs(x.v)) * v + TINY)
def r_tanh(x: Ref) -> Ref: return _ref(np.tanh(x.v), x.e + FEPS * (4 + 4 * np.abs(x.v)) + TINY)


def r_cmp(op: str, a: Ref, b: Ref) -> np.ndarray:
  d, tol = a.v - b.v, a.e + b.e
  if np.any((np.abs(d) <= tol) & (tol > 0)): raise Ambiguous(op)
  return {"<": d < 0, ">": d > 0, "==": d == 0, "!=": d != 0, "<=": d <= 0, ">=": d >= 0}[op]


def r_cast_int(x: Ref) -> Ref:
  if np.any(np.abs(x.v) > 2.0 ** 30) or np.any((np.abs(x.v - np.round(x.v)) <= x.e) & (x.e > 0)): raise Ambiguous("cast to int32")
  return _ref(np.trunc(x.v), np.zeros_like(x.e))


def r_cast_half(x: Ref) -> Ref:
  if np.any(np.abs(x.v) + x.e > 60000): raise Ambiguous("float16 overflow")
  return _ref(x.v, x.e + 2.0 ** -11 * (np.abs(x.v) + x.e) + 2.0 ** -25)


def r_cast_bf16(x: Ref) -> Ref:  # 8 significant bits; below 2**-126 a bfloat16 is subnormal, spaced 2**-133
  if np.any(np.abs(x.v) + x.e > 3e38): raise Ambiguous("bfloat16 overflow")
  return _ref(x.v, x.e + 2.0 ** -8 * (np.abs(x.v) + x.e) + 2.0 ** -134)


def r_nonzero(x: Ref) -> Ref:
  if np.any((np.abs(x.v) <= x.e) & (x.e > 0)): raise Ambiguous("cast to bool")
  return _ref(x.v != 0, np.zeros_like(x.e))




def r_reduce(op: str, x: Ref, axis: Any, keepdim: bool) -> Ref:
  ax = _axes(axis, x.v.ndim)
  n = math.prod(x.v.shape[a] for a in ax)
  if op in ("max", "min"):
    return _ref((np.max if op == "max" else np.min)(x.v, axis=ax, keepdims=keepdim), np.max(x.e, axis=ax, keepdims=keepdim))
  s = _ref(x.v.sum(axis=ax, keepdims=keepdim), x.e.sum(axis=ax, keepdims=keepdim) + n * EPS * np.abs(x.v).sum(axis=ax, keepdims=keepdim) + TINY)
  return s if op == "sum" else _round(s.v / n, s.e / n, 2)


# ***** random float expressions *****

@dataclass(frozen=True)
class Expr:
  """A random expression: its code (what a failing example prints), its shape, and how to evaluate it both ways."""
  code: str
  shape: tuple[int, ...]
  tt: Callable[[list[Tensor]], Tensor] = field(repr=False, compare=False)
  ref: Callable[[list[Any]], Any] = field(repr=False, compare=False)
  dtype: Any = None  # the tinytune dtype (int/bool trees)
  scalar: bool = False  # a python number, not a Tensor

  def __repr__(self) -> str: return self.code


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
  try: return tuple(np.broadcast_shapes(*shapes))
  except ValueError: return None


def _reshape_target(draw: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
  """A random shape with the same number of elements (1-4 dims)."""
  n, primes, p = math.prod(shape), [], 2
  while n > 1:
    while n % p == 0: primes.append(p); n //= p
    p += 1
  primes = draw(st.permutations(primes))
  ndim = draw(st.integers(1, 4))
  dims = [1] * ndim
  for q in primes: dims[draw(st.integers(0, ndim - 1))] *= q
  return tuple(dims)








def _np_pad(a: np.ndarray, pairs: tuple[tuple[int, int], ...], value: Any) -> np.ndarray:
  """Pad with negative amounts (crops) like Tensor.pad."""
  crop = tuple(slice(max(-b, 0), s - max(-a, 0)) for (b, a), s in zip(pairs, a.shape))
  return np.pad(a[crop], tuple((max(b, 0), max(a, 0)) for b, a in pairs), constant_values=value)


def movement(draw: Any, x: Expr, exact: bool, pad_value: Any) -> Expr:
  """A random movement op on x; its reference is an exact array (exact) or a Ref whose error bound moves along."""
  def ref_map(r: Any, fn: Callable[[np.ndarray], np.ndarray]) -> Any: return fn(r) if exact else r.map(fn)
  shape, nd = x.shape, len(x.shape)
  ops = ["flip", "reshape", "getitem", "unsqueeze", "expand", "cat", "contiguous", "realize"]
  if nd: ops += ["pad", "shrink", "flatten", "squeeze"]
  if nd >= 2: ops += ["permute", "transpose"]
  op = draw(st.sampled_from(ops))
  if op == "permute":
    order = tuple(draw(st.permutations(range(nd))))
    return Expr(f"{x}.permute{order}", tuple(shape[i] for i in order), lambda i: x.tt(i).permute(order),
                lambda i: ref_map(x.ref(i), lambda a: np.transpose(a, order)), x.dtype)
  if op == "transpose":
    d0, d1 = draw(st.integers(-nd, nd - 1)), draw(st.integers(-nd, nd - 1))
    new = list(shape)
    new[d0], new[d1] = new[d1], new[d0]
    return Expr(f"{x}.transpose({d0}, {d1})", tuple(new), lambda i: x.tt(i).transpose(d0, d1),
                lambda i: ref_map(x.ref(i), lambda a: np.swapaxes(a, d0, d1)), x.dtype)
  if op == "flip":
    axes = tuple(draw(st.lists(st.integers(0, nd - 1), unique=True, max_size=nd))) if nd else ()
    return Expr(f"{x}.flip{axes}", shape, lambda i: x.tt(i).flip(axes), lambda i: ref_map(x.ref(i), lambda a: np.flip(a, axes)), x.dtype)
  if op == "pad":
    pairs = tuple((draw(st.integers(-min(s - 1, 1), 2)), draw(st.integers(-min(s - 1, 1), 2))) for s in shape)
    pairs = tuple((b, a) if s + b + a >= 1 else (max(b, 0), max(a, 0)) for (b, a), s in zip(pairs, shape))
    new = tuple(s + b + a for s, (b, a) in zip(shape, pairs))
    if math.prod(new) > MAX_NUMEL: return x
    value = draw(pad_value)
    def pad_ref(i: list[Any]) -> Any:
      r = x.ref(i)
      return _np_pad(r, pairs, value) if exact else Ref(_np_pad(r.v, pairs, value), _np_pad(r.e, pairs, 0.0))
    return Expr(f"{x}.pad({pairs}, value={value!r})", new, lambda i: x.tt(i).pad(pairs, value=value), pad_ref, x.dtype)
  if op == "shrink":
    arg = []
    for s in shape:
      b = draw(st.integers(0, s - 1))
      arg.append((b, draw(st.integers(b + 1, s))))
    sl = tuple(slice(b, e) for b, e in arg)
    return Expr(f"{x}.shrink({tuple(arg)})", tuple(e - b for b, e in arg), lambda i: x.tt(i).shrink(arg),
                lambda i: ref_map(x.ref(i), lambda a: a[sl]), x.dtype)
  if op == "reshape":
    new = _reshape_target(draw, shape)
    infer = draw(st.integers(-1, len(new) - 1))
    arg = tuple(-1 if j == infer else s for j, s in enumerate(new))
    return Expr(f"{x}.reshape{arg}", new, lambda i: x.tt(i).reshape(arg), lambda i: ref_map(x.ref(i), lambda a: a.reshape(new)), x.dtype)
  if op == "getitem":
    idx = _index_for(draw, shape)
    new = np.empty(shape)[idx].shape
    return Expr(f"{x}[{_idx_code(idx)}]", new, lambda i: x.tt(i)[idx], lambda i: ref_map(x.ref(i), lambda a: a[idx]), x.dtype)
  if op == "unsqueeze":
    d = draw(st.integers(-nd - 1, nd))
    new = np.expand_dims(np.empty(shape), d).shape
    return Expr(f"{x}.unsqueeze({d})", new, lambda i: x.tt(i).unsqueeze(d), lambda i: ref_map(x.ref(i), lambda a: np.expand_dims(a, d)), x.dtype)
  if op == "squeeze":
    d = draw(st.integers(-nd, nd - 1))
    new = shape[:d % nd] + shape[d % nd + 1:] if shape[d] == 1 else shape
    return Expr(f"{x}.squeeze({d})", new, lambda i: x.tt(i).squeeze(d), lambda i: ref_map(x.ref(i), lambda a: a.reshape(new)), x.dtype)
  if op == "flatten":
    s, e = sorted((draw(st.integers(0, nd - 1)), draw(st.integers(0, nd - 1))))
    new = shape[:s] + (math.prod(shape[s:e + 1]),) + shape[e + 1:]
    return Expr(f"{x}.flatten({s}, {e})", new, lambda i: x.tt(i).flatten(s, e), lambda i: ref_map(x.ref(i), lambda a: a.reshape(new)), x.dtype)
  if op == "expand":
    k = draw(st.integers(2, 4))
    new = tuple(k if s == 1 and draw(st.booleans()) else s for s in shape)
    if new == shape or draw(st.booleans()): new = (k,) + new
    if math.prod(new) > MAX_NUMEL: return x
    return Expr(f"{x}.expand{new}", new, lambda i: x.tt(i).expand(new), lambda i: ref_map(x.ref(i), lambda a: np.broadcast_to(a, new)), x.dtype)
  if op == "cat":
    if not nd or 2 * math.prod(shape) > MAX_NUMEL: return x
    d = draw(st.integers(-nd, nd - 1))
    new = tuple(2 * s if j == d % nd else s for j, s in enumerate(shape))
    return Expr(f"{x}.cat({x}.flip({d}), dim={d})", new, lambda i: (t := x.tt(i)).cat(t.flip(d), dim=d),
                lambda i: ref_map(x.ref(i), lambda a: np.concatenate([a, np.flip(a, d)], axis=d)), x.dtype)
  if op == "contiguous":
    return Expr(f"{x}.contiguous()", shape, lambda i: x.tt(i).contiguous(), x.ref, x.dtype)
  return Expr(f"{x}.realize()", shape, lambda i: x.tt(i).realize(), x.ref, x.dtype)




def _reduced_shape(shape: tuple[int, ...], axis: Any, keepdim: bool) -> tuple[int, ...]:
  ax = _axes(axis, len(shape))
  return tuple(1 if j in ax else s for j, s in enumerate(shape)) if keepdim else tuple(s for j, s in enumerate(shape) if j not in ax)


UNARY: dict[str, tuple[str, Callable[[Tensor], Tensor], Callable[[Ref], Ref]]] = {
  "neg": ("-{}", lambda t: -t, lambda r: _ref(-r.v, r.e)),
  "abs": ("{}.abs()", lambda t: t.abs(), lambda r: _ref(np.abs(r.v), r.e)),
  "relu": ("{}.relu()", lambda t: t.relu(), lambda r: _ref(np.maximum(r.v, 0), r.e)),
  "exp": ("{}.clip(-4, 4).exp()", lambda t: t.clip(-4, 4).exp(), r_exp),
  "log": ("({}.abs() + 1).log()", lambda t: (t.abs() + 1).log(), lambda r: r_log(r_abs1(r))),
  "sqrt": ("({}.abs() + 1).sqrt()", lambda t: (t.abs() + 1).sqrt(), lambda r: r_sqrt(r_abs1(r))),
  "rsqrt": ("(1 + {}.abs()).rsqrt()", lambda t: (1 + t.abs()).rsqrt(), lambda r: r_div(_ref(1.0, 0.0), r_sqrt(r_abs1(r)))),
  "sin": ("{}.sin()", lambda t: t.sin(), r_sin),
  "cos": ("{}.cos()", lambda t: t.cos(), r_cos),
  "sigmoid": ("{}.sigmoid()", lambda t: t.sigmoid(), r_sigmoid),
  "tanh": ("{}.tanh()", lambda t: t.tanh(), r_tanh),
  "square": ("{} ** 2", lambda t: t ** 2, lambda r: r_mul(r, r)),
  "half": ("{}.cast(dtypes.float16).cast(dtypes.float32)", lambda t: t.cast(dtypes.float16).cast(dtypes.float32), r_cast_half),
  "bf16": ("{}.cast(dtypes.bfloat16).cast(dtypes.float32)", lambda t: t.cast(dtypes.bfloat16).cast(dtypes.float32), r_cast_bf16),
  "int": ("{}.cast(dtypes.int32).cast(dtypes.float32)", lambda t: t.cast(dtypes.int32).cast(dtypes.float32), r_cast_int),
  "nonzero": ("{}.cast(dtypes.bool).cast(dtypes.float32)", lambda t: t.cast(dtypes.bool).cast(dtypes.float32), r_nonzero),
  "clip": ("{}.clip(-1.5, 2)", lambda t: t.clip(-1.5, 2), lambda r: _ref(np.clip(r.v, -1.5, 2), r.e)),
}

BINARY: dict[str, tuple[str, Callable[[Any, Any], Tensor], Callable[[Ref, Ref], Ref]]] = {
  "add": ("({} + {})", lambda a, b: a + b, r_add),
  "sub": ("({} - {})", lambda a, b: a - b, r_sub),
  "mul": ("({} * {})", lambda a, b: a * b, r_mul),
  "div": ("({} / (abs({}) + 0.5))", lambda a, b: a / (_abs(b) + 0.5), lambda a, b: r_div(a, _round(np.abs(b.v) + 0.5, b.e))),
  "maximum": ("{}.maximum({})", lambda a, b: a.maximum(b), r_max),
  "minimum": ("{}.minimum({})", lambda a, b: a.minimum(b), r_min),
}
def _abs(x: Any) -> Any: return x.abs() if isinstance(x, Tensor) else abs(x)


CMPS: dict[str, Callable[[Any, Any], Tensor]] = {
  "<": lambda a, b: a < b, ">": lambda a, b: a > b, "<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b,
  "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}


class FloatExprs:
  """Draws random float32 expressions over the inputs x0, x1, ...; every value stays moderate, divisors stay away from 0."""

  def __init__(self, draw: Any, inputs: list[np.ndarray]):
    self.draw, self.inputs = draw, inputs

  def leaf(self) -> Expr:
    k = self.draw(st.integers(0, len(self.inputs) - 1))
    return Expr(f"x{k}", self.inputs[k].shape, lambda i: i[k], lambda i: i[k])

  def const(self) -> Expr:
    c = self.draw(st.sampled_from([0.5, -1.25, 2.0, 3.0, -0.75]))
    return Expr(repr(c), (), lambda i: c, lambda i: _ref(c, 0.0), scalar=True)

  def full_reduce(self, x: Expr) -> Expr:
    op = self.draw(st.sampled_from(["sum", "max", "min", "mean"]))
    return Expr(f"{x}.{op}()", (), lambda i: getattr(x.tt(i), op)(), lambda i: r_reduce(op, x.ref(i), None, False))

  def pair(self, depth: int) -> tuple[Expr, Expr, tuple[int, ...]]:
    """Two operands that broadcast together; sometimes one is a python scalar."""
    a = self.expr(depth - 1)
    b = self.const() if self.draw(st.integers(0, 4)) == 0 else self.expr(depth - 1)
    shape = _broadcast(a.shape, b.shape)
    if shape is None or math.prod(shape) > MAX_NUMEL: b, shape = self.full_reduce(b), a.shape
    return (b, a, shape) if b.shape == () and self.draw(st.booleans()) else (a, b, shape)

  def expr(self, depth: int) -> Expr:
    draw = self.draw
    if depth <= 0 or draw(st.integers(0, 5)) == 0: return self.leaf()
    kind = draw(st.sampled_from(["unary", "unary", "binary", "binary", "cmp", "where", "movement", "movement", "reduce"]))
    if kind == "unary":
      x = self.expr(depth - 1)
      fmt, tt, ref = UNARY[draw(st.sampled_from(sorted(UNARY)))]
      return Expr(fmt.format(x), x.shape, lambda i: tt(x.tt(i)), lambda i: ref(x.ref(i)))
    if kind == "binary":
      a, b, shape = self.pair(depth)
      fmt, tt2, ref2 = BINARY[draw(st.sampled_from(sorted(BINARY)))]
      if a.scalar and fmt.startswith("{}."): a, b = b, a  # a python number has no .maximum()
      return Expr(fmt.format(a, b), shape, lambda i: tt2(a.tt(i), b.tt(i)), lambda i: ref2(a.ref(i), b.ref(i)))
    if kind in ("cmp", "where"):
      a, b, shape = self.pair(depth)
      op = draw(st.sampled_from(sorted(CMPS)))
      if a.scalar: a, b, op = b, a, {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(op, op)  # the tensor first: 2.0 < x is x > 2.0
      cmp = CMPS[op]
      if kind == "cmp":
        return Expr(f"({a} {op} {b}).cast(dtypes.float32)", shape, lambda i: cmp(a.tt(i), b.tt(i)).cast(dtypes.float32),
                    lambda i: _ref(c := r_cmp(op, a.ref(i), b.ref(i)), np.zeros(c.shape)))
      p = draw(st.sampled_from([a, b, self.const(), self.expr(depth - 1)]))
      q = draw(st.sampled_from([a, b, self.const(), self.expr(depth - 1)]))
      out = _broadcast(shape, p.shape, q.shape)
      if out is None or math.prod(out) > MAX_NUMEL: p, q, out = a, b, shape
      def where_ref(i: list[Any]) -> Ref:
        c, pr, qr = r_cmp(op, a.ref(i), b.ref(i)), p.ref(i), q.ref(i)
        return _ref(np.where(c, pr.v, qr.v), np.where(c, pr.e, qr.e))
      return Expr(f"({a} {op} {b}).where({p}, {q})", out, lambda i: cmp(a.tt(i), b.tt(i)).where(p.tt(i), q.tt(i)), where_ref)
    x = self.expr(depth - 1)
    if kind == "movement": return movement(draw, x, False, st.sampled_from([0.0, 0.0, 1.5, -2.0]))
    if not x.shape: return self.full_reduce(x) if draw(st.booleans()) else x
    op = draw(st.sampled_from(["sum", "max", "min", "mean"]))
    axis, keepdim = _axis_arg(draw, len(x.shape)), draw(st.booleans())
    return Expr(f"{x}.{op}({axis!r}, keepdim={keepdim})", _reduced_shape(x.shape, axis, keepdim),
                lambda i: getattr(x.tt(i), op)(axis, keepdim=keepdim), lambda i: r_reduce(op, x.ref(i), axis, keepdim))


@st.composite
def input_shapes(draw: Any, max_inputs: int = 3) -> list[tuple[int, ...]]:
  """1-3 shapes that broadcast together: a base shape, and variants with dims set to 1 or leading dims dropped."""
  base = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
  shapes = [base]
  for _ in range(draw(st.integers(0, max_inputs - 1))):
    s = tuple(1 if draw(st.integers(0, 2)) == 0 else n for n in base)
    shapes.append(s[draw(st.integers(0, len(s))):])
  return shapes


@st.composite
def float_exprs(draw: Any) -> tuple[Expr, list[np.ndarray]]:
  rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
  inputs = [rng.uniform(-3, 3, s).astype(np.float32) for s in draw(input_shapes())]
  return FloatExprs(draw, inputs).expr(draw(st.integers(1, 4))), inputs


def test_random_float_expressions(each_device: str) -> None:  # also on the devices with workgroups
  settings(max_examples=device_examples(90, each_device), **FUZZ)(given(float_exprs())(random_float_expression))()


def random_float_expression(case: tuple[Expr, list[np.ndarray]]) -> None:
  expr, inputs = case
  try: ref = expr.ref([_ref(x, np.zeros(x.shape)) for x in inputs])
  except Ambiguous: reject()
  assume(np.all(np.isfinite(ref.v)) and np.all(np.abs(ref.v) < 1e30))
  def run() -> np.ndarray: return realize_or_reject(lambda: expr.tt([Tensor(x) for x in inputs]))
  out = run()
  assert out.dtype == np.float32 and out.shape == ref.v.shape == expr.shape
  err, bound = np.abs(out.astype(np.float64) - ref.v), 4 * ref.e + 1e-30
  at = np.unravel_index(np.argmax(err - bound), err.shape)
  assert np.all(err <= bound), f"{expr}: at {at} got {out[at]}, expected {ref.v[at]} (error {err[at]:.3g} > bound {bound[at]:.3g})"


# ***** random int and bool expressions: exact, with numpy's wrap-around for the types narrower than int32 and the unsigned ones *****

INT_TYPES = [dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.int8, dtypes.int16, dtypes.uint16, dtypes.uint32]  # uint64 is in test_dtypes


INT_BINARY: dict[str, Callable[[Any, Any], Any]] = {
  "+": operator.add, "-": operator.sub, "*": operator.mul, "&": operator.and_, "|": operator.or_, "^": operator.xor,
  "<": operator.lt, ">": operator.gt, "==": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge,
  "maximum": lambda a, b: a.maximum(b) if isinstance(a, Tensor) else np.maximum(a, b),
  "minimum": lambda a, b: a.minimum(b) if isinstance(a, Tensor) else np.minimum(a, b),
}


class IntExprs:
  """Random int and bool expressions; values stay far from int32 and int64 overflow (their reference is computed in int64)."""

  def __init__(self, draw: Any, inputs: list[np.ndarray], dts: list[DType]):
    self.draw, self.inputs, self.dts = draw, inputs, dts

  def check(self, v: np.ndarray, dt: DType) -> np.ndarray:
    if dt in (dtypes.int32, dtypes.int64) and np.any(np.abs(v.astype(np.int64)) > 2 ** 30): raise Ambiguous("int overflow")
    return v

  def leaf(self) -> Expr:
    k = self.draw(st.integers(0, len(self.inputs) - 1))
    return Expr(f"x{k}", self.inputs[k].shape, lambda i: i[k], lambda i: i[k], self.dts[k])

  def const(self, dt: DType) -> Expr:
    c = self.draw(st.sampled_from([0, 1, 2, 3, 7] if dt.is_unsigned else [-3, -1, 0, 2, 5]))
    return Expr(repr(c), (), lambda i: c, lambda i: c, scalar=True)

  def pair(self, depth: int, kind: str) -> tuple[Expr, Expr, tuple[int, ...], DType]:
    a = self.expr(depth - 1, kind)
    b = self.const(a.dtype) if kind == "int" and self.draw(st.integers(0, 3)) == 0 else self.expr(depth - 1, kind)
    shape = _broadcast(a.shape, b.shape)
    if shape is None or math.prod(shape) > MAX_NUMEL: b, shape = self.full_reduce(b), a.shape
    return a, b, shape, (a.dtype if b.dtype is None else least_upper(a.dtype, b.dtype))

  def full_reduce(self, x: Expr) -> Expr:
    if x.dtype is None: return x
    op = self.draw(st.sampled_from(["max", "min"]))
    return Expr(f"{x}.{op}()", (), lambda i: getattr(x.tt(i), op)(), lambda i: getattr(np, op)(x.ref(i)), x.dtype)

  def expr(self, depth: int, kind: str) -> Expr:
    """kind: "int" (any int dtype) or "bool"."""
    draw = self.draw
    if depth <= 0 or draw(st.integers(0, 5)) == 0:
      if kind == "int": return self.leaf()
      a, b = self.leaf(), self.const(dtypes.int32)
      return Expr(f"({a} > {b})", a.shape, lambda i: a.tt(i) > b.tt(i),  # the constant wraps to a's type first, as in torch
                  lambda i: a.ref(i) > np.asarray(b.ref(i)).astype(a.dtype.np), dtypes.bool)
    ops = ["unary", "binary", "binary", "where", "movement", "movement", "reduce"] + (["from_bool"] if kind == "int" else ["cmp"])
    op = draw(st.sampled_from(ops))
    if op == "unary":
      x = self.expr(depth - 1, kind)
      if kind == "bool":
        return Expr(f"~{x}", x.shape, lambda i: ~x.tt(i), lambda i: ~x.ref(i), dtypes.bool)
      name = draw(st.sampled_from(["neg", "abs", "relu", "invert"]))
      fns: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray]]] = {
        "neg": (lambda t: -t, lambda a: -a), "abs": (lambda t: t.abs(), np.abs), "invert": (lambda t: ~t, lambda a: ~a),
        "relu": (lambda t: t.relu(), lambda a: np.maximum(a, 0).astype(a.dtype))}
      tt1, ref1 = fns[name]
      return Expr(f"{x}.{name}()", x.shape, lambda i: tt1(x.tt(i)), lambda i: ref1(x.ref(i)), x.dtype)
    if op in ("binary", "cmp"):
      sub = "int" if op == "cmp" else kind
      a, b, shape, dt = self.pair(depth, sub)
      if op == "cmp" or kind == "bool":
        name = draw(st.sampled_from(["<", ">", "==", "!=", "<=", ">="] if op == "cmp" else ["&", "|", "^", "maximum", "minimum"]))
      else: name = draw(st.sampled_from(["+", "-", "*", "&", "|", "^", "maximum", "minimum"]))
      out_dt = dtypes.bool if op == "cmp" else dt
      fn = INT_BINARY[name]
      def ref2(i: list[Any]) -> np.ndarray:
        x, y = np.asarray(a.ref(i)).astype(dt.np).astype(np.int64), np.asarray(b.ref(i)).astype(dt.np).astype(np.int64)
        return self.check(fn(x, y), dt).astype(out_dt.np)
      code = f"{a}.{name}({b})" if name in ("maximum", "minimum") else f"({a} {name} {b})"
      return Expr(code, shape, lambda i: fn(a.tt(i), b.tt(i)), ref2, out_dt)
    if op == "where":
      c = self.expr(depth - 1, "bool")
      p, q = self.expr(depth - 1, kind), self.expr(depth - 1, kind)
      out = _broadcast(c.shape, p.shape, q.shape)
      if out is None or math.prod(out) > MAX_NUMEL: return p
      dt = least_upper(p.dtype, q.dtype)
      return Expr(f"{c}.where({p}, {q})", out, lambda i: c.tt(i).where(p.tt(i), q.tt(i)),
                  lambda i: np.where(c.ref(i), p.ref(i).astype(dt.np), q.ref(i).astype(dt.np)), dt)
    if op == "from_bool":
      c = self.expr(depth - 1, "bool")
      if draw(st.booleans()):
        return Expr(f"{c}.cast(dtypes.int32)", c.shape, lambda i: c.tt(i).cast(dtypes.int32), lambda i: c.ref(i).astype(np.int32), dtypes.int32)
      axis, keepdim = (_axis_arg(draw, len(c.shape)), draw(st.booleans())) if c.shape else (None, False)
      return Expr(f"{c}.sum({axis!r}, keepdim={keepdim})", _reduced_shape(c.shape, axis, keepdim), lambda i: c.tt(i).sum(axis, keepdim=keepdim),
                  lambda i: np.sum(c.ref(i), axis=_axes(axis, len(c.shape)), keepdims=keepdim, dtype=np.int64), dtypes.int64)
    x = self.expr(depth - 1, kind)
    if op == "movement":
      return movement(draw, x, True, st.sampled_from([True, False] if x.dtype == dtypes.bool else [0, 0, 3]))
    if not x.shape: return x
    name = draw(st.sampled_from(["max", "min"] + (["sum"] if kind == "int" else [])))
    axis, keepdim = _axis_arg(draw, len(x.shape)), draw(st.booleans())
    out_dt = x.dtype if name != "sum" else (x.dtype if x.dtype == dtypes.int64 else dtypes.int64)
    def red(i: list[Any]) -> np.ndarray:
      v = x.ref(i)
      return self.check(getattr(np, name)(v.astype(out_dt.np), axis=_axes(axis, v.ndim), keepdims=keepdim), out_dt)
    return Expr(f"{x}.{name}({axis!r}, keepdim={keepdim})", _reduced_shape(x.shape, axis, keepdim),
                lambda i: getattr(x.tt(i), name)(axis, keepdim=keepdim), red, out_dt)


@st.composite
def int_exprs(draw: Any) -> tuple[Expr, list[np.ndarray], list[DType]]:
  rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
  shapes = draw(input_shapes())
  dts = [draw(st.sampled_from(INT_TYPES)) for _ in shapes]
  inputs = [rng.integers(0 if dt.is_unsigned else -20, 40 if dt.is_unsigned else 21, s).astype(dt.np) for s, dt in zip(shapes, dts)]
  return IntExprs(draw, inputs, dts).expr(draw(st.integers(1, 4)), draw(st.sampled_from(["int", "int", "bool"]))), inputs, dts


def test_random_int_and_bool_expressions(each_device: str) -> None:  # also on the devices with workgroups
  settings(max_examples=device_examples(60, each_device), **FUZZ)(given(int_exprs())(random_int_expression))()


def random_int_expression(case: tuple[Expr, list[np.ndarray], list[DType]]) -> None:
  expr, inputs, dts = case
  try: ref = np.asarray(expr.ref(inputs))
  except Ambiguous: reject()
  out = expr.tt([Tensor(x, dtype=dt) for x, dt in zip(inputs, dts)])
  assert out.dtype == expr.dtype, f"{expr}: dtype {out.dtype} != {expr.dtype}"
  got = realize_or_reject(lambda: out)
  assert got.dtype == expr.dtype.np and got.shape == ref.shape == expr.shape
  exp = ref.astype(expr.dtype.np)
  np.testing.assert_array_equal(got, exp, err_msg=str(expr))

