"""What the op tests share: hypothesis example counts, canary bytes around every buffer (oob_guard, autouse in each op test
file that imports it), known bugs that fuzz examples are rejected for, and the op-by-op comparison with NumPy."""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, reject
from hypothesis import strategies as st

from tinytune import Device, Tensor
from tinytune.dtype import DType


def nvrtc_missing() -> str | None:
  """Why NVRTC (cuda-bindings) cannot compile here, or None: its tests skip with that reason."""
  try:
    from cuda.bindings import nvrtc
    nvrtc.nvrtcVersion()
  except Exception as e: return f"no NVRTC here ({type(e).__name__}): pip install -e '.[cuda]'"
  return None


PTXAS_STAT = r"(\d+) (bytes spill stores|bytes spill loads|registers|bytes smem)"


def ptxas_stats(tmp_path: Any, src: str, arch: str) -> dict[str, int]:
  """src built by nvcc for `arch` with ptxas' verbose report: its registers, spill bytes and shared-memory bytes."""
  return {m[1]: int(m[0]) for m in re.findall(PTXAS_STAT, ptxas_report(tmp_path, src, arch))}


def ptxas_report(tmp_path: Any, src: str, arch: str, name: str = "k") -> str:
  """ptxas' verbose report of src built by nvcc for `arch` (in files named `name`_`arch`)."""
  (tmp_path / f"{name}_{arch}.cu").write_text(src)
  res = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", "-Xptxas", "-v", f"{name}_{arch}.cu", "-o", f"{name}_{arch}.cubin"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]
  return res.stderr


def ptxas_stats_each(tmp_path: Any, srcs: Sequence[str], arch: str) -> list[dict[str, int]]:
  """ptxas_stats of each source (the most of its kernels'), from one nvcc a core over them all: nvcc takes seconds to start where ptxas
  takes milliseconds a small kernel. Each source goes in a namespace of its own (its kernels' C++ names there: k3's are _ZN2k3...), the
  #includes first in the file; ptxas allocates each kernel's registers alone, so its report is the one the source alone gets."""
  def report(part: int, n: int) -> str:
    mine = range(part, len(srcs), n)
    includes = dict.fromkeys(line for i in mine for line in srcs[i].splitlines() if line.startswith("#include"))
    body = [f"namespace k{i} {{\n" + "\n".join(line.replace('extern "C" ', "") for line in srcs[i].splitlines() if not line.startswith("#include"))
            + "\n}" for i in mine]
    return ptxas_report(tmp_path, "\n".join([*includes, *body]), arch, f"part{part}")
  n = min(len(srcs), os.cpu_count() or 1)
  with ThreadPoolExecutor(n) as pool: reports = list(pool.map(report, range(n), [n] * n))
  stats: list[dict[str, int]] = [{} for _ in srcs]
  for kernel in "".join(reports).split("Compiling entry function '")[1:]:
    name = re.match(r"_ZN(\d+)(k\d+)", kernel)  # the namespace's name, its length first
    got = stats[int(name[2][1:int(name[1])])]  # type: ignore[index]
    for m in re.findall(PTXAS_STAT, kernel): got[m[1]] = max(got.get(m[1], 0), int(m[0]))
  assert all(stats), [i for i, s in enumerate(stats) if not s]  # every source's kernels were reported
  return stats


def bench_module(name: str) -> Any:
  """bench/<name>.py loaded as a module (bench is a folder of scripts, not a package)."""
  spec = importlib.util.spec_from_file_location(name, pathlib.Path(__file__).parents[1] / "bench" / f"{name}.py")
  assert spec is not None and spec.loader is not None
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def hip_flags(arch: str) -> list[str]:
  """clang's flags that compile HIP device code for `arch` to assembly with no ROCm installed."""
  return ["-x", "hip", f"--offload-arch={arch}", "-nogpulib", "-nogpuinc", "--cuda-device-only", "-S", "-O3"]


@functools.cache
def hip_clang(arch: str) -> str | None:
  """A clang that compiles HIP device code for `arch` with hip_flags (Debian's clang 15 and later do), or None: its tests skip."""
  for clang in filter(None, map(shutil.which, ("clang", "clang-19", "clang-18", "clang-17", "clang-16", "clang-15"))):
    res = subprocess.run([clang, *hip_flags(arch), "-", "-o", "-"], input='extern "C" __attribute__((global)) void k(float* a) { a[0] = 1; }\n',
                         capture_output=True, text=True)
    if res.returncode == 0: return clang
  return None


