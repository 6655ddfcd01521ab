"""One command that checks a GPU: the tests on it, the catalog at GPU sizes against PyTorch, matmul 4096^3 in three dtypes
before and after a search, the MLP training step under TinyJit against torch eager, a one-kernel step's overhead, and search
rates. Writes bench/results/<gpu>-<date>.md and, beside it, a junit file of its sections (and pytest's of the tests). Each
section runs alone: one that fails is recorded with its error and the next one runs. How each figure is taken: bench/METHOD.md;
setting up a GPU machine with no network: bench/HOPPER.md.

  python bench/gpu_suite.py                         # CUDA, within 8 minutes on an H100/H200
  python bench/gpu_suite.py --quick --device OPENCL  # the script itself, at small sizes, on any machine (pocl, or CPU)
"""
from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import math
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, NamedTuple
from xml.sax.saxutils import escape

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent


class Suite:
  """The report being written: Markdown lines, and each section's outcome for the junit file."""

  def __init__(self, args: argparse.Namespace):
    self.args, self.lines, self.cases = args, [], []
    self.started = time.monotonic()

  def left(self) -> float: return self.args.budget - (time.monotonic() - self.started)
  def out(self, line: str = "") -> None:
    print(line, flush=True)
    self.lines.append(line)

  def section(self, title: str, fn: Callable[[], None]) -> None:
    """Run one section; an exception is recorded (its last line in the report, the traceback in the junit file) and the suite goes on."""
    self.out(f"\n## {title}\n")
    st = time.monotonic()
    try:
      fn()
      self.cases.append((title, time.monotonic() - st, None))
    except Exception as e:
      self.out(f"**failed**: `{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}`")
      self.cases.append((title, time.monotonic() - st, traceback.format_exc()))
    self.out(f"\n({time.monotonic() - st:.1f} s)")

  def junit(self, path: pathlib.Path) -> None:
    failures = sum(err is not None for _, _, err in self.cases)
    cases = "".join(f'  <testcase classname="gpu_suite" name="{escape(name)}" time="{s:.2f}">'
                    + (f'<failure message="section failed">{escape(err)}</failure>' if err else "") + "</testcase>\n" for name, s, err in self.cases)
    path.write_text(f'<?xml version="1.0" encoding="utf-8"?>\n<testsuite name="gpu_suite" tests="{len(self.cases)}" failures="{failures}">\n'
                    f"{cases}</testsuite>\n")


def torch_cuda() -> Any:
  """PyTorch where it can see a GPU, else None."""
  if importlib.util.find_spec("torch") is None: return None
  import torch
  return torch if torch.cuda.is_available() else None


def versions(suite: Suite, dev: str) -> None:
  from tinytune import __version__
  from tinytune.runtime import Device, device_fingerprint
  fp = device_fingerprint(dev)
  torch = torch_cuda()
  try: commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
  except OSError: commit = ""
  d: Any = Device[dev]
  suite.out(f"- device: {fp.get('name')} ({dev}, {fp.get('arch')}), compiler {fp.get('compiler')} {fp.get('compiler_version')}")
  if dev == "CUDA": suite.out(f"- driver {d.driver}, NVRTC {d.nvrtc_version}, cuda-bindings {_version('cuda-bindings')}")
  suite.out(f"- tinytune {__version__} at {commit or 'an unknown commit'}, codegen {fp['codegen_version']}; Python {sys.version.split()[0]}, "
            f"numpy {np.__version__}, torch {torch.__version__ if torch else 'absent or without a GPU'}")
  needed = ("ml_dtypes", "sqlalchemy", "alembic", "optuna", "pandas", "rich", "safetensors", "pytest", "hypothesis")
  if missing := [m for m in needed if importlib.util.find_spec(m) is None]:
    suite.out(f"- **missing modules**: {', '.join(missing)} (bench/HOPPER.md says how to bring them as wheels)")
  suite.out(f"- command: `python bench/gpu_suite.py {' '.join(sys.argv[1:])}`; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")


def _version(dist: str) -> str:
  from importlib.metadata import PackageNotFoundError, version
  try: return version(dist)
  except PackageNotFoundError: return "absent"


def tests(suite: Suite, dev: str, junit: pathlib.Path) -> None:
  """The whole test suite with the device as the default (`-n auto` where pytest-xdist is installed), under a time cap."""
  cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
  if importlib.util.find_spec("xdist") is not None: cmd += ["-n", "auto"]
  cmd += suite.args.tests.split() if suite.args.tests else ["tests"]
  cap = max(30.0, min(suite.args.tests_seconds, suite.left() - 240))
  env = {**os.environ, "TINYTUNE_DEVICE": dev, "TINYTUNE_CACHE_DIR": tempfile.mkdtemp(prefix="tt-suite-")}
  suite.out(f"`TINYTUNE_DEVICE={dev} python {' '.join(cmd[1:])}` (at most {cap:.0f} s)\n")
  # at the cap, an interrupt as from ^C: pytest stops, prints its summary and writes the junit file of what ran
  proc, interrupted = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), False
  try: stdout, stderr = proc.communicate(timeout=cap)
  except subprocess.TimeoutExpired:
    interrupted = True
    proc.send_signal(signal.SIGINT)
    try: stdout, stderr = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
      proc.kill()
      stdout, stderr = proc.communicate()
    suite.out(f"(interrupted at {cap:.0f} s)")
  res = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
  lines = res.stdout.strip().splitlines()
  failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
  suite.out("```\n" + "\n".join(failed[:40] + lines[-1:]) + "\n```")
  if res.returncode not in (0, 1, 2): raise RuntimeError(f"pytest exited {res.returncode}: {' / '.join(lines[-3:] or res.stderr.splitlines()[-3:])}")
  if failed: raise RuntimeError(f"{len(failed)} tests failed" + (f", and the rest did not run within {cap:.0f} s" if interrupted else ""))
  if interrupted: raise RuntimeError(f"the tests did not all run within {cap:.0f} s (--tests-seconds)")


def _failed(e: Exception) -> str:
  """A table cell for a row that raised: the exception's type and its first line."""
  return f"failed: `{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}`"


