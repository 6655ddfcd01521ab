"""The CPU device: kernels compiled by the system C compiler into shared objects, loaded with ctypes, threaded with OpenMP."""
from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from time import perf_counter
from typing import Callable

import numpy as np

from tinytune.codegen.cstyle import CRenderer
from tinytune.dtype import DType
from tinytune.helpers import cache_dir, warn_once
from tinytune.runtime import Buffer, Compiled, CompileError, DeviceCaps, DeviceMissing, Program, Steps, kept_address

# -fwrapv: signed int overflow wraps (two's complement) as in NumPy and torch, where C leaves it undefined. -march is the target's
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fPIC", "-shared", "-fno-math-errno", "-fwrapv")
CROSS_CC = {"aarch64": "aarch64-linux-gnu-gcc"}  # Debian's cross compilers (apt-get install gcc-aarch64-linux-gnu)


@dataclass(frozen=True)
class CPUTarget:
  """An instruction set CPU kernels are compiled for: its -march, the vector lanes and registers a kernel may plan with, and the
  /proc/cpuinfo flags a CPU needs to run its code."""
  name: str
  machine: str  # platform.machine() of the CPUs that run it
  march: str
  lanes: int  # float32 lanes of one vector register
  registers: int
  needs: tuple[str, ...] = ()
  dot: tuple[str, ...] = ()  # input dtypes of its dot-product instructions (the CPU's TC)


TARGETS = {t.name: t for t in (
  CPUTarget("x86-64-v2", "x86_64", "-march=x86-64-v2", 4, 16, ("ssse3", "sse4_1", "sse4_2", "popcnt")),
  CPUTarget("x86-64-v3", "x86_64", "-march=x86-64-v3", 8, 16, ("avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe")),
  CPUTarget("x86-64-v4", "x86_64", "-march=x86-64-v4", 16, 32, ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")),
  CPUTarget("aarch64", "aarch64", "-march=armv8-a", 4, 32))}
TARGET_NAMES = ("native", *TARGETS)


def cpu_target(name: str | None = None) -> CPUTarget:
  """The target named (else $TINYTUNE_CPU_TARGET, else native: this CPU as it is), a ValueError naming the choices for any other."""
  name = name or os.getenv("TINYTUNE_CPU_TARGET", "").strip() or "native"
  if name == "native":
    flags, machine = cpuinfo().get("flags", "").split(), normal_machine(platform.machine())
    lanes, registers = (16, 32) if "avx512f" in flags else (8, 16) if "avx" in flags else (4, 32) if machine == "aarch64" else (4, 16)
    return CPUTarget("native", machine, "-march=native", lanes, registers, dot=("bfloat16",) if "avx512_bf16" in flags else ())
  if name not in TARGETS: raise ValueError(f"{name!r} is not a CPU target (TINYTUNE_CPU_TARGET, --target); choose one of {', '.join(TARGET_NAMES)}")
  return TARGETS[name]


def normal_machine(machine: str) -> str: return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine.lower())


def cannot_run(target: CPUTarget) -> str | None:
  """None where this CPU runs the target's code, else why not (one line)."""
  if target.machine != (here := normal_machine(platform.machine())): return f"this is an {here} CPU"
  flags = cpuinfo().get("flags", "").split()
  if flags and (lacks := [f for f in target.needs if f not in flags]): return f"this CPU lacks {' '.join(lacks)}"
  return None


@functools.cache
def cache_sizes() -> tuple[int, int]:
  """(L1 data, L2) bytes of one core, from sysfs or getconf; 32 KiB and 1 MiB where neither says."""
  found: dict[str, int] = {}
  for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
    try:
      level, kind, size = (open(os.path.join(index, f)).read().strip() for f in ("level", "type", "size"))
      if kind in ("Data", "Unified") and size[:-1].isdigit(): found.setdefault(level, int(size[:-1]) << {"K": 10, "M": 20}.get(size[-1], 0))
    except OSError: pass
  for level, key in (("1", "LEVEL1_DCACHE_SIZE"), ("2", "LEVEL2_CACHE_SIZE")):
    if level not in found and shutil.which("getconf"):
      out = subprocess.run(["getconf", key], capture_output=True, text=True).stdout.strip()
      if out.isdigit() and int(out): found[level] = int(out)
  return found.get("1", 32 << 10), found.get("2", 1 << 20)


