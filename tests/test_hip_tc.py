"""TC on AMD GPUs with no AMD GPU: which gfx targets take it (RDNA3's WMMA, CDNA's MFMA across 64-lane wavefronts) and why the others
refuse it; the HIP source compiled by clang for gfx1100, gfx90a and gfx942 into v_wmma and v_mfma instructions; the renderer's lane
tables against AMD's documented layouts; and the source run on the host, as test_mma_on_host runs CUDA's, with one host thread per GPU
thread and the matrix builtins written here from AMD's documented lane layouts, apart from the renderer's: WMMA in C++, MFMA in NumPy."""
from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from typing import Callable

import numpy as np
import pytest
from ops_support import hip_clang, hip_flags, run_blocks_on_host

from tinytune import Kernel, KernelOptError, Opt, OptOps, Tensor, dtypes
from tinytune.codegen.caps import amd_caps
from tinytune.codegen.cstyle import HIPRenderer
from tinytune.codegen.heuristic import hand_coded_optimizations
from tinytune.engine.schedule import create_schedule

RDNA3, CDNA2, CDNA3 = amd_caps("gfx1100"), amd_caps("gfx90a"), amd_caps("gfx942")
MFMA = HIPRenderer.MATRIX["mfma"]


def _matmul(ta: bool, tb: bool, k: int, dtype=dtypes.float16, seed: int = 0):  # type: ignore[no-untyped-def]
  """A (64, k) @ (k, 48) matmul's kernel (A or B stored transposed) with its inputs as float32 arrays of the dtype's values."""
  rng = np.random.default_rng(seed)
  a_np, b_np = (rng.standard_normal(s).astype(np.float32) for s in ((k, 64) if ta else (64, k), (48, k) if tb else (k, 48)))
  a, b = Tensor(a_np).cast(dtype).realize(), Tensor(b_np).cast(dtype).realize()
  (item,), _ = create_schedule(((a.T if ta else a) @ (b.T if tb else b)).uop, "CPU")
  return item.ast, a.float().numpy(), b.float().numpy()


@pytest.mark.parametrize("arch, warp", [("gfx1100", 32), ("gfx1101", 32), ("gfx1151", 32), ("gfx90a", 64), ("gfx942:sramecc+:xnack-", 64),
                                        ("gfx940", 64), ("gfx908", 64), ("gfx950", 0), ("gfx1030", 0), ("gfx1201", 0), ("gfx906", 0)])
def test_amd_archs_with_tensor_cores(arch: str, warp: int) -> None:
  caps = amd_caps(arch)
  assert caps.has_local and caps.tc_args == (0,) and bool(caps.tensor_cores) == bool(warp) and bool(caps.no_tc) != bool(warp)
  ast, *_ = _matmul(False, False, 32)
  if warp:
    assert caps.warp == warp and Kernel(ast, caps).apply_opt(Opt(OptOps.TC, 0, 0)) is None
    assert Kernel(ast, caps).apply_opts([Opt(OptOps.TC, 0, 0), Opt(OptOps.LOCAL, 1, 3)]).launch_dims == (4, 3 * warp)  # a warp a tile
  else:
    with pytest.raises(KernelOptError, match=re.escape(caps.no_tc)): Kernel(ast, caps).apply_opt(Opt(OptOps.TC, 0, 0))


def test_gfx908_mfma_takes_float16_alone() -> None:
  """MI100's 16x16x16 MFMA is float16's: its bfloat16 one (16x16x8bf16) holds 2 of K a lane, so a bfloat16 matmul keeps CUDA-core code."""
  ast, *_ = _matmul(False, False, 32, dtypes.bfloat16)
  with pytest.raises(KernelOptError, match="TC needs float16 inputs"): Kernel(ast, amd_caps("gfx908")).apply_opt(Opt(OptOps.TC, 0, 0))


@pytest.mark.parametrize("caps", [RDNA3, CDNA2, CDNA3], ids=["gfx1100", "gfx90a", "gfx942"])
def test_gpu_default_plans_tc_on_amd(caps) -> None:  # type: ignore[no-untyped-def]
  """The GPU heuristics take the matrix units on RDNA3 and CDNA: TC first, a warp a 64x64 tile (4x4 of 16x16) where the sizes allow."""
  ast, *_ = _matmul(False, False, 32)
  opts = hand_coded_optimizations(Kernel(ast, caps))
  assert opts[0] == Opt(OptOps.TC, 0, 0) and Opt(OptOps.UPCAST, 0, 4) in opts, opts
  a = Tensor(np.zeros((1024, 1024), np.float16)).realize()
  (item,), _ = create_schedule((a @ a).uop, "CPU")
  k = Kernel(item.ast, caps).apply_opts(hand_coded_optimizations(Kernel(item.ast, caps)))
  assert k.opts[:5] == [Opt(OptOps.TC, 0, 0), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.LOCAL, 1, 2)]
  assert k.launch_dims == (8 * 8, 4 * caps.warp)  # 128x128 outputs a workgroup


