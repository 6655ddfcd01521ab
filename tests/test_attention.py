"""Attention in one kernel (Ops.ATTENTION, FLASH=2): online softmax in registers, against NumPy on every device, with each opt
that applies to it; the schedule makes it one kernel, and the gradient goes through the graph (tests/test_tensor_math.py)."""
from __future__ import annotations

import dataclasses
import math
import shutil
import subprocess

import numpy as np
import pytest
from ops_support import bench_module, hip_clang, hip_flags, ptxas_stats_each

from tinytune import Context, Device, Kernel, KernelOptError, Opt, OptOps, Tensor, dtypes
from tinytune.codegen.caps import cuda_caps
from tinytune.codegen.cstyle import CUDARenderer, HIPRenderer
from tinytune.codegen.heuristic import default_opts
from tinytune.codegen.kernel import candidate_opts
from tinytune.dtype import DType
from tinytune.engine import compile_kernel
from tinytune.engine.schedule import create_schedule
from tinytune.runtime import DeviceCaps
from tinytune.uop import Ops


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
  q, k, v = (x.astype(np.float64) for x in (q, k, v))
  s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
  if causal: s = np.where(np.triu(np.ones(s.shape[-2:], bool), 1), -np.inf, s)
  e = np.exp(s - s.max(-1, keepdims=True))
  return (e / e.sum(-1, keepdims=True)) @ v


def inputs(shape_q: tuple[int, ...], shape_kv: tuple[int, ...], ev: int, dtype: np.dtype, seed: int = 0) -> list[np.ndarray]:
  rng = np.random.default_rng(seed)
  return [(rng.standard_normal(s) * 2).astype(dtype) for s in (shape_q, shape_kv, (*shape_kv[:-1], ev))]


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, device: str) -> Tensor:
  with Context(FLASH=2):
    return Tensor(q, device=device).scaled_dot_product_attention(Tensor(k, device=device), Tensor(v, device=device), is_causal=causal)


TOL = {np.float32: 2e-5, np.float16: 2e-2}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shapes", [((2, 3, 17, 8), (2, 3, 17, 8), 8), ((1, 2, 33, 16), (1, 2, 40, 16), 4), ((5, 12), (7, 12), 3)])
def test_matches_numpy(each_device: str, shapes: tuple, causal: bool, dtype: np.dtype) -> None:
  """Odd lengths, more keys than queries, value dims unlike the query's, no batch dims; float16 loaded and stored as it is."""
  q, k, v = inputs(shapes[0], shapes[1], shapes[2], dtype)
  out = attention(q, k, v, causal, each_device)
  assert out.dtype == dtypes.from_any(dtype) and out.shape == (*q.shape[:-1], v.shape[-1])
  np.testing.assert_allclose(out.numpy().astype(np.float64), reference(q, k, v, causal), rtol=TOL[dtype], atol=TOL[dtype])


def test_one_kernel_reading_its_inputs_from_memory() -> None:
  """The scores, softmax and P @ V are one kernel; queries computed elementwise and keys read transposed come before it."""
  q, k, v = (Tensor.rand(2, 16, 8).realize() for _ in range(3))
  with Context(FLASH=2): out = (q * 2).scaled_dot_product_attention(k.permute(0, 2, 1).permute(0, 2, 1), v) + 1
  items, _ = create_schedule(out.uop, "CPU")
  assert [it.ast.op for it in items][-2:] == [Ops.ATTENTION, Ops.ADD] and len(items) == 3
  with Context(FLASH=0): assert len(create_schedule((q.scaled_dot_product_attention(k, v)).uop, "CPU")[0]) > 1


