"""EMU's warp-level instructions: the tensor cores and the asynchronous copies of the CUDA renderer's programs (see emu.py).

The instructions' own semantics come from the PTX ISA, written out here from its figures, not from the renderer: mma.sync.m16n8k16
(each lane's registers of A, B and C as "Matrix Fragments for mma.m16n8k16" lays them out, products of 16-bit floats exact in float32
and summed in float32 in K's order), ldmatrix.m8n8.x4 (lane 8 q + r gives the address of row r of matrix q; lane 4 r + w receives
elements 2 w and 2 w + 1 of row r, or of column r with .trans) and the wmma API, whose fragments CUDA keeps opaque: EMU holds a warp's
fragment as its whole 16x16 tile and checks that the warp's 32 lanes run each call together, with the pointer alignment and leading
dimension the API requires. Which elements a lane loads into which register, and where it stores C, is the renderer's choice
(CUDARenderer.MMA_PAIRS and its mma statements), which EMU follows: a renderer whose table disagrees with the ISA gives wrong products.
cp.async (StoreArg.cp_async, BARRIER "commit_group" and ("wait_group", n)) lands in shared memory only at the wait that covers its group.
wgmma.mma_async (sm_90a) reads A and B from shared memory through matrix descriptors, decoded by the ISA's "Matrix Descriptor Format"
(the unswizzled, K-major core-matrix layout), and keeps D in the warpgroup's registers as the ISA's figure for .m64nNk16 lays them out."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from tinytune.codegen.cstyle import CUDARenderer
from tinytune.dtype import DType, dtypes

if TYPE_CHECKING:
  from tinytune.runtime.emu import EMUProgram, Node, _Run, _Shared

Fn = Callable[["_Run"], Any]
WARP = 32

# ***** the PTX ISA's layouts: element i of lane 4 g + t's fragment (two 16-bit elements a 32-bit register, element 2 r in its low half) *****
def a_at(g: Any, t: Any, i: int) -> tuple[Any, Any]: return g + 8 * (i // 2 % 2), 2 * t + i % 2 + 8 * (i // 4)  # A, 16x16: (row, k)
def b_at(g: Any, t: Any, i: int) -> tuple[Any, Any]: return 2 * t + i % 2 + 8 * (i // 2), g  # B, 16x8: (k, column)
def c_at(g: Any, t: Any, i: int) -> tuple[Any, Any]: return g + 8 * (i // 2), 2 * t + i % 2  # C and D, 16x8 floats: (row, column)


LANE = np.arange(WARP)
G, T = LANE // 4, LANE % 4


def halves(regs: np.ndarray) -> np.ndarray:
  """32-bit registers (..., r) as their 16-bit elements (..., 2 r), the low half first."""
  return np.stack([regs & 0xFFFF, regs >> 16], axis=-1).reshape(*regs.shape[:-1], -1).astype(np.uint16)


def value_of(bits: np.ndarray, dt: DType) -> np.ndarray:
  """16-bit elements of `dt` as float32."""
  if dt == dtypes.bfloat16: return (bits.astype(np.uint32) << 16).view(np.float32)
  return bits.view(np.float16).astype(np.float32)


def bits_of(values: np.ndarray, dt: DType) -> np.ndarray:
  """float32 values exactly representable in `dt` (16-bit), as its bits."""
  from tinytune.runtime.emu import bf16_bits
  return bf16_bits(values) if dt == dtypes.bfloat16 else np.asarray(values, np.float32).astype(np.float16).view(np.uint16)


def mma_m16n8k16(c: np.ndarray, a: np.ndarray, b: np.ndarray, dt: DType) -> np.ndarray:
  """mma.sync.aligned.m16n8k16.row.col.f32.{dt}.{dt}.f32 d, a, b, c for warps side by side: c (warps, 32, 4) floats, a (warps, 32, 4) and
  b (warps, 32, 2) uint32 registers; returns d (warps, 32, 4)."""
  ea, eb = value_of(halves(a), dt), value_of(halves(b), dt)
  A, B, C = np.zeros((len(a), 16, 16), np.float32), np.zeros((len(a), 16, 8), np.float32), np.zeros((len(a), 16, 8), np.float32)
  for i in range(8): A[(slice(None), *a_at(G, T, i))] = ea[:, :, i]
  for i in range(4): B[(slice(None), *b_at(G, T, i))], C[(slice(None), *c_at(G, T, i))] = eb[:, :, i], c[:, :, i]
  for k in range(16): C += A[:, :, k, None] * B[:, None, k, :]  # each product exact in float32 (11- or 8-bit significands), summed in float32
  return np.stack([C[(slice(None), *c_at(G, T, i))] for i in range(4)], axis=-1)


def ldmatrix_x4(rows: np.ndarray, trans: bool) -> np.ndarray:
  """ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 for warps side by side: rows (warps, 32, 8), the 8 elements (bits) at the address
  lane 8 q + r gives (row r of matrix q); returns each lane's 4 registers (warps, 32, 4)."""
  m = rows.reshape(len(rows), 4, 8, 8).astype(np.uint32)  # (warp, matrix q, row r, element)
  if trans: m = m.transpose(0, 1, 3, 2)
  r, w = LANE // 4, LANE % 4
  return (m[:, :, r, 2 * w] | m[:, :, r, 2 * w + 1] << 16).transpose(0, 2, 1)


