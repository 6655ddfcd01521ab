"""A progress line per kernel being tuned, on stderr: its name, candidates done of the budget, the best time so far."""
from __future__ import annotations

import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, TextIO

from tinytune.codegen.kernel import Kernel
from tinytune.helpers import env_int
from tinytune.search.evaluate import Result
from tinytune.search.strategy import SearchResult


@dataclass
class ProgressLine:
  """A Tuner's `on_result`: on a terminal the kernel's line is redrawn in place after every candidate; elsewhere (a log, a pipe)
  only its final line is written. `labels` maps kernel keys to names unique in their program (r_1024_1_1024#2); `done()` ends
  the line of the kernel being tuned (a new kernel's first result ends the previous one's too)."""
  strategy: str
  budget: int | None  # candidates per kernel, None where only time limits the search
  labels: dict[str, str] = field(default_factory=dict)
  stream: TextIO | None = None  # None: sys.stderr as it is when something is written (pytest's capsys swaps it)
  quiet: bool = False
  verbose: bool = field(default_factory=lambda: bool(env_int("TINYTUNE_PRINT_TUNING", 0, 0)))  # a line per candidate as it is measured
  key: str | None = None
  label: str = ""
  tried = failed = 0
  default_s = best_s = math.inf
  retimed = ""  # how the final figures were measured, once the search has re-timed them
  clock: Callable[[], float] = time.monotonic
  started = 0.0  # when the kernel's first result (its default's) came

  def __call__(self, kernel: Kernel, result: Result) -> None:
    if kernel.key != self.key:
      self.done()
      self.key, self.label = kernel.key, self.labels.get(kernel.key, kernel.name)
      self.tried = self.failed = 0
      self.default_s = self.best_s = math.inf
      self.retimed, self.started = "", self.clock()
    if self.tried == 0 and result.status == "ok": self.default_s = result.time  # the Tuner reports the default opts first
    self.tried += 1
    self.failed += result.status != "ok"
    if result.status == "ok": self.best_s = min(self.best_s, result.time)
    if self.verbose: self._write(("\r\x1b[K" if self._tty() else "") + self.candidate(result) + "\n")
    if self._tty(): self._write("\r" + self._fit(self.line()) + "\x1b[K")

  def candidate(self, result: Result) -> str:
    """One candidate as measured (--verbose, TINYTUNE_PRINT_TUNING=1): its opts, its time and its part of the best so far, or why it failed."""
    opts = " ".join(f"{o.op.name}:{o.axis}:{o.arg}" for o in result.opts) or "(none)"
    if result.status != "ok": return f"  {self.label} #{self.tried} {opts}: {result.status}" + (f" ({result.error})" if result.error else "")
    return f"  {self.label} #{self.tried} {opts}: {_ms(result.time)} ms, {100 * self.best_s / result.time:.3g}% of the best"

  def settle(self, kernel: Kernel, result: SearchResult) -> None:
    """The search of `kernel` ended: its final line shows the re-time's figures (those the tables and the cache keep), not the search's."""
    if kernel.key != self.key: return
    self.default_s, self.best_s = result.default_s, result.best_s
    objective = next((r.objective for r in result.history if r.status == "ok"), "median")
    how = f"re-timed: {objective} of {result.repeats}" if result.repeats else "nothing beat it: the search's timing"
    self.retimed = result.note or f"{how}, spread {result.spread:.0%}"

  def line(self, final: bool = False) -> str:
    done = f"{self.tried}/{self.budget}" if self.budget is not None and not final else str(self.tried)
    finite = math.isfinite(self.default_s + self.best_s) and not self.retimed.startswith("noisy")
    speedup = f" ({self.default_s / self.best_s:.2f}x the default {_ms(self.default_s)} ms)" if finite else ""
    failed = f", {self.failed} failed" if self.failed else ""
    how = f"; {self.retimed}" if final and self.retimed else ""
    left = ""
    if not final and self.budget is not None and self.tried > 1:  # at the pace so far; a search that stops gaining ends sooner
      left = f" (up to {(self.clock() - self.started) / (self.tried - 1) * max(self.budget - self.tried, 0):.0f} s more)"
    state = "tuned" if final else "tuning"
    return f"{state} {self.label} ({self.strategy}): {done} candidates{left}{failed}, best {_ms(self.best_s)} ms{speedup}{how}"

  def done(self) -> None:
    """Write the final line of the kernel being tuned, if any."""
    if self.key is None: return
    self._write(("\r" if self._tty() else "") + self.line(final=True) + ("\x1b[K" if self._tty() else "") + "\n")
    self.key = None

  def _out(self) -> TextIO: return self.stream or sys.stderr
  def _tty(self) -> bool: return not self.quiet and self._out().isatty()
  def _fit(self, text: str) -> str: return text[:max(20, shutil.get_terminal_size().columns - 1)]  # a wrapped line cannot be redrawn

  def _write(self, text: str) -> None:
    if self.quiet: return
    self._out().write(text)
    self._out().flush()


def _ms(seconds: float) -> str: return f"{seconds * 1e3:.3g}" if math.isfinite(seconds) else "-"
