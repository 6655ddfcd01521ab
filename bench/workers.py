"""Distributed tuning throughput: one optuna study searched by 1, 2, 4 worker processes (`tinytune search --workers N`).

  python bench/workers.py [--size 256] [--budget 48] [--workers 1,2,4] [--db postgresql+psycopg://...]

Prints distinct candidates measured per second of wall time and the best time found. Each run uses a fresh SQLite file
(or, with --db, a new study name in that database), so nothing is a cache hit. Timing candidates side by side on one
machine shares its cores and memory bandwidth, so more workers measure faster but each measurement is a little noisier."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid

from sqlalchemy import text

from tinytune.results_db import Database


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--size", type=int, default=256)
  ap.add_argument("--budget", type=int, default=48)
  ap.add_argument("--workers", default="1,2,4")
  ap.add_argument("--db", default=None)
  args = ap.parse_args()
  print(f"matmul {args.size}, optuna, budget {args.budget}, {os.cpu_count()} cores")
  for n in map(int, args.workers.split(",")):
    url = args.db or f"sqlite:///{tempfile.mkdtemp()}/bench.db"
    study = f"bench-{uuid.uuid4().hex[:8]}"
    sizes = [x for p in "mnk" for x in ("-p", f"{p}={args.size}")]
    command = [sys.executable, "-m", "tinytune.cli", "search", "matmul", *sizes, "--strategy", "optuna", "--budget", str(args.budget),
               "--workers", str(n), "--oversubscribe", "--study", study, "--db", url, "--json", "--quiet", "--force"]
    st = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - st
    kernel = json.loads(out)["kernels"][0]
    with Database(url).session(write=False) as session:
      query = "SELECT count(*) FROM candidates JOIN runs ON runs.id = candidates.run_id WHERE runs.settings LIKE :s"
      measured = session.execute(text(query), {"s": f'%"{study}"%'}).scalar()
    print(f"{n} worker(s): {measured} candidates in {wall:5.1f} s = {measured / wall:5.2f} candidates/s, "
          f"best {kernel['tuned_ms']:.3f} ms (default {kernel['default_ms']:.3f} ms)")


if __name__ == "__main__":
  main()
