"""The OpenCL device through pyopencl: any OpenCL platform, pocl on the CPU included, so workgroup opts run without a GPU."""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from tinytune.codegen.cstyle import OpenCLRenderer
from tinytune.dtype import DType
from tinytune.helpers import env_int
from tinytune.runtime import Buffer, Compiled, CompileError, DeviceCaps, DeviceMissing, Program, disk_cached

try:
  import pyopencl as cl
except ImportError: cl = None  # type: ignore[assignment]

# one program build at a time: pocl aborted the process on loading binaries that threads had built side by side
BUILDS = threading.Lock()


class OpenCLProgram(Program):
  def __init__(self, dev: OpenCLDevice, name: str, binary: bytes, launch: tuple[int, int]):
    self.dev, self.launch = dev, launch
    with BUILDS: self.kernel = getattr(cl.Program(dev.ctx, [dev.device], [binary]).build(), name)

  def __call__(self, *bufs: Buffer, wait: bool = False) -> float | None:
    groups, threads = self.launch
    event = self.kernel(self.dev.queue, (groups * threads,), (threads,), *[b.mem for b in bufs])
    if not wait: return None
    event.wait()
    return (event.profile.end - event.profile.start) * 1e-9


class OpenCLDevice(Compiled):
  name = "OPENCL"

  def __init__(self) -> None:
    if cl is None: raise DeviceMissing('OPENCL needs pyopencl: pip install "tinytune[opencl]" and an OpenCL driver (apt-get install pocl-opencl-icd)')
    try: devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    except cl.Error as e: devices, why = [], str(e)
    else: why = "no platform has a device"
    if not devices: raise DeviceMissing(f"OPENCL found no device ({why}): install a driver, e.g. apt-get install pocl-opencl-icd")
    self.device = devices[env_int("TINYTUNE_OPENCL_DEVICE", 0, 0)]
    self.ctx = cl.Context([self.device])
    self.is_gpu = bool(self.device.type & cl.device_type.GPU)
    self.queue = cl.CommandQueue(self.ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    fp64 = "cl_khr_fp64" in self.device.extensions or bool(getattr(self.device, "double_fp_config", 0))
    self.renderer = OpenCLRenderer(fp16="cl_khr_fp16" in self.device.extensions, fp64=fp64)
    self.caps = DeviceCaps(has_local=True, threads=1, max_upcast=64, simd_width=4, vector_registers=64,
                           max_local=min(self.device.max_work_group_size, 1024), shared_bytes=self.device.local_mem_size, gpu=self.is_gpu,
                           sms=self.device.max_compute_units if self.is_gpu else 0)  # a GPU's compute units: its SMs or CUs

  asynchronous = True  # one in-order queue: a launch is queued, and blocking copies wait for what is before them
  def synchronize(self) -> None: self.queue.finish()

  def alloc(self, size: int, dtype: DType) -> Any: return cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE, max(1, size) * dtype.itemsize)
  def copyin(self, mem: Any, data: np.ndarray) -> None:
    if data.size: cl.enqueue_copy(self.queue, mem, data, is_blocking=True)
  def copyout(self, mem: Any, size: int, dtype: DType) -> np.ndarray:
    out = np.empty(size, dtype=dtype.np)
    if size: cl.enqueue_copy(self.queue, out, mem, is_blocking=True)
    return out

  def compile(self, src: str) -> bytes:
    """Source -> the device's program binary, cached on disk by source, device and driver."""
    def build() -> bytes:
      try:
        with BUILDS: return cl.Program(self.ctx, src).build().get_info(cl.program_info.BINARIES)[0]
      except cl.Error as e: raise CompileError(f"OpenCL build failed: {e}\n{src}") from None
    return disk_cached("opencl", [src, *self.fingerprint().values()], build)

  def program(self, name: str, lib: bytes, launch: tuple[int, int] = (1, 1)) -> Program: return OpenCLProgram(self, name, lib, launch)

  def fingerprint(self) -> dict[str, str]:
    d = self.device
    return {"kind": "OPENCL", "name": d.name.strip(), "arch": d.platform.name.strip(), "compiler": d.version.strip(),
            "compiler_version": d.driver_version.strip(), "flags": ""}
