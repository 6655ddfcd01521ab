"""Opt correctness: every valid opt, and random valid opt sequences, compute what the kernel with no opts computes.

Each case is scheduled once and its kernels are run in order with no opts; those outputs are the references (and the
inputs of later kernels, like softmax's). An optimized kernel writes into a fresh buffer filled with a sentinel, so a
missing store shows up as well as a wrong one. Float results may differ by rounding only where the compiler contracts
a multiply-add differently or an UNROLL of an outer reduce dim adds in another order. Sources compile in parallel."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import random
import re
import subprocess
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from tinytune import Device, Kernel, KernelOptError, Opt, OptOps, Tensor, dtypes
from tinytune.codegen.caps import CUDA_ARCHS, cuda_caps
from tinytune.codegen.heuristic import hand_coded_optimizations
from tinytune.codegen.kernel import candidate_opts
from tinytune.codegen.opts import opts_from_json, opts_to_json
from tinytune.engine import compile_kernel
from tinytune.engine.schedule import ScheduleItem, create_schedule
from tinytune.runtime import Buffer, DeviceCaps, device_status
from tinytune.runtime.emu import emu_caps

DEVICE = "CPU"
# the same valid opts on every machine: bfloat16 dot products (TC) compile to float32 math where the CPU has none
CAPS = dataclasses.replace(Device[DEVICE].caps, threads=2, tensor_cores=("bfloat16",))
WORKGROUP_CAPS = DeviceCaps(has_local=True, threads=1, max_upcast=64, simd_width=4, max_local=256, shared_bytes=16384)
# OPENCL runs in CI through pocl; EMU (a CUDA GPU emulated in NumPy) with the caps of each architecture it emulates
DEVICES = [d for d in ("CPU", "OPENCL", "CUDA", "AMD") if device_status(d) is None] + [f"EMU:{arch}" for arch in CUDA_ARCHS]


def caps_for(device: str) -> DeviceCaps:
  if device.startswith("EMU:"): return emu_caps(device.removeprefix("EMU:"))
  return CAPS if device == "CPU" else dataclasses.replace(WORKGROUP_CAPS, tensor_cores=Device[device].caps.tensor_cores)
SEQUENCES_PER_KERNEL = 16  # with TT_FUZZ_SCALE=2; else 10 per kernel on the CPU (each sequence a 0.1 s compile), 8 on OpenCL
MAX_SEQUENCE = 5


def _rand(*shape: int) -> Tensor: return Tensor.rand(*shape).realize()
def _randn(*shape: int) -> Tensor: return Tensor.randn(*shape).realize()
def _wide(*shape: int) -> Tensor:  # values over 2**-12 .. 2**12, so every order of adding them rounds differently
  rng = np.random.default_rng(sum(shape))
  return Tensor((rng.standard_normal(shape) * np.exp2(rng.uniform(-12, 12, shape))).astype(np.float32)).realize()
def _ints(*shape: int, lo: int = -50, hi: int = 50) -> Tensor:
  return Tensor(np.random.default_rng(sum(shape)).integers(lo, hi, shape).astype(np.int32)).realize()


CASES: dict[str, Callable[[], Tensor]] = {
  "matmul_odd": lambda: _randn(24, 12) @ _randn(12, 20),
  "matmul_pow2": lambda: _randn(16, 16) @ _randn(16, 16),
  "batched_matmul": lambda: _randn(3, 8, 6) @ _randn(3, 6, 10),
  "conv2d": lambda: _randn(2, 3, 9, 9).conv2d(_randn(4, 3, 3, 3), padding=1, stride=2),
  "row_sum": lambda: _wide(12, 40).sum(-1),
  "col_sum": lambda: _wide(40, 12).sum(0),
  "elementwise": lambda: ((_randn(6, 1, 8) * _randn(1, 5, 8) + _randn(8, 5, 6).permute(2, 1, 0)).relu() * 2 - _randn(8)).exp2(),
  "softmax": lambda: (_randn(6, 20) * 3).softmax(-1),  # on the CPU one kernel: the max, the sum of exp, then the row written after them
  "layernorm": lambda: (_randn(6, 24) * 2 + 1).layernorm(),  # the mean, the variance, then the row
  "max": lambda: _randn(10, 30).max(-1),
  "flip_sum": lambda: _randn(6, 8, 4).flip((1, 2)).sum((1, 2)),  # loads that go backwards inside an unrolled sum
  # a cat's rows (Winograd's transforms), whose masked-out pieces the renderer drops where an upcast fixes the row
  "stack": lambda: (lambda x: Tensor.stack([x[0] - x[2], x[1] + x[2], x[2] * 2 - x[1]], dim=1))(_randn(3, 5, 8)),
  "int32": lambda: (_ints(6, 10) * 3 - _ints(10) - (-4)).sum(-1, dtype=dtypes.int32),  # -(-4) once rendered as (--4)
  "int32_max": lambda: (_ints(7, 12) - 3).max(-1),
  "int64_max": lambda: (_ints(5, 12).cast(dtypes.int64) * -(2**40)).max(0),  # the identity -2**63 has no C literal
  "float16": lambda: (_rand(8, 16).cast(dtypes.float16) * _randn(16).cast(dtypes.float16)).sum(-1) + 1,  # sums in float32
  "matmul_f16": lambda: _randn(32, 16).cast(dtypes.float16).realize() @ _randn(16, 48).cast(dtypes.float16).realize(),  # TC on CUDA
  # bfloat16 loads into float32 lanes, and a cast rounding in the kernel
  "bfloat16": lambda: (_rand(8, 16).cast(dtypes.bfloat16).realize() * _randn(16).cast(dtypes.bfloat16)).sum(-1, dtype=dtypes.float32) + 1,
  "matmul_bf16": lambda: _randn(32, 16).cast(dtypes.bfloat16).realize() @ _randn(16, 48).cast(dtypes.bfloat16).realize(),  # TC on CUDA and CPUs
  # 16-bit floats in float32 vector lanes, each op rounding its result to their type (the same bits with any opts), and a softmax
  # row kept in bfloat16 between its statistics' loops and its output's
  "elementwise_f16": lambda: ((_randn(6, 1, 8).cast(dtypes.float16).realize() * _randn(1, 5, 8).cast(dtypes.float16)).relu().sqrt() * 3 - 1).exp2(),
  "softmax_bf16": lambda: (_randn(6, 20) * 3).cast(dtypes.bfloat16).realize().softmax(-1),
  "float64": lambda: (_randn(8, 16).cast(dtypes.float64) * _randn(16).cast(dtypes.float64)).sum(-1) + 1,  # no SIMD lanes, double math
  "int8_max": lambda: (_ints(6, 10).cast(dtypes.int8) * 37 + 5).max(-1),  # products wrap in int8
  "uint32_sum": lambda: (_ints(6, 10, lo=0).cast(dtypes.uint32) * 3_000_000_007).sum(-1, dtype=dtypes.uint32),  # a sum that wraps
  "matmul_relu": lambda: (_randn(10, 24) @ _randn(24, 12) + _randn(12)).relu(),  # an epilogue that only the last K block runs
  "matmul_int32": lambda: _ints(6, 16) @ _ints(16, 10),  # K blocks of an integer sum, exact
  "matmul_wide": lambda: (_randn(6, 16) @ _randn(16, 32) + 1).relu(),  # rows of whole 16-lane vectors: STREAM's stores
}

# outputs that every opt must reproduce bit for bit: integers, and float kernels with one reduce dim and no multiply-add
# for the compiler to contract, where only adding in another order (like unrolling the inner part first) changes a bit;
# GROUP adds partial sums across threads, so float sums are exact up to rounding there
EXACT = {"row_sum", "col_sum", "softmax0", "max", "int32", "int32_max", "int64_max", "int8_max", "uint32_sum", "elementwise_f16"}


@dataclass
class KernelCase:
  name: str  # the id in KERNELS
  item: ScheduleItem
  ref: np.ndarray  # the output of the kernel with no opts
  device: str = DEVICE

  def kernel(self) -> Kernel: return Kernel(self.item.ast, caps_for(self.device))


@functools.cache
def kernel_cases(device: str = DEVICE) -> dict[str, KernelCase]:
  """Every kernel of every case, run in order with no opts."""
  Tensor.manual_seed(0)
  ret: dict[str, KernelCase] = {}
  default, Device.DEFAULT = Device.DEFAULT, device  # the cases' inputs are made on the device
  wanted = [n for n in CASES if not slow_here(device) or any(k == n or k.removeprefix(n).isdigit() for k in OPENCL_KERNELS)]
  try: outs = {name: CASES[name]() for name in wanted}  # on a slow device, only the cases fuzzed there
  finally: Device.DEFAULT = default
  for name, out in outs.items():
    items, _ = create_schedule(out.uop, device)
    for i, item in enumerate(items):
      kernel = Kernel(item.ast, caps_for(device))
      program, _ = compile_kernel(kernel, device)
      _fill_sentinel(item.out)
      program(item.out, *kernel.bufs)
      ref = item.out.numpy_view().copy()
      assert np.isfinite(ref).all() if item.out.dtype.is_float else True, f"{name} has non-finite reference values"
      kid = name if len(items) == 1 else f"{name}{i}"
      ret[kid] = KernelCase(kid, item, ref, device)
  return ret


# pocl builds slowly: on OpenCL the suite fuzzes one kernel of each kind (workgroup reduce, conv, column reduce, softmax, ints,
# 16-bit floats); TT_FUZZ_SCALE=2 or more fuzzes them all there too
OPENCL_KERNELS = {"matmul_odd", "conv2d", "col_sum", "softmax", "softmax1", "int32_max", "float16", "bfloat16"}


def slow_here(device: str) -> bool:
  """Whether the suite fuzzes less on `device`: pocl builds slowly."""
  return device == "OPENCL" and int(os.getenv("TT_FUZZ_SCALE", "1")) < 2


def fuzzed_here(name: str, device: str) -> None:
  if slow_here(device) and name not in OPENCL_KERNELS:
    pytest.skip(f"{name} is fuzzed on the CPU; on OpenCL with TT_FUZZ_SCALE=2")
  # EMU interprets each kernel in NumPy: a kernel is fuzzed with the caps of one architecture it emulates, picked by its name
  if device.startswith("EMU:") and int(os.getenv("TT_FUZZ_SCALE", "1")) < 2 and \
     CUDA_ARCHS[zlib.crc32(name.encode()) % len(CUDA_ARCHS)] != (arch := device.removeprefix("EMU:")):
    pytest.skip(f"{name} is fuzzed on EMU with another architecture's caps than {arch}; with each one with TT_FUZZ_SCALE=2")


KERNELS = ["matmul_odd", "matmul_pow2", "batched_matmul", "conv2d", "row_sum", "col_sum", "elementwise",
           "softmax", "softmax0", "softmax1", "softmax2", "layernorm", "layernorm0", "layernorm1", "layernorm2",
           "max", "flip_sum", "stack", "int32", "int32_max", "int64_max", "float16", "matmul_f16",
           "bfloat16", "matmul_bf16", "elementwise_f16", "softmax_bf16", "softmax_bf160", "softmax_bf161", "softmax_bf162",
           "float64", "int8_max", "uint32_sum", "matmul_relu", "matmul_int32", "matmul_wide"]


# the CPU computes a row's statistics and the row written after them in one kernel (see engine/schedule.py), devices with
# workgroups one kernel each
WORKGROUP_ONLY = {"softmax0", "softmax1", "softmax2", "layernorm0", "layernorm1", "layernorm2", "softmax_bf160", "softmax_bf161", "softmax_bf162"}


def case(name: str, device: str) -> KernelCase:
  if name not in (cases := kernel_cases(device)): pytest.skip(f"{name} is no kernel of its own on {device}")
  return cases[name]


def test_kernel_list() -> None:
  assert list(kernel_cases()) == [k for k in KERNELS if k not in WORKGROUP_ONLY]
  names = {k: kc.kernel().name for k, kc in kernel_cases().items()}
  assert names["matmul_odd"] == "r_24_20_12" and names["softmax"] == "r_6_20_20" and names["conv2d"] == "r_2_4_5_5_3_3_3"
  assert kernel_cases()["int32"].item.out.dtype == dtypes.int32 and kernel_cases()["float16"].item.out.dtype == dtypes.float16
  assert dtypes.bfloat16 in {b.dtype for b in kernel_cases()["bfloat16"].kernel().bufs}
  assert kernel_cases()["matmul_bf16"].item.out.dtype == dtypes.bfloat16


# ***** helpers *****

def _fill_sentinel(buf: Buffer) -> None:
  dt = buf.dtype.np
  buf.copyin(np.full(buf.size, np.nan if buf.dtype.is_float else True if buf.dtype == dtypes.bool else np.iinfo(dt).max - 7, dtype=dt))


def valid_opts(k: Kernel) -> list[Opt]:
  ret = []
  for opt in candidate_opts(k):
    try: k.copy().apply_opt(opt)
    except KernelOptError: continue
    ret.append(opt)
  return ret


def random_sequence(k: Kernel, rng: random.Random) -> list[Opt]:
  k = k.copy()
  for _ in range(rng.randint(1, MAX_SEQUENCE)):
    if not (opts := valid_opts(k)): break
    k.apply_opt(rng.choice(opts))
  return k.opts


def _compile(device: str, src: str) -> bytes | Exception:
  try: return Device[device].compile(src)
  except Exception as e: return e


def check_opts(kc: KernelCase, seqs: list[list[Opt]]) -> None:
  """Run the kernel with each opt sequence (applied to a kernel built from scratch); all must match the reference."""
  dev = Device[kc.device]
  kernels = [kc.kernel().apply_opts(opts) for opts in seqs]
  srcs = [dev.renderer.render(k) for k in kernels]
  with ThreadPoolExecutor(os.cpu_count() or 1) as pool: libs = list(pool.map(functools.partial(_compile, kc.device), srcs))  # warms the cache
  out = Buffer(kc.device, kc.item.out.size, kc.item.out.dtype)
  float_tol = {dtypes.float32: 1e-5, dtypes.float16: 1e-3, dtypes.bfloat16: 1e-2, dtypes.float64: 1e-12}.get(kc.item.out.dtype, 0)
  failures = []
  for k, lib in zip(kernels, libs):
    if isinstance(lib, Exception):
      failures.append(f"{k.opts}: {str(lib).splitlines()[0]}")
      continue
    program = dev.program(k.name, lib, k.launch_dims)
    _fill_sentinel(out)
    program(out, *k.bufs)
    # a workgroup, or LANES, adds its partial sums in another order: exact cases are then exact only up to rounding of the sum
    grouped = any(o.op in (OptOps.GROUP, OptOps.GROUPTOP, OptOps.LANES) for o in k.opts)
    tol = 0 if kc.name in EXACT and not (grouped and kc.item.out.dtype.is_float) else float_tol
    atol = tol * float(np.abs(kc.ref).max(initial=1)) if grouped else tol
    try: np.testing.assert_allclose(out.numpy_view(), kc.ref, rtol=tol, atol=atol)
    except AssertionError as e: failures.append(f"{k.opts}: {str(e).strip().splitlines()[2:4]}")
  assert not failures, f"{len(failures)} of {len(seqs)} opt lists give wrong results for {kc.kernel().name}:\n" + "\n".join(failures)


def test_candidate_opts() -> None:
  k = kernel_cases()["matmul_odd"].kernel()  # global 24, 20; reduce 12; two threads
  by_op: dict[tuple[OptOps, int], set[int]] = {}
  for o in valid_opts(k): by_op.setdefault((o.op, o.axis), set()).add(o.arg)
  assert by_op == {(OptOps.UPCAST, 0): {2, 3, 4, 6, 8, 12, 24}, (OptOps.UPCAST, 1): {2, 4, 5, 10, 20}, (OptOps.UNROLL, 0): {2, 3, 4, 6, 12},
                   (OptOps.LANES, 0): {2, 3, 4, 6, 12}, (OptOps.THREAD, 0): {2, 3, 4, 6, 8}, (OptOps.THREAD, 1): {2, 4, 5}, (OptOps.SWAP, 0): {1},
                   (OptOps.PADTO, 0): {5, 7, 16, 32}, (OptOps.PADTO, 1): {3, 6, 7, 8, 16, 32}, (OptOps.PADTO, 2): {5, 7, 8, 16},
                   (OptOps.KBLOCK, 0): {2, 3, 4, 6}, (OptOps.STREAM, 0): {0}, (OptOps.PACK, 0): {0, 1}}
  assert {o.op for o in candidate_opts(k)} == set(OptOps)
  k.apply_opts([Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.THREAD, 1, 2)])
  upcasts = {o.arg for o in valid_opts(k) if o.op is OptOps.UPCAST and o.axis == 0}
  assert upcasts == {2, 3, 6} and not any(o.op is OptOps.THREAD or o.op is OptOps.PADTO and o.axis < 2 for o in valid_opts(k))


# ***** correctness *****

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", KERNELS)
def test_every_single_opt(name: str, device: str) -> None:
  fuzzed_here(name, device)
  kc = case(name, device)
  opts = valid_opts(kc.kernel())
  ops = {o.op for o in opts}
  tc = {"matmul_f16": "float16", "matmul_bf16": "bfloat16"}.get(name) in kc.kernel().caps.tensor_cores
  assert {OptOps.UPCAST, OptOps.PADTO} <= ops and (OptOps.TC in ops) == tc
  if kc.kernel().caps.has_local: assert OptOps.LOCAL in ops and not ops & {OptOps.THREAD, OptOps.KBLOCK}
  else: assert not ops & {OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP} and (OptOps.KBLOCK in ops or name not in ("matmul_relu", "matmul_int32"))
  if kc.kernel().n_reduce: assert OptOps.UNROLL in ops and (OptOps.GROUP in ops) == kc.kernel().caps.has_local
  matmul = name in ("matmul_odd", "matmul_pow2", "batched_matmul", "matmul_relu", "matmul_int32", "matmul_wide")
  if matmul: assert (OptOps.STAGE in ops) == kc.kernel().caps.has_local
  if slow_here(device):  # each kind of opt, then 8 more spread over the rest
    firsts = [o for i, o in enumerate(opts) if o.op not in {p.op for p in opts[:i]}]
    rest = [o for o in opts if o not in firsts]
    opts = firsts + rest[::max(1, len(rest) // 8)]
  elif int(os.getenv("TT_FUZZ_SCALE", "1")) < 2: opts = spread_opts(name, opts)
  check_opts(kc, [[o] for o in opts])


def spread_opts(name: str, opts: list[Opt]) -> list[Opt]:
  """The smallest and largest amount of each opt on each axis, and a fixed third of the amounts between (by a hash of the kernel's
  name and the opt): each compile costs 0.1 s, and the suite's CPU fuzz ran 800 of them; TT_FUZZ_SCALE=2 runs every one."""
  by_axis: dict[tuple[OptOps, int], list[Opt]] = {}
  for o in opts: by_axis.setdefault((o.op, o.axis), []).append(o)
  ends = {o for same in by_axis.values() for o in (same[0], same[-1])}
  return [o for o in opts if o in ends or zlib.crc32(f"{name} {o}".encode()) % 3 == 0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", KERNELS)
def test_random_opt_sequences(name: str, device: str) -> None:
  fuzzed_here(name, device)
  kc = case(name, device)
  rng = random.Random(zlib.crc32(name.encode()))
  n = SEQUENCES_PER_KERNEL if int(os.getenv("TT_FUZZ_SCALE", "1")) >= 2 else SEQUENCES_PER_KERNEL // 2 if slow_here(device) else 10
  seqs = [random_sequence(kc.kernel(), rng) for _ in range(n)]  # the first n of the kernel's stream
  assert max(len(s) for s in seqs) >= 3
  check_opts(kc, seqs)


def test_hand_picked_sequences() -> None:
  """Opt lists that combine every register and loop rewrite on one kernel, beyond what random picks reach reliably."""
  t, o = OptOps, Opt
  check_opts(kernel_cases()["matmul_odd"], [
    [o(t.UPCAST, 1, 4), o(t.UPCAST, 0, 4), o(t.UNROLL, 0, 4), o(t.THREAD, 0, 2)],
    [o(t.PADTO, 1, 8), o(t.UPCAST, 1, 8), o(t.UPCAST, 1, 3), o(t.UNROLL, 0, 3)],
    [o(t.PADTO, 0, 16), o(t.PADTO, 2, 8), o(t.UNROLL, 0, 8), o(t.UPCAST, 0, 4), o(t.SWAP, 0, 1)],
    [o(t.SWAP, 0, 1), o(t.UPCAST, 1, 20), o(t.UPCAST, 0, 8), o(t.THREAD, 0, 3)],
  ])
  check_opts(kernel_cases()["conv2d"], [
    [o(t.UPCAST, 3, 5), o(t.UNROLL, 2, 3), o(t.UNROLL, 1, 3), o(t.SWAP, 0, 2), o(t.THREAD, 1, 2)],
    [o(t.PADTO, 3, 8), o(t.UPCAST, 3, 8), o(t.PADTO, 4, 4), o(t.UNROLL, 0, 4)],
  ])
  check_opts(kernel_cases()["softmax"], [[o(t.PADTO, 2, 32), o(t.UNROLL, 0, 16), o(t.UPCAST, 0, 3)]])
  check_opts(kernel_cases()["matmul_relu"], [  # K blocks with a register tile, threads, padded rows and a padded K
    [o(t.UPCAST, 1, 4), o(t.UPCAST, 0, 5), o(t.THREAD, 0, 2), o(t.SWAP, 0, 1), o(t.KBLOCK, 0, 8)],
    [o(t.PADTO, 0, 16), o(t.UPCAST, 0, 8), o(t.UPCAST, 1, 4), o(t.KBLOCK, 0, 6), o(t.UNROLL, 0, 3)],
    [o(t.PADTO, 2, 32), o(t.KBLOCK, 0, 8), o(t.UNROLL, 0, 4), o(t.UPCAST, 1, 12), o(t.THREAD, 0, 2)],
    [o(t.UNROLL, 0, 2), o(t.KBLOCK, 0, 3), o(t.UPCAST, 1, 3)],
  ])
  check_opts(kernel_cases()["matmul_int32"], [[o(t.UPCAST, 1, 5), o(t.UPCAST, 0, 2), o(t.KBLOCK, 0, 4), o(t.UNROLL, 0, 2)]])
  pack = o(t.PACK, 0, 0)  # B's panels (or A's rows) copied per K block: with padded rows and lanes, threads, unrolls, an epilogue
  check_opts(kernel_cases()["matmul_relu"], [
    [o(t.UPCAST, 1, 4), o(t.UPCAST, 0, 2), o(t.THREAD, 1, 3), o(t.SWAP, 0, 1), o(t.KBLOCK, 0, 8), pack],
    [o(t.PADTO, 0, 16), o(t.UPCAST, 0, 8), o(t.UPCAST, 1, 4), o(t.SWAP, 0, 1), pack, o(t.KBLOCK, 0, 6), o(t.UNROLL, 0, 3)],
    [o(t.PADTO, 2, 32), o(t.KBLOCK, 0, 8), o(t.UNROLL, 0, 4), o(t.UPCAST, 1, 12), o(t.THREAD, 0, 2), o(t.SWAP, 0, 1), pack],
    [o(t.PADTO, 1, 16), o(t.UPCAST, 1, 16), o(t.UPCAST, 0, 2), o(t.SWAP, 0, 1), pack],
    [o(t.UPCAST, 0, 2), pack, o(t.UNROLL, 0, 2)],
  ])
  check_opts(kernel_cases()["matmul_odd"], [[o(t.UPCAST, 1, 4), o(t.UPCAST, 0, 3), o(t.SWAP, 0, 1), o(t.LANES, 0, 4), pack]])
  check_opts(kernel_cases()["batched_matmul"], [[o(t.UPCAST, 2, 10), o(t.UPCAST, 1, 2), o(t.SWAP, 1, 2), pack, o(t.UNROLL, 0, 2)]])
  block = o(t.PACK, 0, 1)  # B's K block many panels wide, copied outside the row loop: with the columns' threads, padded rows and lanes
  check_opts(kernel_cases()["matmul_relu"], [
    [o(t.UPCAST, 1, 2), o(t.UPCAST, 0, 2), o(t.THREAD, 1, 3), o(t.KBLOCK, 0, 8), block],
    [o(t.PADTO, 0, 16), o(t.UPCAST, 0, 8), o(t.UPCAST, 1, 4), block, o(t.KBLOCK, 0, 6), o(t.UNROLL, 0, 3)],
    [o(t.PADTO, 1, 16), o(t.PADTO, 0, 12), o(t.UPCAST, 1, 8), o(t.UPCAST, 0, 3), block],
  ])
  check_opts(kernel_cases()["matmul_odd"], [[o(t.UPCAST, 1, 4), o(t.UPCAST, 0, 3), o(t.KBLOCK, 0, 4), block, o(t.UNROLL, 0, 2)]])
  check_opts(kernel_cases()["batched_matmul"], [[o(t.UPCAST, 2, 2), o(t.UPCAST, 1, 2), o(t.THREAD, 0, 3), block, o(t.UNROLL, 0, 3)]])
  check_opts(kernel_cases()["matmul_wide"], [  # streaming stores of whole lines: threads, K blocks (whose sums so far stay cached)
    [o(t.UPCAST, 1, 16), o(t.UPCAST, 0, 3), o(t.STREAM, 0, 0), o(t.THREAD, 0, 2)],
    [o(t.STREAM, 0, 0), o(t.UPCAST, 1, 32), o(t.KBLOCK, 0, 4), o(t.UNROLL, 0, 2), o(t.SWAP, 0, 1)],
    [o(t.PADTO, 0, 8), o(t.UPCAST, 0, 8), o(t.UPCAST, 1, 16), o(t.STREAM, 0, 0)],
  ])
  check_opts(kernel_cases()["row_sum"], [  # bit for bit: two unrolls of one axis must still add in memory order
    [o(t.UNROLL, 0, 2), o(t.UNROLL, 0, 4)], [o(t.UNROLL, 0, 4), o(t.UNROLL, 0, 5), o(t.UPCAST, 0, 4)],
    [o(t.PADTO, 1, 16), o(t.UNROLL, 0, 2), o(t.UNROLL, 0, 3), o(t.UNROLL, 0, 8), o(t.UPCAST, 0, 3)],
  ])


@pytest.mark.parametrize("case", ["flip2", "flip_all", "transposed", "flip_transposed"])
def test_reversed_and_permuted_sums_match_numpy(case: str) -> None:
  """Sums whose unrolled loads are a permutation of consecutive addresses, with no opts and each UNROLL, against NumPy:
  gcc 12.2 vectorized such an in-order float sum into one that counts some elements twice, even with no opts."""
  x = np.random.default_rng(1).standard_normal((6, 16, 4)).astype(np.float32)
  xt = Tensor(x, device=DEVICE)  # the kernels run on DEVICE, whatever TINYTUNE_DEVICE makes the default
  t, ref = {"flip2": (xt.flip(2).sum(2), x[:, :, ::-1].sum(2)), "flip_all": (xt[0].flip((0, 1)).sum(), x[0].sum()),
            "transposed": (xt.permute(0, 2, 1).sum((1, 2)), x.sum((1, 2))),
            "flip_transposed": (xt.flip(1).permute(0, 2, 1).sum((1, 2)), x.sum((1, 2)))}[case]
  (item,), _ = create_schedule(t.uop, DEVICE)
  base = Kernel(item.ast, CAPS)
  for opts in [[]] + [[o] for o in valid_opts(base) if o.op is OptOps.UNROLL] + [[Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.UNROLL, 0, 2)]]:
    try: k = Kernel(item.ast, CAPS).apply_opts(opts)
    except KernelOptError: continue
    program, _ = compile_kernel(k, DEVICE)
    program(item.out, *k.bufs)
    np.testing.assert_allclose(item.out.numpy_view().reshape(ref.shape), ref, rtol=1e-5, atol=1e-5, err_msg=f"{case} {opts}")


