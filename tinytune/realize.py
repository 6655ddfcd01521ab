"""Run a schedule: pick each kernel's opts, render, compile (cached), run, and count."""
from __future__ import annotations

import functools
import os
import sys
from typing import Any

from tinytune.codegen.heuristic import hand_coded_optimizations
from tinytune.codegen.kernel import Kernel
from tinytune.codegen.opts import Opt, opts_from_json
from tinytune.helpers import DEBUG, NOOPT
from tinytune.runtime import Device, Program
from tinytune.schedule import ScheduleItem, realized


class GlobalCounters:
  """Totals since the last reset(): kernels run, ops, bytes moved, device seconds."""
  kernel_count = 0
  global_ops = 0
  global_mem = 0
  time_sum_s = 0.0

  @staticmethod
  def reset() -> None:
    GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem, GlobalCounters.time_sum_s = 0, 0, 0, 0.0


def default_opts(kernel: Kernel) -> list[Opt]: return [] if NOOPT else hand_coded_optimizations(kernel)


_warned: set[str] = set()


def warn_once(message: str) -> None:
  if message not in _warned:
    _warned.add(message)
    print(f"tinytune: warning: {message}", file=sys.stderr)


@functools.lru_cache(maxsize=None)
def _tuner(device: str, strategy: str) -> Any:
  from tinytune.search.tune import Tuner
  return Tuner(_database(os.getenv("TINYTUNE_DB") or ""), device, strategy)


@functools.lru_cache(maxsize=4096)
def _tuned_entries(key: str, device: str) -> tuple[tuple[str, str], ...]:
  """(where, opts JSON) for this kernel on this device, in order of preference: the user's own database (read only), then the
  entry measured fastest on this device's fingerprint among the cache files in $TINYTUNE_CACHE."""
  from tinytune.results_db import database_url, fingerprint_hash
  from tinytune.results_db.cache import deployed
  from tinytune.search.tune import device_fingerprint
  device_hash, found = fingerprint_hash(device_fingerprint(device)), []
  parsed = database_url(None)  # $TINYTUNE_DB or the default file
  url, shown = parsed.render_as_string(hide_password=False), parsed.render_as_string()
  if not (parsed.get_backend_name() == "sqlite" and parsed.database and not os.path.exists(parsed.database)):
    try:
      if (entry := _reader(url).tuned(key, device_hash)) is not None: found.append((shown, entry.opts_json))
    except Exception as e:  # an unreadable database costs a warning, never the program
      warn_once(f"the tuning cache {shown} is unusable ({str(e).splitlines()[0]}); not using it")
  if (cached := deployed(os.getenv("TINYTUNE_CACHE", ""), device_hash, warn_once).get(key)) is not None: found.append((cached[0], cached[1].opts))
  return tuple(found)


def tuned_opts(kernel: Kernel, device: str) -> tuple[Opt, ...] | None:
  """The tuning cache's opts for this kernel on this device, validated; None where it has none (or none valid)."""
  for where, text in _tuned_entries(kernel.key, device):
    try:
      opts = tuple(opts_from_json(text))
      kernel.copy().apply_opts(opts)
      return opts
    except Exception as e:  # KernelOptError or ValueError for a bad entry; anything else from a hostile one is no better
      why = str(e).splitlines()[0] if str(e) else type(e).__name__
      warn_once(f"ignoring the tuning cache entry for {kernel.name} ({kernel.key[:8]}) in {where}: {why}")
  return None


@functools.lru_cache(maxsize=8)
def _reader(url: str) -> Any:
  from tinytune.results_db import Database
  return Database(url, read_only=True)


@functools.lru_cache(maxsize=8)
def _database(url: str) -> Any:
  from tinytune.results_db import Database
  return Database(url or None)


def kernel_opts(kernel: Kernel, device: str) -> list[Opt]:
  """Opts for running `kernel`: tuned ones from the cache where it has them, else (TINYTUNE_TUNE=beam etc.) tune now, else defaults."""
  mode = os.getenv("TINYTUNE_TUNE", "1")
  if NOOPT or mode == "0": return default_opts(kernel)
  if (opts := tuned_opts(kernel, device)) is not None: return list(opts)
  if mode not in ("1", ""):
    tuner = _tuner(device, mode)
    device_id = tuner.db.device_id(tuner.fingerprint)
    run_id = tuner.db.start_run(kernel.name, {}, device_id, mode, {}, tuner.budget, f"on first use: {kernel.key}")
    outcome = tuner.tune_kernel(kernel, run_id, device_id)
    tuner.db.finish_run(run_id, "done")
    _tuned_entries.cache_clear()
    return list(outcome.best)
  return default_opts(kernel)


@functools.lru_cache(maxsize=4096)
def _program(device: str, src: str, name: str, launch: tuple[int, int]) -> Program:
  dev = Device[device]
  return dev.program(name, dev.compile(src), launch)


def compile_kernel(kernel: Kernel, device: str) -> tuple[Program, str]:
  src = Device[device].renderer.render(kernel)
  return _program(device, src, kernel.name, kernel.launch_dims), src


def run_schedule(items: list[ScheduleItem]) -> None:
  for item in items:
    device = item.out.device
    kernel = Kernel(item.ast, Device[device].caps)
    if item.out.size == 0:  # an empty output: nothing to compute
      realized[item.node] = item.view
      continue
    kernel.apply_opts(kernel_opts(kernel, device))
    if DEBUG >= 5: print(kernel.ast_text)
    program, src = compile_kernel(kernel, device)
    if DEBUG >= 4: print(src)
    seconds = program(item.out, *kernel.bufs)
    realized[item.node] = item.view
    GlobalCounters.kernel_count += 1
    GlobalCounters.global_ops += kernel.flops
    GlobalCounters.global_mem += kernel.mem_bytes
    GlobalCounters.time_sum_s += seconds
    if DEBUG >= 2:
      gflops, gbs = (kernel.flops / seconds / 1e9, kernel.mem_bytes / seconds / 1e9) if seconds else (0.0, 0.0)
      print(f"{GlobalCounters.kernel_count:4d} {kernel.name:30s} {device:5s} bufs {len(kernel.bufs) + 1:2d} mem {kernel.mem_bytes / 1e6:8.2f} MB "
            f"{seconds * 1e6:9.1f} us {gflops:8.2f} GFLOPS {gbs:7.2f} GB/s" + (f"  opts {kernel.opts}" if DEBUG >= 3 else ""))
