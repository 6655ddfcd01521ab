"""PIPELINE: STAGE's tiles copied by cp.async into a ring of shared buffers, and mma.sync's 16-bit tiles swizzled. Without a GPU: the
CUDA source run on the host (test_mma_on_host's shim, where a cp.async lands at the wait_group that lets it, the latest a GPU may),
the shared-memory addresses of each warp-wide ldmatrix and cp.async counted bank by bank, the opt's checks, and nvcc's compile for
sm_80 and sm_90 with its register and spill figures, and EMU; with a GPU, the same kernels on it."""
from __future__ import annotations

import ctypes
import random
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from ops_support import nvrtc_missing, ptxas_stats_each
from test_mma_on_host import _run_on_host, host_source

from tinytune import Kernel, Opt, OptOps, Tensor, dtypes
from tinytune.codegen import kernel as kernel_module
from tinytune.codegen.caps import amd_caps, cuda_caps
from tinytune.codegen.cstyle import CUDARenderer, dynamic_shared
from tinytune.codegen.kernel import KernelOptError, swizzle_line
from tinytune.codegen.lower import staged as staged_module
from tinytune.dtype import DType
from tinytune.engine import compile_kernel
from tinytune.engine.schedule import ScheduleItem, create_schedule
from tinytune.runtime import Device, DeviceCaps, device_status

t, o = OptOps, Opt
HOST = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ here to run the CUDA source on the host")
SM80, SM90 = cuda_caps("sm_80"), cuda_caps("sm_90")


