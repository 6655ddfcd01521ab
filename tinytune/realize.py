"""Run a schedule: pick each kernel's opts, render, compile (cached), run, and count."""
from __future__ import annotations

import functools

from tinytune.codegen.heuristic import hand_coded_optimizations
from tinytune.codegen.kernel import Kernel
from tinytune.codegen.opts import Opt
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


@functools.lru_cache(maxsize=4096)
def _program(device: str, src: str, name: str) -> Program:
  dev = Device[device]
  return dev.program(name, dev.compile(src))


def compile_kernel(kernel: Kernel, device: str) -> tuple[Program, str]:
  src = Device[device].renderer.render(kernel)
  return _program(device, src, kernel.name), src


def run_schedule(items: list[ScheduleItem]) -> None:
  for item in items:
    device = item.out.device
    kernel = Kernel(item.ast, Device[device].caps)
    kernel.apply_opts(default_opts(kernel))
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
