"""Study coordination: workers that share a study name and a database tune together. Each candidate is measured by the run that
claimed it first (Claims), the candidate budget is the whole study's (StudyBudget), and a worker reads back what another measured
instead of measuring it again (SharedEvaluator)."""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

from tinytune.codegen.kernel import KernelOptError
from tinytune.codegen.opts import Opt, opts_from_json, opts_to_json
from tinytune.results_db import CandidateRow, Database
from tinytune.search.evaluate import Evaluator, Following, Result, source_hash
from tinytune.search.strategy import Budget


def stored_result(c: CandidateRow) -> Result:
  return Result(tuple(opts_from_json(c.opts_json)), c.status, c.min_s, c.median_s, c.spread, c.compile_s, c.source_hash, c.error, stored=True)


@dataclass
class Claims:
  """One run's view of a study's claims on one kernel and device: each candidate is measured by the run that claimed it first."""
  db: Database
  study: str
  kernel_id: int
  device_id: int
  run_id: int
  patience_s: float = 60.0  # how long a run may record nothing while it holds claims before others measure them
  heard: dict[int, tuple[int, float]] = field(default_factory=dict)  # owner -> (its last candidate id, when we saw it change)

  def claim(self, source_hash: str) -> int: return self.db.claim(self.study, self.kernel_id, self.device_id, source_hash, self.run_id)
  def count(self) -> int: return self.db.claim_count(self.study, self.kernel_id, self.device_id)

  def alive(self, owner: int) -> bool:
    """Whether the run that holds a claim may still measure it: not ended, its process not gone (where it ran on this machine),
    and it recorded something within patience_s."""
    if (run := self.db.run(owner)) is None or run.outcome is not None: return False
    host, _, pid = run.worker.rpartition(":")
    if host == socket.gethostname() and pid.isdigit() and not _pid_alive(int(pid)): return False
    last, now = self.db.last_candidate_id(owner), time.monotonic()
    if self.heard.get(owner, (None,))[0] != last: self.heard[owner] = (last, now)
    return now - self.heard[owner][1] < self.patience_s

  def wait(self, source_hash: str, owner: int, deadline: float | None = None) -> Result | None:
    """The result the owning run records (or, if it is ours, recorded before it was killed) for this source; None if ours has
    none, if the owner ended, died or went quiet (the claim is then ours to measure), or once our `deadline` has passed."""
    while (row := self.db.claimed_result(owner, self.kernel_id, self.device_id, source_hash)) is None:
      if owner == self.run_id or (deadline is not None and time.monotonic() > deadline): return None
      if not self.alive(owner):
        if (row := self.db.claimed_result(owner, self.kernel_id, self.device_id, source_hash)) is not None: break  # recorded, then ended
        if self.db.take_claim(self.study, self.kernel_id, self.device_id, source_hash, owner, self.run_id): return None
        if (owner := self.claim(source_hash)) == self.run_id: return None  # another waiter took it and gave it up again
      time.sleep(0.05)
    return stored_result(row)


def _pid_alive(pid: int) -> bool:
  try: os.kill(pid, 0)
  except ProcessLookupError: return False
  except PermissionError: pass  # another user's process
  return True


@dataclass
class StudyBudget(Budget):
  """With `claims`, the candidate budget is the whole study's: what every worker measured (or is measuring) counts."""
  claims: Claims | None = None

  def left(self, tried: int) -> int:
    return super().left(tried if self.claims is None else max(tried, self.claims.count()))


@dataclass
class SharedEvaluator(Evaluator):
  """An Evaluator for workers sharing a study: a candidate whose source another worker claimed is read back once that worker
  records it, never measured twice, so every candidate of the study is recorded once. Without `claims`, a plain Evaluator.

  Claims are taken a few at a time, just before measuring them, and a worker waits for the others' claims only once it has
  measured all of its own: no worker waits while it holds a claim it has not measured, so workers cannot wait on each other."""
  claims: Claims | None = None

  def evaluate(self, candidates: Sequence[Sequence[Opt]], following: Following | None = None) -> list[Result]:
    if self.claims is None: return super().evaluate(candidates, following)
    todo = [tuple(c) for c in candidates]
    theirs: dict[str, tuple[int, list[tuple[Opt, ...]]]] = {}  # source hash -> (the run that measures it, our opts with that source)
    chunk = self.in_flight
    for start in range(0, len(todo), chunk):
      if self.past_deadline(): break
      mine = []
      for opts in todo[start:start + chunk]:
        if (digest := self._source(opts)) is None: continue  # known, invalid or measured here: nothing to claim
        if digest in theirs: theirs[digest][1].append(opts)
        elif (owner := self.claims.claim(digest)) == self.claims.run_id: mine.append(opts)
        else: theirs[digest] = (owner, [opts])
      super().evaluate(mine)
    for digest, (owner, same) in theirs.items():
      if (result := self.claims.wait(digest, owner, self.deadline)) is not None:
        self.known.update({opts_to_json(o): replace(result, opts=o) for o in same})
    return super().evaluate(todo)  # read back, or measured now where a claim became ours

  def _source(self, opts: tuple[Opt, ...]) -> str | None:
    if opts_to_json(opts) in self.known: return None
    try: digest = source_hash(self.render_source(self.kernel_for(opts)))
    except KernelOptError: return None
    return None if digest in self.by_source else digest