compile_stats = {"hits": 0, "misses": 0}  # on-disk compile cache


@functools.cache
def find_compiler(target: CPUTarget | None = None) -> str:
  """TINYTUNE_CC, else (for another machine's target) its cross compiler, else the first of clang, cc, gcc that builds with OpenMP,
  else the first present: a compiler that cannot build OpenMP is never chosen over one that can."""
  target = target or cpu_target()
  if cc := os.getenv("TINYTUNE_CC"):
    if shutil.which(cc) is None: raise RuntimeError(f"TINYTUNE_CC={cc!r} is not a command: install it or unset TINYTUNE_CC")
    return cc
  if target.machine != normal_machine(platform.machine()):
    if shutil.which(cc := CROSS_CC.get(target.machine, "")): return cc
    raise RuntimeError(f"no compiler for {target.name} here: apt-get install gcc-{target.machine}-linux-gnu, or set TINYTUNE_CC")
  found = [cc for cc in ("clang", "cc", "gcc") if shutil.which(cc)]
  if not found: raise RuntimeError("no C compiler found: install one (apt-get install gcc) or set TINYTUNE_CC")
  return next((cc for cc in found if openmp_works(cc)), found[0])


@functools.cache
def openmp_works(cc: str, flag: str = "-fopenmp") -> bool:
  """Whether `cc -fopenmp` builds a shared object here (clang needs libomp installed for it) whose parallel loop calls an OpenMP
  runtime: a compiler can accept the flag and drop the pragma (clang -fopenmp=libgomp links gcc's runtime but runs one thread)."""
  with tempfile.TemporaryDirectory() as tmp:
    with open(os.path.join(tmp, "t.c"), "w") as f: f.write("void f(int* x) {\n#pragma omp parallel for\nfor (int i = 0; i < 4; i++) x[i] = i;\n}\n")
    flags = [f for f in FLAGS if not f.startswith("-march=")]  # any target's compiler
    built = subprocess.run([cc, *flags, flag, "t.c", "-o", "t.so"], cwd=tmp, capture_output=True).returncode == 0
    if not built or not os.path.exists(so_path := os.path.join(tmp, "t.so")): return False  # a "compiler" that exits 0 and writes nothing
    with open(so_path, "rb") as so: lib = so.read()
    return any(call in lib for call in (b"GOMP_parallel", b"__kmpc_fork_call"))  # libgomp's entry, libomp's


def one_thread_note(cc: str) -> str:
  """What to do where `cc` cannot build OpenMP."""
  fix = "apt-get install libomp-dev (or unset TINYTUNE_CC for gcc)" if "clang" in compiler_version(cc) else "use gcc, or clang with libomp-dev"
  return f"{cc} cannot build OpenMP here, so CPU kernels run on one thread: {fix}"


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


def cap_openmp(threads: int) -> None:
  """Caps the kernels' OpenMP threads at the cores this process may use whatever OMP_NUM_THREADS says (OMP_NUM_THREADS=100000
  segfaulted a 256x256 matmul): OMP_THREAD_LIMIT, which the OpenMP runtime reads when the first kernel loads it."""
  limit = os.getenv("OMP_THREAD_LIMIT", "").strip()
  if not (limit.isdigit() and 0 < int(limit) <= threads): os.environ["OMP_THREAD_LIMIT"] = str(threads)