def catalog(suite: Suite, dev: str) -> None:
  """Each workload at its GPU defaults: tinytune's default opts against PyTorch, both by events around the whole program after an
  L2 flush, medians; the output checked against PyTorch's."""
  from tinytune.dtype import dtypes
  from tinytune.kernels import WORKLOADS
  from tinytune.kernels.baselines import tinytune_timing, torch_baseline
  from tinytune.search.evaluate import TimingPolicy
  from tinytune.search.worker import mismatches
  policy = TimingPolicy(min_repeats=3, max_repeats=10 if not suite.args.quick else 3, max_seconds=0.5)
  torch = torch_cuda()
  names = ["elementwise", "softmax", "matmul"] if suite.args.quick else [n for n in WORKLOADS if n != "train_step"]
  suite.out("| workload | params | kernels | tinytune ms | torch ms | torch/tinytune | GB/s | TFLOPS | output | note |")
  suite.out("| --- " * 10 + "|")
  # the sum over axis 0 as well as the catalog's axis 1: a column sum reads across rows, another kernel shape
  runs = [(n, {}) for n in names] + ([] if suite.args.quick else [("reduce", {"axis": 0})])
  for name, extra in runs:
    if suite.left() < 200: suite.out(f"| {name} | skipped: the time left goes to the later sections |"); continue
    w = WORKLOADS[name]
    p = {**w.params({}, gpu=not suite.args.quick), **extra}
    label = " ".join(f"{k}={v}" for k, v in p.items())
    try:
      t = tinytune_timing(w, p, dev, False, policy)
      b = torch_baseline(w, p, dev, policy) if torch is not None and w.torch is not None else None
    except Exception as e:
      suite.out(f"| {name} | {label} | {_failed(e)} |")
      continue
    ok = "-" if b is None or t.output is None or b.output is None else \
      "ok" if t.output.shape == b.output.shape and not mismatches(t.output, b.output, 2e-3).any() else "**differs**"
    s = t.median_s
    suite.out(f"| {name} | {label} | {len(t.kernels)} | {s * 1e3:.3f} | {b.median_s * 1e3 if b else float('nan'):.3f} | "
              f"{b.median_s / s if b else float('nan'):.2f} | {w.nbytes(p, dtypes.float32.itemsize) / s / 1e9:.0f} | "
              f"{w.flops(p) / s / 1e12:.2f} | {ok} | {b.note if b else 'no PyTorch on this device'} |")


def matmul(suite: Suite, dev: str) -> None:
  """matmul n^3 in float32, float16 and bfloat16: the default opts, then after a BEAM search of the given seconds (in one process, the
  search's own evaluator), against torch.matmul; and the search's rate."""
  from tinytune import dtypes
  from tinytune.kernels import get_workload
  from tinytune.kernels.baselines import torch_baseline
  from tinytune.search.evaluate import TimingPolicy
  n = 256 if suite.args.quick else 4096
  w, torch = get_workload("matmul"), torch_cuda()
  suite.out("| dtype | default TFLOPS | searched TFLOPS | torch TFLOPS | torch/searched | search s (asked) | candidates | per s | "
            f"measured per s after {WARM_S:.0f} s | opts |")
  suite.out("| --- " * 10 + "|")
  tf = lambda s: 2 * n ** 3 / s / 1e12  # noqa: E731
  where: list[str] = []  # where each search's seconds went
  for dt in ("float32", "float16", "bfloat16"):
    seconds = max(5.0, min(suite.args.search_seconds, (suite.left() - 40) / 3))
    try:
      s = timed_search(dev, n, dt, "beam", seconds, retime=True)
      where.append(s.where)
      th = torch_baseline(w, {"m": n, "n": n, "k": n}, dev, TimingPolicy(max_repeats=10), dtypes.from_any(dt)).median_s if torch else None
      suite.out(f"| {dt} | {tf(s.default_s):.1f} | {tf(s.searched_s):.1f} | {tf(th) if th else float('nan'):.1f} | "
                f"{th / s.searched_s if th else float('nan'):.2f} | {s.wall:.1f} ({seconds:.0f}) | {s.tried} | {s.tried / s.wall:.1f} | "
                f"{s.rate} | {list(s.result.best)} |")
    except Exception as e:
      suite.out(f"| {dt} | {_failed(e)} |")
  suite.out("\n" + "\n".join(f"- {line}" for line in where))


WARM_S = 10.0  # the search's rate is judged after its first seconds (the worker's start, the first rounds' compiles)


def search_rates(suite: Suite, dev: str, n: int = 1024, seconds: float = 15.0, strategies: tuple[str, ...] = ("beam", "random", "optuna"),
                 dt: str = "float16", jobs: int = 0) -> None:
  """Each strategy's rate on the float16 TC matmul 1024^3 (the issue's `search matmul -p m=1024 ... --dtype float16`): candidates
  measured per second after the first WARM_S, and its wall time against the seconds asked (the budget). bench/search_rate.py prints
  the same table, on a fake GPU (bench/fake_gpu.py) where there is none."""
  suite.out(f"| strategy | search s (asked) | over | candidates | measured per s after {WARM_S:.0f} s |\n| --- | --- | --- | --- | --- |")
  where = []
  for strategy in strategies:
    try:
      s = timed_search(dev, n, dt, strategy, seconds, jobs=jobs)
      suite.out(f"| {strategy} | {s.wall:.1f} ({seconds:.0f}) | {s.wall / seconds - 1:+.0%} | {s.tried} | {s.rate} |")
      where.append(f"{strategy}, {s.where}")
    except Exception as e:
      suite.out(f"| {strategy} | {_failed(e)} |")
  suite.out("\n" + "\n".join(f"- {line}" for line in where))


class TimedSearch(NamedTuple):
  result: Any  # the SearchResult
  wall: float  # seconds from the evaluator's making (the budget's start, as a command's setup counts in its --seconds) to the result
  tried: int  # distinct candidates, invalid ones included
  rate: str  # candidates measured per second after the first WARM_S
  where: str  # search_rate's line
  searched_s: float = math.nan  # the winner's and the default's medians in 5 interleaved rounds, where asked for
  default_s: float = math.nan


def timed_search(dev: str, n: int, dt: str, strategy: str, seconds: float, retime: bool = False, jobs: int = 0) -> TimedSearch:
  """A search of `strategy` for `seconds` of the first kernel of matmul n^3 in dtype `dt` on `dev` (the suite's and
  bench/search_rate.py's), with its rate and where its seconds went."""
  from tinytune import Kernel, Tensor, dtypes
  from tinytune.codegen.heuristic import default_opts
  from tinytune.engine.schedule import create_schedule
  from tinytune.runtime import Device
  from tinytune.search import evaluate
  from tinytune.search.evaluate import Evaluator, Result
  from tinytune.search.strategy import Budget, run_strategy
  a, b = (Tensor.rand(n, n, device=dev).cast(dtypes.from_any(dt)).realize() for _ in range(2))
  kernel = Kernel(create_schedule((a @ b).uop, dev)[0][0].ast, Device[dev].caps)
  finished: list[tuple[float, Result]] = []  # each measured candidate, when its result came
  waited = [0.0]  # seconds the evaluator waited for a candidate to be built, its worker idle meanwhile
  def timed_wait(*args: Any, **kwargs: Any) -> Any:
    st = time.monotonic()
    try: return wait(*args, **kwargs)
    finally: waited[0] += time.monotonic() - st
  budget, cpu, wait = Budget(None, seconds), time.process_time(), evaluate.wait
  evaluate.wait = timed_wait  # type: ignore[assignment]
  try:
    with Evaluator(kernel, dev, jobs=jobs, on_result=lambda r: finished.append((time.monotonic() - budget.started, r))) as ev:
      result = run_strategy(strategy, kernel, ev, budget, default_opts(kernel))
      wall, cpu = time.monotonic() - budget.started, time.process_time() - cpu
      searched_s, default_s = (t.median for t in ev.retime([result.best, result.default], rounds=5)) if retime else (math.nan, math.nan)
      where = search_rate(dt, ev, result.history, finished, wall, cpu, waited[0])
  finally: evaluate.wait = wait
  late = [r for t, r in finished if t > WARM_S]
  rate = f"{len(late) / (wall - WARM_S):.1f}" if wall > WARM_S + 2 else f"- (a search of {seconds:.0f} s)"
  return TimedSearch(result, wall, sum(result.counts().values()), rate, where, searched_s, default_s)


