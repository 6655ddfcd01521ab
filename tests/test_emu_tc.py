"""EMU's warp-level instructions (runtime/emu_tc.py): mma.sync.m16n8k16 and ldmatrix with each lane's registers as the PTX ISA's figures
lay them out, the wmma API, and cp.async; the TC kernels the CUDA renderer writes, run on EMU against NumPy with sm_80's and sm_90's caps;
and the errors where a GPU's result would be undefined (a warp split at a warp-wide call, a misaligned fragment, a race)."""
from __future__ import annotations

import itertools
import random
import re
import zlib

import numpy as np
import pytest
from conftest import emu_arch
from test_emu import LID, T, barrier, load_, program, run_program, store
from test_mma_on_host import CASES
from test_opts import case, check_opts, random_sequence

from tinytune import Device, Kernel, KernelOptError, Opt, OptOps, Tensor, dtypes
from tinytune.codegen.caps import CUDA_ARCHS
from tinytune.codegen.cstyle import CUDARenderer
from tinytune.codegen.lower import LinearProgram, LoadArg, StoreArg, lower, stmt
from tinytune.dtype import DType
from tinytune.engine.schedule import create_schedule
from tinytune.runtime import CompileError
from tinytune.runtime.emu import EmuError, EMUProgram, dump, load
from tinytune.runtime.emu_tc import a_at, b_at, bits_of, c_at, ldmatrix_x4, mma_m16n8k16, value_of
from tinytune.uop import Ops, UOp

LANES = np.arange(32)


# ***** the instructions, against the PTX ISA's figures *****

def test_mma_fragments_are_the_isas() -> None:
  """Spot checks read off the ISA's figures for m16n8k16 (.f16/.bf16): lane 4 g + t, a register's two elements along K (A) or K (B)."""
  assert [a_at(0, 0, i) for i in range(8)] == [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9), (8, 8), (8, 9)]
  assert [a_at(7, 3, i) for i in (0, 3, 7)] == [(7, 6), (15, 7), (15, 15)]  # lane 31
  assert [b_at(2, 1, i) for i in range(4)] == [(2, 2), (3, 2), (10, 2), (11, 2)]  # lane 9: rows 2t, 2t+1, 2t+8, 2t+9 of column g
  assert [c_at(5, 2, i) for i in range(4)] == [(5, 4), (5, 5), (13, 4), (13, 5)]  # lane 22


def test_renderers_register_table_is_the_isas() -> None:
  """CUDARenderer.MMA_PAIRS (each register's pair from (g, 2t) of A or (2t, g) of B) names the elements the ISA puts in the register."""
  for r, (di, dj) in enumerate(CUDARenderer.MMA_PAIRS):
    for g, t in ((1, 2), (7, 3)):
      assert a_at(g, t, 2 * r) == (g + di, 2 * t + dj) and a_at(g, t, 2 * r + 1) == (g + di, 2 * t + dj + 1)
      if r < 2: assert b_at(g, t, 2 * r) == (2 * t + di, g + dj) and b_at(g, t, 2 * r + 1) == (2 * t + di + 1, g + dj)