def test_default_k_blocks_match_numpy() -> None:
  """A product whose rows of A over all of K pass the heuristic's 8 MiB gets K blocks by default; with a bias and relu after it."""
  rng = np.random.default_rng(2)
  a, b, bias = (rng.standard_normal(s).astype(np.float32) for s in ((2048, 2048), (2048, 32), (32,)))
  out = (Tensor(a) @ Tensor(b) + Tensor(bias)).relu()
  (item,), _ = create_schedule(out.uop, DEVICE)
  assert any(o.op is OptOps.KBLOCK for o in hand_coded_optimizations(Kernel(item.ast, Device[DEVICE].caps)))
  np.testing.assert_allclose(out.numpy(), np.maximum(a @ b + bias, 0), rtol=1e-4, atol=1e-3)


def test_default_column_sums_past_the_caches_go_in_blocks_of_rows() -> None:
  """A column sum over more than 8 MiB sums a few rows at a time into the output; the same sums, in the same order, as NumPy's
  float64 result rounded; a small one keeps its sums in registers down the whole column."""
  x = np.random.default_rng(3).standard_normal((1024, 2304)).astype(np.float32)
  for rows, blocked in ((1024, True), (256, False)):
    out = Tensor(x[:rows]).sum(0)
    (item,), _ = create_schedule(out.uop, DEVICE)
    assert any(o.op is OptOps.KBLOCK for o in hand_coded_optimizations(Kernel(item.ast, Device[DEVICE].caps))) == blocked
    np.testing.assert_allclose(out.numpy(), x[:rows].astype(np.float64).sum(0), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shape,perm,dtype,want", [
  ((64, 48), (1, 0), "float32", {(1, 8), (0, 8)}), ((16, 8, 56, 64), (0, 3, 2, 1), "float32", {(3, 8), (1, 8)}),
  ((12, 20), (1, 0), "float32", {(1, 4), (0, 4)}), ((64, 48), (1, 0), "int32", {(1, 8), (0, 8)}), ((64, 48), (1, 0), "float16", {(1, 8), (0, 8)}),
  ((16, 64), (0, 1), "float32", {(1, 32)}), ((10, 7), (1, 0), "float32", set())])
