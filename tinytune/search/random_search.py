"""Random search: random valid opt sequences. The honest baseline for the other strategies."""
from __future__ import annotations

import random
from typing import Callable

from tinytune.codegen.kernel import Kernel
from tinytune.codegen.opts import Opt
from tinytune.search.evaluate import Evaluator, Result
from tinytune.search.space import actions
from tinytune.search.strategy import Budget, Option, SearchContext, SearchResult, finalize, tried

OPTIONS = dict(seed=Option("random seed (each worker of a study adds its number)", 0), max_len=Option("most opts in a candidate", 5, minimum=1),
               batch=Option("candidates drawn and measured together", 8, minimum=1))

STALE = 20  # batches' worth of draws in a row that found nothing new: the space is used up


def random_search(kernel: Kernel, ev: Evaluator, budget: Budget, default: tuple[Opt, ...], context: SearchContext, seed: int, max_len: int,
                  batch: int) -> SearchResult:
  rng = random.Random(seed + context.worker)
  drawn: list[tuple[Opt, ...]] = []  # candidates drawn, in order, not yet asked for
  seen, misses = {default, ()}, 0
  moves: dict[tuple[Opt, ...], list[Opt]] = {}  # each drawn prefix's valid next opts, worked out once (a TC matmul's take 14 ms)
  def draw(n: int) -> list[tuple[Opt, ...]]:
    """The next `n` new candidates (fewer once the space seems used up): a batch takes them, and until then the evaluator
    compiles them while the worker runs the batch before (on a GPU: a batch of 8 left 16 compile processes idle at its end)."""
    nonlocal misses
    while len(drawn) < n and misses < STALE * batch:
      opts: tuple[Opt, ...] = ()
      for _ in range(rng.randint(1, max_len)):
        if (valid := moves.get(opts)) is None: valid = moves[opts] = actions(ev.kernel_for(opts))
        if not valid: break
        opts += (rng.choice(valid),)
      if opts in seen: misses += 1
      else: seen.add(opts); drawn.append(opts); misses = 0
    return drawn[:n]
  def following(left: int) -> Callable[[list[Result]], list[tuple[Opt, ...]]]:
    return lambda so_far: draw(min(left, ev.in_flight))
  history: list[Result] = ev.evaluate([default, ()], following(budget.left(2)))  # the default first: the live speedup compares with it
  while (left := budget.left(tried(history))) and (candidates := draw(min(batch, left))):
    del drawn[:len(candidates)]
    history += ev.evaluate(candidates, following(left - len(candidates)))
  return finalize(ev, history, default)
