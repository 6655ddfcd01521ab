"""The one IR: immutable, hash-consed UOps, a small rule-table rewriter, and symbolic index math.

The same UOp type is the lazy tensor graph (BUFFER, CONST, VIEW, REDUCE and ALU nodes) and
the integer index expressions that kernels render (VAR, CONST and int ALU nodes)."""
from __future__ import annotations

import math
import weakref
from enum import Enum, auto
from typing import Any, Callable, Generic, TypeVar

from tinytune.dtype import DType, dtypes


class Ops(Enum):
  # graph leaves and structure
  BUFFER = auto(); CONST = auto(); VIEW = auto(); REDUCE = auto(); CAST = auto(); BITCAST = auto(); VAR = auto(); CONTIGUOUS = auto()  # noqa: E702
  # GATHER(x, index), arg d: x read where dim d's index is index's value (index has x's shape but at d; out of range reads 0)
  GATHER = auto()
  # CHECK(x, flag), arg (lo, hi): x, and where an element of x is outside [lo, hi) the kernel that computes it stores that element into
  # flag (a BUFFER of one int64, engine.realize.Flag), which the realize that ran the kernel reads: a bounds check fused where x is read
  CHECK = auto()
  # ATTENTION(q, k, v[, mask]), arg (scale, causal): softmax(q @ k^T * scale [+ mask]) @ v over the last two dims, (..., L, E) (..., S, E)
  # (..., S, Ev) [(..., L, S): a bool mask keeps the scores where true, another is added] -> (..., L, Ev), computed in one kernel by
  # online softmax (causal: query i sees keys 0..i)
  ATTENTION = auto()
  # unary
  NEG = auto(); EXP2 = auto(); LOG2 = auto(); SIN = auto(); SQRT = auto(); RECIP = auto()  # noqa: E702
  # binary
  ADD = auto(); MUL = auto(); IDIV = auto(); MOD = auto(); MAX = auto(); CMPLT = auto(); CMPNE = auto()  # noqa: E702
  AND = auto(); OR = auto(); XOR = auto()  # noqa: E702
  # ternary
  WHERE = auto()
  # a lowered program's statements (codegen/lower/): loops, branches, accumulators, memory, lanes, the workgroup, tensor cores
  RANGE = auto(); ENDRANGE = auto(); IF = auto(); ELSE = auto(); ENDIF = auto(); EXIT = auto()  # noqa: E702
  DEFINE_ACC = auto(); ASSIGN = auto(); LOAD = auto(); STORE = auto(); VECTORIZE = auto(); GEP = auto(); FOLD = auto()  # noqa: E702
  SPECIAL = auto(); DEFINE_VAR = auto(); INRANGE = auto(); DEFINE_LOCAL = auto(); CELL = auto(); BARRIER = auto(); WMMA = auto()  # noqa: E702
  __hash__ = object.__hash__  # members are singletons; enum's own hash is a python call, and UOps hash their op on every construction


# members as module names, for the code that runs on every node built or walked (a step's graph, an index expression): on Python 3.11
# each `Ops.X` goes through the enum metaclass's __getattr__ hook, some 900 machine instructions (a 6-node realize walk asked 19)
BUFFER, CONST, VIEW, WHERE = Ops.BUFFER, Ops.CONST, Ops.VIEW, Ops.WHERE


COMPARISONS = {Ops.CMPLT, Ops.CMPNE}
UNARY = {Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP}
TRANSCENDENTAL = {Ops.EXP2, Ops.LOG2, Ops.SIN}  # calls of math code: tens of instructions a value
BINARY = {Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR}
ALU = UNARY | BINARY | {Ops.WHERE, Ops.CAST, Ops.BITCAST}
COMMUTATIVE = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR}

# python semantics of each ALU op, with floor division (the renderers emit floor division where operands can be negative)
PYTHON_ALU: dict[Ops, Callable[..., Any]] = {
  Ops.NEG: lambda x: -x, Ops.ADD: lambda x, y: x + y, Ops.MUL: lambda x, y: x * y, Ops.MAX: max,
  Ops.IDIV: lambda x, y: x // y if y else 0, Ops.MOD: lambda x, y: x % y if y else 0,
  Ops.CMPLT: lambda x, y: x < y, Ops.CMPNE: lambda x, y: x != y,
  Ops.AND: lambda x, y: x & y, Ops.OR: lambda x, y: x | y, Ops.XOR: lambda x, y: x ^ y, Ops.WHERE: lambda c, x, y: x if c else y,
}


