"""Kernel + opts -> a program on its device, once per process: which opts a kernel runs with, and the lowering cache.

A structurally equal kernel (the same `kernel.key`) with the same opts on the same device is rendered and compiled once;
the tuning cache is consulted once per kernel key and device (`engine.forget()` after a search or an import in this process)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence, overload

from tinytune.codegen.heuristic import default_opts
from tinytune.codegen.kernel import Kernel
from tinytune.codegen.opts import Opt
from tinytune.engine.schedule import ScheduleItem, create_schedule
from tinytune.helpers import DEBUG, NOOPT, env_count, tune_mode, unique_names
from tinytune.runtime import Device, Program
from tinytune.uop import UOp


class _Counters:
  """Totals since the last reset(): kernels run, ops, bytes moved, device seconds; and the engine's work done and skipped
  (renders, compiles, lowering-cache hits, schedule-cache hits and misses): a steady-state program renders and compiles nothing.
  One object's attributes, not a class's: every kernel run adds to them, and setting a class attribute is four times slower."""
  def __init__(self) -> None: self.reset()

  def reset(self) -> None:
    self.kernel_count = self.global_ops = self.global_mem = 0
    self.time_sum_s = 0.0
    self.renders = self.compiles = self.program_hits = self.schedule_hits = self.schedule_misses = 0


GlobalCounters = _Counters()


# what tunes a kernel on first use (TINYTUNE_TUNE=beam, or BEAM=N): (kernel, device, strategy) -> opts. tinytune.api registers one that
# loads the search when it is first called: the engine never imports the search, and a program that never tunes never loads it (nor
# SQLAlchemy).
_first_use_tuner: Callable[[Kernel, str, str], tuple[Opt, ...]] | None = None


def register_first_use_tuner(tuner: Callable[[Kernel, str, str], tuple[Opt, ...]]) -> None:
  global _first_use_tuner
  _first_use_tuner = tuner


def kernels(program: UOp | Sequence[ScheduleItem], device: str) -> list[tuple[str, Kernel]]:
  """The kernels of a program, a lazy graph (its schedule) or a schedule, in the order they run, each with its label: its name made
  unique in the program (the second of two different kernels named r_1024_1_1024 is r_1024_1_1024#2; a kernel run twice has one)."""
  items = create_schedule(program, device)[0] if isinstance(program, UOp) else program
  ret = [Kernel(item.ast, Device[device].caps) for item in items]
  labels = unique_names((k.key, k.name) for k in ret)
  return [(labels[k.key], k) for k in ret]


Policy = Literal["run", "tuned", "default"]


@overload
def kernel_opts(kernel: Kernel, device: str, policy: Literal["run", "default"] = "run", db: Any = None) -> tuple[Opt, ...]: ...
@overload
def kernel_opts(kernel: Kernel, device: str, policy: Policy, db: Any = None) -> tuple[Opt, ...] | None: ...


def kernel_opts(kernel: Kernel, device: str, policy: Policy = "run", db: Any = None) -> tuple[Opt, ...] | None:
  """The opts of `kernel` on `device`: `default` the heuristics'; `tuned` the tuning cache's (`db`'s, else the default one's), None
  where it lacks them; `run` what a realize runs: the tuning cache's where it has them, else (TINYTUNE_TUNE=beam, optuna, random,
  or tinygrad's BEAM=N) tuned now, else the heuristics'. Under TINYTUNE_TUNE=0 and NOOPT a run skips the cache; under
  TINYTUNE_RETUNE=1 (tinygrad's IGNORE_BEAM_CACHE=1) with a strategy, it searches again what the cache has."""
  if policy == "default": return tuple(default_opts(kernel))
  if policy == "tuned": return None if (found := _tuning_cache(db).lookup(kernel, device)) is None else found.opts
  if policy != "run": raise ValueError(f"unknown opts policy {policy!r}; use run, tuned or default")
  mode = tune_mode()
  key = (kernel.key, device, mode, NOOPT.value)
  if (opts := opts_memo.get(key)) is None:
    if NOOPT or mode == "0": opts, source = tuple(default_opts(kernel)), f"the heuristic defaults ({'NOOPT' if NOOPT else 'TINYTUNE_TUNE=0'})"
    elif not (retune() and mode not in ("1", "")) and (tuned := _tuning_cache().lookup(kernel, device)) is not None:
      opts, source = tuned.opts, f"the tuning cache ({tuned.where})"
    elif mode not in ("1", ""): opts, source = _tune(kernel, device, mode), f"a first-use {mode} search"
    else: opts, source = tuple(default_opts(kernel)), "the heuristic defaults (not in the tuning cache)"
    if DEBUG >= 2: print(f"{kernel.name} on {device}: opts from {source}")
    opts_memo[key] = opts
  return opts


opts_memo: dict[tuple, tuple[Opt, ...]] = {}


def retune() -> bool:
  """TINYTUNE_RETUNE=1 (or tinygrad's IGNORE_BEAM_CACHE=1): searches ignore what the tuning cache has, and store what they find."""
  return bool(env_count("TINYTUNE_RETUNE", 0) or env_count("IGNORE_BEAM_CACHE", 0))


def _tuning_cache(db: Any = None):  # type: ignore[no-untyped-def]
  from tinytune.results_db.cache import TuningCache  # SQLAlchemy loads on the first kernel, not on import
  return TuningCache(db)


def _tune(kernel: Kernel, device: str, strategy: str) -> tuple[Opt, ...]:
  assert _first_use_tuner is not None, "tinytune.api registers the first-use tuner when tinytune is imported"
  return _first_use_tuner(kernel, device, strategy)


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


def compiled(kernel: Kernel, device: str) -> CompiledKernel:
  """A fresh kernel compiled with the opts a realize runs it with (kernel_opts' `run`)."""
  opts = kernel_opts(kernel, device)
  if (ck := _programs.get((kernel.key, opts, device))) is not None:
    GlobalCounters.program_hits += 1
    return ck
  compile_kernel(kernel.apply_opts(opts), device)
  return _programs[(kernel.key, opts, device)]