def pack(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
  return lo.astype(np.float16).view(np.uint16).astype(np.uint32) | hi.astype(np.float16).view(np.uint16).astype(np.uint32) << 16


def test_mma_multiplies_fragments() -> None:
  """Integers small enough that every product and sum is exact: D = A @ B + C, A, B and C spread over the lanes as the ISA says."""
  rng = np.random.default_rng(0)
  A, B, C = (rng.integers(-8, 8, s).astype(np.float32) for s in ((16, 16), (16, 8), (16, 8)))
  g, t = LANES // 4, LANES % 4
  a = np.stack([pack(A[a_at(g, t, 2 * r)], A[a_at(g, t, 2 * r + 1)]) for r in range(4)], axis=-1)[None]
  b = np.stack([pack(B[b_at(g, t, 2 * r)], B[b_at(g, t, 2 * r + 1)]) for r in range(2)], axis=-1)[None]
  c = np.stack([C[c_at(g, t, i)] for i in range(4)], axis=-1)[None]
  d, want = mma_m16n8k16(c, a, b, dtypes.float16)[0], A @ B + C
  assert all((d[:, i] == want[c_at(g, t, i)]).all() for i in range(4))


def test_mma_sums_in_float32() -> None:
  """Products of 16-bit floats are exact in float32 and the sums round to float32: 2^24 + 1 + 1 is 2^24 in float32, not 2^24 + 2."""
  A, B = np.zeros((16, 16), np.float32), np.zeros((16, 8), np.float32)
  A[0, :3], B[:3, 0] = [4096, 1, 1], [4096, 1, 1]
  g, t = LANES // 4, LANES % 4
  a = np.stack([pack(A[a_at(g, t, 2 * r)], A[a_at(g, t, 2 * r + 1)]) for r in range(4)], axis=-1)[None]
  b = np.stack([pack(B[b_at(g, t, 2 * r)], B[b_at(g, t, 2 * r + 1)]) for r in range(2)], axis=-1)[None]
  assert mma_m16n8k16(np.zeros((1, 32, 4), np.float32), a, b, dtypes.float16)[0, 0, 0] == 2 ** 24


def test_ldmatrix_distributes_rows() -> None:
  """Lane 8 q + r gives row r of matrix q; lane 4 r + w receives that row's elements 2w, 2w + 1 in register q (.trans: column r's)."""
  m = np.arange(4 * 8 * 8, dtype=np.uint16).reshape(4, 8, 8)  # element (q, r, c) holds its own index
  def pair(lo: int, hi: int) -> int: return int(lo) | int(hi) << 16
  regs = ldmatrix_x4(m.reshape(1, 32, 8), trans=False)[0]
  assert regs[5, 2] == pair(m[2, 1, 2], m[2, 1, 3])  # lane 5 = 4 * 1 + 1: row 1, elements 2 and 3, of matrix 2
  trans = ldmatrix_x4(m.reshape(1, 32, 8), trans=True)[0]
  assert trans[5, 2] == pair(m[2, 2, 1], m[2, 3, 1])  # .trans: rows 2 and 3 of column 1


def warp_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, dt: DType, causal: bool, tile: int = 64) -> np.ndarray:
  """FlashAttention-2's warp step on these instructions, the register plan of a TC opt on Ops.ATTENTION: warp w owns query rows 16 w
  to 16 w + 15; S = Q K^T a tile of keys at a time, Q's and K's 16x16 blocks by ldmatrix (K's rows are B's columns: not .trans), the
  lanes' float32 C fragments (c_at: rows g and g + 8, columns 2 t, 2 t + 1 of each 8 keys) softmaxed where they are, a row's max over
  its 4 lanes by two xor shuffles (1, 2); P's C fragments packed pairwise to 16 bits are P V's A (n-blocks 2 j and 2 j + 1 are A's
  registers 0, 1 and 2, 3 of K chunk j), V's blocks by ldmatrix.trans; each lane's share of the sums meets its row's once, at the end."""
  q8, e8 = np.divmod(LANES, 8)
  di, dj = np.array(CUDARenderer.MMA_PAIRS).T[:, q8]
  def ldm(bits: np.ndarray, base: np.ndarray, ld: int, b_rows: bool = False, trans: bool = False) -> np.ndarray:
    r, c = (dj + e8, di) if b_rows else (di + e8, dj)  # lane 8 m + e: row e in memory of matrix m (B's rows in memory are its columns)
    return ldmatrix_x4(bits[base[:, None, None] + (r * ld + c)[None, :, None] + np.arange(8)], trans)
  def bits(x: np.ndarray) -> np.ndarray: return np.pad(bits_of(x, dt), ((0, 0), (0, 8))).ravel()  # rows padded by 16 bytes
  def pair(lo: np.ndarray, hi: np.ndarray) -> np.ndarray: return bits_of(lo, dt).astype(np.uint32) | bits_of(hi, dt).astype(np.uint32) << 16
  (n, e), (s, ev), ld, lv = q.shape, v.shape, q.shape[1] + 8, v.shape[1] + 8
  g, t, w, halves = LANES // 4, LANES % 4, n // 16, [0, 0, 1, 1]
  qa = [ldm(bits(q), 16 * ld * np.arange(w) + 16 * c, ld) for c in range(e // 16)]
  o, m, l = np.zeros((w, 32, ev // 8, 4), np.float32), np.full((w, 32, 2), -np.inf, np.float32), np.zeros((w, 32, 2), np.float32)
  rows = 16 * np.arange(w)[:, None, None, None] + g[None, :, None, None] + 8 * np.array(halves)
  for t0 in range(0, s, tile):
    acc = np.zeros((w, 32, tile // 8, 4), np.float32)
    for j, c, h in itertools.product(range(tile // 16), range(e // 16), range(2)):
      b = ldm(bits(k), np.full(w, (t0 + 16 * j) * ld + 16 * c), ld, b_rows=True)
      acc[:, :, 2 * j + h] = mma_m16n8k16(acc[:, :, 2 * j + h], qa[c], b[:, :, 2 * h:2 * h + 2], dt)
    sc = acc * np.float32(e ** -0.5 / np.log(2))  # base 2
    keys = t0 + 8 * np.arange(tile // 8)[:, None] + 2 * t[:, None, None] + np.arange(4) % 2
    if causal: sc = np.where(keys <= rows, sc, -np.inf)
    mx = np.stack([sc[..., :2].max(axis=(2, 3)), sc[..., 2:].max(axis=(2, 3))], axis=-1)
    for x in (1, 2): mx = np.maximum(mx, mx[:, LANES ^ x])
    new = np.maximum(m, mx)
    base = np.where(new == -np.inf, 0, new)
    alpha, p = np.exp2(m - base), np.exp2(sc - base[:, :, None, halves])
    l, m, o = l * alpha + np.stack([p[..., :2].sum(axis=(2, 3)), p[..., 2:].sum(axis=(2, 3))], axis=-1), new, o * alpha[:, :, None, halves]
    for j in range(tile // 16):
      pa = np.stack([pair(p[:, :, 2 * j + h, 2 * r], p[:, :, 2 * j + h, 2 * r + 1]) for h in range(2) for r in range(2)], axis=-1)
      for c, h in itertools.product(range(ev // 16), range(2)):
        b = ldm(bits(v), np.full(w, (t0 + 16 * j) * lv + 16 * c), lv, trans=True)
        o[:, :, 2 * c + h] = mma_m16n8k16(o[:, :, 2 * c + h], pa, b[:, :, 2 * h:2 * h + 2], dt)
  for x in (1, 2): l = l + l[:, LANES ^ x]
  o, out = o / l[:, :, None, halves], np.zeros((n, ev), np.float32)
  for c, i in itertools.product(range(ev // 8), range(4)):
    r, col = c_at(g, t, i)
    out[16 * np.arange(w)[:, None] + r, 8 * c + col] = o[:, :, c, i]
  return out


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_warp_attention_on_the_instructions(dt: DType, causal: bool) -> None:
  """The FlashAttention-2 register plan (warp_attention) from EMU's mma.sync and ldmatrix matches NumPy's attention: 64 queries,
  192 keys in 3 tiles, heads of 64; the error is P's rounding to 16 bits."""
  rng = np.random.default_rng(1)
  q, k, v = (value_of(bits_of(rng.standard_normal(s).astype(np.float32), dt), dt) for s in ((64, 64), (192, 64), (192, 64)))
  scores = q.astype(np.float64) @ k.T / 8
  if causal: scores = np.where(np.arange(192) <= np.arange(64)[:, None], scores, -np.inf)
  p = np.exp(scores - scores.max(axis=1, keepdims=True))
  np.testing.assert_allclose(warp_attention(q, k, v, dt, causal), p / p.sum(axis=1, keepdims=True) @ v, atol=4e-3 if dt == dtypes.bfloat16 else 5e-4)


# ***** the renderer's TC kernels on EMU *****

def tc_kernel(ta: bool, tb: bool, k: int, opts: list[Opt], dt: DType, arg: int) -> tuple[Kernel, object, np.ndarray]:
  """(A.T if ta else A) @ (B.T if tb else B), 64x48 of `dt` with K = k, on EMU with opts (TC's arg `arg`), and NumPy's product."""
  rng = np.random.default_rng(0)
  a_np, b_np = (rng.standard_normal(s).astype(np.float32) for s in ((k, 64) if ta else (64, k), (48, k) if tb else (k, 48)))
  a, b = Tensor(a_np, device="EMU").cast(dt).realize(), Tensor(b_np, device="EMU").cast(dt).realize()
  (item,), _ = create_schedule(((a.T if ta else a) @ (b.T if tb else b)).uop, "EMU")
  kernel = Kernel(item.ast, Device["EMU"].caps).apply_opts([Opt(OptOps.TC, 0, arg), *opts[1:]])
  A, B = a.numpy().astype(np.float32), b.numpy().astype(np.float32)
  return kernel, item.out, (A.T if ta else A) @ (B.T if tb else B)


def run_tc(kernel: Kernel, out: object, uops: list | None = None) -> np.ndarray:
  p = lower(kernel, Device["EMU"].renderer)
  EMUProgram(kernel.name, load(dump(LinearProgram(kernel, p.width, uops if uops is not None else p.uops))), kernel.launch_dims)(out, *kernel.bufs)
  return out.numpy_view().astype(np.float32).reshape(64, 48)  # type: ignore[attr-defined]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("arg", [0, 1])
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("ta, tb, k, opts", CASES)
def test_tc_matmul_matches_numpy(ta: bool, tb: bool, k: int, opts: list[Opt], dt: DType, arg: int, arch: str) -> None:
  """Both TC args with and without STAGE (ldmatrix from the shared tiles, arg 1) and PREFETCH: the sums of exact products in float32,
  rounded once to the output's 16 bits."""
  with emu_arch(arch):
    kernel, out, ref = tc_kernel(ta, tb, k, opts, dt, arg)
    src = Device["EMU"].renderer.render(kernel)
    staged = arg == 1 and any(o.op is OptOps.STAGE for o in opts)
    assert ("tt_ldmatrix_x4" in src.split('extern "C"')[1]) == staged
    got = run_tc(kernel, out)
  ulp = 2.0 ** -7 if dt == dtypes.bfloat16 else 2.0 ** -10
  np.testing.assert_allclose(got, ref, rtol=ulp, atol=ulp * 2 ** -4 * np.abs(ref).max())


@pytest.mark.parametrize("case", [CASES[0], CASES[4]], ids=["lane loads", "ldmatrix"])
def test_a_swapped_register_table_gives_wrong_products(monkeypatch: pytest.MonkeyPatch, case: tuple) -> None:
  """The renderer's MMA_PAIRS with its middle registers swapped (A's rows 8-15 for its K 8-15): the source is self-consistent, and the
  PTX ISA's mma.sync that EMU runs takes the registers where the ISA has them, so the product is wrong."""
  monkeypatch.setattr(CUDARenderer, "MMA_PAIRS", ((0, 0), (0, 8), (8, 0), (8, 8)))
  kernel, out, ref = tc_kernel(*case, dtypes.float16, 1)
  assert np.abs(run_tc(kernel, out) - ref).max() > 1


def address(text: str, env: dict) -> np.ndarray:
  """An address the CUDA source spells (`p[e]`, `*(p+e)`, `p+e`, a swizzled array's `(tile0+tt_swizzle(base+e, line))`), evaluated
  for every lane of `env` as e, the element offset from the fragment's pointer (a swizzle is the load's `line`, which EMU applies)."""
  text = re.sub(r"^\*(\(const unsigned\*\))?", "", text.strip())
  names = {"p": 0, "base": 0, "tt_swizzle": lambda e, line: e, **{f"tile{i}": 0 for i in range(4)}}
  return eval(re.sub(r"^p\[(.*)\]$", r"(p+\1)", text).replace("/", "//"), {**names, **env})


def tc_loads(kernel: Kernel) -> tuple[str, list[tuple]]:
  """The kernel's CUDA source (its kernel, past the prelude) and its TC loads' args (name, buffer, ld, which, layout)."""
  src = Device["EMU"].renderer.render(kernel).split('extern "C"')[1]
  return src, [tuple(u.arg[2:7]) for u in lower(kernel, Device["EMU"].renderer).uops if u.op is Ops.WMMA and u.arg[1] == "load"]


@pytest.mark.parametrize("case", [CASES[4], CASES[5]], ids=["trans", "rows"])
def test_renderers_ldmatrix_rows_follow_its_table(case: tuple) -> None:
  """The row address each lane gives ldmatrix in the CUDA source is the one EMU takes from MMA_PAIRS: lane 8 q + e, row e in memory of
  register q's 8x8 block (the C expression evaluated for every lane)."""
  src, loads = tc_loads(tc_kernel(*case, dtypes.float16, 1)[0])
  q, e = np.divmod(LANES, 8)
  di, dj = np.array(CUDARenderer.MMA_PAIRS).T[:, q]
  env = {"lane": LANES, "tile_row": LANES // 16, "tile_col": LANES % 16}
  for name, _, ld, _, layout in loads:
    row = address(re.search(rf"tt_ldmatrix_x4\w*\({name}, (.*?)\); }}", src).group(1), env)  # type: ignore[union-attr]
    assert (row == ((di + e) * ld + dj if layout == "row_major" else (dj + e) * ld + di)).all(), name


def isa_pairs(which: str, g: np.ndarray, t: np.ndarray) -> list[list[tuple[np.ndarray, np.ndarray]]]:
  """Each register of a 16x16 tile's fragment as the ISA lays it out, its two (row, column) elements: A's 4 registers, or B's 2 for
  columns 0-7 then 2 for columns 8-15 (the tile's two m16n8k16 instructions)."""
  if which == "a": return [[a_at(g, t, 2 * r), a_at(g, t, 2 * r + 1)] for r in range(4)]
  return [[(k, n + 8 * h) for k, n in (b_at(g, t, 2 * r), b_at(g, t, 2 * r + 1))] for h in range(2) for r in range(2)]


def top_level_split(args: str) -> list[str]:
  depth, parts, start = 0, [], 0
  for i, c in enumerate(args):
    depth += (c in "([") - (c in ")]")
    if c == "," and depth == 0: parts, start = [*parts, args[start:i]], i + 1
  return [*parts, args[start:]]


@pytest.mark.parametrize("case", CASES[:4])
def test_renderers_lane_loads_and_stores_are_the_isas(case: tuple) -> None:
  """Each lane's loads of its registers (one 32-bit load, or two elements packed) and its stores of C, as the CUDA source spells them
  (its C expressions evaluated for every lane), put the elements where the PTX ISA's figures have them."""
  src, loads = tc_loads(tc_kernel(*case, dtypes.float16, 1)[0])
  assert loads
  g, t = LANES // 4, LANES % 4
  env = {"mg": g, "mt": t, "lane": LANES, "warp": 0}
  for name, _, ld, which, layout in loads:
    def off(i: np.ndarray, j: np.ndarray) -> np.ndarray: return i * ld + j if layout == "row_major" else j * ld + i
    for r, ((i0, j0), (i1, j1)) in enumerate(isa_pairs(which, g, t)):
      value = re.search(rf"\b{name}\[{r}\] = (.*?);(?: |$)", src, re.M).group(1)  # type: ignore[union-attr]
      if value.startswith("tt_pack("):
        lo, hi = top_level_split(value[len("tt_pack("):-1])
        assert (address(lo, env) == off(i0, j0)).all() and (address(hi, env) == off(i1, j1)).all(), value
      else: assert (address(value, env) == off(i0, j0)).all() and (off(i1, j1) == off(i0, j0) + 1).all(), value  # a 32-bit word
  store = re.search(r"{ tiles\[(.*?)\] = acc0\[4\*h\+e\]; tiles\[(.*?)\] = acc0\[4\*h\+2\+e\]; }", src)
  assert store
  for h in range(2):
    for e in range(2):
      for q, at in enumerate(store.groups()):  # acc[4 h + i] is C's element i of the instruction for columns 8 h to 8 h + 7
        row, col = c_at(g, t, 2 * q + e)
        assert (eval(at, {**env, "h": h, "e": e}) == row * 16 + col + 8 * h).all(), at


@pytest.mark.parametrize("ldmatrix", [True, False])
@pytest.mark.parametrize("case", [CASES[4], CASES[5]], ids=["A transposed", "B transposed"])
def test_swizzled_tiles(case: tuple, ldmatrix: bool) -> None:
  """A staged tile the lowering stores swizzled (element e at e ^ (e / 64 % 8) * 8), its fragments loaded (by ldmatrix, or each lane's
  loads) with the load's `line` 64: NumPy's product; loaded as if not swizzled, the fragments take the wrong elements."""
  kernel, out, ref = tc_kernel(*case, dtypes.float16, 1)
  uops = lower(kernel, Device["EMU"].renderer).uops
  assert any(u.op is Ops.WMMA and u.arg[1] == "load" and u.arg[8:] == (64,) for u in uops)
  def loads(swizzled: bool) -> list[UOp]:
    return [stmt(Ops.WMMA, *u.src, arg=(*u.arg[:7], ldmatrix, *(u.arg[8:] if swizzled else ()))) if u.op is Ops.WMMA and u.arg[1] == "load" else u
            for u in uops]
  tol = dict(rtol=2 ** -10, atol=2 ** -14 * np.abs(ref).max())
  np.testing.assert_allclose(run_tc(kernel, out, loads(True)), ref, **tol)
  assert not np.allclose(run_tc(kernel, out, loads(False)), ref, **tol)


def without(uops: list, drop: object) -> list:
  return [u for u in uops if not (u.op is Ops.WMMA and u.arg[1:2] == (drop,) or u.op is drop)]


@pytest.mark.parametrize("arg", [0, 1])
def test_tile_read_without_syncwarp_races(arg: int) -> None:
  """The accumulator goes through the warp's 256 floats of shared memory: a lane reading them with no __syncwarp() after the warp's
  stores reads what another lane wrote with nothing ordering the two."""
  kernel, out, _ = tc_kernel(*CASES[2], dtypes.float16, arg)
  with pytest.raises(EmuError, match=r"read shared tiles\[.*\] that thread \d+ wrote with no barrier between: a race"):
    run_tc(kernel, out, without(lower(kernel, Device["EMU"].renderer).uops, "sync"))


@pytest.mark.parametrize("arg", [0, 1])
def test_staged_tiles_without_barriers_race(arg: int) -> None:
  kernel, out, _ = tc_kernel(*CASES[4], dtypes.float16, arg)
  with pytest.raises(EmuError, match="shared .* with no barrier between: a race"):
    run_tc(kernel, out, without(lower(kernel, Device["EMU"].renderer).uops, Ops.BARRIER))


def rewrite(uops: list, what: str, fn) -> list:  # type: ignore[no-untyped-def]
  """The program with its first TC statement `what` replaced by fn(statement) (a list of statements)."""
  i = next(i for i, u in enumerate(uops) if u.op is Ops.WMMA and u.arg[1] == what)
  return [*uops[:i], *fn(uops[i]), *uops[i + 1:]]


@pytest.mark.parametrize("arg", [0, 1])
def test_warp_split_at_a_warp_wide_call(arg: int) -> None:
  """mma.sync and the wmma calls are .sync.aligned: all 32 lanes of the warp must run them, not half of it."""
  kernel, out, _ = tc_kernel(*CASES[3], dtypes.float16, arg)
  half = stmt(Ops.IF, UOp.var("lane", 0, 31).lt(16))
  with pytest.raises(EmuError, match=r"(mma.sync|wmma::mma_sync) in code that only some lanes of a warp run: threads \(group 0, thread 16\)"):
    run_tc(kernel, out, rewrite(lower(kernel, Device["EMU"].renderer).uops, "mma", lambda u: [half, u, stmt(Ops.ENDIF)]))


def test_misaligned_fragments() -> None:
  """load_matrix_sync's pointer must be 32-byte aligned and the same in every lane; mma.sync's 32-bit loads of pairs 4-byte aligned;
  ldmatrix's rows 16-byte aligned."""
  def shifted(u: UOp, by: UOp) -> list: return [stmt(Ops.WMMA, u.src[0] + by, arg=u.arg)]
  kernel, out, _ = tc_kernel(*CASES[0], dtypes.float16, 0)
  uops = lower(kernel, Device["EMU"].renderer).uops
  with pytest.raises(EmuError, match=r"gives load_matrix_sync a pointer at an element offset not a multiple of 16 \(8\): misaligned"):
    run_tc(kernel, out, rewrite(uops, "load", lambda u: shifted(u, UOp.const(dtypes.int64, 8))))
  with pytest.raises(EmuError, match="wmma::load_matrix_sync: lanes of a warp give different pointers"):
    run_tc(kernel, out, rewrite(uops, "load", lambda u: shifted(u, UOp.var("lane", 0, 31) // 16 * 16)))
  with pytest.raises(CompileError, match="load_matrix_sync with ldm 12: not a multiple of 8 16-bit elements"):
    run_tc(kernel, out, rewrite(uops, "load", lambda u: [stmt(Ops.WMMA, *u.src, arg=(*u.arg[:4], 12, *u.arg[5:]))]))
  kernel, out, _ = tc_kernel(*CASES[0], dtypes.float16, 1)
  with pytest.raises(EmuError, match=r"loads a 32-bit pair at an element offset not a multiple of 2 \(1\): misaligned"):
    run_tc(kernel, out, rewrite(lower(kernel, Device["EMU"].renderer).uops, "load", lambda u: shifted(u, UOp.const(dtypes.int64, 1))))
  kernel, out, _ = tc_kernel(*CASES[4], dtypes.float16, 1)
  with pytest.raises(EmuError, match="gives ldmatrix a row at an element offset not a multiple of 8"):
    run_tc(kernel, out, rewrite(lower(kernel, Device["EMU"].renderer).uops, "load", lambda u: shifted(u, UOp.const(dtypes.int64, 4))))
  kernel, out, _ = tc_kernel(*CASES[0], dtypes.float16, 1)
  def from_global(u: UOp) -> list: return [stmt(Ops.WMMA, *u.src, arg=(*u.arg[:7], True, *u.arg[8:]))]  # ldmatrix rows from a buffer
  with pytest.raises(CompileError, match="ldmatrix reads shared memory, not data1"):
    run_tc(kernel, out, rewrite(lower(kernel, Device["EMU"].renderer).uops, "load", from_global))


@pytest.mark.parametrize("device", [f"EMU:{arch}" for arch in CUDA_ARCHS])
@pytest.mark.parametrize("name", ["matmul_f16", "matmul_bf16"])
def test_random_sequences_after_tc(name: str, device: str) -> None:
  """The opt fuzzer's sequences that start with TC (arg 0 or 1), which its random picks reach only now and then (TC comes first):
  each against the kernel's result with no opts."""
  kc, rng = case(name, device), random.Random(zlib.crc32(f"{name} {device}".encode()))
  seqs = []
  for arg in (0, 1) * 3:
    k = kc.kernel()
    k.apply_opt(Opt(OptOps.TC, 0, arg))
    seqs.append(random_sequence(k, rng))  # TC, then up to 5 more
  check_opts(kc, seqs)


# ***** cp.async *****

W = 4  # floats a copy: 16 bytes


def copy(dst: UOp, src: UOp, cache: str = "cg", width: int = W) -> UOp:
  val = stmt(Ops.LOAD, src, UOp.const(dtypes.bool, True), arg=LoadArg(None, width, 1), dtype=dtypes.float32)
  return stmt(Ops.STORE, dst, val, UOp.const(dtypes.bool, True), arg=StoreArg(width, "tile", False, cache), dtype=dtypes.float32)


def commit() -> UOp: return stmt(Ops.BARRIER, arg="commit_group")
def wait(n: int) -> UOp: return stmt(Ops.BARRIER, arg=("wait_group", n))


def copies(*body: UOp) -> np.ndarray:
  """Thread i copies x[4 i % 8 : +4] (x = 0..7) to tile[4 i : +4], then `body`; tile holds 4 T floats."""
  return run_program(program(copy(LID * W, LID * W % T), *body, shared=W * T))


def neighbours() -> list[UOp]: return [w := load_("tile", (LID + 1) % T * W, "w"), store(0, LID, w)]  # tile[4 (i + 1)]: x[4 (i + 1) % 8]


def test_cp_async_lands_at_its_wait() -> None:
  assert copies(commit(), wait(0), barrier(), *neighbours()).tolist() == [4 * ((i + 1) % 2) for i in range(T)]


def test_cp_async_read_before_its_wait_races() -> None:
  with pytest.raises(EmuError, match=r"read shared tile\[32\] that a cp.async copies to, before a cp.async.wait_group covers its group"):
    copies(commit(), barrier(), *neighbours())
  with pytest.raises(EmuError, match="that a cp.async copies to, before"):  # a wait covers only committed groups
    copies(wait(0), barrier(), *neighbours())


def test_cp_async_needs_a_barrier_after_the_wait() -> None:
  """Another thread's copy landed at its own wait: nothing orders it before this thread's read but a barrier."""
  with pytest.raises(EmuError, match=r"read shared tile\[32\] that thread 1 wrote with no barrier between: a race"):
    copies(commit(), wait(0), *neighbours())
  own = [w := load_("tile", LID * W + 1, "w"), store(0, LID, w)]  # its own copy, after its own wait: fine
  assert copies(commit(), wait(0), *own).tolist() == [(4 * i + 1) % 8 for i in range(T)]


def test_cp_async_wait_group_leaves_the_newest_groups() -> None:
  """wait_group 1 lands all but the most recent group: the first copy's elements are there, the second's not yet."""
  first, second = copy(LID * W, LID * W % T, "ca", 2), copy(LID * W + 2, LID * W % T, "ca", 2)
  def run(*then: UOp) -> np.ndarray: return run_program(program(first, commit(), second, commit(), wait(1), *then, shared=W * T))
  def read(at: UOp) -> list[UOp]: return [v := load_("tile", at, "w"), store(0, LID, v)]
  assert run(*read(LID * W + 1)).tolist() == [(4 * i + 1) % 8 for i in range(T)]
  with pytest.raises(EmuError, match="that a cp.async copies to, before"): run(*read(LID * W + 2))
  assert run(wait(0), *read(LID * W + 3)).tolist() == [(4 * i + 1) % 8 for i in range(T)]


def test_cp_async_over_data_others_read_races() -> None:
  """A copy into a stage other threads still read, with no barrier since: the next tile overwrites the one in use."""
  with pytest.raises(EmuError, match=r"write shared tile\[32\] that thread \d read with no barrier between: a race"):
    copies(commit(), wait(0), barrier(), *neighbours(), copy(LID * W, LID * W % T))


def test_cp_async_sizes() -> None:
  with pytest.raises(CompileError, match=r"cp.async.cg of 8 bytes \(ca: 4, 8 or 16; cg: 16\)"): copies(copy(LID * W, LID * W % T, "cg", 2))
  with pytest.raises(CompileError, match=r"cp.async.ca of 12 bytes"): copies(copy(LID * W, LID * W % T, "ca", 3))


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16])
def test_default_tc_matmul_runs_on_emu(dt: DType) -> None:
  """The heuristics' TC for a 16-bit matmul on EMU (a warp's 64x64 tile of wmma fragments), run as Tensor code, against NumPy."""
  from tinytune.codegen.heuristic import default_opts
  rng = np.random.default_rng(1)
  a_np, b_np = rng.standard_normal((128, 64)).astype(np.float32), rng.standard_normal((64, 128)).astype(np.float32)
  a, b = Tensor(a_np, device="EMU").cast(dt).realize(), Tensor(b_np, device="EMU").cast(dt).realize()
  items, _ = create_schedule((a @ b).uop, "EMU")
  assert any(o.op is OptOps.TC for o in default_opts(Kernel(items[-1].ast, Device["EMU"].caps)))
  got, ref = (a @ b).numpy().astype(np.float32), a.numpy().astype(np.float32) @ b.numpy().astype(np.float32)
  ulp = 2.0 ** -7 if dt == dtypes.bfloat16 else 2.0 ** -10
  np.testing.assert_allclose(got, ref, rtol=ulp, atol=ulp * 2 ** -4 * np.abs(ref).max())


# ***** what EMU found in TC's kernels (each failed before its fix) *****

def batched(dt: DType, shape: tuple[int, int, int, int], sliced: int = 0, permuted: bool = False) -> tuple[Tensor, np.ndarray]:
  """A batched 16-bit matmul on EMU: (batch, M, K) @ (batch, K, N), B's columns from `sliced` on; `permuted`: the output (M, batch, 1, N),
  its batch dim after M's. Returns the product's tensor and NumPy's."""
  b_, m, n, k = shape
  rng = np.random.default_rng(2)
  A, B = rng.standard_normal((b_, m, k)).astype(dt.np), rng.standard_normal((b_, k, n + sliced)).astype(dt.np)
  a, b = Tensor(A, device="EMU"), Tensor(B, device="EMU")[:, :, sliced:]  # (numpy() would copy the slice to a buffer of its own)
  A, B = A.astype(np.float32), B[:, :, sliced:].astype(np.float32)
  if permuted: return a.permute(1, 0, 2).contiguous().realize().reshape(m, b_, 1, k) @ b, np.einsum("bmk,bkn->mbn", A, B)[:, :, None]
  return a @ b, A @ B


def run_opts(out: Tensor, opts: list[Opt]) -> np.ndarray:
  (item,), _ = create_schedule(out.uop, "EMU")
  kernel = Kernel(item.ast, Device["EMU"].caps).apply_opts(opts)
  dev = Device["EMU"]
  dev.program(kernel.name, dev.compile(dev.renderer.render(kernel)), kernel.launch_dims)(item.out, *kernel.bufs)
  return item.out.numpy_view().astype(np.float32)


def close(got: np.ndarray, ref: np.ndarray) -> None:
  np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=2 ** -7, atol=2 ** -11 * np.abs(ref).max())


def test_wmma_takes_only_32_byte_aligned_tiles() -> None:
  """load_matrix_sync's pointer is 32-byte aligned (the CUDA guide): TC's arg 0 on rows 16 bytes off is refused (it took them, and a GPU
  was given misaligned fragments); arg 1's lanes and ldmatrix need 16 bytes, and take them."""
  out, ref = batched(dtypes.float16, (2, 32, 32, 32), sliced=8)
  (item,), _ = create_schedule(out.uop, "EMU")
  with pytest.raises(KernelOptError, match="TC's arg 0 \\(wmma\\) needs each 16x16 tile 32-byte aligned"):
    Kernel(item.ast, Device["EMU"].caps).apply_opt(Opt(OptOps.TC, 0, 0))
  close(run_opts(out, [Opt(OptOps.TC, 0, 1), Opt(OptOps.STAGE, 0, 2), Opt(OptOps.LOCAL, 0, 2)]), ref)


@pytest.mark.parametrize("arg", [0, 1])
def test_staged_batch_tiles_keep_fragments_aligned(arg: int) -> None:
  """A workgroup over two batches stages each batch's tile of A after the other's, its rows padded: by 16 bytes, the second batch's
  wmma fragments were 16 bytes off 32-byte alignment; padded by 32 for arg 0, every fragment is aligned."""
  out, ref = batched(dtypes.bfloat16, (2, 32, 16, 32))
  opts = [Opt(OptOps.TC, 0, arg), Opt(OptOps.STAGE, 0, 2), Opt(OptOps.SWAP, 0, 1), Opt(OptOps.UPCAST, 1, 2), Opt(OptOps.LOCAL, 0, 2)]
  close(run_opts(out, opts), ref)


@pytest.mark.parametrize("arg", [0, 1])
def test_staged_tile_keeps_the_fragments_dim_innermost(arg: int) -> None:
  """An output (M, batch, 1, N) puts A's batch dim after M's: its staged tile had the batch dim innermost, so a fragment's rows were not
  contiguous (arg 0 read misaligned, arg 1 read elements no thread wrote); the fragment's dim is the tile's innermost now."""
  out, ref = batched(dtypes.float16, (2, 32, 32, 32), permuted=True)
  close(run_opts(out, [Opt(OptOps.TC, 0, arg), Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.STAGE, 0, 2)]), ref)
