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
import threading
from time import perf_counter
from typing import Callable

import numpy as np

from tinytune.codegen.cstyle import CRenderer
from tinytune.dtype import DType
from tinytune.helpers import cache_dir
from tinytune.runtime import Buffer, Compiled, CompileError, DeviceCaps, Program, Steps

# -fwrapv: signed int overflow wraps (two's complement) as in NumPy and torch, where C leaves it undefined
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fPIC", "-shared", "-fno-math-errno", "-fwrapv")


compile_stats = {"hits": 0, "misses": 0}  # on-disk compile cache


@functools.cache
def find_compiler() -> str:
  """TINYTUNE_CC, else the first of clang, cc, gcc that builds with OpenMP, else the first present."""
  if cc := os.getenv("TINYTUNE_CC"):
    if shutil.which(cc) is None: raise RuntimeError(f"TINYTUNE_CC={cc!r} is not a command: install it or unset TINYTUNE_CC")
    return cc
  found = [cc for cc in ("clang", "cc", "gcc") if shutil.which(cc)]
  if not found: raise RuntimeError("no C compiler found: install one (apt-get install gcc) or set TINYTUNE_CC")
  return next((cc for cc in found if openmp_works(cc)), found[0])


@functools.cache
def openmp_works(cc: str) -> bool:
  """Whether `cc -fopenmp` builds a shared object here (clang needs libomp installed for it)."""
  with tempfile.TemporaryDirectory() as tmp:
    with open(os.path.join(tmp, "t.c"), "w") as f: f.write("void f(int* x) {\n#pragma omp parallel for\nfor (int i = 0; i < 4; i++) x[i] = i;\n}\n")
    return subprocess.run([cc, *FLAGS, "-fopenmp", "t.c", "-o", "t.so"], cwd=tmp, capture_output=True).returncode == 0


@functools.cache
def compiler_version(cc: str) -> str:
  out = subprocess.run([cc, "--version"], capture_output=True, text=True)
  if out.returncode or not out.stdout.strip():
    raise RuntimeError(f"{cc} --version failed (exit {out.returncode}): it is not a C compiler; set TINYTUNE_CC to one, or unset it")
  return out.stdout.splitlines()[0]


@functools.cache
def cpuinfo() -> dict[str, str]:
  """The first processor's fields from /proc/cpuinfo (empty where there is none)."""
  try:
    with open("/proc/cpuinfo") as f: lines = f.read().split("\n\n")[0].splitlines()
  except OSError: return {}
  return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}


def simd() -> tuple[int, int]:
  """(float32 lanes, vector registers) of this CPU as -march=native compiles for it."""
  flags = cpuinfo().get("flags", "").split()
  if "avx512f" in flags: return 16, 32
  if "avx2" in flags or "avx" in flags: return 8, 16
  return 4, 16


class CPUProgram(Program):
  def __init__(self, name: str, path: str):
    self.lib = ctypes.CDLL(path)
    self.fxn = getattr(self.lib, name)
    self.address = ctypes.cast(self.fxn, ctypes.c_void_p).value  # for TinyJit's batched calls

  def __call__(self, *bufs: Buffer, wait: bool = False) -> float:
    ptrs = [address(b) for b in bufs]
    if self.fxn.argtypes is None: self.fxn.argtypes = [ctypes.c_void_p] * len(ptrs)
    st = perf_counter()
    self.fxn(*ptrs)
    return perf_counter() - st


def address(buf: Buffer) -> int:
  """A CPU buffer's address, as a C argument (kept on the Buffer: its memory never moves)."""
  if (ret := buf.__dict__.get("address")) is None: ret = buf.__dict__["address"] = buf.mem.__array_interface__["data"][0]
  return ret


