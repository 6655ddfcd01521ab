"""Lowering: a kernel with its opts as a linear program of UOps (codegen/lower/), and renderers that spell every statement of it."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tinytune import Kernel, KernelOptError, Opt, OptOps, Tensor, dtypes
from tinytune.codegen.cstyle import CRenderer, CStyleRenderer, CUDARenderer, HIPRenderer, OpenCLRenderer
from tinytune.codegen.lower import STATEMENTS, LinearProgram, StoreArg, lower
from tinytune.engine.schedule import create_schedule
from tinytune.runtime import DeviceCaps
from tinytune.uop import ALU, Ops

CPU = DeviceCaps(threads=2, simd_width=4)
GPU = DeviceCaps(has_local=True, max_upcast=64, simd_width=4, max_local=256, shared_bytes=16384, tensor_cores=("float16",))
RENDERERS: list[CStyleRenderer] = [CRenderer(), OpenCLRenderer(), OpenCLRenderer(fp16=False), CUDARenderer(), HIPRenderer()]
U, R, P = OptOps.UPCAST, OptOps.UNROLL, OptOps.PADTO
CPU_BF16, BF16 = DeviceCaps(threads=2, simd_width=16, vector_registers=32, tensor_cores=("bfloat16",)), dtypes.bfloat16.np


def arr(*shape: int, dtype: type = np.float32) -> Tensor: return Tensor(np.ones(shape, dtype=dtype))  # no kernel runs to make it


def kernel(t: Tensor, caps: DeviceCaps, opts: list[Opt]) -> Kernel:
  items, _ = create_schedule(t.uop, "CPU")
  return Kernel(items[-1].ast, caps).apply_opts(opts)


def test_program_reads_like_the_kernel() -> None:
  """A 4x3 row sum, its 4 rows as SIMD lanes of one vector accumulator, the reduce padded to 4: the loop runs its 3 real
  iterations with no masks, then the padded one masked; one vector store."""
  x = Tensor(np.arange(12, dtype=np.float32).reshape(4, 3))
  program = lower(kernel(x.sum(-1), CPU, [Opt(U, 0, 4), Opt(P, 1, 4)]), CRenderer())
  assert str(program) == """\
acc1 = DEFINE_ACC<4>.float32 0.0 ADD
RANGE r1 0..3
  v9 = LOAD.float32 data1[r1]
  v10 = LOAD.float32 data1[(r1+3)]
  v11 = LOAD.float32 data1[(r1+6)]
  v12 = LOAD.float32 data1[(r1+9)]
  v13 = VECTORIZE<4>.float32 v9, v10, v11, v12
  ASSIGN acc1 ADD= v13
ENDRANGE
RANGE r1 3..4
  v2 = LOAD.float32 data1[WHERE((r1<3), r1, 2)]
  v3 = LOAD.float32 data1[(WHERE((r1<3), r1, 2)+3)]
  v4 = LOAD.float32 data1[(WHERE((r1<3), r1, 2)+6)]
  v5 = LOAD.float32 data1[(WHERE((r1<3), r1, 2)+9)]
  v6 = VECTORIZE<4>.bool (r1<3), (r1<3), (r1<3), (r1<3)
  v7 = VECTORIZE<4>.float32 v2, v3, v4, v5
  v8 = WHERE<4>.float32 v6, v7, VECTORIZE(0.0, 0.0, 0.0, 0.0)
  ASSIGN acc1 ADD= v8
ENDRANGE
STORE<4> data0[0] = acc1"""


def structure(p: LinearProgram) -> list[tuple[Ops, int]]:
  """Each statement's op and depth of loops and branches."""
  depth, ret = 0, []
  for u in p.uops:
    depth -= u.op in (Ops.ENDRANGE, Ops.ENDIF, Ops.ELSE)
    ret.append((u.op, depth))
    depth += u.op in (Ops.RANGE, Ops.IF, Ops.ELSE)
  return ret


