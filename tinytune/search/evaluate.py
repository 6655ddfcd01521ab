"""Candidate evaluation: compile in parallel, drop duplicates by source, verify against the kernel's plain sums, time.

Candidates run in a worker process that holds the buffers, so a candidate that crashes or hangs costs that worker
(recorded as `crashed` or `timeout`) and the search goes on with a fresh one."""
from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable, NamedTuple, Sequence

from tinytune.codegen.heuristic import default_opts
from tinytune.codegen.kernel import Kernel, KernelOptError
from tinytune.codegen.opts import Opt, OptOps, opts_to_json
from tinytune.helpers import check_stop
from tinytune.runtime import Device

STATUSES = ("ok", "wrong", "crashed", "timeout", "compile_error", "invalid")


@dataclass(frozen=True)
class Result:
  opts: tuple[Opt, ...]
  status: str
  min_s: float = math.inf
  median_s: float = math.inf
  spread: float = 0.0  # (median - min) / median of the timed repeats
  compile_s: float = 0.0
  source_hash: str = ""
  error: str = ""
  stored: bool = False  # read back from the results database, not measured now
  objective: str = "median"  # which of its timings ranks it: "median" or "min" (see OBJECTIVES)

  @property
  def time(self) -> float: return (self.min_s if self.objective == "min" else self.median_s) if self.status == "ok" else math.inf
  @property
  def opts_json(self) -> str: return opts_to_json(self.opts)


OBJECTIVES = ("median", "min")  # what ranks candidates: the median of a candidate's runs (robust to a busy moment), or its fastest


class Timing(NamedTuple):
  """A re-time of one candidate: the objective's figure of its `n` runs (their median, or their min) and their spread,
  (median - min) / median."""
  median: float
  spread: float
  n: int


@dataclass
class TimingPolicy:
  min_repeats: int = 3
  max_repeats: int = 30
  max_seconds: float = 1.0  # per candidate, after warm-up
  settle: float = 0.03  # stop once (median - min) / median is below this
  warmup_seconds: float = 0.02
  cutoff_ratio: float = 3.0  # a candidate whose first run is this many times slower than the best so far is timed no further
  warm_cache: bool = False  # benchmarks on a GPU: no L2 flush between repeats (the search's own timing never flushes)


