"""Distributed tuning: worker processes sharing one study and one results database, on SQLite and (with TINYTUNE_TEST_POSTGRES)
PostgreSQL. Every candidate is measured and recorded once, the tuning cache holds one best that every process reads back, and a
worker killed with SIGKILL resumes its own run."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import reset_postgres
from sqlalchemy import select

from tinytune.results_db import Candidate, Claim, Database, SearchRun
from tinytune.search.study import Claims

BACKENDS = ["sqlite"] + (["postgresql"] if os.getenv("TINYTUNE_TEST_POSTGRES") else [])
MATMUL = ["matmul", "-p", "m=32", "-p", "n=32", "-p", "k=32"]


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
  if request.param == "sqlite": return f"sqlite:///{tmp_path / 'shared.db'}"
  reset_postgres(os.environ["TINYTUNE_TEST_POSTGRES"])
  return os.environ["TINYTUNE_TEST_POSTGRES"]


def search(*args: str, url: str) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-m", "tinytune.cli", "search", *MATMUL, "--strategy", "optuna", "--db", url, "--json", "--quiet", *args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> dict:
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err
  return json.loads(out)


def study_rows(db: Database) -> tuple[list[SearchRun], list[Candidate], list[Claim]]:
  with db.session(write=False) as session:
    return list(session.scalars(select(SearchRun))), list(session.scalars(select(Candidate))), list(session.scalars(select(Claim)))


def test_workers_tune_one_kernel_together(url: str) -> None:
  out = finish(search("--budget", "10", "--workers", "2", "--oversubscribe", url=url))
  db = Database(url)
  runs, candidates, claims = study_rows(db)
  assert len(runs) == 2 and all(r.outcome == "done" for r in runs) and len({r.worker for r in runs}) == 2
  assert len({json.loads(r.settings)["study"] for r in runs}) == 1
  sources = [c.source_hash for c in candidates]
  assert len(sources) == len(set(sources)) >= 4  # every candidate measured and recorded once, across both workers
  assert {c.source_hash for c in claims} == set(sources) and len({c.run_id for c in candidates}) == 2  # both workers measured
  assert sum(out["kernels"][0]["candidates"].values()) == len(candidates)
  best = db.tuned(out["kernels"][0]["key"], out["fingerprint"])
  assert best is not None and json.loads(best.opts_json) == out["kernels"][0]["opts"]
  again = finish(search("--budget", "10", url=url))  # whoever asks later gets the same best, from the cache
  assert again["cache_hit"] and again["kernels"][0]["opts"] == out["kernels"][0]["opts"]


def test_killed_worker_resumes_its_run(tmp_path: Path) -> None:
  url = f"sqlite:///{tmp_path / 'killed.db'}"
  args = ("--budget", "10", "--study", "s", "--worker", "0")
  first = search(*args, url=url)
  deadline = time.time() + 120
  while time.time() < deadline:
    time.sleep(0.3)
    if Path(tmp_path / "killed.db").exists() and len(Database(url).run_candidates(1)) >= 3: break
  first.send_signal(signal.SIGKILL)
  first.wait()
  before = Database(url).run_candidates(1)
  assert len(before) >= 3 and Database(url).run(1).outcome is None  # type: ignore[union-attr]
  resumed, other = search(*args, "--resume", url=url), search("--budget", "10", "--study", "s", "--worker", "1", url=url)
  finish(resumed), finish(other)
  db = Database(url)
  runs, candidates, _ = study_rows(db)
  assert sorted(r.id for r in runs) == [1, 2] and all(r.outcome == "done" for r in runs)  # the killed run went on; one other run
  assert next(r for r in runs if r.id == 1).worker.endswith(f":{resumed.pid}")  # else the other takes its claims
  assert db.run_candidates(1)[:len(before)] == before
  sources = [c.source_hash for c in candidates]
  assert len(sources) == len(set(sources))


def test_a_claim_recorded_just_before_its_owner_ended_is_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  """The owner records the candidate and ends its run between the waiter's look for a result and its look at the owner: the
  waiter reads the result back rather than taking the claim and measuring it a second time."""
  db = Database(f"sqlite:///{tmp_path / 'race.db'}")
  device = db.device_id({"device": "CPU"})
  kernel = db.kernel_id("key", "k", "ast", [4], ["float32"], 4, 16)
  owner, waiter = (db.start_run("matmul", {}, device, "beam", {}, {}, "sig") for _ in range(2))
  db.claim("s", kernel, device, "src", owner)
  looks = []
  def first_look_misses(*args: object) -> object:
    looks.append(args)
    if len(looks) == 1:  # the owner records and ends right after the waiter's first look
      db.record_candidate(owner, kernel, device, "[]", "src", 0.0, "ok", 1e-3, 1e-3, 0.0)
      db.finish_run(owner, "done")
      return None
    return Database.claimed_result(db, *args)  # type: ignore[arg-type]
  monkeypatch.setattr(db, "claimed_result", first_look_misses)
  result = Claims(db, "s", kernel, device, waiter).wait("src", owner)
  assert result is not None and result.median_s == 1e-3
  assert db.claim("s", kernel, device, "src", waiter) == owner  # the claim stayed the owner's


def test_beam_workers_do_not_wait_on_each_other(url: str) -> None:
  st = time.monotonic()
  finish(search("--strategy", "beam", "--budget", "24", "--workers", "2", "--oversubscribe", url=url))  # beam claims batches of dozens
  assert time.monotonic() - st < 100  # each once waited a minute per candidate the other had claimed
  _, candidates, _ = study_rows(Database(url))
  sources = [c.source_hash for c in candidates]
  assert len(sources) == len(set(sources)) >= 10


def test_searches_of_one_study_survive_a_kill(url: str) -> None:
  """4 searches of one study, the first to record a candidate killed with SIGKILL then: the other 3 race to take over what it had
  claimed (each claim goes to one of them) and finish within 1.5x their budget, every candidate is measured once, and what the
  killed one recorded stays."""
  n, seconds, start = 4, 12, time.monotonic()  # 4 processes starting at once on a loaded machine: setup takes seconds of the budget
  procs = [search("--strategy", "beam", "--seconds", str(seconds), "--study", "k", "--worker", str(i), url=url) for i in range(n)]
  by_pid = {p.pid: p for p in procs}
  victim: SearchRun | None = None
  while victim is None:
    assert time.monotonic() - start < 60, "no search recorded a candidate in a minute"
    time.sleep(0.1)
    with contextlib.suppress(Exception):  # the database may not be made yet
      db = Database(url)
      victim = next((r for r in study_rows(db)[0] if db.run_candidates(r.id) and by_pid[int(r.worker.rpartition(":")[2])].poll() is None), None)
  killed = by_pid[int(victim.worker.rpartition(":")[2])]
  killed.send_signal(signal.SIGKILL)
  killed.wait()
  before = Database(url).run_candidates(victim.id)
  outs = [finish(p) for p in procs if p is not killed]
  assert all(o["elapsed_ms"] <= 1.5 * seconds * 1e3 for o in outs), [o["elapsed_ms"] for o in outs]
  runs, candidates, _ = study_rows(Database(url))
  assert Database(url).run_candidates(victim.id) == before and len(runs) == n  # nothing the killed search recorded is lost
  assert sorted(r.outcome or "killed" for r in runs) == ["done"] * (n - 1) + ["killed"]
  sources = [c.source_hash for c in candidates]
  assert len(sources) == len(set(sources))  # measured once, across all of them