def test_lowering_decides_loops_lanes_and_vector_loads() -> None:
  a, b = arr(8, 16), arr(16, 8)
  k = kernel(a @ b, CPU, [Opt(U, 1, 8), Opt(OptOps.THREAD, 0, 2), Opt(OptOps.KBLOCK, 0, 4)])
  p = lower(k, CRenderer())
  ops = [op for op, _ in structure(p)]
  ranges = [u.arg for u in p.uops if u.op is Ops.RANGE]
  assert [r[0] for r in ranges] == ["t4", "k5", "g0", "r2"] and ranges[0][3] and not any(r[3] for r in ranges[1:])  # threads outermost
  assert ops.count(Ops.IF) == 2 and ops.count(Ops.ELSE) == 1  # K blocks: reload the sums so far; store them, or finish on the last
  assert [u.arg[1] for u in p.uops if u.op is Ops.LOAD and u.arg[2] == 2] == [4, 4]  # B's rows as two 4-wide vector loads
  assert all(d >= 0 for _, d in structure(p)) and structure(p)[-1] == (Ops.ENDRANGE, 0)


def test_pack_copies_b_panels_once_per_column_tile_and_the_rows_read_them() -> None:
  """PACK: B's panel (K by the tile's 8 columns) is copied into an array of the thread's inside the column loop, before the row loop,
  in vectors along its rows (or, for a B gathered along K, from vectors along K, a scalar store a lane); the reduce reads only the
  array, contiguously along K; A, whose row loop is innermost, stays in memory. K blocks copy each block's panel."""
  a, b = arr(32, 16), arr(16, 24)
  for bt, kblock in ((b, []), (arr(24, 16).T, []), (b, [Opt(OptOps.KBLOCK, 0, 4)])):
    k = kernel(a @ bt, CPU, [Opt(U, 1, 8), Opt(U, 0, 2), Opt(OptOps.SWAP, 0, 1), *kblock, Opt(OptOps.PACK, 0, 0)])
    (view, at, loops, dims), = k.pack_tiles()
    assert view.arg.strides[0] == 0 and not loops and dims == [(2, 16 // (4 if kblock else 1)), (1, 8)]
    p = lower(k, CRenderer())
    ranges = [u.arg.var for u in p.uops if u.op is Ops.RANGE]
    assert ranges == [*(["k5"] if kblock else []), "g1", "c0_2", "g0", "r2"]
    local = next(u for u in p.uops if u.op is Ops.DEFINE_LOCAL)
    assert local.arg.name == "pack0" and local.arg.size == 8 * dims[0][1]
    stores = [u.arg.width for u in p.uops if u.op is Ops.STORE and u.arg.buf == "pack0"]
    assert stores == ([4, 4] if bt is b else [1] * 32)  # two vectors a K step; transposed: 4 K steps of 8 lanes, a store each
    body = p.uops[next(i for i, u in enumerate(p.uops) if u.op is Ops.RANGE and u.arg.var == "r2"):]
    assert {u.arg.buf for u in body if u.op is Ops.LOAD and u.arg.buf != 1} == {"pack0"}  # B only from its panel
    assert [u.arg.width for u in body if u.op is Ops.LOAD and u.arg.buf == "pack0"] == [4, 4]
  with pytest.raises(KernelOptError, match="PACK needs"):  # the columns in registers, inside the row loop: no panel is read twice
    kernel(a @ b, CPU, [Opt(U, 1, 8), Opt(U, 1, 3), Opt(OptOps.PACK, 0, 0)])


def test_pack_block_copies_b_once_per_k_block_outside_the_row_loop() -> None:
  """PACK 1: with the rows outside the columns, B's K block for all of the thread's columns is copied once per K block, before the
  row loop, one contiguous panel after another (a column tile's K steps together), and the reduce reads the panel of its column
  tile; PACK 0 there copies A's rows only (B's panel is read once). With the columns outside the rows PACK 1 copies A's block instead,
  and with the columns all in registers it has none."""
  a, b = arr(32, 16), arr(16, 24)
  k = kernel(a @ b, CPU, [Opt(U, 1, 4), Opt(U, 0, 2), Opt(OptOps.THREAD, 1, 2), Opt(OptOps.KBLOCK, 0, 4), Opt(OptOps.PACK, 0, 1)])
  (tile,) = k.pack_tiles()
  assert tile.view.arg.strides[0] == 0 and tile.at == 2 and tile.loops == [(k.axes.index(k.remaining(1)), 3)] and tile.dims == [(2, 4), (1, 4)]
  p = lower(k, CRenderer())
  assert [u.arg.var for u in p.uops if u.op is Ops.RANGE] == ["t5", "k6", "c0_a1", "c0_2", "g0", "g1", "r2"]
  assert next(u for u in p.uops if u.op is Ops.DEFINE_LOCAL).arg.size == 3 * 4 * 4
  body = p.uops[next(i for i, u in enumerate(p.uops) if u.op is Ops.RANGE and u.arg.var == "r2"):]
  reads = [u for u in body if u.op is Ops.LOAD and u.arg.buf == "pack0"]
  assert [u.arg.width for u in reads] == [4] and {v.arg[0] for v in reads[0].src[0].vars} == {"g1", "r2"}  # its column tile's panel
  assert [t.view.arg.strides[1] for t in kernel(a @ b, CPU, [Opt(U, 1, 4), Opt(OptOps.THREAD, 1, 2), Opt(OptOps.PACK, 0, 0)]).pack_tiles()] == [0]
  (tile,) = kernel(a @ b, CPU, [Opt(U, 1, 4), Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PACK, 0, 1)]).pack_tiles()
  assert tile.view.arg.strides[1] == 0 and tile.loops == [(0, 32)] and tile.dims == [(2, 16), (0, 1)]
  with pytest.raises(KernelOptError, match="PACK needs"):
    kernel(a @ b, CPU, [Opt(U, 1, 8), Opt(U, 1, 3), Opt(OptOps.PACK, 0, 1)])


def test_lanes_partials_combine_in_a_tree_after_the_loop() -> None:
  x = arr(3, 64)
  p = lower(kernel(x.max(-1), CPU, [Opt(OptOps.LANES, 0, 16)]), CRenderer())  # C's vectors have MAX: 4 vector partials
  assert str(lower(kernel(x.max(-1), CPU, [Opt(OptOps.LANES, 0, 16)]))).count("DEFINE_ACC") == 16  # a plain target's have not: 16 scalars
  accs = [u for u in p.uops if u.op is Ops.DEFINE_ACC]
  assert [u.arg[1] for u in accs] == [4] * 4  # 16 lanes as 4 vector partials of the max
  folds = [u for u in p.uops if u.op is Ops.FOLD]
  assert folds[0].arg[1] == 4 and len(folds[0].src) == 4 and len(folds) == 1 + 2 + 1  # the vectors, then lanes pairwise
  assert str(p).index("ENDRANGE") < str(p).index(folds[0].arg[0] + " = FOLD")
  # 3 rows at once (an UPCAST): their lanes fold together, one transposing fold whose lane j is row j's max, then each row reads its lane
  p = lower(kernel(x.max(-1), CPU, [Opt(OptOps.LANES, 0, 16), Opt(U, 0, 3)]), CRenderer())
  folds = [u for u in p.uops if u.op is Ops.FOLD]
  assert [u.arg.across for u in folds] == [False] * 3 + [True] + [False] * 3
  assert len(folds[3].src) == 3 and all(u.src[0].src[0] is folds[3] for u in folds[4:])


def test_group_partials_go_through_shared_memory() -> None:
  x = arr(4, 64)
  p = lower(kernel(x.sum(-1), GPU, [Opt(OptOps.GROUP, 0, 8)]), CUDARenderer())
  ops = [op for op, _ in structure(p)]
  assert ops.index(Ops.DEFINE_LOCAL) < ops.index(Ops.BARRIER) < ops.index(Ops.EXIT) < ops.index(Ops.STORE)
  assert [u.arg[:2] for u in p.uops if u.op is Ops.SPECIAL] == [("g0", "group_id"), ("lid", "local_id"), ("q2", "lid")]


def programs() -> list[tuple[str, LinearProgram, Kernel]]:
  """Kernels whose programs hold every statement kind between them."""
  a, b = arr(8, 16), arr(16, 12)
  h1, h2 = arr(32, 16, dtype=np.float16), arr(16, 32, dtype=np.float16)
  x, idx = arr(6, 10), Tensor(np.array([[3, 0, 9, 7]] * 6, dtype=np.int32))
  cases = [
    ("cpu", kernel(a @ b, CPU, [Opt(U, 1, 4), Opt(OptOps.THREAD, 0, 2), Opt(OptOps.KBLOCK, 0, 4), Opt(R, 0, 2)])),
    ("cpu", kernel((x.exp2() * 2).max(-1), CPU, [Opt(P, 1, 16), Opt(OptOps.LANES, 0, 8)])),
    ("cpu", kernel(x.gather(1, idx), CPU, [Opt(U, 1, 4)])),
    ("cpu", kernel((x.bitcast(dtypes.int32) + 1).sum(-1), CPU, [])),
    ("gpu", kernel(a @ b, GPU, [Opt(U, 1, 4), Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.GROUPTOP, 0, 4)])),
    ("tc", kernel(h1 @ h2, GPU, [Opt(OptOps.TC, 0, 0), Opt(OptOps.LOCAL, 0, 2)])),
    ("tc", kernel(a @ b, replace(GPU, async_copy=True), [Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.STAGE, 0, 4), Opt(OptOps.PIPELINE, 0, 2)])),  # cp.async
    ("cpu", kernel(arr(8, 16, dtype=BF16) @ arr(16, 8, dtype=BF16), CPU_BF16, [Opt(OptOps.TC, 0, 0), Opt(U, 1, 8)])),
  ]
  return [(where, lower(k, CRenderer() if where == "cpu" else CUDARenderer()), k) for where, k in cases]


