"""The opt fuzzer under AddressSanitizer: every catalog workload at odd sizes, each of its CPU kernels with random sequences of 3 opts,
built with -fsanitize=address, run on buffers that end where their data ends (ASan's redzone right after the last element), and
checked against the kernel with no opts. An out-of-bounds read or write aborts with ASan's report even where it would not segfault.

Run by tests/test_asan_fuzz.py in a process started with LD_PRELOAD=libasan (an instrumented .so cannot load into a plain Python
otherwise); prints `built N kernels` and exits 0 when every kernel matched. --plain builds and allocates as in normal use, and
--plant adds a write one element past the first kernel's output (to show the sanitizer catching what the plain run does not)."""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import random
import sys
import zlib

import numpy as np

from tinytune import Device, Kernel, KernelOptError, Opt
from tinytune.codegen.kernel import candidate_opts
from tinytune.dtype import DType
from tinytune.kernels import WORKLOADS, get_workload
from tinytune.kernels.workload import schedule
from tinytune.runtime import Buffer, cpu

ASAN_FLAGS = ("-fsanitize=address", "-fno-omit-frame-pointer")
ODD = {  # odd sizes (primes where a size may be one), so every opt meets remainders and padding
  "matmul": {"m": 33, "n": 17, "k": 5}, "bmm": {"batch": 3, "m": 5, "n": 7, "k": 9}, "linear": {"m": 5, "n": 7, "k": 13},
  "conv2d": {"batch": 2, "cin": 3, "cout": 2, "size": 9, "kernel": 3, "stride": 2, "padding": 0},
  "softmax": {"rows": 7, "cols": 33}, "layernorm": {"rows": 7, "cols": 33}, "reduce": {"rows": 9, "cols": 5, "axis": 0},
  "elementwise": {"n": 1001}, "attention": {"batch": 2, "heads": 1, "seq": 9, "dim": 8, "causal": 1},
  "mlp": {"batch": 3, "din": 5, "hidden": 7, "dout": 3}, "train_step": {"batch": 5, "din": 7, "hidden": 6, "classes": 3}}
SEQUENCE = 3


def exact_alloc(self: cpu.CPUDevice, size: int, dtype: DType) -> np.ndarray:
  """64-byte aligned memory of exactly the buffer's bytes from the (sanitized) malloc: the device's own pads 64 bytes, where a
  write past the end would land unseen."""
  ptr, n = ctypes.c_void_p(), max(size * dtype.itemsize, 1)
  if ctypes.CDLL(None).posix_memalign(ctypes.byref(ptr), ctypes.c_size_t(64), ctypes.c_size_t(n)): raise MemoryError
  return np.frombuffer((ctypes.c_uint8 * n).from_address(ptr.value or 0), np.uint8)[:size * dtype.itemsize].view(dtype.np)


def sequence(k: Kernel, rng: random.Random) -> list[Opt]:
  """SEQUENCE opts picked one at a time from those valid after the ones before (fewer where none is left)."""
  k = k.copy()
  for _ in range(SEQUENCE):
    valid = []
    for opt in candidate_opts(k):
      try: k.copy().apply_opt(opt)
      except KernelOptError: continue
      valid.append(opt)
    if not valid: break
    k.apply_opt(rng.choice(valid))
  return k.opts


def main() -> int:
  p = argparse.ArgumentParser()
  p.add_argument("--per-kernel", type=int, default=3, help="opt sequences per kernel")
  p.add_argument("--seed", type=int, default=0, help="another seed picks other sequences")
  p.add_argument("--plain", action="store_true", help="no sanitizer, the device's own buffers")
  p.add_argument("--plant", action="store_true", help="the first kernel also writes one element past its output")
  p.add_argument("workloads", nargs="*", default=list(WORKLOADS))
  args = p.parse_args()
  dev = Device["CPU"]
  if not args.plain:
    dev.flags = (*dev.flags, *ASAN_FLAGS)  # the compile cache keys on the flags, so these never mix with normal builds
    cpu.CPUDevice.alloc = exact_alloc  # type: ignore[method-assign]
  caps = dataclasses.replace(dev.caps, threads=2)  # the same opts on every machine
  built, failures = 0, []
  for name in args.workloads:
    w = get_workload(name)
    items, _ = schedule(w.instantiate(w.params(ODD[name]))[0], "CPU")
    rng = random.Random(zlib.crc32((f"{name} {args.seed}" if args.seed else name).encode()))  # seed 0: the stream CI runs
    for item in items:  # in order: each kernel's output, with no opts, is a later one's input and this one's reference
      base = Kernel(item.ast, caps)
      dev.program(base.name, dev.compile(dev.renderer.render(base)), base.launch_dims)(item.out, *base.bufs)
      ref = item.out.numpy_view().copy()
      for opts in [sequence(base, rng) for _ in range(args.per_kernel)]:
        k = Kernel(item.ast, caps).apply_opts(opts)
        src = dev.renderer.render(k)
        if args.plant and built == 0: src = src[:src.rstrip().rfind("}")] + f"  data0[{item.out.size}] = data0[0];\n}}\n"
        got = Buffer("CPU", item.out.size, item.out.dtype)
        dev.program(k.name, dev.compile(src), k.launch_dims)(got, *k.bufs)
        built += 1
        tol = 1e-3 if item.out.dtype.is_float else 0
        if not np.allclose(got.numpy_view(), ref, rtol=tol, atol=tol, equal_nan=True): failures.append(f"{name} {k.name} {opts}: wrong result")
  print(f"built {built} kernels", *failures, sep="\n")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
