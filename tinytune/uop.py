"""The one IR: immutable, hash-consed UOps, a small rule-table rewriter, and symbolic index math.

The same UOp type is the lazy tensor graph (BUFFER, CONST, VIEW, REDUCE and ALU nodes) and
the integer index expressions that kernels render (VAR, CONST and int ALU nodes)."""
from __future__ import annotations

import math
import weakref
from enum import Enum, auto
from functools import cached_property
from typing import Any, Callable

from tinytune.dtype import DType, dtypes


class Ops(Enum):
  # graph leaves and structure
  BUFFER = auto(); CONST = auto(); VIEW = auto(); REDUCE = auto(); CAST = auto(); VAR = auto(); CONTIGUOUS = auto()  # noqa: E702
  # unary
  NEG = auto(); EXP2 = auto(); LOG2 = auto(); SIN = auto(); SQRT = auto(); RECIP = auto()  # noqa: E702
  # binary
  ADD = auto(); MUL = auto(); IDIV = auto(); MOD = auto(); MAX = auto(); CMPLT = auto(); CMPNE = auto()  # noqa: E702
  AND = auto(); OR = auto(); XOR = auto()  # noqa: E702
  # ternary
  WHERE = auto()


UNARY = {Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP}
BINARY = {Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR}
ALU = UNARY | BINARY | {Ops.WHERE, Ops.CAST}
COMMUTATIVE = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR}

# python semantics of each ALU op, with floor division (the renderers emit floor division where operands can be negative)
PYTHON_ALU: dict[Ops, Callable[..., Any]] = {
  Ops.NEG: lambda x: -x, Ops.ADD: lambda x, y: x + y, Ops.MUL: lambda x, y: x * y, Ops.MAX: max,
  Ops.IDIV: lambda x, y: x // y if y else 0, Ops.MOD: lambda x, y: x % y if y else 0,
  Ops.CMPLT: lambda x, y: x < y, Ops.CMPNE: lambda x, y: x != y,
  Ops.AND: lambda x, y: x & y, Ops.OR: lambda x, y: x | y, Ops.XOR: lambda x, y: x ^ y, Ops.WHERE: lambda c, x, y: x if c else y,
}


