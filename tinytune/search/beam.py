"""BEAM search: expand every entry of the beam by every valid opt, keep the `width` fastest; when a round gains little, stop, or
with a budget in seconds, go on from the fastest kernels not expanded yet (runners-up of earlier rounds) until the time is up."""
from __future__ import annotations

from typing import Iterable

from tinytune.codegen.heuristic import alternative_opts
from tinytune.codegen.kernel import Kernel, KernelOptError
from tinytune.codegen.opts import Opt
from tinytune.search.evaluate import Evaluator, Following, Result
from tinytune.search.space import actions
from tinytune.search.strategy import Budget, Option, SearchContext, SearchResult, finalize, tried

OPTIONS = dict(width=Option("how many of the fastest kernels each round expands (first-use tuning: $BEAM)", 4, minimum=1, env="BEAM"),
               min_gain=Option("a round that gains less than this fraction ends a search by candidates", 0.01, minimum=0.0))


def beam_search(kernel: Kernel, ev: Evaluator, budget: Budget, default: tuple[Opt, ...], context: SearchContext, width: int,
                min_gain: float) -> SearchResult:
  # start from the default and each of its prefixes, which often has more room to grow than the default itself, and the plans
  # the heuristics hold in reserve; the default goes first so slower starts are cut off early (the kernel with no opts is last:
  # at large sizes it is very slow)
  starts = [default, *(tuple(opts) for opts in alternative_opts(kernel)), *(default[:i] for i in range(len(default) - 1, -1, -1))]
  moves: dict[tuple[Opt, ...], list[Opt]] = {}  # each kernel's valid next opts, worked out once (a TC matmul's took 26 ms)
  def expand(beam: list[tuple[Opt, ...]], seen: set[tuple[Opt, ...]]) -> list[tuple[Opt, ...]]:
    for opts in beam:
      if opts in moves: continue
      try: moves[opts] = actions(ev.kernel_for(opts))
      except KernelOptError: moves[opts] = []  # a start not measured yet may be invalid
    return list(dict.fromkeys(opts + (a,) for opts in beam for a in moves[opts] if opts + (a,) not in seen))
  expanded: set[str] = set()  # the kernels (by source) whose every next opt was tried
  def following(asked: list[tuple[Opt, ...]]) -> Following:
    """The round likely to come after this one, from its results so far (before any, from the first it asked for: the default leads
    the starts): compiled while the worker runs this one's last candidates."""
    seen = {r.opts for r in history} | set(asked)  # fixed for the round: not rebuilt at each of its results
    def likely(so_far: list[Result]) -> list[tuple[Opt, ...]]:
      beam = [r.opts for r in fastest(history + so_far, width, expanded)] or asked[:width]
      return expand(beam, seen)
    return likely
  history: list[Result] = []
  history = ev.evaluate(starts := list(dict.fromkeys(starts)), following(starts))
  beam = fastest(history, width, expanded)
  best = beam[0].time if beam else float("inf")
  while beam and (left := budget.left(tried(history))):
    candidates = expand([r.opts for r in beam], {r.opts for r in history})[:left]
    expanded |= {r.source_hash for r in beam}
    history += (results := ev.evaluate(candidates, following(candidates)))
    beam = fastest(results, width, expanded)
    if beam and beam[0].time <= best * (1 - min_gain): best = beam[0].time
    elif budget.seconds is None: break  # a budget of candidates only: stop at the first round that gains little, as always
    else: beam = fastest(history, width, expanded)  # time is left: restart from the fastest kernels not expanded yet
  return finalize(ev, history, default)


def fastest(results: Iterable[Result], width: int, expanded: set[str]) -> list[Result]:
  """The `width` fastest kernels that ran, one entry per distinct kernel, leaving out those already expanded."""
  ok = sorted((r for r in results if r.status == "ok" and r.source_hash not in expanded), key=lambda r: r.time)
  return list({r.source_hash: r for r in reversed(ok)}.values())[::-1][:width]