_INT_RANGE = {d.name: (dtypes.min(d), dtypes.max(d)) for d in dtypes.all if d.is_int}
T = TypeVar("T")


class cached(Generic[T]):
  """A property computed once per object (functools.cached_property takes a lock on every first access in Python 3.11)."""
  def __init__(self, fn: Callable[[Any], T]): self.fn, self.name = fn, fn.__name__
  def __get__(self, obj: Any, cls: Any = None) -> T:
    obj.__dict__[self.name] = ret = self.fn(obj)
    return ret


class _Ref(weakref.ref):
  """The hash-consing table's reference to a live node, with the node's key: cheaper to make than a callback bound to the key."""
  __slots__ = ("key",)
  key: tuple


def _forget(ref: _Ref) -> None:
  if (now := _cache.pop(ref.key, None)) is not ref and now is not None: _cache[ref.key] = now  # a newer node built after this one died


_OWN_SHAPE = {Ops.BUFFER, Ops.CONST, Ops.VAR, Ops.VIEW, Ops.REDUCE, Ops.GATHER, Ops.ATTENTION}  # the ops whose shape is not their first source's
_cache: dict[tuple, _Ref] = {}  # structure -> the live node (a plain dict: WeakValueDictionary.get is slow)


class UOp:
  """An immutable graph node (op, dtype, src, arg). Equal structure means the same object (hash-consing)."""
  __slots__ = ("op", "dtype", "src", "arg", "__dict__", "__weakref__")
  op: Ops
  dtype: DType
  src: tuple[UOp, ...]
  arg: Any

  def __new__(cls, op: Ops, dtype: DType, src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
    # the dtype's name hashes faster than the dtype; repr keeps -0.0 apart from 0.0 (an int or bool constant's dtype says which it is)
    key = (op, dtype.name, src, repr(arg) if type(arg) is float and op is CONST else arg)
    if (ref := _cache.get(key)) is not None and (ret := ref()) is not None: return ret
    ret = object.__new__(cls)
    ret.op, ret.dtype, ret.src, ret.arg = op, dtype, src, arg
    _cache[key] = ref = _Ref(ret, _forget)
    ref.key = key
    return ret

  @staticmethod
  def unique(op: Ops, dtype: DType, src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
    """A node never shared with another (a lowered program's statement, which its arg names): built without the hash-consing lookup."""
    ret = object.__new__(UOp)
    ret.op, ret.dtype, ret.src, ret.arg = op, dtype, src, arg
    return ret

  def __reduce__(self): raise TypeError("UOps are not pickled; serialize opts as JSON instead")
  def __repr__(self) -> str: return pretty(self)

  # ***** constructors *****
  @staticmethod
  def const(dtype: DType, v: Any) -> UOp:
    if (kind := dtype.kind) == "f": v = float(v)
    elif kind == "b": v = bool(v)
    elif not (r := _INT_RANGE[dtype.name])[0] <= (v := int(v)) <= r[1]:  # an int wraps to its type's range, as in C
      bits = 8 * dtype.itemsize
      v = (v % 2**bits) - (2**bits if kind == "i" and v % 2**bits >= 2**(bits - 1) else 0)
    return UOp(CONST, dtype, (), v)

  @staticmethod
  def var(name: str, lo: int, hi: int) -> UOp: return UOp(Ops.VAR, dtypes.int64, (), (name, lo, hi))

  def alu(self, op: Ops, *src: UOp) -> UOp:
    dtype = dtypes.bool if op in COMPARISONS else (src[-1] if op is WHERE else self).dtype
    return UOp(op, dtype, (self, *src))

  def cast(self, dtype: DType) -> UOp:
    if self.dtype == dtype: return self
    if dtype == dtypes.bool and self.op is Ops.CAST and self.src[0].dtype == dtypes.bool: return self.src[0]  # a mask made a number and back
    return UOp(Ops.CAST, dtype, (self,))

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
  @cached
  def shape(self) -> tuple[int, ...]:
    if self.op not in _OWN_SHAPE: return self.src[0].shape  # an ALU op's, asked of every op a Tensor builds
    if self.op is Ops.BUFFER: return (self.arg.size,)
    if self.op in (Ops.CONST, Ops.VAR): return ()
    if self.op is Ops.VIEW: return self.arg.shape
    if self.op is Ops.REDUCE: return tuple(1 if i in self.arg[1] else s for i, s in enumerate(self.src[0].shape))
    if self.op is Ops.GATHER: return self.src[1].shape
    return (*self.src[0].shape[:-1], self.src[2].shape[-1])  # ATTENTION's

  @property
  def toposort(self) -> list[UOp]:
    """Every node under this one (itself last), each once, sources before users (depth first, sources in order)."""
    return [*self.below, self]

  @cached
  def below(self) -> list[UOp]:
    """toposort without the node itself: kept on the node, a list holding the node would make every sorted node a reference
    cycle that only the garbage collector frees, and with it the buffers its graph reads."""
    order: list[UOp] = []
    done: set[UOp] = set()  # in order, and so are all the nodes under it
    stack = [self]
    while stack:
      node = stack[-1]
      for s in node.src:
        if s in done: continue
        if (known := s.__dict__.get("below")) is not None:  # a sorted subgraph (a realized input): the nodes not in order yet
          order.extend(x for x in known if x not in done)
          done.update(known)
          done.add(s); order.append(s)
          continue
        stack.append(s)
        break
      else:
        stack.pop()
        if node not in done: done.add(node); order.append(node)
    order.pop()  # the node itself
    return order

  @cached
  def vars(self) -> frozenset[UOp]: return frozenset([self]) if self.op is Ops.VAR else frozenset().union(*(s.vars for s in self.src))

  @cached
  def bounds(self) -> tuple[Any, Any]:
    """(vmin, vmax) of an integer or bool expression."""
    s = [x.bounds for x in self.src]
    if self.op is Ops.CONST: return (self.arg, self.arg)
    if self.op is Ops.VAR: return (self.arg[1], self.arg[2])
    if self.op is Ops.ADD: return (s[0][0] + s[1][0], s[0][1] + s[1][1])
    if self.op is Ops.MUL:
      corners = [a * b if a and b else 0 for a in s[0] for b in s[1]]  # 0 * inf is 0 here, not nan
      return (min(corners), max(corners))
    if self.op is Ops.MAX: return (max(s[0][0], s[1][0]), max(s[0][1], s[1][1]))
    if self.op is Ops.IDIV and s[1][0] == s[1][1] and s[1][0] > 0 and not math.isinf(s[0][0]) and not math.isinf(s[0][1]):
      return (s[0][0] // s[1][0], s[0][1] // s[1][0])
    if self.op is Ops.MOD and s[1][0] == s[1][1] and s[1][0] > 0:
      c = s[1][0]
      return s[0] if 0 <= s[0][0] and s[0][1] < c and s[0][0] // c == s[0][1] // c else (0, c - 1)
    if self.op is Ops.CMPLT: return (int(s[0][1] < s[1][0]), int(s[0][0] < s[1][1]))
    if self.op is Ops.XOR and self.dtype.is_int and s[0][0] >= 0 and s[1][0] >= 0 and not math.isinf(s[0][1]) and not math.isinf(s[1][1]):
      return (0, (1 << int(max(s[0][1], s[1][1])).bit_length()) - 1)  # a swizzled offset (lower.staged): the bits of neither operand
    if self.op is Ops.WHERE:
      c, x = self.src[0], self.src[1]
      if c.op is Ops.CMPLT and (v := c.src[0]).op is Ops.VAR and c.src[1].op is Ops.CONST and v.arg[1] < c.src[1].arg <= v.arg[2]:
        # a padded dim's clamp (v < k ? f(v) : last): f where v < k, so a row tile's last rows index as its others do
        s[1] = x.substitute({v: UOp.var(v.arg[0], v.arg[1], c.src[1].arg - 1)}).bounds
      return (min(s[1][0], s[2][0]), max(s[1][1], s[2][1]))
    if self.op is Ops.CAST and self.dtype.is_int and dtypes.min(self.dtype) <= s[0][0] and s[0][1] <= dtypes.max(self.dtype): return s[0]
    if self.dtype.kind == "b": return (0, 1)
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
  """A readable one-line form of small expressions (index math); kept on the node, as sums sort their terms by it."""
  if (ret := u.__dict__.get("_pretty")) is None: ret = u.__dict__["_pretty"] = _pretty(u)
  return ret


def _pretty(u: UOp) -> str:
  if u.op is Ops.CONST: return repr(u.arg)
  if u.op is Ops.VAR: return u.arg[0]
  if u.op is Ops.BUFFER: return f"buf{u.arg.uid}"
  sym = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.CMPLT: "<", Ops.CMPNE: "!=", Ops.AND: "&", Ops.OR: "|"}
  if u.op in sym: return f"({pretty(u.src[0])}{sym[u.op]}{pretty(u.src[1])})"
  return f"{u.op.name}({', '.join(pretty(s) for s in u.src)}{', ' + repr(u.arg) if u.arg is not None else ''})"


# ***** rewriting: a rule is (pattern, function); the function gets the pattern's named nodes and returns a replacement or None *****

class Pat:
  """Matches a UOp whose op is one of `ops` (any op where None) and whose sources match `src` in order (in either order for
  a commutative op with two); `name` binds the node, and a name bound twice must bind the same node."""
  __slots__ = ("ops", "src", "name")

  def __init__(self, ops: Ops | tuple[Ops, ...] | set[Ops] | None = None, src: tuple[Pat, ...] | None = None, name: str | None = None):
    self.ops = None if ops is None else frozenset([ops] if isinstance(ops, Ops) else ops)
    self.src, self.name = src, name

  def match(self, u: UOp, bound: dict[str, UOp]) -> bool:
    if self.ops is not None and u.op not in self.ops: return False
    if self.name is not None and bound.setdefault(self.name, u) is not u: return False
    if self.src is None: return True
    if len(self.src) != len(u.src): return False
    orders = [u.src, u.src[::-1]] if u.op in COMMUTATIVE and len(u.src) == 2 else [u.src]
    for srcs in orders:
      trial = dict(bound)
      if all(p.match(s, trial) for p, s in zip(self.src, srcs)):
        bound.update(trial)
        return True
    return False


class Rules:
  """A table of (pattern, function) rules, tried in order. Tables compose with `+`: a dialect puts its own rules first."""

  def __init__(self, rules: list[tuple[Pat, Callable[..., UOp | None]]]):
    self.rules = rules
    self.by_op: dict[Ops, list[tuple[Pat, Callable[..., UOp | None]]]] = {op: [r for r in rules if r[0].ops is None or op in r[0].ops] for op in Ops}

  def __add__(self, other: Rules) -> Rules: return Rules(self.rules + other.rules)

  def rewrite(self, u: UOp) -> UOp | None:
    """The first rule's replacement for `u` itself (not its sources), or None where no rule fires."""
    for pat, fn in self.by_op[u.op]:
      bound: dict[str, UOp] = {}
      if pat.match(u, bound) and (ret := fn(**bound)) is not None and ret is not u: return ret
    return None


def graph_rewrite(root: UOp, rules: Rules, memo: dict[UOp, UOp] | None = None) -> UOp:
  """Rewrite bottom-up to a fixed point: rebuild each node from its rewritten sources; where a rule fires, rewrite its result in turn.
  `memo` (node -> rewritten node) may be shared by calls with the same rules, so common subexpressions are rewritten once."""
  done: dict[UOp, UOp] = {} if memo is None else memo
  def rewrite(u: UOp) -> UOp:
    if (ret := done.get(u)) is not None: return ret
    src = tuple(rewrite(s) for s in u.src)
    new = u if src == u.src else UOp(u.op, u.dtype, src, u.arg)
    done[u] = done[new] = ret = new if (fired := rules.rewrite(new)) is None else rewrite(fired)
    return ret
  return rewrite(root)


# ***** symbolic rules for index math *****

def _const(u: UOp) -> Any: return u.arg if u.op is Ops.CONST else None


def linear(u: UOp) -> tuple[dict[UOp, int], int]:
  """An int expression as sum(coef*term) + const, flattening ADD and MUL-by-constant. The dict is shared: copy before changing it."""
  if (ret := u.__dict__.get("_linear")) is None:
    ret = _linear(u)
    if u not in ret[0]: u.__dict__["_linear"] = ret  # a term keeps its own form uncached: no reference cycle
  return ret


def _linear(u: UOp) -> tuple[dict[UOp, int], int]:
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
        terms = dict(terms)
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


def fold(u: UOp) -> UOp | None:
  """Constant operands, or an int or bool whose bounds are one value, become a constant."""
  if all(s.op is Ops.CONST for s in u.src): return UOp.const(u.dtype, PYTHON_ALU[u.op](*[s.arg for s in u.src]))
  if u.dtype.kind in "iub":
    lo, hi = u.bounds
    if lo == hi and not math.isinf(lo): return UOp.const(u.dtype, lo)
  return None


def canonical_sum(u: UOp) -> UOp | None:
  """An int sum in one order: terms sorted by their text, each once with its coefficient, the constant last."""
  if not u.dtype.is_int: return None
  terms, c = linear(u)
  new = from_linear(u.dtype, _merge_divmod(terms), c)
  return None if new is u else new


def divmod_const(u: UOp, x: UOp, divisor: UOp) -> UOp | None:
  """x // d and x % d by a positive constant: drop what the bounds make whole, nest, cancel a common factor, pull out multiples."""
  op, d = u.op, divisor.arg
  if not u.dtype.is_int or d <= 0: return None
  if d == 1: return x if op is Ops.IDIV else UOp.const(u.dtype, 0)
  if op is Ops.MOD and 0 <= x.vmin and x.vmax < d: return x
  if op is Ops.IDIV and x.op is Ops.IDIV and (d2 := _const(x.src[1])) and d2 > 0: return x.src[0] // (d * d2)
  if op is Ops.MOD and x.op is Ops.MOD and (d2 := _const(x.src[1])) and d2 > 0 and d2 % d == 0: return x.src[0] % d
  terms, c = linear(x)
  g = math.gcd(d, c, *terms.values())
  if g > 1:  # (g*y) // (g*e) == y // e and (g*y) % (g*e) == g*(y % e)
    y = from_linear(u.dtype, {t: v // g for t, v in terms.items()}, c // g)
    return y // (d // g) if op is Ops.IDIV else (y % (d // g)) * g
  whole, q = {t: v // d for t, v in terms.items() if v % d == 0}, c // d
  if not whole and q == 0:  # nothing to pull out of the division: a part that a factor g of d leaves below g may drop
    if (split := _split_below(terms, c, lambda g: d % g == 0)) is None: return None
    g, big, small = split
    return big // (d // g) if op is Ops.IDIV else (big % (d // g)) * g + small
  rest = from_linear(u.dtype, {t: v for t, v in terms.items() if v % d != 0}, c % d)  # floor semantics: (d*a + r) // d == a + r // d
  return rest % d if op is Ops.MOD else from_linear(u.dtype, whole, q) + rest // d


def _split_below(terms: dict[UOp, int], c: int, fits: Callable[[int], bool]) -> tuple[int, UOp, UOp] | None:
  """sum(terms) + c as g*big + small with 0 <= small < g, for the largest coefficient g (in absolute value) that `fits` and leaves
  some term in big (a split index whose inner part an upcast's lanes or a padded view's offset keep below the outer's stride)."""
  for g in sorted({abs(v) for v in terms.values()}, reverse=True):
    if g < 2 or not fits(g): continue
    dtype = next(iter(terms)).dtype
    small = from_linear(dtype, {t: v for t, v in terms.items() if v % g != 0}, c % g)
    if 0 <= small.vmin and small.vmax < g:
      return g, from_linear(dtype, {t: v // g for t, v in terms.items() if v % g == 0}, c // g), small
  return None


def lt_const(a: UOp, c: UOp) -> UOp | None:
  """sum + k < c becomes sum < c - k, and a common factor g of the sum's coefficients divides out: g*s < c iff s < ceil(c / g);
  g*s + r < c with 0 <= r < g (an upcast's lanes) is s < ceil(c / g) where g divides c."""
  if not a.dtype.is_int: return None
  c, (terms, k) = c.arg, linear(a)
  if k != 0: return from_linear(a.dtype, terms, 0).lt(c - k)
  g = math.gcd(*terms.values()) if terms else 1
  if g > 1: return from_linear(a.dtype, {t: v // g for t, v in terms.items()}, 0).lt(-(-c // g))
  if (split := _split_below(terms, 0, lambda g: c % g == 0)) is not None: return split[1].lt(c // split[0])
  return None


FOLDED = (Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.WHERE, Ops.MAX)
symbolic = Rules([
  (Pat(FOLDED, name="u"), fold),
  (Pat((Ops.ADD, Ops.MUL), name="u"), canonical_sum),
  (Pat((Ops.IDIV, Ops.MOD), src=(Pat(name="x"), Pat(Ops.CONST, name="divisor")), name="u"), divmod_const),
  (Pat(Ops.CMPLT, src=(Pat(name="a"), Pat(Ops.CONST, name="c"))), lt_const),
  (Pat(Ops.AND, src=(Pat(Ops.CONST, name="c"), Pat(name="x"))), lambda c, x: x if c.arg else c),
  (Pat(Ops.OR, src=(Pat(Ops.CONST, name="c"), Pat(name="x"))), lambda c, x: c if c.arg else x),
  (Pat((Ops.AND, Ops.OR), src=(Pat(name="x"), Pat(name="x"))), lambda x: x),
  (Pat(Ops.WHERE, src=(Pat(Ops.CONST, name="c"), Pat(name="x"), Pat(name="y"))), lambda c, x, y: x if c.arg else y),
  (Pat(Ops.WHERE, src=(Pat(), Pat(name="x"), Pat(name="x"))), lambda x: x),
])


def is_linear(u: UOp) -> bool:
  """Whether `u` is an int sum of variables (each with more than one value) times constants."""
  if (ret := u.__dict__.get("_is_linear")) is None:
    if u.op is Ops.ADD: ret = is_linear(u.src[0]) and is_linear(u.src[1])
    elif u.op is Ops.MUL: ret = any(c.op is Ops.CONST and is_linear(x) for c, x in (u.src, u.src[::-1]))
    else: ret = u.op is Ops.CONST or (u.op is Ops.VAR and u.arg[1] < u.arg[2])
    u.__dict__["_is_linear"] = ret
  return ret


def linear_sum(dtype: DType, parts: list[tuple[UOp, int]], c: int = 0, memo: dict[UOp, UOp] | None = None) -> UOp:
  """simplify(c + x0*k0 + x1*k1 + ...), built and linearized only where some x is not linear (index math from strides)."""
  if not all(is_linear(x) for x, _ in parts):
    return simplify(sum((x * k for x, k in parts), UOp.const(dtype, c)), memo)
  terms: dict[UOp, int] = {}
  for x, k in parts:  # as linear() adds up the expression (c + x0*k0) + x1*k1 ...: zero coefficients go at each step
    xterms, xc = linear(x)
    for t, v in xterms.items(): terms[t] = terms.get(t, 0) + v * k
    terms, c = {t: v for t, v in terms.items() if v != 0}, c + xc * k
  return from_linear(dtype, terms, c)


def simplify(u: UOp, memo: dict[UOp, UOp] | None = None) -> UOp:
  """Index math folded and put in a canonical form; `memo` may be shared between calls (see graph_rewrite). A linear expression
  goes straight to the canonical sum that the rules reach one node at a time (most index math is linear: tests check they agree)."""
  if u.dtype.is_int and is_linear(u): return from_linear(u.dtype, *linear(u))
  return graph_rewrite(u, symbolic, memo)