def test_every_statement_kind_is_lowered_and_spelled_by_every_renderer() -> None:
  made = programs()
  assert {u.op for _, p, _ in made for u in p.uops} >= STATEMENTS - ALU  # the ALU ops are one table, the renderers' code_table
  for r in RENDERERS:
    assert STATEMENTS - {Ops.WMMA} <= set(r.statements), type(r).__name__
    for where, p, k in made:
      if where == "tc" and not isinstance(r, CUDARenderer): continue
      if where == "cpu" and not isinstance(r, CRenderer): continue
      src = r.spell(p)
      assert src.count("{") == src.count("}") and f" {k.name}(" in src


def test_tensor_cores_only_where_a_renderer_spells_them() -> None:
  """A TC kernel rendered for a device without tensor cores is refused (it was once rendered as if the TC axes were not there)."""
  h1, h2 = arr(32, 16, dtype=np.float16), arr(16, 32, dtype=np.float16)
  k = kernel(h1 @ h2, GPU, [Opt(OptOps.TC, 0, 0)])
  assert "wmma::mma_sync" in CUDARenderer().render(k) and "__builtin_amdgcn_wmma_f32_16x16x16_f16_w32" in HIPRenderer().render(k)
  with pytest.raises(NotImplementedError, match="has no WMMA statement"): OpenCLRenderer().render(k)