def examples(n: int) -> int: return n * int(os.getenv("TT_FUZZ_SCALE", "1"))
def device_examples(n: int, device: str) -> int:
  """examples(n), but half of n on OpenCL, where pocl builds each kernel slowly, unless TT_FUZZ_SCALE is 2 or more."""
  return n // 2 if device == "OPENCL" and examples(1) < 2 else examples(n)


FUZZ = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                                                  HealthCheck.function_scoped_fixture])

CANARY, PAD = 0x7F, 64  # 0x7F7F7F7F is 3.4e38 as a float32: reading a canary shows too


class OOBGuard:
  """Puts PAD canary bytes on both sides of every buffer allocated while a test runs; check() fails if a kernel wrote over one."""

  def __init__(self) -> None: self.bases: list[np.ndarray] = []

  def alloc(self, size: int, dtype: DType) -> np.ndarray:
    base = np.full(size * dtype.itemsize + 2 * PAD, CANARY, np.uint8)
    self.bases.append(base)
    return base[PAD:PAD + size * dtype.itemsize].view(dtype.np)

  def check(self) -> None:
    bad, self.bases = [b for b in self.bases if (b[:PAD] != CANARY).any() or (b[-PAD:] != CANARY).any()], []
    assert not bad, f"kernels wrote out of bounds of {len(bad)} buffer(s) ({[b.size - 2 * PAD for b in bad]} bytes)"


GUARD = OOBGuard()  # the running test's guard


@pytest.fixture(autouse=True)
def oob_guard(monkeypatch: pytest.MonkeyPatch) -> Any:
  global GUARD
  GUARD = OOBGuard()
  monkeypatch.setattr(Device["CPU"], "alloc", GUARD.alloc)
  yield GUARD
  GUARD.check()


# Known bugs outside tensor.py, each pinned down by a strict xfail test below. A fuzz example that trips one is rejected
# (not failed) so the fuzzers keep looking for new bugs; delete the entry when its xfail test starts passing.
KNOWN_BUGS: dict[tuple[type, str], str] = {  # (exception type, a function in its traceback) -> the xfail test
}


def realize_or_reject(fn: Callable[[], Tensor]) -> np.ndarray:
  """fn() as an array, its kernels checked for out-of-bounds writes; an example that trips a known bug is rejected."""
  try: out = fn().numpy()
  except Exception as e:
    names = {f.name for f in traceback.extract_tb(e.__traceback__)}
    if any(isinstance(e, typ) and name in names for typ, name in KNOWN_BUGS): reject()
    raise
  GUARD.check()  # per example, so hypothesis can shrink one that writes out of bounds
  return out



def rand(*shape: int, lo: float = -3.0, hi: float = 3.0, dtype: Any = np.float32, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed + 7 * len(shape) + sum(shape)).uniform(lo, hi, shape).astype(dtype)


def check(t: Tensor, expected: Any, dtype: DType | None = None, rtol: float = 1e-5, atol: float = 1e-6) -> None:
  """t's values (and dtype, given one) equal expected: exactly for ints and bools, to rtol/atol for floats."""
  exp = np.asarray(expected)
  if dtype is not None: assert t.dtype == dtype, f"dtype {t.dtype} != {dtype}"
  got = t.numpy()
  GUARD.check()
  assert got.shape == exp.shape, f"shape {got.shape} != {exp.shape}"
  assert got.dtype == t.dtype.np
  if t.dtype.is_float: np.testing.assert_allclose(got.astype(np.float64), exp.astype(np.float64), rtol=rtol, atol=atol)
  else: np.testing.assert_array_equal(got, exp)


# ***** indexes and axes, drawn or listed *****

GETITEM_CASES = [
  1, -1, (0, 2), (-1, -2, 3), slice(None), slice(1, None), slice(None, -1), slice(None, None, 2), slice(None, None, -1), slice(-1, 0, -2),
  (slice(1, 3), slice(None, None, 3)), (Ellipsis, 1), (1, Ellipsis), (None, 1), (1, None, slice(None, None, -2)), (Ellipsis, None),
  (None, Ellipsis, None), (slice(-100, 100), slice(5, 1, -1)), (slice(3, 1, -1), Ellipsis, -1), (), Ellipsis, (np.int64(1), np.int32(-1)),
  (slice(None, None, 3), 2, slice(None, None, -3)), (slice(2, None), 0), (slice(None, None, 5), slice(-2, None, 4), slice(1, -1, 3)),
]


