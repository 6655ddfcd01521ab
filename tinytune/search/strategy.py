"""What every strategy shares: the budget, the result, choosing the winner by interleaved re-timing, the registry, the options each
strategy declares (checked here alone) and the context of the search a strategy serves."""
from __future__ import annotations

import importlib
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

from tinytune.codegen.kernel import Kernel
from tinytune.codegen.opts import Opt
from tinytune.helpers import env_count, env_int
from tinytune.search.evaluate import FINALISTS, Evaluator, Result, Timing


@dataclass
class Budget:
  """Stop after `candidates` candidates and/or `seconds` seconds; None means no limit on that count."""
  candidates: int | None = 200
  seconds: float | None = None
  started: float = field(default_factory=time.monotonic)
  # whether one more candidate, and then choosing the winner, still fit in the seconds: run_strategy asks its evaluator, which
  # predicts both from the candidates measured so far
  fits: Callable[[], bool] = lambda: True

  def deadline(self) -> float | None:
    """When the seconds end."""
    return None if self.seconds is None else self.started + self.seconds

  def left(self, tried: int) -> int:
    """How many more candidates may be tried (0 when out of time)."""
    if (deadline := self.deadline()) is not None and (time.monotonic() > deadline or not self.fits()): return 0
    return max(0, self.candidates - tried) if self.candidates is not None else 1 << 30


@dataclass
class SearchResult:
  best: tuple[Opt, ...]
  best_s: float
  default: tuple[Opt, ...]
  default_s: float
  history: list[Result]
  spread: float = 0.0  # of the winner's re-time
  repeats: int = 0  # runs in the winner's re-time (0: not re-timed)
  note: str = ""  # "noisy: ..." where the re-time could not be trusted: its speedup is not one

  @property
  def speedup(self) -> float: return self.default_s / self.best_s if self.best_s > 0 and not self.note else math.nan
  def errors(self) -> str:
    """The first error of each kind of failure (crashed, timeout, wrong, compile_error: not invalid opts), for the user to see."""
    first: dict[str, str] = {}
    for r in self.history:
      if r.status not in ("ok", "invalid"): first.setdefault(r.status, r.error)
    return "; ".join(f"{status}: {error}" if error else status for status, error in first.items())

  def counts(self) -> dict[str, int]:
    """Distinct candidates by status: kernels by source (a duplicate is run once), invalid ones (never compiled) by opts."""
    ret: dict[str, int] = {}
    seen: set[str] = set()
    for r in self.history:
      if (identity := r.opts_json if r.status == "invalid" else r.source_hash) in seen: continue
      seen.add(identity)
      ret[r.status] = ret.get(r.status, 0) + 1
    return ret


class Option(NamedTuple):
  """One option of a strategy, in the table the strategy module keeps as OPTIONS: what it means, its default (a value given as
  text is read as the default's type), the values it may take, and the environment variable first-use tuning reads it from."""
  help: str
  default: Any
  choices: tuple = ()
  minimum: float | None = None
  env: str = ""


@dataclass(frozen=True)
class SearchContext:
  """What a strategy may know of the search it serves, besides the kernel: where results are kept and under which run, the
  kernel's label in its program, and which worker of a study this is (optuna keeps its trials in the same database, in a study
  named from these; seeded strategies add the worker to their seed, so the workers of a study explore apart)."""
  db_url: str | None = None
  run_id: int | None = None
  workload: str = ""
  params: dict[str, Any] = field(default_factory=dict)
  label: str = ""
  device: str = ""
  device_hash: str = ""
  study: str | None = None
  worker: int = 0


Strategy = Callable[..., SearchResult]  # (kernel, evaluator, budget, default, context, **options) -> SearchResult

# name -> module:function, imported on first use so a missing optional dependency fails only when its strategy is chosen
STRATEGIES = {"beam": "tinytune.search.beam:beam_search", "random": "tinytune.search.random_search:random_search",
              "optuna": "tinytune.search.optuna_search:optuna_search"}


def get_strategy(name: str) -> Strategy:
  if name not in STRATEGIES: raise ValueError(f"unknown strategy {name!r}; available: {', '.join(STRATEGIES)}")
  module, fn = STRATEGIES[name].split(":")
  return getattr(importlib.import_module(module), fn)


def strategy_options(name: str) -> dict[str, Option]:
  """The options strategy `name` declares (its module's OPTIONS)."""
  get_strategy(name)
  return importlib.import_module(STRATEGIES[name].split(":")[0]).OPTIONS


def check_options(name: str, given: dict[str, Any]) -> dict[str, Any]:
  """`given` options of strategy `name`, checked against the table it declares: a value given as text (the command line's) is read
  as its default's type. An unknown key or a bad value is a ValueError that says what the strategy takes."""
  table = strategy_options(name)
  for key in given:
    if key not in table: raise ValueError(f"{name} has no option {key!r}; it takes {', '.join(table) or 'none'} (--option help lists them)")
  return {key: _option_value(name, key, table[key], value) for key, value in given.items()}