def search_rate(dt: str, ev: Any, history: list, finished: list[tuple[float, Any]], wall: float, cpu: float, waited: float) -> str:
  """Where a search's seconds went: per candidate (medians) its render, compile, verify and run; the worker's busy share, and the
  share of the search it sat idle while the evaluator `waited` for a build, and by the worker's own clock the share of its time it
  waited for a request, and what a request cost besides verifying and timing; the search process's own CPU seconds (`cpu`: its strategy,
  its evaluator's bookkeeping) per candidate; how soon the first result came, and the last; and how many of the candidates measured
  used tensor cores."""
  med = lambda xs: statistics.median(xs) * 1e3 if xs else float("nan")  # noqa: E731
  built = list({r.source_hash: r for r in history if r.status != "invalid" and not r.stored}.values())
  each = {what: med([getattr(r, f"{what}_s") for r in built]) for what in ("render", "compile", "verify", "run")}
  ran = [r for _, r in finished if r.run_s]
  tc = sum(any(o.op.name == "TC" for o in r.opts) for _, r in finished)
  first, last = (finished[0][0], finished[-1][0]) if finished else (float("nan"), float("nan"))
  idle, busy = (sum(x) for x in zip(*ev.worker_s)) if ev.worker_s else (0.0, 0.0)
  overhead = med(ev.overhead_s)
  return (f"{dt}: per candidate (medians) render {each['render']:.0f} ms and compile {each['compile']:.0f} ms in {ev.pool._max_workers} "
          f"{'processes' if ev.dev.compiles_apart else 'threads'} while the worker runs others; run {each['run']:.0f} ms in the worker, of "
          f"it verify {each['verify']:.1f} ms (outputs compared on the {ev.checked_on or '?'}); the worker busy "
          f"{sum(r.run_s for r in ran) / wall:.0%} of the search, idle waiting for a build {waited / wall:.0%}; by its own clock idle "
          f"{idle / max(1e-9, idle + busy):.0%} from its start to its last candidate (a request's reading and load {overhead:.1f} ms); "
          f"the search's own process "
          f"{cpu / max(1, len(finished)) * 1e3:.0f} ms of CPU a candidate; its first result at {first:.1f} s, its last at {last:.1f} s "
          f"(then the finalists' re-time); {ev.evaluated} measured ({tc} with TC), {len(history)} tried with the invalid")


def _with_arg(op: str, arg: int) -> Callable[[Any, list], list]:
  """The default's opts with `op`'s arg set to `arg`."""
  return lambda kernel, opts: [type(o)(o.op, o.axis, arg) if o.op.name == op else o for o in opts]


def _without(op: str) -> Callable[[Any, list], list]:
  """The default's opts without `op`."""
  return lambda kernel, opts: [o for o in opts if o.op.name != op]


def _wmma(kernel: Any, opts: list) -> list:
  """The wmma API's fragments loaded from global memory, 64x64 a warp, 2x2 warps (the TC default before mma.sync's pipeline)."""
  from tinytune.codegen.opts import Opt, OptOps
  tc = kernel.copy().apply_opts([Opt(OptOps.TC, 0, 0)]).tc
  return [Opt(OptOps.TC, 0, 0), Opt(OptOps.UPCAST, tc.row, 4), Opt(OptOps.UPCAST, tc.col, 4), Opt(OptOps.LOCAL, tc.row, 2),
          Opt(OptOps.LOCAL, tc.col, 2), Opt(OptOps.UNROLL, 0, 2)]


def _wgmma(rows: int, cols: int, stages: int = 1) -> Callable[[Any, list], list]:
  """TC's arg 2 (wgmma, sm_90a) in place of the default: one warpgroup a workgroup, its tile 64 `rows` x 16 `cols` (UPCASTs: each K
  step one m64n(16 cols)k16 per 64 rows), K tiles of 64 in shared memory (in `stages` cp.async stages where over 1: PIPELINE); the
  default where that is not valid (another GPU)."""
  def wgmma(kernel: Any, opts: list) -> list:
    from tinytune.codegen.opts import KernelOptError, Opt, OptOps
    try:
      tc = kernel.copy().apply_opts([Opt(OptOps.TC, 0, 2)]).tc  # the matmul's dims of A's rows and B's columns (after a split of K)
      ret = [Opt(OptOps.TC, 0, 2), Opt(OptOps.UPCAST, tc.col, cols), *([Opt(OptOps.UPCAST, tc.row, rows)] if rows > 1 else []),
             *([Opt(OptOps.PIPELINE, 0, stages)] if stages > 1 else [])]
      kernel.copy().apply_opts(ret)
    except KernelOptError: return opts
    return ret
  return wgmma


def _tc_tile(warps: tuple[int, int], stages: int, ktile: int = 2) -> Callable[[Any, list], list]:
  """The default's mma.sync (64x64 a warp) with warps[0] x warps[1] warps along A's rows and B's columns (LOCAL), K tiles of 16 `ktile`
  (STAGE) in `stages` cp.async stages (PIPELINE), past 48 KB in dynamic shared memory; the default where that is not valid."""
  def tile(kernel: Any, opts: list) -> list:
    from tinytune.codegen.opts import KernelOptError, Opt, OptOps
    try:
      tc = kernel.copy().apply_opts([Opt(OptOps.TC, 0, 1)]).tc
      ret = [Opt(OptOps.TC, 0, 1), Opt(OptOps.UPCAST, tc.row, 4), Opt(OptOps.UPCAST, tc.col, 4), Opt(OptOps.LOCAL, tc.row, warps[0]),
             Opt(OptOps.LOCAL, tc.col, warps[1]), Opt(OptOps.STAGE, 0, ktile), Opt(OptOps.PIPELINE, 0, stages)]
      kernel.copy().apply_opts(ret)
    except KernelOptError: return opts
    return ret
  return tile


