"""Candidate evaluation: compile in parallel, drop duplicates by source, verify against the kernel's plain sums, time.

Candidates run in a worker process that holds the buffers, so a candidate that crashes or hangs costs that worker
(recorded as `crashed` or `timeout`) and the search goes on with a fresh one."""
from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import queue
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from typing import Any, Callable, NamedTuple, Sequence

from tinytune.codegen.heuristic import default_opts
from tinytune.codegen.kernel import Kernel, KernelOptError
from tinytune.codegen.opts import Opt, OptOps, opts_from_json, opts_to_json
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
  render_s: float = 0.0  # where its seconds went: rendering its source, ...
  verify_s: float = 0.0  # ... checking its output in the worker, ...
  run_s: float = 0.0  # ... and the whole run request in the worker (load, verify, time); compile_s above

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
  # ... or this many runs, where they end sooner (None: no limit): the verification's run came just before, and a GPU's 1.3 ms kernel
  # spent 20 ms of its 31 ms warming up (a float16 4096^3 matmul, H200)
  warmup_runs: int | None = 3
  cutoff_ratio: float = 3.0  # a candidate whose first run is this many times slower than the best so far is timed no further
  warm_cache: bool = False  # benchmarks on a GPU: no L2 flush between repeats (the search's own timing never flushes)


