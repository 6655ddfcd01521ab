"""The `tinytune` command."""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from tinytune.helpers import prod


def parse_params(pairs: list[str]) -> dict[str, int]:
  params = {}
  for p in pairs:
    key, sep, value = p.partition("=")
    if not sep or not value.lstrip("-").isdigit(): raise ValueError(f"bad parameter {p!r}: write KEY=INTEGER, e.g. -p n=512")
    params[key] = int(value)
  return params


def _ms(s: float | None) -> str: return f"{s * 1e3:.3f}" if s is not None and math.isfinite(s) else "-"


def cmd_search(args: argparse.Namespace) -> int:
  from rich.console import Console
  from rich.progress import Progress, TextColumn
  from rich.table import Table

  from tinytune.dtype import dtypes
  from tinytune.kernels import get_workload
  from tinytune.results_db import Database
  from tinytune.runtime import Device
  from tinytune.search.strategy import get_strategy
  from tinytune.search.tune import Tuner

  workload = get_workload(args.workload)
  params = workload.params(parse_params(args.param))
  device, dtype = Device.canonicalize(args.device), dtypes.from_any(args.dtype)
  get_strategy(args.strategy)  # fail early on a bad name or a missing optional dependency
  if args.budget is not None and args.budget < 1: raise ValueError("--budget needs at least 1 candidate")
  options: dict[str, Any] = {"width": args.beam_width} if args.strategy == "beam" else {"sampler": args.sampler} if args.strategy == "optuna" else {}
  if args.strategy == "optuna" and args.study: options["study_name"] = args.study
  console = Console(stderr=True, quiet=args.quiet or args.json)
  out, _ = workload.instantiate(params, dtype, device)
  db = Database(args.db)
  started = time.perf_counter()
  with Progress(TextColumn("{task.description}"), console=console, transient=True) as progress:
    task = progress.add_task("starting", total=None)
    state: dict[str, Any] = {}

    def on_result(kernel: Any, r: Any) -> None:
      s = state.setdefault(kernel.key, {"tried": 0, "failed": 0, "best": math.inf, "default": None})
      s["tried"] += 1
      s["failed"] += r.status != "ok"
      s["best"] = min(s["best"], r.time)
      if s["default"] is None and r.status == "ok": s["default"] = r.time
      speedup = f"{s['default'] / s['best']:.2f}x" if s["default"] and math.isfinite(s["best"]) else "-"
      progress.update(task, description=f"[bold]{kernel.name}[/] tried {s['tried']} failed {s['failed']} best {_ms(s['best'])} ms speedup {speedup}")

    tuner = Tuner(db, device, args.strategy, {"candidates": args.budget, "seconds": args.seconds}, options, args.resume, args.force, on_result)
    outcomes = tuner.tune_program(out.uop, workload.name, params)
  elapsed = time.perf_counter() - started
  cache_hit = all(o.cache_hit for o in outcomes)
  if args.json:
    print(json.dumps({"workload": workload.name, "params": params, "device": device, "fingerprint": tuner.device_hash, "strategy": args.strategy,
                      "cache_hit": cache_hit, "seconds": elapsed, "kernels": [o.to_json() for o in outcomes]}))
    return 0
  table = Table(title=f"{workload.name} {params} on {device} ({'cache hit' if cache_hit else f'{args.strategy} search, {elapsed:.1f} s'})")
  for col in ("kernel", "default ms", "tuned ms", "speedup", "candidates"): table.add_column(col)
  table.add_column("opts", no_wrap=True)
  for o in outcomes:
    counts = "cached" if o.cache_hit else " ".join(f"{k} {v}" for k, v in sorted(o.counts.items()))
    table.add_row(o.name, _ms(o.default_s), _ms(o.best_s), f"{o.speedup:.2f}x" if o.speedup else "-", counts, " ".join(map(repr, o.best)) or "none")
  Console(width=max(Console().width, 160)).print(table)
  return 0


