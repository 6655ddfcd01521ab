"""The candidate runner: a separate process that holds a kernel's buffers on its device and runs compiled candidates.

Started as `python -m tinytune.search.worker`; speaks JSON lines on stdin/stdout (compiled programs travel as base64).
A candidate that crashes kills only this process."""
from __future__ import annotations

import base64
import json
import math
import os
import signal
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np


def fill(arr: np.ndarray, rng: np.random.Generator) -> None:
  if arr.dtype == np.bool_: arr[:] = rng.random(arr.size) < 0.5
  elif arr.dtype.kind in "iu": arr[:] = rng.integers(0, 8, arr.size)
  else: arr[:] = rng.uniform(-1, 1, arr.size)


def timed(run: Callable[[], float], policy: dict) -> list[float]:
  """Warm up (for warmup_seconds, or warmup_runs runs where they end sooner), then repeat until (median - min) / median settles or
  the time cap is hit; `run` returns device seconds. A first run slower than `cutoff` seconds (when set) is the only sample: the
  search needs no more to drop the candidate."""
  st = time.perf_counter()
  if (first := run()) > (policy.get("cutoff") or math.inf): return [first]
  warm, most = 0, math.inf if policy.get("warmup_runs") is None else policy["warmup_runs"]  # 0: no warm-up run, not unlimited
  while time.perf_counter() - st < policy["warmup_seconds"] and warm < most:
    run()
    warm += 1
  times: list[float] = []
  st = time.perf_counter()
  while len(times) < policy["max_repeats"]:
    times.append(run())
    med = statistics.median(times)
    settled = med <= 0 or (med - min(times)) / med < policy["settle"] or time.perf_counter() - st > policy["max_seconds"]
    if len(times) >= policy["min_repeats"] and settled: break
  return times


class Reference:
  """A reference output with what comparing outputs to it takes worked out once: a search compares every candidate with it, and
  a float32 4096x4096 output took 260 ms a candidate to compare in float64 from scratch (Zen 4), about what the GPU took to time it.
  An element may be off by tol of itself plus tol of the largest finite output (a sum rounds relative to its terms, not to its
  result, which cancellation can make tiny), times sqrt(terms / 256) for long sums; inf and NaN must match exactly."""

  def __init__(self, ref: np.ndarray, tol: float, terms: int = 1):
    self.ref, self.tol = ref, tol
    if not tol: return  # integers and bools: exact
    self.b = ref.astype(np.float64 if ref.dtype == np.float64 else np.float32)
    self.odd = ~np.isfinite(self.b)
    finite = np.abs(self.b[~self.odd])
    tol *= max(1.0, math.sqrt(terms / 256))
    self.limit = tol * np.abs(self.b) + tol * max(1.0, float(finite.max()) if finite.size else 1.0)
    self.any_odd = bool(self.odd.any())
    self.diff = np.empty_like(self.b)  # each comparison's |out - ref|, in memory made once

  def mismatches(self, out: np.ndarray) -> np.ndarray:
    """Where `out` is not the reference within rounding."""
    if not self.tol: return out != self.ref
    a = out.astype(self.b.dtype, copy=False)
    diff = np.abs(np.subtract(a, self.b, out=self.diff), out=self.diff)
    with np.errstate(invalid="ignore", over="ignore"): bad = ~np.less_equal(diff, self.limit)
    if self.any_odd:
      ao, bo = a[self.odd], self.b[self.odd]
      bad[self.odd] = ~((ao == bo) | (np.isnan(ao) & np.isnan(bo)))
    return bad


def mismatches(out: np.ndarray, ref: np.ndarray, tol: float, terms: int = 1) -> np.ndarray:
  """Where `out` is not `ref` within rounding (Reference says how)."""
  return Reference(ref, tol, terms).mismatches(out)


def sentinel_value(is_float: bool, dtype: np.dtype) -> Any:
  """What the output holds before a candidate runs, so that outputs it skips show up as wrong."""
  return np.nan if is_float else 0x5A if dtype.kind in "iu" else True


DEVICE_CHECK_MIN = 1 << 16  # outputs from this many elements are compared on an asynchronous device (a GPU): their copy out costs more


