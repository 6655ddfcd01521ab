"""Tune the kernels of a program: search each one unless the tuning cache has it, record everything, update the cache."""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from sqlalchemy.exc import SQLAlchemyError

from tinytune import engine
from tinytune.codegen.kernel import Kernel
from tinytune.codegen.opts import Opt, opts_to_json
from tinytune.engine.program import retune
from tinytune.engine.schedule import ScheduleItem
from tinytune.helpers import env_count
from tinytune.results_db import Database, DatabaseError, SchemaError, fingerprint_hash
from tinytune.results_db.cache import TuningCache
from tinytune.runtime import Device, device_fingerprint
from tinytune.search.evaluate import OBJECTIVES, Result
from tinytune.search.progress import ProgressLine
from tinytune.search.strategy import SearchContext, check_options, env_options, get_strategy, run_strategy
from tinytune.search.study import Claims, SharedEvaluator, StudyBudget, stored_result
from tinytune.uop import UOp

if TYPE_CHECKING:
  import pandas as pd


@dataclass
class KernelOutcome:
  key: str
  name: str
  best: tuple[Opt, ...]
  best_s: float
  default_s: float | None
  cache_hit: bool
  counts: dict[str, int] = field(default_factory=dict)
  spread: float | None = None  # of the tuned kernel's final re-time (None: read from the cache)
  note: str = ""  # "noisy: ...": the re-time was disturbed, so there is no speedup and nothing was stored
  errors: str = ""  # the first error of each kind of failed candidate

  @property
  def speedup(self) -> float | None: return self.default_s / self.best_s if self.default_s and self.best_s > 0 and not self.note else None


