"""TC on AMD GPUs with no AMD GPU: which gfx targets take it (RDNA3's WMMA) and why the others refuse it; the HIP source compiled by clang
for gfx1100 into v_wmma instructions; and that source run on the host, as test_mma_on_host runs CUDA's, with one host thread per GPU
thread and the WMMA builtins written here from AMD's documented lane layout, apart from the renderer's."""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
from ops_support import hip_clang, hip_flags, run_blocks_on_host

from tinytune import Kernel, KernelOptError, Opt, OptOps, Tensor, dtypes
from tinytune.codegen.caps import amd_caps
from tinytune.codegen.cstyle import HIPRenderer
from tinytune.codegen.heuristic import hand_coded_optimizations
from tinytune.engine.schedule import create_schedule

RDNA3 = amd_caps("gfx1100")


def _matmul(ta: bool, tb: bool, k: int, dtype=dtypes.float16, seed: int = 0):  # type: ignore[no-untyped-def]
  """A (64, k) @ (k, 48) matmul's kernel (A or B stored transposed) with its inputs as float32 arrays of the dtype's values."""
  rng = np.random.default_rng(seed)
  a_np, b_np = (rng.standard_normal(s).astype(np.float32) for s in ((k, 64) if ta else (64, k), (48, k) if tb else (k, 48)))
  a, b = Tensor(a_np).cast(dtype).realize(), Tensor(b_np).cast(dtype).realize()
  (item,), _ = create_schedule(((a.T if ta else a) @ (b.T if tb else b)).uop, "CPU")
  return item.ast, a.float().numpy(), b.float().numpy()


@pytest.mark.parametrize("arch, ok", [("gfx1100", True), ("gfx1101", True), ("gfx1151", True), ("gfx90a", False), ("gfx942:sramecc+:xnack-", False),
                                      ("gfx1030", False), ("gfx1201", False), ("gfx906", False)])
def test_amd_archs_with_tensor_cores(arch: str, ok: bool) -> None:
  caps = amd_caps(arch)
  assert caps.has_local and caps.tc_args == (0,) and bool(caps.tensor_cores) == ok and bool(caps.no_tc) != ok
  ast, *_ = _matmul(False, False, 32)
  if ok: assert Kernel(ast, caps).apply_opt(Opt(OptOps.TC, 0, 0)) is None
  else:
    with pytest.raises(KernelOptError, match=re.escape(caps.no_tc)): Kernel(ast, caps).apply_opt(Opt(OptOps.TC, 0, 0))


def test_cdna_refuses_tc_saying_why() -> None:
  ast, *_ = _matmul(False, False, 32)
  with pytest.raises(KernelOptError, match="gfx90a \\(CDNA\\) would be MFMA, which works across 64-lane wavefronts"):
    Kernel(ast, amd_caps("gfx90a")).apply_opt(Opt(OptOps.TC, 0, 0))
  assert not any(o.op is OptOps.TC for o in hand_coded_optimizations(Kernel(ast, amd_caps("gfx942"))))


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


@pytest.mark.skipif(hip_clang("gfx1100") is None, reason="no clang that compiles HIP for gfx1100: the WMMA source is not compile-checked here")
def test_wmma_source_compiles_for_gfx1100(tmp_path) -> None:  # type: ignore[no-untyped-def]
  for i, (ta, tb, k, dtype, opts) in enumerate([*CASES, (False, False, 256, dtypes.float16, None)]):
    ast, *_ = _matmul(ta, tb, k, dtype)
    kernel = Kernel(ast, RDNA3).apply_opts(hand_coded_optimizations(Kernel(ast, RDNA3)) if opts is None else opts)
    (tmp_path / f"k{i}.hip").write_text(HIPRenderer().render(kernel))
    res = subprocess.run([str(hip_clang("gfx1100")), *hip_flags("gfx1100"), f"k{i}.hip", "-o", f"k{i}.s"], cwd=tmp_path, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr[:3000]
    ty = "bf16" if dtype == dtypes.bfloat16 else "f16"
    assert f"v_wmma_f32_16x16x16_{ty}" in (tmp_path / f"k{i}.s").read_text(), kernel.opts


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
