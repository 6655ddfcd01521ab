"""TC's arg 1 (PTX mma.sync) run on the host: the CUDA source the renderer writes, compiled as C++ with one host thread per GPU thread,
where tt_mma is a warp's m16n8k16 and tt_ldmatrix_x4 a warp's ldmatrix .x4 as the PTX ISA lays their fragments out across lanes. It
checks the renderer's own text (each lane's loads or row addresses, the pairs in each register, the two halves of a 16x16 tile, the
stores of C) with no GPU; where there is one, the same kernels run on it."""
from __future__ import annotations

import re
import shutil
from typing import Sequence

import numpy as np
import pytest
from ops_support import run_blocks_on_host

from tinytune import Kernel, KernelOptError, Opt, OptOps, Tensor, dtypes
from tinytune.codegen.cstyle import CUDARenderer
from tinytune.engine import compile_kernel
from tinytune.engine.schedule import ScheduleItem, create_schedule
from tinytune.runtime import Device, DeviceCaps, device_status

H100_TC = DeviceCaps(has_local=True, threads=1, max_upcast=256, simd_width=4, vector_registers=255, max_local=1024, shared_bytes=48 * 1024,
                     tensor_cores=("float16", "bfloat16"))

# a block's threads in lock step at each warp-wide call; lane 4 g + t of a warp holds A's pairs at (g, 2t), (g+8, 2t), (g, 2t+8), (g+8, 2t+8),
# B's at (2t, g), (2t+8, g) (each pair the next along K), and C's floats at (g, 2t + e), (g+8, 2t + e)
SHIM = r"""
#include <atomic>
#include <barrier>
#include <cstring>
#include <thread>
#include <vector>
typedef _Float16 half;
// the shared-memory addresses of each warp-wide access, for the bank-conflict count: ldmatrix's 32 rows (lane order) and each thread's
// cp.asyncs in turn (block, thread, its count so far, bytes, address)
static std::atomic<int> tt_nrows, tt_ncopies; static long tt_rows[1 << 20], tt_copies[5 << 20]; static thread_local long tt_seq;
struct dim { int x; };
static thread_local dim threadIdx, blockIdx;
static std::barrier<>* block_sync;
#define __global__
#define __device__
#define __launch_bounds__(n)
#define __restrict__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
static inline float __half2float(half h) { return (float)h; }
static inline half __float2half_rn(float f) { return (half)f; }
static void __syncwarp() { block_sync->arrive_and_wait(); }
static void __syncthreads() { block_sync->arrive_and_wait(); }
static float* lane_c[1024]; static const unsigned *lane_a[1024], *lane_b[1024];
static float part(unsigned r, int e) { unsigned short u = e ? r >> 16 : r & 0xffff; half h; memcpy(&h, &u, 2); return (float)h; }
static void tt_mma(float* c, const unsigned* a, const unsigned* b) {
  int id = threadIdx.x;
  lane_c[id] = c, lane_a[id] = a, lane_b[id] = b;
  block_sync->arrive_and_wait();
  if (id % 32 == 0) {
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
      int g = l / 4, t = l % 4;
      const unsigned *ra = lane_a[id + l], *rb = lane_b[id + l];
      for (int e = 0; e < 2; e++) {
        A[g][2*t+e] = part(ra[0], e), A[g+8][2*t+e] = part(ra[1], e), A[g][2*t+8+e] = part(ra[2], e), A[g+8][2*t+8+e] = part(ra[3], e);
        B[2*t+e][g] = part(rb[0], e), B[2*t+8+e][g] = part(rb[1], e);
        C[g][2*t+e] = lane_c[id + l][e], C[g+8][2*t+e] = lane_c[id + l][2+e];
      }
    }
    for (int l = 0; l < 32; l++) {
      int g = l / 4, t = l % 4;
      for (int e = 0; e < 2; e++) {
        float s0 = C[g][2*t+e], s1 = C[g+8][2*t+e];
        for (int k = 0; k < 16; k++) s0 += A[g][k] * B[k][2*t+e], s1 += A[g+8][k] * B[k][2*t+e];
        lane_c[id + l][e] = s0, lane_c[id + l][2+e] = s1;
      }
    }
  }
  block_sync->arrive_and_wait();
}
// ldmatrix .x4 as the PTX ISA has it: lane 8 q + e gives the address of row e of matrix q (16 bytes, 16-byte aligned), and lane 4 r + w
// receives matrix q's elements (r, 2w) and (r, 2w+1) in register q, the first in the low half; .trans loads the matrix column-major, so
// the lane receives (2w, r) and (2w+1, r) of the rows as they are in memory
static const unsigned short* lane_row[1024]; static unsigned* lane_d[1024]; static int misaligned_rows;
static void ldmatrix_x4(unsigned* d, const void* row, bool trans) {
  int id = threadIdx.x;
  lane_row[id] = (const unsigned short*)row, lane_d[id] = d;
  block_sync->arrive_and_wait();
  if (id % 32 == 0) {
    int at = tt_nrows.fetch_add(32);
    if (at + 32 <= (1 << 20)) for (int l = 0; l < 32; l++) tt_rows[at + l] = (long)lane_row[id + l];
  }
  if (id % 32 == 0)
    for (int q = 0; q < 4; q++) {
      const unsigned short* const* m = lane_row + id + 8 * q;
      for (int e = 0; e < 8; e++) misaligned_rows += (size_t)m[e] % 16 != 0;
      for (int l = 0; l < 32; l++) {
        int r = l / 4, w = l % 4;
        unsigned lo = trans ? m[2*w][r] : m[r][2*w], hi = trans ? m[2*w+1][r] : m[r][2*w+1];
        lane_d[id + l][q] = lo | hi << 16;
      }
    }
  block_sync->arrive_and_wait();
}
static void tt_ldmatrix_x4(unsigned* d, const void* row) { ldmatrix_x4(d, row, false); }
static void tt_ldmatrix_x4_trans(unsigned* d, const void* row) { ldmatrix_x4(d, row, true); }
// cp.async as a copy deferred to the thread's wait_group that leaves at most N of its later groups pending (the latest a GPU may land it):
// a read of a tile its thread has not waited for sees the tile's old contents. -DTT_EAGER lands each copy at once (the earliest).
struct tt_copy { void* dst; const void* src; int n; bool full; };
static thread_local std::vector<std::vector<tt_copy>> tt_groups; static thread_local std::vector<tt_copy> tt_open;
static void tt_land(const tt_copy& c) { if (c.full) memcpy(c.dst, c.src, c.n); else memset(c.dst, 0, c.n); }
static int misaligned_copies;
template <int N> static void tt_cp_async(void* dst, const void* src, bool full) {
  static_assert(N == 4 || N == 8 || N == 16, "cp.async copies 4, 8 or 16 bytes");
  misaligned_copies += (size_t)dst % N != 0 || (size_t)src % N != 0;
  int at = tt_ncopies.fetch_add(5);
  long entry[5] = {blockIdx.x, threadIdx.x, tt_seq++, N, (long)dst};
  if (at + 5 <= (5 << 20)) memcpy(tt_copies + at, entry, sizeof entry);
#ifdef TT_EAGER
  tt_land({dst, src, N, full});
#else
  tt_open.push_back({dst, src, N, full});
#endif
}
static void tt_cp_commit() { tt_groups.push_back(tt_open); tt_open.clear(); }
template <int N> static void tt_cp_wait() {
  while (tt_groups.size() > N) { for (auto& c : tt_groups.front()) tt_land(c); tt_groups.erase(tt_groups.begin()); }
}
struct float4 { float x, y, z, w; };
static float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
extern "C" int rows_logged(long* out) { int n = tt_nrows; memcpy(out, tt_rows, sizeof(long) * n); return n; }
extern "C" int copies_logged(long* out) { int n = tt_ncopies; memcpy(out, tt_copies, sizeof(long) * n); return n; }
"""


