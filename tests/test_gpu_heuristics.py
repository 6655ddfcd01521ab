"""The default opts on a big GPU (an H100's caps, no GPU needed): each rule of the GPU planners, read off the kernel and its lowered
program, and the kernels they make run against NumPy on OPENCL (pocl in CI) at sizes that take each planner's path. The kernels are
scheduled on OPENCL, as a GPU's are (the CPU's schedule differs: Winograd's convolutions, row arrays)."""
from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import pytest
from ops_support import bench_module, ptxas_stats_each

from tinytune import Context, Kernel, Opt, OptOps, Tensor, engine
from tinytune.codegen.caps import cuda_caps
from tinytune.codegen.cstyle import CUDARenderer
from tinytune.codegen.heuristic import GPU_THREADS, default_opts
from tinytune.codegen.kernel import AxisKind
from tinytune.codegen.lower import lower
from tinytune.dtype import dtypes
from tinytune.engine import compile_kernel
from tinytune.engine.schedule import create_schedule
from tinytune.kernels import get_workload
from tinytune.kernels.workload import result, schedule
from tinytune.runtime import Device, DeviceCaps, device_status
from tinytune.uop import Ops, UOp, simplify

H100 = DeviceCaps(has_local=True, threads=1, max_upcast=256, simd_width=4, vector_registers=255, max_local=1024, shared_bytes=48 * 1024,
                  tensor_cores=("float16", "bfloat16"))
needs_opencl = pytest.mark.skipif(device_status("OPENCL") is not None, reason=f"OPENCL: {device_status('OPENCL')}")


def gpu_kernels(name: str, **params: int) -> list[Kernel]:
  """The workload's kernels, scheduled as for a GPU (on OPENCL), with the default opts for an H100."""
  w = get_workload(name)
  ins = [Tensor.full(shape, i + 1.0, device="OPENCL").contiguous().realize() for i, shape in enumerate(w.inputs(w.params(params)))]
  items, _ = schedule(w.build(w.params(params), *ins), "OPENCL")
  return [Kernel(item.ast, H100).apply_opts(default_opts(Kernel(item.ast, H100))) for item in items]


