"""The CUDA device: kernels compiled by NVRTC to cubin for this GPU, loaded and launched through the driver API
(NVIDIA's cuda-bindings) on the legacy default stream, which orders launches and copies: a launch returns at once, a copy out
waits for the kernels before it. Timing records CUDA events around the timed work only; TinyJit replays a CUDA graph."""
from __future__ import annotations

import ctypes
import functools
import glob
import os
from typing import Any, Callable

import numpy as np

from tinytune.codegen.caps import cuda_caps
from tinytune.codegen.cstyle import CUDARenderer, dynamic_shared
from tinytune.dtype import DType
from tinytune.helpers import env_int
from tinytune.runtime import Buffer, Compiled, CompileError, DeviceMissing, KernelArgs, KernelGraph, Program, Steps, disk_cached, kept_address

try:
  from cuda.bindings import driver as cu
  from cuda.bindings import nvrtc
except ImportError: cu = nvrtc = None


def _check(result: Any, what: str) -> Any:
  """cuda-bindings calls return (error, *values): raise on an error, else return the values."""
  err, *values = result if isinstance(result, tuple) else (result,)
  if int(err) != 0:
    name = cu.cuGetErrorName(err)[1] if isinstance(err, cu.CUresult) else err
    raise RuntimeError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
  return values[0] if len(values) == 1 else values


DYNAMIC = b"TTDS"  # a lib's header where its kernel takes dynamic shared memory: then the bytes (4, little-endian), then the cubin


def pack_lib(cubin: bytes, shared: int) -> bytes:
  """A CUDA program's lib: its cubin, after a header that says how much dynamic shared memory each launch gives where it takes any."""
  return DYNAMIC + shared.to_bytes(4, "little") + cubin if shared else cubin


def unpack_lib(lib: bytes) -> tuple[bytes, int]:
  """pack_lib's cubin and bytes of dynamic shared memory (a plain cubin takes none)."""
  return (lib[8:], int.from_bytes(lib[4:8], "little")) if lib.startswith(DYNAMIC) else (lib, 0)


class CUDAProgram(Program):
  shared = 0  # bytes of dynamic shared memory each launch gives

  def __init__(self, dev: CUDADevice, name: str, lib: bytes, launch: tuple[int, int]):
    self.dev, self.launch = dev, launch
    cubin, self.shared = unpack_lib(lib)
    self.module = _check(cu.cuModuleLoadData(cubin), "cuModuleLoadData")
    self.function = _check(cu.cuModuleGetFunction(self.module, name.encode()), "cuModuleGetFunction")
    if self.shared:  # past 48 KB a function takes only what it opted into
      _check(cu.cuFuncSetAttribute(self.function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.shared),
             f"cuFuncSetAttribute (kernel {name}: {self.shared} bytes of dynamic shared memory)")
    self.args: KernelArgs | None = None

  def __call__(self, *bufs: Buffer, wait: bool = False) -> float | None:
    groups, threads = self.launch
    if self.args is None: self.args = KernelArgs(len(bufs))
    params = self.args.set([b.__dict__.get("address") or _address(b) for b in bufs])
    if wait: _check(cu.cuEventRecord(self.dev.start, 0), "cuEventRecord")
    _check(cu.cuLaunchKernel(self.function, groups, 1, 1, threads, 1, 1, self.shared, 0, params, 0), "cuLaunchKernel")
    if not wait: return None
    _check(cu.cuEventRecord(self.dev.end, 0), "cuEventRecord")
    _check(cu.cuEventSynchronize(self.dev.end), "the kernel")
    return _check(cu.cuEventElapsedTime(self.dev.start, self.dev.end), "cuEventElapsedTime") * 1e-3


def _address(buf: Buffer) -> int: return kept_address(buf, int)


def _arguments(addresses: list[int]) -> ctypes.Array:
  """A kernel's parameters as the driver takes them: an array of pointers to each argument (the pointed-to values ride along)."""
  values = [ctypes.c_void_p(a) for a in addresses]
  args = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
  args.values = values  # type: ignore[attr-defined]  # alive as long as the array
  return args