def test_the_default_is_one_kernel_where_it_measured_faster() -> None:
  """FLASH=1: one kernel for float32 on CUDA (EMU stands for it), where attention in tiles beat the graph on an H200; the graph on the
  CPU and for float16 (no tensor cores in the one kernel yet), where one kernel measured slower. FLASH=2 makes it one kernel."""
  from tinytune import dtypes
  for device, dtype, one in [("CPU", dtypes.float32, False), ("EMU", dtypes.float16, False), ("EMU", dtypes.float32, True)]:
    q = Tensor.empty(2, 16, 8, device=device, dtype=dtype)
    assert (len(create_schedule(q.scaled_dot_product_attention(q, q).uop, device)[0]) == 1) == one
    with Context(FLASH=2): assert len(create_schedule(q.scaled_dot_product_attention(q, q).uop, device)[0]) == 1


GPU_CAPS = DeviceCaps(has_local=True, threads=1, max_upcast=256, simd_width=4, vector_registers=255, max_local=1024, shared_bytes=48 * 1024)


def kernel(device: str, causal: bool, shape: tuple[int, ...] = (2, 2, 32, 16), caps: DeviceCaps | None = None) -> tuple[Kernel, object, np.ndarray]:
  q, k, v = inputs(shape, shape, shape[-1], np.float32, seed=1)
  item = create_schedule(attention(q, k, v, causal, device).uop, device)[0][0]
  return Kernel(item.ast, caps or Device[device].caps), item, reference(q, k, v, causal)


@pytest.mark.parametrize("device", ["CPU", "EMU"])
@pytest.mark.parametrize("causal", [False, True])
def test_every_valid_opt(device: str, causal: bool) -> None:
  """Each opt that applies to the kernel alone, then the default opts with one more, computes what NumPy does."""
  k, item, ref = kernel(device, causal)
  seqs = [[o] for o in candidate_opts(k)] + [default_opts(k) + [o] for o in candidate_opts(k.copy().apply_opts(default_opts(k)))]
  valid = []
  for opts in seqs:
    try: valid.append(k.copy().apply_opts(opts))
    except KernelOptError: pass
  kinds = {o.op for kk in valid for o in kk.opts}
  assert {OptOps.UPCAST, OptOps.UNROLL} <= kinds and (OptOps.LOCAL if device == "EMU" else OptOps.THREAD) in kinds
  for kk in valid:
    program, _ = compile_kernel(kk, device)
    item.out.copyin(np.full(item.out.size, np.nan, np.float32))  # a store left out shows
    program(item.out, *kk.bufs)
    np.testing.assert_allclose(item.out.numpy_view(), ref.reshape(-1), rtol=2e-5, atol=2e-5, err_msg=str(kk.opts))


def test_opts_that_do_not_apply_say_why() -> None:
  k, _, _ = kernel("CPU", False, (1, 2, 64, 64))
  for opt, why in [(Opt(OptOps.GROUP, 0, 2), "needs a device with workgroups"), (Opt(OptOps.PADTO, 0, 4), "does not apply to attention"),
                   (Opt(OptOps.UPCAST, 2, 16), "registers"), (Opt(OptOps.UNROLL, 0, 5), "does not divide")]:
    with pytest.raises(KernelOptError, match=why): k.copy().apply_opt(opt)
  gpu, stage = Kernel(k.ast, GPU_CAPS), Opt(OptOps.STAGE, 0, 32)
  for opts, why in [([Opt(OptOps.GROUP, 0, 2)], "comes after STAGE"), ([Opt(OptOps.UNROLL, 0, 4), stage], "comes before any opt"),
                    ([Opt(OptOps.STAGE, 0, 6)], "multiple of 4"), ([stage, Opt(OptOps.UNROLL, 0, 4)], "does not combine with STAGE"),
                    ([stage, Opt(OptOps.UPCAST, 1, 2)], "splits the rows"), ([stage, Opt(OptOps.GROUP, 0, 3)], "does not divide"),
                    ([stage, Opt(OptOps.GROUP, 0, 0)], "does not divide"),
                    ([Opt(OptOps.STAGE, 0, 64), Opt(OptOps.LOCAL, 2, 64)], "bytes of shared memory")]:
    with pytest.raises(KernelOptError, match=why): gpu.copy().apply_opts(opts)


