"""The `tinytune` command."""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import sys
import time
from typing import Any


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


def _against(text: str) -> list[str]:
  """--against torch,numpy -> the baselines that can run here; a missing PyTorch costs a one-line note, not the command."""
  from tinytune.kernels.baselines import TORCH_MISSING
  libs = [x.strip() for x in text.split(",") if x.strip()]
  if bad := [x for x in libs if x not in ("torch", "numpy")]: raise ValueError(f"unknown baseline {', '.join(bad)}; --against takes torch, numpy")
  if "torch" in libs and importlib.util.find_spec("torch") is None:
    print(f"tinytune: note: {TORCH_MISSING}; its column stays empty", file=sys.stderr)
    libs.remove("torch")
  return libs


def _roof(gflops: float, gbs: float, peaks: tuple[float, float] | None) -> float | None:
  """Percent of what the roofline allows at this arithmetic intensity: min(peak GFLOPS, intensity * peak GB/s)."""
  if peaks is None or not gbs: return None
  return 100 * gflops / min(peaks[0], gflops / gbs * peaks[1])


def _write(text: str, out: str | None) -> None:
  if out is None:
    sys.stdout.write(text)
    return
  try:
    with open(out, "w") as f: f.write(text)
  except OSError as e: raise RuntimeError(f"cannot write {out}: {e.strerror or e}") from None
  print(f"tinytune: wrote {out}", file=sys.stderr)


def _check_format(fmt: str) -> None:
  from tinytune.reports import FORMATS
  if fmt not in FORMATS: raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")


def cmd_bench(args: argparse.Namespace) -> int:
  import numpy as np
  import pandas as pd

  from tinytune.kernels import get_workload
  from tinytune.kernels.baselines import measure, store
  from tinytune.kernels.peaks import device_peaks
  from tinytune.reports import params_label, render
  from tinytune.results_db import Database
  from tinytune.runtime import Device
  from tinytune.search.evaluate import TimingPolicy
  from tinytune.search.tune import device_fingerprint

  _check_format(args.format)
  workload = get_workload(args.workload)
  params = workload.params(parse_params(args.param))
  device = Device.canonicalize(args.device)
  libs = ["tinytune-default", "tinytune-tuned", *_against(args.against)]
  db = Database(args.db)
  peaks = device_peaks(db, device, device_fingerprint(device), measure=not args.no_peak)
  timings = measure(workload, params, device, libs, TimingPolicy(max_repeats=args.repeats), db)
  ref = workload.reference(params, *workload.arrays(params))
  flops, nbytes, tuned_s = workload.flops(params), workload.nbytes(params), timings["tinytune-tuned"].median_s
  rows, ok = [], True
  for lib, t in timings.items():
    if lib.startswith("tinytune") and (t.output is None or not np.allclose(t.output, ref, rtol=1e-3, atol=1e-3)): ok = False
    if not args.no_store: store(db, workload, params, device, t)
    gflops, gbs = flops / t.median_s / 1e9, nbytes / t.median_s / 1e9
    rows.append({"implementation": lib, "version": t.version, "ms": t.median_s * 1e3, "min ms": t.min_s * 1e3, "GFLOPS": gflops, "GB/s": gbs,
                 "% of roof": _roof(gflops, gbs, peaks), "tuned is faster by": t.median_s / tuned_s, "note": t.note})
  roof = f" (roof {peaks[0]:.0f} GFLOPS, {peaks[1]:.1f} GB/s)" if peaks else ""
  title = f"{workload.name} {params_label(params, workload.name)} on {device}{roof}"
  kernels = f"the kernels of {workload.name} as tuned (each run in turn per call)"
  _write(render({title: pd.DataFrame(rows), kernels: pd.DataFrame(timings["tinytune-tuned"].kernels)}, args.format), None)
  if not ok: print(f"tinytune: error: {workload.name}: tinytune's output differs from NumPy's", file=sys.stderr)
  return 0 if ok else 1


def _sweep(specs: list[str], workload: Any) -> list[dict[str, int]]:
  """--sweep n=256,512 (repeatable: a grid) -> parameter overrides, one per size."""
  if not specs: raise ValueError("compare needs --sweep KEY=V1,V2,..., e.g. --sweep n=256,512")
  axes = []
  for spec in specs:
    key, sep, values = spec.partition("=")
    items = values.split(",")
    if not sep or not key or not all(v.strip().isdigit() for v in items):
      raise ValueError(f"bad --sweep {spec!r}: write KEY=V1,V2,..., e.g. n=256,512")
    axes.append([(key, int(v)) for v in items])
  points = [dict(p) for p in itertools.product(*axes)]
  for p in points: workload.params(p)  # unknown keys fail here, before anything is timed
  return points