class _Worker:
  """A `python -m tinytune.search.worker` process holding the kernel's buffers."""

  def __init__(self, spec: dict, timeout: float):
    self.proc = subprocess.Popen([sys.executable, "-m", "tinytune.search.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    self.ready = self.request(spec, timeout)

  def request(self, msg: object, timeout: float) -> list:
    """One request; its reply, ["crashed", why] if the worker died, or ["timeout", why] if it did not answer in time."""
    assert self.proc.stdin is not None and self.proc.stdout is not None
    try:
      self.proc.stdin.write(json.dumps(msg) + "\n")
      self.proc.stdin.flush()
      if not select.select([self.proc.stdout], [], [], timeout)[0]:
        self.kill()
        return ["timeout", f"no answer in {timeout:.1f} s"]
      if line := self.proc.stdout.readline(): return json.loads(line)
    except (BrokenPipeError, OSError): pass
    self.kill()
    return ["crashed", f"the worker died (exit code {self.proc.returncode})"]

  def kill(self) -> None:
    if self.proc.poll() is None: self.proc.kill()
    self.proc.wait(5)


def _b64(lib: bytes) -> str: return base64.b64encode(lib).decode()
def source_hash(src: str) -> str:
  """A candidate's identity: the hash of its source (two opt lists that render the same kernel are one candidate)."""
  return hashlib.sha256(src.encode()).hexdigest()[:16]


# ***** the evaluator *****

# the slowest the reference runs, with time to spare: the kernel with no opts ran a 2048^3 matmul, reading B down its columns, in 52 s
# (0.33 GFLOPS) on a loaded Zen 4
REF_MIN_FLOPS = 1e8
CUT_MIN_S = 2.0  # the least time a candidate gets, however fast the best so far
# opts that move where and when each output is computed (threads, workgroups, registers, loop order) but not how: its sum still adds
# the same terms one by one in the same order, as the kernel with no opts does
ORDER_KEEPING = {OptOps.THREAD, OptOps.LOCAL, OptOps.UPCAST, OptOps.SWAP}


def reference_kernel(kernel: Kernel) -> Kernel:
  """What candidates are checked against: the kernel with those of its default opts that keep each output's sum as the kernel with
  no opts adds it, so the reference has the plain kernel's values at a fraction of its time (the plain 2048^3 matmul took 52 s of
  a 60 s search; with its default register tile and threads, under a second)."""
  k = kernel.copy()
  for opt in default_opts(kernel):
    if opt.op in ORDER_KEEPING:
      try: k.apply_opt(opt)
      except KernelOptError: pass  # it needed an opt left out
  return k


@dataclass
class Evaluator:
  """Evaluate opt lists for one kernel on one device. `known` maps opts JSON to results already stored (resume)."""
  kernel: Kernel  # with no opts
  device: str
  timeout_s: float = 10.0
  policy: TimingPolicy = field(default_factory=TimingPolicy)
  jobs: int = 0  # parallel compiles; 0 means one per core
  seed: int = 0
  on_result: Callable[[Result], None] | None = None
  known: dict[str, Result] = field(default_factory=dict)
  render: Callable[[Kernel], str] | None = None  # the device's renderer unless given (tests inject crashing candidates here)
  deadline: float | None = None  # time.monotonic() after which no new candidate starts (the strategy's budget sets it)
  end: float | None = None  # ... and after which re-timing the finalists takes no more rounds
  objective: str = "median"  # one of OBJECTIVES

  def __post_init__(self) -> None:
    self.dev = Device[self.device]
    self.render_source: Callable[[Kernel], str] = self.render or self.dev.renderer.render
    self.by_source: dict[str, Result] = {}
    self.worker: _Worker | None = None
    self.evaluated = 0  # candidates measured now (not read back, not duplicates)
    self.run_s: list[float] = []  # the wall time of each candidate's run in the worker
    self.render_s: list[float] = []  # ... and of rendering each
    ref = reference_kernel(self.kernel)
    self.ref = (_b64(self.dev.compile(self.dev.renderer.render(ref))), ref.name, ref.launch_dims)
    self.pool = ThreadPoolExecutor(self.jobs or os.cpu_count() or 1)
    self.ref_dir = tempfile.TemporaryDirectory(prefix="tinytune-ref-")  # the reference output, kept for workers that replace one that died

  def _request(self, msg: list, timeout: float | None = None) -> list:
    if self.worker is None:
      spec = {"device": self.device, "seed": self.seed, "inputs": [(b.size, b.dtype.name) for b in self.kernel.bufs], "ref": self.ref,
              "out": (math.prod(self.kernel.out_shape), self.kernel.ast.dtype.name), "terms": math.prod(self.kernel.sizes[self.kernel.n_global:]),
              "ref_file": os.path.join(self.ref_dir.name, "ref.npy")}
      self.worker = _Worker(spec, self.timeout_s + 10 + self.kernel.flops / REF_MIN_FLOPS)
      if self.worker.ready[0] != "ready": raise RuntimeError(f"the reference kernel failed in the worker: {self.worker.ready[1]}")
    reply = self.worker.request(msg, timeout or self.timeout_s)
    if reply[0] in ("crashed", "timeout"): self.worker = None
    return reply

  def kernel_for(self, opts: Sequence[Opt]) -> Kernel: return self.kernel.copy().apply_opts(opts)

  def evaluate(self, candidates: Sequence[Sequence[Opt]]) -> list[Result]:
    """Results in the order given; each new measurement is reported to on_result as it finishes. Past the deadline no new
    candidate is compiled or run: the results stop at the first candidate that was not."""
    results: list[Result] = []
    chunk = 2 * self.pool._max_workers  # compile a few in parallel, run them, look at the clock
    for start in range(0, len(candidates), chunk):
      check_stop()
      results += (done := self._evaluate(candidates[start:start + chunk]))
      if len(done) < len(candidates[start:start + chunk]): break
    return results

  def past_deadline(self, rendering: bool = False) -> bool:
    """Whether a new candidate would end past the deadline, going by how long the candidates so far took to run (a 2048^3
    matmul's take seconds each, and one started just before the deadline overran a 20 s budget by 4 s) and, before it is
    rendered, to render (a tensor-core matmul's lowering takes 0.2 to 0.4 s of Python, and a chunk of them is rendered in turn)."""
    typical = statistics.median(self.run_s[-8:]) if self.run_s else 0.0
    if rendering and self.render_s: typical += statistics.median(self.render_s[-8:])
    return self.deadline is not None and time.monotonic() + typical > self.deadline

  def _evaluate(self, candidates: Sequence[Sequence[Opt]]) -> list[Result]:
    results: list[Result | None] = [None] * len(candidates)
    todo: list[tuple[int, tuple[Opt, ...], Kernel, str, str]] = []
    for i, opts in enumerate(map(tuple, candidates)):
      if (stored := self.known.get(opts_to_json(opts))) is not None: results[i] = replace(stored, objective=self.objective); continue
      try: k = self.kernel_for(opts)
      except KernelOptError as e: results[i] = Result(opts, "invalid", error=str(e)); continue
      if self.past_deadline(rendering=True): break
      st = time.monotonic()
      src = self.render_source(k)
      self.render_s.append(time.monotonic() - st)
      todo.append((i, opts, k, src, source_hash(src)))
    fresh = {h: (k, src) for _, _, k, src, h in todo if h not in self.by_source}
    compiling = {h: self.pool.submit(self._compile, src) for h, (_, src) in fresh.items()}
    for i, opts, k, src, h in todo:
      if h not in self.by_source:
        if self.past_deadline(): break
        # a compile still running at the deadline is left to finish alone (a chunk's compiles ran 2.4 s past a 5 s budget on pocl)
        try: lib, compile_s, error = compiling[h].result(None if self.deadline is None else max(0.0, self.deadline - time.monotonic()))
        except TimeoutError: break
        if lib is None: res = Result(opts, "compile_error", compile_s=compile_s, source_hash=h, error=error)
        else:
          st = time.monotonic()
          res = self._run(opts, lib, k, h, compile_s)
          self.run_s.append(time.monotonic() - st)
        self.by_source[h] = res
        self.evaluated += 1
        if self.on_result is not None: self.on_result(res)
      results[i] = replace(self.by_source[h], opts=opts)
    return results[:next((i for i, r in enumerate(results) if r is None), len(results))]  # type: ignore[return-value]

  def _compile(self, src: str) -> tuple[str | None, float, str]:
    st = time.perf_counter()
    try: return _b64(self.dev.compile(src)), time.perf_counter() - st, ""
    except Exception as e: return None, time.perf_counter() - st, str(e).splitlines()[0]

  def _run(self, opts: tuple[Opt, ...], lib: str, k: Kernel, source_hash: str, compile_s: float) -> Result:
    best = min((r.median_s for r in self.by_source.values() if r.status == "ok"), default=math.inf)
    policy = {**vars(self.policy), "cutoff": self.policy.cutoff_ratio * best if math.isfinite(best) else 0}
    if self.end is not None:  # near the budget's end, time each candidate for a part of what is left
      policy["max_seconds"] = min(policy["max_seconds"], max(0.05, (self.end - time.monotonic()) / 4))
    # a candidate still running long after the cutoff (a run under it is timed for up to max_seconds more) cannot win: stop it there
    # (a new worker costs about a second) rather than at the timeout (the 2048^3 matmul with no opts, a start of BEAM's, runs a minute)
    cut = min(self.timeout_s, max(CUT_MIN_S, 4 * policy["cutoff"]) + self.policy.max_seconds) if policy["cutoff"] else self.timeout_s
    if self.end is not None and math.isfinite(best): cut = min(cut, max(CUT_MIN_S, self.end - time.monotonic()))  # none runs far past the end
    reply = self._request(["run", lib, k.name, k.launch_dims, policy, True], cut)
    if reply[0] == "timeout" and cut < self.timeout_s: reply[1] = f"cut off after {cut:.1f} s, over {cut / best:.0f}x the best so far"
    if reply[0] != "ok": return Result(opts, reply[0], compile_s=compile_s, source_hash=source_hash, error=reply[1])
    times = reply[1]
    med = statistics.median(times)
    return Result(opts, "ok", min(times), med, (med - min(times)) / med if med else 0.0, compile_s, source_hash, objective=self.objective)

  def retime(self, candidates: Sequence[Sequence[Opt]], rounds: int = 5) -> list[Timing]:
    """Time candidates again, interleaved round by round so drift hits all alike; the median and spread per candidate."""
    libs = []
    for opts in candidates:
      k = self.kernel_for(opts)
      libs.append((_b64(self.dev.compile(self.render_source(k))), k.name, k.launch_dims))
    policy = {**vars(self.policy), "max_repeats": 5, "min_repeats": 3, "max_seconds": 0.2, "cutoff": 0}
    samples: list[list[float]] = [[] for _ in candidates]
    for r in range(rounds):
      if r and self.end is not None and time.monotonic() > self.end: break  # one round at least, more while the budget lasts
      for j, (lib, name, launch) in enumerate(libs):
        reply = self._request(["run", lib, name, launch, policy, False])
        samples[j] += reply[1] if reply[0] == "ok" else [math.inf]
    spreads = [(med - min(s)) / med if math.isfinite(med := statistics.median(s)) and med else 0.0 for s in samples]
    return [Timing(min(s) if self.objective == "min" else statistics.median(s), spread, len(s)) for s, spread in zip(samples, spreads)]

  def close(self) -> None:
    if self.worker is not None:
      self.worker.kill()
      self.worker = None
    self.pool.shutdown(wait=False, cancel_futures=True)  # compiles past the deadline: not waited for
    self.ref_dir.cleanup()

  def __enter__(self) -> Evaluator: return self
  def __exit__(self, *exc: object) -> None: self.close()