def test_cpu_tensor_cores_add_bfloat16_pairs() -> None:
  """On a CPU with bfloat16 dot products, a bfloat16 matmul's defaults put K in pairs first (TC). Each pass of its loop makes each
  row's pair of A once (in every lane) and each vector's pair of B rows once, and adds each accumulator's products in one dot
  product. x @ W.T with a long K takes LANES along K, whose pairs are neighbours in both inputs. TC refuses what is no bfloat16
  matmul with pairs, and other CPUs and dtypes get no TC by default."""
  from tinytune.codegen.heuristic import hand_coded_optimizations
  tc = [Opt(OptOps.TC, 0, 0)]
  def made(k: Kernel) -> list[str]:  # the loop's WMMA statements: "dot" or the kind of pair
    p = lower(k.apply_opts(hand_coded_optimizations(k)), CRenderer())
    return [u.arg[0] if u.arg[0] == "dot" else u.arg[4] for u in p.uops if u.op is Ops.WMMA]
  mm = kernel(arr(64, 128, dtype=BF16) @ arr(128, 64, dtype=BF16), CPU_BF16, [])
  assert hand_coded_optimizations(mm)[:1] == tc and Opt(U, 1, 32) in hand_coded_optimizations(mm)
  rows = next(o.arg for o in hand_coded_optimizations(mm) if o.op is U and o.axis == 0)
  assert sorted(made(mm)) == sorted(["dot"] * rows * 2 + ["splat"] * rows + ["rows"] * 2) and "tt_dot16(acc" in CRenderer().render(mm)
  linear = kernel(arr(8, 1024, dtype=BF16) @ arr(64, 1024, dtype=BF16).T, CPU_BF16, [])  # 4x4 outputs, each a vector of partial sums
  assert sorted(made(linear)) == sorted(["dot"] * 16 + ["neighbours"] * 8) and linear.opts[:2] == tc + [Opt(OptOps.LANES, 0, 16)]
  # a gathered 16-bit B costs a conversion a lane: dot products from a K of 256 (float32's from 512), float16's without TC
  assert "neighbours" in made(kernel(arr(8, 256, dtype=BF16) @ arr(64, 256, dtype=BF16).T, CPU_BF16, []))
  half, single = (hand_coded_optimizations(kernel(arr(8, 256, dtype=dt) @ arr(64, 256, dtype=dt).T, CPU_BF16, [])) for dt in (np.float16, np.float32))
  assert Opt(OptOps.LANES, 0, 16) in half and tc[0] not in half and not any(o.op is OptOps.LANES for o in single)
  for other in (kernel(arr(64, 128) @ arr(128, 64), CPU_BF16, []), kernel(arr(64, 128, dtype=BF16) @ arr(128, 64, dtype=BF16), CPU, []),
                kernel(arr(64, 64, dtype=BF16) @ arr(64, 64, dtype=BF16).T, CPU_BF16, [])):
    assert tc[0] not in hand_coded_optimizations(other)  # float32, a CPU without the instruction, or B gathered along a short K
  for t, why in [(arr(8, 16, dtype=np.float16) @ arr(16, 16, dtype=np.float16), "bfloat16 inputs"),
                 (arr(8, 7, dtype=BF16) @ arr(7, 16, dtype=BF16), "even length"), ((arr(8, 16, dtype=BF16) + 1).sum(-1), "product")]:
    with pytest.raises(KernelOptError, match=why): kernel(t, CPU_BF16, tc)
  with pytest.raises(KernelOptError, match="GROUP does not combine with TC"):
    kernel(arr(8, 16, dtype=BF16) @ arr(16, 16, dtype=BF16), CPU_BF16, tc + [Opt(OptOps.GROUP, 0, 2)])


