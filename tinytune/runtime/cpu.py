"""The CPU device: kernels compiled by the system C compiler into shared objects, loaded with ctypes, threaded with OpenMP."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import time

import numpy as np

from tinytune.codegen.cstyle import CRenderer
from tinytune.dtype import DType
from tinytune.helpers import cache_dir
from tinytune.runtime import Buffer, Compiled, DeviceCaps, Program

FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fopenmp", "-fPIC", "-shared", "-fno-math-errno")


compile_stats = {"hits": 0, "misses": 0}  # on-disk compile cache


class CompileError(RuntimeError):
  pass


@functools.cache
def find_compiler() -> str:
  cc = os.getenv("TINYTUNE_CC") or shutil.which("clang") or shutil.which("cc") or shutil.which("gcc")
  if cc is None or shutil.which(cc) is None:
    raise RuntimeError(f"no C compiler found{f' ({cc!r})' if cc else ''}: install one (apt-get install gcc) or set TINYTUNE_CC")
  return cc


@functools.cache
def compiler_version(cc: str) -> str:
  return subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]


def simd() -> tuple[int, int]:
  """(float32 lanes, vector registers) of this CPU as -march=native compiles for it."""
  try:
    with open("/proc/cpuinfo") as f: flags = next((line.split() for line in f if line.startswith("flags")), [])
  except OSError: flags = []
  if "avx512f" in flags: return 16, 32
  if "avx2" in flags or "avx" in flags: return 8, 16
  return 4, 16


class CPUProgram(Program):
  def __init__(self, name: str, path: str):
    self.lib = ctypes.CDLL(path)
    self.fxn = getattr(self.lib, name)

  def __call__(self, *bufs: Buffer) -> float:
    ptrs = [ctypes.c_void_p(b.numpy_view().ctypes.data) for b in bufs]
    st = time.perf_counter()
    self.fxn(*ptrs)
    return time.perf_counter() - st


class CPUDevice(Compiled):
  name = "CPU"

  def __init__(self) -> None:
    self.cc = find_compiler()
    self.renderer = CRenderer()
    width, registers = simd()
    self.caps = DeviceCaps(has_local=False, threads=os.cpu_count() or 1, max_upcast=256, simd_width=width, vector_registers=registers)

  def alloc(self, size: int, dtype: DType) -> np.ndarray: return np.empty(size, dtype=dtype.np)

  def compile(self, src: str) -> bytes:
    """Source -> path of a shared object (as bytes), cached on disk by source, compiler, its version and flags."""
    key = hashlib.sha256("\n".join([src, self.cc, compiler_version(self.cc), *FLAGS]).encode()).hexdigest()[:32]
    path = cache_dir() / "cpu" / f"{key}.so"
    compile_stats["hits" if path.exists() else "misses"] += 1
    if not path.exists():
      path.parent.mkdir(parents=True, exist_ok=True)
      with tempfile.TemporaryDirectory() as tmp:
        cfile, sofile = os.path.join(tmp, "k.c"), os.path.join(tmp, "k.so")
        with open(cfile, "w") as f: f.write(src)
        res = subprocess.run([self.cc, *FLAGS, cfile, "-o", sofile, "-lm"], capture_output=True, text=True)
        if res.returncode != 0: raise CompileError(f"{self.cc} failed:\n{res.stderr}\n{src}")
        os.replace(sofile, path)  # atomic, so concurrent compiles of the same kernel are safe
    return str(path).encode()

  def program(self, name: str, lib: bytes) -> Program: return CPUProgram(name, lib.decode())

  def fingerprint(self) -> dict[str, str]:
    return {"kind": "CPU", "name": platform.processor() or platform.machine(), "compiler": self.cc,
            "compiler_version": compiler_version(self.cc), "flags": " ".join(FLAGS)}