def test_default_transposes_take_square_tiles(shape: tuple[int, ...], perm: tuple[int, ...], dtype: str, want: set[tuple[int, int]]) -> None:
  """A copy whose input is contiguous along another output dim than the lanes upcasts both by one width that splits them, 8 or 4,
  so each input line is read in runs (a 1024^2 float32 transpose: 2.2 -> 0.38 ms, 4096^2: 61.7 -> 10.4); a plain copy keeps its
  wide vectors, and dims no width splits keep none."""
  x = np.arange(np.prod(shape)).reshape(shape).astype(dtype)
  out = Tensor(x).permute(*perm).contiguous()
  (item,), _ = create_schedule(out.uop, DEVICE)
  opts = hand_coded_optimizations(Kernel(item.ast, dataclasses.replace(Device[DEVICE].caps, simd_width=16)))
  assert {(o.axis, o.arg) for o in opts if o.op is OptOps.UPCAST} == want
  np.testing.assert_array_equal(out.numpy(), x.transpose(perm))


def _lanes_case(case: str) -> tuple[Tensor, np.ndarray]:
  """A reduce over rows of 37 (no whole vectors: LANES needs PADTO), its NumPy result."""
  rng = np.random.default_rng(2)
  x = rng.standard_normal((5, 37)).astype(np.float32)
  if case == "max_nan":  # a NaN anywhere in a row wins, as in NumPy; a row of -inf stays -inf
    x[1, 5], x[2, 36], x[3, :] = np.nan, np.nan, -np.inf
    return Tensor(x).max(-1), x.max(-1)
  if case == "min": return Tensor(x).min(-1), x.min(-1)
  if case == "sum": return Tensor(x).sum(-1), x.sum(-1)
  if case == "full_sum": return Tensor(x).sum(), x.sum()
  if case == "float64": return Tensor(x.astype(np.float64)).sum(-1), x.astype(np.float64).sum(-1)
  if case == "bfloat16":
    b = Tensor(x).cast(dtypes.bfloat16).realize()
    return b.sum(-1, dtype=dtypes.float32), b.cast(dtypes.float32).numpy().sum(-1)
  i = rng.integers(-100, 100, x.shape).astype(np.int32)
  if case == "int32_sum": return Tensor(i).sum(-1, dtype=dtypes.int32), i.sum(-1, dtype=np.int32)
  assert case == "int8_max"
  return Tensor(i.astype(np.int8)).max(-1), i.astype(np.int8).max(-1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["sum", "max_nan", "min", "full_sum", "float64", "bfloat16", "int32_sum", "int8_max"])