def _raster(band: int) -> Callable[[Any, list], list]:
  """The default's opts with its workgroups in bands of `band` along the first global axis (RASTER), where that is valid."""
  def raster(kernel: Any, opts: list) -> list:
    from tinytune.codegen.opts import KernelOptError, Opt, OptOps
    try: kernel.copy().apply_opts([*opts, Opt(OptOps.RASTER, kernel.global_order[0], band)])
    except KernelOptError: return opts
    return [*opts, Opt(OptOps.RASTER, kernel.global_order[0], band)]
  return raster


def _reserve(kernel: Any, opts: list) -> list:
  """The plan the heuristics hold in reserve beside an unmeasured default's (heuristic.alternative_opts), else the default's."""
  from tinytune.codegen.heuristic import alternative_opts
  return next(iter(alternative_opts(kernel)), opts)


# matmul's alternatives to the default, each timed against it (H200 figures: bench/results/nvidia-h200-*)
# (dtype, label, the opts from the kernel and the default's)
VARIANTS: list[tuple[str, str, Callable[[Any, list], list]]] = [
  ("float16", "the wmma API from global memory (the default before mma.sync's pipeline: 106 TFLOPS against 326 on an H200)", _wmma),
  ("bfloat16", "the wmma API from global memory (the default before mma.sync's pipeline)", _wmma),
  ("float16", "the default's pipeline in 3 cp.async stages (PIPELINE 3: 53248 bytes of shared memory, dynamic)", _with_arg("PIPELINE", 3)),
  ("float16", "the default's pipeline in 4 cp.async stages (PIPELINE 4: 69632 bytes)", _with_arg("PIPELINE", 4)),
  ("bfloat16", "the default's pipeline in 3 cp.async stages (PIPELINE 3)", _with_arg("PIPELINE", 3)),
  ("float16", "the default's 128x128 tiles with K tiles of 64 (STAGE 4) in 3 cp.async stages (102400 bytes)", _tc_tile((2, 2), 3, 4)),
  ("float16", "256x128 workgroup tiles, 4x2 warps of 64x64 (8 warps), in 3 cp.async stages (81920 bytes)", _tc_tile((4, 2), 3)),
  ("float16", "128x256 workgroup tiles, 2x4 warps of 64x64 (8 warps), in 3 cp.async stages (81920 bytes)", _tc_tile((2, 4), 3)),
  ("float16", "128x256 workgroup tiles, 2x4 warps of 64x64, in 4 cp.async stages (106496 bytes)", _tc_tile((2, 4), 4)),
  ("float16", "TC as sm_90a's wgmma (TC 2): a warpgroup's 128x64 tile (m64n64k16 x 2), K tiles of 64 in shared memory", _wgmma(2, 4)),
  ("float16", "TC as sm_90a's wgmma (TC 2): a warpgroup's 64x128 tile (m64n128k16), K tiles of 64 in shared memory", _wgmma(1, 8)),
  ("bfloat16", "TC as sm_90a's wgmma (TC 2): a warpgroup's 64x128 tile (m64n128k16), K tiles of 64 in shared memory (40.9 TFLOPS at 16:08, "
   "its conversions branching per element)", _wgmma(1, 8)),
  ("float16", "wgmma's 64x128 tile in 3 cp.async stages (PIPELINE 3: 77824 bytes; A by 16-byte cp.async, B by elements)", _wgmma(1, 8, 3)),
  ("bfloat16", "wgmma's 64x128 tile in 3 cp.async stages (PIPELINE 3)", _wgmma(1, 8, 3)),
  ("float16", "wgmma's 64x128 tile in 4 cp.async stages (PIPELINE 4: 102400 bytes)", _wgmma(1, 8, 4)),
  ("float16", "wgmma's 128x128 tile (m64n128k16 x 2) in 3 cp.async stages (PIPELINE 3: 102400 bytes)", _wgmma(2, 8, 3)),
  ("float32", "the shared tile's copies as plain loads, no cp.async (the default before PIPELINE 2: 42.2 TFLOPS against 46.1)", _without("PIPELINE")),
  ("float16", "TC's workgroups in bands of 16 (RASTER 0 16)", _raster(16))]


# workloads whose schedule a variant changes (split-K, SPLITK=0 in place of the planner's choice), each timed against the default
# schedule: (workload, its params over the GPU sizes, label, the Context of the variant, the Context of both: attention's P.V is a
# kernel of its own only as the graph, FLASH=0)
SCHEDULE_VARIANTS: list[tuple[str, dict[str, int], str, dict[str, int], dict[str, int]]] = [
  ("bmm", {}, "split-K in 2 shares (512 workgroups unsplit: not split by default since 16:08)", {"SPLITK": 2}, {}),
  ("linear", {"m": 16, "k": 8192, "n": 4096}, "no split-K (16 shares by default)", {"SPLITK": 0}, {}),
  ("linear", {"m": 16, "k": 8192, "n": 4096}, "split-K in 4 shares", {"SPLITK": 4}, {}),
  ("matmul", {"m": 256, "n": 256, "k": 65536}, "no split-K (16 shares by default)", {"SPLITK": 0}, {}),
  ("conv2d", {}, "Winograd's F(4, 3) (WINO=2; the CPU's default, not the GPU's): 6 kernels, 36 GEMMs 6272x64 by 64x64", {"WINO": 2}, {})]


def _conv_tile(positions: int, channels: int) -> Callable[[Any, list], list]:
  """The convolution's default (heuristic.gpu_conv) with each thread's `positions` (its UPCAST along the lane dim) by `channels`
  (its UPCAST along the output channels) in place of the default's."""
  def tile(kernel: Any, opts: list) -> list:
    lane = kernel.n_global - 1
    return [type(o)(o.op, o.axis, positions if o.axis == lane else channels) if o.op.name == "UPCAST" else o for o in opts]
  return tile


