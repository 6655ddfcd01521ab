"""The symbolic index math on its own: folding, div/mod, gcd, bounds, comparisons, the pattern matcher, and properties checked by
evaluating random int expressions in Python (floor division) before and after simplification."""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinytune.dtype import dtypes
from tinytune.uop import PYTHON_ALU, Ops, Pat, Rules, UOp, graph_rewrite, is_linear, linear_sum, simplify, symbolic

x, y, z = UOp.var("x", 0, 9), UOp.var("y", 0, 3), UOp.var("z", -5, 5)


def c(v: int) -> UOp: return UOp.const(dtypes.int64, v)


def evaluate(u: UOp, env: dict[str, int]) -> Any:
  """An expression's value with each variable set from `env`, by Python's semantics of each op (floor division)."""
  if u.op is Ops.CONST: return u.arg
  if u.op is Ops.VAR: return env[u.arg[0]]
  return PYTHON_ALU[u.op](*[evaluate(s, env) for s in u.src])


# ***** folding and canonical forms *****

def test_constants_fold() -> None:
  assert simplify(c(3) * 4 + 2) is c(14)
  assert simplify(c(-7) // 2) is c(-4) and simplify(c(-7) % 2) is c(1)  # floor semantics
  assert simplify(c(3).lt(4)) is UOp.const(dtypes.bool, True)


def test_div_and_mod_of_a_split_index() -> None:
  assert simplify((x * 4 + y) // 4) is x
  assert simplify((x * 4 + y) % 4) is y
  assert simplify((y + x * 4) // 4) is x  # the order of the terms does not matter
  assert simplify((x * 4 + y + 8) // 4) is simplify(x + 2)


def test_nested_div_and_mod() -> None:
  assert simplify((x // 2) // 3) is simplify(x // 6)
  assert simplify((x % 12) % 4) is simplify(x % 4)
  assert simplify(((x * 12 + y) // 4) % 3) is simplify((x * 3) % 3)  # (12x + y) // 4 == 3x where y < 4
  assert simplify((x * 3) % 3) is c(0)


def test_a_part_below_a_factor_of_the_divisor_drops() -> None:
  # a pool's backward upcast along w (20 wide) by 4: (20h + 4g + lane) // 40 is h // 2 (its 2x2 windows' row), as w stays below 20
  h, g, lane = UOp.var("h", 0, 19), UOp.var("g", 0, 4), UOp.var("lane", 0, 3)
  assert simplify((h * 20 + g * 4 + lane) // 40) is simplify(h // 2) is simplify((h * 20 + g * 4 + 3) // 40)
  assert simplify((h * 20 + g * 4 + lane) % 40) is simplify((h % 2) * 20 + g * 4 + lane)
  assert simplify((h * 20 + g * 4 + lane + 1) // 40) is not simplify(h // 2)  # w + 1 reaches 20
  # a bound on an upcast's groups: 4g + lane < 24 is g < 6 for every lane; 4g + lane < 22 is not one comparison of g
  g = UOp.var("g", 0, 9)
  assert simplify((g * 4 + lane).lt(24)) is simplify(g.lt(6)) and lane in simplify((g * 4 + lane).lt(22)).vars


def test_gcd_cancels() -> None:
  assert simplify((x * 6 + y * 4 + 2) // 2) is simplify(x * 3 + y * 2 + 1)
  e = simplify((x * 6 + y * 4) % 4)  # 2 * ((3x + 2y) % 2)
  assert all(evaluate(e, {"x": a, "y": b}) == (6 * a + 4 * b) % 4 for a in range(10) for b in range(4))


def test_reshape_divmod_merges() -> None:
  # what a reshape of a contiguous (10, 4) view back to 40 produces: (i // 4) * 4 + i % 4 == i
  i = UOp.var("i", 0, 39)
  assert simplify((i // 4) * 4 + i % 4) is i
  assert simplify(((i // 4) * 4 + i % 4) * 3) is simplify(i * 3)


def test_mod_drops_where_bounds_fit() -> None:
  assert simplify(y % 4) is y and simplify(x % 10) is x
  assert simplify(x // 10) is c(0) and simplify(y // 4) is c(0)
  assert simplify(x % 5) is not x


def test_bounds() -> None:
  assert (x * 2 + 3).bounds == (3, 21)
  assert (z * -2).bounds == (-10, 10)
  assert (x % 4).bounds == (0, 3) and (y % 4).bounds == (0, 3) and ((x + 10) % 4).bounds == (0, 3)
  assert (x // 4).bounds == (0, 2) and (z // 2).bounds == (-3, 2)
  assert x.lt(10).bounds == (1, 1) and x.lt(0).bounds == (0, 0) and x.lt(5).bounds == (0, 1)
  assert simplify(x.lt(10)) is UOp.const(dtypes.bool, True) and simplify(x.lt(0)) is UOp.const(dtypes.bool, False)


def test_bounds_of_a_clamp_where_its_condition_holds() -> None:
  """A padded dim's clamp (g < 170 ? 6g + 4 : 1023, the last rows of a 6-row tile over 1024 rows) stays below 1024: its true branch
  only where g < 170, so the row's index divides by the rows' span to 0 (it was 1024 at most, and a batched matmul gathered each lane)."""
  g = UOp.var("g", 0, 170)
  row = UOp(Ops.WHERE, dtypes.int64, (g.lt(170), g * 6 + 4, UOp.const(dtypes.int64, 1023)))
  assert row.bounds == (4, 1023)
  assert simplify((row * 64 + y) // 65536) is c(0)
  assert UOp(Ops.WHERE, dtypes.int64, (g.lt(171), g * 6 + 4, c(0))).bounds == (0, 1024)  # a condition that always holds narrows nothing


def test_cmplt_canonical() -> None:
  assert simplify((x + 3).lt(5)) is simplify(x.lt(2))
  assert simplify((x * 4).lt(10)) is simplify(x.lt(3))  # 4x < 10 iff x < ceil(10 / 4)
  assert simplify((x * 4 + y * 8).lt(10)) is simplify((x + y * 2).lt(3))
  assert simplify((x * 4 + 1).lt(10)) is simplify(x.lt(3))


def test_logic_and_where() -> None:
  t, f, g = UOp.const(dtypes.bool, True), UOp.const(dtypes.bool, False), x.lt(5)
  assert simplify(g.logical_and(t)) is g and simplify(t.logical_and(g)) is g and simplify(g.logical_and(f)) is f
  assert simplify(g.alu(Ops.OR, t)) is t and simplify(f.alu(Ops.OR, g)) is g and simplify(g.logical_and(g)) is g
  assert simplify(UOp(Ops.WHERE, dtypes.int64, (t, x, y))) is x and simplify(UOp(Ops.WHERE, dtypes.int64, (g, y, y))) is y


def test_floats_are_left_alone() -> None:
  a = UOp(Ops.VIEW, dtypes.float32, (), None)
  assert simplify(a + a) is a + a


# ***** the fast paths agree with the rules *****

def test_linear_shortcuts_agree_with_the_rules() -> None:
  e = (c(0) + (x * 8 + 1) * 1024) + y * 1 + x * 3
  assert is_linear(e) and not is_linear(x // 2) and not is_linear(x * y) and not is_linear(UOp.var("d", 0, 0))
  assert simplify(e) is graph_rewrite(e, symbolic)
  assert linear_sum(dtypes.int64, [(x * 8 + 1, 1024), (y, 1), (x, 3)]) is simplify(e)
  assert linear_sum(dtypes.int64, [(x // 2, 4), (y, 1)], 5) is simplify(c(5) + (x // 2) * 4 + y)


def test_memo_is_shared() -> None:
  memo: dict[UOp, UOp] = {}
  a = simplify((x * 4 + y) // 4 + z, memo)
  assert memo[(x * 4 + y) // 4] is x and simplify((x * 4 + y) // 4 + z, memo) is a


# ***** the pattern matcher *****

def test_patterns_bind_names_and_commute() -> None:
  bound: dict[str, UOp] = {}
  assert Pat(Ops.ADD, src=(Pat(Ops.CONST, name="k"), Pat(name="v"))).match(x + 3, bound) and bound == {"k": c(3), "v": x}
  assert not Pat(Ops.IDIV, src=(Pat(Ops.CONST), Pat())).match(x // 3, {})  # not commutative: sources in order only
  assert Pat(Ops.ADD, src=(Pat(name="a"), Pat(name="a"))).match(x + x, {}) and not Pat(Ops.ADD, src=(Pat(name="a"), Pat(name="a"))).match(x + y, {})
  assert Pat((Ops.ADD, Ops.MUL)).match(x * 2, {}) and not Pat(Ops.ADD).match(x * 2, {})
  assert not Pat(Ops.ADD, src=(Pat(),)).match(x + 1, {})


def test_rules_compose_with_plus() -> None:
  var_plus_const = Pat(Ops.ADD, src=(Pat(Ops.VAR, name="a"), Pat(Ops.CONST, name="k")))
  hundred, two_hundred = Rules([(var_plus_const, lambda a, k: c(100))]), Rules([(var_plus_const, lambda a, k: c(200))])
  assert graph_rewrite(x + 1, hundred) is c(100) and graph_rewrite(x + 1, symbolic) is x + 1
  assert graph_rewrite(x + 1, hundred + two_hundred) is c(100) and graph_rewrite(x + 1, two_hundred + hundred) is c(200)  # first wins
  assert graph_rewrite(x + 1, symbolic + hundred) is c(100)  # a rule that returns None lets the next one try
  assert graph_rewrite((x + 1) * 2, hundred + symbolic) is c(200)  # bottom-up, and each result is rewritten again
  assert graph_rewrite(x * 2, hundred) is x * 2


# ***** properties *****

VARS = [UOp.var("a", 0, 7), UOp.var("b", 0, 3), UOp.var("n", -6, 6), UOp.var("w", 1, 30)]


def int_exprs() -> st.SearchStrategy[UOp]:
  leaves = st.one_of(st.sampled_from(VARS), st.integers(-20, 20).map(c))
  def grow(sub: st.SearchStrategy[UOp]) -> st.SearchStrategy[UOp]:
    divisor = st.integers(1, 12)
    return st.one_of(
      st.tuples(sub, sub).map(lambda t: t[0] + t[1]),
      st.tuples(sub, st.integers(-6, 6)).map(lambda t: t[0] * t[1]),
      st.tuples(sub, sub).map(lambda t: t[0] * t[1]),
      st.tuples(sub, divisor).map(lambda t: t[0] // t[1]),
      st.tuples(sub, divisor).map(lambda t: t[0] % t[1]),
      st.tuples(sub, sub).map(lambda t: t[0].alu(Ops.MAX, t[1])),
      st.tuples(sub, sub, sub).map(lambda t: UOp(Ops.WHERE, dtypes.int64, (t[0].lt(t[1]), t[1], t[2]))),
    )
  return st.recursive(leaves, grow, max_leaves=12)


def envs() -> st.SearchStrategy[dict[str, int]]:
  return st.fixed_dictionaries({v.arg[0]: st.integers(v.arg[1], v.arg[2]) for v in VARS})


@settings(max_examples=400, deadline=None)
@given(int_exprs(), st.lists(envs(), min_size=1, max_size=8))
def test_simplify_keeps_values(e: UOp, assignments: list[dict[str, int]]) -> None:
  s = simplify(e)
  lo, hi = s.bounds
  for env in assignments:
    assert evaluate(s, env) == evaluate(e, env), f"{e} simplified to {s}"
    assert lo <= evaluate(e, env) <= hi, f"{e}: {evaluate(e, env)} outside the bounds {s.bounds} of {s}"
  assert simplify(s) is s  # a fixed point


@settings(max_examples=200, deadline=None)
@given(int_exprs(), st.integers(-30, 30), envs())
def test_comparisons_keep_values(e: UOp, bound: int, env: dict[str, int]) -> None:
  cmp = e.lt(bound)
  assert bool(evaluate(simplify(cmp), env)) == (evaluate(e, env) < bound)
  ge = e.ge(bound)
  assert bool(evaluate(simplify(ge), env)) == (evaluate(e, env) >= bound)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(VARS), st.integers(-5, 5)), max_size=6), st.integers(-50, 50))
def test_linear_sum_is_simplify(parts: list[tuple[UOp, int]], k: int) -> None:
  built = sum((v * coef for v, coef in parts), c(k))
  assert linear_sum(dtypes.int64, parts, k) is simplify(built) is graph_rewrite(built, symbolic)


@pytest.mark.parametrize("d", [1, 2, 3, 4, 7])
def test_divmod_exhaustive_small(d: int) -> None:
  """Every value of (4a + b + k) // d and % d over the whole range, for a few offsets k, negative ones included."""
  a, b = VARS[0], VARS[1]
  for k in (-9, -4, 0, 3, 5):
    for op in (Ops.IDIV, Ops.MOD):
      e = (a * 4 + b + k).alu(op, c(d))
      s = simplify(e)
      for va in range(8):
        for vb in range(4):
          assert evaluate(s, {"a": va, "b": vb}) == evaluate(e, {"a": va, "b": vb}), f"{e} -> {s}"


@pytest.mark.parametrize("d", [6, 8, 12, 16, 24])
def test_a_part_below_a_factor_exhaustive(d: int) -> None:
  """Every value of a sum // d, % d and < d where a factor of d may split it (4a + b: b stays below 4), or where the small part
  may go negative (8a + n) or reach the factor (2a + 3b): the random expressions above rarely build such a sum."""
  a, b, n = VARS[:3]
  envs = [{"a": va, "b": vb, "n": vn} for va in range(8) for vb in range(4) for vn in range(-6, 7)]
  for p, q, r in ((4, 1, 0), (8, 2, 1), (8, 0, 1), (6, 0, 1), (2, 3, 0), (12, 3, 1), (4, 0, 1), (3, 1, 0), (-4, 1, 0)):
    for k in (-5, 0, 1, 3):
      e = a * p + b * q + n * r + k
      for u in (e // d, e % d, e.lt(d), e.lt(-d)):
        s = simplify(u)
        assert all(evaluate(s, env) == evaluate(u, env) for env in envs), f"{u} -> {s}"


def test_unbounded_operands() -> None:
  """A product or quotient of an expression with no known bounds has none either (once nan, which folded comparisons to False)."""
  p = UOp.var("p", 0, 9) * UOp(Ops.VIEW, dtypes.int64, (), None)
  assert (p // 2).bounds == (-float("inf"), float("inf")) and (p * 0).bounds == (0, 0)
  assert simplify((p // 2).lt(5)) is not UOp.const(dtypes.bool, False)
  assert x.alu(Ops.MAX, z).bounds == (0, 9)


def test_hash_consing_keeps_live_nodes_only() -> None:
  """A node is found again while it lives; a dead one leaves the table, and one built again with its structure is a new live node."""
  import gc

  from tinytune import uop
  gc.collect()
  gc.disable()  # only these nodes die while the table is counted (the collector would free earlier tests' garbage too)
  try:
    before = len(uop._cache)
    nodes = [UOp.const(dtypes.int32, 7_000_000 + i).alu(Ops.NEG) for i in range(50)]
    assert len(uop._cache) == before + 100 and UOp.const(dtypes.int32, 7_000_000).alu(Ops.NEG) is nodes[0]
    del nodes
    assert len(uop._cache) == before
  finally: gc.enable()
  again = UOp.const(dtypes.int32, 7_000_000).alu(Ops.NEG)
  assert uop._cache[(Ops.NEG, "int32", again.src, None)]() is again
