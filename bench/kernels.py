"""Every catalog workload, default opts: torch_ms / tinytune_ms, elementwise and reduce as a fraction of a STREAM triad, and the
GEMM-like workloads as a fraction of a peak-FMA probe (a loop of register-only FMAs in C for the target, on every thread), both
compiled and measured in the same run. Ratios are medians over rounds; each round times tinytune and PyTorch back to back with
the search's timing loop (tinytune/kernels/baselines.py; PyTorch in its own process, held to the target's ISA). With --search S,
each shape is first searched by `tinytune search W -p ... --seconds S` into a fresh database, and the tuned kernels are timed
beside the defaults. The output is Markdown: with --write it also goes to bench/results/cpu-VENDOR-FAMILY-MODEL-ISA.md, and
--compare FILE says which workloads regressed against such a file of the same family.

  python bench/kernels.py [--target x86-64-v3] [--rounds 3] [--only softmax,reduce] [--quick] [--search 60] [--write] [--compare FILE]
  taskset -c 0 python bench/kernels.py ...   # one core: tinytune and PyTorch both on one thread
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from tinytune.kernels import get_workload
from tinytune.kernels.baselines import tinytune_timing, torch_baseline
from tinytune.results_db import Database
from tinytune.runtime import Device
from tinytune.runtime.cpu import cannot_run, compiler_version, cpuinfo
from tinytune.search.evaluate import TimingPolicy

# (workload, params): the shape first, then two others
SHAPES: list[tuple[str, dict[str, int]]] = [
  *[("matmul", {"m": n, "n": n, "k": n}) for n in (256, 512, 1024, 2048)],
  ("bmm", {"batch": 8, "m": 128, "n": 128, "k": 128}), ("bmm", {"batch": 16, "m": 256, "n": 256, "k": 64}),
  ("bmm", {"batch": 4, "m": 512, "n": 512, "k": 512}),
  ("linear", {"m": 64, "n": 1024, "k": 1024}), ("linear", {"m": 16, "n": 4096, "k": 4096}), ("linear", {"m": 256, "n": 4096, "k": 4096}),
  ("conv2d", {"batch": 16, "cin": 64, "cout": 64, "size": 56}), ("conv2d", {"batch": 4, "cin": 32, "cout": 32, "size": 32}),
  ("conv2d", {"batch": 8, "cin": 128, "cout": 128, "size": 28}),
  ("attention", {"batch": 1, "heads": 8, "seq": 1024, "dim": 64}), ("attention", {"batch": 1, "heads": 4, "seq": 256, "dim": 64}),
  ("attention", {"batch": 2, "heads": 8, "seq": 512, "dim": 64}),
  ("mlp", {"batch": 64, "din": 512, "hidden": 1024, "dout": 512}), ("mlp", {"batch": 256, "din": 784, "hidden": 128, "dout": 10}),
  ("mlp", {"batch": 128, "din": 768, "hidden": 3072, "dout": 768}),
  *[("reduce", {"rows": r, "cols": c, "axis": ax}) for r, c in ((4096, 4096), (1024, 1024), (256, 16384)) for ax in (1, 0)],
  ("layernorm", {"rows": 4096, "cols": 1024}), ("layernorm", {"rows": 1024, "cols": 1024}), ("layernorm", {"rows": 512, "cols": 4096}),
  ("softmax", {"rows": 4096, "cols": 4096}), ("softmax", {"rows": 1024, "cols": 1024}), ("softmax", {"rows": 8192, "cols": 512}),
  ("elementwise", {"n": 1 << 24}), ("elementwise", {"n": 1 << 20}), ("elementwise", {"n": 1 << 22}),
]
BANDWIDTH = ("elementwise", "reduce")  # reported as a fraction of the triad too
COMPUTE = ("matmul", "bmm", "linear", "conv2d", "attention", "mlp")  # and these of the peak-FMA probe
RESULTS = pathlib.Path(__file__).parent / "results"
REGRESSION = 0.9  # a torch/tinytune ratio below this fraction of the file's is a regression

TRIAD = """
void triad(float* restrict a, const float* restrict b, const float* restrict c, long n) {
  #pragma omp parallel for schedule(static)
  for (long i = 0; i < n; i++) a[i] = b[i] + 3.0f * c[i];
}
"""


# 12 independent chains of vector FMAs (of 16 registers, with room for the constants) cover two FMA units of latency 4 to 6
FMA = """
typedef float vf __attribute__((vector_size(LANES * 4)));
float fma_loop(long n, float mul, float add) {
  float total = 0;
  #pragma omp parallel reduction(+:total)
  {
    vf acc[12], m, a;
    for (int j = 0; j < LANES; j++) { m[j] = mul; a[j] = add; }
    for (int i = 0; i < 12; i++) acc[i] = a * (float)(i + 2);
    for (long k = 0; k < n; k++) {
      #pragma GCC unroll 12
      for (int i = 0; i < 12; i++) acc[i] = acc[i] * m + a;
    }
    for (int i = 0; i < 12; i++) for (int j = 0; j < LANES; j++) total += acc[i][j];
  }
  return total;
}
"""


def build(name: str, src: str) -> Any:
  """A C function compiled with the CPU device's compiler and flags (its target's -march, OpenMP), loaded."""
  dev: Any = Device["CPU"]
  with tempfile.TemporaryDirectory() as tmp:
    path, so = os.path.join(tmp, f"{name}.c"), os.path.join(tmp, f"{name}.so")
    with open(path, "w") as f: f.write(src)
    subprocess.run([dev.cc, *dev.flags, path, "-o", so], check=True)
    return getattr(ctypes.CDLL(so), name)


def peak_gflops(n: int = 1 << 20, repeats: int = 10) -> float:
  """GFLOPS of 12 chains of FMAs in registers, the target's vectors, on every thread: the most a matmul kernel could reach."""
  lanes = Device["CPU"].caps.simd_width
  fn = build("fma_loop", f"#define LANES {lanes}\n" + FMA)
  fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_long, ctypes.c_float, ctypes.c_float]
  fn(n // 16, 0.999999, 1e-6)
  times = []
  for _ in range(repeats):
    st = time.perf_counter()
    fn(n, 0.999999, 1e-6)
    times.append(time.perf_counter() - st)
  return Device["CPU"].caps.threads * n * 12 * lanes * 2 / min(times) / 1e9


def triad_gbs(n: int = 1 << 24, repeats: int = 20) -> float:
  """GB/s of a STREAM triad (a = b + s*c, counted as 3 arrays moved) in C with OpenMP on the CPU device's compiler and threads."""
  fn = build("triad", TRIAD)
  a, b, c = (np.ones(n, np.float32) for _ in range(3))
  ptr = [x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, c)]
  fn(*ptr, ctypes.c_long(n))
  times = []
  for _ in range(repeats):
    st = time.perf_counter()
    fn(*ptr, ctypes.c_long(n))
    times.append(time.perf_counter() - st)
  return 3 * 4 * n / statistics.median(times) / 1e9