@dataclass
class Tuner:
  """Search settings plus the database; `on_result(kernel, result)` sees every fresh measurement (for progress bars), and first,
  for each kernel, its default opts' (measured now or read back), the baseline of the speedups."""
  db: Database
  device: str
  strategy: str = "beam"
  budget: dict[str, Any] = field(default_factory=lambda: {"candidates": 200, "seconds": None})
  options: dict[str, Any] = field(default_factory=dict)
  resume: bool = False
  force: bool = False
  on_result: Callable[[Kernel, Result], None] | None = None
  study: str | None = None  # workers with the same study name and database tune together (see SharedEvaluator)
  worker: str = ""  # which worker of the study this is: part of what `resume` matches on
  started: float | None = None  # time.monotonic() when the budget's seconds began (a command's start: its setup counts), else now
  objective: str = "median"  # what ranks candidates: their runs' "median" or "min" (OBJECTIVES)
  fixed_s: float = field(default=0.0, init=False)  # the most a kernel's search took before its first candidate (worker, reference, default)

  def __post_init__(self) -> None:
    self.device = Device.canonicalize(self.device)
    if self.objective not in OBJECTIVES: raise ValueError(f"unknown objective {self.objective!r}; choose {' or '.join(OBJECTIVES)}")
    self.options = check_options(self.strategy, self.options)
    self.fingerprint = device_fingerprint(self.device)
    self.device_hash = fingerprint_hash(self.fingerprint)

  def cached(self, kernel: Kernel) -> KernelOutcome | None:
    if self.force or retune() or (found := TuningCache(self.db).lookup(kernel, self.device)) is None: return None
    return KernelOutcome(kernel.key, kernel.name, found.opts, found.best_s, found.default_s, True)

  def forget(self, program: UOp | Sequence[ScheduleItem]) -> None:
    """Drop the tuning cache entries of the program's kernels on this device (`search --force --workers N` starts so)."""
    for _, k in engine.kernels(program, self.device): self.db.delete_tuned(k.key, self.device_hash)

  def tune_program(self, program: UOp | Sequence[ScheduleItem], workload: str, params: dict[str, Any],
                   dtype: str | None = None) -> list[KernelOutcome]:
    """Tune every kernel of the program (a lazy graph or a schedule; nothing is realized); `dtype` is what the run records the
    program computes in (the kernels' keys tell dtypes apart already)."""
    labelled = {k.key: (label, k) for label, k in engine.kernels(program, self.device)}  # a kernel the program runs twice is tuned once
    kernels, labels = [k for _, k in labelled.values()], {key: label for key, (label, _) in labelled.items()}
    outcomes: list[KernelOutcome | None] = [None if (o := self.cached(k)) is None else replace(o, name=labels[k.key]) for k in kernels]
    if all(o is not None for o in outcomes): return outcomes  # type: ignore[return-value]
    settings = {"strategy": self.strategy, **self.options, **({"study": self.study, "worker": self.worker} if self.study else {}),
                **({"objective": self.objective} if self.objective != "median" else {})}
    signature = json.dumps({"workload": workload, "params": params, "device": self.device_hash, "settings": settings, "budget": self.budget,
                            "kernels": [k.key for k in kernels]}, sort_keys=True)
    end = None if self.budget.get("seconds") is None else (self.started or time.monotonic()) + self.budget["seconds"]  # all kernels' time
    if end is not None and end - time.monotonic() < SETUP_LEFT * self.budget["seconds"]:
      setup = time.monotonic() - end + self.budget["seconds"]
      raise ValueError(f"a {self.budget['seconds']:g} s budget leaves {max(0.0, end - time.monotonic()):.1f} s after the setup (imports, scheduling, "
                       f"compiling the default kernels took {setup:.1f} s): give it more seconds")
    with self.run(workload, params, settings, signature, dtype) as (run_id, device_id, stored):
      for i in sorted(range(len(kernels)), key=lambda i: -weight(kernels[i])):  # the heaviest first: a budget that runs out skips light ones
        if outcomes[i] is not None: continue
        k, started = kernels[i], time.monotonic()
        if end is not None and end - started < 1.5 * self.fixed_s:  # too little time left to time its default and re-time: not searched
          outcomes[i] = KernelOutcome(k.key, labels[k.key], engine.kernel_opts(k, self.device, "default"), math.inf, None, False,
                                      note="not searched: the --seconds budget ran out")
          continue
        left = [kk for kk, o in zip(kernels, outcomes) if o is None]
        seconds = None if end is None else max(0.0, end - started) * time_share(k, left)
        outcomes[i] = self.tune_kernel(k, self.context(run_id, workload, params, labels[k.key]), device_id, stored, seconds)
    return outcomes  # type: ignore[return-value]

  @contextlib.contextmanager
  def run(self, workload: str, params: dict[str, Any], settings: dict[str, Any], signature: str,
          dtype: str | None = None) -> Iterator[tuple[int, int, list]]:
    """A search run in the database: (run id, device id, what it measured before, with --resume); finished as done or interrupted."""
    device_id = self.db.device_id(self.fingerprint)
    run_id = self.db.resumable_run(signature) if self.resume else None
    stored = self.db.run_candidates(run_id) if run_id is not None else []
    if run_id is not None: self.db.adopt_run(run_id)  # its old process is gone: others of the study would take over its claims
    if run_id is None: run_id = self.db.start_run(workload, params, device_id, self.strategy, settings, self.budget, signature, dtype)
    try: yield run_id, device_id, stored
    except BaseException:
      self.db.finish_run(run_id, "interrupted")
      raise
    self.db.finish_run(run_id, "done")

  def tune_on_first_use(self, kernel: Kernel) -> tuple[Opt, ...]:
    """Tune a kernel a program is about to run (TINYTUNE_TUNE=beam): a run of its own, with the kernel's name as workload and its
    shape as params."""
    if (cached := self.cached(kernel)) is not None: return cached.best
    settings = {"strategy": self.strategy, **self.options}
    params = kernel_params(kernel)
    with self.run(kernel.name, params, settings, f"on first use: {kernel.key}", kernel.ast.dtype.name) as (run_id, device_id, _):
      return self.tune_kernel(kernel, self.context(run_id, kernel.name, params, kernel.name), device_id).best

  def context(self, run_id: int, workload: str, params: dict[str, Any], label: str) -> SearchContext:
    """What a strategy may know of this search (see SearchContext): `label` names the kernel uniquely in its program."""
    return SearchContext(self.db.url.render_as_string(hide_password=False), run_id, workload, params, label, self.device, self.device_hash,
                         self.study, int(self.worker or 0))

  def tune_kernel(self, kernel: Kernel, context: SearchContext, device_id: int, stored: list = (),  # type: ignore[assignment]
                  seconds: float | None = None) -> KernelOutcome:
    """Search one kernel's opts within the budget (`seconds`, where given, instead of the budget's own), in the context's run."""
    run_id, label = context.run_id, context.label
    assert run_id is not None, "a Tuner's search has a run"
    dtypes = sorted({b.dtype.name for b in kernel.bufs} | {kernel.ast.dtype.name})
    kernel_id = self.db.kernel_id(kernel.key, kernel.name, kernel.ast_text, kernel.sizes, dtypes, kernel.flops, kernel.mem_bytes)
    known = {c.opts_json: stored_result(c) for c in stored if c.kernel_id == kernel_id}

    def record(r: Result) -> None:
      self.db.record_candidate(run_id, kernel_id, device_id, r.opts_json, r.source_hash, r.compile_s, r.status, r.min_s, r.median_s, r.spread,
                               r.error)
      if self.on_result is not None: self.on_result(kernel, r)

    claims = Claims(self.db, self.study, kernel_id, device_id, run_id) if self.study else None
    budget = StudyBudget(self.budget.get("candidates"), self.budget.get("seconds") if seconds is None else seconds, claims=claims)
    default, started = engine.kernel_opts(kernel, self.device, "default"), time.monotonic()
    with SharedEvaluator(kernel, self.device, on_result=record, known=known, objective=self.objective, claims=claims) as ev:
      # the default first, so the first result on_result sees for a kernel is the baseline of every speedup, live and final
      if (base := ev.evaluate([default])) and base[0].stored and self.on_result is not None: self.on_result(kernel, base[0])
      self.fixed_s = max(self.fixed_s, time.monotonic() - started)
      result = run_strategy(self.strategy, kernel, ev, budget, default, context, **self.options)
    if isinstance(self.on_result, ProgressLine): self.on_result.settle(kernel, result)  # its final line: the re-time's figures
    if math.isfinite(result.best_s) and not result.note:  # a noisy re-time is not stored, lest it beat a quiet one
      # workers of a study keep the fastest of their results even with --force (which made them search despite the cache)
      self.db.set_tuned(kernel.key, self.device_hash, opts_to_json(result.best), result.best_s, result.default_s, run_id,
                        force=(self.force or retune()) and not self.study, kernel_name=label)
      engine.forget()  # programs in this process look the kernel up again
    counts = result.counts()
    if self.study:  # what this run measured itself, not what it read back from the other workers
      mine = {c.source_hash: c.status for c in self.db.run_candidates(run_id) if c.kernel_id == kernel_id}
      counts = {status: list(mine.values()).count(status) for status in set(mine.values())}
    return KernelOutcome(kernel.key, label, result.best, result.best_s, result.default_s, False, counts, result.spread, result.note, result.errors())


