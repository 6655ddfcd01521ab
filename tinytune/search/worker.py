"""The candidate runner: a separate process that holds a kernel's buffers and runs compiled candidates on them.

Started as `python -m tinytune.search.worker`; speaks JSON lines on stdin/stdout. A candidate that crashes kills only
this process. Uses numpy and ctypes alone so it starts fast."""
from __future__ import annotations

import ctypes
import json
import statistics
import sys
import time
from typing import Any

import numpy as np


def fill(arr: np.ndarray, rng: np.random.Generator) -> None:
  if arr.dtype == np.bool_: arr[:] = rng.random(arr.size) < 0.5
  elif arr.dtype.kind in "iu": arr[:] = rng.integers(0, 8, arr.size)
  else: arr[:] = rng.uniform(-1, 1, arr.size)


def call(fxn: Any, arrays: list[np.ndarray]) -> float:
  ptrs = [ctypes.c_void_p(a.ctypes.data) for a in arrays]
  st = time.perf_counter()
  fxn(*ptrs)
  return time.perf_counter() - st


def timed(fxn: Any, arrays: list[np.ndarray], policy: dict) -> list[float]:
  """Warm up, then repeat until (median - min) / median settles or the time cap is hit."""
  st = time.perf_counter()
  while time.perf_counter() - st < policy["warmup_seconds"]: call(fxn, arrays)
  times: list[float] = []
  st = time.perf_counter()
  while len(times) < policy["max_repeats"]:
    times.append(call(fxn, arrays))
    med = statistics.median(times)
    settled = (med - min(times)) / med < policy["settle"] or time.perf_counter() - st > policy["max_seconds"]
    if len(times) >= policy["min_repeats"] and settled: break
  return times


def serve(spec: dict, requests: Any, reply: Any) -> None:
  rng = np.random.default_rng(spec["seed"])
  inputs = [np.empty(n, dtype=dt) for n, dt in spec["inputs"]]
  for a in inputs: fill(a, rng)
  out = np.empty(spec["out"][0], dtype=spec["out"][1])
  ref = np.empty_like(out)
  call(getattr(ctypes.CDLL(spec["ref_lib"]), spec["ref_name"]), [ref, *inputs])
  tol = {"float16": 1e-2, "float32": 1e-4}.get(out.dtype.name, 0)
  reply(["ready"])
  for line in requests:
    msg = json.loads(line)
    if msg[0] != "run": break
    _, lib, name, policy, verify = msg
    fxn = getattr(ctypes.CDLL(lib), name)
    if verify:
      out[:] = np.nan if out.dtype.kind == "f" else 0x5A if out.dtype.kind in "iu" else True  # outputs a candidate skips show up as wrong
      call(fxn, [out, *inputs])
      bad = ~np.isclose(out, ref, rtol=tol, atol=tol, equal_nan=True)
      if bad.any():
        reply(["wrong", f"{int(bad.sum())} of {out.size} outputs differ from the kernel with no opts, first at {int(np.argmax(bad))}"])
        continue
    reply(["ok", timed(fxn, [out, *inputs], policy)])


def main() -> None:
  def reply(obj: list) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
  serve(json.loads(sys.stdin.readline()), sys.stdin, reply)


if __name__ == "__main__":
  main()
