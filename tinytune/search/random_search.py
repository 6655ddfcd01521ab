"""Random search: random valid opt sequences. The honest baseline for the other strategies."""
from __future__ import annotations

import random

from tinytune.codegen.kernel import Kernel
from tinytune.codegen.opts import Opt
from tinytune.search.evaluate import Evaluator, Result
from tinytune.search.space import actions
from tinytune.search.strategy import Budget, Option, SearchContext, SearchResult, finalize, tried

OPTIONS = dict(seed=Option("random seed (each worker of a study adds its number)", 0), max_len=Option("most opts in a candidate", 5, minimum=1),
               batch=Option("candidates drawn and measured together", 8, minimum=1))


def random_search(kernel: Kernel, ev: Evaluator, budget: Budget, default: tuple[Opt, ...], context: SearchContext, seed: int, max_len: int,
                  batch: int) -> SearchResult:
  rng = random.Random(seed + context.worker)
  history: list[Result] = ev.evaluate([default, ()])  # the default first: the live speedup compares with it
  stale = 0
  while (left := budget.left(tried(history))) and stale < 20:
    seen, candidates = {r.opts for r in history}, []
    for _ in range(min(batch, left)):
      opts: tuple[Opt, ...] = ()
      for _ in range(rng.randint(1, max_len)):
        if not (valid := actions(ev.kernel_for(opts))): break
        opts += (rng.choice(valid),)
      if opts not in seen: seen.add(opts); candidates.append(opts)
    stale = stale + 1 if not candidates else 0
    history += ev.evaluate(candidates)
  return finalize(ev, history, default)