def warp_steps(k: Kernel) -> list[int]:
  """For each global load of the lowered kernel, how far (in elements) thread 1 of a workgroup reads from thread 0."""
  prog = lower(k, CUDARenderer())
  def at(lid: int) -> dict[UOp, UOp]:
    env = {u.arg.var: (lid // u.arg.divisor) % (u.arg.modulus or 1 << 30) for u in prog.uops if u.op is Ops.SPECIAL and u.arg.id == "lid"}
    return {v: UOp.const(dtypes.int64, env.get(v.arg[0], 0)) for u in prog.uops if u.op is Ops.LOAD for v in u.src[0].vars}
  loads = [u.src[0] for u in prog.uops if u.op is Ops.LOAD and isinstance(u.arg.buf, int)]
  return [simplify(i.substitute(at(1))).arg - simplify(i.substitute(at(0))).arg for i in loads]


def threads(k: Kernel) -> int: return k.launch_dims[0] * k.launch_dims[1]


def create_ast(t: Tensor, device: str = "OPENCL") -> UOp:
  (item,), _ = create_schedule(t.uop, device)
  return item.ast


@needs_opencl
def test_column_sum_threads_run_along_the_kept_row() -> None:
  """Sum over axis 0 of 8192^2 (932 GB/s on an H200, 0.29x PyTorch): threads read 16 bytes each, side by side along the row, and the
  rows are shared by GROUPs of them so the GPU has enough threads (it had 256 threads reading down each column)."""
  (k,) = gpu_kernels("reduce", rows=8192, cols=8192, axis=0)
  assert set(warp_steps(k)) == {4}  # float4 loads, neighbours 16 bytes apart
  assert any(a.kind is AxisKind.GROUP for a in k.axes) and threads(k) >= GPU_THREADS // 2
  assert k.axes[k.thread_axes[-1]].kind is AxisKind.LOCAL


@needs_opencl
def test_row_reduce_with_many_rows_shares_each_row() -> None:
  """Attention's row max and sum over 64Ki rows of 1024 ran one thread a workgroup, each reading its row alone: then a group of
  threads read each row side by side, in workgroups of 256, and now its softmax is one kernel that does so (gpu_row_statistic)."""
  ks = [k for k in gpu_kernels("attention", batch=4, heads=16, seq=1024, dim=64) if k.row_dims]
  assert len(ks) == 1
  for k in ks:
    assert k.launch_dims[1] >= 128 and warp_steps(k)[0] == 1


@needs_opencl
def test_conv_on_a_gpu_is_a_register_tile_read_along_the_positions() -> None:
  """conv2d 32x64->64 at 56^2 (4.7 ms on an H200, 0.05x cuDNN): each thread computes 4 positions by 8 output channels (every input
  value loaded serves 8 channels), neighbouring threads read neighbouring positions, and the positions are whole warps of 4."""
  k = next(k for k in gpu_kernels("conv2d", batch=32, cin=64, cout=64, size=56) if k.reduceop is not None)
  assert k.sizes[2] % 128 == 0
  assert {(a.dim, a.size) for a in k.axes if a.kind is AxisKind.UPCAST} == {(1, 8), (2, 4)}
  assert set(warp_steps(k)) == {0, 1}  # the input's loads step 1, the weight's are one value for the warp
  assert threads(k) >= GPU_THREADS


@needs_opencl
def test_copies_fill_their_workgroups() -> None:
  """The convolution's padded copy (rows of 58) ran 2 threads a workgroup, and an SM holds at most 32 workgroups: now at least 128."""
  for k in gpu_kernels("conv2d", batch=32, cin=64, cout=64, size=56):
    if k.reduceop is None: assert k.launch_dims[1] >= 128, k


@needs_opencl
def test_unaligned_rows_keep_their_loads_side_by_side() -> None:
  """An elementwise kernel whose rows do not start 16-byte aligned gets no 4-element upcast (4 scalar loads a thread, each warp
  access 4 times the sectors): one element a thread, neighbours side by side."""
  a = Tensor.full((64, 58), 1.0, device="OPENCL").contiguous().realize()
  k = Kernel(create_ast(a[:, 1:57] * 2), H100)
  k.apply_opts(default_opts(k))
  assert all(a.kind is not AxisKind.UPCAST for a in k.axes) and warp_steps(k) == [1] and k.launch_dims[1] >= 128


@needs_opencl
def test_a_transpose_reads_and_writes_in_warp_tiles() -> None:
  """linear's W.T copy read each input element a row apart per thread (an eighth of each sector used): now 8 columns by 32 rows a
  workgroup (25 of W's 200 here), each warp 8 by 4, and the values are W's transposed."""
  w = np.arange(96 * 200, dtype=np.float32).reshape(96, 200)
  t = Tensor(w, device="OPENCL").T.contiguous()
  k = Kernel(create_ast(t), H100)
  opts = default_opts(k)
  assert opts[0] == Opt(OptOps.LOCAL, 1, 8) and opts[1].op is OptOps.LOCAL and opts[1].axis == 0 and opts[1].arg >= 8, opts
  np.testing.assert_array_equal(t.numpy(), w.T)


@needs_opencl
def test_thread_order_follows_the_contiguous_axis() -> None:
  """GROUP parts are the fastest threads where the reduce reads along its axis (a row sum), the slowest where it reads across it."""
  rows = Tensor.full((256, 512), 1.0, device="OPENCL").contiguous().realize()
  for axis, fastest in ((1, AxisKind.GROUP), (0, AxisKind.LOCAL)):
    k = Kernel(create_ast(rows.sum(axis)), H100).apply_opts([Opt(OptOps.LOCAL, 0, 8), Opt(OptOps.GROUP, 0, 16)])
    assert k.axes[k.thread_axes[-1]].kind is fastest


@pytest.mark.parametrize("device", ["OPENCL", "EMU"])
@pytest.mark.parametrize("axis,opts", [
  (1, [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUP, 0, 16)]),  # partials in a tree, the GROUP fastest
  (0, [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUP, 0, 16)]),  # a tree, the GROUP slowest
  (0, [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUPTOP, 0, 8), Opt(OptOps.GROUP, 0, 2)]),  # two GROUP parts, a tree of their 16
  (0, [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUP, 0, 3)]),  # not a power of two: the first thread adds them one by one
])
def test_group_partials(device: str, axis: int, opts: list[Opt]) -> None:
  """GROUP partials added in a tree (a power of two) or one by one, with the GROUP parts fastest or slowest in the thread id: the
  sums match NumPy's, and on EMU no shared-memory read races its write."""
  if device_status(device) is not None: pytest.skip(f"{device}: {device_status(device)}")
  a = np.random.default_rng(axis).standard_normal((48, 64)).astype(np.float32)
  t = Tensor(a, device=device)
  (item,), _ = create_schedule(t.sum(axis).uop, device)
  k = Kernel(item.ast, Device[device].caps).apply_opts(opts)
  program, _ = compile_kernel(k, device)
  program(item.out, *k.bufs)
  np.testing.assert_allclose(item.out.numpy_view(), a.sum(axis), rtol=1e-5, atol=1e-4)