def cmd_bench(args: argparse.Namespace) -> int:
  import statistics

  import numpy as np

  from tinytune import Device, Kernel
  from tinytune.kernels import get_workload
  from tinytune.realize import compile_kernel, kernel_opts
  from tinytune.schedule import create_schedule

  workload = get_workload(args.workload)
  params = workload.params(parse_params(args.param))
  device = Device.canonicalize(args.device)
  out, arrays = workload.instantiate(params, device=device)
  total = 0.0
  for item in create_schedule(out.uop, device)[0]:
    kernel = Kernel(item.ast, Device[device].caps)
    kernel.apply_opts(kernel_opts(kernel, device))
    program, _ = compile_kernel(kernel, device)
    program(item.out, *kernel.bufs)
    seconds = statistics.median(program(item.out, *kernel.bufs) for _ in range(args.repeats))
    total += seconds
    print(f"{kernel.name}: {seconds * 1e3:.3f} ms, {kernel.flops / seconds / 1e9:.1f} GFLOPS, {prod(kernel.out_shape)} outputs, opts {kernel.opts}")
  ok = np.allclose(out.numpy(), workload.reference(params, *arrays), rtol=1e-3, atol=1e-3)
  gflops = workload.flops(params) / total / 1e9
  print(f"{workload.name} {params}: {total * 1e3:.3f} ms, {gflops:.1f} GFLOPS, {'verified' if ok else 'WRONG'} against numpy")
  return 0 if ok else 1


def cmd_db(args: argparse.Namespace) -> int:
  from tinytune.results_db import HEAD, Database
  from tinytune.results_db.migrate import revision
  db = Database(args.db, check_schema=False)
  if args.action == "upgrade":
    before, after = db.upgrade()
    print(f"{db!r}: " + (f"schema revision {before} -> {after}" if before != after else f"already at schema revision {after}"))
  else:
    with db.engine.connect() as conn: rev = revision(conn)
    print(f"{db!r}: schema revision {rev or 'none (empty)'}; this tinytune uses {HEAD}")
  return 0


def add_db_parser(sub: Any) -> None:
  db = sub.add_parser("db", help="the results database's schema: `tinytune db upgrade` migrates a database made by an older tinytune")
  db.add_argument("action", choices=["upgrade", "version"], help="upgrade: migrate to this tinytune's schema; version: print the schema revision")
  db.add_argument("--db", default=None, help="SQLAlchemy URL (default: $TINYTUNE_DB or the SQLite file in the user cache)")


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="tinytune", description="A kernel generator and autotuner.")
  sub = ap.add_subparsers(dest="command", required=True)
  search = sub.add_parser("search", help="find the fastest opts for each kernel of a workload and store them in the tuning cache")
  search.add_argument("workload", help="matmul, conv2d, softmax, reduce")
  search.add_argument("-p", "--param", action="append", default=[], help="KEY=VALUE, e.g. -p m=1024 (see `tinytune search WORKLOAD -p help=1`)")
  search.add_argument("--device", default=None, help="device name (default: $TINYTUNE_DEVICE or CPU)")
  search.add_argument("--dtype", default="float32", help="float32 (default), float16, int32, ...")
  search.add_argument("--strategy", default="beam", help="beam (default), optuna, random")
  search.add_argument("--beam-width", type=int, default=4)
  search.add_argument("--sampler", default="tpe", help="optuna sampler: tpe (default), cmaes, gp")
  search.add_argument("--study", default=None, help="optuna study name: workers with the same name and --db share one study")
  search.add_argument("--budget", type=int, default=200, help="candidates per kernel (default 200)")
  search.add_argument("--seconds", type=float, default=None, help="time limit per kernel")
  search.add_argument("--db", default=None, help="SQLAlchemy URL of the results database (default: $TINYTUNE_DB or a SQLite file in the user cache)")
  search.add_argument("--resume", action="store_true", help="continue the last unfinished run with the same arguments")
  search.add_argument("--force", action="store_true", help="search even where the tuning cache has an entry")
  search.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
  search.add_argument("--quiet", action="store_true", help="no progress bar")
  bench = sub.add_parser("bench", help="run a workload with its tuned (or default) opts and print its time")
  bench.add_argument("workload", help="matmul, conv2d, softmax, reduce")
  bench.add_argument("-p", "--param", action="append", default=[], help="KEY=VALUE, e.g. -p m=1024")
  bench.add_argument("--device", default=None, help="device name (default: $TINYTUNE_DEVICE or CPU)")
  bench.add_argument("--repeats", type=int, default=10)
  add_db_parser(sub)
  add_cache_parser(sub)
  args = ap.parse_args(argv)
  try: return {"search": cmd_search, "bench": cmd_bench, "db": cmd_db, "cache": cmd_cache}[args.command](args)
  except (ValueError, TypeError, RuntimeError, LookupError) as e:
    print(f"tinytune: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print("tinytune: interrupted; what was measured is stored (continue with --resume)", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
