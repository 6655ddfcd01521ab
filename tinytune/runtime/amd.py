"""The AMD device (alias HIP): kernels compiled by hiprtc for this GPU's gfx target, run through the HIP runtime,
timed with HIP events. Bound with ctypes on ROCm's own libraries, so it needs ROCm and nothing from PyPI."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
from typing import Any, Callable

import numpy as np

from tinytune.codegen.caps import amd_caps
from tinytune.codegen.cstyle import HIPRenderer
from tinytune.dtype import DType
from tinytune.helpers import env_int
from tinytune.runtime import Buffer, Compiled, CompileError, DeviceMissing, KernelArgs, KernelGraph, Program, Steps, disk_cached, kept_address


def _lib(name: str) -> ctypes.CDLL:
  for path in (ctypes.util.find_library(name), f"lib{name}.so", os.path.join(os.getenv("ROCM_PATH", "/opt/rocm"), "lib", f"lib{name}.so")):
    if path:
      try: return ctypes.CDLL(path)
      except OSError: pass
  raise DeviceMissing(f"AMD needs ROCm's lib{name}.so (install ROCm, or set ROCM_PATH), and an AMD GPU")


class _DeviceProp(ctypes.Structure):  # hipDeviceProp_t begins with name[256]; the rest is read through attributes
  _fields_ = [("name", ctypes.c_char * 256), ("rest", ctypes.c_byte * 4096)]


HIP_ATTR_MAX_THREADS_PER_BLOCK, HIP_ATTR_MAX_SHARED_PER_BLOCK = 56, 74  # hipDeviceAttribute_t values (ROCm 6)


def _gfx_target(ordinal: int) -> str:
  """This GPU's gfx target (e.g. gfx90a), as ROCm's amdgpu-arch or rocm_agent_enumerator lists it."""
  rocm = os.getenv("ROCM_PATH", "/opt/rocm")
  for tool in ("amdgpu-arch", f"{rocm}/llvm/bin/amdgpu-arch", "rocm_agent_enumerator", f"{rocm}/bin/rocm_agent_enumerator"):
    try: out = subprocess.run([tool], capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError): continue
    if targets := [t for t in out if t.startswith("gfx") and t != "gfx000"]: return targets[min(ordinal, len(targets) - 1)]
  raise DeviceMissing("AMD could not find the GPU's gfx target (no amdgpu-arch or rocm_agent_enumerator): set TINYTUNE_AMD_ARCH, e.g. gfx90a")


class AMDProgram(Program):
  def __init__(self, dev: AMDDevice, name: str, code: bytes, launch: tuple[int, int]):
    self.dev, self.launch, self.code = dev, launch, code  # the module reads the code object in place: keep it alive
    self.module, self.function = ctypes.c_void_p(), ctypes.c_void_p()
    dev.check(dev.hip.hipModuleLoadData(ctypes.byref(self.module), code), "hipModuleLoadData")
    dev.check(dev.hip.hipModuleGetFunction(ctypes.byref(self.function), self.module, name.encode()), "hipModuleGetFunction")
    self.args: KernelArgs | None = None

  def __call__(self, *bufs: Buffer, wait: bool = False) -> float | None:
    hip, (groups, threads) = self.dev.hip, self.launch
    if self.args is None: self.args = KernelArgs(len(bufs))
    params = ctypes.c_void_p(self.args.set([b.__dict__.get("address") or _address(b) for b in bufs]))
    def launch() -> None:
      self.dev.check(hip.hipModuleLaunchKernel(self.function, groups, 1, 1, threads, 1, 1, 0, None, params, None), "hipModuleLaunchKernel")
    if wait: return self.dev.timed(launch)
    launch()
    return None


def _address(buf: Buffer) -> int: return kept_address(buf, lambda mem: mem.value or 0)


class _Dim3(ctypes.Structure):
  _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _KernelNodeParams(ctypes.Structure):  # hipKernelNodeParams
  _fields_ = [("blockDim", _Dim3), ("extra", ctypes.c_void_p), ("func", ctypes.c_void_p), ("gridDim", _Dim3),
              ("kernelParams", ctypes.c_void_p), ("sharedMemBytes", ctypes.c_uint)]


class HIPGraph(KernelGraph):
  """TinyJit's kernels as a hipGraph: hipGraphAddKernelNode per kernel, hipGraphExecKernelNodeSetParams where an input moved,
  one hipGraphLaunch per replay."""

  def __init__(self, dev: AMDDevice, steps: Steps):
    super().__init__(steps)
    self.dev, self.graph_, self.exec = dev, ctypes.c_void_p(), ctypes.c_void_p()

  def address(self, buf: Buffer) -> int: return _address(buf)
  @staticmethod
  def _params(program: AMDProgram, args: list[int]) -> tuple[_KernelNodeParams, Any]:
    """The node's parameters, and what must stay alive until the call that takes them returns (HIP copies the arguments)."""
    values = [ctypes.c_void_p(a) for a in args]
    ptrs = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    groups, threads = program.launch
    p = _KernelNodeParams(_Dim3(threads, 1, 1), None, program.function.value, _Dim3(groups, 1, 1), ctypes.addressof(ptrs), 0)
    return p, (values, ptrs)

  def add(self, program: Program, args: list[int]) -> Any:
    assert isinstance(program, AMDProgram)
    hip = self.dev.hip
    if not self.graph_: self.dev.check(hip.hipGraphCreate(ctypes.byref(self.graph_), 0), "hipGraphCreate")
    node, (p, _alive) = ctypes.c_void_p(), self._params(program, args)
    deps = (ctypes.c_void_p * 1)(*self.nodes[-1:]) if self.nodes else None
    self.dev.check(hip.hipGraphAddKernelNode(ctypes.byref(node), self.graph_, deps, ctypes.c_size_t(len(self.nodes[-1:])), ctypes.byref(p)),
                   "hipGraphAddKernelNode")
    return node
  def instantiate(self) -> None:
    # the graph outlives its executable copy: the nodes that hipGraphExecKernelNodeSetParams names are the graph's
    self.dev.check(self.dev.hip.hipGraphInstantiate(ctypes.byref(self.exec), self.graph_, None, None, ctypes.c_size_t(0)), "hipGraphInstantiate")
  def update(self, node: Any, program: Program, args: list[int]) -> None:
    assert isinstance(program, AMDProgram)
    p, _alive = self._params(program, args)
    self.dev.check(self.dev.hip.hipGraphExecKernelNodeSetParams(self.exec, node, ctypes.byref(p)), "hipGraphExecKernelNodeSetParams")
  def launch(self) -> None: self.dev.check(self.dev.hip.hipGraphLaunch(self.exec, None), "hipGraphLaunch")

  def __del__(self) -> None:
    if self.exec: self.dev.hip.hipGraphExecDestroy(self.exec)
    if self.graph_: self.dev.hip.hipGraphDestroy(self.graph_)