def outcome_frame(outcomes: Sequence[KernelOutcome], extra: Callable[[KernelOutcome], dict[str, Any]] = lambda o: {}) -> pd.DataFrame:
  """One row per kernel outcome, as `tune()` and `tinytune search` report them: kernel (its label), the `extra` columns, default_ms
  and tuned_ms (the final interleaved re-time's medians, or the cache's; None where nothing was measured), spread (the tuned kernel's
  re-time, (median - min) / median), speedup (None where the re-time was noisy), cache_hit, candidates (measured by status), opts
  ([op, axis, arg] lists), key, note ("noisy: ..." where the machine was too busy to trust the figures) and errors (the first of each
  kind of failed candidate: "crashed: ...; timeout: ...")."""
  import pandas as pd
  def ms(s: float | None) -> float | None: return s * 1e3 if s is not None and math.isfinite(s) else None
  return pd.DataFrame([{"kernel": o.name, **extra(o), "default_ms": ms(o.default_s), "tuned_ms": ms(o.best_s), "spread": o.spread,
                        "speedup": o.speedup, "cache_hit": o.cache_hit, "candidates": dict(sorted(o.counts.items())),
                        "opts": json.loads(opts_to_json(o.best)), "key": o.key, "note": o.note, "errors": o.errors} for o in outcomes])