class DeviceCheck:
  """Reference's rule as one of tinytune's own kernels on the device that holds the output: the reference and each element's limit
  (NaN where the reference is inf or NaN, which only an equal value or a NaN matches) stay on the device, and only a count per row of
  the output comes back (the worst error too where some differ). A float16 4096x4096 output took 178 ms a candidate to copy out
  and compare on the host (H200), longer than the candidate's own timing."""

  def __init__(self, check: Reference, out: Any):
    from tinytune import Tensor, dtypes
    from tinytune.engine.schedule import buffer_view
    dev, n = out.device, out.size
    rows = math.gcd(n, 4096)  # partial counts, so the reduction has rows to spread over the cores or workgroups
    got = Tensor._of(buffer_view(out, (n,)), dev)
    if not check.tol:
      ref = Tensor(check.ref, device=dev)
      bad, diff = got != ref, (got.cast(dtypes.float32) - ref.cast(dtypes.float32)).abs()
    else:
      ref, limit = Tensor(check.b, device=dev), Tensor(np.where(check.odd, np.nan, check.limit).astype(check.b.dtype), device=dev)
      a = got.cast(ref.dtype)
      diff = (a - ref).abs()
      bad = ((diff <= limit) | (a == ref) | (a.isnan() & ref.isnan())).logical_not()
      diff = diff.isnan().where(math.inf, diff)  # a NaN where a number belongs is as wrong as can be (a max would skip it)
    self.count = bad.reshape(rows, n // rows).sum(axis=1).uop
    self.worst = bad.where(diff, 0).reshape(rows, n // rows).max(axis=1).uop
    self.device, self.blank = dev, sentinel_value(out.dtype.is_float, check.ref.dtype)
    self.sentinel = Tensor.full((n,), self.blank, dtype=out.dtype, device=dev).uop

  @staticmethod
  def tried(check: Reference, out: Any) -> DeviceCheck | None:
    """The device check, where its kernels build and run here and find the reference (still in `out`) right and the sentinel wrong;
    else None, and the host compares (a check that cannot be trusted on some device is no check)."""
    try:
      ret = DeviceCheck(check, out)
      if ret() != (0, 0.0): return None
      ret.fill(out)
      return ret if ret()[0] > 0 or not check.mismatches(np.full(out.size, ret.blank, dtype=check.ref.dtype)).any() else None
    except Exception: return None  # a dtype this device lacks, or its kernels failed to build

  def fill(self, out: Any) -> None:
    """Write the sentinel into the output on the device: elements a candidate skips show up as wrong."""
    from tinytune.engine.realize import realize
    realize(self.sentinel, self.device, into=out)

  def __call__(self) -> tuple[int, float]:
    """The number of outputs that differ from the reference, and the largest difference among them (0.0 where none does)."""
    from tinytune import Tensor
    from tinytune.engine.schedule import forget_realized
    forget_realized()  # the output's memory was written by a candidate since the last check: compute the check again
    if not (count := int(Tensor._of(self.count, self.device).numpy().sum())): return 0, 0.0
    return count, float(Tensor._of(self.worst, self.device).numpy().max())


def serve(spec: dict, requests: Any, reply: Any) -> None:
  from tinytune.dtype import dtypes
  from tinytune.runtime import Buffer, Device
  device = spec["device"]
  dev = Device[device]
  rng = np.random.default_rng(spec["seed"])
  inputs = []
  for n, name in spec["inputs"]:
    arr = np.empty(n, dtype=(dt := dtypes.from_any(name)).np)
    fill(arr, rng)
    inputs.append(Buffer(device, n, dt).copyin(arr))
  out = Buffer(device, spec["out"][0], dtypes.from_any(spec["out"][1]))
  def program(lib: str, name: str, launch: list[int]) -> Any: return dev.program(name, base64.b64decode(lib), (launch[0], launch[1]))
  if (saved := spec.get("ref_file")) and os.path.exists(saved):  # a restart: computed once (bfloat16 comes back as raw 'V2' bytes)
    ref = np.load(saved, allow_pickle=False).view(out.dtype.np)
  else:
    program(*spec["ref"])(out, *inputs)
    ref = out.numpy_view().copy()
    if saved: np.save(saved, ref, allow_pickle=False)
  check = Reference(ref, {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-4, "float64": 1e-9}.get(ref.dtype.name, 0), spec.get("terms", 1))
  sentinel = np.full(ref.size, sentinel_value(out.dtype.is_float, ref.dtype), dtype=ref.dtype)
  on_device = spec.get("device_check")
  wanted = on_device or on_device is None and dev.asynchronous and ref.size >= DEVICE_CHECK_MIN
  if (device_check := DeviceCheck.tried(check, out) if wanted else None) is None and on_device:
    raise RuntimeError("the device check failed its test on the reference")
  def measure(lib: str, name: str, launch: list[int], policy: dict, verify: bool) -> list:
    """[status, the times or why not, seconds verifying, seconds timing]."""
    prg, st = program(lib, name, launch), time.perf_counter()
    if verify:
      if device_check is None:
        out.copyin(sentinel)
        prg(out, *inputs)
        if (bad := check.mismatches(out.numpy_view())).any():
          return ["wrong", f"{int(bad.sum())} of {ref.size} outputs differ from the reference, first at {int(np.argmax(bad))}",
                  time.perf_counter() - st, 0.0]
      else:
        device_check.fill(out)
        prg(out, *inputs)
        if (found := device_check())[0]:
          return ["wrong", f"{found[0]} of {ref.size} outputs differ from the reference, the worst by {found[1]:.3g}", time.perf_counter() - st, 0.0]
    verify_s = time.perf_counter() - st  # the run, the copy out and the comparison: the seconds before timing
    times = timed(lambda: prg.timed(out, *inputs), policy)
    return ["ok", times, verify_s, time.perf_counter() - st - verify_s]
  reply(["ready", "device" if device_check is not None else "host"])
  answered = time.perf_counter()
  for line in requests:
    got, msg = time.perf_counter(), json.loads(line)
    if msg[0] != "run": break
    # and by its own clock: how long it waited for this request (idle), and how long it took to answer it
    reply([*measure(*msg[1:]), got - answered, time.perf_counter() - got])
    answered = time.perf_counter()


def main() -> None:
  # a terminal's Ctrl-C or hangup reaches the whole process group: the search that owns this worker stops it (or stdin ends)
  for signum in (signal.SIGINT, signal.SIGHUP): signal.signal(signum, signal.SIG_IGN)
  os.environ["TINYTUNE_TUNE"] = "0"  # the device check's kernels take the heuristics' opts: no search, no tuning cache, inside a search
  def reply(obj: list) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
  serve(json.loads(sys.stdin.readline()), sys.stdin, reply)


if __name__ == "__main__":
  main()