def test_lanes_match_numpy(case: str, device: str) -> None:
  """LANES (partial accumulators in SIMD lanes, combined after the loop) over padded rows, with UNROLL, UPCAST and THREAD beside it."""
  if device == "OPENCL" and case not in ("sum", "max_nan"): pytest.skip("pocl builds slowly: the other dtypes are checked on the CPU")
  default, Device.DEFAULT = Device.DEFAULT, device
  try: t, ref = _lanes_case(case)
  finally: Device.DEFAULT = default
  (item,), _ = create_schedule(t.uop, device)
  t_, o = OptOps, Opt
  seqs = [[o(t_.PADTO, -1, 16), o(t_.LANES, -1, 16)], [o(t_.PADTO, -1, 8), o(t_.LANES, -1, 40)], [o(t_.PADTO, -1, 16), o(t_.LANES, -1, 48)],
          [o(t_.PADTO, -1, 16), o(t_.LANES, -1, 8), o(t_.UNROLL, -1, 3)], [o(t_.PADTO, -1, 8), o(t_.UNROLL, -1, 2), o(t_.LANES, -1, 4)],
          [o(t_.PADTO, -1, 32), o(t_.LANES, -1, 16), o(t_.UPCAST, 0, 5)], [o(t_.PADTO, -1, 8), o(t_.LANES, -1, 5), o(t_.THREAD, 0, 5)],
          [o(t_.PADTO, -1, 32), o(t_.LANES, -1, 32), o(t_.UNROLL, -1, 2)]]
  done = 0
  if caps_for(device).has_local:  # the partials combine before a workgroup's threads share theirs
    seqs = seqs[:3] + [[o(t_.PADTO, -1, 16), o(t_.LANES, -1, 4), o(t_.GROUP, -1, 4)], [o(t_.PADTO, -1, 8), o(t_.GROUPTOP, -1, 5), o(t_.LANES, -1, 8)]]
  for opts in seqs:
    base = Kernel(item.ast, caps_for(device))
    last = {t_.PADTO: len(base.sizes) - 1, **{op: base.n_reduce - 1 for op in (t_.LANES, t_.UNROLL, t_.GROUP, t_.GROUPTOP)}}  # -1: the last
    opts = [o(x.op, last[x.op] if x.axis == -1 else x.axis, x.arg) for x in opts]
    try: k = base.apply_opts(opts)
    except KernelOptError: continue
    _fill_sentinel(item.out)
    program, _ = compile_kernel(k, device)
    program(item.out, *k.bufs)
    got = item.out.numpy_view().reshape(np.shape(ref))
    np.testing.assert_allclose(got, ref, rtol=1e-5 if ref.dtype.kind == "f" else 0, atol=1e-5, err_msg=f"{case} {opts}")
    done += 1
  assert done >= 3, f"{case}: too few of the opt lists applied"