def _option_value(name: str, key: str, option: Option, value: Any) -> Any:
  kind = type(option.default)
  bad = f"{name} option {key}={value!r} is not"
  if isinstance(value, str) and kind is not str:
    try: value = kind(value)
    except ValueError: raise ValueError(f"{bad} {'a whole number' if kind is int else 'a number'}") from None
  if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else kind):
    raise ValueError(f"{bad} a {kind.__name__}")
  if kind is float and not math.isfinite(value): raise ValueError(f"{bad} a finite number")
  if option.choices and value not in option.choices: raise ValueError(f"{bad} one of {', '.join(map(str, option.choices))}")
  if option.minimum is not None and value < option.minimum: raise ValueError(f"{bad} at least {option.minimum}")
  return value


def env_options(name: str) -> dict[str, int]:
  """The options of strategy `name` set by environment variables (first-use tuning: tinygrad's BEAM=N is the beam's width); 0 or
  unset is the default."""
  return {key: n for key, option in strategy_options(name).items() if option.env and (n := env_count(option.env, 0))}


def options_help() -> str:
  """Every strategy's options, their defaults and meanings: `tinytune search --option help` prints it."""
  lines = []
  for name in STRATEGIES:
    lines.append(f"{name}:")
    for key, o in strategy_options(name).items():
      lines.append(f"  {key}={o.default}  {o.help}" + (f" (one of {', '.join(map(str, o.choices))})" if o.choices else ""))
  return "\n".join(lines)


TIE = 0.01  # finalists within 1% of the fastest are a tie: the default wins it, then the shortest opt list


NOISY_SPREAD = 0.75  # a re-time whose median is four times its fastest run was disturbed
NOISY_FAR = 2.5  # a re-time's speedup this many times off the search's own for the same two kernels was disturbed


def noisy(times: Sequence[Timing], searched: Sequence[float], winner: int) -> bool:
  """Whether re-times (beside the search's medians of the same candidates, inf where it has none) are too disturbed to give the
  speedup of candidate `winner` over the default (times[0]): it is far from the search's own speedup of the two (a load that
  slows both alike is no matter: they are interleaved), or either is spread wide. A default that stays the winner claims none.
  TINYTUNE_NOISE_CHECK=0 trusts every re-time (a machine always busy, as a shared CI runner, still stores what it finds)."""
  if winner == 0 or not env_int("TINYTUNE_NOISE_CHECK", 1, 0): return False
  if all(math.isfinite(s) and s > 0 for s in (searched[0], searched[winner])):
    moved = (times[winner].median / searched[winner]) / (times[0].median / searched[0])
    if not 1 / NOISY_FAR < moved < NOISY_FAR: return True
  return max(times[0].spread, times[winner].spread) > NOISY_SPREAD


def busy_note() -> str: return f"noisy: the machine was busy (load {os.getloadavg()[0]:.1f})"


def finalize(ev: Evaluator, history: list[Result], default: Sequence[Opt], finalists: int = FINALISTS) -> SearchResult:
  """Time the fastest few again beside the default, interleaved; the default wins unless something beats it by more than a tie.
  A re-time far from the search's own measurements, or spread wide, is measured once more; still so, the result says it is noisy."""
  default = tuple(default)
  best: dict[str, Result] = {}
  for r in sorted((r for r in history if r.status == "ok"), key=lambda r: r.time):
    best.setdefault(r.source_hash, r)
  top = [r.opts for r in list(best.values())[:finalists] if r.opts != default]
  entries, searched = [default, *top], {r.opts: r.time for r in history if r.status == "ok"}
  medians = [searched.get(opts, math.inf) for opts in entries]
  if not top and (mine := next((r for r in history if r.opts == default and r.status == "ok"), None)) is not None:
    return SearchResult(default, mine.time, default, mine.time, history, mine.spread)  # nothing beat it: its search timing is the figure
  st = time.monotonic()
  times = ev.retime(entries)
  result = choose(default, top, [t.median for t in times], history)
  # measured once more where the budget has room for it: the first re-time may have met a passing load
  if noisy(times, medians, entries.index(result.best)) and (ev.end is None or time.monotonic() + (time.monotonic() - st) < ev.end):
    times = ev.retime(entries)
    result = choose(default, top, [t.median for t in times], history)
  winner = entries.index(result.best)
  result.spread, result.repeats = times[winner].spread, times[winner].n
  result.note = busy_note() if noisy(times, medians, winner) else ""
  return result


def choose(default: tuple[Opt, ...], top: list[tuple[Opt, ...]], times: list[float], history: list[Result]) -> SearchResult:
  """The winner among the default (times[0]) and the finalists: the default, or else the shortest, of those tied with the fastest."""
  entries = [default, *top]
  tied = [i for i, t in enumerate(times) if t <= min(times) * (1 + TIE)]
  winner = 0 if 0 in tied else min(tied, key=lambda i: (len(entries[i]), times[i]))
  return SearchResult(entries[winner], times[winner], default, times[0], history)


def tried(history: list[Result]) -> int: return sum(r.status != "invalid" for r in history)


def run_strategy(name: str, kernel: Kernel, ev: Evaluator, budget: Budget, default: Sequence[Opt], context: SearchContext | None = None,
                 **options: Any) -> SearchResult:
  """Search `kernel` with strategy `name` and its options (checked; the table's defaults for those not given)."""
  options = {key: o.default for key, o in strategy_options(name).items()} | check_options(name, options)
  ev.deadline = ev.end = budget.deadline()  # candidates stop where those left and the finalists' re-time would end past it
  ev.budget_s = budget.seconds
  budget.fits = lambda: not ev.past_deadline()
  return get_strategy(name)(kernel, ev, budget, tuple(default), context or SearchContext(), **options)