@needs_opencl
@pytest.mark.parametrize("name,params", [
  ("reduce", {"rows": 2048, "cols": 1024, "axis": 0}),  # columns: 256 float4 threads, rows in GROUPs (group slowest)
  ("reduce", {"rows": 40000, "cols": 64, "axis": 1}),  # many rows: a GROUP a row
  ("softmax", {"rows": 40000, "cols": 64}),
  ("conv2d", {"batch": 4, "cin": 2, "cout": 64, "size": 64}),  # over 2^20 outputs: a 4x2 register tile
  ("conv2d", {"batch": 1, "cin": 1, "cout": 2, "size": 3, "padding": 0}),  # too small to round the positions up to 128
  ("conv2d", {"batch": 2, "cin": 3, "cout": 4, "size": 30, "padding": 1}),  # 960 positions, rounded to 1024
  ("conv2d", {"batch": 1, "cin": 3, "cout": 32, "size": 50, "stride": 2}),
])
def test_gpu_paths_match_numpy_on_opencl(name: str, params: dict[str, int]) -> None:
  w = get_workload(name)
  p = w.params(params)
  out, arrays = w.instantiate(p, device="OPENCL")
  np.testing.assert_allclose(result(out), w.reference(p, *arrays), rtol=1e-4, atol=1e-3)


def test_launch_report_reads_coalescing_off_the_lowered_kernel(capsys: pytest.CaptureFixture[str]) -> None:
  """bench/gpu_launch_report.py: a column sum read by GROUP threads alone (neighbours a row apart) uses an eighth of each sector a
  warp touches, the default plan all of it; the script prints a row per kernel."""
  bench = bench_module("gpu_launch_report")
  ast = create_ast(Tensor.full((512, 256), 1.0, device="EMU").contiguous().realize().sum(0), "EMU")
  old = bench.report(Kernel(ast, H100).apply_opts([Opt(OptOps.GROUP, 0, 64)]))
  new = bench.report(Kernel(ast, H100).apply_opts(default_opts(Kernel(ast, H100))))
  assert (old["use"].split()[0], new["use"].split()[0]) == ("in1:0.12", "in1:1.00") and old["launch"] == "256x64"
  import sys
  argv, sys.argv = sys.argv, ["gpu_launch_report.py", "reduce:rows=512,cols=256,axis=0"]
  try: bench.main()
  finally: sys.argv = argv
  assert "| r_256_512 | UP0,4 LO0,8 GR0,64 UN0,4 | 8x512 |" in capsys.readouterr().out