def cmd_compare(args: argparse.Namespace) -> int:
  import pandas as pd

  from tinytune.kernels import get_workload
  from tinytune.kernels.baselines import measure, store
  from tinytune.reports import params_label, render
  from tinytune.results_db import Database
  from tinytune.runtime import Device
  from tinytune.search.evaluate import TimingPolicy
  from tinytune.search.tune import Tuner

  _check_format(args.format)
  workload = get_workload(args.workload)
  base = parse_params(args.param)
  points = _sweep(args.sweep, workload)
  device = Device.canonicalize(args.device)
  against = _against(args.against)
  db = Database(args.db)
  rows = []
  for point in points:
    params = workload.params({**base, **point})
    if args.tune:
      out, _ = workload.instantiate(params, device=device)
      Tuner(db, device, args.strategy, {"candidates": args.budget, "seconds": None}).tune_program(out.uop, workload.name, params)
    timings = measure(workload, params, device, ["tinytune-default", "tinytune-tuned", *against], TimingPolicy(max_repeats=args.repeats), db)
    if not args.no_store:
      for t in timings.values(): store(db, workload, params, device, t)
    tuned = timings["tinytune-tuned"].median_s
    row: dict[str, Any] = {"params": params_label(params, workload.name), "GFLOPS tuned": workload.flops(params) / tuned / 1e9}
    row.update({f"{lib.removeprefix('tinytune-')} ms": t.median_s * 1e3 for lib, t in timings.items()})
    row["tuned vs default"] = timings["tinytune-default"].median_s / tuned
    row.update({f"{lib} / tuned": timings[lib].median_s / tuned for lib in against})
    row["note"] = timings["tinytune-tuned"].note
    rows.append(row)
  title = f"{workload.name} on {device}: ratios above 1 mean tinytune's tuned kernels are faster"
  _write(render({title: pd.DataFrame(rows)}, args.format), None)
  return 0


def cmd_report(args: argparse.Namespace) -> int:
  from tinytune.kernels import get_workload
  from tinytune.reports import render, report_frames
  from tinytune.results_db import Database

  _check_format(args.format)
  if args.workload: get_workload(args.workload)
  frames = report_frames(Database(args.db), args.workload, args.device)
  if args.table:
    if unknown := [t for t in args.table if t not in frames]: raise ValueError(f"unknown table {', '.join(unknown)}; tables: {', '.join(frames)}")
    frames = {t: frames[t] for t in args.table}
  title = "tinytune report" + (f": {args.workload}" if args.workload else "") + (f" on {args.device}" if args.device else "")
  _write(render(frames, args.format, title), args.out)
  return 0


def cmd_devices(args: argparse.Namespace) -> int:
  import pandas as pd

  from tinytune.kernels.peaks import measure_peaks
  from tinytune.reports import render
  from tinytune.results_db import Database, fingerprint_hash
  from tinytune.runtime import _BACKENDS, Device
  from tinytune.search.tune import device_fingerprint

  _check_format(args.format)
  rows = []
  db = Database(args.db) if args.probe else None
  for name in _BACKENDS:
    try:
      fp, caps = device_fingerprint(name), Device[name].caps
      rows.append({"device": name, "present": "yes", "name": fp.get("name", ""), "fingerprint": fingerprint_hash(fp)[:16], "threads": caps.threads,
                   "compiler": fp.get("compiler_version", ""), "missing": ""})
      if db is not None:
        gflops, gbs, how = measure_peaks(name)
        db.set_peak(db.device_id(fp), gflops, gbs, how)
        rows[-1].update({"peak GFLOPS": gflops, "peak GB/s": gbs})
    except Exception as e:  # a device that is not here says what it needs
      rows.append({"device": name, "present": "no", "name": "", "fingerprint": "", "threads": None, "compiler": "",
                   "missing": str(e).splitlines()[0] if str(e) else type(e).__name__})
  _write(render({"devices": pd.DataFrame(rows)}, args.format), None)
  return 0