def host_source(k: Kernel) -> str:
  """The kernel's CUDA source without the device code that SHIM stands in for: its PTX helpers (mma.sync, ldmatrix, cp.async)."""
  src = CUDARenderer().render(k)
  src = re.sub(r"(template <int N> )?static __device__ inline void tt_(mma|ldmatrix_x4\w*|cp_\w+)\(.*?\); }\n", "", src, flags=re.S)
  return src.replace("#include <cuda_fp16.h>\n", "")


def _run_on_host(k: Kernel, tmp_path, out: np.ndarray, *inputs: np.ndarray, src: str | None = None, flags: Sequence[str] = ()) -> str:  # type: ignore[no-untyped-def]
  """Runs the kernel's CUDA source (or `src`) on the host and returns it; fails where an ldmatrix row or a cp.async was misaligned."""
  src = src or host_source(k)
  name = re.search(r"__launch_bounds__\(\d+\) (\w+)\(", src).group(1)  # type: ignore[union-attr]
  blocks, threads = k.launch_dims
  ty = "float" if k.ast.dtype == dtypes.float32 else "half"
  body = f"threadIdx.x = i; blockIdx.x = blk; {name}(({ty}*)out, (const {ty}*)a, (const {ty}*)b);"
  run = run_blocks_on_host(tmp_path, SHIM + src, blocks, threads, body, result="misaligned_rows * 1000 + misaligned_copies", flags=flags)
  assert run(out, *inputs) == 0, "misaligned ldmatrix rows or cp.async copies"
  return src