def family() -> str:
  """cpu-VENDOR-FAMILY-MODEL-ISA of this machine and target: the name of its results file."""
  info, dev = cpuinfo(), Device["CPU"]
  vendor = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}.get(info.get("vendor_id", ""), platform.machine().lower())
  isa = {16: "avx512", 8: "avx2"}.get(dev.caps.simd_width, "sse") if dev.target.machine == "x86_64" else dev.target.machine
  return f"cpu-{vendor}-{info.get('cpu family', '0')}-{info.get('model', '0')}-{isa}"


def header(rounds: int) -> list[str]:
  info, dev = cpuinfo(), Device["CPU"]
  flags = [f for f in info.get("flags", "").split() if re.fullmatch(r"avx\w*|fma|f16c|sse4_2|amx\w*|sve\w*|asimd\w*", f)]
  return [f"# {family()}", "", f"- model: {info.get('model name', platform.processor())} (family {info.get('cpu family')}, "
          f"model {info.get('model')}), {len(os.sched_getaffinity(0))} cores", f"- ISA flags: {' '.join(flags)}",
          f"- target: {dev.target.name} ({' '.join(dev.flags)})", f"- compiler: {compiler_version(dev.cc)}",
          f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; `python bench/kernels.py --target {dev.target.name} "
          f"--rounds {rounds}`", ""]


def compare(path: str, rows: dict[tuple[str, str], float]) -> list[str]:
  """What regressed against a results file of this family: each shape's torch/tinytune ratio below REGRESSION of the file's."""
  text = pathlib.Path(path).read_text()
  if (first := text.splitlines()[0].removeprefix("# ").strip()) != (here := family()):
    raise SystemExit(f"kernels.py: error: {path} holds figures of {first}, this is {here}: compare with bench/results/{here}.md")
  old = {(c[1], c[2]): float(c[5]) for line in text.splitlines() if (c := [x.strip() for x in line.split("|")]) and len(c) > 6
         and c[1] not in ("workload", "---") and re.fullmatch(r"[\d.]+", c[5])}
  worse = [f"{w} {p}: torch/tinytune {old[(w, p)]:.2f} -> {r:.2f}" for (w, p), r in rows.items() if (w, p) in old and r < REGRESSION * old[(w, p)]]
  return [f"against {path}: " + (f"{len(worse)} regressed (ratio below {REGRESSION:.0%} of the file's)" if worse else "nothing regressed"), *worse]


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--only", default="", help="comma-separated workload names")
  ap.add_argument("--quick", action="store_true", help="the issue's shape only")
  ap.add_argument("--search", type=float, default=0, metavar="S", help="search each shape for S seconds first, and time the tuned kernels too")
  ap.add_argument("--target", default=None, help="CPU target: native (default), x86-64-v2, x86-64-v3, x86-64-v4 (PyTorch held to it too)")
  ap.add_argument("--write", action="store_true", help="also write the table to bench/results/cpu-VENDOR-FAMILY-MODEL-ISA.md")
  ap.add_argument("--compare", default=None, metavar="FILE", help="say what regressed against this results file (of this CPU family)")
  args = ap.parse_args()
  if args.target: os.environ["TINYTUNE_CPU_TARGET"] = args.target  # before the CPU device opens; PyTorch's process inherits it
  try:
    if why := cannot_run(Device["CPU"].target): raise ValueError(f"{Device['CPU'].target.name} cannot run here: {why}")
  except ValueError as e: raise SystemExit(f"kernels.py: error: {e}") from None
  policy = TimingPolicy(min_repeats=3, max_repeats=10, max_seconds=0.5)
  only = set(args.only.split(",")) if args.only else None
  seen: set[str] = set()
  lines = header(args.rounds)
  def out(line: str) -> None: print(line, flush=True); lines.append(line)
  out(f"load average at start: {os.getloadavg()[0]:.2f}; threads: {Device['CPU'].caps.threads}")
  triad = statistics.median(triad_gbs() for _ in range(args.rounds))
  peak = statistics.median(peak_gflops() for _ in range(args.rounds))
  out(f"STREAM triad: {triad:.1f} GB/s; peak FMA probe: {peak:.0f} GFLOPS\n")
  tuned_head = " searched s | tuned ms | torch/tuned |" if args.search else ""
  out(f"| workload | params | tinytune ms | torch ms | torch/tt | GB/s | of triad | GFLOPS | of peak | max rel err |{tuned_head}")
  out("| --- " * (10 + 3 * bool(args.search)) + "|")
  ratios_by_shape: dict[tuple[str, str], float] = {}
  for name, params in SHAPES:
    if only is not None and name not in only or args.quick and name in seen and name != "matmul": continue
    seen.add(name)
    w = get_workload(name)
    p = w.params(params)
    db, searched = None, 0.0
    if args.search:
      url = f"sqlite:///{tempfile.mkdtemp()}/bench.db"
      st = time.perf_counter()
      subprocess.run([sys.executable, "-m", "tinytune.cli", "search", name, *(f"-p{k}={v}" for k, v in params.items()),
                      "--seconds", str(args.search), "--db", url], check=True, capture_output=True)
      searched = time.perf_counter() - st
      db = Database(url)
    tt, th, tu, ratios, tuned_ratios, err = [], [], [], [], [], float("nan")
    for _ in range(args.rounds):
      t, b = tinytune_timing(w, p, "CPU", False, policy), torch_baseline(w, p, "CPU", policy)
      tt.append(t.median_s)
      th.append(b.median_s)
      ratios.append(b.median_s / t.median_s)
      if db is not None:
        tu.append(tinytune_timing(w, p, "CPU", True, policy, db=db).median_s)
        tuned_ratios.append(b.median_s / tu[-1])
      if t.output is not None and b.output is not None:
        err = float(np.max(np.abs(t.output - b.output)) / max(1e-30, float(np.max(np.abs(b.output)))))
    t_s = statistics.median(tt)
    gbs, gflops = w.nbytes(p) / t_s / 1e9, w.flops(p) / t_s / 1e9
    bw = f"{gbs:.1f} | {gbs / triad:.2f}" if name in BANDWIDTH else " | "
    fl = f"{gflops:.1f} | {gflops / peak:.2f}" if name in COMPUTE else " | "
    shape = " ".join(f"{k}={v}" for k, v in params.items())
    tuned = f" {searched:.1f} | {statistics.median(tu) * 1e3:.3f} | {statistics.median(tuned_ratios):.2f} |" if db is not None else ""
    ratio = ratios_by_shape[(name, shape)] = statistics.median(ratios)
    out(f"| {name} | {shape} | {t_s * 1e3:.3f} | {statistics.median(th) * 1e3:.3f} | {ratio:.2f} | {bw} | {fl} | {err:.1e} |{tuned}")
  out(f"\nload average at end: {os.getloadavg()[0]:.2f}")
  if args.write:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{family()}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS / f'{family()}.md'}")
  if args.compare: print("\n".join(compare(args.compare, ratios_by_shape)))


if __name__ == "__main__":
  main()