def cmd_kernels(args: argparse.Namespace) -> int:
  import pandas as pd

  from tinytune.kernels import WORKLOADS
  from tinytune.reports import render

  _check_format(args.format)
  rows = [{"workload": w.name, "parameters (defaults)": " ".join(f"{k}={v}" for k, v in w.defaults.items()),
           "GFLOP at defaults": w.flops(w.defaults) / 1e9, "torch": "yes" if w.torch else "no",
           "description": w.doc + "".join(f"; {k}: {v}" for k, v in w.help.items())} for w in WORKLOADS.values()]
  _write(render({"workloads": pd.DataFrame(rows)}, args.format), None)
  return 0


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="tinytune", description="A kernel generator and autotuner.")
  sub = ap.add_subparsers(dest="command", required=True)
  search = sub.add_parser("search", help="find the fastest opts for each kernel of a workload and store them in the tuning cache")
  search.add_argument("workload", help="a workload of `tinytune kernels`")
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
  bench = sub.add_parser("bench", help="time a workload with its default and tuned opts beside PyTorch and NumPy")
  bench.add_argument("workload", help="a workload of `tinytune kernels`")
  bench.add_argument("-p", "--param", action="append", default=[], help="KEY=VALUE, e.g. -p m=1024")
  compare = sub.add_parser("compare", help="a table over sizes: tinytune default and tuned, PyTorch, NumPy, and their ratios")
  compare.add_argument("workload", help="a workload of `tinytune kernels`")
  compare.add_argument("--sweep", action="append", default=[], help="KEY=V1,V2,... (repeat for a grid), e.g. --sweep n=256,512")
  compare.add_argument("-p", "--param", action="append", default=[], help="KEY=VALUE for every size, e.g. -p k=64")
  compare.add_argument("--tune", action="store_true", help="search each size the tuning cache does not have (see --strategy, --budget)")
  compare.add_argument("--strategy", default="beam", help="search strategy for --tune (default beam)")
  compare.add_argument("--budget", type=int, default=40, help="candidates per kernel for --tune (default 40)")
  for p in (bench, compare):
    p.add_argument("--device", default=None, help="device name (default: $TINYTUNE_DEVICE or CPU)")
    p.add_argument("--against", default="torch,numpy", help="baselines to time: torch, numpy or both (default torch,numpy)")
    p.add_argument("--repeats", type=int, default=30, help="most timed repeats per implementation (default 30; fewer once the spread settles)")
    p.add_argument("--format", default="table", help="table (default), csv, md, json, html")
    p.add_argument("--db", default=None, help="SQLAlchemy URL of the results database (default: $TINYTUNE_DB or a SQLite file in the user cache)")
    p.add_argument("--no-store", action="store_true", help="do not record the timings in the results database")
  bench.add_argument("--no-peak", action="store_true", help="do not measure the device's peak throughput if it is not stored yet")
  report = sub.add_parser("report", help="the results database as tables and plots: best results, baselines, search history")
  report.add_argument("--workload", default=None, help="only this workload")
  report.add_argument("--device", default=None, help="only this device: a kind (cpu), a label (CPU:1a2b3c4d) or a fingerprint hash prefix")
  report.add_argument("--format", default="table", help="table (default), csv, md, json, html (one self-contained page with plots)")
  report.add_argument("--table", action="append", default=[], help="only this table: devices, best, baselines, history (repeatable)")
  report.add_argument("--out", default=None, help="write to this file instead of stdout")
  report.add_argument("--db", default=None, help="SQLAlchemy URL of the results database (default: $TINYTUNE_DB or a SQLite file in the user cache)")
  devices = sub.add_parser("devices", help="the devices tinytune knows: fingerprints of those present, what is missing for the others")
  kernels = sub.add_parser("kernels", help="the workload catalog with its parameters and defaults")
  for p in (devices, kernels): p.add_argument("--format", default="table", help="table (default), csv, md, json, html")
  devices.add_argument("--probe", action="store_true", help="measure each present device's peak GFLOPS and GB/s again and store them (roofline)")
  devices.add_argument("--db", default=None, help="SQLAlchemy URL of the results database for --probe")
  args = ap.parse_args(argv)
  commands = {"search": cmd_search, "bench": cmd_bench, "compare": cmd_compare, "report": cmd_report, "devices": cmd_devices, "kernels": cmd_kernels}
  try: return commands[args.command](args)
  except (ValueError, TypeError, RuntimeError, LookupError) as e:
    print(f"tinytune: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print("tinytune: interrupted; what was measured is stored (continue with --resume)", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
