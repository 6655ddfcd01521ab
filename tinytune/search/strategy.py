"""What every strategy shares: the budget, the result, and choosing the winner by interleaved re-timing."""
from __future__ import annotations

import importlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from tinytune.codegen.kernel import Kernel
from tinytune.codegen.opts import Opt
from tinytune.search.evaluate import Evaluator, Result


@dataclass
class Budget:
  """Stop after `candidates` candidates and/or `seconds` seconds; None means no limit on that count."""
  candidates: int | None = 200
  seconds: float | None = None
  started: float = field(default_factory=time.monotonic)

  def deadline(self) -> float | None:
    """When evaluation stops starting candidates: at 90% of the seconds, so choosing the winner fits in the rest."""
    return None if self.seconds is None else self.started + 0.9 * self.seconds

  def left(self, tried: int) -> int:
    """How many more candidates may be tried (0 when out of time)."""
    if (deadline := self.deadline()) is not None and time.monotonic() > deadline: return 0
    return max(0, self.candidates - tried) if self.candidates is not None else 1 << 30


@dataclass
class SearchResult:
  best: tuple[Opt, ...]
  best_s: float
  default: tuple[Opt, ...]
  default_s: float
  history: list[Result]

  @property
  def speedup(self) -> float: return self.default_s / self.best_s if self.best_s > 0 else math.nan
  def counts(self) -> dict[str, int]:
    """Distinct candidates by status: kernels by source (a duplicate is run once), invalid ones (never compiled) by opts."""
    ret: dict[str, int] = {}
    seen: set[str] = set()
    for r in self.history:
      if (identity := r.opts_json if r.status == "invalid" else r.source_hash) in seen: continue
      seen.add(identity)
      ret[r.status] = ret.get(r.status, 0) + 1
    return ret


Strategy = Callable[..., SearchResult]  # (kernel, evaluator, budget, default, **options) -> SearchResult

# name -> module:function, imported on first use so a missing optional dependency fails only when its strategy is chosen
STRATEGIES = {"beam": "tinytune.search.beam:beam_search", "random": "tinytune.search.random_search:random_search",
              "optuna": "tinytune.search.optuna_search:optuna_search"}


def get_strategy(name: str) -> Strategy:
  if name not in STRATEGIES: raise ValueError(f"unknown strategy {name!r}; available: {', '.join(STRATEGIES)}")
  module, fn = STRATEGIES[name].split(":")
  return getattr(importlib.import_module(module), fn)


TIE = 0.01  # finalists within 1% of the fastest are a tie: the default wins it, then the shortest opt list


def finalize(ev: Evaluator, history: list[Result], default: Sequence[Opt], finalists: int = 3) -> SearchResult:
  """Time the fastest few again beside the default, interleaved; the default wins unless something beats it by more than a tie."""
  default = tuple(default)
  best: dict[str, Result] = {}
  for r in sorted((r for r in history if r.status == "ok"), key=lambda r: r.time):
    best.setdefault(r.source_hash, r)
  top = [r.opts for r in list(best.values())[:finalists] if r.opts != default]
  return choose(default, top, ev.retime([default, *top]), history)


def choose(default: tuple[Opt, ...], top: list[tuple[Opt, ...]], times: list[float], history: list[Result]) -> SearchResult:
  """The winner among the default (times[0]) and the finalists: the default, or else the shortest, of those tied with the fastest."""
  entries = [default, *top]
  tied = [i for i, t in enumerate(times) if t <= min(times) * (1 + TIE)]
  winner = 0 if 0 in tied else min(tied, key=lambda i: (len(entries[i]), times[i]))
  return SearchResult(entries[winner], times[winner], default, times[0], history)


def tried(history: list[Result]) -> int: return sum(r.status != "invalid" for r in history)


def run_strategy(name: str, kernel: Kernel, ev: Evaluator, budget: Budget, default: Sequence[Opt], **options: Any) -> SearchResult:
  ev.deadline, ev.end = budget.deadline(), None if budget.seconds is None else budget.started + budget.seconds
  return get_strategy(name)(kernel, ev, budget, tuple(default), **options)