class UOp:
  """An immutable graph node (op, dtype, src, arg). Equal structure means the same object (hash-consing)."""
  __slots__ = ("op", "dtype", "src", "arg", "__dict__", "__weakref__")
  op: Ops
  dtype: DType
  src: tuple[UOp, ...]
  arg: Any
  _cache: weakref.WeakValueDictionary[tuple, UOp] = weakref.WeakValueDictionary()

  def __new__(cls, op: Ops, dtype: DType, src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
    key = (op, dtype, src, repr(arg) if op is Ops.CONST else arg)  # repr keeps -0.0 apart from 0.0 and 1 from True
    if (ret := UOp._cache.get(key)) is not None: return ret
    ret = super().__new__(cls)
    ret.op, ret.dtype, ret.src, ret.arg = op, dtype, src, arg
    UOp._cache[key] = ret
    return ret

  def __reduce__(self): raise TypeError("UOps are not pickled; serialize opts as JSON instead")
  def __repr__(self) -> str: return pretty(self)

  # ***** constructors *****
  @staticmethod
  def const(dtype: DType, v: Any) -> UOp:
    v = bool(v) if dtype == dtypes.bool else float(v) if dtype.is_float else int(v)
    return UOp(Ops.CONST, dtype, (), v)

  @staticmethod
  def var(name: str, lo: int, hi: int) -> UOp: return UOp(Ops.VAR, dtypes.int64, (), (name, lo, hi))

  def alu(self, op: Ops, *src: UOp) -> UOp:
    dtype = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE) else (src[-1] if op is Ops.WHERE else self).dtype
    return UOp(op, dtype, (self, *src))

  def cast(self, dtype: DType) -> UOp: return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))

  # ***** symbolic index math (python ints are promoted to int constants) *****
  def _c(self, x: UOp | int) -> UOp: return x if isinstance(x, UOp) else UOp.const(self.dtype, x)
  def __add__(self, x: UOp | int) -> UOp: return self.alu(Ops.ADD, self._c(x))
  def __radd__(self, x: int) -> UOp: return self._c(x).alu(Ops.ADD, self)
  def __sub__(self, x: UOp | int) -> UOp: return self + (-self._c(x))
  def __mul__(self, x: UOp | int) -> UOp: return self.alu(Ops.MUL, self._c(x))
  def __rmul__(self, x: int) -> UOp: return self._c(x).alu(Ops.MUL, self)
  def __neg__(self) -> UOp: return self * -1
  def __floordiv__(self, x: UOp | int) -> UOp: return self.alu(Ops.IDIV, self._c(x))
  def __mod__(self, x: UOp | int) -> UOp: return self.alu(Ops.MOD, self._c(x))
  def lt(self, x: UOp | int) -> UOp: return self.alu(Ops.CMPLT, self._c(x))
  def ge(self, x: UOp | int) -> UOp: return self.lt(x).alu(Ops.CMPNE, UOp.const(dtypes.bool, True))
  def logical_and(self, x: UOp) -> UOp: return self.alu(Ops.AND, x)

  # ***** properties *****
  @cached_property
  def shape(self) -> tuple[int, ...]:
    if self.op is Ops.BUFFER: return (self.arg.size,)
    if self.op in (Ops.CONST, Ops.VAR): return ()
    if self.op is Ops.VIEW: return self.arg.shape
    if self.op is Ops.REDUCE: return tuple(1 if i in self.arg[1] else s for i, s in enumerate(self.src[0].shape))
    return self.src[0].shape

  @cached_property
  def toposort(self) -> list[UOp]:
    """Every node under this one (itself last), each once, sources before users."""
    order: list[UOp] = []
    seen: set[int] = set()
    stack: list[tuple[UOp, bool]] = [(self, False)]
    while stack:
      node, expanded = stack.pop()
      if expanded: order.append(node); continue
      if id(node) in seen: continue
      seen.add(id(node))
      stack.append((node, True))
      stack.extend((s, False) for s in reversed(node.src))
    return order

  @cached_property
  def vars(self) -> frozenset[UOp]: return frozenset(u for u in self.toposort if u.op is Ops.VAR)

  @cached_property
  def bounds(self) -> tuple[Any, Any]:
    """(vmin, vmax) of an integer or bool expression."""
    s = [x.bounds for x in self.src]
    if self.op is Ops.CONST: return (self.arg, self.arg)
    if self.op is Ops.VAR: return (self.arg[1], self.arg[2])
    if self.op is Ops.ADD: return (s[0][0] + s[1][0], s[0][1] + s[1][1])
    if self.op is Ops.MUL:
      corners = [a * b for a in s[0] for b in s[1]]
      return (min(corners), max(corners))
    if self.op is Ops.IDIV and s[1][0] == s[1][1] and s[1][0] > 0: return (s[0][0] // s[1][0], s[0][1] // s[1][0])
    if self.op is Ops.MOD and s[1][0] == s[1][1] and s[1][0] > 0:
      c = s[1][0]
      return s[0] if 0 <= s[0][0] and s[0][1] < c and s[0][0] // c == s[0][1] // c else (0, c - 1)
    if self.op is Ops.CMPLT: return (int(s[0][1] < s[1][0]), int(s[0][0] < s[1][1]))
    if self.op is Ops.WHERE: return (min(s[1][0], s[2][0]), max(s[1][1], s[2][1]))
    if self.op is Ops.CAST and self.dtype.is_int: return s[0]
    if self.dtype == dtypes.bool: return (0, 1)
    return (-math.inf, math.inf)

  @property
  def vmin(self) -> Any: return self.bounds[0]
  @property
  def vmax(self) -> Any: return self.bounds[1]

  def substitute(self, mapping: dict[UOp, UOp]) -> UOp:
    done: dict[UOp, UOp] = dict(mapping)
    for u in self.toposort:
      if u not in done: done[u] = u if not u.src else UOp(u.op, u.dtype, tuple(done[s] for s in u.src), u.arg)
    return done[self]


def pretty(u: UOp) -> str:
  """A readable one-line form of small expressions (index math)."""
  if u.op is Ops.CONST: return repr(u.arg)
  if u.op is Ops.VAR: return u.arg[0]
  if u.op is Ops.BUFFER: return f"buf{u.arg.uid}"
  sym = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.CMPLT: "<", Ops.CMPNE: "!=", Ops.AND: "&", Ops.OR: "|"}
  if u.op in sym: return f"({pretty(u.src[0])}{sym[u.op]}{pretty(u.src[1])})"
  return f"{u.op.name}({', '.join(pretty(s) for s in u.src)}{', ' + repr(u.arg) if u.arg is not None else ''})"