def _stage_matmul(device: str, m: int, n: int, k: int, batch: int = 0, transpose_b: bool = False) -> tuple[ScheduleItem, np.ndarray]:
  """A float32 matmul (batched where batch > 0, B read transposed where asked) scheduled on `device`, and its NumPy result."""
  rng = np.random.default_rng(m * n + k)
  a = rng.standard_normal((batch, m, k) if batch else (m, k)).astype(np.float32)
  b = rng.standard_normal((batch, n, k) if batch else (n, k)) if transpose_b else rng.standard_normal((batch, k, n) if batch else (k, n))
  b = b.astype(np.float32)
  bt = np.swapaxes(b, -1, -2) if transpose_b else b
  tb = Tensor(b, device=device)
  items, _ = create_schedule((Tensor(a, device=device) @ (tb.transpose(-1, -2) if transpose_b else tb)).uop, device)
  for item in items[:-1]: compile_kernel(Kernel(item.ast, Device[device].caps), device)[0](item.out, *Kernel(item.ast, Device[device].caps).bufs)
  return items[-1], a @ bt


t_, o_ = OptOps, Opt
STAGE_CASES = [  # (m, n, k, batch, B transposed): odd sizes, padded to the tiles; opt lists with STAGE
  ((37, 29, 23, 0, False), [[o_(t_.PADTO, 1, 32), o_(t_.UPCAST, 1, 4), o_(t_.PADTO, 0, 40), o_(t_.UPCAST, 0, 4), o_(t_.LOCAL, 1, 4),
                             o_(t_.LOCAL, 0, 2), o_(t_.PADTO, 2, 24), o_(t_.STAGE, 0, 8), o_(t_.UNROLL, 0, 2)],
                            [o_(t_.PADTO, 2, 24), o_(t_.LOCAL, 0, 37), o_(t_.STAGE, 0, 4), o_(t_.UNROLL, 0, 4)],  # 37 threads: a ragged copy
                            [o_(t_.PADTO, 2, 24), o_(t_.LOCAL, 0, 37), o_(t_.STAGE, 0, 4), o_(t_.PREFETCH, 0, 0), o_(t_.UPCAST, 1, 29)],
                            [o_(t_.STAGE, 0, 23)],  # one thread, K in one tile
                            [o_(t_.PADTO, 0, 40), o_(t_.UPCAST, 0, 8), o_(t_.LOCAL, 0, 5), o_(t_.LOCAL, 1, 29), o_(t_.PADTO, 2, 32),
                             o_(t_.STAGE, 0, 16)]]),
  ((24, 36, 20, 3, False), [[o_(t_.UPCAST, 2, 4), o_(t_.UPCAST, 1, 4), o_(t_.LOCAL, 2, 3), o_(t_.LOCAL, 1, 2), o_(t_.UNROLL, 0, 2),
                             o_(t_.STAGE, 0, 5), o_(t_.PREFETCH, 0, 0)],  # K tiles of 10: the loop in the tile by 2, unrolled
                            [o_(t_.LOCAL, 0, 3), o_(t_.LOCAL, 2, 4), o_(t_.STAGE, 0, 10), o_(t_.UPCAST, 1, 8)]]),  # the batch in the workgroup
  ((33, 40, 28, 0, True), [[o_(t_.UPCAST, 1, 4), o_(t_.PADTO, 0, 36), o_(t_.UPCAST, 0, 4), o_(t_.LOCAL, 1, 10), o_(t_.LOCAL, 0, 3),
                            o_(t_.STAGE, 0, 14), o_(t_.UNROLL, 0, 2), o_(t_.PREFETCH, 0, 0)],
                           [o_(t_.UPCAST, 1, 8), o_(t_.LOCAL, 1, 5), o_(t_.LOCAL, 0, 11), o_(t_.STAGE, 0, 14), o_(t_.UNROLL, 0, 2)]]),
]


