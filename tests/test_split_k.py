"""Split-K: a GPU reduce whose outputs are too few to fill the device, cut into shares across workgroups (heuristic.gpu_split_k),
the partials combined in order by a second kernel (schedule.split_k)."""
from __future__ import annotations

import numpy as np
import pytest
from ops_support import bench_module

from tinytune import Kernel, Tensor, engine
from tinytune.codegen.caps import cuda_caps
from tinytune.codegen.heuristic import SPLIT_MIN_K, default_opts, gpu_split_k
from tinytune.engine.schedule import create_schedule
from tinytune.helpers import Context
from tinytune.kernels import get_workload
from tinytune.kernels.workload import result, schedule
from tinytune.runtime import device_status

WORKGROUPS = [d for d in ("OPENCL", "EMU") if device_status(d) is None]


def kernels(t: Tensor, device: str) -> list[Kernel]: return [k for _, k in engine.kernels(t.uop, device)]


CASES = {  # name -> (the inputs' shapes, the tensor computation, NumPy's)
  "matmul, bias and relu": ([(6, 512), (512, 8), (8,)], lambda a, b, c: (a @ b + c).relu(), lambda a, b, c: np.maximum(a @ b + c, 0)),
  "row max": ([(3, 1024)], lambda a: a.max(axis=1), lambda a: a.max(axis=1)),
  "column sum": ([(1024, 12)], lambda a: a.sum(axis=0), lambda a: a.sum(axis=0)),
  "batched matmul": ([(2, 4, 256), (2, 256, 8)], lambda a, b: a @ b, lambda a, b: a @ b),
}


@pytest.mark.parametrize("device", WORKGROUPS)
@pytest.mark.parametrize("case", list(CASES))
def test_forced_split_matches_numpy(device: str, case: str) -> None:
  """SPLITK=4: one kernel more (the partials, then the kernel that combines them and runs the epilogue), the same values as NumPy."""
  shapes, fn, ref = CASES[case]
  arrays = [np.random.randn(*s).astype(np.float32) for s in shapes]
  with Context(SPLITK=0):
    plain = fn(*[Tensor(a, device=device) for a in arrays])
    n = len(kernels(plain, device))
  with Context(SPLITK=4):
    out = fn(*[Tensor(a, device=device) for a in arrays])
    assert len(kernels(out, device)) == n + 1
    np.testing.assert_allclose(out.numpy(), ref(*arrays), rtol=1e-4, atol=1e-4)


def test_split_runs_in_order_every_time() -> None:
  """The partials are added in one order (no atomics): two runs give the same bits."""
  a, b = np.random.randn(4, 2048).astype(np.float32), np.random.randn(2048, 4).astype(np.float32)
  with Context(SPLITK=8):
    first, second = ((Tensor(a, device="EMU") @ Tensor(b, device="EMU")).numpy() for _ in range(2))
  assert first.tobytes() == second.tobytes()


def gpu_kernels(name: str, device: str = "EMU", **params: int) -> list[Kernel]:
  w = get_workload(name)
  ins = [Tensor.full(shape, i + 1.0, device=device).contiguous().realize() for i, shape in enumerate(w.inputs(w.params(params)))]
  items, _ = schedule(w.build(w.params(params), *ins), device)
  return [Kernel(item.ast, cuda_caps("sm_90")) for item in items]


def test_kernels_with_a_workgroup_for_each_sm_are_not_split() -> None:
  """Attention 4x16x1024x64's P.V (512 workgroups of its 128x64 shared tile; 256 of the register tile it was measured split in), bmm
  32x512^3 (512) and a matmul 4096^3 (1024) fill an H200's 132 SMs: not split (split, P.V and bmm measured slower there). Attention as
  its graph (FLASH=0): in one kernel it has no P.V of its own."""
  with Context(FLASH=0): ks = gpu_kernels("attention", batch=4, heads=16, seq=1024, dim=64)
  assert [k.name for k in ks][-1] == "r_4_16_1024_64_1024" and len(ks) == 3 and all(gpu_split_k(k) == 1 for k in ks)
  assert len(gpu_kernels("bmm", batch=32, m=512, n=512, k=512)) == 1
  assert len(gpu_kernels("matmul", m=4096, n=4096, k=4096)) == 1
  with Context(SPLITK=4, FLASH=0): ks = gpu_kernels("attention", batch=4, heads=16, seq=1024, dim=64)  # forced: every sum split
  assert [k.name for k in ks][-2:] == ["r_4_4_16_1024_64_256", "r_4_16_1024_64_4"]