def test_default_opts() -> None:
  """A block of keys a vector wide and the rows across the cores on a CPU; attention in tiles on a GPU: 64 query rows a workgroup."""
  k, _, _ = kernel("CPU", False, (2, 8, 256, 64))
  opts = default_opts(k)
  assert Opt(OptOps.UNROLL, 0, k.caps.simd_width) in opts and (k.caps.threads == 1 or any(o.op is OptOps.THREAD for o in opts))
  gpu = Kernel(k.ast, GPU_CAPS)
  assert default_opts(gpu) == [Opt(OptOps.STAGE, 0, 32), Opt(OptOps.GROUP, 0, 8), Opt(OptOps.UPCAST, 2, 4), Opt(OptOps.LOCAL, 2, 16)]


def gpu_kernels(caps: DeviceCaps = GPU_CAPS) -> list[Kernel]:
  """Attention at the catalog's GPU size (4x16x1024x64) in each 16-bit float and float32, causal or not, with the default opts."""
  ret = []
  for dt in (dtypes.float32, dtypes.float16, dtypes.bfloat16):
    q = Tensor.empty(4, 16, 1024, 64, dtype=dt, device="EMU")
    for causal in (False, True):
      with Context(FLASH=2): item = create_schedule(q.scaled_dot_product_attention(q, q, is_causal=causal).uop, "EMU")[0][0]
      ret.append(Kernel(item.ast, caps).apply_opts(default_opts(Kernel(item.ast, caps))))
  return ret


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: the CUDA renderer's output is not compile-checked here")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_source_compiles_in_registers(tmp_path, arch: str) -> None:  # type: ignore[no-untyped-def]
  """ptxas keeps each thread's scores and output accumulators (4 rows by 4 keys, 4 rows by 8 values) in registers: none spilled, and the
  tiles in 48 KiB of shared memory; the opts before tiles (a row's 64 + 64 floats a thread) at most a word spilled."""
  kernels = gpu_kernels()
  untiled = Kernel(kernels[0].ast, GPU_CAPS).apply_opts([Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.LOCAL, 2, 128)])
  *tiled, stats = ptxas_stats_each(tmp_path, [CUDARenderer().render(k) for k in [*kernels, untiled]], arch)
  for k, st in zip(kernels, tiled):
    assert st["registers"] <= 255 and st["bytes spill stores"] == 0 and st["bytes smem"] <= 48 * 1024, (k.ast.dtype, st)
  assert stats["registers"] <= 255 and stats["bytes spill stores"] <= 8, stats


TILES = [[Opt(OptOps.STAGE, 0, 8), Opt(OptOps.GROUP, 0, 2), Opt(OptOps.LOCAL, 2, 4), Opt(OptOps.UPCAST, 2, 2)],
         [Opt(OptOps.LOCAL, 2, 2), Opt(OptOps.STAGE, 0, 4), Opt(OptOps.UPCAST, 2, 8)],  # an accumulator per row: l0..l7 beside the LOCAL's l4
         [Opt(OptOps.STAGE, 0, 16), Opt(OptOps.GROUP, 0, 4), Opt(OptOps.UPCAST, 2, 4)], [Opt(OptOps.STAGE, 0, 48)]]


