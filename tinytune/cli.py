"""The `tinytune` command."""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import os
import re
import signal
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any, NoReturn


def _process_age() -> float:
  """Seconds since this process started (Linux's /proc; 0 elsewhere): a command's --seconds counts its imports too."""
  try:
    with open("/proc/self/stat") as f: ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f: return max(0.0, float(f.read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK"))
  except (OSError, ValueError, IndexError): return 0.0


STARTED = time.monotonic() - _process_age()  # when `python -m tinytune.cli` started

DTYPE_HELP = "what the workload computes in: float32 (default), float16, bfloat16, int32, ... (`tinytune kernels` lists each one's)"
TARGET_HELP = "what CPU kernels are built for: native (this CPU; default: $TINYTUNE_CPU_TARGET), x86-64-v2, x86-64-v3 (AVX2), x86-64-v4, aarch64"
DB_HELP = "results database: a SQLAlchemy URL or a SQLite file path (default: $TINYTUNE_DB or tinytune.db in the user cache)"


def param_help(workload_name: str, pairs: list[str]) -> bool:
  """`-p help` (or `-p help=1`): print the workload's parameters, their defaults and meanings; True if asked."""
  if not any(p.partition("=")[0] == "help" for p in pairs): return False
  from tinytune.kernels import get_workload
  workload = get_workload(workload_name)
  print(f"{workload.name}: {workload.doc}\nparameters (-p KEY=VALUE), with their defaults:")
  for k, v in workload.defaults.items():
    named = f" (by name: {', '.join(f'{n}={i}' for n, i in workload.names[k].items())})" if k in workload.names else ""
    print(f"  {k}={v}" + (f"  {workload.help[k]}" if k in workload.help else "") + named)
  return True


def parse_params(pairs: list[str], names: dict[str, dict[str, int]] | None = None) -> dict[str, int]:
  """-p KEY=INTEGER pairs; `names` (a workload's) lets a parameter be given by name too, as -p model=cnn."""
  params = {}
  for p in pairs:
    key, sep, value = p.partition("=")
    if sep and value in (names or {}).get(key, {}): params[key] = (names or {})[key][value]; continue
    if not sep or not value.lstrip("-").isdigit():
      named = f" or one of {', '.join((names or {})[key])}" if key in (names or {}) else ""
      raise ValueError(f"bad parameter {p!r}: write KEY=INTEGER{named}, e.g. -p n=512")
    params[key] = int(value)
  return params


def count(text: str) -> int:
  """An argparse type: a whole number of at least 1."""
  try: n = int(text)
  except ValueError: raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
  if n < 1: raise argparse.ArgumentTypeError(f"{n} is too small: give at least 1")
  return n


def seconds(text: str) -> float:
  """An argparse type: a finite number of seconds above 0."""
  try: s = float(text)
  except ValueError: raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
  if not (math.isfinite(s) and s > 0): raise argparse.ArgumentTypeError(f"{text} is not a time limit: give a number of seconds above 0")
  return s


def ms(s: float | None) -> float | None:
  """Seconds -> milliseconds for JSON: None where nothing was measured (a failure is inf)."""
  return s * 1e3 if s is not None and math.isfinite(s) else None


def add_format(p: argparse.ArgumentParser, formats: str = "table (default), csv, md, json, html") -> None:
  p.add_argument("--format", default="table", help=formats)
  p.add_argument("--json", dest="format", action="store_const", const="json",
                 help="print one JSON object: the same as --format json (the schema is in the README)")


def cmd_search(args: argparse.Namespace) -> int:
  if param_help(args.workload, args.param): return 0
  if "help" in args.option:
    from tinytune.search.strategy import options_help
    print("each strategy's options (--option KEY=VALUE), with their defaults:\n" + options_help())
    return 0
  from rich.console import Console

  from tinytune import engine
  from tinytune.kernels import get_workload
  from tinytune.kernels.workload import schedule
  from tinytune.reports import params_label, render
  from tinytune.results_db import Database
  from tinytune.runtime import Device
  from tinytune.search.progress import ProgressLine
  from tinytune.search.strategy import check_options
  from tinytune.search.tune import Tuner, outcome_frame

  workload = get_workload(args.workload)
  device, dtype = Device.canonicalize(args.device), workload.dtype(args.dtype)
  params = workload.params(parse_params(args.param, workload.names), is_gpu(device))
  options = check_options(args.strategy, search_options(args))  # fail early on a bad name, option or missing optional dependency
  _check_workers(args.workers, args.oversubscribe)
  _check_format(args.format)
  console = Console(stderr=True, quiet=args.quiet or args.format == "json")
  _runs_on(workload, params, dtype, device)
  items = schedule(workload.instantiate(params, dtype, device)[0], device)[0]
  db = Database(args.db)
  if args.workers > 1 and args.force: Tuner(db, device).forget(items)
  measured = _search_workers(args, options, console) if args.workers > 1 else None
  progress = ProgressLine(args.strategy, search_budget(args)["candidates"], {k.key: label for label, k in engine.kernels(items, device)},
                          quiet=args.quiet or args.format == "json")
  progress.verbose |= args.verbose
  tuner = Tuner(db, device, args.strategy, search_budget(args), options, args.resume, args.force and not measured, progress, args.study,
                str(args.worker or 0), args.started, args.objective)
  try: outcomes = tuner.tune_program(items, workload.name, params, dtype.name)
  finally: progress.done()
  if measured is not None:  # the workers searched; what they left in the tuning cache is the result
    for o in outcomes: o.cache_hit, o.counts = False, measured.get(o.key, {})
  elapsed = time.monotonic() - args.started  # the whole command's, as --seconds counts it
  cache_hit = all(o.cache_hit for o in outcomes)
  context = {"workload": workload.name, "params": params, "dtype": dtype.name, "device": device, "fingerprint": tuner.device_hash,
             "strategy": args.strategy, "cache_hit": cache_hit, "elapsed_ms": elapsed * 1e3}
  retimed = f"ms: {args.objective}s of the final interleaved re-time"
  how = "cache hit: the stored times" if cache_hit else f"{args.strategy} search, {elapsed:.1f} s; {retimed}"
  title = f"{workload.name} {params_label(params, workload.name)} {dtype.name} on {_on(device)} ({how})"
  frame = outcome_frame(outcomes, lambda o: {"dtype": dtype.name})
  _write(render({"kernels": frame}, args.format, title, "search", context, {"kernels": title}), None)
  _emulated_note(device)
  return 0


def _check_workers(workers: int, oversubscribe: bool) -> None:
  """`search --workers`: at most the cores here, or MAX_OVERSUBSCRIBE a core with --oversubscribe."""
  if workers > (cores := os.cpu_count() or 1) and not oversubscribe:
    raise ValueError(f"--workers {workers} is more than the {cores} cores here, where workers only slow each other; "
                     "add --oversubscribe to start them anyway")
  if workers > MAX_OVERSUBSCRIBE * cores:  # each worker is a process with its own timing worker: thousands would exhaust the machine
    raise ValueError(f"--workers {workers} is more than {MAX_OVERSUBSCRIBE} per core ({MAX_OVERSUBSCRIBE * cores} here), "
                     "even with --oversubscribe")


def search_options(args: argparse.Namespace) -> dict[str, str]:
  """--option KEY=VALUE pairs (repeatable), after the aliases --beam-width (width) and --sampler: the strategy's options as text."""
  pairs = ([f"width={args.beam_width}"] if args.beam_width is not None else []) + ([f"sampler={args.sampler}"] if args.sampler is not None else [])
  options = {}
  for pair in pairs + args.option:
    key, sep, value = pair.partition("=")
    if not sep or not key or not value: raise ValueError(f"bad --option {pair!r}: write KEY=VALUE, e.g. --option width=8 (--option help lists them)")
    options[key] = value
  return options


def search_budget(args: argparse.Namespace) -> dict[str, Any]:
  """`search`'s budget: --budget candidates per kernel (200 by default, none with --seconds, which then alone ends the search)."""
  from tinytune.search.tune import DEFAULT_CANDIDATES
  return {"candidates": args.budget if args.budget is not None or args.seconds else DEFAULT_CANDIDATES, "seconds": args.seconds}


def _search_workers(args: argparse.Namespace, options: dict[str, Any], console: Any) -> dict[str, dict[str, int]]:
  """`search --workers N`: N processes of this search share one study (and the database) and its budget.
  Returns the candidates they measured per kernel key."""
  import subprocess
  import uuid
  if args.study is None: args.study = f"workers-{uuid.uuid4().hex[:12]}"
  command = [sys.executable, "-m", "tinytune.cli", "search", args.workload, *[x for p in args.param for x in ("-p", p)], "--dtype", args.dtype,
             "--strategy", args.strategy, *[x for k, v in options.items() for x in ("--option", f"{k}={v}")], "--study", args.study,
             "--format", "json", "--quiet", "--objective", args.objective]
  command += (["--budget", str(args.budget)] if args.budget is not None else [])
  command += (["--device", args.device] if args.device else []) + (["--seconds", str(args.seconds)] if args.seconds else [])
  command += (["--db", args.db] if args.db else []) + (["--resume"] if args.resume else []) + (["--force"] if args.force else [])
  console.print(f"{args.workers} workers searching {args.workload} together (study {args.study})")
  procs = [subprocess.Popen(command + ["--worker", str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(args.workers)]
  try: outputs = [proc.communicate() for proc in procs]
  except BaseException:  # stopped: each worker records what it finished and stops its own workers before we exit
    for proc in procs:
      if proc.poll() is None: proc.terminate()
    for proc in procs: proc.wait()
    raise
  counts: dict[str, dict[str, int]] = {}
  for i, (proc, (stdout, stderr)) in enumerate(zip(procs, outputs)):
    if proc.returncode != 0:
      lines = stderr.strip().splitlines() or [f"exit code {proc.returncode}"]
      why = next((x for x in lines if x.startswith("tinytune: error: ")), lines[-1]).removeprefix("tinytune: error: ")
      raise RuntimeError(f"worker {i} failed: {why}")
    for k in json.loads(stdout)["kernels"]:
      kernel_counts = counts.setdefault(k["key"], {})
      for status, n in k["candidates"].items(): kernel_counts[status] = kernel_counts.get(status, 0) + n
  return counts


def _against(text: str) -> list[str]:
  """--against torch,numpy -> the baselines asked for; a name we do not know is the error."""
  libs = [x.strip() for x in text.split(",") if x.strip()]
  if bad := [x for x in libs if x not in ("torch", "numpy")]: raise ValueError(f"unknown baseline {', '.join(bad)}; --against takes torch, numpy")
  return libs


LEFT_OUT = {"bench": "its row is left out", "compare": "its columns are left out"}  # where a baseline that cannot run goes missing


def _installed(libs: list[str], args: argparse.Namespace) -> list[str]:
  """The baselines of `libs` that can run here, after any error that ends the command. A missing PyTorch is an error where
  --against names it, and a one-line note where it is only the default."""
  from tinytune.kernels.baselines import TORCH_MISSING
  if "torch" in libs and importlib.util.find_spec("torch") is None:
    if args.against is not None: raise RuntimeError(f"--against {args.against}: {TORCH_MISSING} (or leave torch out of --against)")
    print(f"tinytune: note: {TORCH_MISSING}; {LEFT_OUT[args.command]}", file=sys.stderr)
    return [x for x in libs if x != "torch"]
  return libs


def roof(gflops: float, gbs: float, peaks: tuple[float, float] | None, dtype: str = "float32") -> tuple[float | None, str]:
  """Percent of what the roofline allows at this arithmetic intensity (min(peak GFLOPS, intensity * peak GB/s)), at most 100,
  and a note where the measurement is above the roof: the stored peak is low, or the data fit in a cache; in another dtype than
  the peak's float32, its own instructions (bfloat16 dot products, tensor cores) may outrun it too."""
  from tinytune.reports import roof_pct
  if peaks is None or not gbs: return None, ""
  pct = roof_pct(gflops, gflops / gbs, *peaks)
  if pct <= 100: return pct, ""
  why = "the stored peak is low (tinytune devices --probe measures it again) or the data fit in a cache"
  if dtype != "float32": why = f"the roof is float32's, which {dtype} instructions can outrun; or {why}"
  return 100.0, f"{pct:.0f}% of the stored roof, shown as 100: {why}"


def noisy(timings: dict[str, Any]) -> str:
  """A note naming the timings whose runs spread wider than the search trusts (median - min over NOISY_SPREAD of the median): the
  machine was busy, so their ratios mean little."""
  from tinytune.search.strategy import NOISY_SPREAD, busy_note
  if not (wide := [f"{lib} {t.spread:.0%}" for lib, t in timings.items() if t.spread > NOISY_SPREAD]): return ""
  return f"{busy_note()}: runs spread {', '.join(wide)}"


def tolerance(dtype: Any) -> float:
  """How far tinytune's output may be from NumPy's (in float64) in `dtype`: a few of its roundings; integers are exact."""
  import ml_dtypes
  return max(1e-3, 8 * float(ml_dtypes.finfo(dtype.np).eps)) if dtype.is_float else 0.0


def _runs_on(workload: Any, params: dict[str, int], dtype: Any, device: str) -> None:
  """Compile the workload's kernels (default opts) for the device: a dtype the device cannot do fails here, in one line, and not
  in every candidate or timing after."""
  from tinytune import engine
  from tinytune.kernels.workload import schedule
  items = schedule(workload.instantiate(params, dtype, device)[0], device)[0]
  try:
    for _, kernel in engine.kernels(items, device): engine.compile_kernel(kernel.apply_opts(engine.kernel_opts(kernel, device, "default")), device)
  except Exception as e:  # a compiler's complaint, whatever its type
    why = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise RuntimeError(f"{device} cannot run {workload.name} in {dtype.name}: {why}") from None


def _on(device: str) -> str:
  """The device as a table's title names it: an emulator's, saying that its times are no GPU's speed."""
  from tinytune.runtime import Device
  return f"{device} (emulated: times are host seconds, not GPU speed)" if Device[device].emulated else device


def _emulated_note(device: str) -> None:
  """After the tables of times on an emulator: a note that they are not a GPU's (on stderr, where JSON output has none)."""
  from tinytune.runtime import Device
  if Device[device].emulated: print(f"tinytune: note: {device} is an emulator: its times are its host seconds, not a GPU's speed", file=sys.stderr)


def _timings(workload: Any, params: dict[str, int], device: str, against: list[str], db: Any, dtype: Any, args: argparse.Namespace) -> dict[str, Any]:
  """tinytune's default and tuned kernels, then each baseline of `against`, all in `dtype`. A baseline that cannot compute in it
  (PyTorch has no integer conv2d on the CPU) costs a one-line note and is dropped from `against`, not the command."""
  from tinytune.kernels.baselines import measure
  from tinytune.search.evaluate import TimingPolicy
  policy = TimingPolicy(max_repeats=args.repeats, warm_cache=args.warm_cache)
  timings = measure(workload, params, device, ["tinytune-default", "tinytune-tuned"], policy, db, dtype)
  for lib in list(against):
    try: timings.update(measure(workload, params, device, [lib], policy, db, dtype))
    except (RuntimeError, TypeError, ValueError) as e:
      why = (str(e).strip().splitlines() or [type(e).__name__])[0]
      print(f"tinytune: note: {lib} cannot run {workload.name} in {dtype.name} on {device} ({why}); {LEFT_OUT[args.command]}", file=sys.stderr)
      against.remove(lib)
  return timings


def _write(text: str, out: str | None) -> None:
  if out is None:
    sys.stdout.write(text)
    return
  try:
    with open(out, "w") as f: f.write(text)
  except OSError as e: raise RuntimeError(f"cannot write {out}: {e.strerror or e}") from None
  print(f"tinytune: wrote {out}", file=sys.stderr)


def is_gpu(device: str) -> bool:
  """Whether the device is a GPU (pocl's OPENCL is not), which takes the workloads' GPU default sizes; False where it is absent."""
  from tinytune.runtime import Device, device_status
  return device_status(device) is None and Device[device].is_gpu


def _check_format(fmt: str) -> None:
  from tinytune.reports import FORMATS
  if fmt not in FORMATS: raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")


def cmd_bench(args: argparse.Namespace) -> int:
  if param_help(args.workload, args.param): return 0
  import numpy as np
  import pandas as pd

  from tinytune.kernels import get_workload
  from tinytune.kernels.baselines import store
  from tinytune.reports import params_label, render
  from tinytune.results_db import Database
  from tinytune.runtime import Device

  _check_format(args.format)
  workload = get_workload(args.workload)
  device = Device.canonicalize(args.device)
  params, dtype = workload.params(parse_params(args.param, workload.names), is_gpu(device)), workload.dtype(args.dtype)
  db = Database(args.db)  # an unusable database is the one error, before any note
  against = _against(args.against or DEFAULT_AGAINST)
  _runs_on(workload, params, dtype, device)
  against = _installed(against, args)
  peaks = _peaks(db, device, measure=not args.no_peak)
  timings = _timings(workload, params, device, against, db, dtype, args)
  if not args.no_store:
    for t in timings.values(): store(db, workload, params, device, t, dtype)
  ref = workload.reference(params, *[a.astype(np.float64) if dtype.is_float else a for a in workload.arrays(params, dtype)])
  rows, ok = _bench_rows(timings, ref, dtype, (workload.flops(params), workload.nbytes(params, dtype.itemsize)), peaks)
  peak = f" (roof {peaks[0]:.0f} GFLOPS, {peaks[1]:.1f} GB/s)" if peaks else ""
  what = f"{workload.name} {params_label(params, workload.name)} {dtype.name} on {_on(device)}{peak}"
  titles = {"implementations": f"{what} (ms: median ±spread of the runs; tuned_speedup above 1: tuned is faster)",
            "kernels": f"the kernels of {workload.name} as tuned (each run in turn per call)"}
  context = {"workload": workload.name, "params": params, "dtype": dtype.name, "device": device, "peak_gflops": peaks[0] if peaks else None,
             "peak_gbs": peaks[1] if peaks else None}
  frames = {"implementations": pd.DataFrame(rows), "kernels": pd.DataFrame(timings["tinytune-tuned"].kernels)}
  _write(render(frames, args.format, titles["implementations"], "bench", context, titles), None)
  _emulated_note(device)
  if not ok: print(f"tinytune: error: {workload.name} in {dtype.name}: tinytune's output differs from NumPy's", file=sys.stderr)
  return 0 if ok else 1


def _bench_rows(timings: dict[str, Any], ref: Any, dtype: Any, work: tuple[int, int], peaks: tuple[float, float] | None
                ) -> tuple[list[dict[str, Any]], bool]:
  """The table's row of each implementation (its times, rates of `work`'s flops and bytes, share of the roof, speed against tuned
  tinytune), and whether every tinytune output matches the reference `ref`."""
  from tinytune.search.worker import mismatches
  (flops, nbytes), tuned_s = work, timings["tinytune-tuned"].median_s
  rows, ok = [], True
  for lib, t in timings.items():
    wrong = t.output is None or t.output.shape != ref.shape or mismatches(t.output, ref, tolerance(dtype)).any()
    if lib.startswith("tinytune") and wrong: ok = False
    gflops, gbs = flops / t.median_s / 1e9, nbytes / t.median_s / 1e9
    roof_pct, above = roof(gflops, gbs, peaks, dtype.name)
    rows.append({"implementation": lib, "dtype": dtype.name, "version": t.version, "median_ms": t.median_s * 1e3, "spread": t.spread,
                 "min_ms": t.min_s * 1e3,
                 "gflops": gflops, "gbs": gbs, "roof_pct": roof_pct, "tuned_speedup": t.median_s / tuned_s,
                 "note": "; ".join(x for x in (t.note, noisy({lib: t}), above) if x)})
  return rows, ok


def _peaks(db: Any, device: str, measure: bool) -> tuple[float, float] | None:
  """The device's peak (GFLOPS, GB/s) for bench's roof_pct, measured where it is not stored and `measure` says so; None, after a note,
  where it cannot be measured."""
  from tinytune.kernels.peaks import device_peaks
  from tinytune.runtime import Device, device_fingerprint
  try: return device_peaks(db, device, device_fingerprint(device), measure=measure and not Device[device].emulated)  # an emulator has none
  except RuntimeError as e:  # a GPU's probe runs PyTorch there, which may be missing or built without that device
    print(f"tinytune: note: the peak of {device} cannot be measured ({e}); roof_pct is left out", file=sys.stderr)
    return None


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
  db.add_argument("--db", default=None, help=DB_HELP)


def _rerun(entry: Any, device: str) -> tuple[str, float | None]:
  """Build an entry's kernel from its workload, check its opts verify here and time them against the default: (verdict, speedup)."""
  from tinytune import engine
  from tinytune.codegen.opts import opts_from_json
  from tinytune.dtype import dtypes
  from tinytune.kernels import get_workload
  from tinytune.kernels.workload import schedule
  from tinytune.search.evaluate import Evaluator
  if not entry.workload: return "cannot re-run: no workload recorded", None
  workload, params = get_workload(entry.workload), json.loads(entry.params)
  builds = (workload.instantiate(workload.params(params), dt, device)[0] for dt in dtypes.all if workload.takes(dt))  # the entry's dtype is one
  kernel = next((k for out in builds for _, k in engine.kernels(schedule(out, device)[0], device) if k.key == entry.kernel_key), None)
  if kernel is None: return "cannot re-run: its workload no longer makes this kernel", None
  opts = tuple(opts_from_json(entry.opts))
  with Evaluator(kernel, device) as ev:
    if (result := ev.evaluate([opts])[0]).status != "ok": return f"FAILED: {result.status} {result.error}".strip(), None
    default_s, tuned_s = (t.median for t in ev.retime([engine.kernel_opts(kernel, device, "default"), opts]))
  return ("ok" if tuned_s <= default_s * 1.05 else "SLOWER than the default"), default_s / tuned_s


def cmd_cache(args: argparse.Namespace) -> int:
  from tinytune.results_db import fingerprint_hash
  from tinytune.runtime import Device, device_fingerprint

  named = args.device
  if args.action == "export" and named is not None:  # export --device takes a device name or a fingerprint hash
    try: Device.canonicalize(named)
    except ValueError: named = None
  device = Device.canonicalize(named)
  _check_format(args.format)
  if args.format != "table" and args.action != "list": raise ValueError(f"--format and --json are for cache list, not cache {args.action}")
  here = fingerprint_hash(device_fingerprint(device))
  if args.action in ("export", "merge") and args.out is None: raise ValueError(f"cache {args.action} needs --out FILE")
  if args.action in ("import", "verify") and len(args.files) != 1: raise ValueError(f"cache {args.action} takes one cache file")
  try: before = datetime.fromisoformat(args.before).replace(tzinfo=timezone.utc) if args.before else None
  except ValueError: raise ValueError(f"bad --before {args.before!r}: write a date, YYYY-MM-DD") from None
  if args.action == "export": _cache_export(args, here if args.device is None or named is not None else None)
  elif args.action == "import": _cache_import(args)
  elif args.action == "merge": _cache_merge(args)
  elif args.action == "prune": _cache_prune(args, before)
  elif args.action == "verify": return _cache_verify(args, device, here)
  else: _cache_list(args, here)
  return 0


def _cache_export(args: argparse.Namespace, here: str | None) -> None:
  """`here`: this device's fingerprint hash, or None where --device is a prefix of another device's."""
  from tinytune.results_db import Database
  from tinytune.results_db import cache as files
  db = Database(args.db)
  if args.all: device_hash = None
  elif here is not None: device_hash = here
  elif len(match := [h for h in db.fingerprints() if h.startswith(args.device.lower())]) == 1: device_hash = match[0]
  else: raise ValueError(f"--device {args.device!r} is no device name and matches {len(match)} fingerprints in {db!r}; give more of the hash")
  out = files.export(db, args.out, device_hash, args.workload)
  print(f"wrote {out.path}: {len(out.entries)} entries for {len(out.devices)} device(s)")


def _cache_import(args: argparse.Namespace) -> None:
  from tinytune import engine
  from tinytune.results_db import Database
  from tinytune.results_db import cache as files
  stored, kept = files.import_file(Database(args.db), args.files[0], args.force)
  engine.forget()  # programs in this process look their kernels up again
  print(f"imported {stored} entries into the tuning cache; kept {kept} existing entries that were as fast or faster")


def _cache_merge(args: argparse.Namespace) -> None:
  from tinytune.results_db import cache as files
  if len(args.files) < 2: raise ValueError("cache merge takes two or more files")
  out = files.merge(args.files, args.out)
  print(f"wrote {out.path}: {len(out.entries)} entries for {len(out.devices)} device(s)")


def _cache_prune(args: argparse.Namespace, before: datetime | None) -> None:
  from tinytune.codegen import CODEGEN_VERSION
  from tinytune.results_db import Database
  from tinytune.results_db import cache as files
  if args.files:
    out, dropped = files.prune(files.CacheFile.open(args.files[0]), args.files[0], CODEGEN_VERSION, before)
    print(f"{out.path}: dropped {dropped} entries, kept {len(out.entries)}")
  else: print(f"dropped {Database(args.db).prune_tuned(CODEGEN_VERSION, before)} entries from the tuning cache")


def _cache_verify(args: argparse.Namespace, device: str, here: str) -> int:
  from tinytune.results_db import cache as files
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


def _cache_list(args: argparse.Namespace, here: str) -> None:
  import pandas as pd

  from tinytune.reports import render
  from tinytune.results_db import Database
  from tinytune.results_db import cache as files
  entries = files.CacheFile.open(args.files[0]).entries if args.files else [files.Entry(
    t.kernel_key, t.device_hash, t.kernel_name, t.workload, t.params, t.opts_json, t.best_s, t.default_s, t.updated_at.isoformat())
    for t in Database(args.db, read_only=True).tuned_entries()]
  rows = [{"kernel": e.kernel_name or e.kernel_key[:12], "workload": e.workload, "params": json.loads(e.params) if e.params else None,
           "device": e.device_hash[:12], "here": e.device_hash == here, "tuned_ms": ms(e.best_s), "default_ms": ms(e.default_s),
           "speedup": e.speedup, "updated_at": e.updated_at[:19], "opts": json.loads(e.opts), "key": e.kernel_key} for e in entries]
  title = f"tuning cache: {args.files[0] if args.files else 'the results database'} ({len(entries)} entries)"
  _write(render({"entries": pd.DataFrame(rows)}, args.format, title, "cache list", {"source": args.files[0] if args.files else None},
                {"entries": title}), None)


def add_cache_parser(sub: Any) -> None:
  cache = sub.add_parser("cache", help="tuning cache files for deployments: export, import, merge, list, verify, prune")
  cache.add_argument("action", choices=["export", "import", "merge", "list", "verify", "prune"], help="what to do (see the README's cache files)")
  cache.add_argument("files", nargs="*", help="cache file(s): import FILE, merge A B, list [FILE], verify FILE, prune [FILE] (else the database)")
  cache.add_argument("--out", default=None, help="export, merge: the file to write")
  cache.add_argument("--all", action="store_true", help="export: every device in the database")
  cache.add_argument("--workload", default=None, help="export: only kernels tuned for this workload")
  cache.add_argument("--device", default=None, help="the device here (default: $TINYTUNE_DEVICE or CPU); export: a name or fingerprint hash")
  cache.add_argument("--run", action="store_true", help="verify: re-run each entry for this device: it must verify and beat the default")
  cache.add_argument("--force", action="store_true", help="import: replace existing entries even where they are faster")
  cache.add_argument("--before", default=None,
                      help="prune: also drop entries updated before this date (YYYY-MM-DD); those of other codegen versions always go")
  cache.add_argument("--db", default=None, help=DB_HELP)
  add_format(cache, "list: table (default), csv, md, json, html")
  cache.add_argument("--target", default=None, help=TARGET_HELP)


def _sweep(specs: list[str], workload: Any) -> list[dict[str, int]]:
  """--sweep n=256,512 (repeatable: a grid) -> parameter overrides, one per size; no --sweep is one size."""
  if not specs: return [{}]  # one size: the defaults and -p
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
  if param_help(args.workload, args.param): return 0
  import pandas as pd

  from tinytune.kernels import get_workload
  from tinytune.kernels.baselines import store
  from tinytune.kernels.workload import schedule
  from tinytune.reports import render
  from tinytune.results_db import Database
  from tinytune.runtime import Device
  from tinytune.search.tune import Tuner

  _check_format(args.format)
  workload = get_workload(args.workload)
  base, dtype = parse_params(args.param, workload.names), workload.dtype(args.dtype)
  points = _sweep(args.sweep, workload)
  device = Device.canonicalize(args.device)
  db = Database(args.db)  # an unusable database is the one error, before any note
  against = _against(args.against or DEFAULT_AGAINST)
  rows = []
  for i, point in enumerate(points):
    params = workload.params({**base, **point})
    if i == 0:
      _runs_on(workload, params, dtype, device)
      against = _installed(against, args)
    if args.tune:
      items = schedule(workload.instantiate(params, dtype, device)[0], device)[0]
      Tuner(db, device, args.strategy, {"candidates": args.budget, "seconds": None}).tune_program(items, workload.name, params, dtype.name)
    timings = _timings(workload, params, device, against, db, dtype, args)
    if not args.no_store:
      for t in timings.values(): store(db, workload, params, device, t, dtype)
    tuned = timings["tinytune-tuned"].median_s
    row: dict[str, Any] = {"params": params, "dtype": dtype.name, "tuned_gflops": workload.flops(params) / tuned / 1e9}
    for lib, t in timings.items(): row.update({f"{lib.removeprefix('tinytune-')}_ms": t.median_s * 1e3,
                                               f"{lib.removeprefix('tinytune-')}_spread": t.spread})
    row["speedup_vs_default"] = timings["tinytune-default"].median_s / tuned
    row.update({f"speedup_vs_{lib}": timings[lib].median_s / tuned for lib in against})
    row["note"] = "; ".join(x for x in (timings["tinytune-tuned"].note, noisy(timings)) if x)
    rows.append(row)
  title = f"{workload.name} in {dtype.name} on {_on(device)} (ms: median ±spread of the runs; speedups above 1: tinytune's tuned kernels are faster)"
  context = {"workload": workload.name, "dtype": dtype.name, "device": device, "against": against}
  _write(render({"sizes": pd.DataFrame(rows)}, args.format, title, "compare", context, {"sizes": title}), None)
  _emulated_note(device)
  return 0


def cmd_report(args: argparse.Namespace) -> int:
  from tinytune.kernels import get_workload
  from tinytune.reports import render, report_frames
  from tinytune.results_db import Database, database_url

  _check_format(args.format)
  if args.workload: get_workload(args.workload)
  url = database_url(args.db)
  if url.get_backend_name() == "sqlite" and url.database and not os.path.exists(url.database):
    raise ValueError(f"there is no results database at {url.database}: check --db, or run `tinytune search` first")
  frames = report_frames(Database(args.db, read_only=True), args.workload, args.device)
  if args.device and frames["devices"].empty:
    raise ValueError(f"no device in the database matches --device {args.device!r}; see `tinytune report --table devices`")
  if args.kernel:  # one kernel's results: NAME, or NAME#2 where a program has two kernels of that name
    for t in ("best", "history"): frames[t] = frames[t][frames[t]["kernel"].str.fullmatch(re.escape(args.kernel) + r"(#\d+)?")].reset_index(drop=True)
    if frames["best"].empty and frames["history"].empty:
      raise ValueError(f"no tuned kernel or search matches --kernel {args.kernel!r}; see `tinytune report --table best`")
  if args.table:
    if unknown := [t for t in args.table if t not in frames]: raise ValueError(f"unknown table {', '.join(unknown)}; tables: {', '.join(frames)}")
    frames = {t: frames[t] for t in args.table}
  title = "tinytune report" + (f": {args.workload}" if args.workload else "") + (f", {args.kernel}" if args.kernel else "") + \
    (f" on {args.device}" if args.device else "")
  _write(render(frames, args.format, title, "report", {"workload": args.workload, "kernel": args.kernel, "device": args.device}), args.out)
  return 0


def cmd_devices(args: argparse.Namespace) -> int:
  import pandas as pd

  from tinytune.kernels.peaks import measure_peaks
  from tinytune.reports import render
  from tinytune.results_db import Database, fingerprint_hash
  from tinytune.runtime import _BACKENDS, Device, device_fingerprint

  _check_format(args.format)
  rows = []
  db = Database(args.db) if args.probe else None
  for name in _BACKENDS:
    try:
      fp, caps = device_fingerprint(name), Device[name].caps
      rows.append({"device": name, "present": True, "name": fp.get("name", ""), "fingerprint": fingerprint_hash(fp)[:16], "threads": caps.threads,
                   "compiler": fp.get("compiler_version", ""), "missing": ""})
    except Exception as e:  # a device that is not here says what it needs
      rows.append({"device": name, "present": False, "name": "", "fingerprint": "", "threads": None, "compiler": "",
                   "missing": str(e).splitlines()[0] if str(e) else type(e).__name__})
      continue
    if db is None or Device[name].emulated: continue  # an emulator's peaks would be its interpreter's
    try: gflops, gbs, how = measure_peaks(name)
    except RuntimeError as e:  # a GPU's probe runs PyTorch there: the device is here all the same
      print(f"tinytune: note: the peak of {name} cannot be measured ({e})", file=sys.stderr)
      continue
    db.set_peak(db.device_id(fp), gflops, gbs, how)
    rows[-1].update({"peak_gflops": gflops, "peak_gbs": gbs})
  _write(render({"devices": pd.DataFrame(rows)}, args.format, "tinytune devices", "devices"), None)
  return 0


def cmd_kernels(args: argparse.Namespace) -> int:
  import pandas as pd

  from tinytune.dtype import dtypes
  from tinytune.kernels import WORKLOADS
  from tinytune.reports import render

  _check_format(args.format)
  rows = [{"workload": w.name, "params": dict(w.defaults), "gpu_params": w.params({}, gpu=True),
           "dtypes": [d.name for d in dtypes.all if w.takes(d)], "gflop": w.flops(w.defaults) / 1e9,
           "torch": w.torch is not None,
           "description": w.doc + "".join(f"; {k}: {v}" for k, v in w.help.items())} for w in WORKLOADS.values()]
  titles = {"workloads": "workloads (params and GFLOP at their defaults; gpu_params: the defaults on a GPU, where no -p is given)"}
  _write(render({"workloads": pd.DataFrame(rows)}, args.format, titles["workloads"], "kernels", None, titles), None)
  return 0


DEFAULT_AGAINST = "torch,numpy"
MAX_OVERSUBSCRIBE = 4  # --oversubscribe allows this many search workers per core, no more


class Parser(argparse.ArgumentParser):
  """argparse's parser whose errors are one line (argparse prints the whole usage block first) and exit 2."""
  def error(self, message: str) -> NoReturn:
    self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
  from tinytune import __version__  # the running code's, installed or not (pyproject.toml reads it too)
  ap = Parser(prog="tinytune", description="A kernel generator and autotuner.")
  ap.add_argument("--version", action="version", version=f"tinytune {__version__}")
  sub = ap.add_subparsers(dest="command", required=True)
  for add in (add_search_parser, add_bench_parser, add_compare_parser, add_report_parser, add_devices_parsers, add_db_parser, add_cache_parser):
    add(sub)
  return ap


def add_search_parser(sub: Any) -> None:
  search = sub.add_parser("search", help="find the fastest opts for each kernel of a workload and store them in the tuning cache")
  search.add_argument("workload", help="a workload of `tinytune kernels`")
  search.add_argument("-p", "--param", action="append", default=[], help="KEY=VALUE, e.g. -p m=1024 (-p help lists them)")
  search.add_argument("--device", default=None, help="device name (default: $TINYTUNE_DEVICE or CPU)")
  search.add_argument("--dtype", default="float32", help=DTYPE_HELP)
  search.add_argument("--strategy", default="beam", help="beam (default), optuna, random")
  search.add_argument("--option", action="append", default=[], help="KEY=VALUE: an option of the strategy (repeatable; --option help lists them)")
  search.add_argument("--beam-width", type=count, default=None, help="beam: --option width=N, how many of the best candidates each step expands")
  search.add_argument("--sampler", default=None, help="optuna: --option sampler=NAME: tpe (default), cmaes, gp")
  search.add_argument("--study", default=None, help="study name: searches with the same name and --db tune together, on one budget")
  search.add_argument("--workers", type=count, default=1, help="start N local worker processes sharing one study and its budget (at most the cores)")
  search.add_argument("--oversubscribe", action="store_true", help="allow --workers beyond the number of cores")
  search.add_argument("--worker", type=int, default=None, help="with --study: this process's number (its seed, and the run --resume continues)")
  search.add_argument("--budget", type=count, default=None, help="candidates per kernel (default 200; with --seconds, no limit but the time)")
  search.add_argument("--seconds", type=seconds, default=None, help="time limit for the whole search, all kernels together")
  search.add_argument("--db", default=None, help=DB_HELP)
  search.add_argument("--resume", action="store_true", help="continue the last unfinished run with the same arguments")
  search.add_argument("--force", action="store_true", help="search even where the tuning cache has an entry")
  add_format(search)
  search.add_argument("--quiet", action="store_true", help="no progress bar")
  search.add_argument("--objective", default="median", choices=["median", "min"], help="what ranks candidates: their runs' median or min")
  search.add_argument("--verbose", action="store_true", help="a line per candidate as measured, with its %% of the best (TINYTUNE_PRINT_TUNING=1)")
  search.add_argument("--target", default=None, help=TARGET_HELP)


def add_bench_parser(sub: Any) -> None:
  bench = sub.add_parser("bench", help="time a workload with its default and tuned opts beside PyTorch and NumPy")
  bench.add_argument("workload", help="a workload of `tinytune kernels`")
  bench.add_argument("-p", "--param", action="append", default=[], help="KEY=VALUE, e.g. -p m=1024 (-p help lists them)")
  add_timing_args(bench)
  bench.add_argument("--no-peak", action="store_true", help="do not measure the device's peak throughput if it is not stored yet")
  bench.add_argument("--target", default=None, help=TARGET_HELP)


def add_compare_parser(sub: Any) -> None:
  compare = sub.add_parser("compare", help="a table over sizes (or one): tinytune default and tuned, PyTorch, NumPy, and the speedups")
  compare.add_argument("workload", help="a workload of `tinytune kernels`")
  compare.add_argument("--sweep", action="append", default=[], help="KEY=V1,V2,... (repeat for a grid), e.g. --sweep n=256,512; none: one size")
  compare.add_argument("-p", "--param", action="append", default=[], help="KEY=VALUE for every size, e.g. -p k=64 (-p help lists them)")
  compare.add_argument("--tune", action="store_true", help="search each size the tuning cache does not have (see --strategy, --budget)")
  compare.add_argument("--strategy", default="beam", help="search strategy for --tune (default beam)")
  compare.add_argument("--budget", type=count, default=40, help="candidates per kernel for --tune (default 40)")
  add_timing_args(compare)
  compare.add_argument("--target", default=None, help=TARGET_HELP)


def add_timing_args(p: argparse.ArgumentParser) -> None:
  """What bench and compare share: the device, dtype, baselines and timing, the output and the database."""
  p.add_argument("--device", default=None, help="device name (default: $TINYTUNE_DEVICE or CPU)")
  p.add_argument("--dtype", default="float32", help=DTYPE_HELP + "; PyTorch and NumPy run in it too")
  p.add_argument("--against", default=None, help=f"baselines to time: torch, numpy or both (default {DEFAULT_AGAINST}, without torch where "
                 "it is not installed; named here, a missing one is an error)")
  p.add_argument("--repeats", type=count, default=30, help="most timed repeats per implementation (default 30; fewer once the spread settles)")
  p.add_argument("--warm-cache", action="store_true", help="on a GPU, no L2 flush between repeats (default: flush, so each run starts cold)")
  add_format(p)
  p.add_argument("--db", default=None, help=DB_HELP)
  p.add_argument("--no-store", action="store_true", help="do not record the timings in the results database")


def add_report_parser(sub: Any) -> None:
  report = sub.add_parser("report", help="the results database as tables and plots: best results, baselines, search history")
  report.add_argument("--workload", default=None, help="only this workload")
  report.add_argument("--device", default=None, help="only this device: a kind (cpu), a label (CPU:1a2b3c4d) or a fingerprint hash prefix")
  report.add_argument("--kernel", default=None, help="only this kernel in best and history (NAME also matches NAME#2, NAME#3: same-named kernels)")
  add_format(report, "table (default), csv, md, json, html (one self-contained page with plots)")
  report.add_argument("--table", action="append", default=[], help="only this table: devices, best, baselines, history (repeatable)")
  report.add_argument("--out", default=None, help="write to this file instead of stdout")
  report.add_argument("--db", default=None, help=DB_HELP)


def add_devices_parsers(sub: Any) -> None:
  devices = sub.add_parser("devices", help="the devices tinytune knows: fingerprints of those present, what is missing for the others")
  add_format(devices)
  devices.add_argument("--probe", action="store_true", help="measure each present device's peak GFLOPS and GB/s again; each stored peak only rises")
  devices.add_argument("--db", default=None, help="results database for --probe: a SQLAlchemy URL or a SQLite file path")
  add_format(sub.add_parser("kernels", help="the workload catalog with its parameters and defaults"))


def main(argv: list[str] | None = None) -> int:
  from tinytune.helpers import on_stop_signal, stop_handled
  args = build_parser().parse_args(argv)
  args.started = STARTED if argv is None else time.monotonic()  # the command line's process, or a call from Python now
  stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if threading.current_thread() is threading.main_thread() else ()
  before = {signum: signal.signal(signum, on_stop_signal) for signum in stops}
  try: return _main(args)
  finally:
    stop_handled()
    for signum, handler in before.items(): signal.signal(signum, handler)  # a call from Python leaves its caller's handlers


def _main(args: argparse.Namespace) -> int:
  commands = {"search": cmd_search, "bench": cmd_bench, "compare": cmd_compare, "report": cmd_report, "devices": cmd_devices, "kernels": cmd_kernels,
              "db": cmd_db, "cache": cmd_cache}
  from sqlalchemy.exc import SQLAlchemyError

  from tinytune.helpers import Stopped, check_environment
  if getattr(args, "target", None): os.environ["TINYTUNE_CPU_TARGET"] = args.target  # the CPU device and search workers read it
  try:
    check_environment()
    if hasattr(args, "target") and os.getenv("TINYTUNE_CPU_TARGET"):  # said at once, whichever device runs (the CPU reads it only if used)
      from tinytune.runtime.cpu import cpu_target
      cpu_target()
    code = commands[args.command](args)
    sys.stdout.flush()  # a full disk (`> /dev/full`) fails here, in the try, not in Python's flush at exit
    return code
  except (ValueError, TypeError, RuntimeError, LookupError, SQLAlchemyError) as e:
    # database errors (unreachable server, locked or unreadable file) are one line too, in every command
    why = f"database error: {getattr(e, 'orig', None) or e}" if isinstance(e, SQLAlchemyError) else str(e) or type(e).__name__
    print(f"tinytune: error: {why.splitlines()[0]}", file=sys.stderr)
    return 2
  except MemoryError:
    print("tinytune: error: out of memory; try smaller sizes (-p)", file=sys.stderr)
    return 2
  except OSError as e:  # a write that failed: stdout on a full disk or a closed pipe, an output file
    try: sys.stdout.flush()
    except OSError: os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the flush at exit has nothing left to fail
    print(f"tinytune: error: cannot write {e.filename or 'the output'}: {e.strerror or e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt as e:
    print("tinytune: interrupted; what was measured is stored (continue with --resume)", file=sys.stderr)
    return 128 + (e.signum if isinstance(e, Stopped) else signal.SIGINT)


if __name__ == "__main__":
  sys.exit(main())