SETUP_LEFT = 0.25  # a --seconds budget the setup left less than this part of is too small: said at once, not overrun

BYTE_FLOPS = 4  # a byte moved takes about as long as 4 flops (tens of GFLOPS, about ten GB/s on the CPUs we tune)


def weight(kernel: Kernel) -> int: return kernel.flops + BYTE_FLOPS * kernel.mem_bytes


def time_share(kernel: Kernel, left: Sequence[Kernel]) -> float:
  """`kernel`'s part of the time left to the kernels in `left` (it among them): half split evenly, half by how long each likely
  runs (its weight: flops and bytes), so a conv's matmul gets more of a --seconds budget than its input copy does."""
  return 0.5 / len(left) + 0.5 * weight(kernel) / max(1, sum(map(weight, left)))


def kernel_params(kernel: Kernel) -> dict[str, Any]:
  """A kernel's shape as a run's params: its output shape, the sizes it reduces over, its dtype."""
  return {"shape": list(kernel.out_shape), "reduce": kernel.sizes[kernel.n_global:], "dtype": kernel.ast.dtype.name}


DEFAULT_CANDIDATES = 200


def first_use_tuner(device: str, strategy: str) -> Tuner:
  """The Tuner of first-use tuning under the environment now: TINYTUNE_BUDGET candidates per kernel (default 200), and the
  strategy's options that environment variables set (BEAM=N, the beam's width); it writes a progress line per kernel on stderr."""
  db, options = os.getenv("TINYTUNE_DB") or None, tuple(env_options(strategy).items())
  try: return _first_use_tuner(db, device, strategy, env_count("TINYTUNE_BUDGET", 1) or DEFAULT_CANDIDATES, options)
  except (SQLAlchemyError, SchemaError, DatabaseError) as e:  # SQLAlchemy's own words name neither the variable nor the URL
    why = (str(getattr(e, "orig", None) or e).removeprefix("database error: ").splitlines() or [type(e).__name__])[0]
    where = f"TINYTUNE_DB={db!r}" if db else "the default database (TINYTUNE_DB is unset)"
    raise RuntimeError(f"{where} cannot record first-use tuning: {why}") from None


@functools.lru_cache(maxsize=None)
def _first_use_tuner(db: str | None, device: str, strategy: str, candidates: int, options: tuple[tuple[str, Any], ...]) -> Tuner:
  return Tuner(Database(db), device, strategy, {"candidates": candidates, "seconds": None}, dict(options),
               on_result=ProgressLine(strategy, candidates))


def tune_on_first_use(kernel: Kernel, device: str, strategy: str) -> tuple[Opt, ...]:
  """What the engine calls (tinytune.api registers it) for a kernel the tuning cache lacks, under TINYTUNE_TUNE=strategy."""
  get_strategy(strategy)  # TINYTUNE_TUNE=bem fails with the names it could be, before anything is recorded
  tuner = first_use_tuner(device, strategy)
  try: return tuner.tune_on_first_use(kernel)
  finally:
    if isinstance(tuner.on_result, ProgressLine): tuner.on_result.done()