def test_16_bit_floats_take_float32_lanes_where_the_renderer_has_them() -> None:
  """The C renderer computes float16 and bfloat16 in float32 vector lanes: vector loads and stores convert, each op rounds to the
  16-bit type (a max or a negation needs no rounding); a matmul of them multiplies in float32 (exact products) and rounds only its
  sum. Renderers without such lanes (OpenCL here) keep a lane per scalar."""
  for dt, name in ((np.float16, "f16"), (dtypes.bfloat16.np, "bf16")):
    a, b = arr(8, 16, dtype=dt), arr(8, 16, dtype=dt)
    k = kernel(((a * b).relu() + 1).neg(), CPU, [Opt(U, 1, 8)])
    program = str(lower(k, CRenderer()))
    assert program.count(f"LOAD<4>.{dtypes.from_any(dt).name}") == 4 and program.count("STORE<4>") == 2
    src = CRenderer().render(k).split(f"void {k.name}")[1]
    assert src.count(f"tt_f4_round_{name}(") == 4 and f"tt_f4_store_{name}(data0" in src  # the product and the sum, twice
    assert "LOAD<4>" not in str(lower(k, OpenCLRenderer()))
    mm = kernel(arr(8, 16, dtype=dt) @ arr(16, 8, dtype=dt), CPU, [Opt(U, 1, 8)])
    assert CRenderer().render(mm).split(f"void {mm.name}")[1].count(f"tt_f4_round_{name}(") == 2  # only the sums, a vector each