CASES = [
  (False, False, 32, [Opt(OptOps.TC, 0, 1), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.LOCAL, 1, 3), Opt(OptOps.UNROLL, 0, 2)]),
  (False, True, 32, [Opt(OptOps.TC, 0, 1), Opt(OptOps.LOCAL, 1, 3), Opt(OptOps.UPCAST, 0, 2)]),
  (True, False, 32, [Opt(OptOps.TC, 0, 1), Opt(OptOps.UPCAST, 1, 3)]),
  (True, True, 32, [Opt(OptOps.TC, 0, 1), Opt(OptOps.SWAP, 0, 1)]),
  # STAGE: the workgroup's tiles of A (stored transposed, rows padded) and B in shared memory, each K tile between two barriers
  (False, False, 96, [Opt(OptOps.TC, 0, 1), Opt(OptOps.STAGE, 0, 2), Opt(OptOps.LOCAL, 1, 3), Opt(OptOps.UPCAST, 0, 2)]),
  (True, True, 64, [Opt(OptOps.TC, 0, 1), Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.STAGE, 0, 2), Opt(OptOps.UPCAST, 1, 3)]),
  # PREFETCH: the first K tile copied before the loop, each next one loaded during the compute and stored after it
  (False, True, 96, [Opt(OptOps.TC, 0, 1), Opt(OptOps.STAGE, 0, 2), Opt(OptOps.PREFETCH, 0, 0), Opt(OptOps.LOCAL, 1, 3)])]


def _case(ta: bool, tb: bool, k: int, opts: list[Opt], device: str, caps: DeviceCaps) -> tuple[Kernel, ScheduleItem, np.ndarray]:
  """(A.T if ta else A) @ (B.T if tb else B), 64x48 float16 with K = k, as a kernel with `opts`, its schedule item, and NumPy's product."""
  rng = np.random.default_rng(0)
  a_np, b_np = (rng.standard_normal(s).astype(np.float16) for s in ((k, 64) if ta else (64, k), (48, k) if tb else (k, 48)))
  a, b = Tensor(a_np, device=device).cast(dtypes.float16).realize(), Tensor(b_np, device=device).cast(dtypes.float16).realize()
  (item,), _ = create_schedule(((a.T if ta else a) @ (b.T if tb else b)).uop, device)
  kernel = Kernel(item.ast, caps).apply_opts(opts)
  assert kernel.tc is not None and kernel.tc.mma
  return kernel, item, (a_np.T if ta else a_np).astype(np.float32) @ (b_np.T if tb else b_np).astype(np.float32)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ here to run the CUDA source on the host")