class CPUDevice(Compiled):
  name = "CPU"

  def __init__(self) -> None:
    self.cc = find_compiler()
    self.renderer = CRenderer()
    openmp = openmp_works(self.cc)
    # gcc 12's if-conversion with AVX-512 masks miscompiles some selects (a masked subtract with the wrong mask)
    gcc = "clang" not in compiler_version(self.cc)
    self.flags = FLAGS + (("-fopenmp",) if openmp else ()) + (("-fno-tree-loop-if-convert",) if gcc else ())
    width, registers = simd()
    threads = len(os.sched_getaffinity(0)) if openmp and hasattr(os, "sched_getaffinity") else 1
    bf16 = ("bfloat16",) if "avx512_bf16" in cpuinfo().get("flags", "").split() else ()  # TC: its dot products (see TensorCore)
    self.caps = DeviceCaps(has_local=False, threads=threads, max_upcast=256, simd_width=width, vector_registers=registers, tensor_cores=bf16)

  def alloc(self, size: int, dtype: DType) -> np.ndarray:
    """Memory that starts on a cache line: numpy starts large arrays 16 bytes into one, so every 64-byte vector load would
    straddle two lines (a streaming kernel ran 4-9% slower)."""
    raw = np.empty(size * dtype.itemsize + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + size * dtype.itemsize].view(dtype.np)
  def retype(self, mem: np.ndarray, size: int, dtype: DType) -> np.ndarray: return mem.view(dtype.np)
  def copyin(self, mem: np.ndarray, data: np.ndarray) -> None: np.copyto(mem, data)
  def copyout(self, mem: np.ndarray, size: int, dtype: DType) -> np.ndarray: return mem

  def compile(self, src: str) -> bytes:
    """Source -> path of a shared object (as bytes), cached on disk by source, compiler, its version and flags."""
    key = hashlib.sha256("\n".join([src, self.cc, compiler_version(self.cc), *self.flags]).encode()).hexdigest()[:32]
    path = cache_dir() / "cpu" / f"{key}.so"
    compile_stats["hits" if path.exists() else "misses"] += 1
    if not path.exists():  # built beside its final name, so the rename is atomic even where $TMPDIR is another filesystem
      path.parent.mkdir(parents=True, exist_ok=True)
      stem = f"{key}.{os.getpid()}.{threading.get_ident()}"  # one per compiling thread
      cfile, sofile = path.with_name(f"{stem}.c"), path.with_name(f"{stem}.so.tmp")
      try:
        cfile.write_text(src)
        res = subprocess.run([self.cc, *self.flags, str(cfile), "-o", str(sofile), "-lm"], capture_output=True, text=True)
        if res.returncode != 0: raise CompileError(f"{self.cc} failed:\n{res.stderr}\n{src}")
        os.replace(sofile, path)  # atomic, so concurrent compiles of the same kernel are safe
      finally:
        cfile.unlink(missing_ok=True)
        sofile.unlink(missing_ok=True)
    return str(path).encode()

  def program(self, name: str, lib: bytes, launch: tuple[int, int] = (1, 1)) -> Program: return CPUProgram(name, lib.decode())

  def fingerprint(self) -> dict[str, str]:
    info = cpuinfo()
    isa = hashlib.sha256(info.get("flags", "").encode()).hexdigest()[:12]  # -march=native code depends on the exact ISA
    return {"kind": "CPU", "name": info.get("model name", platform.processor()), "arch": f"{platform.machine()}-{isa}", "compiler": self.cc,
            "compiler_version": compiler_version(self.cc), "flags": " ".join(self.flags)}

  def batch(self, steps: Steps) -> Callable[[list[Buffer]], None] | None:
    """One C function that calls each kernel in turn, through the kernels' own addresses, with its buffers' addresses from one array:
    the inputs' entries are refreshed per call, the rest are fixed (the batch holds those buffers)."""
    if not all(isinstance(p, CPUProgram) for p, _ in steps): return None
    places: dict[tuple[str, int], int] = {}  # ("in", argument) or ("buf", id) -> place in the address table
    def place(b: Buffer | int) -> int: return places.setdefault(("in", b) if isinstance(b, int) else ("buf", id(b)), len(places))
    calls = [[place(b) for b in bufs] for _, bufs in steps]
    lines = [f"  ((void (*)({', '.join(['void*'] * len(args))}))fns[{i}])({', '.join(f'b[{a}]' for a in args)});" for i, args in enumerate(calls)]
    fn = ctypes.CDLL(self.compile("void tt_jit(void** fns, void** b) {\n" + "\n".join(lines) + "\n}\n").decode()).tt_jit
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    fns = (ctypes.c_void_p * len(steps))(*[p.address for p, _ in steps])  # type: ignore[attr-defined]
    table = (ctypes.c_void_p * len(places))()
    held = {id(b): b for _, bufs in steps for b in bufs if not isinstance(b, int)}  # alive as long as the batch: their addresses stay
    for (kind, key), at in places.items():
      if kind == "buf": table[at] = address(held[key])
    inputs = [(at, key) for (kind, key), at in places.items() if kind == "in"]

    def run(new_inputs: list[Buffer]) -> None:
      for at, i in inputs: table[at] = address(new_inputs[i])
      fn(fns, table)
    run.held = held  # type: ignore[attr-defined]
    return run