def test_a_tile_across_rows_goes_without_the_loop_vectorizer() -> None:
  """A transpose's 8x8 tile (no reduce, register parts on two dims) is compiled without gcc's loop vectorizer, which took 2-6 s
  on one with short rows (4x512x64) and made it 10x slower; an elementwise kernel, or a matmul's tile, keeps it."""
  x = arr(4, 512, 64)
  tile = kernel(x.transpose(-1, -2).contiguous(), CPU, [Opt(U, 2, 8), Opt(U, 1, 8)])
  assert lower(tile, CRenderer()).no_loop_vectorizer and "no-tree-loop-vectorize" in CRenderer().render(tile)
  for k in (kernel(x + 1, CPU, [Opt(U, 2, 8)]), kernel(arr(8, 16) @ arr(16, 8), CPU, [Opt(U, 1, 8), Opt(U, 0, 2)])):
    assert not lower(k, CRenderer()).no_loop_vectorizer and "no-tree-loop-vectorize" not in CRenderer().render(k)


def test_void_is_no_tensor_dtype() -> None:
  """Statements that hold no value have dtype void, which no tensor takes."""
  program = lower(kernel(arr(4, 4).sum(-1), CPU, []), CRenderer())
  assert dtypes.void not in dtypes.all and all(u.dtype is dtypes.void for u in program.uops if u.op is Ops.RANGE)
  with pytest.raises(TypeError, match="unsupported dtype"): dtypes.from_any("void")