class CPUProgram(Program):
  def __init__(self, name: str, path: str):
    self.lib = ctypes.CDLL(path)
    self.fxn = getattr(self.lib, name)
    self.address = ctypes.cast(self.fxn, ctypes.c_void_p).value  # for TinyJit's batched calls

  def __call__(self, *bufs: Buffer, wait: bool = False) -> float:
    ptrs = [b.__dict__.get("address") or address(b) for b in bufs]
    if self.fxn.argtypes is None: self.fxn.argtypes = [ctypes.c_void_p] * len(ptrs)
    st = perf_counter()
    self.fxn(*ptrs)
    return perf_counter() - st


def address(buf: Buffer) -> int:
  """A CPU buffer's address, as a C argument."""
  return kept_address(buf, _data)


def _data(mem: np.ndarray) -> int: return mem.__array_interface__["data"][0]


class CPUDevice(Compiled):
  name = "CPU"

  def __init__(self, target: str | None = None) -> None:
    self.target = cpu_target(target)
    self.cc = find_compiler(self.target)
    self.renderer = CRenderer()
    if not (openmp := openmp_works(self.cc)): warn_once(one_thread_note(self.cc))
    # gcc 12's if-conversion with AVX-512 masks miscompiles some selects (a masked subtract with the wrong mask)
    gcc = "clang" not in compiler_version(self.cc)
    self.flags = tuple(self.target.march if f.startswith("-march=") else f for f in FLAGS) + (("-fopenmp",) if openmp else ()) + \
      (("-fno-tree-loop-if-convert",) if gcc else ())
    threads = len(os.sched_getaffinity(0)) if openmp and hasattr(os, "sched_getaffinity") else 1
    cap_openmp(threads)
    l1, l2 = cache_sizes()
    self.caps = DeviceCaps(has_local=False, threads=threads, max_upcast=256, simd_width=self.target.lanes, vector_registers=self.target.registers,
                           tensor_cores=self.target.dot, l1_bytes=l1, l2_bytes=l2)  # TC: the target's dot products (see TensorCore)

  def alloc(self, size: int, dtype: DType) -> np.ndarray:
    """Memory that starts on a cache line: numpy starts large arrays 16 bytes into one, so every 64-byte vector load would
    straddle two lines (a streaming kernel ran 4-9% slower)."""
    raw = np.empty(size * dtype.itemsize + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + size * dtype.itemsize].view(dtype.np)
  def retype(self, mem: np.ndarray, size: int, dtype: DType) -> np.ndarray: return mem if mem.dtype.type is dtype.np else mem.view(dtype.np)
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
        if not sofile.exists():  # TINYTUNE_CC=/bin/true exits 0 and writes nothing
          raise CompileError(f"{self.cc} exited 0 but wrote no shared object: it is not a C compiler; set TINYTUNE_CC to one, or unset it")
        os.replace(sofile, path)  # atomic, so concurrent compiles of the same kernel are safe
      finally:
        cfile.unlink(missing_ok=True)
        sofile.unlink(missing_ok=True)
    return str(path).encode()

  def program(self, name: str, lib: bytes, launch: tuple[int, int] = (1, 1)) -> Program:
    if why := cannot_run(self.target):
      raise DeviceMissing(f"CPU kernels built for {self.target.name} cannot run here ({why}): set TINYTUNE_CPU_TARGET (or --target) to native")
    return CPUProgram(name, lib.decode())

  def fingerprint(self) -> dict[str, str]:
    """native: this CPU (its model and exact ISA); a named target: the target alone, so a cache tuned for it is found on every CPU
    that runs it."""
    info, common = cpuinfo(), {"kind": "CPU", "compiler": self.cc, "compiler_version": compiler_version(self.cc), "flags": " ".join(self.flags)}
    if self.target.name != "native": return {**common, "name": self.target.name, "arch": self.target.machine, "target": self.target.name}
    isa = hashlib.sha256(info.get("flags", "").encode()).hexdigest()[:12]  # -march=native code depends on the exact ISA
    return {**common, "name": info.get("model name", platform.processor()), "arch": f"{platform.machine()}-{isa}"}

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