# ***** rewriting: rules are (op -> functions); a function returns a replacement or None *****

Rules = dict[Ops, list[Callable[[UOp], "UOp | None"]]]


def graph_rewrite(root: UOp, rules: Rules) -> UOp:
  """Rewrite bottom-up: rebuild each node from rewritten sources, then apply its rules until none fires."""
  done: dict[UOp, UOp] = {}
  for u in root.toposort:
    new = UOp(u.op, u.dtype, tuple(done[s] for s in u.src), u.arg) if u.src else u
    while (rewritten := next((r for fn in rules.get(new.op, []) if (r := fn(new)) is not None), None)) is not None:
      new = rewritten if rewritten is new or not rewritten.src else graph_rewrite(rewritten, rules)
      if new is rewritten and rewritten.src: break
    done[u] = new
  return done[root]


# ***** symbolic rules for index math *****

def _const(u: UOp) -> Any: return u.arg if u.op is Ops.CONST else None


def linear(u: UOp) -> tuple[dict[UOp, int], int]:
  """An int expression as sum(coef*term) + const, flattening ADD and MUL-by-constant."""
  if u.op is Ops.CONST: return {}, u.arg
  if u.op is Ops.ADD:
    (ta, ca), (tb, cb) = linear(u.src[0]), linear(u.src[1])
    terms = dict(ta)
    for t, c in tb.items(): terms[t] = terms.get(t, 0) + c
    return {t: c for t, c in terms.items() if c != 0}, ca + cb
  if u.op is Ops.MUL and ((c := _const(u.src[1])) is not None or (c := _const(u.src[0])) is not None):
    inner, k = linear(u.src[0] if _const(u.src[1]) is not None else u.src[1])
    return ({x: v * c for x, v in inner.items()} if c else {}), k * c
  return {u: 1}, 0


def _merge_divmod(terms: dict[UOp, int]) -> dict[UOp, int]:
  """(x//c)*c*k + (x%c)*k -> x*k, which reshapes produce."""
  for t, coef in list(terms.items()):
    if t.op is Ops.IDIV and (c := _const(t.src[1])) and t in terms:
      m = UOp(Ops.MOD, t.dtype, t.src)
      if m in terms and coef == terms[m] * c:
        k = terms.pop(m); terms.pop(t)
        x = t.src[0]
        terms[x] = terms.get(x, 0) + k
        return _merge_divmod(terms)
  return terms


def from_linear(dtype: DType, terms: dict[UOp, int], c: int) -> UOp:
  ret: UOp | None = None
  for t, coef in sorted(terms.items(), key=lambda tc: pretty(tc[0])):
    term = t if coef == 1 else UOp(Ops.MUL, dtype, (t, UOp.const(dtype, coef)))
    ret = term if ret is None else UOp(Ops.ADD, dtype, (ret, term))
  if ret is None: return UOp.const(dtype, c)
  return ret if c == 0 else UOp(Ops.ADD, dtype, (ret, UOp.const(dtype, c)))