# a kernel of a workload at its GPU sizes (the last with a reduce: conv2d's sum, Winograd's GEMM, attention's P.V) against its default
# opts: (workload, the Context of its schedule, label, the opts from the kernel and the default's). conv2d's direct sum: a thread's 4
# positions x 8 channels issue 0.375 loads (L1) per FMA, 8 x 8 0.25; Winograd's GEMM and attention's P.V (64 columns) from memory read
# their rows at 0.12 of each sector: 982 and 2701 MB of L1 sectors, 166 and 426 from the 128x64 shared tile (bench/gpu_launch_report.py)
KERNEL_VARIANTS: list[tuple[str, dict[str, int], str, Callable[[Any, list], list]]] = [
  ("conv2d", {}, "8 positions x 8 output channels a thread (the default 4 x 8): 0.25 loads per FMA, not 0.375; 1664 workgroups", _conv_tile(8, 8)),
  ("conv2d", {}, "4 positions x 16 output channels a thread: 0.31 loads per FMA", _conv_tile(4, 16)),
  ("conv2d", {}, "2 positions x 8 output channels a thread: twice the threads, 0.625 loads per FMA", _conv_tile(2, 8)),
  ("conv2d", {"WINO": 2}, "Winograd's GEMM 6272x64 by 64x64 (x36) as the register tile from memory (the default before the 128x64 shared tile)",
   _reserve),
  ("attention", {"FLASH": 0}, "P.V as the register tile from memory (the default before the 128x64 shared tile)", _reserve)]


def _timed_variant(suite: Suite, dev: str, kernel: Any, head: str, label: str, change: Callable[[Any, list], list], flops: float) -> None:
  """One row: the kernel's default opts and `change`'s, each verified against the unoptimized kernel by the search's evaluator,
  then re-timed interleaved (5 rounds), as TFLOPS of `flops`."""
  from tinytune.codegen.heuristic import default_opts
  from tinytune.search.evaluate import Evaluator
  base = default_opts(kernel)
  if (opts := change(kernel, base)) == base: suite.out(f"| {head} | {label} | the same as the default here ({base}) |"); return
  with Evaluator(kernel, dev) as ev:
    res = ev.evaluate([base, opts])
    if any(r.status != "ok" for r in res):
      suite.out(f"| {head} | {label} | {opts} | {' / '.join(f'{r.status} {r.error[:120]}' for r in res)} |")
      return
    t_base, t_var = (t.median for t in ev.retime([base, opts], rounds=5))
  suite.out(f"| {head} | {label} | {opts} | yes | {flops / t_var / 1e12:.1f} | {flops / t_base / 1e12:.1f} | {t_base / t_var:.2f} |")


def variants(suite: Suite, dev: str) -> None:
  """matmul n^3 (VARIANTS), then a kernel of other workloads (KERNEL_VARIANTS): the default opts beside the alternatives, each verified
  against the unoptimized kernel by the search's evaluator, then re-timed interleaved with the default (5 rounds)."""
  from tinytune import Kernel, Tensor, dtypes
  from tinytune.engine.schedule import create_schedule
  from tinytune.helpers import Context
  from tinytune.kernels import WORKLOADS
  from tinytune.kernels.workload import schedule
  from tinytune.runtime import Device
  n = 256 if suite.args.quick else 4096
  suite.out("| dtype | variant | opts | verified | TFLOPS | default TFLOPS | variant / default speed |")
  suite.out("| --- " * 7 + "|")
  for dt, label, change in VARIANTS:
    if suite.left() < 60: suite.out(f"| {dt} | {label} | skipped: no time left |"); continue
    try:
      dtype = dtypes.from_any(dt)
      a, b = (Tensor.rand(n, n, device=dev).cast(dtype).realize() for _ in range(2))
      _timed_variant(suite, dev, Kernel(create_schedule((a @ b).uop, dev)[0][0].ast, Device[dev].caps), dt, label, change, 2 * n ** 3)
    except Exception as e:
      suite.out(f"| {dt} | {label} | {_failed(e)} |")
  for name, context, label, change in KERNEL_VARIANTS:
    w = WORKLOADS[name]
    p = w.params({}, gpu=not suite.args.quick)
    head = f"float32 {name} {' '.join(f'{k}={v}' for k, v in {**p, **context}.items())}"
    if suite.left() < 60: suite.out(f"| {head} | {label} | skipped: no time left |"); continue
    try:
      ins = [Tensor.rand(*shape, device=dev).realize() for shape in w.inputs(p)]
      with Context(**context): items = schedule(w.build(p, *ins), dev)[0]
      kernel = [k for k in (Kernel(it.ast, Device[dev].caps) for it in items) if k.reduceop is not None][-1]
      _timed_variant(suite, dev, kernel, f"{head}: {kernel.name}", label, change, kernel.flops)
    except Exception as e:
      suite.out(f"| {head} | {label} | {_failed(e)} |")


def schedule_variants(suite: Suite, dev: str) -> None:
  """Workloads whose schedule a variant changes (SCHEDULE_VARIANTS): the default's kernels and the variant's, each timed as the
  catalog times them (events around the whole program after an L2 flush, medians), the variant's output checked against the default's."""
  from tinytune.helpers import Context
  from tinytune.kernels import WORKLOADS
  from tinytune.kernels.baselines import tinytune_timing
  from tinytune.search.evaluate import TimingPolicy
  from tinytune.search.worker import mismatches
  policy = TimingPolicy(min_repeats=3, max_repeats=10 if not suite.args.quick else 3, max_seconds=0.5)
  suite.out("| workload | params | variant | kernels | default kernels | ms | default ms | variant / default speed | output |")
  suite.out("| --- " * 9 + "|")
  for name, extra, label, context, both in SCHEDULE_VARIANTS:
    if suite.left() < 60: suite.out(f"| {name} | skipped: no time left |"); continue
    w = WORKLOADS[name]
    p = {**w.params({}, gpu=not suite.args.quick), **({} if suite.args.quick else extra)}
    try:
      with Context(**both): base = tinytune_timing(w, p, dev, False, policy)
      with Context(**both, **context): var = tinytune_timing(w, p, dev, False, policy)
      ok = "-" if base.output is None or var.output is None else "ok" if not mismatches(var.output, base.output, 2e-3).any() else "**differs**"
      suite.out(f"| {name} | {' '.join(f'{k}={v}' for k, v in p.items())} | {label} | {len(var.kernels)} | {len(base.kernels)} | "
                f"{var.median_s * 1e3:.3f} | {base.median_s * 1e3:.3f} | {base.median_s / var.median_s:.2f} | {ok} |")
    except Exception as e:
      suite.out(f"| {name} | {label} | {_failed(e)} |")


# attention at its GPU sizes in one kernel (FLASH=2: online softmax, no scores in memory) against the graph's kernels (FLASH=0):
# (dtype, causal). Which devices take one kernel by default: tensor/functional.py FLASH_DEVICES.
ATTENTION_VARIANTS = [("float32", 0), ("float32", 1), ("float16", 0), ("float16", 1)]