class AMDDevice(Compiled):
  name = "AMD"

  def __init__(self) -> None:
    self.hip, self.hiprtc = _lib("amdhip64"), _lib("hiprtc")
    count = ctypes.c_int()
    if self.hip.hipGetDeviceCount(ctypes.byref(count)) != 0 or count.value == 0:
      raise DeviceMissing("AMD found no GPU: it needs an AMD GPU and ROCm's driver")
    self.ordinal = env_int("TINYTUNE_AMD_DEVICE", 0, 0)
    self.check(self.hip.hipSetDevice(self.ordinal), "hipSetDevice")
    prop = _DeviceProp()
    get_props = getattr(self.hip, "hipGetDevicePropertiesR0600", None) or self.hip.hipGetDeviceProperties
    self.check(get_props(ctypes.byref(prop), self.ordinal), "hipGetDeviceProperties")
    self.gpu_name = prop.name.decode()
    self.arch = os.getenv("TINYTUNE_AMD_ARCH") or _gfx_target(self.ordinal)
    version = ctypes.c_int()
    self.hip.hipRuntimeGetVersion(ctypes.byref(version))
    self.version = str(version.value)
    self.start, self.end = ctypes.c_void_p(), ctypes.c_void_p()
    for e in (self.start, self.end): self.check(self.hip.hipEventCreate(ctypes.byref(e)), "hipEventCreate")
    self.renderer = HIPRenderer()
    self.caps = amd_caps(self.arch, max_local=self._attr(HIP_ATTR_MAX_THREADS_PER_BLOCK) or 1024,
                         shared_bytes=self._attr(HIP_ATTR_MAX_SHARED_PER_BLOCK) or 65536)

  def check(self, status: int, what: str) -> None:
    if status != 0:
      self.hip.hipGetErrorString.restype = ctypes.c_char_p
      raise RuntimeError(f"{what} failed: {self.hip.hipGetErrorString(status).decode()}")

  def _attr(self, attr: int) -> int:
    value = ctypes.c_int()
    return value.value if self.hip.hipDeviceGetAttribute(ctypes.byref(value), attr, self.ordinal) == 0 else 0

  is_gpu = True
  asynchronous = True  # launches and copies on the null stream, in order: a copy out waits for the kernels before it
  def synchronize(self) -> None: self.check(self.hip.hipDeviceSynchronize(), "the kernels")
  def timed(self, run: Callable[[], Any]) -> float:
    """Device seconds between events recorded before and after what `run` launches."""
    self.check(self.hip.hipEventRecord(self.start, None), "hipEventRecord")
    run()
    self.check(self.hip.hipEventRecord(self.end, None), "hipEventRecord")
    self.check(self.hip.hipEventSynchronize(self.end), "the kernels")
    ms = ctypes.c_float()
    self.check(self.hip.hipEventElapsedTime(ctypes.byref(ms), self.start, self.end), "hipEventElapsedTime")
    return ms.value * 1e-3

  def batch(self, steps: Steps) -> Callable[[list[Buffer]], None] | None:
    return HIPGraph(self, steps) if all(isinstance(p, AMDProgram) for p, _ in steps) else None

  def alloc(self, size: int, dtype: DType) -> Any:
    ptr = ctypes.c_void_p()
    self.check(self.hip.hipMalloc(ctypes.byref(ptr), ctypes.c_size_t(max(1, size * dtype.itemsize))), "hipMalloc")
    return ptr
  def free(self, mem: Any) -> None: self.hip.hipFree(mem)  # from a Buffer's finalizer: an error has no caller to reach
  def copyin(self, mem: Any, data: np.ndarray) -> None:
    if data.size: self.check(self.hip.hipMemcpy(mem, ctypes.c_void_p(data.ctypes.data), ctypes.c_size_t(data.nbytes), 1), "hipMemcpy")
  def copyout(self, mem: Any, size: int, dtype: DType) -> np.ndarray:
    out = np.empty(size, dtype=dtype.np)
    if size: self.check(self.hip.hipMemcpy(ctypes.c_void_p(out.ctypes.data), mem, ctypes.c_size_t(out.nbytes), 2), "hipMemcpy")
    return out

  def compile(self, src: str) -> bytes:
    """Source -> a code object for this GPU's gfx target, cached on disk by source, target and HIP version."""
    return disk_cached("amd", [src, self.arch, self.version], lambda: self._hiprtc(src))

  def _hiprtc(self, src: str) -> bytes:
    rtc, prog = self.hiprtc, ctypes.c_void_p()
    if rtc.hiprtcCreateProgram(ctypes.byref(prog), src.encode(), b"kernel.hip", 0, None, None) != 0: raise CompileError("hiprtcCreateProgram failed")
    try:
      opts = (ctypes.c_char_p * 2)(f"--offload-arch={self.arch}".encode(), b"-O3")
      if rtc.hiprtcCompileProgram(prog, 2, opts) != 0:
        size = ctypes.c_size_t()
        rtc.hiprtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        rtc.hiprtcGetProgramLog(prog, log)
        raise CompileError(f"hiprtc failed: {log.value.decode(errors='replace').strip()}\n{src}")
      size = ctypes.c_size_t()
      rtc.hiprtcGetCodeSize(prog, ctypes.byref(size))
      code = ctypes.create_string_buffer(size.value)
      rtc.hiprtcGetCode(prog, code)
    finally: rtc.hiprtcDestroyProgram(ctypes.byref(prog))
    return code.raw

  def program(self, name: str, lib: bytes, launch: tuple[int, int] = (1, 1)) -> Program: return AMDProgram(self, name, lib, launch)

  def fingerprint(self) -> dict[str, str]:
    return {"kind": "AMD", "name": self.gpu_name, "arch": self.arch, "compiler": "hiprtc", "compiler_version": self.version, "flags": "-O3"}
