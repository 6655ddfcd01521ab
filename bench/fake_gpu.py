"""FAKEGPU: a GPU that costs what an H200 costs the search, for measuring the search without one. Its caps and renderer are EMU's
(the CUDA renderer for sm_90: a tensor-core candidate's render costs here what it costs there); a compile sleeps as long as NVRTC
took (134 ms for the float16 TC matmul, 26 ms for a plain kernel: ../shared/gpu/h200-2026-11-27.md); a program writes zeros
(the reference does too, so every candidate verifies, on the host) and a timed run spins for a few microseconds, a time of its own
per program, as a 1024^3 TC matmul takes on an H200.

  import fake_gpu; fake_gpu.register()   # in a bench script, before Device["FAKEGPU"]: search workers get it too
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
import time
import types
from typing import Any

from tinytune.runtime import _BACKENDS, Buffer, Program
from tinytune.runtime.emu import EMUDevice

TC_COMPILE_S, PLAIN_COMPILE_S = 0.134, 0.026
RUN_S = (3e-6, 9e-6)  # the span of the programs' run times


class FakeProgram(Program):
  def __init__(self, lib: bytes):
    self.seconds = RUN_S[0] + (RUN_S[1] - RUN_S[0]) * int.from_bytes(hashlib.sha256(lib).digest()[:4], "little") / 2 ** 32

  def __call__(self, *bufs: Buffer, wait: bool = False) -> float | None:
    if not wait:  # a run whose output is read (the reference's, a candidate's verification): zeros
      bufs[0].mem[:] = 0
      return None
    st = time.perf_counter()
    while time.perf_counter() - st < self.seconds: pass
    return self.seconds


class FakeGPU(EMUDevice):
  name = "FAKEGPU"
  emulated, is_gpu = False, True

  def compile(self, src: str) -> bytes:
    time.sleep(TC_COMPILE_S if "mma" in src else PLAIN_COMPILE_S)
    return hashlib.sha256(src.encode()).digest()

  def program(self, name: str, lib: bytes, launch: tuple[int, int] = (1, 1)) -> Program: return FakeProgram(lib)
  def fingerprint(self) -> dict[str, str]: return {**super().fingerprint(), "kind": "FAKEGPU", "name": "FAKEGPU (sleeps like an H200)"}


def _popen(args: list[str], **kwargs: Any) -> subprocess.Popen:
  """The search's worker, started as this file's `worker`, which registers FAKEGPU first."""
  if args[1:] == ["-m", "tinytune.search.worker"]: args = [args[0], __file__, "worker"]
  return subprocess.Popen(args, **kwargs)


def register() -> None:
  """Device['FAKEGPU'] in this process, the compile processes it forks, and the search workers it starts."""
  from tinytune.search import evaluate
  sys.path.insert(0, str(__file__).rsplit("/", 1)[0])
  _BACKENDS["FAKEGPU"] = "fake_gpu:FakeGPU"
  evaluate.subprocess = types.SimpleNamespace(Popen=_popen, PIPE=subprocess.PIPE)  # type: ignore[assignment]


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
  _BACKENDS["FAKEGPU"] = "fake_gpu:FakeGPU"
  from tinytune.search.worker import main
  main()