STAGE_DEVICES = [d for d in ("OPENCL", "EMU", "CUDA", "AMD") if device_status(d) is None]  # EMU: races on the tiles are errors


@pytest.mark.parametrize("device", STAGE_DEVICES)
@pytest.mark.parametrize("shape,seqs", STAGE_CASES, ids=[str(c[0]) for c in STAGE_CASES])
def test_stage_matches_numpy(shape: tuple[int, int, int, int, bool], seqs: list[list[Opt]], device: str) -> None:
  """STAGE's tiles in shared memory against NumPy: odd sizes padded to the tiles (masked), copies that do not split evenly over the
  threads, a batch, a B read across its rows (copied transposed), and PREFETCH's next tile loaded during the current one's compute."""
  item, ref = _stage_matmul(device, *shape)
  for opts in seqs:
    k = Kernel(item.ast, Device[device].caps).apply_opts(opts)
    _fill_sentinel(item.out)
    compile_kernel(k, device)[0](item.out, *k.bufs)
    np.testing.assert_allclose(item.out.numpy_view().reshape(ref.shape), ref, rtol=1e-4, atol=1e-4, err_msg=str(opts))


@pytest.mark.parametrize("device", STAGE_DEVICES)
def test_default_shared_tiles_match_numpy(device: str) -> None:
  """A float32 matmul with over 4 million outputs takes the shared-memory tile by default on a GPU, its odd sizes
  padded to 128x128 tiles, K to a tile of 16: the H100's and H200's plan (their caps) wherever it runs. Not by default on a CPU's
  OpenCL (pocl), where barriers and shared memory cost and save nothing."""
  item, ref = _stage_matmul(device, 2053, 2047, 15)
  if not Device[device].caps.gpu: assert not any(o.op is OptOps.STAGE for o in hand_coded_optimizations(Kernel(item.ast, Device[device].caps)))
  k = Kernel(item.ast, cuda_caps("sm_90"))
  opts = hand_coded_optimizations(k)
  assert {Opt(OptOps.STAGE, 0, 16), Opt(OptOps.PADTO, 0, 128), Opt(OptOps.PADTO, 1, 128), Opt(OptOps.PADTO, 2, 16)} <= set(opts)
  k.apply_opts(opts)
  _fill_sentinel(item.out)
  compile_kernel(k, device)[0](item.out, *k.bufs)
  np.testing.assert_allclose(item.out.numpy_view().reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)


def test_stage_rules() -> None:
  """STAGE needs workgroups and a reduce along the kernel's last dim read from memory in a dtype shared memory holds as loaded; it
  does not combine with GROUP or LANES, comes once, and its tiles fit in shared memory (a later split that overfills it is refused).
  PREFETCH needs a STAGE of more than one K tile, and comes once."""
  gpu = dataclasses.replace(WORKGROUP_CAPS, shared_bytes=1600)
  def kernel(name: str) -> Kernel: return Kernel(kernel_cases()[name].item.ast, gpu)
  for name in ("matmul_f16", "elementwise", "conv2d"):  # 16-bit inputs, no reduce, three reduce dims
    with pytest.raises(KernelOptError): kernel(name).apply_opt(Opt(OptOps.STAGE, 0, 2))
  for before, opt in [([Opt(OptOps.STAGE, 0, 4)], Opt(OptOps.GROUP, 0, 3)), ([Opt(OptOps.GROUP, 0, 3)], Opt(OptOps.STAGE, 0, 4)),
                      ([Opt(OptOps.LANES, 0, 4)], Opt(OptOps.STAGE, 0, 3)), ([Opt(OptOps.STAGE, 0, 4)], Opt(OptOps.STAGE, 0, 3)),
                      ([], Opt(OptOps.STAGE, 0, 5)), ([], Opt(OptOps.STAGE, 0, 1)),
                      ([Opt(OptOps.LOCAL, 0, 24), Opt(OptOps.LOCAL, 1, 10)], Opt(OptOps.STAGE, 0, 12)),
                      ([Opt(OptOps.LOCAL, 0, 24), Opt(OptOps.STAGE, 0, 12)], Opt(OptOps.LOCAL, 1, 10)), ([], Opt(OptOps.PREFETCH, 0, 0)),
                      ([Opt(OptOps.STAGE, 0, 12)], Opt(OptOps.PREFETCH, 0, 0)), ([Opt(OptOps.STAGE, 0, 4)], Opt(OptOps.PREFETCH, 0, 1)),
                      ([Opt(OptOps.STAGE, 0, 4), Opt(OptOps.PREFETCH, 0, 0)], Opt(OptOps.PREFETCH, 0, 0))]:
    k = kernel("matmul_odd").apply_opts(before)
    state = _state(k)
    with pytest.raises(KernelOptError): k.apply_opt(opt)
    assert _state(k) == state, (before, opt)
  k = kernel("matmul_odd").apply_opts([Opt(OptOps.LOCAL, 0, 24), Opt(OptOps.STAGE, 0, 12), Opt(OptOps.LOCAL, 1, 5)])
  assert k.stage_bytes() == 12 * (24 + 4) * 4 + 12 * 5 * 4 <= 1600  # A's rows padded (copied across them), B's not