@pytest.mark.parametrize("opts", TILES, ids=range(len(TILES)))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_tiles_match_numpy(opts: list[Opt], causal: bool, dtype: np.dtype) -> None:
  """Attention in tiles on EMU (the CUDA renderer's program, warp-exact): more keys than queries (causal: a key past the row is -inf, a
  tile past the block's rows skipped), value dims unlike the query's, 16-bit floats loaded and stored as they are, vectors of 4
  where the dims split into them (the head dim 8) and not (values 4 over 2 or 4 threads a row)."""
  q, k, v = inputs((1, 2, 16, 8), (1, 2, 48, 8), 4 if Opt(OptOps.GROUP, 0, 2) in opts else 8, dtype, seed=4)
  item = create_schedule(attention(q, k, v, causal, "EMU").uop, "EMU")[0][0]
  kk = Kernel(item.ast, Device["EMU"].caps).apply_opts(opts)
  program, _ = compile_kernel(kk, "EMU")
  item.out.copyin(np.full(item.out.size, np.nan, dtype))
  program(item.out, *kk.bufs)
  np.testing.assert_allclose(item.out.numpy_view().astype(np.float64), reference(q, k, v, causal).reshape(-1), rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.skipif(hip_clang("gfx90a") is None, reason="no clang that compiles HIP for gfx90a: the HIP renderer's output is not compile-checked")
def test_hip_source_compiles(tmp_path) -> None:  # type: ignore[no-untyped-def]
  for i, k in enumerate(gpu_kernels(dataclasses.replace(GPU_CAPS, max_local=256))):
    (tmp_path / f"k{i}.hip").write_text(HIPRenderer().render(k))
    res = subprocess.run([str(hip_clang("gfx90a")), *hip_flags("gfx90a"), f"k{i}.hip", "-o", f"k{i}.s"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[:2000]


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_masks(each_device: str, mask_kind: str) -> None:
  """A mask broadcast over the batch dims: a bool one keeps the scores where true (a row's first block of keys all masked out: the
  running max is -inf, its exps subtract 0), a float one is added; a row masked out whole is NaN, as the graph's softmax gives."""
  q, k, v = inputs((2, 3, 9, 8), (2, 3, 24, 8), 8, np.float32)
  rng = np.random.default_rng(2)
  mask = rng.random((9, 24)) > 0.5 if mask_kind == "bool" else (rng.standard_normal((9, 24)) * 3).astype(np.float32)
  if mask_kind == "bool": mask[:, :9], mask[3, 12] = False, True  # every row's first blocks masked out, row 3 all but one key
  if mask_kind == "bool": mask[5] = False
  ts = [Tensor(x, device=each_device) for x in (q, k, v, mask)]
  with Context(FLASH=2):
    out = ts[0].scaled_dot_product_attention(ts[1], ts[2], ts[3])
    assert len(create_schedule(out.uop, each_device)[0]) == 1
    got = out.numpy()
  with Context(FLASH=0): want = ts[0].scaled_dot_product_attention(ts[1], ts[2], ts[3]).numpy()
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
  assert np.isnan(got[:, :, 5]).all() == (mask_kind == "bool")


def test_assigned_into_its_values_memory() -> None:
  """v.assign(attention(q, k, v)): the kernel reads every row of v for each output row, so it may not write into v's memory as it goes
  (realize's direct writes: each later row read the rows already overwritten)."""
  q, k, v = inputs((1, 2, 16, 8), (1, 2, 16, 8), 8, np.float32, seed=3)
  tv = Tensor(v.copy())
  with Context(FLASH=2): tv.assign(Tensor(q).scaled_dot_product_attention(Tensor(k), tv)).realize()
  np.testing.assert_allclose(tv.numpy(), reference(q, k, v, False), rtol=2e-5, atol=2e-5)


def test_launch_report_of_tiles() -> None:
  """bench/gpu_launch_report.py at the catalog's GPU size: the old kernel's threads each read all keys and values (1024 reads of each
  element), the tiles' once a workgroup of 64 rows (16), coalesced; 4 workgroups of 47 KiB fill an SM's shared memory (a quarter of
  its thread slots), where counting threads alone said all of them."""
  bench = bench_module("gpu_launch_report")
  q, k, v = (Tensor(np.zeros((4, 16, 1024, 64), np.float32), device="EMU") for _ in range(3))
  with Context(FLASH=2): ast = create_schedule(q.scaled_dot_product_attention(k, v).uop, "EMU")[0][0].ast
  tiles = Kernel(ast, bench.GPU_CAPS).apply_opts(default_opts(Kernel(ast, bench.GPU_CAPS)))
  old = bench.report(Kernel(tiles.ast, bench.GPU_CAPS).apply_opts([Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.LOCAL, 2, 128)]))
  new = bench.report(tiles)
  assert sorted(old["reads"].values())[1:] == [1024, 1024] and sorted(new["reads"].values())[1:] == [16, 16]
  assert new["use"] == "in1:1.00 in2:1.00 in3:1.00 out:1.00" and (old["occupancy"], new["occupancy"]) == (1.0, 0.25)


# ***** TC on attention (Kernel.flash_tc, lower.flash.flash_attention_tc): a warp's 16 rows by mma.sync, 16-bit inputs, CUDA sm_80 and later *****
TC = Opt(OptOps.TC, 0, 1)


def tc_kernel(dt: DType, causal: bool, shape_q: tuple[int, ...], shape_kv: tuple[int, ...], ev: int, caps: DeviceCaps | None = None,
              seed: int = 0) -> tuple[Kernel, object, np.ndarray]:
  """Attention of `dt` on EMU (its arrays from NumPy: in memory) as a kernel of `caps` (EMU's), and NumPy's result."""
  q, k, v = inputs(shape_q, shape_kv, ev, np.float32, seed)
  t = [Tensor(x, device="EMU").cast(dt).realize() for x in (q, k, v)]
  with Context(FLASH=2): item = create_schedule(t[0].scaled_dot_product_attention(t[1], t[2], is_causal=causal).uop, "EMU")[0][0]
  q, k, v = (x.numpy().astype(np.float32) for x in t)
  return Kernel(item.ast, caps or Device["EMU"].caps), item.out, reference(q, k, v, causal)


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("opts", [[TC], [TC, Opt(OptOps.LOCAL, 2, 2)]], ids=["1 warp", "2 warps"])
def test_tensor_cores_match_numpy(dt: DType, causal: bool, opts: list[Opt]) -> None:
  """TC on EMU (mma.sync and ldmatrix as the PTX ISA lays their registers out, cp.async, shuffles): more keys than queries in tiles of
  32 (96 keys; causal: a tile past the block's rows skipped, a key past its row -inf), value dims unlike the query's; the error is the
  probabilities' and the output's rounding to 16 bits."""
  kk, out, ref = tc_kernel(dt, causal, (1, 2, 64, 32), (1, 2, 96, 32), 16, seed=4)
  kk.apply_opts(opts)
  assert kk.flash_sizes()[1] == 32
  program, _ = compile_kernel(kk, "EMU")
  out.copyin(np.full(out.size, np.nan, np.float32).astype(dt.np))  # type: ignore[attr-defined]
  program(out, *kk.bufs)
  tol = 3e-2 if dt == dtypes.bfloat16 else 4e-3
  np.testing.assert_allclose(out.numpy_view().astype(np.float64), ref.reshape(-1), rtol=tol, atol=tol)


def test_tensor_cores_say_why_not() -> None:
  gpu = cuda_caps("sm_90")
  f32, _, _ = tc_kernel(dtypes.float32, False, (1, 1, 32, 16), (1, 1, 32, 16), 16, gpu)
  f16, _, _ = tc_kernel(dtypes.float16, False, (1, 1, 32, 16), (1, 1, 32, 16), 16, gpu)
  odd, _, _ = tc_kernel(dtypes.float16, False, (1, 1, 32, 8), (1, 1, 32, 8), 8, gpu)
  for k, opts, why in [(f32, [TC], "16-bit float"), (odd, [TC], "multiples of 16"), (f16, [Opt(OptOps.TC, 0, 0)], "arg 1"),
                       (f16, [Opt(OptOps.STAGE, 0, 16), TC], "before any other opt"), (f16, [TC, Opt(OptOps.GROUP, 0, 2)], "rows' LOCAL"),
                       (Kernel(f16.ast, cuda_caps("sm_75")), [TC], "sm_80")]:
    with pytest.raises(KernelOptError, match=why): k.copy().apply_opts(opts)


def tc_gpu_kernels() -> list[Kernel]:
  """TC on attention at the catalog's GPU rows and head (1024 x 64), 4 warps a workgroup, in each 16-bit float, causal or not."""
  return [tc_kernel(dt, causal, (1, 2, 1024, 64), (1, 2, 1024, 64), 64, cuda_caps("sm_90"))[0].apply_opts([TC, Opt(OptOps.LOCAL, 2, 4)])
          for dt in (dtypes.float16, dtypes.bfloat16) for causal in (False, True)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: the CUDA renderer's output is not compile-checked here")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_tensor_cores_compile_in_registers(tmp_path, arch: str) -> None:  # type: ignore[no-untyped-def]
  """A lane's S (16 rows by 64 keys: 32 floats), output (16 x 64: 32) and queries' fragments (16 registers) stay in registers: none
  spilled (115-128 registers a thread with nvcc 12), tiles of 64 keys in 31 KiB of shared memory."""
  kernels = tc_gpu_kernels()
  for k, stats in zip(kernels, ptxas_stats_each(tmp_path, [CUDARenderer().render(k) for k in kernels], arch)):
    assert stats["registers"] <= 255 and stats["bytes spill stores"] == 0 and stats["bytes smem"] == 31744, (k.ast.dtype, stats)


# what the host stands in for beyond test_mma_on_host's SHIM: the shuffles (through an array, the block in lock step) and half2
HOST_SHIM = r"""
#include <cmath>
static float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
struct __half2 { half x, y; };
static __half2 __floats2half2_rn(float x, float y) { return {(half)x, (half)y}; }
static float tt_shfl[1024];
static float __shfl_xor_sync(unsigned, float v, int d) {
  int id = threadIdx.x; tt_shfl[id] = v; block_sync->arrive_and_wait(); float r = tt_shfl[id ^ d]; block_sync->arrive_and_wait(); return r; }
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ here to run the CUDA source on the host")
@pytest.mark.parametrize("causal", [False, True])
def test_tensor_cores_source_on_the_host(tmp_path, causal: bool) -> None:  # type: ignore[no-untyped-def]
  """The CUDA renderer's own text of TC on attention (its softmax, packing and sums on the accumulators, which EMU runs as its own
  statements) run on the host, one thread per GPU thread, with mma.sync, ldmatrix and cp.async as the PTX ISA has them: NumPy's result."""
  import re

  from ops_support import run_blocks_on_host
  from test_mma_on_host import SHIM, host_source
  k, out, ref = tc_kernel(dtypes.float16, causal, (1, 2, 64, 32), (1, 2, 96, 32), 16, cuda_caps("sm_90"), seed=4)
  k.apply_opts([TC, Opt(OptOps.LOCAL, 2, 2)])
  src = host_source(k)
  name = re.search(r"__launch_bounds__\(\d+\) (\w+)\(", src).group(1)  # type: ignore[union-attr]
  body = f"threadIdx.x = i; blockIdx.x = blk; {name}((half*)out, (const half*)a, (const half*)b, (const half*)c);"
  run = run_blocks_on_host(tmp_path, SHIM + HOST_SHIM + src, *k.launch_dims, body, result="misaligned_rows * 1000 + misaligned_copies",
                           inputs=("a", "b", "c"))
  got = np.full(out.size, np.nan, np.float16)  # type: ignore[attr-defined]  # out: a Buffer
  assert run(got, *(b.numpy_view() for b in k.bufs)) == 0, "misaligned ldmatrix rows or cp.async copies"  # type: ignore[attr-defined]
  np.testing.assert_allclose(got.astype(np.float64), ref.reshape(-1), rtol=4e-3, atol=4e-3)
