"""optuna search: a fixed-dimension parametrization of the opts, searched by TPE (default), CMA-ES or GP.

Per global dim a log2 upcast amount, per reduce dim a log2 unroll amount, which dim is split across threads, and which
pair of global dims swaps loop order. Parameter sets that make an invalid kernel are told to optuna as failed trials.
With `storage` (any SQLAlchemy URL) the trials live in optuna's own tables, so several workers can share one study."""
from __future__ import annotations

import itertools
import math
import time
from typing import Any

from tinytune.codegen.kernel import Kernel, KernelOptError
from tinytune.codegen.opts import Opt, OptOps
from tinytune.search.evaluate import Evaluator, Result
from tinytune.search.strategy import Budget, SearchResult, finalize, tried


def _optuna() -> Any:
  try:
    import optuna
  except ImportError as e: raise RuntimeError("the optuna strategy needs optuna: pip install optuna") from e
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  return optuna


def _sampler(optuna: Any, name: str, seed: int, shared: bool) -> Any:
  # constant_liar: trials other workers are running count as bad guesses, so workers sharing a study spread out
  if name == "tpe": return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=shared)
  if name == "cmaes": return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
  if name == "gp":
    try: return optuna.samplers.GPSampler(seed=seed)
    except ImportError as e: raise RuntimeError(f"the GP sampler needs its extra dependencies ({e}): pip install torch scipy") from e
  raise ValueError(f"unknown optuna sampler {name!r}; use tpe, cmaes or gp")


def _storage(optuna: Any, url: str) -> Any:
  """optuna's RDB storage at `url`; on SQLite it waits for the write lock, as our own database does."""
  kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
  for attempt in range(3):
    try: return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except Exception:  # several workers creating optuna's tables at the same moment (PostgreSQL): the next try finds them
      if attempt == 2: raise
      time.sleep(0.5 * (attempt + 1))


def opts_from_params(kernel: Kernel, params: dict[str, int]) -> tuple[Opt, ...]:
  n = kernel.n_global
  pairs = list(itertools.combinations(range(n), 2))
  opts = [Opt(OptOps.UPCAST, d, 2 ** params[f"upcast{d}"]) for d in reversed(range(n)) if params[f"upcast{d}"]]
  opts += [Opt(OptOps.UNROLL, r, 2 ** params[f"unroll{r}"]) for r in range(kernel.n_reduce) if params[f"unroll{r}"]]
  if params["thread"] >= 0: opts.append(Opt(OptOps.THREAD, params["thread"], kernel.caps.threads))
  if params["swap"] >= 0: opts.append(Opt(OptOps.SWAP, *pairs[params["swap"]]))
  return tuple(opts)


def _suggest(trial: Any, kernel: Kernel) -> dict[str, int]:
  n, limit = kernel.n_global, int(math.log2(kernel.caps.max_upcast))
  params = {f"upcast{d}": trial.suggest_int(f"upcast{d}", 0, min(5, limit)) for d in range(n)}
  params.update({f"unroll{r}": trial.suggest_int(f"unroll{r}", 0, 3) for r in range(kernel.n_reduce)})
  params["thread"] = trial.suggest_int("thread", -1, n - 1) if kernel.caps.threads > 1 and n else -1
  params["swap"] = trial.suggest_int("swap", -1, n * (n - 1) // 2 - 1) if n > 1 else -1
  return params


def optuna_search(kernel: Kernel, ev: Evaluator, budget: Budget, default: tuple[Opt, ...], sampler: str = "tpe", seed: int = 0,
                  storage: str | None = None, study_name: str | None = None, batch: int = 4) -> SearchResult:
  optuna = _optuna()
  study = optuna.create_study(storage=_storage(optuna, storage) if storage else None, study_name=study_name, direction="minimize",
                              sampler=_sampler(optuna, sampler, seed, storage is not None), load_if_exists=study_name is not None)
  history: list[Result] = ev.evaluate([(), default])
  failed_in_a_row = 0
  while (left := budget.left(tried(history))) and failed_in_a_row < 200:
    trials, candidates = [], []
    for _ in range(min(batch, left)):
      trial = study.ask()
      opts = opts_from_params(kernel, _suggest(trial, kernel))
      try: ev.kernel_for(opts)
      except KernelOptError:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        failed_in_a_row += 1
        continue
      trials.append(trial); candidates.append(opts)
    results = ev.evaluate(candidates)
    for trial, r in itertools.zip_longest(trials, results):
      if r is None: study.tell(trial, state=optuna.trial.TrialState.PRUNED)  # the budget ran out before it ran
      elif r.status == "ok": study.tell(trial, r.time); failed_in_a_row = 0
      else: study.tell(trial, state=optuna.trial.TrialState.FAIL)
    history += results
  return finalize(ev, history, default)
