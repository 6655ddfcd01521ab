"""Devices and their memory. A device is an allocator, a compiler and a program runner."""
from __future__ import annotations

import importlib
import itertools
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tinytune.dtype import DType


@dataclass(frozen=True)
class DeviceCaps:
  """What a device's kernels may use; the opt checks read these."""
  has_local: bool = False  # workgroups (LOCAL, GROUP)
  threads: int = 1  # cores a THREAD opt can split across
  max_upcast: int = 256  # elements computed per thread in registers
  simd_width: int = 8  # float32 lanes of one vector register
  vector_registers: int = 16


class Program:
  """A compiled kernel: `program(*buffers) -> seconds` of device time."""
  def __call__(self, *bufs: Buffer) -> float: raise NotImplementedError


class Compiled:
  name: str
  caps: DeviceCaps
  renderer: Any  # a CStyleRenderer subclass

  def alloc(self, size: int, dtype: DType) -> Any: raise NotImplementedError
  def compile(self, src: str) -> bytes: raise NotImplementedError
  def program(self, name: str, lib: bytes) -> Program: raise NotImplementedError
  def fingerprint(self) -> dict[str, str]: raise NotImplementedError


class Buffer:
  """Memory for `size` elements of `dtype` on a device, allocated on first use."""
  _uids = itertools.count()

  def __init__(self, device: str, size: int, dtype: DType):
    self.device, self.size, self.dtype, self.uid = device, size, dtype, next(Buffer._uids)
    self._mem: Any = None

  def __repr__(self) -> str: return f"<Buffer {self.uid} {self.device} {self.size} {self.dtype.name}>"
  @property
  def nbytes(self) -> int: return self.size * self.dtype.itemsize
  @property
  def mem(self) -> Any:
    if self._mem is None: self._mem = Device[self.device].alloc(self.size, self.dtype)
    return self._mem

  def copyin(self, data: np.ndarray) -> Buffer:
    np.copyto(self.numpy_view(), np.ascontiguousarray(data, dtype=self.dtype.np).reshape(-1))
    return self

  def numpy_view(self) -> np.ndarray:
    """The host-visible array behind this buffer (CPU memory is a numpy array)."""
    return self.mem


# name -> module:class, imported on first use so a missing optional backend only fails when it is chosen
_BACKENDS: dict[str, str] = {"CPU": "tinytune.runtime.cpu:CPUDevice"}


class _DeviceRegistry:
  def __init__(self) -> None:
    self._opened: dict[str, Compiled] = {}
    self._default: str | None = None

  def canonicalize(self, name: str | None) -> str:
    if name is None: return self.DEFAULT
    upper = name.upper().split(":")[0]
    if upper not in _BACKENDS: raise ValueError(f"unknown device {name!r}; available: {', '.join(_BACKENDS)}")
    return upper

  def __getitem__(self, name: str) -> Compiled:
    name = self.canonicalize(name)
    if name not in self._opened:
      module, cls = _BACKENDS[name].split(":")
      self._opened[name] = getattr(importlib.import_module(module), cls)()
    return self._opened[name]

  @property
  def DEFAULT(self) -> str:
    if self._default is None: self._default = self.canonicalize(os.getenv("TINYTUNE_DEVICE", "CPU"))
    return self._default

  @DEFAULT.setter
  def DEFAULT(self, name: str) -> None: self._default = self.canonicalize(name)


Device = _DeviceRegistry()
Runner = Callable[..., float]