@pytest.mark.parametrize("ta, tb, k, opts", CASES)
def test_mma_sync_source_multiplies_on_the_host(tmp_path, ta: bool, tb: bool, k: int, opts: list[Opt]) -> None:  # type: ignore[no-untyped-def]
  kernel, _, ref = _case(ta, tb, k, opts, "CPU", H100_TC)
  out = np.full(64 * 48, np.nan, np.float16)
  src = _run_on_host(kernel, tmp_path, out, *(buf.numpy_view() for buf in kernel.bufs))  # type: ignore[attr-defined]  # data1, data2 in order
  # STAGE's tiles in shared memory (K outer: A column-major, B row-major) are read by ldmatrix .trans, global memory by each lane's loads
  assert ("tt_ldmatrix_x4" in src[src.index('extern "C"'):]) == any(o.op is OptOps.STAGE for o in opts)
  np.testing.assert_allclose(out.reshape(64, 48).astype(np.float32), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(device_status("CUDA") is not None, reason=f"CUDA: {device_status('CUDA')}")
@pytest.mark.parametrize("ta, tb, k, opts", CASES)
def test_mma_sync_multiplies_on_a_cuda_gpu(ta: bool, tb: bool, k: int, opts: list[Opt]) -> None:
  """The same kernels on an NVIDIA GPU (sm_80 or later), where the hardware's mma.sync and ldmatrix check the host's."""
  kernel, item, ref = _case(ta, tb, k, opts, "CUDA", Device["CUDA"].caps)
  program, _ = compile_kernel(kernel, "CUDA")
  program(item.out, *kernel.bufs)
  np.testing.assert_allclose(item.out.numpy_view().reshape(64, 48).astype(np.float32), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ here to run the CUDA source on the host")
def test_tc_epilogue_reading_another_input_per_tile(tmp_path) -> None:  # type: ignore[no-untyped-def]
  """What follows the sum (here + a bias per column) is lowered once per accumulator tile in a loop over the tile's rows: a bias read
  in one tile's loop is read again in the next tile's of the same columns, not taken from a loop that has ended."""
  rng = np.random.default_rng(1)
  a_np, b_np, c_np = (rng.standard_normal(shape).astype(np.float16) for shape in ((64, 32), (32, 48), 48))
  a, b, c = (Tensor(x, device="CPU").cast(dtypes.float16).realize() for x in (a_np, b_np, c_np))
  (item,), _ = create_schedule((a @ b + c).uop, "CPU")
  kernel = Kernel(item.ast, H100_TC).apply_opts([Opt(OptOps.TC, 0, 1), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.LOCAL, 1, 3)])
  src = CUDARenderer().render(kernel)
  src = re.sub(r"static __device__ inline void tt_(mma|ldmatrix_x4\w*)\(.*?\); }\n", "", src, flags=re.S).replace("#include <cuda_fp16.h>\n", "")
  name = re.search(r"__launch_bounds__\(\d+\) (\w+)\(", src).group(1)  # type: ignore[union-attr]
  args = ", ".join(["(half*)out", *(f"(const half*){x}" for x in ("a", "b", "c"))])
  run = run_blocks_on_host(tmp_path, SHIM + src, *kernel.launch_dims, f"threadIdx.x = i; blockIdx.x = blk; {name}({args});", result="misaligned_rows",
                           inputs=("a", "b", "c"))
  out = np.full(64 * 48, np.nan, np.float16)
  assert run(out, *(buf.numpy_view() for buf in kernel.bufs)) == 0  # type: ignore[attr-defined]
  ref = a_np.astype(np.float32) @ b_np.astype(np.float32) + c_np.astype(np.float32)
  np.testing.assert_allclose(out.reshape(64, 48).astype(np.float32), ref, rtol=1e-2, atol=2e-2)


def test_tc_accumulators_past_the_register_file_are_refused() -> None:
  """Each 16x16 accumulator tile takes 8 registers of every thread of its warp: 32 tiles (256 registers) cannot fit sm_90's 255, and
  such a candidate spilled and took 38 s to compile (4096^3 float16 with 128 tiles, loaded Zen 4)."""
  a, b = (Tensor.empty(512, 512, dtype=dtypes.float16, device="CPU").realize() for _ in range(2))
  (item,), _ = create_schedule((a @ b).uop, "CPU")
  k = Kernel(item.ast, H100_TC).apply_opts([Opt(OptOps.TC, 0, 1), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4)])  # 16 tiles
  with pytest.raises(KernelOptError, match="TC's accumulators would take 256 registers a thread, over 255"): k.apply_opt(Opt(OptOps.UPCAST, 0, 2))