# ***** wgmma (sm_90a): a warpgroup's 128 threads multiply A and B that shared memory holds, each named by a 64-bit matrix descriptor *****
WARPGROUP = 128
SWIZZLES = ("none", "128B", "64B", "32B")  # the descriptor's bits 62-63


def wgmma_descriptor(desc: int) -> dict[str, Any]:
  """A matrix descriptor's fields as the PTX ISA's "Matrix Descriptor Format" packs them: the start address, the leading and the stride
  dimension byte offsets, each a byte count shifted right by 4 in bits 0-13, 16-29 and 32-45; the matrix base offset in bits 49-51; the
  swizzle mode in bits 62-63."""
  return {"start": (desc & 0x3FFF) << 4, "lbo": (desc >> 16 & 0x3FFF) << 4, "sbo": (desc >> 32 & 0x3FFF) << 4, "base": desc >> 49 & 7,
          "swizzle": SWIZZLES[desc >> 62 & 3]}


def wgmma_addresses(desc: int, rows: int) -> np.ndarray:
  """The byte addresses (rows, 16) of the rows x 16 matrix (A's M x K or B's N x K, K-major) of 16-bit elements that an unswizzled
  descriptor names: core matrices of 8 rows of 16 bytes (8 elements along K), each row's bytes contiguous and the 8 rows one after
  another (128 bytes); the core matrix i along M or N and j along K at start + i * stride offset + j * leading offset."""
  f = wgmma_descriptor(desc)
  if f["swizzle"] != "none" or f["base"]: raise ValueError(f"wgmma descriptor {desc:#x}: EMU takes the unswizzled layout (swizzle {f['swizzle']})")
  r, k = np.divmod(np.arange(rows * 16), 16)
  return (f["start"] + r // 8 * f["sbo"] + k // 8 * f["lbo"] + r % 8 * 16 + k % 8 * 2).reshape(rows, 16)


def wgmma_operand(smem: np.ndarray, desc: int, rows: int) -> np.ndarray:
  """The matrix's elements (bits, little-endian) at wgmma_addresses in `smem`, a workgroup's shared memory as bytes."""
  at = wgmma_addresses(desc, rows)
  if at.max() + 2 > len(smem): raise ValueError(f"wgmma descriptor {desc:#x} reads past shared memory's {len(smem)} bytes")
  return smem[at].astype(np.uint16) | smem[at + 1].astype(np.uint16) << 8


def d_at(lane: Any, i: Any) -> tuple[Any, Any]:
  """wgmma's f32 accumulator D (m64nN) in the warpgroup's lanes: register i of lane 32 w + 4 g + t at (16 w + g + 8 (i / 2 % 2),
  8 (i / 4) + 2 t + i % 2), the ISA's figure for .m64nNk16: warp w holds rows 16 w to 16 w + 15, each 8 columns as mma.sync's C."""
  w, g, t = lane // 32, lane % 32 // 4, lane % 4
  return 16 * w + g + 8 * (i // 2 % 2), 8 * (i // 4) + 2 * t + i % 2


def wgmma_m64nNk16(d: np.ndarray, smem: np.ndarray, desc_a: int, desc_b: int, dt: DType, scale_d: bool = True) -> np.ndarray:
  """wgmma.mma_async.sync.aligned.m64nNk16.f32.{dt}.{dt} d, desc_a, desc_b, scale_d, 1, 1, 0, 0 (A and B K-major, not negated) for one
  warpgroup: d (128, N / 2) floats, smem its workgroup's shared memory as bytes; returns the new d = A @ B (+ d where scale_d)."""
  n = d.shape[1] * 2
  if d.shape[0] != WARPGROUP or n % 8 or not 8 <= n <= 256: raise ValueError(f"wgmma m64n{n}k16: N is a multiple of 8 from 8 to 256")
  return wgmma_product(d[None], value_of(wgmma_operand(smem, desc_a, 64), dt)[None], value_of(wgmma_operand(smem, desc_b, n), dt)[None], scale_d)[0]


def wgmma_product(d: np.ndarray, A: np.ndarray, B: np.ndarray, scale_d: bool = True) -> np.ndarray:
  """D = A @ B (+ d where scale_d) for warpgroups side by side: d (groups, 128, N / 2) floats by d_at, A (groups, 64, 16), B (groups, N, 16)."""
  n = B.shape[1]
  lane, i = np.arange(WARPGROUP)[:, None], np.arange(n // 2)[None, :]
  D = np.zeros((len(d), 64, n), np.float32)
  if scale_d: D[(slice(None), *d_at(lane, i))] = d
  for k in range(16): D += A[:, :, k, None] * B[:, None, :, k]  # each product exact in float32, summed in float32 in K's order
  return D[(slice(None), *d_at(lane, i))]


# ***** the renderer's statements (Ops.WMMA, arg (kind, what, ...): see CUDARenderer.wmma) *****

def warps(s: _Run, what: str) -> np.ndarray:
  """The warps (a mask over s.n // 32) that run a warp-wide call: every lane of such a warp must run it (.sync.aligned)."""
  active = s.active.reshape(-1, WARP)
  if (split := active.any(axis=1) & ~active.all(axis=1)).any():
    s.fail(f"{what} in code that only some lanes of a warp run: {s.who(np.repeat(split, WARP) & ~s.active)} of the warp do not")
  return np.asarray(active[:, 0])


def warpgroups(s: _Run, what: str) -> np.ndarray:
  """The warpgroups (a mask over s.n // 128) that run a warpgroup-wide call: every thread of such a warpgroup must run it."""
  if s.n % WARPGROUP: s.fail(f"{what} with workgroups of {s.n} threads: not whole warpgroups of {WARPGROUP}")
  active = s.active.reshape(-1, WARPGROUP)
  if (split := active.any(axis=1) & ~active.all(axis=1)).any():
    s.fail(f"{what} in code that only some threads of a warpgroup run: {s.who(np.repeat(split, WARPGROUP) & ~s.active)} of it do not")
  return np.asarray(active[:, 0])


def leaders(s: _Run, on: np.ndarray, size: int = WARP) -> np.ndarray:
  """The first thread of each warp (or `size`-wide warpgroup) of `on`, as a mask over the lanes: the one that acts for all of them."""
  first = np.zeros(s.n, bool)
  first[np.flatnonzero(on) * size] = True
  return first


def uniform(s: _Run, x: Any, on: np.ndarray, what: str, size: int = WARP) -> np.ndarray:
  """A warp-wide (or `size`-wide) call's operand, which must be the same in each lane of the warp: one value per warp of `on`."""
  x = s.lanes(np.asarray(x, np.int64)).reshape(-1, size)[on]
  if (bad := (x != x[:, :1]).any(axis=1)).any():
    s.fail(f"{what}: lanes of a warp{'group' if size > WARP else ''} give different pointers ({x[bad][0][:4].tolist()}, ...)")
  return np.asarray(x[:, 0])


class TensorCores:
  """The statements of TC (arg 0: the wmma API, arg 1: mma.sync, arg 2: wgmma), each compiled to a closure over an EMU run, for one program."""

  def __init__(self, prog: EMUProgram): self.prog = prog

  def statement(self, u: Node) -> Fn:
    kind, what, *arg = u.arg
    if what == "ids": return self.ids
    if what == "sync": return self.syncwarp
    if (fn := getattr(self, f"{kind}_{what}", None)) is None: self.prog.fail_compile(f"no tensor core statement {kind} {what}")
    return fn(u, *arg)

  def ids(self, s: _Run) -> None:
    lane = s.t % WARP
    s.env.update(lid=s.t, warp=s.t // WARP, lane=lane, tile_row=lane // 16, tile_col=lane % 16, mg=lane // 4, mt=lane % 4)

  def syncwarp(self, s: _Run) -> None:
    """__syncwarp(): what the lanes of each warp that runs it did in shared memory is ordered before what they do next."""
    on = warps(s, "__syncwarp()").reshape(s.groups, -1)
    for sh in s.shared.values(): sh.warp_barrier(on)

  # ***** memory a warp reads: 16-bit elements of a global buffer or a shared array, as bits *****
  def read(self, s: _Run, buf: int | str, at: np.ndarray, rows: np.ndarray, what: str, by: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """The bits of elements `at` ((rows.sum(), k) offsets) of `buf`, each row read by the thread of `rows` (a mask over s.n), or by the
    threads `by` (first, last: a warp's lanes reading together)."""
    if isinstance(buf, str):
      sh = self.prog.shared_array(s, buf)
      return bits_of(self.prog.shared_elements(s, sh, rows, at, by=by)[rows], sh.dtype)
    mem = s.bufs[buf]
    if (bad := ((at < 0) | (at >= mem.size)).any(axis=1)).any():
      s.fail(f"{s.who(self.prog.rows(s, rows, bad))} {what} data{buf} out of its bounds [0, {mem.size})")
    if id(mem) in s.stored: self.prog.check_loads(s, buf, at, rows)
    return mem.view(np.uint16)[at]

  def aligned(self, s: _Run, at: np.ndarray, rows: np.ndarray, elements: int, what: str) -> None:
    if (bad := np.asarray(at % elements != 0).reshape(len(at), -1).any(axis=1)).any():
      first = at[bad].ravel()[np.flatnonzero(at[bad].ravel() % elements)[0]]
      s.fail(f"{s.who(self.prog.rows(s, rows, bad))} {what} at an element offset not a multiple of {elements} ({first}): misaligned")

  # ***** arg 1: PTX mma.sync, each lane's registers *****
  def mma_acc(self, u: Node, j: int) -> Fn:
    def acc(s: _Run) -> None: s.env[f"acc{j}"] = np.zeros((s.n, 8), np.float32)
    return acc

  def mma_fragment(self, u: Node, name: str, *_: Any) -> Fn:
    def fragment(s: _Run) -> None: s.env[name] = None  # unsigned name[4]: loaded next
    return fragment

  def mma_load(self, u: Node, name: str, buf: int | str, ld: int, which: str, layout: str, rows: bool, line: int = 0) -> Fn:
    """The lanes' registers of a 16x16 tile of A or B at p = buf + offset with leading dimension ld: by ldmatrix (.trans where the
    pair of a register is not contiguous in memory), or each lane's loads of the pairs MMA_PAIRS gives each register. A swizzled
    array (`line` elements a line) holds element e at e ^ (e / line % 8) * 8: each 16-byte chunk moved, whole, within its 128 bytes."""
    base = self.prog.expr(u.src[0])
    def swizzled(e: np.ndarray) -> np.ndarray: return e ^ e // line % 8 * 8 if line else e
    along_k = (which == "a") == (layout == "row_major")
    def off(i: Any, j: Any) -> Any: return i * ld + j if layout == "row_major" else j * ld + i
    # ldmatrix's rows as the renderer lays them out: lane 8 q + e gives the address of row e in memory of the 8x8 block at MMA_PAIRS[q]
    # (the tile's rows where they are contiguous, else its columns), which is matrix q, register q
    q, e = np.divmod(np.arange(WARP), 8)
    di, dj = np.array(CUDARenderer.MMA_PAIRS).T[:, q]
    rows_at = off(di + e, dj) if layout == "row_major" else off(di, dj + e)
    def ldmatrix(s: _Run) -> None:
      on = warps(s, "ldmatrix")
      start = swizzled(s.lanes(np.asarray(base(s), np.int64) + rows_at[s.t % WARP]))
      mask = np.repeat(on, WARP)
      self.aligned(s, start[mask], mask, 8, "gives ldmatrix a row")  # 16 bytes: the shared array is 32-byte aligned
      bits = self.read(s, buf, start[mask][:, None] + np.arange(8), mask, "ldmatrix reads")
      regs = ldmatrix_x4(bits.reshape(-1, WARP, 8), trans=not along_k)
      out = np.zeros((s.n, 4), np.uint32)
      out[mask] = regs.reshape(-1, 4)
      s.env[name] = out
    def lane_loads(s: _Run) -> None:
      mask = s.active
      mg, mt, p = s.env["mg"][mask], s.env["mt"][mask], s.lanes(np.asarray(base(s), np.int64))[mask]
      at = []
      for di, dj in CUDARenderer.MMA_PAIRS:
        i, j = (mg + di, 2 * mt + dj) if which == "a" else (2 * mt + di, mg + dj)
        first = swizzled(p + off(i, j))
        at += [first, first + 1 if along_k else swizzled(p + (off(i, j + 1) if which == "a" else off(i + 1, j)))]  # a 32-bit word, or two
      at2 = np.stack(at, axis=1)
      if along_k: self.aligned(s, at2[:, 0::2], mask, 2, "loads a 32-bit pair")
      bits = self.read(s, buf, at2, mask, "loads from").astype(np.uint32)
      out = np.zeros((s.n, 4), np.uint32)
      out[mask] = bits[:, 0::2] | bits[:, 1::2] << 16
      s.env[name] = out
    if rows and not isinstance(buf, str): self.prog.fail_compile(f"ldmatrix reads shared memory, not data{buf}")
    return ldmatrix if rows else lane_loads

  def mma_mma(self, u: Node, j: int, a: str, b: str, dt: DType) -> Fn:
    """tt_mma(acc, a, b); tt_mma(acc + 4, a, b + 2): the 16x16 tile's two halves of 8 columns."""
    def mma(s: _Run) -> None:
      on = np.repeat(warps(s, "mma.sync"), WARP)
      if s.env.get(a) is None or s.env.get(b) is None: s.fail(f"mma.sync reads fragment {a if s.env.get(a) is None else b} before it is loaded")
      acc, ra, rb = s.env[f"acc{j}"].copy(), s.env[a][on].reshape(-1, WARP, 4), s.env[b][on].reshape(-1, WARP, 4)
      for h in range(2):
        half = slice(4 * h, 4 * h + 4)
        acc[on, half] = mma_m16n8k16(acc[on, half].reshape(-1, WARP, 4), ra, rb[:, :, 2 * h:2 * h + 2], dt).reshape(-1, 4)
      s.env[f"acc{j}"] = acc
    return mma

  def mma_store(self, u: Node, j: int) -> Fn:
    """Each lane stores its 8 floats of C to the warp's 256 in `tiles`: acc[4 h + 2 q + e] at (mg + 8 q, 8 h + 2 mt + e)."""
    def store(s: _Run) -> None:
      mask = s.active
      mg, mt, w = s.env["mg"][mask], s.env["mt"][mask], s.env["warp"][mask]
      at = np.stack([w * 256 + (mg + 8 * q) * 16 + 8 * h + 2 * mt + e for h in range(2) for q in range(2) for e in range(2)], axis=1)
      self.prog.shared_elements(s, self.prog.shared_array(s, "tiles"), mask, at, s.env[f"acc{j}"][mask])
    return store

  # ***** TC attention's statements (CUDARenderer.flash_tc): the online softmax on the lanes' accumulators *****
  def mma_state(self, u: Node) -> Fn:
    def state(s: _Run) -> None: s.env.update(fm=np.full((s.n, 2), -np.inf, np.float32), fl=np.zeros((s.n, 2), np.float32))
    return state

  def mma_softmax(self, u: Node, s_accs: tuple[int, ...], o_accs: tuple[int, ...], scale: float, causal: bool) -> Fn:
    """S's accumulators (element 4 h + r of tile n at row mg + 8 (r / 2), key 16 n + 8 h + 2 mt + r % 2 of the tile) scaled, masked
    (causal), then 2^(s - m) with m the running max of the row, taken across its 4 lanes (xor shuffles 1 and 2); the output
    accumulators and the lane's share of the row's sum rescaled by 2^(m_old - m)."""
    row0, key0 = (self.prog.expr(x) for x in u.src)
    i = np.arange(8)
    half, col = i % 4 // 2, 8 * (i // 4) + i % 2
    def softmax(s: _Run) -> None:
      on = np.repeat(warps(s, "the softmax's shuffles"), WARP)
      mg, mt = s.env["mg"], s.env["mt"]
      rows, keys = s.lanes(np.asarray(row0(s), np.int64)), s.lanes(np.asarray(key0(s), np.int64))
      sc = np.stack([s.env[f"acc{j}"] * np.float32(scale) for j in s_accs], axis=1)  # (n, tiles, 8)
      if causal:
        key = keys[:, None, None] + 16 * np.arange(len(s_accs))[None, :, None] + col[None, None] + 2 * mt[:, None, None]
        sc = np.where(key > (rows + mg)[:, None, None] + 8 * half, np.float32(-np.inf), sc)
      mx = np.stack([sc[:, :, half == h].max(axis=(1, 2)) for h in range(2)], axis=1)
      for d in (1, 2): mx = np.maximum(mx, mx.reshape(-1, WARP, 2)[:, LANE ^ d].reshape(-1, 2))
      fm, fl = s.env["fm"], s.env["fl"]
      new = np.maximum(fm, mx)
      base = np.where(new == -np.inf, np.float32(0), new)
      alpha = np.exp2(fm - base)
      p = np.exp2(sc - base[:, None, half])
      s.env["fm"], s.env["fl"] = np.where(on[:, None], new, fm), np.where(on[:, None], fl * alpha + np.stack([p[:, :, half == h].sum(axis=(1, 2))
                                                                                                           for h in range(2)], axis=1), fl)
      for n, j in enumerate(s_accs): s.env[f"acc{j}"] = np.where(on[:, None], p[:, n], s.env[f"acc{j}"]).astype(np.float32)
      for o in o_accs: s.env[f"acc{o}"] = np.where(on[:, None], s.env[f"acc{o}"] * alpha[:, half], s.env[f"acc{o}"]).astype(np.float32)
    return softmax

  def mma_pack(self, u: Node, name: str, j: int, dt: DType) -> Fn:
    """S's 16x16 accumulator tile as A's registers: its floats pairwise, each rounded to `dt` (C's pairs are A's)."""
    def pack(s: _Run) -> None:
      acc = s.env[f"acc{j}"]
      s.env[name] = bits_of(acc[:, 0::2], dt).astype(np.uint32) | bits_of(acc[:, 1::2], dt).astype(np.uint32) << 16
    return pack

  def mma_finish(self, u: Node, o_accs: tuple[int, ...]) -> Fn:
    """Each row's sum across its 4 lanes (xor shuffles 1 and 2), and the output accumulators divided by it."""
    i = np.arange(8)
    def finish(s: _Run) -> None:
      on = np.repeat(warps(s, "the sums' shuffles"), WARP)
      fl = s.env["fl"]
      for d in (1, 2): fl = fl + fl.reshape(-1, WARP, 2)[:, LANE ^ d].reshape(-1, 2)
      s.env["fl"] = fl
      for o in o_accs: s.env[f"acc{o}"] = np.where(on[:, None], s.env[f"acc{o}"] / fl[:, i % 4 // 2], s.env[f"acc{o}"]).astype(np.float32)
    return finish

  # ***** arg 2: wgmma, a warpgroup's, from the staged tiles in shared memory *****
  def wgmma_accs(self, u: Node, js: tuple[int, ...]) -> Fn:
    def accs(s: _Run) -> None: s.env.update({f"acc{j}": np.zeros((s.n, 8), np.float32) for j in js})
    return accs

  def wgmma_store(self, u: Node, j: int) -> Fn: return self.mma_store(u, j)

  def wgmma_proxy(self, u: Node) -> Fn:
    """fence.proxy.async.shared::cta: the thread's stores to shared memory so far are seen by wgmma (the async proxy) after a barrier."""
    def proxy(s: _Run) -> None: s.unfenced[s.active] = False
    return proxy

  def wgmma_fence(self, u: Node) -> Fn:
    def fence(s: _Run) -> None: warpgroups(s, "wgmma.fence")
    return fence

  def wgmma_wait(self, u: Node) -> Fn:
    """commit_group, then wait_group 0: EMU's wgmma completes as it is issued, so the wait only checks the warpgroup is whole."""
    def wait(s: _Run) -> None: warpgroups(s, "wgmma.wait_group")
    return wait

  def wgmma_mma(self, u: Node, js: tuple[int, ...], ta: str, sa: int, tb: str, sb: int, dt: DType) -> Fn:
    """tt_wgmma_m64n{16 len(js)}k16(accw, desc(ta + a, 128, sa), desc(tb + b, 128, sb)), D the tiles' accumulators js side by side (8
    floats each), each operand's descriptor packed from its byte address
    (the array's first byte at shared address 0) and offsets, decoded by the ISA's table into the elements it names; the warpgroup's
    128 lanes read them together."""
    base_a, base_b = self.prog.expr(u.src[0]), self.prog.expr(u.src[1])
    def operand(s: _Run, name: str, base: Fn, sbo: int, rows: int, on: np.ndarray, first: np.ndarray) -> np.ndarray:
      sh = self.prog.shared_array(s, name)
      start = uniform(s, base(s), on, "wgmma's descriptor", WARPGROUP) * sh.dtype.itemsize
      if (bad := start % 16 != 0).any(): s.fail(f"wgmma's descriptor of {name} starts at byte {start[bad][0]}: not 16-byte aligned")
      at = np.stack([wgmma_addresses(int(b) >> 4 | (128 >> 4) << 16 | (sbo >> 4) << 32, rows) for b in start]).reshape(len(start), -1) // 2
      bits = self.read(s, name, at, first, "wgmma reads", by=(s.t[first], s.t[first] + WARPGROUP - 1))
      return value_of(bits, dt).reshape(len(start), rows, 16)
    def mma(s: _Run) -> None:
      on = warpgroups(s, "wgmma.mma_async")
      if (bad := np.asarray(s.unfenced.reshape(s.groups, -1).any(axis=1))[s.local_g] & s.active).any():  # the workgroup's stores reach wgmma fenced
        s.fail(f"wgmma.mma_async reads shared memory that {s.who(s.unfenced & np.isin(s.local_g, s.local_g[bad]))} stored to with no "
               "fence.proxy.async after: the async proxy may not see it")
      first = leaders(s, on, WARPGROUP)
      A, B = operand(s, ta, base_a, sa, 64, on, first), operand(s, tb, base_b, sb, 16 * len(js), on, first)
      acc, lanes = np.concatenate([s.env[f"acc{j}"] for j in js], axis=1), np.repeat(on, WARPGROUP)
      acc[lanes] = wgmma_product(acc[lanes].reshape(-1, WARPGROUP, 8 * len(js)), A, B).reshape(-1, 8 * len(js))
      for i, j in enumerate(js): s.env[f"acc{j}"] = acc[:, 8 * i:8 * i + 8]
    return mma

  # ***** arg 0: the wmma API, a warp's fragment kept as its whole tile *****
  def wmma_acc(self, u: Node, j: int) -> Fn:
    def acc(s: _Run) -> None: s.env[f"acc{j}"] = np.zeros((s.n // WARP, 16, 16), np.float32)
    return acc

  def wmma_fragment(self, u: Node, name: str, which: str, dt: DType, layout: str) -> Fn:
    def fragment(s: _Run) -> None: s.env[name] = None
    return fragment

  def wmma_load(self, u: Node, name: str, buf: int | str, ld: int, which: str, layout: str) -> Fn:
    """load_matrix_sync(fragment, p, ld): the 16x16 tile at p, element (i, j) at p[i ld + j] (row_major) or p[j ld + i]; p 32-byte
    aligned, ld a multiple of 8 16-bit elements (16 bytes), the same in every lane of the warp."""
    base = self.prog.expr(u.src[0])
    i, j = np.divmod(np.arange(256), 16)
    tile = i * ld + j if layout == "row_major" else j * ld + i
    if ld % 8: self.prog.fail_compile(f"load_matrix_sync with ldm {ld}: not a multiple of 8 16-bit elements")
    def load(s: _Run) -> None:
      on = warps(s, "wmma::load_matrix_sync")
      p = uniform(s, base(s), on, "wmma::load_matrix_sync")
      first = leaders(s, on)
      self.aligned(s, p, first, 16, "gives load_matrix_sync a pointer")
      bits = self.read(s, buf, p[:, None] + tile, first, "load_matrix_sync reads", by=(s.t[first], s.t[first] + WARP - 1))
      out = np.zeros((s.n // WARP, 16, 16), np.uint16)
      out[on] = bits.reshape(-1, 16, 16)
      s.env[name] = out
    return load

  def wmma_mma(self, u: Node, j: int, a: str, b: str, dt: DType) -> Fn:
    """mma_sync(acc, a, b, acc): acc += a @ b, products exact in float32 and summed in float32 in K's order."""
    def mma(s: _Run) -> None:
      on = warps(s, "wmma::mma_sync")
      if s.env.get(a) is None or s.env.get(b) is None: s.fail(f"wmma::mma_sync reads fragment {a if s.env.get(a) is None else b} before it is loaded")
      acc, fa, fb = s.env[f"acc{j}"].copy(), value_of(s.env[a][on], dt), value_of(s.env[b][on], dt)
      c = acc[on]
      for k in range(16): c += fa[:, :, k, None] * fb[:, None, k, :]
      acc[on] = c
      s.env[f"acc{j}"] = acc
    return mma

  def wmma_store(self, u: Node, j: int) -> Fn:
    """store_matrix_sync(tiles + warp * 256, acc, 16, mem_row_major): the warp's lanes write its 256 floats together."""
    def store(s: _Run) -> None:
      on = warps(s, "wmma::store_matrix_sync")
      first = leaders(s, on)
      at = (s.t[first] // WARP * 256)[:, None] + np.arange(256)
      self.prog.shared_elements(s, self.prog.shared_array(s, "tiles"), first, at, s.env[f"acc{j}"][on].reshape(-1, 256),
                                by=(s.t[first], s.t[first] + WARP - 1))
    return store


# ***** cp.async: copies from global to shared memory in groups, landing at a wait *****

class AsyncCopies:
  """A run's cp.async copies not landed yet: each thread's in the order issued, with the group each was committed in (-1: none yet)."""

  def __init__(self, n: int):
    self.committed = np.zeros(n, np.int64)  # groups each thread committed
    self.pending: list[tuple[_Shared, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # array, rows (lanes), offsets, values, group

  def issue(self, s: _Run, sh: _Shared, lanes: np.ndarray, at: np.ndarray, values: np.ndarray) -> None:
    """Copies by the threads `lanes` (in order) to elements `at` ((len(lanes), k) offsets in `sh`) of `values`, in no group yet."""
    self.pending.append((sh, lanes, at, values, np.full(len(lanes), -1, np.int64)))
    np.add.at(sh.copying, s.local_g[lanes][:, None] * sh.size + at, 1)

  def commit(self, active: np.ndarray) -> None:
    """cp.async.commit_group: each active thread's copies not yet in a group make its next group (possibly empty)."""
    for _, lanes, _, _, group in self.pending: group[(group < 0) & active[lanes]] = self.committed[lanes][(group < 0) & active[lanes]]
    self.committed[active] += 1

  def wait(self, prog: EMUProgram, s: _Run, n: int) -> None:
    """cp.async.wait_group n: each active thread's groups but its n most recent land, each copy as a write of its thread now."""
    keep = []
    for sh, lanes, at, values, group in self.pending:
      done = (group >= 0) & (group < self.committed[lanes] - n) & s.active[lanes]
      if done.any():
        np.subtract.at(sh.copying, s.local_g[lanes[done]][:, None] * sh.size + at[done], 1)
        rows = np.zeros(s.n, bool)
        rows[lanes[done]] = True  # lanes are in order, one row each (a statement's copies)
        prog.shared_elements(s, sh, rows, at[done], values[done])
      if not done.all(): keep.append((sh, lanes[~done], at[~done], values[~done], group[~done]))
    self.pending = keep
