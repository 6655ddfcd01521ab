"""optuna search: a fixed set of parameters per kernel, searched by TPE (default), CMA-ES or GP.

The parameters are the opts' own amounts (search.space.parameter_space): each choice is valid by itself, and a point that breaks
a joint limit is pruned before compiling, so the budget goes to kernels that run. The objective is the median time in ms.
Where the search has a database (the context's URL), the trials live in optuna's own tables there, so several workers can share
one study, and optuna-dashboard can watch it live."""
from __future__ import annotations

import time
import warnings
from typing import Any

from tinytune.codegen.kernel import Kernel, KernelOptError
from tinytune.codegen.opts import Opt
from tinytune.helpers import warn_once
from tinytune.search.evaluate import Evaluator, Following, Result
from tinytune.search.space import opts_from_params, parameter_space
from tinytune.search.strategy import Budget, Option, SearchContext, SearchResult, finalize, tried

OPTIONS = dict(sampler=Option("optuna's sampler", "tpe", choices=("tpe", "cmaes", "gp")),
               seed=Option("the sampler's seed (each worker of a study adds its number)", 0),
               batch=Option("points asked for at a time", 4, minimum=1),
               patience=Option("trials in a row with nothing new to measure before it stops", 100, minimum=1))


def _optuna() -> Any:
  try:
    import optuna
  except ImportError as e: raise RuntimeError("the optuna strategy needs optuna: pip install optuna") from e
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  return optuna


def _sampler(optuna: Any, name: str, seed: int) -> Any:
  # constant_liar: trials asked for and not yet told (the rest of a batch, those asked ahead, other workers') count as bad guesses,
  # so they spread out
  if name == "tpe": return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
  if name == "cmaes": return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
  try: return optuna.samplers.GPSampler(seed=seed)  # gp: OPTIONS allows no other name
  except ImportError as e: raise RuntimeError(f"the GP sampler needs its extra dependencies ({e}): pip install torch scipy") from e


def _study(kernel: Kernel, default: tuple[Opt, ...], c: SearchContext) -> tuple[str, dict[str, Any]]:
  """The stored study's name and user attributes: named for the workload, kernel and device, and the run (a resumed run continues
  it), e.g. softmax-r_1024_1024-CPU-run4; a study of workers has their name and the device's fingerprint instead, so machines
  that differ never share one. Its attributes say what it tunes."""
  parts = list(dict.fromkeys([c.workload, c.label]))  # a kernel tuned on first use is its own workload
  name = "-".join([c.study, *parts, c.device, c.device_hash[:8]] if c.study else [*parts, c.device, f"run{c.run_id}"])
  attrs = {"workload": c.workload, "params": c.params, "kernel": c.label, "kernel_key": kernel.key, "device": c.device,
           "device_fingerprint": c.device_hash, "dtype": kernel.ast.dtype.name, "default_opts": " ".join(map(repr, default)) or "none",
           **({"study": c.study} if c.study else {"run": c.run_id})}
  return name, attrs


def _storage(optuna: Any, url: str) -> Any:
  """optuna's RDB storage at `url`; on SQLite it waits for the write lock, as our own database does."""
  kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
  for attempt in range(3):
    try: return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except Exception:  # several workers creating optuna's tables at the same moment (PostgreSQL): the next try finds them
      if attempt == 2: raise
      time.sleep(0.5 * (attempt + 1))


def optuna_search(kernel: Kernel, ev: Evaluator, budget: Budget, default: tuple[Opt, ...], context: SearchContext, sampler: str, seed: int,
                  batch: int, patience: int) -> SearchResult:
  """Ask optuna for `batch` points at a time and measure the new ones (on a device that compiles apart, the next ones are asked for
  while these run, and compiled meanwhile); stop at the budget, or after `patience` trials in a row that had nothing new to measure
  (pruned, or repeats of what was measured), which means the space is used up."""
  optuna = _optuna()
  space, storage = parameter_space(kernel), context.db_url
  study_name, study_attrs = _study(kernel, default, context) if storage else (None, {})
  study = optuna.create_study(storage=_storage(optuna, storage) if storage else None, study_name=study_name, direction="minimize",
                              sampler=_sampler(optuna, sampler, seed + context.worker), load_if_exists=storage is not None)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    study.set_metric_names(["ms"])
  for key, value in study_attrs.items(): study.set_user_attr(key, value)
  history: list[Result] = []
  measured: dict[tuple[Opt, ...], Result] = {}
  pending: list[tuple[Any, tuple[Opt, ...]]] = []  # trials asked for and not yet measured, valid ones
  idle = 0
  def ask(n: int) -> list[tuple[Opt, ...]]:
    """Ask until `n` trials are pending (a point that breaks a joint limit is pruned before compiling, and optuna learns to avoid it);
    the new opts among the first `n`."""
    nonlocal idle
    while len(pending) < n and idle < patience:
      trial = study.ask()
      opts = opts_from_params(kernel, {name: trial.suggest_categorical(name, choices) for name, choices in space.items()})
      trial.set_user_attr("opts", " ".join(map(repr, opts)) or "none")
      try: ev.kernel_for(opts)
      except KernelOptError as e:
        trial.set_user_attr("status", f"invalid: {e}")
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        history.append(Result(opts, "invalid", error=str(e)))
        idle += 1
        continue
      pending.append((trial, opts))
    return list(dict.fromkeys(opts for _, opts in pending[:n] if opts not in measured))
  def following(left: int) -> Following:
    """The trials after this batch, asked for now (constant_liar counts this batch's as bad guesses): the evaluator compiles them
    while the worker runs this batch (on a GPU: a batch of 4 left all but 4 compile processes idle, and those at its end)."""
    return lambda so_far: ask(min(left, ev.in_flight))
  first = ev.evaluate([default, ()], following(budget.left(2)))  # the default first: the live speedup compares with it, as the final table does
  if first and first[0].status == "ok": study.set_user_attr("default_ms", first[0].time * 1e3)
  history += first
  measured.update((r.opts, r) for r in first)
  sources = {r.source_hash for r in first}
  while (left := budget.left(tried(history))) and idle < patience:
    fresh = ask(n := min(batch, left))[:left]
    asked, pending[:] = pending[:n], pending[n:]
    results = ev.evaluate(fresh, following(left - len(fresh)))
    measured.update((r.opts, r) for r in results)
    new = any(r.source_hash not in sources for r in results if r.status != "invalid" and not r.stored)  # a kernel not measured before
    sources.update(r.source_hash for r in results)
    history += results
    idle = 0 if new else idle + len(asked)
    for trial, opts in asked:
      if (r := measured.get(opts)) is None:
        trial.set_user_attr("status", "not run: out of budget")
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        continue
      trial.set_user_attr("status", r.status)
      if r.status == "ok": study.tell(trial, r.time * 1e3)
      else:
        trial.set_user_attr("error", r.error[:200])
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
  for trial, _ in pending:  # asked ahead, and the budget ended first
    trial.set_user_attr("status", "not run: out of budget")
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
  if idle >= patience:
    study.set_user_attr("stopped", f"{patience} trials in a row had nothing new to measure")
    warn_once(f"optuna stopped searching {kernel.name} early: {patience} trials in a row had nothing new to measure")
  return finalize(ev, history, default)
