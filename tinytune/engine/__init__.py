"""The run path: schedule (fused kernels) -> lower (kernel + opts -> program, cached) -> run; TinyJit replays whole steps."""
from __future__ import annotations

from tinytune.engine.jit import TinyJit
from tinytune.engine.program import GlobalCounters, compile_kernel, compiled, kernel_opts, kernels
from tinytune.engine.realize import forget, realize, schedule_many

__all__ = ["GlobalCounters", "TinyJit", "compile_kernel", "compiled", "forget", "kernel_opts", "kernels", "realize", "schedule_many"]