def bank_ways(addrs: list[int], nbytes: int) -> int:
  """How many passes one warp-wide shared-memory access of `nbytes` a lane (lanes in order) takes: the lanes are served in groups of
  128 bytes (32 lanes of 4 bytes, 16 of 8, 8 of 16: an ldmatrix matrix's 8 rows), and a group whose lanes touch distinct 4-byte words
  in one of the 32 banks takes a pass for each; the same word twice is one (a broadcast)."""
  ways = 1
  for g in range(0, len(addrs), 128 // nbytes):
    banks: dict[int, set[int]] = {}
    for a in addrs[g:g + 128 // nbytes]:
      for word in range(a // 4, (a + nbytes) // 4): banks.setdefault(word % 32, set()).add(word)
    ways = max(ways, *(len(w) for w in banks.values()))
  return ways


def test_bank_ways_counts_conflicts() -> None:
  assert bank_ways([4 * i for i in range(32)], 4) == 1 and bank_ways([0] * 32, 4) == 1  # a broadcast
  assert bank_ways([128 * i for i in range(32)], 4) == 32 and bank_ways([8 * i for i in range(32)], 4) == 2
  assert bank_ways([16 * i for i in range(32)], 16) == 1  # 4 groups of 8 rows, each 128 contiguous bytes
  assert [bank_ways([s * i for i in range(32)], 16) for s in (32, 64, 128, 48)] == [2, 4, 8, 1]  # 48: 3 chunks, odd
  assert [swizzle_line(r) for r in (16, 32, 48, 64, 96, 128, 256, 384)] == [0, 128, 0, 128, 0, 128, 256, 384]


def matmul(m: int, k: int, n: int, dtype: DType, tb: bool = False, caps: DeviceCaps = SM90, device: str = "CPU", batch: tuple[int, ...] = ()
           ) -> tuple[Kernel, ScheduleItem, np.ndarray, list[np.ndarray]]:
  """A @ (B.T if tb else B) (with `batch` dims in front) as a kernel for `caps`, its schedule item, NumPy's product and the inputs."""
  rng = np.random.default_rng(0)
  a_np, b_np = (rng.standard_normal((*batch, *s)).astype(np.float32).astype(dtype.np) for s in ((m, k), (n, k) if tb else (k, n)))
  a, b = Tensor(a_np, device=device).cast(dtype).realize(), Tensor(b_np, device=device).cast(dtype).realize()
  bt = b.transpose(-1, -2) if tb else b
  (item,), _ = create_schedule((a @ bt).uop, device)
  return Kernel(item.ast, caps), item, a_np.astype(np.float32) @ (np.swapaxes(b_np, -1, -2) if tb else b_np).astype(np.float32), [a_np, b_np]


# (m, k, n, dtype, B transposed, opts): mma.sync from swizzled tiles (rows of 2, 4 and 8 chunks; 6, padded to 7) and float32's register
# tiles (A transposed in shared memory: cp.async of 4 bytes an element; B: 16 a chunk), 2 to 4 stages, K tiles fewer than the stages
CASES = [
  (64, 128, 48, dtypes.float16, False, [o(t.TC, 0, 1), o(t.STAGE, 0, 2), o(t.LOCAL, 1, 3), o(t.PIPELINE, 0, 3), o(t.UPCAST, 0, 2)]),
  (64, 128, 64, dtypes.float16, True, [o(t.TC, 0, 1), o(t.LOCAL, 0, 2), o(t.STAGE, 0, 4), o(t.PIPELINE, 0, 2), o(t.UPCAST, 1, 2)]),
  (32, 192, 64, dtypes.float16, False, [o(t.TC, 0, 1), o(t.STAGE, 0, 4), o(t.LOCAL, 1, 4), o(t.PIPELINE, 0, 4), o(t.UNROLL, 0, 2)]),
  (32, 64, 32, dtypes.float16, False, [o(t.TC, 0, 1), o(t.STAGE, 0, 2), o(t.PIPELINE, 0, 4)]),  # 2 K tiles, 4 stages
  (64, 96, 64, dtypes.float32, False, [o(t.LOCAL, 0, 8), o(t.LOCAL, 1, 8), o(t.UPCAST, 0, 4), o(t.UPCAST, 1, 4), o(t.STAGE, 0, 8),
                                       o(t.PIPELINE, 0, 3)]),
  (48, 40, 40, dtypes.float32, True, [o(t.LOCAL, 0, 4), o(t.LOCAL, 1, 5), o(t.UPCAST, 1, 4), o(t.STAGE, 0, 4), o(t.PIPELINE, 0, 2)]),  # both across
  (37, 36, 29, dtypes.float32, False, [o(t.PADTO, 0, 8), o(t.PADTO, 1, 8), o(t.LOCAL, 0, 5), o(t.LOCAL, 1, 4), o(t.STAGE, 0, 3),
                                       o(t.PIPELINE, 0, 3)]),  # odd sizes, padded: clamped copies (4 bytes an element)
  (32, 64, 32, dtypes.float16, False, [o(t.TC, 0, 1), o(t.LOCAL, 0, 2), o(t.STAGE, 0, 2), o(t.PIPELINE, 0, 2)]),  # 2 batches a workgroup
  (128, 64, 256, dtypes.float16, False, [o(t.TC, 0, 1), o(t.UPCAST, 0, 4), o(t.UPCAST, 1, 4), o(t.LOCAL, 0, 2), o(t.LOCAL, 1, 4), o(t.STAGE, 0, 2),
                                         o(t.PIPELINE, 0, 3)])]  # 128x256 tiles of 8 warps: 81920 bytes of shared memory, dynamic
DYNAMIC = {8: 81920}  # the cases past 48 KB of shared memory: its bytes


BATCH = {7: (2,)}  # the cases of batched matmuls: their batch dims


@HOST
@pytest.mark.parametrize("case", range(len(CASES)))
def test_pipelined_source_multiplies_on_the_host(tmp_path, case: int) -> None:  # type: ignore[no-untyped-def]
  m, kk, n, dtype, tb, opts = CASES[case]
  kernel, _, ref, inputs = matmul(m, kk, n, dtype, tb, batch=BATCH.get(case, ()))
  kernel.apply_opts(opts)
  out = np.full(ref.size, np.nan, dtype.np)
  src = _run_on_host(kernel, tmp_path, out, *inputs)
  body = src[src.index('extern "C"'):]
  assert dynamic_shared(src) == DYNAMIC.get(case, 0)
  assert body.count("tt_cp_wait<") == 1 and body.count("tt_cp_commit();") == kernel.stages and "tt_cp_async<" in body
  assert ("tt_cp_async<16>" in body) == (case not in (5, 6)) and ("tt_cp_async<4>" in body) == (case in (4, 5, 6))  # float32's across rows
  np.testing.assert_allclose(out.reshape(ref.shape).astype(np.float32), ref, rtol=1e-2, atol=1e-2)


@HOST
def test_pipelined_source_is_right_with_copies_landing_early_too(tmp_path) -> None:  # type: ignore[no-untyped-def]
  """Each cp.async landing as it is issued (the earliest a GPU may): a copy that overwrote a buffer still being read would show here."""
  for case in (0, 4):
    m, kk, n, dtype, tb, opts = CASES[case]
    kernel, _, ref, inputs = matmul(m, kk, n, dtype, tb)
    out = np.full(m * n, np.nan, dtype.np)
    (tmp_path / str(case)).mkdir()
    _run_on_host(kernel.apply_opts(opts), tmp_path / str(case), out, *inputs, flags=["-DTT_EAGER"])
    np.testing.assert_allclose(out.reshape(m, n).astype(np.float32), ref, rtol=1e-2, atol=1e-2)


@HOST
def test_a_missing_wait_fails_on_the_host(tmp_path) -> None:  # type: ignore[no-untyped-def]
  """The shim's cp.async is no plain copy: without the loop's wait_group the tiles are read before they land, and the product is wrong."""
  m, kk, n, dtype, tb, opts = CASES[0]
  kernel, _, ref, inputs = matmul(m, kk, n, dtype, tb)
  src = host_source(kernel.apply_opts(opts))
  out = np.full(m * n, np.nan, dtype.np)
  _run_on_host(kernel, tmp_path, out, *inputs, src=re.sub(r"tt_cp_wait<\d+>\(\);", "", src))
  assert not np.allclose(out.reshape(m, n).astype(np.float32), ref, rtol=1e-2, atol=1e-2)


def _warp_accesses(lib_path: str) -> tuple[list[list[int]], dict[tuple[int, int, int], list[tuple[int, int]]]]:
  """The host run's ldmatrix rows (32 addresses a call) and its cp.asyncs grouped by (block, warp, the thread's count): (lane, address)."""
  lib = ctypes.CDLL(lib_path)
  buf = np.zeros(5 << 20, np.int64)
  n = lib.rows_logged(buf.ctypes.data_as(ctypes.c_void_p))
  rows = [list(map(int, buf[i:i + 32])) for i in range(0, n, 32)]
  n = lib.copies_logged(buf.ctypes.data_as(ctypes.c_void_p))
  copies: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
  for blk, tid, seq, nbytes, addr in buf[:n].reshape(-1, 5).tolist():
    assert nbytes == 16
    copies.setdefault((blk, tid // 32, seq), []).append((tid % 32, addr))
  return rows, copies


SWIZZLED = [  # TC+STAGE tiles with rows of 2, 4, 8 and 16 16-byte chunks (A: the K tile's 2 bytes each; B: the workgroup's N's)
  (64, 128, 128, False, [o(t.TC, 0, 1), o(t.STAGE, 0, 4), o(t.LOCAL, 1, 8), o(t.PIPELINE, 0, 2)]),  # A rows of 8 chunks, B 16
  (64, 64, 16, False, [o(t.TC, 0, 1), o(t.STAGE, 0, 2), o(t.LOCAL, 0, 4), o(t.PIPELINE, 0, 2)]),  # A 4, B 2
  (32, 128, 32, True, [o(t.TC, 0, 1), o(t.STAGE, 0, 4), o(t.LOCAL, 0, 2), o(t.PIPELINE, 0, 2)])]  # A and B 8


@HOST
@pytest.mark.parametrize("swizzled", [True, False])
def test_swizzled_tiles_are_free_of_bank_conflicts(tmp_path, monkeypatch, swizzled: bool) -> None:  # type: ignore[no-untyped-def]
  """Every ldmatrix (each of its 4 matrices: 8 rows of 16 bytes) and every warp's cp.async of 16 bytes a lane touches each bank once in
  the swizzled tiles; the same tiles unswizzled and unpadded take ldmatrix 4 to 8 ways (rows of 64 to 256 bytes put a matrix's 8 rows
  in the same 4 banks up to 8 times; their cp.asyncs stay conflict-free, a warp's 32 chunks 512 contiguous bytes)."""
  if not swizzled:
    monkeypatch.setattr(staged_module, "swizzle_line", lambda row: 0)
    monkeypatch.setattr(kernel_module, "swizzle_line", lambda row: row)  # no padding either
  worst = []
  for i, (m, kk, n, tb, opts) in enumerate(SWIZZLED):
    kernel, _, ref, inputs = matmul(m, kk, n, dtypes.float16, tb)
    out = np.full(m * n, np.nan, np.float16)
    (tmp_path / str(i)).mkdir()
    src = _run_on_host(kernel.apply_opts(opts), tmp_path / str(i), out, *inputs)
    assert ("tt_swizzle(" in src[src.index('extern "C"'):]) == swizzled
    np.testing.assert_allclose(out.reshape(m, n).astype(np.float32), ref, rtol=1e-2, atol=1e-2)
    rows, copies = _warp_accesses(str(tmp_path / str(i) / "k.so"))
    assert rows and copies and all(len(c) == 32 for c in copies.values())
    worst.append((max(bank_ways(r, 16) for r in rows), max(bank_ways([a for _, a in sorted(c)], 16) for c in copies.values())))
  if swizzled: assert worst == [(1, 1)] * len(SWIZZLED)
  else: assert [ld for ld, _ in worst] == [8, 4, 8], worst


def test_shared_arrays_past_48k_are_dynamic() -> None:
  """Past the 48 KB a CUDA block declares statically, a kernel's shared arrays are pointers into one extern array at 128-byte aligned
  offsets that do not overlap, its bytes on the declaration's line (what the launch gives); up to it they stay static arrays."""
  m, kk, n, dtype, tb, opts = CASES[8]
  src = CUDARenderer().render(matmul(m, kk, n, dtype, tb)[0].apply_opts(opts))
  arrays = {name: (ty, int(off)) for ty, name, off in re.findall(r"(\w+)\* (\w+) = \(\w+\*\)\(tt_shared\+(\d+)\);", src)}
  assert src.count("extern __shared__") == 1 and "__shared__ __align__(32)" not in src and dynamic_shared(src) == 81920
  # A's 3 stages of 128x32 halves, B's of 32x256, and the 8 warps' 256 floats of C
  assert sorted(arrays.values()) == [("float", 73728), ("half", 0), ("half", 24576)], arrays
  small = CUDARenderer().render(matmul(*CASES[0][:5])[0].apply_opts(CASES[0][5]))
  assert dynamic_shared(small) == 0 and "extern __shared__" not in small and "tt_shared" not in small


def test_pipeline_opt_checks() -> None:
  """PIPELINE needs cp.async (CUDA, sm_80+: HIP and OpenCL keep STAGE's plain copy), a STAGE of several K tiles, mma.sync's tiles with
  TC, and the ring's shared memory; it comes once, not with PREFETCH, and counts its stages in every later shared-memory check."""
  def kern(caps: DeviceCaps = SM80, dtype: DType = dtypes.float32) -> Kernel: return matmul(64, 256, 64, dtype, caps=caps)[0]
  ok = kern().apply_opts([o(t.LOCAL, 0, 8), o(t.STAGE, 0, 16), o(t.PIPELINE, 0, 3)])
  assert ok.stages == 3 and ok.stage_bytes() == 3 * (16 * (8 + 4) + 16) * 4  # A transposed, padded; B one column
  opencl = DeviceCaps(has_local=True, max_upcast=64, simd_width=4, max_local=256, shared_bytes=32 << 10)  # an OpenCL device's
  for caps in (amd_caps("gfx942"), amd_caps("gfx1100"), cuda_caps("sm_75"), opencl):
    with pytest.raises(KernelOptError, match="cp.async, CUDA's on sm_80 and later: on HIP and OpenCL STAGE copies"):
      kern(caps).apply_opts([o(t.LOCAL, 0, 8), o(t.STAGE, 0, 16), o(t.PIPELINE, 0, 2)])
  for opts, why in [([o(t.PIPELINE, 0, 2)], "STAGE"), ([o(t.STAGE, 0, 256), o(t.PIPELINE, 0, 2)], "more than one K tile"),
                    ([o(t.STAGE, 0, 16), o(t.PIPELINE, 0, 1)], "2 to 8"), ([o(t.STAGE, 0, 16), o(t.PIPELINE, 1, 2)], "axis 0"),
                    ([o(t.STAGE, 0, 16), o(t.PIPELINE, 0, 2), o(t.PIPELINE, 0, 3)], "one PIPELINE"),
                    ([o(t.STAGE, 0, 16), o(t.PREFETCH, 0, 0), o(t.PIPELINE, 0, 2)], "PREFETCH"),
                    ([o(t.STAGE, 0, 16), o(t.PIPELINE, 0, 2), o(t.PREFETCH, 0, 0)], "PIPELINE"),
                    ([o(t.LOCAL, 0, 8), o(t.LOCAL, 1, 8), o(t.UPCAST, 0, 8), o(t.UPCAST, 1, 8), o(t.STAGE, 0, 64), o(t.PIPELINE, 0, 5)],
                     "PIPELINE 5 needs 168960 bytes of shared memory, over 166912"),  # sm_80's most, opted into
                    ([o(t.STAGE, 0, 64), o(t.PIPELINE, 0, 8), o(t.UPCAST, 1, 8), o(t.LOCAL, 1, 8), o(t.UPCAST, 0, 4), o(t.LOCAL, 0, 4)],
                     "tiles would need 172032 bytes")]:
    with pytest.raises(KernelOptError, match=why): kern().apply_opts(opts)
  with pytest.raises(KernelOptError, match="mma.sync"): kern(dtype=dtypes.float16).apply_opts([o(t.TC, 0, 0), o(t.STAGE, 0, 4), o(t.PIPELINE, 0, 2)])
  assert kern(dtype=dtypes.float16).apply_opts([o(t.TC, 0, 1), o(t.STAGE, 0, 4), o(t.PIPELINE, 0, 4)]).stages == 4


def gpu_sized() -> list[Kernel]:
  """The GPU suite's PIPELINE variants at 4096^3 (bench/gpu_suite.py): float16 mma.sync from 2 stages of 128x128 swizzled tiles and 3 of
  64x128 (K tiles of 32), float32's default register tiles from 2 stages of K tiles of 16 and 3 of 8; past 48 KB of shared memory
  (dynamic), float16's 128x128 tiles in 3 and 4 stages and with K tiles of 64 in 3, and 8 warps' 256x128 and 128x256 in 3 and 4."""
  from tinytune.codegen.heuristic import default_opts
  def kernel(dtype: DType) -> Kernel:
    z = [Tensor.zeros(4096, 4096, dtype=dtype).contiguous() for _ in range(2)]  # never allocated
    return Kernel(create_schedule((z[0] @ z[1]).uop, "CPU")[0][-1].ast, SM90)
  f16, f32 = kernel(dtypes.float16), kernel(dtypes.float32)
  base = default_opts(f32)
  assert Opt(t.STAGE, 0, 16) in base and base[-1] == Opt(t.PIPELINE, 0, 2)  # the defaults since the H200 timed them
  tc = [o(t.TC, 0, 1), o(t.UPCAST, 0, 4), o(t.UPCAST, 1, 4), o(t.LOCAL, 0, 2), o(t.LOCAL, 1, 2), o(t.STAGE, 0, 2)]
  assert default_opts(f16) == [*tc, o(t.PIPELINE, 0, 2)]
  def tiles(rows: int, cols: int, ktile: int = 2) -> list[Opt]: return [*tc[:3], o(t.LOCAL, 0, rows), o(t.LOCAL, 1, cols), o(t.STAGE, 0, ktile)]
  big = [[*tc, o(t.PIPELINE, 0, 3)], [*tc, o(t.PIPELINE, 0, 4)], [*tiles(2, 2, 4), o(t.PIPELINE, 0, 3)], [*tiles(4, 2), o(t.PIPELINE, 0, 3)],
         [*tiles(2, 4), o(t.PIPELINE, 0, 3)], [*tiles(2, 4), o(t.PIPELINE, 0, 4)]]
  return [f16.copy().apply_opts([*tc, o(t.PIPELINE, 0, 2)]), f16.copy().apply_opts([*tc[:1], o(t.UPCAST, 0, 2), *tc[2:], o(t.PIPELINE, 0, 3)]),
          f32.copy().apply_opts(base),
          f32.copy().apply_opts([o(t.STAGE, 0, 8) if x.op is t.STAGE else o(t.PIPELINE, 0, 3) if x.op is t.PIPELINE else x for x in base]),
          *(f16.copy().apply_opts(opts) for opts in big)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: the pipelined source is not compile-checked here")
def test_pipelined_source_compiles_for_sm80_and_sm90_without_spills(tmp_path) -> None:  # type: ignore[no-untyped-def]
  kernels = gpu_sized() + [matmul(m, kk, n, dt, tb, batch=BATCH.get(i, ()))[0].apply_opts(opts) for i, (m, kk, n, dt, tb, opts) in enumerate(CASES)]
  srcs = [CUDARenderer().render(k) for k in kernels]
  for k, src in zip(kernels, srcs):
    assert "cp.async.cg.shared.global" in src and "cp.async.wait_group" in src
    assert (dynamic_shared(src) > 0) == (k.stage_bytes() + k.tc_shared() > 48 << 10), k.opts  # past 48 KB: dynamic
  with ThreadPoolExecutor(2) as pool:  # one nvcc per arch over all the kernels, side by side
    for arch, each in zip(ARCHS := ("sm_80", "sm_90"), pool.map(lambda arch: ptxas_stats_each(tmp_path, srcs, arch), ARCHS)):
      for k, stats in zip(kernels, each):
        assert stats["bytes spill stores"] == stats["bytes spill loads"] == 0 and stats["registers"] <= 255, (k.opts, arch, stats)


@pytest.mark.skipif(bool(nvrtc_missing()), reason=str(nvrtc_missing()))
def test_pipelined_source_compiles_with_nvrtc() -> None:
  """The CUDA device's own compile path (NVRTC, which takes the cp.async helpers' inline PTX and templates as nvcc does), for sm_80 and sm_90."""
  from tinytune.runtime.cuda import _nvrtc
  kernels = gpu_sized() + [matmul(m, kk, n, dt, tb, batch=BATCH.get(i, ()))[0].apply_opts(opts) for i, (m, kk, n, dt, tb, opts) in enumerate(CASES)]
  for k in kernels:
    for arch in ("sm_80", "sm_90"): _nvrtc(CUDARenderer().render(k), arch)


PIPELINE_DEVICES = [d for d in ("EMU", "CUDA") if device_status(d) is None]


@pytest.mark.parametrize("device", PIPELINE_DEVICES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_pipelined_matmul_on_a_device(device: str, case: int) -> None:
  """The same kernels on EMU (the lowered program in NumPy: 16-bit ones where its caps take TC) and on an NVIDIA GPU (sm_80 or later),
  where the hardware's cp.async and ldmatrix check the host's shim."""
  m, kk, n, dtype, tb, opts = CASES[case]
  if dtype.is_half and dtype.name not in Device[device].caps.tensor_cores: pytest.skip(f"{device} has no tensor cores for {dtype.name}")
  kernel, item, ref, _ = matmul(m, kk, n, dtype, tb, caps=Device[device].caps, device=device, batch=BATCH.get(case, ()))
  program, _ = compile_kernel(kernel.apply_opts(opts), device)
  program(item.out, *kernel.bufs)
  np.testing.assert_allclose(item.out.numpy_view().reshape(ref.shape).astype(np.float32), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(device_status("EMU") is not None, reason=f"EMU: {device_status('EMU')}")
@pytest.mark.parametrize("seed", range(4))
def test_random_pipelined_matmuls_on_emu(seed: int) -> None:
  """Random PIPELINE kernels (float32 register tiles, padded or not; 16-bit mma.sync from swizzled tiles; batched; B transposed; 2 to 4
  stages) on EMU, whose cp.async lands at the wait_group that covers it and whose shared-memory races are errors, against NumPy."""
  rng, ran = random.Random(seed), 0
  for _ in range(12):
    half = rng.random() < 0.5
    dtype, q = (rng.choice([dtypes.float16, dtypes.bfloat16]), 16) if half else (dtypes.float32, 1)
    m, n = (q * rng.choice([1, 2, 3, 4]) if half else rng.choice([8, 16, 24, 37]) for _ in range(2))
    k, tb, batch = q * rng.choice([2, 4, 6, 8]) if half else rng.choice([16, 24, 36, 48]), rng.random() < 0.5, (2,) * (rng.random() < 0.2)
    kernel, item, ref, _ = matmul(m, k, n, dtype, tb, caps=Device["EMU"].caps, device="EMU", batch=batch)
    tiles = [o(rng.choice([t.UPCAST, t.LOCAL]), rng.randrange(kernel.n_global), rng.choice([2, 3, 4])) for _ in range(4)]
    pad = [] if half or rng.random() < 0.7 else [o(t.PADTO, rng.randrange(kernel.n_global + 1), rng.choice([4, 8]))]
    for opt in [o(t.TC, 0, 1)] * half + pad + tiles + [o(t.STAGE, 0, rng.choice([2, 3, 4, 8])), o(t.PIPELINE, 0, rng.choice([2, 3, 4]))]:
      try: kernel.apply_opt(opt)
      except KernelOptError: pass
    if kernel.stages == 1: continue
    program, _ = compile_kernel(kernel, "EMU")
    program(item.out, *kernel.bufs)
    np.testing.assert_allclose(item.out.numpy_view().reshape(ref.shape).astype(np.float32), ref, rtol=2e-2, atol=2e-2, err_msg=str(kernel.opts))
    ran += 1
  assert ran >= 3
