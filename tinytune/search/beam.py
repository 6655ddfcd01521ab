"""BEAM search: expand every entry of the beam by every valid opt, keep the `width` fastest, stop when the gain is small."""
from __future__ import annotations

from tinytune.codegen.kernel import Kernel
from tinytune.codegen.opts import Opt
from tinytune.search.evaluate import Evaluator, Result
from tinytune.search.space import actions
from tinytune.search.strategy import Budget, SearchResult, finalize, tried


def beam_search(kernel: Kernel, ev: Evaluator, budget: Budget, default: tuple[Opt, ...], width: int = 4, min_gain: float = 0.01) -> SearchResult:
  # start from the default and each of its prefixes, which often has more room to grow than the default itself; the
  # default goes first so slower starts are cut off early (the kernel with no opts is last: at large sizes it is very slow)
  history: list[Result] = ev.evaluate(list(dict.fromkeys([default, *(default[:i] for i in range(len(default) - 1, -1, -1))])))
  beam = sorted((r for r in history if r.status == "ok"), key=lambda r: r.time)[:width]
  best = beam[0].time if beam else float("inf")
  while beam and (left := budget.left(tried(history))):
    seen = {r.opts for r in history}
    candidates = list(dict.fromkeys(r.opts + (a,) for r in beam for a in actions(ev.kernel_for(r.opts)) if r.opts + (a,) not in seen))[:left]
    if not candidates: break
    results = ev.evaluate(candidates)
    history += results
    beam = sorted((r for r in results if r.status == "ok"), key=lambda r: r.time)
    beam = list({r.source_hash: r for r in reversed(beam)}.values())[::-1][:width]  # one entry per distinct kernel
    if not beam or beam[0].time > best * (1 - min_gain): break
    best = beam[0].time
  return finalize(ev, history, default)