def test_rdna3_takes_wmma_not_mma_sync() -> None:
  ast, *_ = _matmul(False, False, 32)
  with pytest.raises(KernelOptError, match="arg 1 \\(PTX mma.sync\\) is CUDA's"): Kernel(ast, RDNA3).apply_opt(Opt(OptOps.TC, 0, 1))
  assert hand_coded_optimizations(Kernel(ast, RDNA3))[0] == Opt(OptOps.TC, 0, 0)  # the GPU default plans TC on RDNA3


CASES = [  # (A transposed, B transposed, K, dtype, opts): every layout of A and B, UPCAST tiles, warps, UNROLL, and STAGE's tiles
  (False, False, 32, dtypes.float16, [Opt(OptOps.TC, 0, 0), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.LOCAL, 1, 3), Opt(OptOps.UNROLL, 0, 2)]),
  (False, True, 32, dtypes.float16, [Opt(OptOps.TC, 0, 0), Opt(OptOps.LOCAL, 1, 3), Opt(OptOps.UPCAST, 0, 2)]),
  (True, False, 32, dtypes.bfloat16, [Opt(OptOps.TC, 0, 0), Opt(OptOps.UPCAST, 1, 3)]),
  (True, True, 32, dtypes.float16, [Opt(OptOps.TC, 0, 0), Opt(OptOps.SWAP, 0, 1)]),
  (False, False, 96, dtypes.bfloat16, [Opt(OptOps.TC, 0, 0), Opt(OptOps.STAGE, 0, 2), Opt(OptOps.LOCAL, 1, 3), Opt(OptOps.UPCAST, 0, 2)]),
  (True, True, 64, dtypes.float16, [Opt(OptOps.TC, 0, 0), Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.STAGE, 0, 2), Opt(OptOps.UPCAST, 1, 3)])]


INSTRUCTIONS = {"gfx1100": "v_wmma_f32_16x16x16_{}", "gfx908": "v_mfma_f32_16x16x16{}", "gfx90a": "v_mfma_f32_16x16x16{}",
                "gfx942": "v_mfma_f32_16x16x16_{}"}  # as clang prints them
SPELLINGS = {"gfx1100": ("f16", "bf16"), "gfx908": ("f16", ""), "gfx90a": ("f16", "bf16_1k"), "gfx942": ("f16", "bf16")}


