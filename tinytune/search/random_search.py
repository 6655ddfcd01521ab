"""Random search: random valid opt sequences. The honest baseline for the other strategies."""
from __future__ import annotations

import random

from tinytune.codegen.kernel import Kernel
from tinytune.codegen.opts import Opt
from tinytune.search.evaluate import Evaluator, Result
from tinytune.search.space import actions
from tinytune.search.strategy import Budget, SearchResult, finalize, tried


def random_search(kernel: Kernel, ev: Evaluator, budget: Budget, default: tuple[Opt, ...], seed: int = 0, max_len: int = 5,
                  batch: int = 8) -> SearchResult:
  rng = random.Random(seed)
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