class CUDAGraph(KernelGraph):
  """TinyJit's kernels as a CUDA graph: cuGraphAddKernelNode per kernel, cuGraphExecKernelNodeSetParams where an input moved,
  one cuGraphLaunch per replay."""

  def __init__(self, steps: Steps):
    super().__init__(steps)
    self.graph_: Any = None
    self.exec: Any = None

  def address(self, buf: Buffer) -> int: return _address(buf)
  @staticmethod
  def _params(program: CUDAProgram, args: ctypes.Array) -> Any:
    p = cu.CUDA_KERNEL_NODE_PARAMS()
    p.func, (p.gridDimX, p.blockDimX) = program.function, program.launch
    p.gridDimY = p.gridDimZ = p.blockDimY = p.blockDimZ = 1
    p.sharedMemBytes, p.kernelParams, p.extra = program.shared, ctypes.addressof(args), 0
    return p

  def add(self, program: Program, args: list[int]) -> Any:
    assert isinstance(program, CUDAProgram)
    if self.graph_ is None: self.graph_ = _check(cu.cuGraphCreate(0), "cuGraphCreate")
    deps, values = self.nodes[-1:], _arguments(args)  # the driver copies the arguments: `values` need only outlive the call
    return _check(cu.cuGraphAddKernelNode(self.graph_, deps, len(deps), self._params(program, values)), "cuGraphAddKernelNode")
  def instantiate(self) -> None:
    # the graph outlives its executable copy: the nodes that cuGraphExecKernelNodeSetParams names are the graph's
    self.exec = _check(cu.cuGraphInstantiate(self.graph_, 0), "cuGraphInstantiate")
  def update(self, node: Any, program: Program, args: list[int]) -> None:
    assert isinstance(program, CUDAProgram)
    values = _arguments(args)
    _check(cu.cuGraphExecKernelNodeSetParams(self.exec, node, self._params(program, values)), "cuGraphExecKernelNodeSetParams")
  def launch(self) -> None: _check(cu.cuGraphLaunch(self.exec, 0), "cuGraphLaunch")

  def __del__(self) -> None:
    if cu is None: return
    if self.exec is not None: cu.cuGraphExecDestroy(self.exec)
    if self.graph_ is not None: cu.cuGraphDestroy(self.graph_)


class CUDADevice(Compiled):
  name = "CUDA"

  def __init__(self) -> None:
    if cu is None: raise DeviceMissing('CUDA needs NVIDIA\'s Python bindings: pip install "tinytune[cuda]" (and an NVIDIA GPU with its driver)')
    ordinal = env_int("TINYTUNE_CUDA_DEVICE", 0, least=0)  # its own error, named, not "found no GPU"
    try:
      _check(cu.cuInit(0), "cuInit")
      self.device = _check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
    except Exception as e: raise DeviceMissing(f"CUDA found no GPU ({str(e).splitlines()[0]}): it needs an NVIDIA GPU and its driver") from None
    self.ctx = _check(cu.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
    _check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
    attr = cu.CUdevice_attribute
    def get(a: Any) -> int: return int(_check(cu.cuDeviceGetAttribute(a, self.device), "cuDeviceGetAttribute"))
    self.cc = (get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
    self.arch = f"sm_{self.cc[0]}{self.cc[1]}"
    self.gpu_name = _check(cu.cuDeviceGetName(256, self.device), "cuDeviceGetName").split(b"\0")[0].decode()
    self.driver = str(_check(cu.cuDriverGetVersion(), "cuDriverGetVersion"))
    self.nvrtc_version = ".".join(map(str, _check(nvrtc.nvrtcVersion(), "nvrtcVersion")))
    self.start, self.end = (_check(cu.cuEventCreate(0), "cuEventCreate") for _ in range(2))
    self.scratch: Any = None  # flush_cache's buffer
    self.renderer = CUDARenderer()
    self.caps = cuda_caps(self.arch, get(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK), get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
                          get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN))

  asynchronous = is_gpu = compiles_apart = True  # NVRTC needs no context: a forked process compiles while the parent's GPU times
  def synchronize(self) -> None: _check(cu.cuCtxSynchronize(), "the kernels")
  def timed(self, run: Callable[[], Any]) -> float:
    """Device seconds between events recorded before and after what `run` launches."""
    _check(cu.cuEventRecord(self.start, 0), "cuEventRecord")
    run()
    _check(cu.cuEventRecord(self.end, 0), "cuEventRecord")
    _check(cu.cuEventSynchronize(self.end), "the kernels")
    return _check(cu.cuEventElapsedTime(self.start, self.end), "cuEventElapsedTime") * 1e-3
  def flush_cache(self) -> None:
    """Write twice the L2's size of memory (at least 64 MiB) on the stream."""
    if self.scratch is None:
      l2 = int(_check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, self.device), "cuDeviceGetAttribute"))
      self.scratch_bytes = max(2 * l2, 64 << 20)
      self.scratch = _check(cu.cuMemAlloc(self.scratch_bytes), "cuMemAlloc")
    _check(cu.cuMemsetD8Async(self.scratch, 0, self.scratch_bytes, 0), "cuMemsetD8Async")
  def batch(self, steps: Steps) -> Callable[[list[Buffer]], None] | None:
    return CUDAGraph(steps) if all(isinstance(p, CUDAProgram) for p, _ in steps) else None

  def alloc(self, size: int, dtype: DType) -> Any: return _check(cu.cuMemAlloc(max(1, size * dtype.itemsize)), "cuMemAlloc")
  def free(self, mem: Any) -> None: cu.cuMemFree(mem)  # from a Buffer's finalizer: an error has no caller to reach
  def copyin(self, mem: Any, data: np.ndarray) -> None:
    if data.size: _check(cu.cuMemcpyHtoD(mem, data.ctypes.data, data.nbytes), "cuMemcpyHtoD")
  def copyout(self, mem: Any, size: int, dtype: DType) -> np.ndarray:
    out = np.empty(size, dtype=dtype.np)
    if size: _check(cu.cuMemcpyDtoH(out.ctypes.data, mem, out.nbytes), "cuMemcpyDtoH")
    return out

  def compile(self, src: str) -> bytes:
    """Source -> cubin for this GPU's architecture (sm_90a for TC's wgmma, which sm_90 lacks), cached on disk by source, architecture
    and NVRTC version; with its dynamic shared memory's bytes where it takes any (pack_lib)."""
    cubin = compile_cuda(src, self.arch + ("a" if self.arch == "sm_90" and "tt_wgmma" in src else ""), self.nvrtc_version)  # wgmma: sm_90a's
    return pack_lib(cubin, dynamic_shared(src))

  def program(self, name: str, lib: bytes, launch: tuple[int, int] = (1, 1)) -> Program: return CUDAProgram(self, name, lib, launch)

  def fingerprint(self) -> dict[str, str]:
    return {"kind": "CUDA", "name": self.gpu_name, "arch": self.arch, "compiler": "nvrtc",
            "compiler_version": f"{self.nvrtc_version} driver {self.driver}", "flags": " ".join(NVRTC_FLAGS)}


