"""Devices and their memory. A device is an allocator, a compiler and a program runner."""
from __future__ import annotations

import ctypes
import hashlib
import importlib
import itertools
import os
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from tinytune.codegen.caps import DeviceCaps
from tinytune.dtype import DType
from tinytune.helpers import DEBUG, cache_dir, env_count


class Program:
  """A compiled kernel. `program(*buffers)` launches it and returns; `wait=True` waits for it and returns its seconds of device time.
  A synchronous device (the CPU) waits always and always returns the seconds."""
  def __call__(self, *bufs: Buffer, wait: bool = False) -> float | None: raise NotImplementedError
  def timed(self, *bufs: Buffer) -> float:
    """Run it, wait, and return its seconds of device time."""
    if (seconds := self(*bufs, wait=True)) is None: raise RuntimeError(f"{type(self).__name__} returned no time when waited for")
    return seconds


# the kernels of a TinyJit capture, in order, each with its buffers: an int is the place of an input among the call's arguments
Steps = list[tuple[Program, list["Buffer | int"]]]


class Compiled:
  name: str
  caps: DeviceCaps
  renderer: Any  # a CStyleRenderer subclass

  def alloc(self, size: int, dtype: DType) -> Any: raise NotImplementedError
  def free(self, mem: Any) -> None:
    """Gives back memory the pool drops: a no-op where the collector frees it (NumPy arrays, OpenCL buffers), the driver's free else."""
  def retype(self, mem: Any, size: int, dtype: DType) -> Any:
    """Memory from the pool, allocated for another dtype of the same byte size, as memory for `dtype`."""
    return mem
  def copyin(self, mem: Any, data: np.ndarray) -> None: raise NotImplementedError
  def copyout(self, mem: Any, size: int, dtype: DType) -> np.ndarray: raise NotImplementedError
  def compile(self, src: str) -> bytes: raise NotImplementedError
  def program(self, name: str, lib: bytes, launch: tuple[int, int] = (1, 1)) -> Program:
    """`launch` is (workgroups, threads per workgroup) on devices with workgroups."""
    raise NotImplementedError
  def fingerprint(self) -> dict[str, str]: raise NotImplementedError

  is_gpu = False  # a GPU takes the workloads' GPU default sizes
  asynchronous = False  # launches return before the kernel has run: copyout, synchronize() and timing wait
  emulated = False  # an emulator (EMU): its timings are the host's seconds of running it, never the emulated device's speed
  compiles_apart = False  # render and compile touch no device state: the search renders and compiles in forked processes
  def synchronize(self) -> None:
    """Wait for every kernel launched so far."""
  def timed(self, run: Callable[[], Any]) -> float:
    """Seconds of device time that what `run` launches takes, all of it (gaps between kernels included); the host clock here."""
    self.synchronize()
    st = time.perf_counter()
    run()
    self.synchronize()
    return time.perf_counter() - st
  def flush_cache(self) -> None:
    """Evict the device's last-level cache, so the next timing starts cold (GPUs: writes a buffer larger than L2)."""
  def batch(self, steps: Steps) -> Callable[[list[Buffer]], None] | None:
    """TinyJit's replay of `steps` as one native call (the CPU) or graph launch (CUDA), given the new input buffers; None where this
    device has no such thing, and the steps replay one by one."""
    return None


class KernelGraph:
  """TinyJit's kernels as one device graph (CUDA's, HIP's), in a chain: built at the first replay; per replay the nodes whose input
  buffers moved get their arguments set again, and one launch runs them all. Where the graph cannot be built, the kernels launch
  one by one (DEBUG=1 says why); `graph` tells which. A backend gives the driver calls: add, instantiate, update, launch."""

  def __init__(self, steps: Steps):
    self.steps, self.graph = steps, True
    self.nodes: list[Any] = []
    self.last: list[int] = []  # the input addresses the nodes were last given

  def address(self, buf: Buffer) -> int: raise NotImplementedError
  def add(self, program: Program, args: list[int]) -> Any:
    """A kernel node after the last one added, launching `program` on the buffers at `args`."""
    raise NotImplementedError
  def instantiate(self) -> None: raise NotImplementedError
  def update(self, node: Any, program: Program, args: list[int]) -> None: raise NotImplementedError
  def launch(self) -> None: raise NotImplementedError

  def _args(self, bufs: list[Buffer | int], inputs: list[int]) -> list[int]:
    return [inputs[b] if isinstance(b, int) else self.address(b) for b in bufs]

  def __call__(self, new_inputs: list[Buffer]) -> None:
    inputs = [self.address(b) for b in new_inputs]
    if not self.graph:
      for program, bufs in self.steps: program(*[new_inputs[b] if isinstance(b, int) else b for b in bufs])
      return
    if not self.last and not self.nodes:
      try:
        for program, bufs in self.steps: self.nodes.append(self.add(program, self._args(bufs, inputs)))
        self.instantiate()
      except Exception as e:
        if DEBUG >= 1: print(f"TinyJit: no graph ({str(e).splitlines()[0]}): the kernels launch one by one")
        self.graph = False
        return self(new_inputs)
    elif inputs != self.last:
      moved = {i for i, (a, b) in enumerate(zip(inputs, self.last)) if a != b}
      for node, (program, bufs) in zip(self.nodes, self.steps):
        if moved.intersection(b for b in bufs if isinstance(b, int)): self.update(node, program, self._args(bufs, inputs))
    self.last = inputs
    self.launch()


