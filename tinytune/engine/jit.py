"""TinyJit: capture the kernels a function runs, then replay them on new inputs with no graph building, scheduling or
per-kernel Python. The device's own batch replays them where it has one (runtime: one native call on the CPU, a graph on CUDA)."""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar

from tinytune import rng
from tinytune.engine import schedule
from tinytune.engine.program import CompiledKernel, GlobalCounters
from tinytune.engine.realize import Flag, capturing, run_kernel
from tinytune.engine.schedule import is_buffer_view
from tinytune.helpers import DEBUG, prod
from tinytune.runtime import Buffer, Compiled, Device
from tinytune.tensor import Tensor, checks
from tinytune.uop import BUFFER, VIEW, Ops, UOp

R = TypeVar("R")


def _input_buffer(t: Tensor) -> Buffer:
  """The buffer that holds a realized input, copied to a buffer of its own where it is a view into a larger one."""
  if (u := t.uop).op is VIEW and (b := u.src[0]).op is BUFFER and not t._pending and u.arg.contiguous and \
     prod(u.arg.shape) == b.arg.size and schedule.realized(u) is None: return b.arg  # realized already, as a replay's inputs mostly are
  t.realize()
  if not (is_buffer_view(t.uop) and t.uop.arg.contiguous and prod(t.shape) == t.uop.src[0].arg.size):
    t.uop = Tensor(UOp(Ops.CONTIGUOUS, t.dtype, (t.uop,)), device=t.device).realize().uop
  return t.uop.src[0].arg


@dataclass
class _Captured:
  """The kernels of one call, each with its buffers: an int is the place of an input among the call's Tensor arguments."""
  steps: list[tuple[CompiledKernel, list[Buffer | int]]]
  inputs: list[tuple[tuple[int, ...], Any, str]]  # (shape, dtype, device) of each Tensor argument
  others: tuple  # the non-Tensor arguments, which the captured kernels may have baked in
  ret: Any
  draws: list[tuple[Buffer, int]]  # random number state buffers to refill before each replay
  device: str  # where the kernels run (a function with no Tensor arguments has only its kernels' buffers to say)
  dev: Compiled  # that device
  batch: Callable[[list[Buffer]], None] | None = None
  # CHECK's flags that the kernels store an index out of range into, by the number of steps after which they are read: right after
  # the last kernel that stores into each, so that a bad index raises before the kernels after it write memory, as at a realize
  checks: dict[int, tuple[Flag, ...]] = field(default_factory=dict)


