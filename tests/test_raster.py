"""RASTER: a GPU kernel's workgroups numbered in bands along one global axis, each band walked down one column of the next axis at a
time, so the workgroups at work together share their inputs' tiles in L2."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from ops_support import bench_module

from tinytune import Kernel, KernelOptError, Opt, OptOps, Tensor, engine
from tinytune.codegen.caps import cuda_caps
from tinytune.codegen.cstyle import CUDARenderer
from tinytune.codegen.heuristic import SHARED_TILE
from tinytune.codegen.lower import lower
from tinytune.engine import compile_kernel
from tinytune.engine.schedule import create_schedule
from tinytune.runtime import Device, device_status
from tinytune.uop import Ops

WORKGROUPS = [d for d in ("OPENCL", "EMU") if device_status(d) is None]
LOCAL_TILE = [Opt(OptOps.LOCAL, 1, 8), Opt(OptOps.LOCAL, 0, 8)]
(INNER, LOCAL, OUTER), _ = SHARED_TILE
STAGED_TILE = [Opt(OptOps.UPCAST, 1, INNER), Opt(OptOps.UPCAST, 0, INNER), Opt(OptOps.LOCAL, 1, LOCAL), Opt(OptOps.LOCAL, 0, LOCAL),
               Opt(OptOps.UPCAST, 1, OUTER), Opt(OptOps.UPCAST, 0, OUTER), Opt(OptOps.STAGE, 0, 16)]


def matmul_kernel(device: str, *shapes: tuple[int, ...]) -> tuple[Kernel, list[np.ndarray], np.ndarray]:
  arrays = [np.random.randn(*s).astype(np.float32) for s in shapes]
  ((_, k),) = engine.kernels((Tensor(arrays[0], device=device) @ Tensor(arrays[1], device=device)).uop, device)
  return k, arrays, arrays[0] @ arrays[1]


def run(k: Kernel, device: str) -> np.ndarray:
  from tinytune.runtime import Buffer
  out = Buffer(device, int(np.prod(k.out_shape)), k.ast.dtype)
  program, _ = compile_kernel(k, device)
  program(out, *k.bufs)
  return out.numpy_view().reshape(k.out_shape)


@pytest.mark.parametrize("device", WORKGROUPS)
@pytest.mark.parametrize("case", ["matmul", "batched", "staged"])
def test_raster_matches_numpy(device: str, case: str) -> None:
  """Every output tile computed once, in bands: a matmul (16 x 8 workgroups, bands of 4), a batched one (bands along the rows, the
  batch outermost), the shared-memory tile (4 x 2 workgroups of 128 x 128, bands of 2)."""
  shapes, opts = {"matmul": ([(128, 32), (32, 64)], [*LOCAL_TILE, Opt(OptOps.RASTER, 0, 4)]),
                  "batched": ([(3, 64, 16), (3, 16, 48)], [Opt(OptOps.LOCAL, 2, 8), Opt(OptOps.LOCAL, 1, 8), Opt(OptOps.RASTER, 1, 2)]),
                  "staged": ([(512, 32), (32, 256)], [*STAGED_TILE, Opt(OptOps.RASTER, 0, 2)])}[case]
  k, _, ref = matmul_kernel(device, *shapes)
  k.apply_opts(opts)
  np.testing.assert_allclose(run(k, device), ref, rtol=1e-4, atol=1e-4)


def test_bands_run_down_the_columns() -> None:
  """Workgroup ids 0..7 of a 16 x 8 grid in bands of 4: rows 0-3 of column 0, then rows 0-3 of column 1; id 32 starts the second band."""
  k, _, _ = matmul_kernel("EMU", (128, 32), (32, 64))
  k.apply_opts([*LOCAL_TILE, Opt(OptOps.RASTER, 0, 4)])
  specials = [u.arg for u in lower(k, CUDARenderer()).uops if u.op is Ops.SPECIAL and u.arg.id == "group_id"]
  def place(gid: int) -> tuple[int, int]:
    env = {s.var: gid // s.divisor % (s.modulus or 1 << 30) for s in specials}
    return env["g0b"] * 4 + env["g0w"], env["g1"]
  assert [place(g) for g in (0, 1, 2, 3, 4, 5, 32, 127)] == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1), (4, 0), (15, 7)]
  assert sorted(place(g) for g in range(128)) == [(r, c) for r in range(16) for c in range(8)]


def test_raster_checks() -> None:
  k, _, _ = matmul_kernel("EMU", (128, 32), (32, 64))
  k.apply_opts(LOCAL_TILE)
  for bad in (Opt(OptOps.RASTER, 0, 3), Opt(OptOps.RASTER, 0, 16), Opt(OptOps.RASTER, 1, 2), Opt(OptOps.RASTER, 2, 2)):
    with pytest.raises(KernelOptError): k.copy().apply_opt(bad)
  k.apply_opt(Opt(OptOps.RASTER, 0, 4))
  for bad in (Opt(OptOps.RASTER, 0, 2), Opt(OptOps.SWAP, 0, 1), Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.LOCAL, 0, 0)):
    with pytest.raises(KernelOptError): k.copy().apply_opt(bad)
  k.apply_opt(Opt(OptOps.UPCAST, 0, 2))  # 8 workgroups along axis 0 left: two bands
  cpu = Kernel(k.ast, Device["CPU"].caps)
  with pytest.raises(KernelOptError, match="workgroups"): cpu.apply_opt(Opt(OptOps.RASTER, 0, 4))


def test_raster_compiles_for_sm_90(tmp_path) -> None:  # type: ignore[no-untyped-def]
  """The CUDA source of the big tile in bands (nvcc -arch=sm_90 -cubin where nvcc is installed)."""
  k, _, _ = matmul_kernel("EMU", (4096, 256), (256, 4096))
  k = Kernel(k.ast, cuda_caps("sm_90")).apply_opts([*STAGED_TILE, Opt(OptOps.RASTER, 0, 8)])
  src = CUDARenderer().render(k)
  assert "blockIdx.x/8)%32" in src.replace(" ", "")
  if shutil.which("nvcc") is None: pytest.skip("nvcc is not installed")
  (tmp_path / "k.cu").write_text(src)
  res = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "k.cu"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]


def test_launch_report_counts_a_waves_tiles() -> None:
  """bench/gpu_launch_report.py's "wave MB" for float32 4096^3 (1024 workgroups of 128x128, 264 at work at once on 132 SMs): row by
  row, a wave reads 8 or 9 row panels of A and all 32 column panels of B; in bands of 16 rows, fewer."""
  bench = bench_module("gpu_launch_report")
  a, b = (Tensor(np.zeros((4096, 4096), np.float32), device="EMU") for _ in range(2))
  (item,), _ = create_schedule((a @ b).uop, "EMU")
  k = Kernel(item.ast, bench.GPU_CAPS)
  k.apply_opts([*STAGED_TILE, Opt(OptOps.UNROLL, 0, 4)])
  mb = 64 * 2 ** 20 / 32  # a panel of 128 rows (columns) of a 4096^2 float32 input
  waves = [(9, 32), (9, 32), (9, 32), (8, 32)]  # rows 0-8, 8-16, 16-24, 24-31 of 32: workgroups 0-263, 264-527, 528-791, 792-1023
  assert bench.wave_bytes(k, bench.lower(k, bench.CUDARenderer())) == pytest.approx(sum(r + c for r, c in waves) * mb)
  k.apply_opts([Opt(OptOps.RASTER, 0, 16)])
  assert bench.wave_bytes(k, bench.lower(k, bench.CUDARenderer())) < sum(r + c for r, c in waves) * mb


def test_no_raster_along_a_row() -> None:
  """A softmax kernel's workgroups run along its rows alone (its columns loop in each thread): RASTER has no second axis there."""
  ((_, k),) = engine.kernels(Tensor(np.zeros((64, 64), np.float32), device="EMU").softmax(-1).uop, "EMU")
  for axis in (0, 1):
    with pytest.raises(KernelOptError, match="RASTER"): k.copy().apply_opt(Opt(OptOps.RASTER, axis, 2))
