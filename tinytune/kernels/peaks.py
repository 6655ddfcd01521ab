"""A small probe of a device's peak throughput (GFLOPS of a large float32 matmul, GB/s of a large copy), measured once and stored.

On the CPU it times NumPy's BLAS and a NumPy copy; on a GPU, PyTorch on that GPU. It is the roof of the roofline plot, an
estimate of what the device sustains, not its data-sheet peak."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tinytune.kernels.baselines import time_callable, torch_device, torch_module, wall
from tinytune.search.evaluate import TimingPolicy

POLICY = TimingPolicy(min_repeats=3, max_repeats=10, max_seconds=0.5)


def measure_peaks(device: str, n: int = 1024, copy_mb: int = 64) -> tuple[float, float, str]:
  """(GFLOPS, GB/s, how) for `device`."""
  if device == "CPU":
    a, b = np.ones((n, n), np.float32), np.ones((n, n), np.float32)
    src, dst = np.ones(copy_mb << 18, np.float32), np.empty(copy_mb << 18, np.float32)
    matmul: Callable[[], Any] = lambda: a @ b
    copy: Callable[[], Any] = lambda: np.copyto(dst, src)
    how, sync = f"numpy {np.__version__}: {n}x{n} float32 matmul, {copy_mb} MB copy", lambda: None
  else:
    torch = torch_module()
    dev = torch_device(device)
    a, b = torch.ones((n, n), device=dev), torch.ones((n, n), device=dev)
    src, dst = torch.ones(copy_mb << 18, device=dev), torch.empty(copy_mb << 18, device=dev)
    matmul, copy = lambda: a @ b, lambda: dst.copy_(src)
    how, sync = f"torch {torch.__version__} on {dev}: {n}x{n} float32 matmul, {copy_mb} MB copy", torch.cuda.synchronize
  gflops = 2 * n ** 3 / min(time_callable(wall(lambda: (matmul(), sync())), POLICY)) / 1e9
  gbs = 2 * (copy_mb << 20) / min(time_callable(wall(lambda: (copy(), sync())), POLICY)) / 1e9  # read and write
  return gflops, gbs, how


def device_peaks(db: Any, device: str, fingerprint: dict[str, str], measure: bool = True) -> tuple[float, float] | None:
  """The stored peaks of this device; measured now and stored if there are none and `measure`."""
  device_id = db.device_id(fingerprint)
  if (peak := db.peak(device_id)) is not None: return peak.gflops, peak.gbs
  if not measure: return None
  gflops, gbs, how = measure_peaks(device)
  db.set_peak(device_id, gflops, gbs, how)
  return gflops, gbs
