"""Counter-based random numbers computed in kernels: Threefry-2x32 with 20 rounds (Salmon et al., "Parallel random numbers:
as easy as 1, 2, 3", SC 2011) of a 64-bit key (the seed) and a 64-bit counter, one counter per element.

Each draw reads its key and first counter from a small state buffer and advances the process's counter by the number of
elements, so the sequence depends on the seed and the order of draws alone. TinyJit records the state buffers a captured call
filled and fills them again on every replay, so replays draw new numbers, the same ones as running without the JIT."""
from __future__ import annotations

import contextlib
import functools
from typing import Iterator

import numpy as np

from tinytune.dtype import dtypes
from tinytune.runtime import Buffer
from tinytune.shape import View
from tinytune.uop import Ops, UOp

M32 = 0xFFFFFFFF
ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
PARITY = 0x1BD11BDA


class _State:
  seed, counter = 0, 0
  recording: list[tuple[Buffer, int]] | None = None  # while TinyJit captures: each state buffer filled, with its draw's size


def manual_seed(seed: int) -> None: _State.seed, _State.counter = seed, 0


def _fill(buf: Buffer, n: int) -> None:
  """The key and the first counter of a draw of n numbers, into its state buffer; the counter moves on by n."""
  buf.copyin(np.array([_State.seed & M32, (_State.seed >> 32) & M32, _State.counter], dtype=np.int64))
  _State.counter += n


def state_buffer(n: int, device: str) -> Buffer:
  buf = Buffer(device, 3, dtypes.int64)
  _fill(buf, n)
  if _State.recording is not None: _State.recording.append((buf, n))
  return buf


@contextlib.contextmanager
def recording() -> Iterator[list[tuple[Buffer, int]]]:
  """The state buffers that draws inside the block fill, each with its draw's size (TinyJit refills them on replay)."""
  states: list[tuple[Buffer, int]] = []
  _State.recording = states
  try: yield states
  finally: _State.recording = None


def refill(states: list[tuple[Buffer, int]]) -> None:
  for buf, n in states: _fill(buf, n)


def _i64(v: int) -> UOp: return UOp.const(dtypes.int64, v)
def _add(a: UOp, b: UOp) -> UOp: return a.alu(Ops.ADD, b).alu(Ops.AND, _i64(M32))
def _rotl(x: UOp, r: int) -> UOp: return x.alu(Ops.MUL, _i64(1 << r)).alu(Ops.AND, _i64(M32)).alu(Ops.OR, x.alu(Ops.IDIV, _i64(1 << (32 - r))))


def threefry2x32(k0: UOp, k1: UOp, x0: UOp, x1: UOp) -> tuple[UOp, UOp]:
  """Threefry-2x32-20 of 32-bit words held in int64 values (so every product stays below 2**63)."""
  ks = (k0, k1, k0.alu(Ops.XOR, k1).alu(Ops.XOR, _i64(PARITY)))
  x0, x1 = _add(x0, ks[0]), _add(x1, ks[1])
  for s in range(1, 6):  # five groups of four rounds, each group followed by a key injection
    for r in ROTATIONS[4 * ((s - 1) % 2):][:4]:
      x0 = _add(x0, x1)
      x1 = _rotl(x1, r).alu(Ops.XOR, x0)
    x0, x1 = _add(x0, ks[s % 3]), _add(x1, _add(ks[(s + 1) % 3], _i64(s)))
  return x0, x1


@functools.lru_cache(maxsize=4)
def _index(n: int, device: str) -> UOp:
  """0, 1, ..., n-1 in an int64 buffer: each element's counter offset."""
  buf = Buffer(device, n, dtypes.int64).copyin(np.arange(n, dtype=np.int64))
  return UOp(Ops.VIEW, dtypes.int64, (UOp(Ops.BUFFER, dtypes.int64, (), buf),), View.create((n,)))


def uniform_bits(n: int, device: str) -> UOp:
  """A lazy (n,) float32 graph of uniform numbers in [0, 1) with 24 random bits each."""
  state = UOp(Ops.BUFFER, dtypes.int64, (), state_buffer(n, device))
  def word(i: int) -> UOp: return UOp(Ops.VIEW, dtypes.int64, (state,), View.create((n,), (0,), i))
  counter = word(2).alu(Ops.ADD, _index(n, device))
  bits, _ = threefry2x32(word(0), word(1), counter.alu(Ops.AND, _i64(M32)), counter.alu(Ops.IDIV, _i64(1 << 32)))
  return bits.alu(Ops.IDIV, _i64(256)).cast(dtypes.float32).alu(Ops.MUL, UOp.const(dtypes.float32, 2.0 ** -24))