def attention_variants(suite: Suite, dev: str) -> None:
  """Attention in one kernel against the graph's kernels, both with default opts (the one kernel's: attention in tiles on a GPU,
  codegen/heuristic.attention_opts), each checked against PyTorch's SDPA; timed alternately (3 rounds each), medians."""
  from tinytune import Context
  from tinytune.kernels import get_workload
  from tinytune.kernels.baselines import tinytune_timing, torch_baseline
  from tinytune.search.evaluate import TimingPolicy
  from tinytune.search.worker import mismatches
  policy, w = TimingPolicy(min_repeats=3, max_repeats=10, max_seconds=0.5), get_workload("attention")
  suite.out("| dtype | params | one kernel ms (kernels) | graph ms (kernels) | SDPA ms | graph / one kernel | SDPA / one kernel | output | "
            "one kernel's opts |")
  suite.out("| --- " * 9 + "|")
  for dt, causal in ATTENTION_VARIANTS:
    if suite.left() < 60: suite.out(f"| {dt} | causal={causal} | skipped: no time left |"); continue
    p = {**w.params({}, gpu=not suite.args.quick), "causal": causal}
    label = " ".join(f"{k}={v}" for k, v in p.items())
    try:
      dtype, times = w.dtype(dt), {0: list[float](), 2: list[float]()}
      kernels, outs, opts = {}, {}, []
      for _ in range(3):
        for flash in (2, 0):
          with Context(FLASH=flash): t = tinytune_timing(w, p, dev, False, policy, dtype=dtype)
          times[flash].append(t.median_s)
          kernels[flash], outs[flash] = len(t.kernels), t.output
          if flash == 2: opts = [k.get("opts") for k in t.kernels]
      b = torch_baseline(w, p, dev, policy, dtype) if torch_cuda() is not None else None
      one, graph = statistics.median(times[2]), statistics.median(times[0])
      ok = "-" if b is None or b.output is None or outs[2] is None else "ok" if not mismatches(outs[2], b.output, 2e-2).any() else "**differs**"
      sdpa = b.median_s if b else float("nan")
      suite.out(f"| {dt} | {label} | {one * 1e3:.3f} ({kernels[2]}) | {graph * 1e3:.3f} ({kernels[0]}) | {sdpa * 1e3:.3f} | {graph / one:.2f} | "
                f"{sdpa / one:.2f} | {ok} | {' '.join(f'{o[0]}{o[1]},{o[2]}' for k in opts for o in k or [])} |")
    except Exception as e:
      suite.out(f"| {dt} | {label} | {_failed(e)} |")
  tc_attention(suite, dev)


# TC on attention (lower.flash.flash_attention_tc: a warp's 16 rows by mma.sync, P in registers as P V's A) against attention in tiles, the
# default (scalar FMAs: float16 0.581 ms at 4x16x1024x64 on the H200, SDPA 0.046): (dtype, causal), 4 warps a workgroup
TC_ATTENTION = [("float16", 0), ("float16", 1), ("bfloat16", 0)]


def tc_attention(suite: Suite, dev: str) -> None:
  """TC on attention (TC 1, the rows' LOCAL 4: 64 rows a workgroup, tiles of 64 keys) beside the one kernel's default opts, each verified
  against the unoptimized kernel by the search's evaluator, then re-timed interleaved (5 rounds), as TFLOPS of the kernel's FLOPs."""
  from tinytune import Kernel, Opt, OptOps, Tensor, dtypes
  from tinytune.helpers import Context
  from tinytune.kernels import get_workload
  from tinytune.kernels.workload import schedule
  from tinytune.runtime import Device
  from tinytune.uop import Ops
  w = get_workload("attention")
  suite.out("")
  suite.out("| workload | variant | opts | verified | TFLOPS | default TFLOPS | variant / default speed |")
  suite.out("| --- " * 7 + "|")
  for dt, causal in TC_ATTENTION:
    p = {**w.params({}, gpu=not suite.args.quick), "causal": causal}
    head = f"{dt} attention {' '.join(f'{k}={v}' for k, v in p.items())}"
    if suite.left() < 60: suite.out(f"| {head} | TC | skipped: no time left |"); continue
    try:
      ins = [Tensor.rand(*shape, device=dev).cast(dtypes.from_any(dt)).realize() for shape in w.inputs(p)]
      with Context(FLASH=2): items = schedule(w.build(p, *ins), dev)[0]
      kernel = next(k for k in (Kernel(it.ast, Device[dev].caps) for it in items) if k.attention is not None and k.ast.op is Ops.ATTENTION)
      _timed_variant(suite, dev, kernel, head, "TC 1 (mma.sync), 4 warps of 16 rows, tiles of 64 keys",
                     lambda k, opts: [Opt(OptOps.TC, 0, 1), Opt(OptOps.LOCAL, k.n_global - 1, 4)], kernel.flops)
    except Exception as e:
      suite.out(f"| {head} | TC | {_failed(e)} |")


def _per_step(step: Callable[[], object], sync: Callable[[], object], steps: int, rounds: int = 5) -> tuple[float, float]:
  """(median seconds per step over rounds of `steps` steps, each round ended by a synchronize; median seconds per step of the host's
  issuing them, the synchronize left out): where the two agree, the host is the bottleneck, and where the first is larger, the GPU."""
  for _ in range(3): step()
  sync()
  times, issue = [], []
  for _ in range(rounds):
    st = time.perf_counter()
    for _ in range(steps): step()
    issue.append((time.perf_counter() - st) / steps)
    sync()
    times.append((time.perf_counter() - st) / steps)
  return statistics.median(times), statistics.median(issue)


# the MLP forward's first matmul (128x128 outputs over K=784) in the default plan's 2 shares ran 71.6 us of its 80 on an H200: too
# few workgroups (8) for the GPU, each thread's 392-long loop bound by memory latency. The default now computes one output a thread
# (gpu_register_tile's smaller tiles: 64 workgroups in 2 shares, unmeasured); more shares, each a workgroup's: timed beside it here.
MLP_SPLITS = (4, 16)


# the one-kernel step in a process of its own: the suite's own process has run the catalog before (its garbage, its loaded modules and
# torch's), which the H200's runs of 2026-11-27 suggest cost the step 56 us there against 40 in a fresh process
FRESH_STEP = """
import sys, time, statistics, numpy as np
from tinytune import Tensor
from tinytune.runtime import Device
dev = sys.argv[1]
state = {"t": Tensor(np.zeros(4096, np.float32), device=dev).realize()}
def step(): state["t"] = (state["t"] * 0.999 + 0.001).realize()
for _ in range(3): step()
times = []
for _ in range(5):
  Device[dev].synchronize(); st = time.perf_counter()
  for _ in range(200): step()
  Device[dev].synchronize(); times.append((time.perf_counter() - st) / 200)
print(statistics.median(times))
"""


def _fresh_step_s(dev: str) -> float:
  """The one-kernel step's seconds (as _per_step's first figure) in a new process, or nan where it failed."""
  try:
    proc = subprocess.run([sys.executable, "-c", FRESH_STEP, dev], capture_output=True, text=True, timeout=120)
    return float(proc.stdout.split()[-1]) if proc.returncode == 0 and proc.stdout.split() else float("nan")
  except (subprocess.TimeoutExpired, ValueError): return float("nan")