def _axes(axis: Any, nd: int) -> tuple[int, ...]:
  if axis is None: return tuple(range(nd))
  return tuple(sorted({a % nd for a in (axis if isinstance(axis, tuple) else (axis,))}))


def _slice_for(draw: Any, n: int) -> slice:
  step = draw(st.sampled_from([None, 1, 2, 3, -1, -2]))
  bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
  return slice(draw(bound), draw(bound), step)


def _index_for(draw: Any, shape: tuple[int, ...]) -> tuple:
  """A random basic index (ints, slices with steps and negative bounds, None, one Ellipsis) that selects something."""
  def parts_for(sizes: tuple[int, ...]) -> list[Any]:
    parts: list[Any] = []
    for n in sizes:
      kind = draw(st.sampled_from(["int", "slice", "slice", "none"]))
      if kind == "none": parts.append(None)
      parts.append(draw(st.integers(-n, n - 1)) if kind == "int" else _slice_for(draw, n))
    return parts
  ndims = draw(st.integers(0, len(shape)))
  if draw(st.booleans()): parts = parts_for(shape[:ndims])
  else:  # an Ellipsis takes the dims the parts before and after it leave
    at = draw(st.integers(0, ndims))
    parts = parts_for(shape[:at]) + [Ellipsis] + parts_for(shape[len(shape) - (ndims - at):])
  if draw(st.booleans()): parts.append(None)
  idx = tuple(parts)
  return idx if 0 not in np.empty(shape)[idx].shape else (slice(None),)


def _idx_code(idx: tuple) -> str:
  def one(i: Any) -> str:
    if isinstance(i, slice): return ":".join("" if v is None else str(v) for v in (i.start, i.stop, i.step)).rstrip(":") or ":"
    return "..." if i is Ellipsis else repr(i)
  return ", ".join(one(i) for i in idx) if idx else "()"


def _axis_arg(draw: Any, nd: int) -> Any:
  kind = draw(st.sampled_from(["none", "int", "tuple"]))
  if kind == "none": return None
  if kind == "int": return draw(st.integers(-nd, nd - 1))
  return tuple(a - nd if draw(st.booleans()) else a for a in draw(st.lists(st.integers(0, nd - 1), min_size=1, max_size=nd, unique=True)))


def run_blocks_on_host(tmp_path: Any, source: str, blocks: int, threads: int, each_thread: str, result: str = "0",
                       flags: Sequence[str] = (), inputs: Sequence[str] = ("a", "b")) -> Callable[..., int]:
  """GPU source made host C++ by its test's shim, built with g++ as a library whose `run(out, *inputs)` runs `blocks` blocks one after
  another, each as `threads` std::threads that share `block_sync` (the shim's barrier for warp-wide calls and __syncthreads);
  `each_thread` is a thread's body (i, blk: its thread and block ids), `result` what run returns when all are done. A kernel's dynamic
  shared memory (past 48 KB) is a static array of its size, as its shared arrays are: the blocks run one after another."""
  from tinytune.codegen.cstyle import DYNAMIC_SHARED, dynamic_shared
  if n := dynamic_shared(source): source = source.replace(DYNAMIC_SHARED.format(n), f"__shared__ __align__(128) unsigned char tt_shared[{n}];")
  (tmp_path / "k.cpp").write_text(source + f"""
extern "C" int run(void* out, {", ".join(f"const void* {x}" for x in inputs)}) {{
  for (int blk = 0; blk < {blocks}; blk++) {{
    std::barrier<> sync({threads});
    block_sync = &sync;
    std::vector<std::thread> ts;
    for (int i = 0; i < {threads}; i++) ts.emplace_back([=] {{ {each_thread} }});
    for (auto& t : ts) t.join();
  }}
  return {result};
}}
""")
  cmd = ["g++", "-std=c++20", "-O1", "-fno-strict-aliasing", *flags, "-shared", "-fPIC", "-pthread", "k.cpp", "-o", "k.so"]
  build = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert build.returncode == 0, build.stderr[-3000:]
  run = ctypes.CDLL(str(tmp_path / "k.so")).run
  return lambda *arrays: run(*(x.ctypes.data_as(ctypes.c_void_p) for x in arrays))
