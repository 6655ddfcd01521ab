"""sm_90a's warpgroup MMA (PTX wgmma) from shared memory: EMU's semantics of the instruction (runtime/emu_tc.py: matrix descriptors
decoded as the PTX ISA's "Matrix Descriptor Format" packs them, the unswizzled core-matrix layout, the f32 accumulator's registers per
lane), checked against the ISA's figures and NumPy; the CUDA renderer's wgmma prelude (CUDARenderer.wgmma_prelude): its descriptor
packed on the host and decoded by EMU, a kernel of it compiled by nvcc for sm_90a, and run on an sm_90 GPU where there is one."""
from __future__ import annotations

import ctypes
import random
import re
import shutil
import subprocess
import zlib

import numpy as np
import pytest
from conftest import emu_arch

from tinytune import Device, Kernel, KernelOptError, Opt, OptOps, Tensor
from tinytune.codegen.cstyle import CUDARenderer, dynamic_shared
from tinytune.codegen.lower import LinearProgram, lower, stmt
from tinytune.dtype import DType, dtypes
from tinytune.engine.schedule import create_schedule
from tinytune.runtime.emu import EmuError, EMUProgram, dump, load
from tinytune.runtime.emu_tc import bits_of, d_at, wgmma_descriptor, wgmma_m64nNk16, wgmma_operand
from tinytune.uop import Ops

LANES = np.arange(128)


def pack(start: int, lbo: int, sbo: int, base: int = 0, swizzle: int = 0) -> int:
  """A descriptor packed by the ISA's table: bits 0-13 start >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4,
  49-51 base offset, 62-63 swizzle mode."""
  return start >> 4 | (lbo >> 4) << 16 | (sbo >> 4) << 32 | base << 49 | swizzle << 62


def place(smem: np.ndarray, start: int, lbo: int, sbo: int, bits: np.ndarray) -> None:
  """Write a rows x 16 K-major matrix of 16-bit elements into `smem` (bytes) in the ISA's unswizzled canonical layout: core matrix
  (i along M or N, j along K) of 8 rows x 8 elements at start + i sbo + j lbo, its rows 16 bytes apart, each row's elements 2 apart."""
  for r in range(bits.shape[0]):
    for k in range(16):
      at = start + r // 8 * sbo + k // 8 * lbo + r % 8 * 16 + k % 8 * 2
      smem[at], smem[at + 1] = bits[r, k] & 0xFF, bits[r, k] >> 8


def test_descriptor_fields_are_the_isas() -> None:
  desc = 0x40 | 0x12 << 16 | 0x345 << 32 | 5 << 49 | 1 << 62
  assert wgmma_descriptor(desc) == {"start": 0x400, "lbo": 0x120, "sbo": 0x3450, "base": 5, "swizzle": "128B"}
  assert wgmma_descriptor(pack(0x3FFF0, 16, 0x3FFF0)) == {"start": 0x3FFF0, "lbo": 16, "sbo": 0x3FFF0, "base": 0, "swizzle": "none"}


def test_accumulator_layout_is_the_isas() -> None:
  """Spot checks read off the ISA's figure for wgmma .m64nNk16's D: warp w of the warpgroup holds rows 16 w to 16 w + 15; lane 4 g + t
  of it d0, d1 at row g, columns 2 t and 2 t + 1, d2, d3 at row g + 8, and the next four registers 8 columns on."""
  assert [d_at(0, i) for i in range(6)] == [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9)]
  assert [d_at(37, i) for i in (0, 3)] == [(17, 2), (25, 3)]  # warp 1, g 1, t 1
  assert [d_at(127, i) for i in (0, 3, 126, 127)] == [(55, 6), (63, 7), (63, 254), (63, 255)]
  rows, cols = d_at(LANES[:, None], np.arange(128)[None, :])  # n = 256: each element of the 64 x 256 tile once
  assert len(set(zip(rows.ravel().tolist(), cols.ravel().tolist()))) == 64 * 256


