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


def _database_errors(command: Any) -> Any:
  """Database errors (unreachable server, locked or unreadable file) as one line, like every other error."""
  def run(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError
    try: return command(args)
    except SQLAlchemyError as e: raise RuntimeError(f"database error: {str(getattr(e, 'orig', None) or e).splitlines()[0]}") from e
  return run


@_database_errors
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
  if args.worker is not None and args.strategy in ("optuna", "random"): options["seed"] = args.worker  # workers of one study explore apart
  if args.workers < 1: raise ValueError("--workers needs at least 1")
  console = Console(stderr=True, quiet=args.quiet or args.json)
  out, _ = workload.instantiate(params, dtype, device)
  db = Database(args.db)
  started = time.perf_counter()
  if args.workers > 1 and args.force: Tuner(db, device).forget(out.uop)
  measured = _search_workers(args, console) if args.workers > 1 else None
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

    tuner = Tuner(db, device, args.strategy, {"candidates": args.budget, "seconds": args.seconds}, options, args.resume, args.force and not measured,
                  on_result, args.study, str(args.worker or 0))
    outcomes = tuner.tune_program(out.uop, workload.name, params)
  if measured is not None:  # the workers searched; what they left in the tuning cache is the result
    for o in outcomes: o.cache_hit, o.counts = False, measured.get(o.key, {})
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


def _search_workers(args: argparse.Namespace, console: Any) -> dict[str, dict[str, int]]:
  """`search --workers N`: N processes of this search share one study (and the database) and its budget.
  Returns the candidates they measured per kernel key."""
  import subprocess
  import uuid
  if args.study is None: args.study = f"workers-{uuid.uuid4().hex[:12]}"
  command = [sys.executable, "-m", "tinytune.cli", "search", args.workload, *[x for p in args.param for x in ("-p", p)], "--dtype", args.dtype,
             "--strategy", args.strategy, "--beam-width", str(args.beam_width), "--sampler", args.sampler, "--study", args.study,
             "--budget", str(args.budget), "--json", "--quiet"]
  command += (["--device", args.device] if args.device else []) + (["--seconds", str(args.seconds)] if args.seconds else [])
  command += (["--db", args.db] if args.db else []) + (["--resume"] if args.resume else []) + (["--force"] if args.force else [])
  console.print(f"{args.workers} workers searching {args.workload} together (study {args.study})")
  procs = [subprocess.Popen(command + ["--worker", str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(args.workers)]
  counts: dict[str, dict[str, int]] = {}
  for i, proc in enumerate(procs):
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
      lines = stderr.strip().splitlines() or [f"exit code {proc.returncode}"]
      why = next((x for x in lines if x.startswith("tinytune: error: ")), lines[-1]).removeprefix("tinytune: error: ")
      raise RuntimeError(f"worker {i} failed: {why}")
    for k in json.loads(stdout)["kernels"]:
      kernel_counts = counts.setdefault(k["key"], {})
      for status, n in k["candidates"].items(): kernel_counts[status] = kernel_counts.get(status, 0) + n
  return counts


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


@_database_errors
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


def _rerun(entry: Any, device: str) -> tuple[str, float | None]:
  """Build an entry's kernel from its workload, check its opts verify here and time them against the default: (verdict, speedup)."""
  from tinytune import Kernel
  from tinytune.codegen.opts import opts_from_json
  from tinytune.kernels import get_workload
  from tinytune.realize import default_opts
  from tinytune.runtime import Device
  from tinytune.schedule import create_schedule
  from tinytune.search.evaluate import Evaluator
  if not entry.workload: return "cannot re-run: no workload recorded", None
  workload = get_workload(entry.workload)
  out, _ = workload.instantiate(workload.params(json.loads(entry.params)), device=device)
  kernel = next((k for item in create_schedule(out.uop, device)[0] if (k := Kernel(item.ast, Device[device].caps)).key == entry.kernel_key), None)
  if kernel is None: return "cannot re-run: its workload no longer makes this kernel", None
  opts = tuple(opts_from_json(entry.opts))
  with Evaluator(kernel, device) as ev:
    if (result := ev.evaluate([opts])[0]).status != "ok": return f"FAILED: {result.status} {result.error}".strip(), None
    default_s, tuned_s = ev.retime([default_opts(kernel), opts])
  return ("ok" if tuned_s <= default_s * 1.05 else "SLOWER than the default"), default_s / tuned_s


@_database_errors
def cmd_cache(args: argparse.Namespace) -> int:
  from datetime import datetime, timezone

  from rich.console import Console
  from rich.table import Table

  from tinytune.codegen import CODEGEN_VERSION
  from tinytune.results_db import Database, fingerprint_hash
  from tinytune.results_db import cache as files
  from tinytune.runtime import Device
  from tinytune.search.tune import device_fingerprint

  named = args.device
  if args.action == "export" and named is not None:  # export --device takes a device name or a fingerprint hash
    try: Device.canonicalize(named)
    except ValueError: named = None
  device = Device.canonicalize(named)
  here = fingerprint_hash(device_fingerprint(device))
  before = datetime.fromisoformat(args.before).replace(tzinfo=timezone.utc) if getattr(args, "before", None) else None
  if args.action == "export":
    db = Database(args.db)
    if args.all: device_hash = None
    elif args.device is None or named is not None: device_hash = here
    elif len(match := [h for h in db.fingerprints() if h.startswith(args.device.lower())]) == 1: device_hash = match[0]
    else: raise ValueError(f"--device {args.device!r} is no device name and matches {len(match)} fingerprints in {db!r}; give more of the hash")
    out = files.export(db, args.out, device_hash, args.workload)
    print(f"wrote {out.path}: {len(out.entries)} entries for {len(out.devices)} device(s)")
  elif args.action == "import":
    stored, kept = files.import_file(Database(args.db), args.files[0], args.force)
    print(f"imported {stored} entries into the tuning cache; kept {kept} existing entries that were as fast or faster")
  elif args.action == "merge":
    if len(args.files) < 2 or args.out is None: raise ValueError("merge takes two or more files and --out FILE")
    out = files.merge(args.files, args.out)
    print(f"wrote {out.path}: {len(out.entries)} entries for {len(out.devices)} device(s)")
  elif args.action == "prune":
    if args.files:
      out, dropped = files.prune(files.CacheFile.open(args.files[0]), args.files[0], CODEGEN_VERSION, before)
      print(f"{out.path}: dropped {dropped} entries, kept {len(out.entries)}")
    else: print(f"dropped {Database(args.db).prune_tuned(CODEGEN_VERSION, before)} entries from the tuning cache")
  elif args.action == "verify":
    if not args.files: raise ValueError("verify takes a cache file")
    cache = files.CacheFile.open(args.files[0])
    m = cache.manifest
    print(f"{cache.path}: format {m['format_version']}, made by tinytune {m.get('tinytune_version')} at {m.get('created_at')}, checksum ok;\n"
          f"  {len(cache.entries)} entries for {len(cache.devices)} device(s), {len(cache.for_device(here))} for this device ({here[:12]})")
    if not args.run: return 0
    bad = 0
    for e in cache.for_device(here).values():
      verdict, speedup = _rerun(e, device)
      bad += not verdict.startswith("ok")
      print(f"  {e.kernel_name or e.kernel_key[:12]} {e.workload} {e.params}: {verdict}" + (f", {speedup:.2f}x the default" if speedup else ""))
    return 1 if bad else 0
  else:  # list
    entries = files.CacheFile.open(args.files[0]).entries if args.files else [files.Entry(
      t.kernel_key, t.device_hash, t.kernel_name, t.workload, t.params, t.opts_json, t.best_s, t.default_s, t.updated_at.isoformat())
      for t in Database(args.db, read_only=True).tuned_entries()]
    table = Table(title=f"tuning cache: {args.files[0] if args.files else 'the results database'} ({len(entries)} entries)")
    for col in ("kernel", "workload", "device", "tuned ms", "default ms", "speedup", "updated"): table.add_column(col)
    table.add_column("opts", no_wrap=True)
    for e in entries:
      table.add_row(e.kernel_name or e.kernel_key[:12], f"{e.workload} {e.params}", e.device_hash[:12] + (" (here)" if e.device_hash == here else ""),
                    _ms(e.best_s), _ms(e.default_s), f"{e.speedup:.2f}x" if e.speedup else "-", e.updated_at[:19], e.opts)
    Console(width=max(Console().width, 160)).print(table)
  return 0


def add_cache_parser(sub: Any) -> None:
  cache = sub.add_parser("cache", help="tuning cache files for deployments: export, import, merge, list, verify, prune")
  cache.add_argument("action", choices=["export", "import", "merge", "list", "verify", "prune"])
  cache.add_argument("files", nargs="*", help="cache file(s): import FILE, merge A B, list [FILE], verify FILE, prune [FILE] (else the database)")
  cache.add_argument("--out", default=None, help="export, merge: the file to write")
  cache.add_argument("--all", action="store_true", help="export: every device in the database")
  cache.add_argument("--workload", default=None, help="export: only kernels tuned for this workload")
  cache.add_argument("--device", default=None, help="the device here (default: $TINYTUNE_DEVICE or CPU); export: a name or fingerprint hash")
  cache.add_argument("--run", action="store_true", help="verify: re-run each entry for this device: it must verify and beat the default")
  cache.add_argument("--force", action="store_true", help="import: replace existing entries even where they are faster")
  cache.add_argument("--before", default=None,
                      help="prune: also drop entries updated before this date (YYYY-MM-DD); those of other codegen versions always go")
  cache.add_argument("--db", default=None, help="SQLAlchemy URL of the results database (default: $TINYTUNE_DB or the SQLite file in the user cache)")


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
  search.add_argument("--study", default=None, help="study name: searches with the same name and --db tune together, on one budget")
  search.add_argument("--workers", type=int, default=1, help="start N local worker processes sharing one study and its budget")
  search.add_argument("--worker", type=int, default=None, help="with --study: this process's number (its seed, and the run --resume continues)")
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