def test_launch_report_counts_the_pipelines_copies() -> None:
  """bench/gpu_launch_report.py: PIPELINE's cp.async copies are the staged matmul's global loads (the report counted none): float16
  1024^3 on tensor cores reads each input 8 times, once a 128-wide workgroup tile, and once more for the tile past the last that its
  ring's copy asks for behind a guard (33 of 32 K tiles: 8.25)."""
  bench = bench_module("gpu_launch_report")
  a, b = (Tensor(np.ones((1024, 1024), np.float16), device="EMU").realize() for _ in range(2))
  with Context(SPLITK=0): k = Kernel(create_ast(a @ b, "EMU"), bench.GPU_CAPS)  # one kernel: its 64 workgroups, not K in shares
  k.apply_opts(default_opts(k))
  assert Opt(OptOps.PIPELINE, 0, 2) in k.opts and k.tc is not None
  row = bench.report(k)
  assert sorted(row["reads"].values()) == [8.25, 8.25] and row["use"].startswith("in1:1.00 in2:1.00") and row["bound"] == "tc"


def test_conv_register_tile_runs_on_emu() -> None:
  """The GPU-size conv's plan (4 positions x 8 output channels a thread, the window's columns unrolled) needs over 4M outputs: on
  EMU, the CUDA program warp by warp, against NumPy (7 s here)."""
  w = get_workload("conv2d")
  p = w.params({"batch": 20, "cin": 4, "cout": 64, "size": 56})
  out, arrays = w.instantiate(p, device="EMU")
  items, _ = schedule(out, "EMU")
  k = engine.kernels(items, "EMU")[1][1]
  assert default_opts(k) == [Opt(OptOps.LOCAL, 2, 32), Opt(OptOps.UPCAST, 2, 4), Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.LOCAL, 1, 2),
                             Opt(OptOps.UNROLL, 2, 3)]
  np.testing.assert_allclose(result(out), w.reference(p, *arrays), rtol=1e-4, atol=1e-3)


def conv_tile(positions: int, channels: int) -> list[Opt]:
  """gpu_conv's plan for the convolution (output channels, positions, then the reduce) with its tile of positions x channels a thread."""
  return [Opt(OptOps.LOCAL, 2, 32), Opt(OptOps.UPCAST, 2, positions), Opt(OptOps.UPCAST, 1, channels), Opt(OptOps.LOCAL, 1, 2),
          Opt(OptOps.UNROLL, 2, 3)]


@pytest.mark.parametrize("positions,channels", [(8, 8), (4, 16), (2, 8)])
def test_conv_tiles_timed_beside_the_default_run_on_emu(positions: int, channels: int) -> None:
  """The convolution's register tiles that bench/gpu_suite.py's KERNEL_VARIANTS time against the default's 4 x 8 (positions x output
  channels a thread): each kernel of the schedule run on EMU in turn, the convolution's with the tile, the output against NumPy."""
  w = get_workload("conv2d")
  p = w.params({"batch": 2, "cin": 5, "cout": 64, "size": 30})
  out, arrays = w.instantiate(p, device="EMU")
  items, _ = schedule(out, "EMU")
  dev = Device["EMU"]
  for item in items:
    k = Kernel(item.ast, dev.caps)
    k.apply_opts(conv_tile(positions, channels) if k.reduceop is not None else default_opts(k))
    dev.program(k.name, dev.compile(dev.renderer.render(k)), k.launch_dims)(item.out, *k.bufs)
  ref = w.reference(p, *arrays)
  np.testing.assert_allclose(items[-1].out.numpy_view().reshape(ref.shape), ref, rtol=1e-4, atol=1e-3)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: the convolution's tiles are not compile-checked here")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_conv_tiles_compile_without_spills(tmp_path: Any, arch: str) -> None:
  """The GPU-size convolution (32x64->64 at 56^2) with 8 x 8 and 4 x 16 outputs a thread: nvcc keeps them in registers (93-96)."""
  k = next(k for k in gpu_kernels("conv2d", batch=32, cin=64, cout=64, size=56) if k.reduceop is not None)
  tiles = ((8, 8), (4, 16))
  srcs = [CUDARenderer().render(Kernel(k.ast, cuda_caps(arch)).apply_opts(conv_tile(*tile))) for tile in tiles]
  for tile, stats in zip(tiles, ptxas_stats_each(tmp_path, srcs, arch)):
    assert stats["bytes spill stores"] == stats["bytes spill loads"] == 0 and stats["registers"] <= 128, (tile, stats)


