"""Kernel + opts -> a program on its device, once per process: which opts a kernel runs with, and the lowering cache.

A structurally equal kernel (the same `kernel.key`) with the same opts on the same device is rendered and compiled once;
the tuning cache is consulted once per kernel key and device (`engine.forget()` after a search or an import in this process)."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from tinytune.codegen.heuristic import default_opts
from tinytune.codegen.kernel import Kernel
from tinytune.codegen.opts import Opt
from tinytune.helpers import NOOPT, tune_mode
from tinytune.runtime import Device, Program


class GlobalCounters:
  """Totals since the last reset(): kernels run, ops, bytes moved, device seconds; and the engine's work done and skipped
  (renders, compiles, lowering-cache hits, schedule-cache hits and misses): a steady-state program renders and compiles nothing."""
  kernel_count = global_ops = global_mem = 0
  time_sum_s = 0.0
  renders = compiles = program_hits = schedule_hits = schedule_misses = 0

  @staticmethod
  def reset() -> None:
    for name in ("kernel_count", "global_ops", "global_mem", "renders", "compiles", "program_hits", "schedule_hits", "schedule_misses"):
      setattr(GlobalCounters, name, 0)
    GlobalCounters.time_sum_s = 0.0


# "module:function" that tunes a kernel on first use (TINYTUNE_TUNE=beam, or BEAM=N): (kernel, device, strategy) -> opts. The search
# module registers it; the engine loads it by name only when asked, so the run path never imports the search.
FIRST_USE_TUNER = "tinytune.search.tune:tune_on_first_use"
_first_use_tuner: Callable[[Kernel, str, str], tuple[Opt, ...]] | None = None


def kernel_opts(kernel: Kernel, device: str) -> tuple[Opt, ...]:
  """The opts `kernel` runs with: the tuning cache's where it has them, else (TINYTUNE_TUNE=beam, optuna, random, or tinygrad's
  BEAM=N) tuned now, else the heuristic defaults. TINYTUNE_TUNE=0 and NOOPT skip the cache."""
  mode = tune_mode()
  key = (kernel.key, device, mode, NOOPT.value)
  if (opts := opts_memo.get(key)) is None:
    if NOOPT or mode == "0": opts = tuple(default_opts(kernel))
    elif (tuned := _tuning_cache().lookup(kernel, device)) is not None: opts = tuned.opts
    elif mode not in ("1", ""): opts = _tuner()(kernel, device, mode)
    else: opts = tuple(default_opts(kernel))
    opts_memo[key] = opts
  return opts


opts_memo: dict[tuple, tuple[Opt, ...]] = {}


def _tuning_cache():  # type: ignore[no-untyped-def]
  from tinytune.results_db.cache import TuningCache  # SQLAlchemy loads on the first kernel, not on import
  return TuningCache()


def _tuner() -> Callable[[Kernel, str, str], tuple[Opt, ...]]:
  global _first_use_tuner
  if _first_use_tuner is None:
    module, fn = FIRST_USE_TUNER.split(":")
    _first_use_tuner = getattr(importlib.import_module(module), fn)
  return _first_use_tuner


@dataclass(frozen=True)
class CompiledKernel:
  """A kernel lowered and compiled for its device: run it as `program(out, *inputs)` (buffers in `Kernel.bufs` order)."""
  name: str
  program: Program
  opts: tuple[Opt, ...]
  flops: int
  mem_bytes: int
  src: str
  ast_text: str


_programs: dict[tuple[str, tuple[Opt, ...], str], CompiledKernel] = {}


def compile_kernel(kernel: Kernel, device: str) -> tuple[Program, str]:
  """Render and compile a kernel with the opts already applied to it (cached by key, opts and device)."""
  key = (kernel.key, tuple(kernel.opts), device)
  if (ck := _programs.get(key)) is None:
    GlobalCounters.renders += 1
    dev = Device[device]
    src = dev.renderer.render(kernel)
    GlobalCounters.compiles += 1
    ck = _programs[key] = CompiledKernel(kernel.name, dev.program(kernel.name, dev.compile(src), kernel.launch_dims), tuple(kernel.opts),
                                         kernel.flops, kernel.mem_bytes, src, kernel.ast_text)
  else: GlobalCounters.program_hits += 1
  return ck.program, ck.src


def lower(kernel: Kernel, device: str) -> CompiledKernel:
  """A fresh kernel with the opts it runs with, compiled."""
  opts = kernel_opts(kernel, device)
  if (ck := _programs.get((kernel.key, opts, device))) is not None:
    GlobalCounters.program_hits += 1
    return ck
  compile_kernel(kernel.apply_opts(opts), device)
  return _programs[(kernel.key, opts, device)]