def test_softmax_computes_each_exp_once_in_a_row_array() -> None:
  """The CPU's softmax kernel: the sum's loop writes exp(x - max) into an array of the row, the row's loop reads it back; one EXP2
  per element, not two. The kernel's result is NumPy's."""
  x = np.random.default_rng(0).standard_normal((6, 40)).astype(np.float32)
  k = kernel(Tensor(x).softmax(-1), CPU, [Opt(U, 1, 8), Opt(OptOps.LANES, 0, 8)])
  program = str(lower(k, CRenderer()))
  reduce_loop, row_loop = program.split("RANGE g1")
  assert "DEFINE_LOCAL" in reduce_loop and "EXP2" in reduce_loop and "STORE<4> row0" in reduce_loop
  assert "EXP2" not in row_loop and "LOAD<4>.float32 row0" in row_loop
  e = np.exp(x - x.max(-1, keepdims=True))
  np.testing.assert_allclose(Tensor(x).softmax(-1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5)


def test_a_row_read_off_its_statistic_is_recomputed() -> None:
  """Where the output reads the statistic's source on another row than the statistic's (the sums flipped), no row array holds
  it: lowering computes it again."""
  x = np.random.default_rng(1).standard_normal((6, 40)).astype(np.float32)
  t = Tensor(x)
  e = (t - t.max(-1, keepdim=True)).exp()
  out = e * e.sum(-1, keepdim=True).flip(0)
  items, _ = create_schedule(out.uop, "CPU")
  assert len(items) == 1  # the max and the flipped sum stay in the output's kernel
  program = str(lower(Kernel(items[-1].ast, CPU).apply_opts([Opt(U, 1, 8)]), CRenderer()))
  assert "row0" not in program and "EXP2" in program.split("RANGE g1")[1]
  en = np.exp(x - x.max(-1, keepdims=True))
  np.testing.assert_allclose(out.numpy(), en * en.sum(-1, keepdims=True)[::-1], rtol=1e-5)


def test_a_chain_of_statistics_on_workgroups() -> None:
  """A kernel with softmax's chain of reduces (scheduled for the CPU) on a device with workgroups: with threads across rows each
  runs the max's loop, then the sum's, then writes its row; threads along the row must be the reduce's GROUP threads (a row
  kernel: each statistic's partials combined between barriers), so LOCAL along the row alone is refused."""
  k = kernel(arr(6, 40).softmax(-1), GPU, [Opt(OptOps.LOCAL, 0, 2)])
  assert len(k.reduceops) == 2
  assert [u.arg[0] for u in lower(k, CUDARenderer()).uops if u.op is Ops.RANGE] == ["r2", "r2", "g1"]
  with pytest.raises(KernelOptError, match="GROUP threads"): kernel(arr(6, 40).softmax(-1), GPU, [Opt(OptOps.LOCAL, 1, 8)])
  row = lower(kernel(arr(6, 40).softmax(-1), GPU, [Opt(OptOps.GROUP, 0, 4), Opt(OptOps.LOCAL, 1, 4)]), CUDARenderer()).uops
  loops = [u.arg[0] for u in row if u.op is Ops.RANGE]
  assert loops == ["r2", "r2", "g1"] and sum(u.op is Ops.BARRIER for u in row) >= 2


def test_stream_stores_whole_lines_past_the_caches_and_fences_each_thread() -> None:
  """STREAM: the output's 16-lane vector stores (a 64-byte line each), or 8-lane ones two a line, go past the caches, and each thread's
  share ends with a fence; narrower vector stores, 8-lane ones of half a line, scalar stores and the stores of a row array stay cached."""
  avx512 = DeviceCaps(threads=2, simd_width=16)
  p = lower(kernel(arr(64, 64).exp() + 1, avx512, [Opt(U, 1, 32), Opt(OptOps.THREAD, 0, 2), Opt(OptOps.STREAM, 0, 0)]), CRenderer())
  stores = [u for u in p.uops if u.op is Ops.STORE]
  assert len(stores) == 2 and all(u.arg == StoreArg(16, 0, True) for u in stores)
  ends = [(op, depth) for op, depth in structure(p) if op in (Ops.BARRIER, Ops.ENDRANGE)]
  assert ends[-3:] == [(Ops.ENDRANGE, 1), (Ops.BARRIER, 1), (Ops.ENDRANGE, 0)]  # the fence last in the thread's loop
  src = CRenderer().spell(p)
  assert src.count("tt_f16_stream(data0+") == 2 and "tt_fence();" in src
  narrow = lower(kernel(arr(64, 64) + 1, CPU, [Opt(U, 1, 8), Opt(OptOps.STREAM, 0, 0)]), CRenderer())
  assert not any(u.op is Ops.BARRIER or u.op is Ops.STORE and u.arg[2] for u in narrow.uops)
  # AVX2's 8 lanes: two vectors a line, one after the other, where the lanes' part spans whole lines (16 floats), not 8
  avx2 = DeviceCaps(threads=2, simd_width=8)
  halves = lower(kernel(arr(64, 64).exp() + 1, avx2, [Opt(U, 1, 16), Opt(U, 0, 2), Opt(OptOps.STREAM, 0, 0)]), CRenderer())
  assert all(u.arg == StoreArg(8, 0, True) for u in halves.uops if u.op is Ops.STORE)
  streamed = [line.strip() for line in CRenderer().spell(halves).splitlines() if "tt_f8_stream(data0+" in line]
  assert [line.split("(g1*16))")[-1].split(",")[0] for line in streamed] == ["", "+8)", "+64)", "+72)"]  # each line's halves in turn
  eight = lower(kernel(arr(64, 64) + 1, avx2, [Opt(U, 1, 8), Opt(OptOps.STREAM, 0, 0)]), CRenderer())
  assert not any(u.op is Ops.STORE and u.arg[2] for u in eight.uops) and "tt_f8_stream" not in CRenderer().spell(eight)
  softmax = lower(kernel(arr(64, 64).softmax(-1), avx512, [Opt(OptOps.LANES, 0, 32), Opt(U, 1, 32), Opt(OptOps.STREAM, 0, 0)]), CRenderer())
  assert {u.arg[1:3] for u in softmax.uops if u.op is Ops.STORE} == {(0, True), ("row0", False)}
  with pytest.raises(KernelOptError, match="once per kernel"):
    kernel(arr(64, 64) + 1, CPU, [Opt(OptOps.STREAM, 0, 0), Opt(OptOps.STREAM, 0, 0)])
  with pytest.raises(KernelOptError, match="for the CPU"): kernel(arr(64, 64) + 1, GPU, [Opt(OptOps.STREAM, 0, 0)])


def test_a_padded_copy_of_a_computed_value_indexes_its_source_by_its_own_dims() -> None:
  """relu(x + b) padded (as the CNN step pads its batchnorm's gradient for the input gradient's conv): the source is indexed by its
  own dims counted from the mask's start, with no division, in vector loads guarded by the mask (an extra image of padding reads
  nothing), where the index through the flat offset had a division and a modulo per dim and gathered each lane."""
  rng = np.random.default_rng(0)
  x, b = rng.standard_normal((2, 3, 4, 4)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
  y = (Tensor(x) + Tensor(b).reshape(1, 3, 1, 1)).relu().pad(((0, 1), (0, 0), (2, 2), (4, 4)))
  p = lower(kernel(y, CPU, [Opt(U, 3, 4)]), CRenderer())
  assert not any(v.op in (Ops.IDIV, Ops.MOD) for u in p.uops for s in u.src for v in s.toposort)
  x_load = next(u for u in p.uops if u.op is Ops.LOAD and u.arg.buf == 1)
  assert x_load.arg.width == 4 and x_load.src[1].op is not Ops.CONST  # one vector, read where the mask holds
  np.testing.assert_array_equal(y.numpy(), np.pad(np.maximum(x + b.reshape(1, 3, 1, 1), 0), ((0, 1), (0, 0), (2, 2), (4, 4))))


def test_a_mask_made_a_number_stays_a_vector() -> None:
  """(x == y) as float32, as a max pool's gradient counts its window's maxima: the comparison's mask, negated and made a number, stays
  one vector, where each lane was taken out of it and converted on its own."""
  x, y = np.arange(32, dtype=np.float32).reshape(4, 8), np.arange(32, dtype=np.float32).reshape(4, 8) % 3
  out = (Tensor(x) == Tensor(y)).float()
  p = lower(kernel(out, CPU, [Opt(U, 1, 4)]), CRenderer())
  assert not any(u.op is Ops.GEP for u in p.uops) and [u.op for u in p.uops if u.op in (Ops.CMPNE, Ops.WHERE)] == [Ops.CMPNE] * 2 + [Ops.WHERE]
  np.testing.assert_array_equal(out.numpy(), (x == y).astype(np.float32))


def test_sources_script_keeps_the_features_kernels(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
  """bench/sources.py builds the features' kernels from their tests' cases (attention, PIPELINE, wgmma, AMD's matrix cores, RASTER, index
  checks, the GPU plans), each renderer's opt lists applying to its kernel; a save of some then a check finds them identical, and a
  source unlike the one saved is reported."""
  import json

  from ops_support import bench_module
  sources = bench_module("sources")
  features = sources.features()
  assert {name for _, plans in features.values() for name in plans} == {"c", "cuda_tiles", "hip_tiles", "opencl_tiles", "cuda_sm80", "cuda_sm90",
                                                                      "hip_gfx1100", "hip_gfx942"}
  assert all(lists for _, plans in features.values() for lists in plans.values())
  monkeypatch.setattr(sources, "fuzzed", dict)
  monkeypatch.setattr(sources, "features", lambda: dict(list(features.items())[::25]))
  path = tmp_path / "sources.json"
  sources.save(str(path), 0)
  assert sources.check(str(path)) == 0
  records = json.loads(path.read_text())
  assert not any(r["src"].startswith("!!") for r in records)
  records[-1]["src"] = records[-1]["src"].replace("(", "[", 1)
  path.write_text(json.dumps(records))
  assert sources.check(str(path)) == 1