def overhead(suite: Suite, dev: str, steps: int = 200) -> None:
  """A one-kernel Tensor step, `t = (t * 0.999 + 0.001).realize()` on 4096 floats, against torch eager's `t * 0.999 + 0.001`; and a
  TinyJit forward of an MLP 784-128-10 (batch 128, input passed in), against torch eager's, with the forward's device time per replay
  (events around steps / 2 replays back to back) and the same forward split along K in more shares (SPLITK=N)."""
  from tinytune import Context, Tensor, TinyJit
  from tinytune.runtime import Device
  torch = torch_cuda()
  sync = Device[dev].synchronize
  gc.collect()  # the garbage of the sections before: a full collection still due would land in some rounds of one side alone
  state = {"t": Tensor(np.zeros(4096, np.float32), device=dev).realize()}
  def tt_step() -> None: state["t"] = (state["t"] * 0.999 + 0.001).realize()
  tt = _per_step(tt_step, sync, steps)
  gc.disable()  # the suite's process (after the catalog: its heap, torch's) took 56 us a step on the H200 where a fresh one took 40
  try: tt_nogc = _per_step(tt_step, sync, steps)
  finally: gc.enable()
  heap = len(gc.get_objects())
  rng = np.random.default_rng(0)
  w1, w2 = (Tensor(rng.standard_normal(s, dtype=np.float32) * 0.05, device=dev).realize() for s in ((784, 128), (128, 10)))
  x = Tensor(rng.standard_normal((128, 784), dtype=np.float32), device=dev).realize()
  def jitted(splitk: int | None) -> tuple[tuple[float, float], float, str, np.ndarray]:
    """(per step, issue), device seconds per replay, how it replays (kernels), its output."""
    with Context(**({} if splitk is None else {"SPLITK": splitk})):  # the capture (the second call) schedules under it
      forward = TinyJit(lambda x: ((x @ w1).relu() @ w2).realize())
      timed = _per_step(lambda: forward(x), sync, steps)
    batch = forward.captured.batch if forward.captured else None
    how = "one graph launch" if getattr(batch, "graph", False) else "one native call" if batch is not None else "kernel by kernel"
    kernels = len(forward.captured.steps) if forward.captured else 0
    device = Device[dev].timed(lambda: [forward(x) for _ in range(steps // 2)]) / (steps // 2)
    return timed, device, f"{how}, {kernels} kernels", forward(x).numpy()
  fw, fw_device, how, want = jitted(None)
  pt = pf = (float("nan"), float("nan"))
  if torch is not None:
    gc.collect()
    tstate = {"t": torch.zeros(4096, device="cuda")}
    def pt_step() -> None: tstate["t"] = tstate["t"] * 0.999 + 0.001
    pt = _per_step(pt_step, torch.cuda.synchronize, steps)
    tw1, tw2, tx = (torch.from_numpy(v.numpy()).cuda() for v in (w1, w2, x))
    with torch.inference_mode(): pf = _per_step(lambda: (tx @ tw1).relu() @ tw2, torch.cuda.synchronize, steps)
  suite.out("| step | tinytune µs | tinytune's host, issuing µs | device µs per replay | torch eager µs | torch's host, issuing µs | "
            "tinytune / torch |\n| --- | --- | --- | --- | --- | --- | --- |")
  suite.out(f"| one-kernel step, 4096 floats | {tt[0] * 1e6:.1f} | {tt[1] * 1e6:.1f} | - | {pt[0] * 1e6:.1f} | {pt[1] * 1e6:.1f} | "
            f"{tt[0] / pt[0]:.2f} |")
  suite.out(f"| the same step in a fresh process | {_fresh_step_s(dev) * 1e6:.1f} | - | - | {pt[0] * 1e6:.1f} | {pt[1] * 1e6:.1f} | - |")
  suite.out(f"| the same step, garbage collection off ({heap} objects in this process) | {tt_nogc[0] * 1e6:.1f} | {tt_nogc[1] * 1e6:.1f} | - | "
            f"{pt[0] * 1e6:.1f} | {pt[1] * 1e6:.1f} | {tt_nogc[0] / pt[0]:.2f} |")
  suite.out(f"| MLP 784-128-10 forward, TinyJit ({how}) | {fw[0] * 1e6:.1f} | {fw[1] * 1e6:.1f} | {fw_device * 1e6:.1f} | "
            f"{pf[0] * 1e6:.1f} | {pf[1] * 1e6:.1f} | {fw[0] / pf[0]:.2f} |")
  for n in MLP_SPLITS:
    try:
      timed, device, how, got = jitted(n)
      ok = "" if np.allclose(got, want, rtol=1e-4, atol=1e-5) else " **differs from the default**"
      suite.out(f"| the same, SPLITK={n} ({how}){ok} | {timed[0] * 1e6:.1f} | {timed[1] * 1e6:.1f} | {device * 1e6:.1f} | "
                f"{pf[0] * 1e6:.1f} | {pf[1] * 1e6:.1f} | {timed[0] / pf[0]:.2f} |")
    except Exception as e:
      suite.out(f"| the same, SPLITK={n} | {_failed(e)} |")
  suite.out("\n(issuing: the host's time for the steps alone, the synchronize after them left out; where it is near the step's time the "
            "host is the bottleneck, where it is far below, the GPU)")


def gather_checks(suite: Suite, dev: str) -> None:
  """A[idx] of 10^6 int32 indices into 10^6, the index in memory and computed (idx * 1), with the bounds check fused into the gather
  (tinytune.tensor.checks.checked: each realize then waits to read its flag) and without, in alternating rounds."""
  from tinytune import Tensor
  from tinytune.engine import schedule
  from tinytune.runtime import Device
  from tinytune.tensor import indexing
  n = 10**4 if suite.args.quick else 10**6
  A = Tensor.arange(n, device=dev).contiguous().realize()
  idx = Tensor(np.random.default_rng(0).integers(0, n, n).astype(np.int32), device=dev).realize()
  def step(index: Callable[[], Tensor]) -> Callable[[], None]:
    def run() -> None:
      schedule.forget_realized()  # unchecked, the same graph again would be found realized
      A[index()].realize()
    return run
  work = {"A[idx]": step(lambda: idx), "A[idx * 1]": step(lambda: idx * 1)}
  real, times = indexing.checked, dict[tuple[str, bool], list[float]]()
  try:
    for r in range(4):
      for on in ((True, False) if r % 2 == 0 else (False, True)):
        indexing.checked = real if on else (lambda values, lo, hi, error: values)
        for name, run in work.items(): times.setdefault((name, on), []).append(_per_step(run, Device[dev].synchronize, 20, rounds=3)[0])
  finally: indexing.checked = real
  suite.out(f"| gather of {n} | checked µs | unchecked µs | checked / unchecked |\n| --- | --- | --- | --- |")
  for name in work:
    yes, no = statistics.median(times[(name, True)]), statistics.median(times[(name, False)])
    suite.out(f"| {name} | {yes * 1e6:.1f} | {no * 1e6:.1f} | {yes / no:.2f} |")


def training(suite: Suite, dev: str) -> None:
  """The MLP 784-128-10 Adam step, batch 128, under TinyJit (the batch sampled on the host and passed in) against torch eager."""
  from tinytune import Tensor, TinyJit
  from tinytune.nn import optim
  from tinytune.runtime import Device
  torch = torch_cuda()
  rng = np.random.default_rng(0)
  X, Y = rng.standard_normal((8192, 784), dtype=np.float32), rng.integers(0, 10, 8192).astype(np.int32)
  w1, w2 = (rng.uniform(-1, 1, (784, 128)) / 28).astype(np.float32), (rng.uniform(-1, 1, (128, 10)) / 11).astype(np.float32)
  b1, b2 = np.zeros(128, np.float32), np.zeros(10, np.float32)
  params = [Tensor(p, device=dev, requires_grad=True) for p in (w1, b1, w2, b2)]
  opt, classes = optim.Adam(params, lr=1e-3), Tensor.arange(10, device=dev)

  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    logits = (x @ params[0] + params[1]).relu() @ params[2] + params[3]
    loss = -(logits.log_softmax(-1) * (y.unsqueeze(-1) == classes).cast(logits.dtype)).sum(-1).mean()
    loss.backward()
    return loss.realize(*opt.schedule_step())
  def tt() -> object:
    idx = rng.integers(0, len(X), 128)
    return step(Tensor(X[idx], device=dev), Tensor(Y[idx], device=dev))
  first = float(tt().item())
  t = _per_step(tt, Device[dev].synchronize, 50)[0]
  last = float(tt().item())
  pt = float("nan")
  if torch is not None:
    tp = [torch.tensor(p, device="cuda", requires_grad=True) for p in (w1, b1, w2, b2)]
    topt, TX, TY = torch.optim.Adam(tp, lr=1e-3), torch.from_numpy(X).cuda(), torch.from_numpy(Y.astype(np.int64)).cuda()
    def pt_step() -> object:
      idx = torch.randint(0, len(TX), (128,), device="cuda")
      topt.zero_grad()
      loss = torch.nn.functional.cross_entropy((TX[idx] @ tp[0] + tp[1]).relu() @ tp[2] + tp[3], TY[idx])
      loss.backward()
      topt.step()
      return loss
    pt = _per_step(pt_step, torch.cuda.synchronize, 50)[0]
  suite.out(f"tinytune + TinyJit {t * 1e3:.3f} ms/step, torch eager {pt * 1e3:.3f} ms/step: tinytune {pt / t:.2f}x torch's speed; "
            f"loss {first:.3f} -> {last:.3f} over {3 + 5 * 50 + 2} steps")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--device", default="CUDA", help="the device checked (default CUDA)")
  ap.add_argument("--quick", action="store_true", help="small sizes and a few tests: proves the script on any machine in a few minutes")
  ap.add_argument("--search-seconds", type=float, default=None, help="seconds of each matmul search (default 60; --quick 5)")
  ap.add_argument("--tests", default=None, help="pytest arguments instead of the whole suite (default: tests; --quick: the TinyJit tests)")
  ap.add_argument("--tests-seconds", type=float, default=200, help="most seconds the tests may take (default 200)")
  ap.add_argument("--budget", type=float, default=470, help="seconds for the whole run; sections shrink to what is left (default 470)")
  ap.add_argument("--skip", default="", help="comma-separated sections to skip: tests, catalog, matmul, overhead, training, gather, variants, "
                  "schedules, attention, rates")
  ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder of the results files (default bench/results)")
  args = ap.parse_args()
  if args.search_seconds is None: args.search_seconds = 5.0 if args.quick else 60.0
  if args.quick and args.tests is None: args.tests = "tests/test_engine.py -k tinyjit"
  sys.path.insert(0, str(ROOT))  # tinytune from this checkout, here and in the processes it starts (tests, search workers)
  os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
  from tinytune.runtime import Device, device_status
  dev = Device.canonicalize(args.device)
  if why := device_status(dev): raise SystemExit(f"gpu_suite.py: error: {why}")
  Device.DEFAULT = dev
  suite = Suite(args)
  name = Device[dev].fingerprint().get("name", dev)
  stem = f"{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}-{datetime.date.today():%Y-%m-%d}" + ("-quick" if args.quick else "")
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  suite.out(f"# tinytune on {name}: `bench/gpu_suite.py`{' --quick' if args.quick else ''}\n")
  suite.section("Versions", lambda: versions(suite, dev))
  skip = set(args.skip.split(","))
  sections: list[tuple[str, str, Callable[[], None]]] = [
    ("tests", f"Tests with TINYTUNE_DEVICE={dev}", lambda: tests(suite, dev, out / f"{stem}-tests.junit.xml")),
    ("catalog", "The catalog at GPU sizes against PyTorch (default opts)", lambda: catalog(suite, dev)),
    ("overhead", "Launch overhead", lambda: overhead(suite, dev)),
    ("training", "MLP training step under TinyJit", lambda: training(suite, dev)),
    ("gather", "Index bounds checks fused into the gather, against none", lambda: gather_checks(suite, dev)),
    ("variants", "matmul, conv2d and attention's P.V: alternatives to the default opts, timed against them", lambda: variants(suite, dev)),
    ("schedules", "Schedules other than the default (split-K, Winograd), timed against it", lambda: schedule_variants(suite, dev)),
    ("attention", "attention in one kernel (FLASH=2) against the graph's kernels (FLASH=0)", lambda: attention_variants(suite, dev)),
    ("rates", "Search rates: float16 matmul 1024^3, per strategy", lambda: search_rates(suite, dev, *((256, 5.0) if args.quick else ()))),
    ("matmul", "matmul: default opts, searched, and the search's rate", lambda: matmul(suite, dev))]
  for key, title, fn in sections:
    if key not in skip: suite.section(title, fn)
  suite.out(f"\ntotal {time.monotonic() - suite.started:.0f} s")
  (out / f"{stem}.md").write_text("\n".join(suite.lines) + "\n")
  suite.junit(out / f"{stem}.junit.xml")
  print(f"gpu_suite.py: wrote {out / stem}.md and {stem}.junit.xml", file=sys.stderr)


if __name__ == "__main__":
  main()