@pytest.mark.parametrize("arch", INSTRUCTIONS)
def test_tc_source_compiles_for_amd(tmp_path, arch: str) -> None:  # type: ignore[no-untyped-def]
  """Every case below and the GPU default's plan, rendered for the target and compiled by clang into its matrix instructions (gfx908:
  the float16 ones)."""
  if (clang := hip_clang(arch)) is None: pytest.skip(f"no clang that compiles HIP for {arch} (Debian's clang-19 does gfx942): not compile-checked")
  caps = amd_caps(arch)
  for i, (ta, tb, k, dtype, opts) in enumerate([*CASES, (False, False, 256, dtypes.float16, None), (True, False, 256, dtypes.bfloat16, None)]):
    if dtype.name not in caps.tensor_cores: continue
    ast, *_ = _matmul(ta, tb, k, dtype)
    kernel = Kernel(ast, caps).apply_opts(hand_coded_optimizations(Kernel(ast, caps)) if opts is None else opts)
    (tmp_path / f"k{i}.hip").write_text(HIPRenderer().render(kernel))
    res = subprocess.run([clang, *hip_flags(arch), f"k{i}.hip", "-o", f"k{i}.s"], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[:3000]
    instruction = INSTRUCTIONS[arch].format(SPELLINGS[arch][dtype == dtypes.bfloat16])
    assert re.search(rf"\b{instruction}\b", (tmp_path / f"k{i}.s").read_text()), (instruction, kernel.opts)


# A block's threads meet at each WMMA (a wave-wide instruction). From AMD's RDNA3 docs: lane l of a wave32 holds row l % 16 of A and
# column l % 16 of B, all 16 of K in element order, lanes 16-31 the same as lanes 0-15; C and D: element v of lane l is (2 v + l / 16, l % 16).
SHIM = r"""
#include <barrier>
#include <cstring>
#include <thread>
#include <vector>
static thread_local int thread_id, group_id;
static std::barrier<>* block_sync;
#define __builtin_amdgcn_workitem_id_x() thread_id
#define __builtin_amdgcn_workgroup_id_x() group_id
#define __builtin_amdgcn_fence(order, scope)
#define __builtin_amdgcn_s_barrier() block_sync->arrive_and_wait()
typedef float tt_c8 __attribute__((vector_size(32)));
static const void *lane_a[1024], *lane_b[1024]; static tt_c8 lane_c[1024]; static int repeats_differ;
template <class V, class F> static tt_c8 host_wmma(V a, V b, tt_c8 c, F value) {
  int id = thread_id;
  lane_a[id] = &a, lane_b[id] = &b, lane_c[id] = c;
  block_sync->arrive_and_wait();
  if (id % 32 == 0) {
    float A[16][16], B[16][16], D[16][16];
    for (int l = 0; l < 32; l++) {
      const V &la = *(const V*)lane_a[id + l], &lb = *(const V*)lane_b[id + l];
      if (l >= 16) repeats_differ |= memcmp(&la, lane_a[id + l - 16], sizeof la) != 0 || memcmp(&lb, lane_b[id + l - 16], sizeof lb) != 0;
      else for (int k = 0; k < 16; k++) A[l][k] = value(la[k]), B[k][l] = value(lb[k]);
      for (int v = 0; v < 8; v++) D[2 * v + l / 16][l % 16] = lane_c[id + l][v];
    }
    for (int i = 0; i < 16; i++) for (int j = 0; j < 16; j++) for (int k = 0; k < 16; k++) D[i][j] += A[i][k] * B[k][j];
    for (int l = 0; l < 32; l++) for (int v = 0; v < 8; v++) lane_c[id + l][v] = D[2 * v + l / 16][l % 16];
  }
  block_sync->arrive_and_wait();
  return lane_c[id];
}
static float bf16_value(short x) { unsigned u = (unsigned)(unsigned short)x << 16; float f; memcpy(&f, &u, 4); return f; }
#define __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a, b, c) host_wmma(a, b, c, [](_Float16 x) { return (float)x; })
#define __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(a, b, c) host_wmma(a, b, c, bf16_value)
"""


def _run_on_host(k: Kernel, tmp_path, out: np.ndarray, *inputs: np.ndarray) -> int:  # type: ignore[no-untyped-def]
  """Run the kernel's HIP source on the host; whether lanes 16-31 of a wave ever held other A or B elements than lanes 0-15."""
  src = HIPRenderer().render(k).replace("typedef float tt_c8 __attribute__((vector_size(32)));\n", "")
  src = src.replace("__attribute__((shared, aligned(16)))", "static __attribute__((aligned(16)))")  # one array for the block's threads
  name = re.search(r"amdgpu_flat_work_group_size\(1, \d+\)\)\) (\w+)\(", src).group(1)  # type: ignore[union-attr]
  blocks, threads = k.launch_dims
  ty = "unsigned short" if k.ast.dtype == dtypes.bfloat16 else "_Float16"  # the buffers' element type
  run = run_blocks_on_host(tmp_path, SHIM + src, blocks, threads,
                           f"thread_id = i; group_id = blk; {name}(({ty}*)out, (const {ty}*)a, (const {ty}*)b);", result="repeats_differ",
                           flags=["-Wno-attributes"])
  return run(out, *inputs)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ here to run the HIP source on the host")
@pytest.mark.parametrize("ta, tb, k, dtype, opts", CASES)
def test_wmma_source_multiplies_on_the_host(tmp_path, ta: bool, tb: bool, k: int, dtype, opts: list[Opt]) -> None:  # type: ignore[no-untyped-def]
  ast, a_np, b_np = _matmul(ta, tb, k, dtype)
  kernel = Kernel(ast, RDNA3).apply_opts(opts)
  assert kernel.tc is not None and not kernel.tc.mma
  bf16 = dtype == dtypes.bfloat16
  out = np.full(64 * 48, 0xffff, np.uint16) if bf16 else np.full(64 * 48, np.nan, np.float16)
  inputs = [np.ascontiguousarray(buf.numpy_view()) for buf in kernel.bufs]  # type: ignore[attr-defined]  # data1, data2 in order
  assert not _run_on_host(kernel, tmp_path, out, *inputs), "lanes 16-31 must repeat lanes 0-15's A and B"
  got = (out.astype(np.uint32) << 16).view(np.float32) if bf16 else out.astype(np.float32)
  ref = (a_np.T if ta else a_np) @ (b_np.T if tb else b_np)
  np.testing.assert_allclose(got.reshape(64, 48), ref, rtol=2e-2 if bf16 else 1e-2, atol=2e-2 if bf16 else 1e-2)


# ***** CDNA's MFMA: v_mfma_f32_16x16x16{f16,bf16_1k} across a 64-lane wavefront, emulated in NumPy *****
# From AMD's matrix instruction calculator (CDNA2, CDNA3): A[i][k] is in lane 16 (k / 4) + i, element k % 4 of its registers; B[k][j]
# in lane 16 (k / 4) + j, element k % 4; C[i][j] and D[i][j] in lane 16 (i / 4) + j, register i % 4.
I, J = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
L, R = np.meshgrid(np.arange(64), np.arange(4), indexing="ij")


def mfma_f32_16x16x16(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
  """D = A @ B + C for waves side by side: a, b (waves, 64, 4) of 16-bit floats' values and c (waves, 64, 4) floats in each lane's
  registers; each product exact in float32 (a 16-bit float's significand is 11 bits at most), summed in float32 in K's order."""
  A, B, D = a[:, 16 * (J // 4) + I, J % 4], b[:, 16 * (I // 4) + J, I % 4], c[:, 16 * (I // 4) + J, I % 4].astype(np.float32)
  for k in range(16): D = D + A[:, :, k, None] * B[:, None, k, :]
  return D[:, 4 * (L // 16) + R, L % 16]


def test_mfma_table_is_amds() -> None:
  """HIPRenderer.MATRIX's MFMA puts each element where AMD's calculator does (and its WMMA where the RDNA3 ISA does), for every lane."""
  lane, e = np.meshgrid(np.arange(64), np.arange(4), indexing="ij")
  assert MFMA.wave == 64 and MFMA.elements == 4 and MFMA.floats == 4 and not MFMA.lane_own()
  for got, want in [(MFMA.a_at(lane, e), (lane % 16, 4 * (lane // 16) + e)), (MFMA.b_at(lane, e), (4 * (lane // 16) + e, lane % 16)),
                    (MFMA.c_at(lane, e), (4 * (lane // 16) + e, lane % 16))]:
    assert all((g == w).all() for g, w in zip(got, want))
  wmma, lane, e = HIPRenderer.MATRIX["wmma"], *np.meshgrid(np.arange(32), np.arange(16), indexing="ij")
  assert wmma.lane_own() and all((g == w).all() for g, w in zip(wmma.a_at(lane, e), (lane % 16, e)))
  assert all((g == w).all() for g, w in zip(wmma.c_at(lane[:, :8], e[:, :8]), (2 * e[:, :8] + lane[:, :8] // 16, lane[:, :8] % 16)))


def test_mfma_multiplies_what_the_table_loads() -> None:
  """Registers filled by the renderer's table from A, B and C, multiplied as the instruction does, read back by the table: A @ B + C,
  exactly, as integers this small (in float16 and bfloat16 alike) make every product and sum; C read as if laid out as A is not."""
  rng = np.random.default_rng(1)
  A, B, C = (rng.integers(-8, 8, (3, 16, 16)).astype(np.float32) for _ in range(3))
  def regs(at: Callable[..., tuple[np.ndarray, np.ndarray]], M: np.ndarray) -> np.ndarray: return M[(slice(None), *at(L, R))]
  d, want = mfma_f32_16x16x16(regs(MFMA.a_at, A), regs(MFMA.b_at, B), regs(MFMA.c_at, C)), A @ B + C
  assert (d == regs(MFMA.c_at, want)).all() and not (d == regs(MFMA.a_at, want)).all()


# The MFMA builtins on the host: a wave's 64 threads meet, lane 0 gathers their registers as floats and NumPy multiplies them
# (mfma_f32_16x16x16 above, through a ctypes callback); the wave barrier is the block's
MFMA_SHIM = r"""
#include <barrier>
#include <cstring>
#include <thread>
#include <vector>
static thread_local int thread_id, group_id;
static std::barrier<>* block_sync;
#define __builtin_amdgcn_workitem_id_x() thread_id
#define __builtin_amdgcn_workgroup_id_x() group_id
#define __builtin_amdgcn_fence(order, scope)
#define __builtin_amdgcn_s_barrier() block_sync->arrive_and_wait()
#define __builtin_amdgcn_wave_barrier() block_sync->arrive_and_wait()
typedef float tt_c4 __attribute__((vector_size(16)));
static float wave_a[1024][4], wave_b[1024][4], wave_c[1024][4];
static void (*numpy_mfma)(float*, float*, float*);
extern "C" void set_mfma(void (*f)(float*, float*, float*)) { numpy_mfma = f; }
template <class V, class F> static tt_c4 host_mfma(V a, V b, tt_c4 c, F value) {
  int id = thread_id;
  for (int e = 0; e < 4; e++) wave_a[id][e] = value(a[e]), wave_b[id][e] = value(b[e]), wave_c[id][e] = c[e];
  block_sync->arrive_and_wait();
  if (id % 64 == 0) numpy_mfma(wave_a[id], wave_b[id], wave_c[id]);
  block_sync->arrive_and_wait();
  tt_c4 d;
  for (int e = 0; e < 4; e++) d[e] = wave_c[id][e];
  return d;
}
static float bf16_value(short x) { unsigned u = (unsigned)(unsigned short)x << 16; float f; memcpy(&f, &u, 4); return f; }
#define __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, c, cbsz, abid, blgp) host_mfma(a, b, c, [](_Float16 x) { return (float)x; })
#define __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, cbsz, abid, blgp) host_mfma(a, b, c, bf16_value)
"""
NUMPY_MFMA = ctypes.CFUNCTYPE(None, *[ctypes.POINTER(ctypes.c_float)] * 3)


def _mfma_on_host(k: Kernel, tmp_path, out: np.ndarray, *inputs: np.ndarray) -> int:  # type: ignore[no-untyped-def]
  """Run the kernel's HIP source on the host with NumPy's MFMA; how many MFMAs its waves made."""
  src = HIPRenderer().render(k).replace("typedef float tt_c4 __attribute__((vector_size(16)));\n", "")
  src = src.replace("__attribute__((shared, aligned(16)))", "static __attribute__((aligned(16)))")  # one array for the block's threads
  name = re.search(r"amdgpu_flat_work_group_size\(1, \d+\)\)\) (\w+)\(", src).group(1)  # type: ignore[union-attr]
  blocks, threads = k.launch_dims
  ty = "unsigned short" if k.ast.dtype == dtypes.bfloat16 else "_Float16"
  run = run_blocks_on_host(tmp_path, MFMA_SHIM + src, blocks, threads,
                           f"thread_id = i; group_id = blk; {name}(({ty}*)out, (const {ty}*)a, (const {ty}*)b);", flags=["-Wno-attributes"])
  calls = []
  def mfma(a, b, c) -> None:  # type: ignore[no-untyped-def]  # a wave's registers: row l of each (64, 4) array is lane l's
    regs = [np.ctypeslib.as_array(p, (64, 4)) for p in (a, b, c)]
    regs[2][:] = mfma_f32_16x16x16(regs[0][None], regs[1][None], regs[2][None])[0]
    calls.append(1)
  callback = NUMPY_MFMA(mfma)
  ctypes.CDLL(str(tmp_path / "k.so")).set_mfma(callback)
  run(out, *inputs)
  return len(calls)


CDNA_CASES = [  # (A transposed, B transposed, K, dtype, opts): as CASES, and a workgroup of 4 waves
  *CASES, (False, True, 64, dtypes.bfloat16, [Opt(OptOps.TC, 0, 0), Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.LOCAL, 1, 3), Opt(OptOps.UNROLL, 0, 4)])]


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ here to run the HIP source on the host")
@pytest.mark.parametrize("ta, tb, k, dtype, opts", CDNA_CASES)
def test_mfma_source_multiplies_on_the_host(tmp_path, ta: bool, tb: bool, k: int, dtype, opts: list[Opt]) -> None:  # type: ignore[no-untyped-def]
  ast, a_np, b_np = _matmul(ta, tb, k, dtype)
  kernel = Kernel(ast, CDNA3).apply_opts(opts)
  bf16 = dtype == dtypes.bfloat16
  out = np.full(64 * 48, 0xffff, np.uint16) if bf16 else np.full(64 * 48, np.nan, np.float16)
  inputs = [np.ascontiguousarray(buf.numpy_view()) for buf in kernel.bufs]  # type: ignore[attr-defined]  # data1, data2 in order
  assert _mfma_on_host(kernel, tmp_path, out, *inputs) == (64 // 16) * (48 // 16) * (k // 16)  # a call a 16x16x16 product
  got = (out.astype(np.uint32) << 16).view(np.float32) if bf16 else out.astype(np.float32)
  ref = (a_np.T if ta else a_np) @ (b_np.T if tb else b_np)
  np.testing.assert_allclose(got.reshape(64, 48), ref, rtol=2e-2 if bf16 else 1e-2, atol=2e-2 if bf16 else 1e-2)