class _Worker:
  """A `python -m tinytune.search.worker` process holding the kernel's buffers. It starts (buffers filled, the reference run) while
  the caller goes on: `ready` waits for it. It answers requests in the order sent, and a request sent while it runs the one before
  waits in its pipe, so it goes on to the next without waiting for the caller."""

  def __init__(self, spec: dict, timeout: float):
    self.proc = subprocess.Popen([sys.executable, "-m", "tinytune.search.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    self.unread = b""  # what came from its stdout after the last answer read
    # a thread writes the requests: a program of more than the pipe holds (64 KB) would block the caller until the worker read it,
    # and a candidate that hangs would then hold it past its timeout
    self.outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    threading.Thread(target=self._write, daemon=True).start()
    self.timeout = timeout
    self.send(spec)
    self._ready: list | None = None

  @property
  def ready(self) -> list:
    """["ready", where it compares outputs] once the worker has started, or why it did not (given `timeout` from this first ask)."""
    if self._ready is None: self._ready = self.reply(self.timeout)
    return self._ready

  def request(self, msg: object, timeout: float) -> list:
    """One request, none other in flight; its reply, ["crashed", why] if the worker died, or ["timeout", why] if it did not answer in time."""
    self.send(msg)
    return self.reply(timeout)

  def send(self, msg: object) -> None: self.outbox.put(json.dumps(msg).encode() + b"\n")

  def _write(self) -> None:
    assert self.proc.stdin is not None
    while (line := self.outbox.get()) is not None:
      try:
        self.proc.stdin.write(line)
        self.proc.stdin.flush()
      except (BrokenPipeError, OSError): return  # it died: its reply says so

  def reply(self, timeout: float) -> list:
    """The answer to the oldest request not answered yet. Read from the pipe itself: where two answers came together, a buffered
    reader would hold the second where `select` does not see it."""
    assert self.proc.stdout is not None
    end, fd = time.monotonic() + timeout, self.proc.stdout.fileno()
    try:
      while b"\n" not in self.unread:
        if not select.select([fd], [], [], max(0.0, end - time.monotonic()))[0]:
          self.kill()
          return ["timeout", f"no answer in {timeout:.1f} s"]
        if not (chunk := os.read(fd, 1 << 16)): return self.died()
        self.unread += chunk
    except OSError: return self.died()
    line, _, self.unread = self.unread.partition(b"\n")
    return json.loads(line)

  def died(self) -> list:
    self.kill()
    return ["crashed", f"the worker died (exit code {self.proc.returncode})"]

  def kill(self) -> None:
    self.outbox.put(None)
    if self.proc.poll() is None: self.proc.kill()
    self.proc.wait(5)


def _b64(lib: bytes) -> str: return base64.b64encode(lib).decode()
def source_hash(src: str) -> str:
  """A candidate's identity: the hash of its source (two opt lists that render the same kernel are one candidate)."""
  return hashlib.sha256(src.encode()).hexdigest()[:16]


class Built(NamedTuple):
  """A candidate rendered and compiled: its source's hash, the program (base64; None where it did not compile, or where its source
  was measured already), the seconds of each step, the compiler's first line of error."""
  source_hash: str
  lib: str | None
  render_s: float
  compile_s: float
  error: str = ""


def _build(src: str, render_s: float, compile: Callable[[str], bytes]) -> Built:
  st = time.perf_counter()
  try: return Built(source_hash(src), _b64(compile(src)), render_s, time.perf_counter() - st)
  except Exception as e: return Built(source_hash(src), None, render_s, time.perf_counter() - st, (str(e).splitlines() or [type(e).__name__])[0])


# what the compile processes of a device that compiles apart render and compile; set just before they are forked, so they inherit it
_FORKED: dict[str, Any] = {}


def _forked_init() -> None:
  """A compile process dies on a stop signal, quietly: the search terminates it at its end, and a Ctrl-C reaches it with the search,
  which records and stops (the command's handler, inherited, raised Stopped in the pool's queue wait and printed its traceback)."""
  for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP): signal.signal(signum, signal.SIG_DFL)


def _build_forked(opts_json: str) -> Built:
  k = _FORKED["kernel"].copy().apply_opts(opts_from_json(opts_json))
  st = time.perf_counter()
  src = _FORKED["render"](k)
  return _build(src, time.perf_counter() - st, _FORKED["dev"].compile)


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


# given a call's results so far, the candidates likely to be asked for next (the next round of a BEAM search)
Following = Callable[[list[Result]], Sequence[Sequence[Opt]]]

QUEUED = 2  # run requests the worker holds at once: the one it runs, and the next, so it never waits for this process between them
# the finalists' re-time (strategy.finalize): this many rounds, interleaved, of the default and FINALISTS others, each request
# timed under RETIME_POLICY
RETIME_ROUNDS, FINALISTS = 5, 3
RETIME_POLICY = {"max_repeats": 5, "min_repeats": 3, "max_seconds": 0.2}
RETIME_SHARE = 0.1  # the part of a budget in seconds kept for the re-time's rounds, where they take longer than that (one at least)


@dataclass
class _Sent:
  """A run request the worker has: a call's candidate (`slot`: its place in the call's results), or one sent ahead of the call that
  will likely ask for it (None). What it takes to send it again, where the worker died before it ran, and the policy it ran under."""
  slot: int | None
  opts: tuple[Opt, ...]
  k: Kernel
  build: Future[Built]
  built: Built
  policy: dict = field(default_factory=dict)
  cut: float = 0.0  # seconds after it began that it is cut off
  end: float = math.inf  # time.monotonic() near which it is cut off however late it began: the budget's end (CUT_MIN_S after it began at least)
  at: float = 0.0  # time.monotonic() when it was sent


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
  device_check: bool | None = None  # compare outputs on the device (worker.DeviceCheck); None: on a GPU, where the output is large

  def __post_init__(self) -> None:
    self.dev = Device[self.device]
    self.render_source: Callable[[Kernel], str] = self.render or self.dev.renderer.render
    self.by_source: dict[str, Result] = {}
    self.libs: dict[tuple[Opt, ...], str] = {}  # the programs of candidates that ran, for the finalists' re-time (not built again)
    self.evaluated = 0  # candidates measured now (not read back, not duplicates)
    self.run_s: list[float] = []  # the wall time of each candidate's run in the worker
    self.render_s: list[float] = []  # ... and of rendering each
    self.ref: tuple[str, str, tuple[int, int]] | None = None  # the reference's program, built with the first worker
    self.pool = ThreadPoolExecutor(self.jobs or os.cpu_count() or 1)
    self.in_flight = 2 * self.pool._max_workers  # builds kept going at once: twice the jobs, so none idles while the worker measures
    # where the device compiles apart (a GPU's NVRTC: no device state), candidates are rendered and compiled in forked processes
    # while the worker verifies and times those before them: a float16 TC candidate took 60 ms to render and 600 ms to compile,
    # 165 ms to verify and time (H200)
    self.procs: ProcessPoolExecutor | None = None
    self.early: dict[tuple[Opt, ...], tuple[Kernel, Future[Built]]] = {}  # builds started before a call asked for them (`following`)
    self.refused: set[tuple[Opt, ...]] = set()  # ... and the invalid ones among them
    self.ref_dir = tempfile.TemporaryDirectory(prefix="tinytune-ref-")  # the reference output, kept for workers that replace one that died
    # started with the first candidate that needs measuring, while it compiles: a resume that finds every candidate stored needs none
    self.worker: _Worker | None = None
    self.checked_on = ""  # where the worker compares outputs with the reference: "device" or "host"
    self.sent: deque[_Sent] = deque()  # run requests the worker has, oldest first, their answers not read yet
    self.answered = 0.0  # when the worker last answered: the oldest request sent before that runs from then
    self.ahead: dict[tuple[Opt, ...], Result] = {}  # candidates measured before a call asked for them (`following`'s, sent ahead)
    self.overhead_s: list[float] = []  # of each candidate's run, by the worker's clock what was neither verifying nor timing (reading it, loading it)
    self.budget_s: float | None = None  # the budget's seconds, which end at `end` (run_strategy sets both)
    self.worker_s: list[tuple[float, float]] = []  # by the worker's clock, for each candidate: how long it waited for it, and ran it

  def _spawn(self) -> _Worker:
    """A new worker, starting: a second or more (a GPU's context, the inputs, the reference), which no candidate's run counts."""
    if self.ref is None:
      ref = reference_kernel(self.kernel)
      self.ref = (_b64(self.dev.compile(self.dev.renderer.render(ref))), ref.name, ref.launch_dims)
    spec = {"device": self.device, "seed": self.seed, "inputs": [(b.size, b.dtype.name) for b in self.kernel.bufs], "ref": self.ref,
            "out": (math.prod(self.kernel.out_shape), self.kernel.ast.dtype.name), "terms": math.prod(self.kernel.sizes[self.kernel.n_global:]),
            "ref_file": os.path.join(self.ref_dir.name, "ref.npy"), "device_check": self.device_check}
    return _Worker(spec, self.timeout_s + 10 + self.kernel.flops / REF_MIN_FLOPS)

  def _started(self) -> _Worker:
    """The worker, started (with the reference computed)."""
    if self.worker is None: self.worker = self._spawn()
    if self.worker.ready[0] != "ready": raise RuntimeError(f"the reference kernel failed in the worker: {self.worker.ready[1]}")
    self.checked_on = self.worker.ready[1]
    return self.worker

  def _request(self, msg: list, timeout: float | None = None) -> list:
    reply = self._started().request(msg, timeout or self.timeout_s)
    if reply[0] in ("crashed", "timeout"): self.worker = None
    return reply

  def kernel_for(self, opts: Sequence[Opt]) -> Kernel: return self.kernel.copy().apply_opts(opts)

  def evaluate(self, candidates: Sequence[Sequence[Opt]], following: Following | None = None) -> list[Result]:
    """Results in the order given; each new measurement is reported to on_result as it finishes. Up to twice as many candidates as
    there are compile jobs are rendered and compiled ahead, and the worker runs whichever is built first (a TC candidate's compile
    took from 1.3 to 38 s on a loaded Zen 4: one slow compile holds up no other). The worker always has the next built candidate
    waiting while it runs one, so it never waits for this process between candidates. Once all are under way, and where the device
    compiles apart, `following` (given this call's results so far) names the candidates likely to come next, and they are compiled
    meanwhile: a later call that asks for one takes its build, and once this call's last candidates are with the worker, those built
    are sent too, so the worker goes on while the strategy chooses its next call (a later call takes their results).
    Past the deadline no new candidate is compiled or run: the results stop at the first candidate that was not."""
    results: list[Result | None] = [None] * len(candidates)
    ahead: list[tuple[int, tuple[Opt, ...], Kernel, Future[Built]]] = []
    building: dict[str, Future[Built]] = {}  # source hash -> its build in flight (compiled in this process: a duplicate waits for it)
    stopped = False
    try:
      for i, opts in enumerate(map(tuple, candidates)):
        if (stored := self.known.get(opts_to_json(opts))) is not None: results[i] = replace(stored, objective=self.objective); continue
        if (measured := self.ahead.pop(opts, None)) is not None: results[i] = measured; continue
        if (sent := next((s for s in self.sent if s.slot is None and s.opts == opts), None)) is not None:
          sent.slot = i  # with the worker already
          continue
        if (early := self.early.pop(opts, None)) is not None:
          ahead.append((i, opts, *early))
          continue
        try: k = self.kernel_for(opts)
        except KernelOptError as e: results[i] = Result(opts, "invalid", error=str(e)); continue
        while len(ahead) >= self.in_flight and not stopped: stopped = not self._step(ahead, results)
        if stopped or self.past_deadline(rendering=not self.dev.compiles_apart): break
        if self.worker is None: self.worker = self._spawn()  # starting while this candidate compiles
        ahead.append((i, opts, k, self._submit(opts, k, building)))
      while (ahead and not stopped) or any(s.slot is not None for s in self.sent):
        if following is not None and self.dev.compiles_apart and not self.past_deadline(): self._compile_early(following([r for r in results if r]))
        stopped = not self._step(ahead, results) or stopped
        if not ahead: self._send_early()
    finally:
      for s in self.sent: s.slot = None  # stopped by a signal: what the worker has is no longer this call's
    return results[:next((i for i, r in enumerate(results) if r is None), len(results))]  # type: ignore[return-value]

  def _compile_early(self, candidates: Sequence[Sequence[Opt]]) -> None:
    """Start compiling candidates a later call will likely ask for, while up to twice as many are in flight as there are jobs; those
    no longer likely are dropped: those not started, lest they hold up the ones now likely, and those built, lest a long search keep
    every program it once thought likely (one still compiling goes at a later call, once built)."""
    likely = list(dict.fromkeys(map(tuple, candidates)))
    for opts in set(self.early) - set(likely):
      if (build := self.early[opts][1]).done() or build.cancel(): del self.early[opts]
    flight = sum(not build.done() for _, build in self.early.values())
    for opts in likely:
      if flight >= self.in_flight: return
      if opts in self.early or opts in self.refused or opts in self.ahead or opts_to_json(opts) in self.known: continue
      if any(s.opts == opts for s in self.sent): continue
      try: k = self.kernel_for(opts)
      except KernelOptError:
        self.refused.add(opts)  # not applied again at the next result: the worker waits while this process works
        continue
      self.early[opts] = (k, self._submit(opts, k, {}))
      flight += 1

  def _send_early(self) -> None:
    """Give the worker early builds that are done, while it has room: measured while the strategy chooses its next call."""
    for opts, (k, build) in list(self.early.items()):
      if len(self.sent) >= QUEUED or self.past_deadline(): return
      if not build.done() or build.cancelled() or build.exception() is not None: continue
      if (built := build.result()).lib is None or built.source_hash in self.by_source or self._in_flight(built.source_hash): continue
      del self.early[opts]
      self._send(_Sent(None, opts, k, build, built))

  def past_deadline(self, rendering: bool = False) -> bool:
    """Whether a new candidate would end past the deadline, going by how long the candidates so far took to run (a 2048^3
    matmul's take seconds each, and one started just before the deadline overran a 20 s budget by 4 s), those the worker has yet
    to answer first, and, before it is rendered in this process, to render (a tensor-core matmul's lowering took 0.2 to 0.4 s of
    Python); and where the deadline ends the budget (`end`), what choosing the winner will take after it (_latest)."""
    if self.deadline is None: return False
    typical = statistics.median(self.run_s[-8:]) if self.run_s else 0.0
    if rendering and self.render_s: typical += statistics.median(self.render_s[-8:])
    return time.monotonic() + typical * (1 + len(self.sent)) > self._latest()

  def _latest(self) -> float:
    """When the last candidate must end: the deadline, less the finalists' re-time where the deadline is the budget's end. The
    re-time takes RETIME_ROUNDS rounds where they fit in a tenth of the budget (a fast GPU's took a fraction of it), one at least."""
    assert self.deadline is not None
    if self.end is None or self.deadline < self.end: return self.deadline
    one = self.retime_round_s()
    return self.deadline - min(RETIME_ROUNDS * one, max(one, RETIME_SHARE * self.budget_s if self.budget_s else math.inf))

  def retime_round_s(self) -> float:
    """How long a round of re-timing the finalists (strategy.finalize: the default and FINALISTS others) will take, from the
    candidates measured so far: each request costs what the worker took besides verifying and timing (reading the request,
    loading the program) and RETIME_POLICY's runs of one of the fastest candidates (a random search's typical one ran 17x as long)."""
    fastest = sorted(r.time for r in self.by_source.values() if r.status == "ok")[:FINALISTS + 1]
    if not fastest or not self.overhead_s: return 0.0
    p, r = self.policy, RETIME_POLICY
    def request(t: float) -> float:
      runs = t + min(t * (r["max_repeats"] if p.warmup_runs is None else p.warmup_runs), p.warmup_seconds + t)  # the first, the warm-up
      return runs + max(r["min_repeats"] * t, min(r["max_repeats"] * t, r["max_seconds"] + t))  # and the repeats timed
    return len(fastest) * statistics.median(self.overhead_s[-8:]) + sum(map(request, fastest))

  def _submit(self, opts: tuple[Opt, ...], k: Kernel, building: dict[str, Future[Built]]) -> Future[Built]:
    """Start rendering and compiling a candidate: in a compile process where the device compiles apart, else rendered here (a
    source already built or in flight is not compiled again) and compiled in a thread."""
    if self.dev.compiles_apart:
      if self.procs is None:  # forked at the first candidate, inheriting the kernel and the renderer as they are now
        _FORKED.update(kernel=self.kernel, render=self.render_source, dev=self.dev)
        self.procs = ProcessPoolExecutor(self.pool._max_workers, mp_context=get_context("fork"), initializer=_forked_init)
      try: return self.procs.submit(_build_forked, opts_to_json(opts))
      except BrokenProcessPool: self._close_procs()  # a compiler crashed its process: a fresh pool for the next candidate
      return self._submit(opts, k, building)
    st = time.monotonic()
    src = self.render_source(k)
    self.render_s.append(render_s := time.monotonic() - st)
    if (h := source_hash(src)) in building: return building[h]  # done with the first: it runs, then this takes its result
    if h in self.by_source:
      done: Future[Built] = Future()
      done.set_result(Built(h, None, render_s, 0.0))
      return done
    building[h] = self.pool.submit(self._compile, src, render_s)
    return building[h]

  def _step(self, ahead: list[tuple[int, tuple[Opt, ...], Kernel, Future[Built]]], results: list[Result | None]) -> bool:
    """One step of a call: give the worker what is built (up to QUEUED requests), then read its oldest answer, or, where it has
    nothing, wait for a build; False where the deadline stops new candidates. A compile still running at the deadline is left to
    finish alone (a chunk's compiles ran 2.4 s past a 5 s budget on pocl)."""
    check_stop()
    more = self._give(ahead, results)
    if self.sent:
      self._receive(ahead, results)
      return more
    if not ahead: return True
    if not more: return False
    timeout = None if self.deadline is None else max(0.0, self._latest() - time.monotonic())
    return bool(wait([build for *_, build in ahead], timeout, FIRST_COMPLETED).done)

  def _give(self, ahead: list[tuple[int, tuple[Opt, ...], Kernel, Future[Built]]], results: list[Result | None]) -> bool:
    """Send the worker the built candidates, the first given first, until it has QUEUED requests; a build that failed, or whose
    source was measured, takes its result at once. False where the deadline stops new candidates."""
    j = 0
    while j < len(ahead):
      i, opts, k, build = ahead[j]
      if not build.done(): j += 1; continue
      try: built = build.result()
      except BrokenProcessPool:
        self._close_procs()
        built = Built("", None, 0.0, 0.0, "the compile process died")
      except CancelledError: built = Built("", None, 0.0, 0.0, "the compile process died")  # its pool broke and was closed meanwhile
      done = built.lib is None or built.source_hash in self.by_source
      if not done and self._in_flight(built.source_hash): j += 1; continue  # the same kernel, measured now: this takes its result
      if not done and len(self.sent) >= QUEUED: return True
      if not done and self.past_deadline(): return False
      del ahead[j]
      if self.dev.compiles_apart: self.render_s.append(built.render_s)
      if done: self._record(i, opts, built, results)
      else: self._send(_Sent(i, opts, k, build, built))
    return True

  def _in_flight(self, h: str) -> bool: return any(s.built.source_hash == h for s in self.sent)

  def _send(self, s: _Sent) -> None:
    """A candidate's run request to the worker, with a timing policy and a cut-off from the results so far."""
    best = min((r.median_s for r in self.by_source.values() if r.status == "ok"), default=math.inf)
    s.policy = {**vars(self.policy), "cutoff": self.policy.cutoff_ratio * best if math.isfinite(best) else 0}
    if self.end is not None:  # near the budget's end, time each candidate for a part of what is left
      s.policy["max_seconds"] = min(s.policy["max_seconds"], max(0.05, (self.end - time.monotonic()) / 4))
    # a candidate still running long after the cutoff (a run under it is timed for up to max_seconds more) cannot win: stop it there
    # (a new worker costs about a second) rather than at the timeout (the 2048^3 matmul with no opts, a start of BEAM's, runs a minute)
    s.cut = min(self.timeout_s, max(CUT_MIN_S, 4 * s.policy["cutoff"]) + self.policy.max_seconds) if s.policy["cutoff"] else self.timeout_s
    if self.end is not None and math.isfinite(best): s.end = self.end  # none runs far past the end
    worker = self._started()
    worker.send(["run", s.built.lib, s.k.name, s.k.launch_dims, s.policy, True])
    s.at = time.monotonic()
    self.sent.append(s)

  def _receive(self, ahead: list[tuple[int, tuple[Opt, ...], Kernel, Future[Built]]], results: list[Result | None]) -> None:
    """Read the worker's answer to its oldest request and record it, having first sent it its next (it runs that meanwhile). Where
    the worker died or was cut off, the requests it had go back to be sent to the next."""
    s = self.sent[0]
    assert self.worker is not None
    begun = max(s.at, self.answered)  # it ran from when the worker answered the request before it
    cut = min(s.cut, max(CUT_MIN_S, s.end - begun))  # from when it began: queued behind a slow one, it began late
    reply = self.worker.reply(max(0.0, cut - (time.monotonic() - begun)))
    self.sent.popleft()
    self.answered = time.monotonic()
    if reply[0] in ("crashed", "timeout"):
      self.worker = None
      for r in reversed(self.sent):
        if r.slot is None: self.early[r.opts] = (r.k, r.build)
        else: ahead.insert(0, (r.slot, r.opts, r.k, r.build))
      self.sent.clear()
    else: self._give(ahead, results)
    # its run: the worker's own seconds on it where it answered (the answer may wait unread while this process is busy)
    res = Result(s.opts, reply[0], compile_s=s.built.compile_s, source_hash=s.built.source_hash, objective=self.objective,
                 render_s=s.built.render_s, verify_s=float(reply[2]) if len(reply) > 2 else 0.0,
                 run_s=float(reply[5]) if len(reply) > 5 else self.answered - begun)
    if reply[0] == "timeout" and cut < self.timeout_s:
      best = s.policy["cutoff"] / self.policy.cutoff_ratio
      reply[1] = f"cut off after {cut:.1f} s, over {cut / best:.0f}x the best so far"
    if reply[0] != "ok": res = replace(res, error=reply[1])
    else:
      times, med = reply[1], statistics.median(reply[1])
      res = replace(res, min_s=min(times), median_s=med, spread=(med - min(times)) / med if med else 0.0)
      self.overhead_s.append(max(0.0, res.run_s - res.verify_s - float(reply[3])))
    if len(reply) > 5: self.worker_s.append((float(reply[4]), float(reply[5])))
    self.run_s.append(res.run_s)
    self._record(s.slot, s.opts, s.built, results, res)

  def _record(self, slot: int | None, opts: tuple[Opt, ...], built: Built, results: list[Result | None], measured: Result | None = None) -> None:
    """A candidate's result: `measured` now, its build's failure, or the result of its source measured before; into the call's
    `results` at `slot`, or kept for the call that asks for it (sent ahead)."""
    if built.source_hash not in self.by_source or not built.source_hash:
      self.by_source[built.source_hash] = measured or Result(opts, "compile_error", compile_s=built.compile_s, source_hash=built.source_hash,
                                                             error=built.error, render_s=built.render_s)
      self.evaluated += 1
      if self.on_result is not None: self.on_result(self.by_source[built.source_hash])
    res = replace(self.by_source[built.source_hash], opts=opts)
    if slot is None: self.ahead[opts] = res
    else: results[slot] = res
    if res.status == "ok" and (lib := built.lib or self.libs.get(self.by_source[built.source_hash].opts)): self.libs[opts] = lib

  def _compile(self, src: str, render_s: float) -> Built: return _build(src, render_s, self.dev.compile)

  def _drain(self) -> None:
    """Read the answers to every request the worker has (candidates sent ahead: kept for a later call)."""
    while self.sent: self._receive([], [])

  def retime(self, candidates: Sequence[Sequence[Opt]], rounds: int = RETIME_ROUNDS) -> list[Timing]:
    """Time candidates again, interleaved round by round so drift hits all alike; the median and spread per candidate."""
    self._drain()
    libs = []
    for opts in map(tuple, candidates):
      k = self.kernel_for(opts)
      libs.append((self.libs.get(opts) or _b64(self.dev.compile(self.render_source(k))), k.name, k.launch_dims))
    policy = {**vars(self.policy), **RETIME_POLICY, "cutoff": 0}
    samples: list[list[float]] = [[] for _ in candidates]
    st = time.monotonic()
    for r in range(rounds):  # one round at least, more while the budget has room for one
      if r and self.end is not None and time.monotonic() + (time.monotonic() - st) / r > self.end: break
      for j, (lib, name, launch) in enumerate(libs):
        reply = self._request(["run", lib, name, launch, policy, False])
        samples[j] += reply[1] if reply[0] == "ok" else [math.inf]
    spreads = [(med - min(s)) / med if math.isfinite(med := statistics.median(s)) and med else 0.0 for s in samples]
    return [Timing(min(s) if self.objective == "min" else statistics.median(s), spread, len(s)) for s, spread in zip(samples, spreads)]

  def _close_procs(self) -> None:
    """Stop the compile processes, those still compiling too (candidates past the deadline): the search does not wait for them."""
    self.early.clear()  # their builds die with the pool: compiled again when asked for
    if self.procs is None: return
    for proc in list((getattr(self.procs, "_processes", None) or {}).values()): proc.terminate()  # the executor's own table of them
    self.procs.shutdown(wait=False, cancel_futures=True)
    self.procs = None

  def close(self) -> None:
    if self.worker is not None:
      self.worker.kill()
      self.worker = None
    self.sent.clear()
    self.pool.shutdown(wait=False, cancel_futures=True)  # compiles past the deadline: not waited for
    self._close_procs()
    self.ref_dir.cleanup()

  def __enter__(self) -> Evaluator: return self
  def __exit__(self, *exc: object) -> None: self.close()