def test_lanes_rules() -> None:
  k = kernel_cases()["row_sum"].kernel()  # global 12; reduce 40
  k.apply_opt(Opt(OptOps.LANES, 0, 8))
  with pytest.raises(KernelOptError): k.apply_opt(Opt(OptOps.LANES, 0, 5))  # one LANES part per kernel
  with pytest.raises(KernelOptError): kernel_cases()["elementwise"].kernel().apply_opt(Opt(OptOps.LANES, 0, 2))
  assert "tt_f8 acc" in Device[DEVICE].renderer.render(k) or CAPS.simd_width < 8  # one vector accumulator of 8 lanes
  ints = Kernel(create_schedule(_ints(2, 128).max(1).uop, DEVICE)[0][0].ast, CAPS).apply_opts([Opt(OptOps.LANES, 0, 128)])
  assert len(Device[DEVICE].renderer.render(ints)) < 30_000  # 128 partials combine through named values, not a nested expression
  padded = kernel_cases()["row_sum"].kernel().apply_opts([Opt(OptOps.PADTO, 1, 16), Opt(OptOps.LANES, 0, 16)])  # 40 of 48
  src = Device[DEVICE].renderer.render(padded)  # the two whole iterations of 16 run a body without masks, the last one masks
  assert re.search(r"for \(long (r\d+) = 0; \1 < 2; \1\+\+\)", src) and re.search(r"for \(long (r\d+) = 2; \1 < 3; \1\+\+\)", src)


# ***** invalid opts *****

def _state(k: Kernel) -> tuple:
  return (list(k.sizes), [(a.size, a.kind, a.dim, a.stride) for a in k.axes], list(k.global_order), dict(k.padded), list(k.opts))


def test_candidate_opts_leave_the_kernel_unchanged() -> None:
  for kc in kernel_cases().values():
    k = kc.kernel().apply_opts([Opt(OptOps.UPCAST, 0, 2)] if kc.kernel().sizes[0] % 2 == 0 else [])
    before, src = _state(k), Device[DEVICE].renderer.render(k)
    assert valid_opts(k) and _state(k) == before and Device[DEVICE].renderer.render(k) == src


@pytest.mark.parametrize("op", [OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.TC, OptOps.STAGE, OptOps.PREFETCH])
def test_workgroup_and_tensor_core_opts_need_a_gpu(op: OptOps) -> None:
  k = kernel_cases()["matmul_pow2"].kernel()
  for axis in range(3):
    for arg in (0, 2, 4, 16):
      with pytest.raises(KernelOptError): k.apply_opt(Opt(op, axis, arg))
  assert k.opts == [] and k.sizes == [16, 16, 16]


def _invalid_cases() -> list[tuple[str, list[Opt], Opt]]:
  t, o = OptOps, Opt
  return [  # matmul_odd: global 24, 20; reduce 12
    ("non-dividing upcast", [], o(t.UPCAST, 0, 7)),
    ("non-dividing upcast after a split", [o(t.UPCAST, 0, 4)], o(t.UPCAST, 0, 4)),
    ("non-dividing unroll", [], o(t.UNROLL, 0, 5)),
    ("upcast by 1", [], o(t.UPCAST, 0, 1)),
    ("upcast by 0", [], o(t.UPCAST, 0, 0)),
    ("negative upcast", [], o(t.UPCAST, 0, -2)),
    ("upcast axis out of range", [], o(t.UPCAST, 2, 2)),
    ("negative axis", [], o(t.UPCAST, -1, 2)),
    ("unroll axis out of range", [], o(t.UNROLL, 1, 2)),
    ("unroll on a global axis number past the reduce axes", [], o(t.UNROLL, 2, 2)),
    ("padto axis out of range", [], o(t.PADTO, 3, 16)),
    ("second thread", [o(t.THREAD, 0, 2)], o(t.THREAD, 1, 2)),
    ("second thread on the same axis", [o(t.THREAD, 0, 2)], o(t.THREAD, 0, 2)),
    ("thread over 4x the cores", [], o(t.THREAD, 0, 24)),
    ("padto after split", [o(t.UPCAST, 0, 4)], o(t.PADTO, 0, 8)),
    ("padto of a reduce axis after unroll", [o(t.UNROLL, 0, 3)], o(t.PADTO, 2, 8)),
    ("padto twice", [o(t.PADTO, 1, 16)], o(t.PADTO, 1, 8)),
    ("padto of a multiple", [], o(t.PADTO, 0, 8)),
    ("padto more than doubling", [], o(t.PADTO, 2, 32)),
    ("padto by 1", [], o(t.PADTO, 0, 1)),
    ("swap with itself", [], o(t.SWAP, 0, 0)),
    ("swap with a reduce axis", [], o(t.SWAP, 0, 2)),
    ("swap backwards", [], o(t.SWAP, 1, 0)),
    ("swap twice", [o(t.SWAP, 0, 1)], o(t.SWAP, 0, 1)),
    ("upcast product over max_upcast", [o(t.UPCAST, 0, 24), o(t.UPCAST, 1, 10)], o(t.UNROLL, 0, 2)),
    ("kblock of one block", [], o(t.KBLOCK, 0, 12)),
    ("non-dividing kblock", [], o(t.KBLOCK, 0, 5)),
    ("second kblock", [o(t.KBLOCK, 0, 6)], o(t.KBLOCK, 0, 2)),
    ("kblock on a global axis number", [], o(t.KBLOCK, 2, 2)),
    ("kblock after lanes", [o(t.LANES, 0, 4)], o(t.KBLOCK, 0, 3)),
    ("lanes after kblock", [o(t.KBLOCK, 0, 6)], o(t.LANES, 0, 2)),
    ("bool axis", [], Opt(t.UPCAST, True, 4)),  # type: ignore[arg-type]
    ("float arg", [], Opt(t.UPCAST, 0, 4.0)),  # type: ignore[arg-type]
    ("not an opt", [], ("UPCAST", 0, 4)),  # type: ignore[list-item]
  ]


@pytest.mark.parametrize("why,before,opt", _invalid_cases(), ids=[c[0] for c in _invalid_cases()])
def test_invalid_opt_raises_and_leaves_kernel_unchanged(why: str, before: list[Opt], opt: Opt) -> None:
  k = kernel_cases()["matmul_odd"].kernel().apply_opts(before)
  state, src = _state(k), Device[DEVICE].renderer.render(k)
  with pytest.raises(KernelOptError): k.apply_opt(opt)
  assert _state(k) == state and Device[DEVICE].renderer.render(k) == src
  with pytest.raises(KernelOptError): kernel_cases()["matmul_odd"].kernel().apply_opts([*before, opt])