NVRTC_FLAGS = ("-default-device", "--std=c++17")


def compile_cuda(src: str, arch: str, version: str) -> bytes:
  return disk_cached("cuda", [src, arch, version, *NVRTC_FLAGS], lambda: _nvrtc(src, arch))


def _nvrtc(src: str, arch: str) -> bytes:
  prog = _check(nvrtc.nvrtcCreateProgram(src.encode(), b"kernel.cu", 0, [], []), "nvrtcCreateProgram")
  try:
    opts = [f"--gpu-architecture={arch}".encode(), *(f.encode() for f in NVRTC_FLAGS), *(f"-I{d}".encode() for d in _include_dirs()), *_pch()]
    if int(nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]) != 0:
      log = bytearray(_check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize"))
      nvrtc.nvrtcGetProgramLog(prog, log)
      raise CompileError(f"NVRTC failed: {bytes(log).decode(errors='replace').strip()}\n{src}")
    cubin = bytes(_check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize"))
    _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
  finally: nvrtc.nvrtcDestroyProgram(prog)
  return cubin


@functools.cache
def _pch() -> list[bytes]:
  """NVRTC's automatic precompiled headers (12.4 on): a process's later compiles reuse the headers (cuda_fp16.h, mma.h) as its first
  parsed them, which took 150 ms of a wmma kernel's compile (75 ms with them; 70 and 24 ms for cuda_fp16.h alone: loaded Zen 4). The
  code is the same, so the disk cache's key and the fingerprint's flags leave it out."""
  return [b"-pch"] if tuple(_check(nvrtc.nvrtcVersion(), "nvrtcVersion")) >= (12, 4) else []


def _include_dirs() -> list[str]:
  """CUDA's headers (cuda_fp16.h), where a toolkit or an NVIDIA runtime wheel has them (12.x: nvidia/cuda_runtime/include; 13 wheels
  may nest them one folder deeper)."""
  dirs = [os.path.join(os.getenv("CUDA_HOME", "/usr/local/cuda"), "include")]
  try:
    import nvidia  # type: ignore[import-not-found]
    dirs += sorted(os.path.dirname(h) for p in nvidia.__path__ for pattern in ("*/include/cuda_fp16.h", "*/*/include/cuda_fp16.h")
                   for h in glob.glob(os.path.join(p, pattern)))
  except ImportError: pass
  return [d for d in dict.fromkeys(dirs) if os.path.exists(os.path.join(d, "cuda_fp16.h"))]