class TinyJit(Generic[R]):
  """`@TinyJit` on a function of Tensors that realizes what it returns: the first call runs it, the second captures the
  kernels it runs, later calls replay them on the new inputs (same shapes and dtypes) and return the same output Tensors,
  refilled. Kernels only: Python side effects of the function happen on the first two calls alone."""

  def __init__(self, fn: Callable[..., R]):
    self.fn, self.calls = fn, 0
    self.captured: _Captured | None = None
    functools.update_wrapper(self, fn)  # type: ignore[arg-type]

  def reset(self) -> None: self.calls, self.captured = 0, None

  def __call__(self, *args: Any, **kwargs: Any) -> R:
    if checks.pending: checks.run_pending()  # what a realize of the inputs would check
    tensors: list[Tensor] = []
    others: list[Any] = []  # the positional non-Tensors, then (name, value) of each keyword that is not a Tensor
    for a in args: (tensors if isinstance(a, Tensor) else others).append(a)
    for name, a in kwargs.items(): tensors.append(a) if isinstance(a, Tensor) else others.append((name, a))
    inputs = [_input_buffer(t) for t in tensors]
    self.calls += 1
    if self.captured is not None: return self._replay(tensors, inputs, tuple(others))
    if self.calls == 1: return self._realized(self.fn(*args, **kwargs))
    schedule.forget_realized()  # forget what earlier realizes computed: a kernel the capture skipped for it would be missing from every replay
    with capturing() as captured, rng.recording() as draws: ret = self._realized(self.fn(*args, **kwargs))
    where = {id(b): i for i, b in enumerate(inputs)}
    steps = [(kernel, [where.get(id(b), b) for b in bufs]) for kernel, bufs in captured]
    device = next((b.device for _, bufs in captured for b in bufs), tensors[0].device if tensors else Device.DEFAULT)
    cap = self.captured = _Captured(steps, [(t.shape, t.dtype, t.device) for t in tensors], tuple(others), ret, draws, device, Device[device])
    last = {b: n + 1 for n, (_, bufs) in enumerate(captured) for b in bufs if isinstance(b, Flag)}
    for flag, n in last.items(): cap.checks[n] = (*cap.checks.get(n, ()), flag)
    cuts = [0, *sorted(n for n in cap.checks if n < len(steps)), len(steps)]
    parts = [p for a, b in zip(cuts, cuts[1:]) if steps and (p := cap.dev.batch([(k.program, bufs) for k, bufs in steps[a:b]])) is not None]
    if parts and len(parts) == len(cuts) - 1: cap.batch = parts[0] if len(parts) == 1 else functools.partial(self._parts, parts, cuts[1:])
    return ret

  def _parts(self, parts: list[Callable[[list[Buffer]], None]], ends: list[int], inputs: list[Buffer]) -> None:
    """The batches of the steps between reads of CHECK's flags, reading each between them."""
    assert self.captured is not None
    for part, end in zip(parts, ends):
      part(inputs)
      if end < len(self.captured.steps): self._check(end)

  @staticmethod
  def _realized(ret: R) -> R:
    for t in ret.values() if isinstance(ret, dict) else ret if isinstance(ret, (tuple, list)) else (ret,):
      if isinstance(t, Tensor): t.realize()
    return ret

  def _replay(self, tensors: list[Tensor], inputs: list[Buffer], others: tuple) -> R:
    cap = self.captured
    assert cap is not None
    got = [(t.shape, t.dtype, t.device) for t in tensors]
    if got != cap.inputs:
      raise ValueError(f"{self.fn.__name__} was captured by TinyJit with Tensor arguments {_show(cap.inputs)}, not {_show(got)}: "
                       "call it with the same shapes and dtypes, or reset() it")
    if others != cap.others:
      raise ValueError(f"{self.fn.__name__} was captured by TinyJit with the other arguments {cap.others!r:.200}, not {others!r:.200}: "
                       "the kernels may have them baked in; pass them as Tensors, or reset() the jit")
    if cap.draws: rng.refill(cap.draws)
    if (batch := cap.batch) is not None:
      GlobalCounters.kernel_count += len(cap.steps)
      # the device's time: an asynchronous device waits for it only under DEBUG=2; a synchronous one's is the host clock's
      if (debug := DEBUG.value) >= 2: GlobalCounters.time_sum_s += (seconds := cap.dev.timed(lambda: batch(inputs)))
      elif not cap.dev.asynchronous:  # Compiled.timed's host clock, without its calls
        st = time.perf_counter()
        batch(inputs)
        GlobalCounters.time_sum_s += time.perf_counter() - st
      else: batch(inputs)
      if debug >= 2: print(f"TinyJit {self.fn.__name__}: {len(cap.steps)} kernels in one call, {seconds * 1e6:.1f} us")
    else:
      for n, (kernel, bufs) in enumerate(cap.steps):
        run_kernel(kernel, [inputs[b] if isinstance(b, int) else b for b in bufs], cap.device)
        if n + 1 < len(cap.steps): self._check(n + 1)
    self._check(len(cap.steps))
    return cap.ret

  def _check(self, steps: int) -> None:
    assert self.captured is not None
    for f in self.captured.checks.get(steps, ()): f.check()


def _show(inputs: list[tuple[tuple[int, ...], Any, str]]) -> str:
  return ", ".join(f"{shape} {dtype.name} on {device}" for shape, dtype, device in inputs) or "none"