LAYOUTS = [(128, 256), (1024, 128), (2048, 1024 + 256)]  # (leading, stride) byte offsets: K's 2 core matrices apart, or after M's


@pytest.mark.parametrize("n", [8, 16, 64, 256])
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
def test_wgmma_multiplies_shared_tiles(n: int, dt: DType, layout: int) -> None:
  """Integers small enough that every product and sum is exact: D = A @ B + C with A (64 x 16, in one of LAYOUTS) and B (as n x 16,
  K-major, its N core matrices side by side, then a gap and K's) laid out in shared memory by the ISA's canonical layout at the descriptors'
  offsets, C and D spread over the warpgroup's lanes by the ISA's figure; scale-d 0 drops C. The same bytes named with either operand's
  two offsets swapped give other products."""
  rng = np.random.default_rng(n + layout)
  A, Bt, C = (rng.integers(-8, 8, s).astype(np.float32) for s in ((64, 16), (n, 16), (64, n)))
  (lbo, sbo), (lbo_b, sbo_b) = LAYOUTS[layout], (n * 16 + 256, 128)
  smem = np.zeros(1 << 18, np.uint8)  # what the descriptor's 14 bits of start >> 4 reach
  sa, sb = 48, 0x8000 + 16  # any 16-byte aligned start
  place(smem, sa, lbo, sbo, bits_of(A, dt))
  place(smem, sb, lbo_b, sbo_b, bits_of(Bt, dt))
  lane, i = LANES[:, None], np.arange(n // 2)[None, :]
  c, da, db = C[d_at(lane, i)], pack(sa, lbo, sbo), pack(sb, lbo_b, sbo_b)
  d = wgmma_m64nNk16(c, smem, da, db, dt)
  np.testing.assert_array_equal(d, (A @ Bt.T + C)[d_at(lane, i)])
  np.testing.assert_array_equal(wgmma_m64nNk16(c, smem, da, db, dt, scale_d=False), (A @ Bt.T)[d_at(lane, i)])
  assert not np.array_equal(wgmma_m64nNk16(c, smem, pack(sa, sbo, lbo), db, dt), d)
  assert not np.array_equal(wgmma_m64nNk16(c, smem, da, pack(sb, sbo_b, lbo_b), dt), d)


def test_wgmma_sums_in_float32() -> None:
  """Products exact in float32 (from float16), summed in float32: 2^-24 is lost beside 1 as float32 loses it."""
  smem = np.zeros(4096, np.uint8)
  A, Bt = np.zeros((64, 16), np.float32), np.zeros((8, 16), np.float32)
  A[0, 0], A[0, 1], Bt[0, :2] = 2.0 ** -12, 1.0, [2.0 ** -12, 1.0]
  place(smem, 0, 128, 256, bits_of(A, dtypes.float16))
  place(smem, 2048, 128, 256, bits_of(Bt, dtypes.float16))
  d = wgmma_m64nNk16(np.zeros((128, 4), np.float32), smem, pack(0, 128, 256), pack(2048, 128, 256), dtypes.float16)
  assert d[0, 0] == np.float32(2.0 ** -24) + np.float32(1.0) == 1.0


def test_wgmma_refusals() -> None:
  smem = np.zeros(4096, np.uint8)
  with pytest.raises(ValueError, match="unswizzled layout"): wgmma_operand(smem, pack(0, 128, 256, swizzle=1), 64)
  with pytest.raises(ValueError, match="unswizzled layout"): wgmma_operand(smem, pack(0, 128, 256, base=1), 64)
  with pytest.raises(ValueError, match="past shared memory"): wgmma_operand(smem, pack(2048, 128, 512), 64)
  with pytest.raises(ValueError, match="multiple of 8 from 8 to 256"): wgmma_m64nNk16(np.zeros((128, 6)), smem, 0, 0, dtypes.float16)


def test_operand_reads_the_isas_core_matrices() -> None:
  """Element (r, k) of the operand is the 16-bit word at start + (r / 8) sbo + (k / 8) lbo + 16 (r % 8) + 2 (k % 8), little-endian."""
  smem = (np.arange(8192) % 251).astype(np.uint8)
  got = wgmma_operand(smem, pack(256, 1024, 128), 64)
  for r, k in ((0, 0), (7, 7), (8, 0), (0, 8), (63, 15), (21, 10)):
    at = 256 + r // 8 * 128 + k // 8 * 1024 + r % 8 * 16 + k % 8 * 2
    assert got[r, k] == int(smem[at]) | int(smem[at + 1]) << 8, (r, k)


# ***** the renderer's prelude *****

def desc_function() -> str:
  prelude = CUDARenderer().wgmma_prelude(dtypes.float16, 16)
  return prelude[:prelude.index("}\n") + 2]


def test_renderers_descriptor_is_the_isas(tmp_path) -> None:  # type: ignore[no-untyped-def]
  """tt_wgmma_desc, built with g++ on the host, packs the fields where EMU's decoder (the ISA's table) reads them: a descriptor whose
  offsets were swapped or misplaced decodes to other fields."""
  if shutil.which("g++") is None: pytest.skip("g++ is not installed: the renderer's descriptor is not evaluated on the host")
  (tmp_path / "d.cpp").write_text(desc_function().replace(CUDARenderer.func_prefix, 'extern "C"', 1))
  build = subprocess.run(["g++", "-O1", "-shared", "-fPIC", "d.cpp", "-o", "d.so"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
  assert build.returncode == 0, build.stderr
  fn = ctypes.CDLL(str(tmp_path / "d.so")).tt_wgmma_desc
  fn.restype, fn.argtypes = ctypes.c_uint64, [ctypes.c_uint32] * 3
  for addr, lbo, sbo in ((0, 128, 256), (0x1230, 2048, 16), (0x3FFF0, 0x3FFF0, 128)):
    assert wgmma_descriptor(fn(addr, lbo, sbo)) == {"start": addr, "lbo": lbo, "sbo": sbo, "base": 0, "swizzle": "none"}


def test_mma_store_places_wgmmas_accumulator() -> None:
  """The mma.sync epilogue's store (each warp's 16 x 16 of C into its 256 floats of `tiles`), evaluated for every lane of a warpgroup,
  puts register i of a m64n16k16 wgmma's D where the ISA's figure has it, warp w's tile being rows 16 w to 16 w + 15."""
  text = CUDARenderer().mma(None, None, "store", [0])  # type: ignore[arg-type]
  stores = re.findall(r"tiles\[(.*?)\] = acc0\[(.*?)\];", text)
  assert len(stores) == 2
  env = {"mg": LANES % 32 // 4, "mt": LANES % 4, "warp": LANES // 32}
  seen = 0
  for h in range(2):
    for e in range(2):
      for at, reg in stores:
        where, i = eval(at, {**env, "h": h, "e": e}), eval(reg, {"h": h, "e": e})
        row, col = d_at(LANES, i)
        assert (where == LANES // 32 * 256 + (row % 16) * 16 + col).all() and (row // 16 == LANES // 32).all(), (at, reg)
        seen += 1
  assert seen == 8


def kernel_source(dt: DType, n: int, lbo: int, sbo: int) -> str:
  """One warpgroup: A (64 x 16, row major) and B (16 x n, column major: n rows of K) into shared memory in the unswizzled layout with
  these offsets, one wgmma, D stored per lane (register i of lane l at out[l n / 2 + i])."""
  ty = "half" if dt == dtypes.float16 else "__nv_bfloat16"
  def fill(name: str, rows: int) -> str:
    return (f"  for (int e = threadIdx.x; e < {rows * 16}; e += 128) {{ int r = e / 16, k = e % 16; "
            f"{name}[(r / 8 * {sbo} + k / 8 * {lbo} + r % 8 * 16 + k % 8 * 2) / 2] = {name}_in[e]; }}\n")
  size_a, size_b = (7 * sbo + lbo + 128) // 2, ((n // 8 - 1) * sbo + lbo + 128) // 2
  return ("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n" + CUDARenderer().wgmma_prelude(dt, n)
          + f'extern "C" __global__ void __launch_bounds__(128) k(float* out, const {ty}* a_in, const {ty}* b_in) {{\n'
          f"  __shared__ __align__(128) {ty} a[{size_a}], b[{size_b}];\n" + fill("a", 64) + fill("b", n)
          + f"  tt_wgmma_proxy();\n  __syncthreads();\n  float d[{n // 2}] = {{}};\n  tt_wgmma_fence();\n"
          f"  tt_wgmma_m64n{n}k16(d, tt_wgmma_desc((unsigned)__cvta_generic_to_shared(a), {lbo}, {sbo}), "
          f"tt_wgmma_desc((unsigned)__cvta_generic_to_shared(b), {lbo}, {sbo}));\n"
          f"  tt_wgmma_wait();\n  for (int i = 0; i < {n // 2}; i++) out[threadIdx.x * {n // 2} + i] = d[i];\n}}\n")


KERNELS = [(dtypes.float16, 16, 128, 256), (dtypes.bfloat16, 64, 1024, 128), (dtypes.float16, 256, 128, 256)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: the wgmma prelude is not compile-checked here")
@pytest.mark.parametrize("dt, n, lbo, sbo", KERNELS)
def test_wgmma_prelude_compiles_for_sm_90a(tmp_path, dt: DType, n: int, lbo: int, sbo: int) -> None:  # type: ignore[no-untyped-def]
  """ptxas takes the prelude's wgmma, fence and commit/wait for sm_90a, and refuses them for sm_90 (wgmma is sm_90a's alone)."""
  (tmp_path / "k.cu").write_text(kernel_source(dt, n, lbo, sbo))
  def nvcc(arch: str) -> subprocess.CompletedProcess:
    return subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "k.cu"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert (res := nvcc("sm_90a")).returncode == 0, res.stderr[-3000:]
  assert (res := nvcc("sm_90")).returncode != 0 and "wgmma" in res.stderr


def sm_90_gpu() -> str | None:
  """Why the hardware check is skipped, or None on a CUDA GPU of compute capability 9.0."""
  from tinytune.runtime import Device, device_status
  if (why := device_status("CUDA")) is not None: return why
  return None if Device["CUDA"].arch == "sm_90" else f"wgmma needs an sm_90 GPU, not {Device['CUDA'].arch}"


@pytest.mark.skipif((why := sm_90_gpu()) is not None, reason=str(why))
@pytest.mark.parametrize("dt, n, lbo, sbo", KERNELS)
def test_wgmma_on_the_gpu_is_emus(dt: DType, n: int, lbo: int, sbo: int) -> None:
  """On an H100/H200 the kernel's D, lane by lane, is EMU's wgmma of the same shared bytes and A @ B: EMU's descriptor decoding, core
  matrices and D layout checked against the hardware."""
  from tinytune.runtime import Buffer, Device
  from tinytune.runtime.cuda import _nvrtc
  rng = np.random.default_rng(n)
  A, Bt = (rng.integers(-8, 8, s).astype(np.float32) for s in ((64, 16), (n, 16)))
  dev = Device["CUDA"]
  out, a, b = Buffer("CUDA", 128 * n // 2, dtypes.float32), Buffer("CUDA", A.size, dt), Buffer("CUDA", Bt.size, dt)
  a.copyin(A), b.copyin(Bt)  # small integers: exact in both dtypes
  dev.program("k", _nvrtc(kernel_source(dt, n, lbo, sbo), "sm_90a"), (1, 128))(out, a, b)
  dev.synchronize()
  got = out.numpy_view().reshape(128, n // 2)
  smem = np.zeros(1 << 16, np.uint8)
  place(smem, 0, lbo, sbo, bits_of(A, dt))
  place(smem, 1 << 15, lbo, sbo, bits_of(Bt, dt))
  emu = wgmma_m64nNk16(np.zeros((128, n // 2), np.float32), smem, pack(0, lbo, sbo), pack(1 << 15, lbo, sbo), dt)
  np.testing.assert_array_equal(got, emu)
  np.testing.assert_array_equal(got, (A @ Bt.T)[d_at(LANES[:, None], np.arange(n // 2)[None, :])])


# ***** TC's arg 2: the renderer's wgmma kernels on EMU (sm_90's caps) *****

def matmul(dt: DType, ta: bool, tb: bool, m: int, n: int, k: int) -> tuple[Tensor, np.ndarray]:
  rng = np.random.default_rng(m + n + k)
  A, B = rng.standard_normal((k, m) if ta else (m, k)).astype(dt.np), rng.standard_normal((n, k) if tb else (k, n)).astype(dt.np)
  a, b = Tensor(A, device="EMU"), Tensor(B, device="EMU")
  A, B = A.astype(np.float32), B.astype(np.float32)
  return (a.T if ta else a) @ (b.T if tb else b), (A.T if ta else A) @ (B.T if tb else B)


def tc2_kernel(out: Tensor, opts: list[Opt]) -> tuple[Kernel, object]:
  (item,), _ = create_schedule(out.uop, "EMU")
  return Kernel(item.ast, Device["EMU"].caps).apply_opts([Opt(OptOps.TC, 0, 2), *opts]), item.out


def run_emu(kernel: Kernel, out: object) -> np.ndarray:
  dev = Device["EMU"]
  dev.program(kernel.name, dev.compile(dev.renderer.render(kernel)), kernel.launch_dims)(out, *kernel.bufs)
  return out.numpy_view().astype(np.float32)  # type: ignore[attr-defined]


def close(got: np.ndarray, ref: np.ndarray) -> None:
  np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=2 ** -7, atol=2 ** -11 * np.abs(ref).max())


WGMMA_CASES = [  # (A transposed, B transposed, M, N, K, opts after TC 2): its K tiles are 64, 32 where K is 96, 16 where it is 16
  (False, False, 128, 48, 64, []),
  (True, False, 64, 32, 96, [Opt(OptOps.UPCAST, 1, 2)]),
  (False, True, 128, 64, 64, [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UNROLL, 0, 2)]),
  (True, True, 64, 16, 128, [Opt(OptOps.PREFETCH, 0, 0)]),
  (False, False, 64, 64, 16, [Opt(OptOps.SWAP, 0, 1), Opt(OptOps.UPCAST, 1, 4)]),
  (False, True, 128, 64, 32, [Opt(OptOps.UPCAST, 1, 2), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 1, 2)])]
WIDTHS = [16, 32, 16, 16, 64, 32]  # each case's wgmma N: 16 x the UPCAST of B's columns right after TC's 16 (the first one)


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("ta, tb, m, n, k, opts", WGMMA_CASES)
def test_tc_wgmma_matmul_matches_numpy(dt: DType, ta: bool, tb: bool, m: int, n: int, k: int, opts: list[Opt]) -> None:
  """TC's arg 2 on EMU with sm_90's caps: the staged tiles laid out as wgmma's core matrices, one m64nNk16 a K step for each run of
  UPCAST's 16 x 16 tiles along B's columns (N = 16 x their count), matching NumPy."""
  with emu_arch("sm_90"):
    out, ref = matmul(dt, ta, tb, m, n, k)
    kernel, buf = tc2_kernel(out, opts)
    src = Device["EMU"].renderer.render(kernel)
    wide = WIDTHS[[c[5] for c in WGMMA_CASES].index(opts)]
    assert f"tt_wgmma_m64n{wide}k16(accw0, tt_wgmma_desc(" in src and "tt_ldmatrix" not in src and kernel.launch_dims[1] == 128
    close(run_emu(kernel, buf), ref)


@pytest.mark.parametrize("shape, opts", [((2, 64, 32, 32), []), ((4, 64, 16, 32), [Opt(OptOps.UPCAST, 0, 2)])], ids=["batch", "2 batches a tile"])
def test_tc_wgmma_batched(shape: tuple[int, int, int, int], opts: list[Opt]) -> None:
  """A batched matmul; with UPCAST over the batch dim, a workgroup's tiles hold two batches' core matrices one block after the other."""
  b_, m, n, k = shape
  rng = np.random.default_rng(3)
  A, B = rng.standard_normal((b_, m, k)).astype(np.float16), rng.standard_normal((b_, k, n)).astype(np.float16)
  with emu_arch("sm_90"):
    kernel, buf = tc2_kernel(Tensor(A, device="EMU") @ Tensor(B, device="EMU"), opts)
    close(run_emu(kernel, buf), A.astype(np.float32) @ B.astype(np.float32))


def test_tc_wgmma_refusals() -> None:
  """sm_80 has no wgmma; the warpgroup needs 64 rows; LOCAL would split it; TC's arg 2 stages its tiles itself, unswizzled."""
  with emu_arch("sm_80"):
    out, _ = matmul(dtypes.float16, False, False, 64, 16, 32)
    with pytest.raises(KernelOptError, match=r"TC's arg 2 \(wgmma\) is sm_90's \(Hopper\): this GPU's TC takes args 0 and 1"): tc2_kernel(out, [])
  with emu_arch("sm_90"):
    with pytest.raises(KernelOptError, match="rows a multiple of 64"): tc2_kernel(matmul(dtypes.float16, False, False, 32, 16, 32)[0], [])
    with pytest.raises(KernelOptError, match="LOCAL does not combine"): tc2_kernel(out, [Opt(OptOps.LOCAL, 1, 1)])
    with pytest.raises(KernelOptError, match="stages its K tiles itself"): tc2_kernel(out, [Opt(OptOps.STAGE, 0, 2)])


# (A transposed, B transposed, M, N, K, opts after TC 2, bytes of dynamic shared memory): K tiles of 64 in 2 to 4 cp.async stages, past
# 48 KB dynamic; 16-byte cp.asyncs where K is contiguous (A untransposed, B transposed), elements copied by plain stores elsewhere
PIPELINED = [(False, False, 64, 128, 256, [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.PIPELINE, 0, 3)], 77824),
             (False, True, 128, 64, 192, [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.PIPELINE, 0, 4)], 102400),
             (True, False, 64, 64, 128, [Opt(OptOps.PIPELINE, 0, 2)], 0)]


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("ta, tb, m, n, k, opts, dynamic", PIPELINED)
def test_tc_wgmma_pipelined_matches_numpy(dt: DType, ta: bool, tb: bool, m: int, n: int, k: int, opts: list[Opt], dynamic: int) -> None:
  """TC's arg 2 with PIPELINE on EMU: each iteration waits for its tile's cp.asyncs, fences them for wgmma's async proxy, then meets the
  others at the barrier; a copy of plain stores is fenced after them, as without PIPELINE."""
  with emu_arch("sm_90"):
    out, ref = matmul(dt, ta, tb, m, n, k)
    kernel, buf = tc2_kernel(out, opts)
    src = Device["EMU"].renderer.render(kernel)
    assert dynamic_shared(src) == dynamic and ("tt_cp_async<16>" in src) == (not ta or tb)
    assert re.search(r"tt_cp_wait<\d+>\(\);\n\s*tt_wgmma_proxy\(\);\n\s*__syncthreads\(\);", src)
    close(run_emu(kernel, buf), ref)


def test_tc_wgmma_pipeline_without_its_landed_fence_fails() -> None:
  """With every copy a cp.async (K contiguous in A and B), the fence after the wait is the only one: without it EMU refuses the wgmma."""
  with emu_arch("sm_90"):
    out, ref = matmul(dtypes.float16, False, True, 64, 64, 256)
    kernel, buf = tc2_kernel(out, [Opt(OptOps.PIPELINE, 0, 3)])
    uops = lower(kernel, Device["EMU"].renderer).uops
    fences = [i for i, u in enumerate(uops) if u.op is Ops.WMMA and u.arg[1] == "proxy"]
    assert len(fences) == 1 and uops[fences[0] - 1].arg == ("wait_group", 1)
    close(run_lowered(kernel, buf, uops), ref)
    with pytest.raises(EmuError, match="stored to with no fence.proxy.async after"): run_lowered(kernel, buf, uops[:fences[0]] + uops[fences[0] + 1:])


def test_tc_wgmma_descriptors_in_the_source() -> None:
  """The CUDA source names each operand by tt_wgmma_desc(address, 128, K tile x 16 bytes): core matrices along K 128 bytes apart (leading),
  8 rows on the K tile's 16 bytes a K (stride), the statement's offsets, which EMU packs and decodes: given the leading offset for the
  stride, its products are wrong."""
  with emu_arch("sm_90"):
    out, ref = matmul(dtypes.float16, False, False, 64, 32, 64)
    kernel, buf = tc2_kernel(out, [])
    src = Device["EMU"].renderer.render(kernel)
    assert re.findall(r"tt_wgmma_desc\(\(unsigned\)__cvta_generic_to_shared\(tile\d\+[^;]*?\), (\d+), (\d+)\)", src) == [("128", "1024")] * 2
    wg = [u for u in lower(kernel, Device["EMU"].renderer).uops if u.op is Ops.WMMA and u.arg[1] == "mma"]
    assert [(u.arg[4], u.arg[6]) for u in wg] == [(1024, 1024)]
    close(run_emu(kernel, buf), ref)
    p = lower(kernel, Device["EMU"].renderer)
    swapped = [stmt(Ops.WMMA, *u.src, arg=(*u.arg[:4], 128, u.arg[5], 128, u.arg[7])) if u.op is Ops.WMMA and u.arg[1] == "mma" else u
               for u in p.uops]
    with pytest.raises(AssertionError): close(run_lowered(kernel, buf, swapped), ref)


def run_lowered(kernel: Kernel, out: object, uops: list) -> np.ndarray:
  EMUProgram(kernel.name, load(dump(LinearProgram(kernel, 1, uops))), kernel.launch_dims)(out, *kernel.bufs)
  return out.numpy_view().astype(np.float32)  # type: ignore[attr-defined]


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_random_sequences_after_tc_wgmma(dt: DType) -> None:
  """The opt fuzzer's sequences after TC 2 (up to 5 more opts, each valid where it was picked) render and run on EMU, matching NumPy."""
  from test_opts import random_sequence
  rng = random.Random(zlib.crc32(dt.name.encode()))
  with emu_arch("sm_90"):
    out, ref = matmul(dt, False, True, 128, 64, 128)
    for _ in range(6):
      kernel, buf = tc2_kernel(out, [])
      kernel = tc2_kernel(out, random_sequence(kernel, rng)[1:])[0]
      close(run_emu(kernel, buf), ref)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: TC's arg 2 kernels are not compile-checked here")
def test_tc_wgmma_kernels_compile_for_sm_90a(tmp_path) -> None:  # type: ignore[no-untyped-def]
  """The CUDA source of TC's arg 2 kernels (each of WGMMA_CASES, both dtypes) compiles with nvcc for sm_90a, as the CUDA device builds it."""
  srcs = []
  with emu_arch("sm_90"):
    for dt in (dtypes.float16, dtypes.bfloat16):
      for ta, tb, m, n, k, opts in WGMMA_CASES: srcs.append(Device["EMU"].renderer.render(tc2_kernel(matmul(dt, ta, tb, m, n, k)[0], opts)[0]))
  for i, src in enumerate(srcs): (tmp_path / f"k{i}.cu").write_text(src)
  res = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", *(f"k{i}.cu" for i in range(len(srcs)))], cwd=tmp_path, capture_output=True, text=True,
                       timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: TC's arg 2 kernels are not compiled here")
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16])
def test_tc_wgmma_conversions_do_not_branch(tmp_path, dt: DType) -> None:  # type: ignore[no-untyped-def]
  """The 16-bit conversions of a TC arg 2 kernel (its tiles' copies: loads as float32, stores as 16 bits; the epilogue's stores) are
  selects in the PTX, whose one branch is the K loop's: bfloat16's rounding branched on a NaN once per element and so did float16's
  load (a 64x128 tile from K tiles of 64, 96 elements a thread each: 40.9 TFLOPS bfloat16 on an H200, 132 float16)."""
  with emu_arch("sm_90"):
    src = Device["EMU"].renderer.render(tc2_kernel(matmul(dt, False, False, 64, 128, 128)[0], [Opt(OptOps.UPCAST, 1, 8)])[0])
  (tmp_path / "k.cu").write_text(src)
  res = subprocess.run(["nvcc", "-arch=sm_90a", "-ptx", "k.cu", "-o", "k.ptx"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  assert len(re.findall(r"^\s+(?:@%p\d+ )?bra", (tmp_path / "k.ptx").read_text(), re.M)) == 1


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: TC's arg 2 kernels are not compile-checked here")
def test_gpu_suites_pipelined_wgmma_compiles_without_spills(tmp_path) -> None:  # type: ignore[no-untyped-def]
  """The GPU suite's pipelined wgmma variants at 4096^3 (bench/gpu_suite.py): 64x128 in 3 and 4 stages and 128x128 in 3, float16 and
  bfloat16, built by nvcc for sm_90a with no spills."""
  from ops_support import ptxas_stats_each
  cases, srcs = [], []
  with emu_arch("sm_90"):
    for dt in (dtypes.float16, dtypes.bfloat16):
      z = [Tensor.zeros(4096, 4096, dtype=dt).contiguous() for _ in range(2)]  # never allocated
      ast = create_schedule((z[0] @ z[1]).uop, "EMU")[0][-1].ast
      for opts in ([Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.PIPELINE, 0, 3)], [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.PIPELINE, 0, 4)],
                   [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.PIPELINE, 0, 3)]):
        cases.append((dt, opts))
        srcs.append(Device["EMU"].renderer.render(Kernel(ast, Device["EMU"].caps).apply_opts([Opt(OptOps.TC, 0, 2), *opts])))
  for (dt, opts), stats in zip(cases, ptxas_stats_each(tmp_path, srcs, "sm_90a")):  # one nvcc for them all
    assert stats["bytes spill stores"] == stats["bytes spill loads"] == 0 and stats["registers"] <= 255, (dt, opts, stats)


def test_tc_wgmma_without_the_proxy_fence_fails() -> None:
  """The staged tiles' stores are generic-proxy writes that wgmma (the async proxy) reads: without each thread's fence.proxy.async after
  its stores, EMU refuses the wgmma, naming the threads."""
  with emu_arch("sm_90"):
    out, _ = matmul(dtypes.float16, False, False, 64, 16, 32)
    kernel, buf = tc2_kernel(out, [])
    uops = lower(kernel, Device["EMU"].renderer).uops
    assert sum(u.op is Ops.WMMA and u.arg[1] == "proxy" for u in uops) == 1
    with pytest.raises(EmuError, match="with no fence.proxy.async after"):
      run_lowered(kernel, buf, [u for u in uops if not (u.op is Ops.WMMA and u.arg[1] == "proxy")])