def _fold(u: UOp) -> UOp | None:
  if all(s.op is Ops.CONST for s in u.src) and u.op in PYTHON_ALU: return UOp.const(u.dtype, PYTHON_ALU[u.op](*[s.arg for s in u.src]))
  if u.dtype.is_int or u.dtype == dtypes.bool:
    lo, hi = u.bounds
    if lo == hi and not math.isinf(lo): return UOp.const(u.dtype, lo)
  return None


def _canon_sum(u: UOp) -> UOp | None:
  if not u.dtype.is_int: return None
  terms, c = linear(u)
  new = from_linear(u.dtype, _merge_divmod(terms), c)
  return None if new is u else new


def _divmod(u: UOp) -> UOp | None:
  x, d = u.src[0], _const(u.src[1])
  if not u.dtype.is_int or d is None or d <= 0: return None
  if d == 1: return x if u.op is Ops.IDIV else UOp.const(u.dtype, 0)
  if u.op is Ops.MOD and 0 <= x.vmin and x.vmax < d: return x
  if u.op is Ops.IDIV and x.op is Ops.IDIV and (d2 := _const(x.src[1])) and d2 > 0: return x.src[0] // (d * d2)
  if u.op is Ops.MOD and x.op is Ops.MOD and (d2 := _const(x.src[1])) and d2 > 0 and d2 % d == 0: return x.src[0] % d
  terms, c = linear(x)
  g = math.gcd(d, c, *terms.values())
  if g > 1:  # (g*y) // (g*e) == y // e and (g*y) % (g*e) == g*(y % e)
    y = from_linear(u.dtype, {t: v // g for t, v in terms.items()}, c // g)
    return y // (d // g) if u.op is Ops.IDIV else (y % (d // g)) * g
  whole, q = {t: v // d for t, v in terms.items() if v % d == 0}, c // d
  if not whole and q == 0: return None  # nothing to pull out of the division
  rest = from_linear(u.dtype, {t: v for t, v in terms.items() if v % d != 0}, c % d)  # floor semantics: (d*a + r) // d == a + r // d
  return rest % d if u.op is Ops.MOD else from_linear(u.dtype, whole, q) + rest // d


def _cmplt(u: UOp) -> UOp | None:
  a, b = u.src
  if not a.dtype.is_int or (c := _const(b)) is None: return None
  terms, k = linear(a)
  if k != 0: return from_linear(a.dtype, terms, 0).lt(c - k)
  g = math.gcd(*terms.values()) if terms else 1
  if g > 1: return from_linear(a.dtype, {t: v // g for t, v in terms.items()}, 0).lt(-(-c // g))
  return None


def _logic(u: UOp) -> UOp | None:
  a, b = u.src
  for x, y in ((a, b), (b, a)):
    if (c := _const(x)) is not None:
      if u.op is Ops.AND: return y if c else x
      if u.op is Ops.OR: return x if c else y
  return a if a is b and u.op in (Ops.AND, Ops.OR) else None


def _where(u: UOp) -> UOp | None:
  c, x, y = u.src
  if (v := _const(c)) is not None: return x if v else y
  return x if x is y else None


symbolic: Rules = {
  Ops.ADD: [_fold, _canon_sum], Ops.MUL: [_fold, _canon_sum], Ops.IDIV: [_fold, _divmod], Ops.MOD: [_fold, _divmod],
  Ops.CMPLT: [_fold, _cmplt], Ops.CMPNE: [_fold], Ops.AND: [_fold, _logic], Ops.OR: [_fold, _logic], Ops.WHERE: [_fold, _where],
  Ops.MAX: [_fold],
}


def simplify(u: UOp) -> UOp: return graph_rewrite(u, symbolic)