def test_few_rows_with_a_long_k_are_split() -> None:
  """A linear layer of 16 rows (16x4096 @ 4096x1024): a few thousand threads; split into the most shares (16) that keep K's shares
  SPLIT_MIN_K long or longer. With a K of 2 x SPLIT_MIN_K, 2 shares; shorter, none; on sm_80 (108 SMs) as on sm_90."""
  for k, shares in ((4096, 16), (2 * SPLIT_MIN_K, 2), (SPLIT_MIN_K, 1)):
    a, b = (Tensor.full(s, 1.0, device="EMU").contiguous().realize() for s in ((16, k), (k, 1024)))
    with Context(SPLITK=0): (ast,) = [item.ast for item in create_schedule((a @ b).uop, "EMU")[0]]
    assert [gpu_split_k(Kernel(ast, cuda_caps(arch))) for arch in ("sm_80", "sm_90")] == [shares] * 2


def test_small_matmuls_shrink_their_register_tile_to_fill_the_sms() -> None:
  """The MLP's 128x784 @ 784x128 ran 4 workgroups of 4x4 tiles in 2 shares on an H200's 132 SMs (71.6 us): each thread now computes
  one output, 64 workgroups in 2 shares. Where the 4x4 tile in its shares reaches the SMs (16 rows over K=4096: 64 workgroups in 16
  shares) it stays, and so does a big matmul's."""
  def plan(m: int, k: int, n: int) -> tuple[int, int, int]:
    a, b = (Tensor.full(s, 1.0, device="EMU").contiguous().realize() for s in ((m, k), (k, n)))
    with Context(SPLITK=0): (ast,) = [item.ast for item in create_schedule((a @ b).uop, "EMU")[0]]
    kernel = Kernel(ast, cuda_caps("sm_90"))
    shares, tiled = gpu_split_k(kernel), kernel.copy().apply_opts(default_opts(kernel))
    groups, threads = tiled.launch_dims
    return groups, m * n // (groups * threads), shares  # workgroups, outputs a thread, shares
  assert plan(128, 784, 128) == (64, 1, 2)
  assert plan(16, 4096, 1024) == (16, 16, 16)
  assert plan(1024, 1024, 1024)[:2] == (256, 16)


def test_heuristic_split_on_emu_matches_numpy() -> None:
  """The planner's own split (8x1024 @ 1024x64: 2 workgroups), run warp by warp on EMU."""
  a, b = np.random.randn(8, 1024).astype(np.float32), np.random.randn(1024, 64).astype(np.float32)
  out = Tensor(a, device="EMU") @ Tensor(b, device="EMU")
  assert [k.out_shape for k in kernels(out, "EMU")] == [(4, 8, 64), (8, 64)]
  np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(device_status("OPENCL") is not None, reason=f"OPENCL: {device_status('OPENCL')}")
def test_small_attention_split_matches_numpy_on_opencl() -> None:
  w = get_workload("attention")
  p = w.params({"batch": 1, "heads": 2, "seq": 512, "dim": 16})
  with Context(SPLITK=2):
    out, arrays = w.instantiate(p, device="OPENCL")
    np.testing.assert_allclose(result(out), w.reference(p, *arrays), rtol=1e-4, atol=1e-4)


def test_gpu_suite_times_the_mlp_forward_under_each_split() -> None:
  """bench/gpu_suite.py's launch overhead, on the CPU: the one-kernel step (here, in a fresh process, and here with garbage collection
  off) and the MLP forward under TinyJit, each with its host's issuing time, and the forward again under each of MLP_SPLITS, its output
  the default's."""
  import argparse
  suite_module = bench_module("gpu_suite")
  suite = suite_module.Suite(argparse.Namespace(quick=True, budget=600))
  suite_module.overhead(suite, "CPU", steps=4)
  rows = [line.split(" | ") for line in suite.lines if line.startswith("| ") and "---" not in line]  # the header goes with its rule
  heap = rows[2][0].split("(")[1].split()[0]
  assert int(heap) > 1000  # the process's objects, counted: a test run holds far more
  assert [r[0] for r in rows] == ["| one-kernel step, 4096 floats", "| the same step in a fresh process",
                                  f"| the same step, garbage collection off ({heap} objects in this process)",
                                  "| MLP 784-128-10 forward, TinyJit (one native call, 2 kernels)",
                                  *[f"| the same, SPLITK={n} (one native call, 2 kernels)" for n in suite_module.MLP_SPLITS]]
  assert all(float(r[1]) > 0 for r in rows) and all(float(r[2]) > 0 for r in rows if r[2] != "-")