def kept_address(buf: Buffer, of: Callable[[Any], int]) -> int:
  """A buffer's address on its device, `of(memory)` worked out once and kept on the Buffer: its memory never moves, and pooled memory
  comes back with its address."""
  if (ret := buf.__dict__.get("address")) is None:
    mem = buf.mem
    if (ret := buf.__dict__.get("address")) is None: ret = buf.__dict__["address"] = of(mem)
  return ret


class KernelArgs:
  """A GPU kernel's parameters as CUDA and HIP take them, an array of pointers to each argument's value, kept by its program and
  written again only where the buffers' addresses changed: the drivers copy the arguments at the launch, so one block serves every
  launch (the engine launches one at a time)."""

  def __init__(self, n: int):
    self.values = (ctypes.c_uint64 * n)()
    self.pointers = (ctypes.c_void_p * n)(*[ctypes.addressof(self.values) + 8 * i for i in range(n)])
    self.address = ctypes.addressof(self.pointers)
    self.last: list[int] = []

  def set(self, addresses: list[int]) -> int:
    """The block's address, holding these buffer addresses."""
    if addresses != self.last:
      self.values[:] = addresses  # type: ignore[assignment]  # ints, which ctypes converts
      self.last = addresses
    return self.address


class CompileError(RuntimeError):
  """A kernel's source that the device's compiler rejected."""


def disk_cached(kind: str, key_parts: list[str], build: Callable[[], bytes]) -> bytes:
  """A compiled program from the on-disk cache, or built and stored there (atomically, so concurrent builds are safe)."""
  path = cache_dir() / kind / hashlib.sha256("\n".join(key_parts).encode()).hexdigest()[:32]
  if path.exists(): return path.read_bytes()
  lib = build()
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
  tmp.write_bytes(lib)
  os.replace(tmp, path)
  return lib


class DeviceMissing(RuntimeError):
  """A device that is not present here; the message says what is missing and how to get it."""


class BufferPool:
  """Device memory that freed Buffers gave back, kept by (device, bytes) for the next Buffer of that size: a steady-state
  program allocates nothing new. Least recently freed memory goes first once over `limit` bytes. Only a Buffer's finalizer
  gives memory back, so memory that a live Buffer holds is never handed out twice. What the pool holds is (memory, its address
  where a device found one): the address comes back with the memory, not worked out again."""

  def __init__(self, limit: int | None = None):
    self._limit, self.held = limit, 0
    self.free: OrderedDict[tuple[str, int], list[Any]] = OrderedDict()

  @property
  def limit(self) -> int:
    """The given limit, else $TINYTUNE_POOL_BYTES (1 GiB where unset), read at the first buffer: a bad value is an error that
    names it there, not a traceback from importing tinytune."""
    if self._limit is None:
      self._limit = env_count("TINYTUNE_POOL_BYTES", 0)
      if self._limit is None: self._limit = 1 << 30
    return self._limit

  def take(self, device: str, nbytes: int) -> Any:
    """Pooled memory of this size on this device, or None."""
    if nbytes > self.limit or not (mems := self.free.get((device, nbytes))): return None  # (the first buffer reads the limit here)
    self.held -= nbytes
    mem = mems.pop()
    if not mems: del self.free[(device, nbytes)]
    return mem

  def give(self, device: str, nbytes: int, mem: Any) -> None:
    """Keeps a freed Buffer's (memory, address) for the next Buffer of its size; memory the pool drops goes back to its device."""
    if nbytes == 0 or nbytes > (limit := self.limit): return Device[device].free(mem[0])
    self.free.setdefault((device, nbytes), []).append(mem)
    self.free.move_to_end((device, nbytes))
    self.held += nbytes
    while self.held > limit:
      (dev, size), mems = next(iter(self.free.items()))
      Device[dev].free(mems.pop(0)[0])
      self.held -= size
      if not mems: del self.free[(dev, size)]

  def clear(self) -> None: self.free.clear(); self.held = 0