def shared_tile_64(row: int) -> list[Opt]:
  """The 128x64 shared tile (8x8 a thread, 16 x 8 threads) of a GEMM with its 64 columns along dim 3 and its rows along dim `row`."""
  return [Opt(OptOps.UPCAST, 3, 4), Opt(OptOps.UPCAST, row, 4), Opt(OptOps.LOCAL, 3, 8), Opt(OptOps.LOCAL, row, 16), Opt(OptOps.UPCAST, 3, 2),
          Opt(OptOps.UPCAST, row, 2), Opt(OptOps.STAGE, 0, 16), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.PIPELINE, 0, 2)]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_gemms_of_64_columns_take_a_128x64_shared_tile(tmp_path: Any, arch: str) -> None:
  """Winograd's GEMMs on a GPU (WINO=2: 36 of 6272x64 by 64x64) and attention's P.V (64 x 1024x64 by 1024x64, FLASH=0) read their
  rows from memory at 0.12 of each sector with the register tile (128x128 shared tiles do not fit 64 columns): now a 128x64 shared
  tile, the same 8x8 a thread, in 2 cp.async stages, no spills on sm_80 or sm_90; on EMU at small sizes, with each so tiled, the
  convolution and attention match NumPy."""
  with Context(WINO=2): wino = next(k for k in gpu_kernels("conv2d", batch=32, cin=64, cout=64, size=56) if k.reduceop is not None)
  with Context(FLASH=0): pv = [k for k in gpu_kernels("attention", batch=4, heads=16, seq=1024, dim=64) if k.reduceop is not None][-1]
  tiled = []
  for k, row in ((wino, 1), (pv, 2)):
    k = Kernel(k.ast, cuda_caps(arch))
    assert default_opts(k) == shared_tile_64(row), (k.name, default_opts(k))
    tiled.append(k.apply_opts(shared_tile_64(row)))
  if shutil.which("nvcc") is not None:
    for k, stats in zip(tiled, ptxas_stats_each(tmp_path, [CUDARenderer().render(k) for k in tiled], arch)):
      assert stats["bytes spill stores"] == stats["bytes spill loads"] == 0 and stats["registers"] <= 128, (k.name, stats)
  if arch != "sm_90": return
  dev = Device["EMU"]
  for name, params, context, row in (("conv2d", {"batch": 2, "cin": 32, "cout": 64, "size": 32}, {"WINO": 2}, 1),  # 128 tiles, 2 K tiles
                                     ("attention", {"batch": 1, "heads": 1, "seq": 128, "dim": 64}, {"FLASH": 0}, 2)):
    w = get_workload(name)
    p = w.params(params)
    with Context(**context):
      out, arrays = w.instantiate(p, device="EMU")
      items, _ = schedule(out, "EMU")
    last = [i for i, item in enumerate(items) if Kernel(item.ast, dev.caps).reduceop is not None][-1]
    for i, item in enumerate(items):
      k = Kernel(item.ast, dev.caps)
      k.apply_opts(shared_tile_64(row) if i == last else default_opts(k))
      dev.program(k.name, dev.compile(dev.renderer.render(k)), k.launch_dims)(item.out, *k.bufs)
    ref = w.reference(p, *arrays)
    np.testing.assert_allclose(items[-1].out.numpy_view().reshape(ref.shape), ref, rtol=1e-3, atol=1e-3)