def test_thread_needs_threads() -> None:
  k = Kernel(kernel_cases()["row_sum"].item.ast, DeviceCaps(threads=1))
  with pytest.raises(KernelOptError): k.apply_opt(Opt(OptOps.THREAD, 0, 2))
  assert k.opts == []


def test_kblock_needs_the_output_to_hold_the_sums() -> None:
  """The sums wait in the output between K blocks: not where the output is another dtype, nor on devices with workgroups."""
  k = kernel_cases()["float16"].kernel()  # sums in float32, stores float16
  with pytest.raises(KernelOptError, match="float32"): k.apply_opt(Opt(OptOps.KBLOCK, 0, 4))
  k = Kernel(kernel_cases()["matmul_odd"].item.ast, WORKGROUP_CAPS)
  with pytest.raises(KernelOptError, match="CPU"): k.apply_opt(Opt(OptOps.KBLOCK, 0, 4))
  (item,), _ = create_schedule((_randn(24, 12) @ _randn(12, 20)).T.contiguous().uop, DEVICE)  # the sums stored transposed
  with pytest.raises(KernelOptError, match="reorders"): Kernel(item.ast, CAPS).apply_opt(Opt(OptOps.KBLOCK, 0, 4))
  assert not any(o.op is OptOps.KBLOCK for o in valid_opts(k))


def test_reduce_opts_on_an_elementwise_kernel() -> None:
  k = kernel_cases()["elementwise"].kernel()
  for op in (OptOps.UNROLL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.KBLOCK):
    with pytest.raises(KernelOptError): k.apply_opt(Opt(op, 0, 2))
  assert k.opts == [] and not any(o.op is OptOps.UNROLL for o in valid_opts(k))


# ***** determinism and serialization *****

def _some_sequences() -> list[list[Opt]]:
  kc = kernel_cases()["matmul_odd"]
  rng = random.Random(1)
  return [[]] + [random_sequence(kc.kernel(), rng) for _ in range(20)]


def test_same_opts_same_source() -> None:
  kc = kernel_cases()["matmul_odd"]
  rebuilt = create_schedule(CASES["matmul_odd"]().uop, DEVICE)[0][0]  # the same AST over new buffers
  render = Device[DEVICE].renderer.render
  assert rebuilt.out is not kc.item.out
  for opts in _some_sequences():
    a, b = kc.kernel().apply_opts(opts), kc.kernel().apply_opts(opts)
    c = Kernel(rebuilt.ast, CAPS).apply_opts(opts)
    assert render(a) == render(a) == render(b) == render(c), opts
    assert a.key == c.key


RENDER_SCRIPT = """
import dataclasses, hashlib
from tinytune import Device, Kernel, Tensor
from tinytune.codegen.opts import opts_from_json
from tinytune.engine.schedule import create_schedule
item = create_schedule((Tensor.rand(24, 12).realize() @ Tensor.rand(12, 20).realize()).uop, 'CPU')[0][0]
for text in {texts!r}:
  k = Kernel(item.ast, dataclasses.replace(Device['CPU'].caps, threads=2)).apply_opts(opts_from_json(text))
  print(hashlib.sha256(Device['CPU'].renderer.render(k).encode()).hexdigest())
"""


def test_same_opts_same_source_across_processes() -> None:
  """Sources are the compile cache's and the tuning database's keys: they must not depend on hash seeds or object ids."""
  seqs, kc = _some_sequences()[:8], kernel_cases()["matmul_odd"]
  here = [hashlib.sha256(Device[DEVICE].renderer.render(kc.kernel().apply_opts(opts)).encode()).hexdigest() for opts in seqs]
  script = RENDER_SCRIPT.format(texts=[opts_to_json(opts) for opts in seqs])
  procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONHASHSEED": seed}) for seed in ("1", "2")]  # together
  for proc in procs:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.split() == here


def test_opts_json_round_trip() -> None:
  seqs = _some_sequences() + [[Opt(op, 3, 17) for op in OptOps], [Opt(OptOps.PADTO, 0, -1), Opt(OptOps.TC, 0, 0)]]
  for opts in seqs:
    text = opts_to_json(opts)
    assert opts_from_json(text) == opts and opts_to_json(opts_from_json(text)) == text
    assert all(type(o.axis) is int and type(o.arg) is int and isinstance(o.op, OptOps) for o in opts_from_json(text))
  kc = kernel_cases()["matmul_odd"]
  for opts in seqs[:5]:
    assert Device[DEVICE].renderer.render(kc.kernel().apply_opts(opts_from_json(opts_to_json(opts)))) == \
      Device[DEVICE].renderer.render(kc.kernel().apply_opts(opts))


@pytest.mark.parametrize("text", [
  '{"op": "UPCAST", "axis": 0, "arg": 4}', '"UPCAST"', "4", "null", "true",  # not a list
  '[["UPCAST", 0]]', '[["UPCAST", 0, 4, 1]]', '[[]]', '["UPCAST"]', "[null]", '[{"op": "UPCAST"}]',  # not [op, axis, arg]
  '[["FOO", 0, 4]]', '[["upcast", 0, 4]]', '[[1, 0, 4]]', '[[null, 0, 4]]',  # unknown op
  '[["UPCAST", "0", 4]]', '[["UPCAST", 0, 4.0]]', '[["UPCAST", 0, true]]', '[["UPCAST", null, 4]]', '[["UPCAST", 0, [4]]]',  # wrong types
  '[["UPCAST", 0, 4], ["UNROLL", 0]]', "[[\"UPCAST\", 0, 4]", "",  # one bad entry, bad JSON
  "[" * 100_000 + "]" * 100_000, "{" * 50_000, '[["UPCAST", 0, 4]' + ', ["UPCAST", 0, 4]' * 10_000 + "]",  # too deep or long to parse
])
def test_malformed_opts_json(text: str) -> None:
  with pytest.raises(ValueError): opts_from_json(text)


@pytest.mark.parametrize("opts", [
  [Opt(OptOps.UPCAST, 1, 32), Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UNROLL, 0, 8), Opt(OptOps.THREAD, 0, 2), Opt(OptOps.SWAP, 0, 1)],
  [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.LANES, 0, 2), Opt(OptOps.UNROLL, 0, 16), Opt(OptOps.THREAD, 0, 2),
   Opt(OptOps.SWAP, 0, 1), Opt(OptOps.STREAM, 0, 0)]])
@pytest.mark.usefixtures("on_cpu")  # gcc's stack in a CPU thread
def test_unrolled_scalar_math_keeps_the_stack(opts: list[Opt]) -> None:
  """A softmax row whose exp2 calls a scalar helper 64 times per iteration: the helper's one-lane vector argument went through the
  stack and gcc never popped it inside the loop, so these candidates overflowed a thread's stack (a segfault in an optuna search)."""
  Tensor.manual_seed(0)
  x = Tensor.randn(1024, 1024).realize()
  items, _ = create_schedule(x.softmax(-1).uop, "CPU")
  kernel = Kernel(items[0].ast, Device["CPU"].caps).apply_opts(opts)
  program, _ = compile_kernel(kernel, "CPU")
  program(items[0].out, *kernel.bufs)
  e = np.exp(x.numpy() - x.numpy().max(-1, keepdims=True))
  np.testing.assert_allclose(items[0].out.numpy_view().reshape(1024, 1024), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