POOL = BufferPool()


class Buffer:
  """Memory for `size` elements of `dtype` on a device, allocated on first use (from the pool where it has some) and given back
  to the pool when the Buffer is collected."""
  _uids = itertools.count()

  def __init__(self, device: str, size: int, dtype: DType):
    self.device, self.size, self.dtype, self.uid = device, size, dtype, next(Buffer._uids)
    self._mem: Any = None

  def __repr__(self) -> str: return f"<Buffer {self.uid} {self.device} {self.size} {self.dtype.name}>"
  def __del__(self) -> None:
    if self._mem is not None and POOL is not None:  # POOL is None at interpreter exit
      POOL.give(self.device, self.size * self.dtype.itemsize, (self._mem, self.__dict__.get("address")))  # nbytes, without its call
  @property
  def nbytes(self) -> int: return self.size * self.dtype.itemsize
  @property
  def mem(self) -> Any:
    if self._mem is None:
      dev = Device[self.device]
      if (pooled := POOL.take(self.device, self.size * self.dtype.itemsize)) is None: self._mem = dev.alloc(self.size, self.dtype)
      else:
        self._mem = dev.retype(pooled[0], self.size, self.dtype)
        if pooled[1] is not None: self.__dict__["address"] = pooled[1]  # a CPU buffer's (runtime.cpu.address), the same after retype
    return self._mem

  def copyin(self, data: np.ndarray) -> Buffer:
    Device[self.device].copyin(self.mem, np.ascontiguousarray(data, dtype=self.dtype.np).reshape(-1))
    return self

  def numpy_view(self) -> np.ndarray:
    """The buffer's contents as a flat array: the memory itself on the CPU, a copy from other devices."""
    return Device[self.device].copyout(self.mem, self.size, self.dtype)


# name -> module:class, imported on first use so a missing optional backend only fails when it is chosen
_BACKENDS: dict[str, str] = {"CPU": "tinytune.runtime.cpu:CPUDevice", "OPENCL": "tinytune.runtime.opencl:OpenCLDevice",
                             "CUDA": "tinytune.runtime.cuda:CUDADevice", "AMD": "tinytune.runtime.amd:AMDDevice",
                             "EMU": "tinytune.runtime.emu:EMUDevice"}
_ALIASES = {"HIP": "AMD"}


class _DeviceRegistry:
  def __init__(self) -> None:
    self._opened: dict[str, Compiled] = {}
    self._default: str | None = None

  def canonicalize(self, name: str | None) -> str:
    if name is None: return self.DEFAULT
    if name in _BACKENDS: return name  # already canonical: every Tensor op asks
    upper = name.upper().split(":")[0]
    upper = _ALIASES.get(upper, upper)
    if upper not in _BACKENDS: raise ValueError(f"unknown device {name!r}; available: {', '.join(_BACKENDS)}")
    return upper

  def __getitem__(self, name: str) -> Compiled:
    if (dev := self._opened.get(name)) is not None: return dev  # an open device by its canonical name: every buffer asks
    name = self.canonicalize(name)
    if name not in self._opened:
      module, cls = _BACKENDS[name].split(":")
      self._opened[name] = getattr(importlib.import_module(module), cls)()
    return self._opened[name]

  @property
  def DEFAULT(self) -> str:
    if self._default is None:
      try: self._default = self.canonicalize(os.getenv("TINYTUNE_DEVICE") or "CPU")
      except ValueError as e: raise ValueError(f"TINYTUNE_DEVICE: {e}") from None
    return self._default

  @DEFAULT.setter
  def DEFAULT(self, name: str) -> None: self._default = self.canonicalize(name)


Device = _DeviceRegistry()


def device_fingerprint(device: str) -> dict[str, str]:
  """What a measurement depends on: the device, its compiler, version and flags, and the code generator's version."""
  from tinytune.codegen import CODEGEN_VERSION
  return {**Device[device].fingerprint(), "codegen_version": CODEGEN_VERSION}


def device_status(name: str) -> str | None:
  """None where the device opens here, else one line on why not."""
  try: Device[name]
  except DeviceMissing as e: return str(e)
  except Exception as e: return f"{name} failed to open: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
  return None
