"""EMU: a CUDA GPU emulated in NumPy, so that GPU code paths are proven on any CPU.

A kernel is scheduled for a CUDA GPU (the caps of `TINYTUNE_EMU_ARCH`, sm_80 or sm_90, default sm_90) and rendered by the CUDA
renderer (DEBUG=4 prints its CUDA source), and EMU runs the lowered program that source spells (codegen/lower/): statement by
statement, every thread of a workgroup in lock step as one NumPy array (several workgroups side by side), each value with the C
type the CUDA source gives it. What CUDA does, EMU does: float32 math in float32, float16 and bfloat16 computed in float32 and
rounded to their type where the source rounds, integers wrap, C's division and remainder truncate, a float cast to an int
saturates (PTX's cvt), loops, branches and early exits as masks, shared memory per workgroup and its barriers. Where a GPU would
give an undefined result EMU raises EmuError, naming the kernel, the memory and the threads: a read or write out of bounds of a
buffer or shared array, a misaligned vector access, a shared-memory element one thread writes and another reads or writes with
no barrier between (a race), a read of shared memory no thread wrote, two threads storing to one element of a buffer, a thread
loading an element another thread stored to earlier in the launch, a barrier only some threads of a workgroup reach; and it
refuses what NVRTC or the driver would (over 1024 threads a block, over the shared memory a block may opt into: past 48 KiB the CUDA
source declares it dynamic). Loops run all threads alike
(their bounds are constants). Exact but for two things: CUDA may contract a multiply and an add into one FMA (EMU rounds both), and
exp2f, log2f and sinf are NumPy's float32 functions (CUDA's differ by an ulp or two). The warp-level instructions the CUDA renderer
emits are emu_tc.py's: TC's mma.sync, ldmatrix and wmma API (a warp split at one of them is an error too), __syncwarp(), and
cp.async, whose shared-memory elements are a race to touch until the wait_group that covers their group. A tensor core's sums are
float32 in K's order (the hardware's order and rounding inside one mma are its own: results agree to float32 rounding).

EMU's timings are the host seconds its interpreter takes, nothing like a GPU's: the device says so (`emulated`), and the search
and benchmarks mark them as such. Memory is host NumPy arrays; launches run at once (not asynchronous)."""
from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, NoReturn

import numpy as np

from tinytune.codegen.caps import CUDA_ARCHS, SHARED_OPT_IN, DeviceCaps, cuda_caps
from tinytune.codegen.cstyle import CUDARenderer
from tinytune.codegen.kernel import Kernel
from tinytune.codegen.lower import VALUES, AccArg, FoldArg, LinearProgram, LoadArg, LocalArg, LoopArg, SpecialArg, StoreArg, ValueArg, lower
from tinytune.dtype import DType, dtypes
from tinytune.runtime import Buffer, Compiled, CompileError, Program
from tinytune.runtime.emu_tc import AsyncCopies, TensorCores
from tinytune.uop import ALU, Ops


class EmuError(RuntimeError):
  """What a GPU would do wrong or leave undefined in a kernel EMU runs (a race, an access out of bounds, ...)."""


def emu_caps(arch: str) -> DeviceCaps:
  """The CUDA GPU's caps for `arch`, tensor cores included."""
  if arch not in CUDA_ARCHS: raise ValueError(f"TINYTUNE_EMU_ARCH={arch!r}: EMU emulates {' or '.join(CUDA_ARCHS)}")
  return cuda_caps(arch)


# ***** the renderer: CUDA's, keeping each source's lowered program for compile *****

class EMURenderer(CUDARenderer):
  """The CUDA renderer; it keeps the lowered program of each source it renders (the last few hundred), which EMU's compile turns
  into what its programs run."""
  KEEP = 512

  def __init__(self) -> None:
    self.programs: OrderedDict[str, LinearProgram] = OrderedDict()
    self.lock = threading.Lock()

  def render(self, k: Kernel) -> str:
    src = self.spell(p := lower(k, self))
    with self.lock:
      self.programs[src] = p
      self.programs.move_to_end(src)
      while len(self.programs) > self.KEEP: self.programs.popitem(last=False)
    return src

  def lowered(self, src: str) -> LinearProgram | None:
    with self.lock: return self.programs.get(src)


# ***** a lowered program as bytes (JSON: no pickle), and back *****

_ARGS: dict[str, Any] = {c.__name__: c for c in (ValueArg, AccArg, LoadArg, StoreArg, FoldArg, LoopArg, SpecialArg, LocalArg)}
_DTYPES = {d.name: d for d in (*dtypes.all, dtypes.void)}


def _enc(a: Any) -> Any:
  if a is None or isinstance(a, (bool, int, float, str)): return a
  if isinstance(a, Ops): return {"op": a.name}
  if isinstance(a, DType): return {"dtype": a.name}
  if type(a).__name__ in _ARGS and type(a) is _ARGS[type(a).__name__]: return {"arg": type(a).__name__, "v": [_enc(x) for x in a]}
  if isinstance(a, tuple): return {"tuple": [_enc(x) for x in a]}
  raise CompileError(f"EMU cannot carry a statement's arg {a!r}")


def _dec(a: Any) -> Any:
  if not isinstance(a, dict): return a
  if "op" in a: return Ops[a["op"]]
  if "dtype" in a: return _DTYPES[a["dtype"]]
  if "arg" in a: return _ARGS[a["arg"]](*(_dec(x) for x in a["v"]))
  return tuple(_dec(x) for x in a["tuple"])


def named(u: Any) -> bool:
  """Whether `u` is a value a statement defines and names (else it is spelled inline: index math, a constant, a lane)."""
  return u.op in VALUES and u.arg is not None and u.arg.name is not None


def dump(p: LinearProgram) -> bytes:
  """The program's statements and the nodes they use, each once. Integer division and remainder in index math carry whether the
  renderer spelled them as floor operations (a numerator that can be negative) or as C's."""
  index: dict[int, int] = {}
  nodes: list[list] = []
  for root in p.uops:
    stack = [(root, False)]
    while stack:
      u, ready = stack.pop()
      if id(u) in index: continue
      if not ready:
        stack.append((u, True))
        stack += [(s, False) for s in u.src if id(s) not in index]
        continue
      floor = u.op in (Ops.IDIV, Ops.MOD) and not named(u) and u.src[0].vmin < 0
      index[id(u)] = len(nodes)
      nodes.append([u.op.name, u.dtype.name, [index[id(s)] for s in u.src], _enc(u.arg), floor])
  return json.dumps({"emu": 1, "nodes": nodes, "program": [index[id(u)] for u in p.uops]}).encode()


class Node:
  """A statement or a node of one, as the program's bytes give it back."""
  __slots__ = ("op", "dtype", "src", "arg", "floor")
  def __init__(self, op: Ops, dtype: DType, src: tuple[Node, ...], arg: Any, floor: bool):
    self.op, self.dtype, self.src, self.arg, self.floor = op, dtype, src, arg, floor


def load(lib: bytes) -> list[Node]:
  try:
    data = json.loads(lib)
    nodes: list[Node] = []
    for op, dt, src, arg, floor in data["nodes"]: nodes.append(Node(Ops[op], _DTYPES[dt], tuple(nodes[i] for i in src), _dec(arg), floor))
    return [nodes[i] for i in data["program"]]
  except (ValueError, KeyError, TypeError, IndexError) as e: raise CompileError(f"not an EMU program ({type(e).__name__}: {e})") from None


# ***** C's types and conversions in NumPy *****

_C_NP = {"bool": np.bool_, "signed char": np.int8, "unsigned char": np.uint8, "short": np.int16, "unsigned short": np.uint16, "int": np.int32,
         "unsigned int": np.uint32, "long long": np.int64, "unsigned long long": np.uint64, "long": np.int64, "unsigned long": np.uint64,
         "float": np.float32, "double": np.float64}
R = CUDARenderer


def reg(dt: DType) -> Any:
  """The NumPy type of a value of `dt` in the CUDA source (a 16-bit float is a float there)."""
  return _C_NP[R.types[dt]]


def bf16_bits(x: Any) -> np.ndarray:
  """float32 -> bfloat16's bits, rounded to nearest even, a NaN the quiet NaN of its sign (the CUDA renderer's tt_f32_to_bf16)."""
  u = np.asarray(x, np.float32).view(np.uint32)
  nan = (u & 0x7FFFFFFF) > 0x7F800000
  rounded = (u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16
  return np.where(nan, ((u >> 16) & 0x8000) | 0x7FC0, rounded).astype(np.uint16)


def bf16_value(bits: Any) -> np.ndarray: return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)
def round_half(x: Any, dt: DType) -> Any:
  """A float32 rounded to float16 or bfloat16 and back, as the source's conversions do."""
  if dt == dtypes.bfloat16: return bf16_value(bf16_bits(x))
  return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def convert(x: Any, to: Any) -> Any:
  """C's conversion of `x` to the NumPy type `to`; a float to an integer truncates and saturates, NaN to 0 (PTX's cvt.rzi)."""
  x = np.asarray(x)
  if x.dtype == to: return x
  if x.dtype.kind == "f" and np.dtype(to).kind in "iu":
    info = np.iinfo(to)
    t = np.trunc(x)
    with np.errstate(invalid="ignore"):  # NaN and out-of-range lanes cast to garbage first, then replaced
      return np.where(np.isnan(t), 0, np.where(t >= float(info.max), info.max, np.where(t <= float(info.min), info.min, t.astype(to))))
  if to is np.bool_: return x != 0
  return x.astype(to)


def _divide(floor: bool, remainder: bool) -> Callable[[Any, Any], Any]:
  """Integer division or remainder: floor operations (index math whose numerator can be negative), else C's, which truncate."""
  def divide(a: Any, b: Any) -> Any:
    zero = b == 0
    safe = np.where(zero, 1, b)  # C leaves x/0 undefined; EMU gives 0, as the IR's own semantics do
    if floor: ret = a % safe if remainder else a // safe
    elif remainder: ret = np.fmod(a, safe)
    else: ret = a // safe + ((np.fmod(a, safe) != 0) & ((a < 0) != (safe < 0)))  # floor back up to truncation
    return np.where(zero, 0, ret)
  return divide


def _max(a: Any, b: Any) -> Any: return np.where((a > b) | (a != a), a, b)  # a NaN in either operand wins, as the CUDA source's does
def _recip(a: Any) -> Any: return (np.float64(1) if np.asarray(a).dtype == np.float64 else np.float32(1)) / a
_C_OPS: dict[Ops, Callable[..., Any]] = {
  Ops.NEG: np.negative, Ops.RECIP: _recip, Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.SQRT: np.sqrt, Ops.ADD: np.add,
  Ops.MUL: np.multiply, Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor,
  Ops.WHERE: lambda c, a, b: np.where(np.asarray(c, bool), a, b),
}


def c_fn(op: Ops, src_dts: list[DType], floor: bool = False, index: bool = False) -> Callable[..., Any]:
  """What the C expression of `op` on operands of `src_dts` gives, in C's arithmetic type (integers in 64 bits: the caller wraps them
  to the value's type), as a function of the operands; `index`: index math, whose operands are 64-bit already."""
  ints = tuple(i for i, d in enumerate(src_dts) if not d.is_float and not (op is Ops.WHERE and i == 0))
  it = np.uint64 if dtypes.uint64 in src_dts else np.int64
  fn: Callable[..., Any]
  if op is Ops.AND: fn = np.logical_and if src_dts[0] == dtypes.bool else np.bitwise_and
  elif op is Ops.MAX: fn = _max if src_dts[0].is_float else lambda a, b: np.where(a > b, a, b)
  elif op in (Ops.IDIV, Ops.MOD): fn = _divide(floor, op is Ops.MOD)
  elif op in _C_OPS: fn = _C_OPS[op]
  else: raise EmuError(f"EMU has no {op.name}")
  if index or not ints or op is Ops.AND and src_dts[0] == dtypes.bool: return fn
  return lambda *args: fn(*(np.asarray(a, it) if i in ints else a for i, a in enumerate(args)))


def c_op(op: Ops, args: list[Any], src_dts: list[DType], floor: bool = False) -> Any: return c_fn(op, src_dts, floor)(*args)


def cast(x: Any, dst: DType) -> Any:
  """The CUDA renderer's CAST: to a 16-bit float by way of float32, else C's conversion."""
  if dst.is_half: return round_half(convert(x, np.float32), dst)
  return convert(x, reg(dst))


def bitcast(x: Any, src: DType, dst: DType) -> Any:
  """x's bits, stored as `src` would be in a buffer, read as `dst`."""
  if src == dtypes.bfloat16: bits = bf16_bits(x)
  elif src == dtypes.float16: bits = np.asarray(x, np.float32).astype(np.float16)
  else: bits = np.asarray(x).astype(reg(src))
  if dst == dtypes.bfloat16: return bf16_value(bits.view(np.uint16))
  if dst == dtypes.float16: return bits.view(np.float16).astype(np.float32)
  return bits.view(reg(dst))


def to_memory(x: Any, dt: DType) -> Any:
  """A value stored into memory of `dt` (a buffer's element): bfloat16 by tt_f32_to_bf16, the rest by C's conversion."""
  if dt == dtypes.bfloat16: return bf16_bits(x).view(dt.np)
  return convert(x, dt.np)


def lanewise(x: Any) -> Any:
  """A scalar beside a vector: the same in each of its lanes (a thread's scalar gets a lane axis)."""
  return x if np.ndim(x) == 0 else np.asarray(x)[..., None]


def from_memory(x: Any, dt: DType) -> Any: return convert(x, np.float32) if dt.is_half else x


# ***** running a program *****

class _Shared:
  """A shared-memory array of every workgroup in the run, with who wrote and read each element since the last barrier."""
  NONE = np.iinfo(np.int32).max

  def __init__(self, name: str, groups: int, size: int, dtype: DType, stored: bool):
    self.name, self.size, self.dtype, self.stored = name, size, dtype, stored
    self.data = np.zeros(groups * size, reg(dtype))
    self.written = np.zeros(groups * size, bool)
    self.copying = np.zeros(groups * size, np.int32)  # cp.async copies to each element that have not landed
    self.wmin, self.wmax, self.rmin, self.rmax = (np.empty(groups * size, np.int32) for _ in range(4))
    self.barrier()

  def barrier(self, groups: np.ndarray | None = None) -> None:
    """A barrier in the workgroups of `groups` (all where None): what their threads did before is ordered before what follows."""
    for arr, none in ((self.wmin, self.NONE), (self.rmin, self.NONE), (self.wmax, -1), (self.rmax, -1)):
      if groups is None: arr.fill(none)
      else: arr.reshape(-1, self.size)[groups] = none

  def warp_barrier(self, on: np.ndarray) -> None:
    """__syncwarp() in the warps of `on` ((groups, warps) mask): an element only the lanes of one of them touched is ordered."""
    lo, hi = np.minimum(self.wmin, self.rmin), np.maximum(self.wmax, self.rmax)
    group = np.arange(lo.size) // self.size
    synced = (lo != self.NONE) & (lo // 32 == hi // 32) & on[group, np.minimum(lo // 32, on.shape[1] - 1)]
    for arr, none in ((self.wmin, self.NONE), (self.rmin, self.NONE), (self.wmax, -1), (self.rmax, -1)): arr[synced] = none


class _Run:
  """One launch's state over a chunk of its workgroups: each lane is a thread."""

  def __init__(self, prog: EMUProgram, bufs: list[np.ndarray], stored: dict, first: int, groups: int):
    threads = prog.launch[1]
    self.prog, self.bufs, self.first, self.groups, self.n = prog, bufs, first, groups, groups * threads
    # the launch's: per buffer's memory (by id), the least and greatest thread that stored to each element
    self.stored: dict[int, tuple[np.ndarray, np.ndarray]] = stored
    self.t = np.tile(np.arange(threads, dtype=np.int64), groups)
    self.g = np.repeat(np.arange(first, first + groups, dtype=np.int64), threads)
    self.local_g = self.g - first
    self.env: dict[str, Any] = {}
    self.alive = np.ones(self.n, bool)
    self.active, self.full, self.any = self.alive, True, True
    self.shared: dict[str, _Shared] = {}
    self.copies = AsyncCopies(self.n)
    self.unfenced = np.zeros(self.n, bool)  # threads that stored to shared memory since their last fence.proxy.async (wgmma reads it)

  def set_active(self, mask: np.ndarray) -> None:
    self.active = mask
    self.full, self.any = bool(mask.all()), bool(mask.any())

  def mask(self, guard: Any) -> np.ndarray:
    """The threads that run a guarded access: active ones where the guard holds."""
    if guard is True: return self.active
    return self.active & np.broadcast_to(np.asarray(guard, bool), (self.n,))

  def lanes(self, x: Any, width: int = 1) -> np.ndarray:
    """A value (one for all threads, or each thread's; a vector's lanes last) as an array of every thread's."""
    return np.broadcast_to(np.asarray(x), (self.n,) if width == 1 else (self.n, width))

  def who(self, where: np.ndarray, at: np.ndarray | None = None) -> str:
    """The first few threads of `where` (a mask over the lanes), as (group, thread) with the element each touched."""
    picks = np.flatnonzero(where)[:3]
    text = ", ".join(f"(group {self.g[i]}, thread {self.t[i]})" + ("" if at is None else f" at [{at[i]}]") for i in picks)
    return f"thread{'s' if where.sum() > 1 else ''} {text}" + (f" and {int(where.sum()) - 3} more" if where.sum() > 3 else "")

  def fail(self, what: str) -> None: raise EmuError(f"EMU: kernel {self.prog.name}: {what}")


Fn = Callable[[_Run], Any]


def under(s: _Run, mask: np.ndarray, fn: Fn) -> Any:
  """fn(s) with only the threads of `mask` active: a guarded statement's inline reads happen only where it runs, as in C."""
  if mask is s.active: return fn(s)
  saved = s.active, s.full, s.any
  s.set_active(mask)
  try: return fn(s)
  finally: s.active, s.full, s.any = saved


class _Loop:
  __slots__ = ("var", "start", "end", "body")
  def __init__(self, var: str, start: int, end: int, body: list): self.var, self.start, self.end, self.body = var, start, end, body


class _If:
  __slots__ = ("cond", "then", "otherwise")
  def __init__(self, cond: Fn, then: list, otherwise: list): self.cond, self.then, self.otherwise = cond, then, otherwise


NOBODY = np.iinfo(np.int64).max  # no thread stored to this element yet
MAX_THREADS = 1024  # a CUDA block's threads


class EMUProgram(Program):
  """A lowered program made into closures, one per statement, nested as its loops and branches are."""
  LANES = 1 << 14  # threads run side by side: workgroups in chunks of about this many threads

  def __init__(self, name: str, stmts: list[Node], launch: tuple[int, int], shared_bytes: int = SHARED_OPT_IN["sm_90"]):
    """`shared_bytes`: the most shared memory a block may opt into (the emulated architecture's)."""
    self.name, self.launch = name, launch
    shared = sum(u.arg.size * (u.dtype.itemsize if u.arg.stored else np.dtype(reg(u.dtype)).itemsize) for u in stmts if u.op is Ops.DEFINE_LOCAL)
    if shared > shared_bytes:
      raise CompileError(f"EMU: kernel {name}: {shared} bytes of shared memory, over the {shared_bytes} a CUDA block may opt into")
    if launch[1] > MAX_THREADS: raise CompileError(f"EMU: kernel {name}: {launch[1]} threads a workgroup, over CUDA's {MAX_THREADS}")
    self.exprs: dict[int, Fn] = {}
    self.tc = TensorCores(self)
    self.body, end = self.block(stmts, 0)
    if end != len(stmts): raise CompileError(f"EMU: kernel {name}: a {stmts[end].op.name} closes nothing")

  def __call__(self, *bufs: Buffer, wait: bool = False) -> float | None:
    st = time.perf_counter()
    mems, stored = [b.mem for b in bufs], dict[int, tuple[np.ndarray, np.ndarray]]()
    groups, threads = self.launch
    chunk = max(1, self.LANES // max(threads, 1))
    with np.errstate(all="ignore"):
      for first in range(0, groups, chunk): self.run(self.body, _Run(self, mems, stored, first, min(chunk, groups - first)))
    return time.perf_counter() - st  # a synchronous device's run is done: its seconds, waited for or not (as the CPU's)

  def run(self, items: list, s: _Run) -> None:
    for it in items:
      if type(it) is _Loop:
        for v in range(it.start, it.end):
          if not s.any: break
          s.env[it.var] = np.int64(v)
          self.run(it.body, s)
      elif type(it) is _If:
        before = s.active
        cond = np.broadcast_to(np.asarray(it.cond(s), bool), (s.n,))
        s.set_active(before & cond)
        if s.any: self.run(it.then, s)
        s.set_active(before & ~cond & s.alive)
        if s.any and it.otherwise: self.run(it.otherwise, s)
        s.set_active(before & s.alive)
      else: it(s)

  # ***** structure *****
  def block(self, stmts: list[Node], i: int) -> tuple[list, int]:
    """The statements from `i` to the end of their loop or branch, compiled; returns them and where they stopped."""
    out: list = []
    while i < len(stmts):
      u = stmts[i]
      if u.op in (Ops.ENDRANGE, Ops.ENDIF, Ops.ELSE): return out, i
      if u.op is Ops.RANGE:
        body, i = self.block(stmts, i + 1)
        self.expect(stmts, i, Ops.ENDRANGE)
        out.append(_Loop(u.arg.var, u.arg.start, u.arg.end, body))
      elif u.op is Ops.IF:
        then, i = self.block(stmts, i + 1)
        otherwise: list = []
        if i < len(stmts) and stmts[i].op is Ops.ELSE: otherwise, i = self.block(stmts, i + 1)
        self.expect(stmts, i, Ops.ENDIF)
        out.append(_If(self.expr(u.src[0]), then, otherwise))
      else: out.append(self.statement(u))
      i += 1
    return out, i

  def expect(self, stmts: list[Node], i: int, op: Ops) -> None:
    if i >= len(stmts) or stmts[i].op is not op: self.fail_compile(f"a block is not closed by {op.name}")

  def fail_compile(self, what: str) -> NoReturn: raise CompileError(f"EMU: kernel {self.name}: {what}")

  # ***** statements *****
  def statement(self, u: Node) -> Fn:
    op, arg = u.op, u.arg
    if named(u):
      value, name = self.value(u), arg.name
      def define(s: _Run) -> None: s.env[name] = value(s)
      return define
    if op is Ops.SPECIAL: return self.special(u)
    if op is Ops.ASSIGN: return self.assign(u)
    if op is Ops.STORE: return self.store(u)
    if op is Ops.EXIT:
      cond = self.expr(u.src[0])
      def leave(s: _Run) -> None:
        s.alive = s.alive & ~(s.active & np.broadcast_to(np.asarray(cond(s), bool), (s.n,)))
        s.set_active(s.active & s.alive)
      return leave
    if op is Ops.DEFINE_LOCAL:
      def define_local(s: _Run) -> None:
        if arg.name not in s.shared: s.shared[arg.name] = _Shared(arg.name, s.groups, arg.size, u.dtype, arg.stored)
      return define_local
    if op is Ops.BARRIER:
      if arg is None: return self.barrier
      if arg == "stores": return lambda s: None  # the CPU's streaming stores
      if arg == "commit_group": return lambda s: s.copies.commit(s.active)
      if isinstance(arg, tuple) and arg[0] == "wait_group": return lambda s: s.copies.wait(self, s, arg[1])
      self.fail_compile(f"no barrier {arg!r}")
    if op is Ops.WMMA: return self.tc.statement(u)
    raise CompileError(f"EMU: kernel {self.name}: no statement {op.name}")

  def barrier(self, s: _Run) -> None:
    """__syncthreads() in the workgroups whose threads run it: each of their threads not exited must (a branch that differs between
    workgroups is fine, one that differs inside one is not)."""
    if s.full:
      for sh in s.shared.values(): sh.barrier()
      return
    active = s.active.reshape(s.groups, -1)
    groups: np.ndarray = np.asarray(active.any(axis=1))
    if (stray := (s.alive.reshape(s.groups, -1) & ~active & groups[:, None]).ravel()).any():
      s.fail(f"__syncthreads() in code that only some threads of a workgroup run: {s.who(stray)} of the workgroup do not reach it")
    for sh in s.shared.values(): sh.barrier(groups)

  def special(self, u: Node) -> Fn:
    name, base, mult, mod = u.arg
    def special(s: _Run) -> None:
      x = s.g if base == "group_id" else s.t if base == "local_id" else s.env[base]
      if mult != 1: x = x // mult
      s.env[name] = x % mod if mod else x
    return special

  def assign(self, u: Node) -> Fn:
    target, val, guard = u.src
    value, g = self.expr(val), self.guard(guard)
    rhs = value
    if (op := u.arg) is not None:  # t = t op v, a scalar v added to each lane of a vector t
      t, fn, spread = self.expr(target), c_fn(op, [target.dtype, val.dtype]), self.width(target) > 1 and self.width(val) == 1
      rhs = lambda s: fn(t(s), lanewise(value(s)) if spread else value(s))  # noqa: E731
    if target.op is Ops.CELL:
      write = self.cell_access(target)
      def assign_shared(s: _Run) -> None:
        mask = s.mask(g(s))
        write(s, mask, under(s, mask, rhs))
      return assign_shared
    lane = None
    if target.op is Ops.GEP: target, lane = target.src[0], target.arg
    if not named(target): raise CompileError(f"EMU: kernel {self.name}: cannot assign to a {target.op.name}")
    name, to, width = target.arg.name, reg(target.dtype), target.arg.width
    def assign(s: _Run) -> None:
      mask = s.mask(g(s))
      new = convert(under(s, mask, rhs), to)
      if lane is not None:
        old = np.array(s.lanes(s.env[name], width))
        old[:, lane] = np.where(mask, new, old[:, lane])
        s.env[name] = old
      elif mask is s.active and s.full: s.env[name] = new
      else: s.env[name] = np.where(mask[:, None] if width > 1 else mask, new, s.env[name])
    return assign

  def guard(self, guard: Node) -> Fn:
    if guard.op is Ops.CONST and guard.arg is True: return lambda s: True
    return self.expr(guard)

  def store(self, u: Node) -> Fn:
    (idx, val, guard), (width, buf, *_) = u.src, u.arg
    if u.arg.cp_async: return self.copy_async(u)
    at, value, g, dt = self.expr(idx), self.expr(val), self.guard(guard), u.dtype
    if isinstance(buf, str):  # the CUDA source stores bfloat16 into a float array by way of its 16 bits: rounded
      def store_shared(s: _Run) -> None:
        mask = s.mask(g(s))
        v = under(s, mask, value)
        self.shared_access(s, buf, at(s), width, mask, round_half(v, dt) if dt == dtypes.bfloat16 else v)
      return store_shared
    def store(s: _Run) -> None:
      mask = s.mask(g(s))
      if not s.any or not mask.any(): return
      offs, mem = self.offsets(s, buf, at(s), width, mask, "stores to"), s.bufs[buf]
      tid = (s.g * self.launch[1] + s.t)[mask]
      if not u.arg.any: self.check_stores(s, buf, offs, tid, mask)  # else any of the threads' values may land: the last one here
      v = s.lanes(under(s, mask, value), width)[mask]
      mem[offs] = to_memory(v.reshape(offs.shape), dt)
    return store

  def copy_async(self, u: Node) -> Fn:
    """cp.async.{ca,cg}.shared.global [shared + idx], [global], bytes: the source is read now, the shared elements are written at the
    cp.async.wait_group that covers the copy's group (AsyncCopies); until then any access of them is a race."""
    (idx, val, guard), (width, buf, cache), dt = u.src, (u.arg.width, u.arg.buf, u.arg.cp_async), u.dtype
    size = width * (dt.itemsize if dt.is_half else np.dtype(reg(dt)).itemsize)
    if not isinstance(buf, str) or val.op is not Ops.LOAD or isinstance(val.arg.buf, str) or val.dtype != dt:
      self.fail_compile("a cp.async copies elements of a global buffer to a shared array of their type")
    if size not in (4, 8, 16) or cache == "cg" and size != 16: self.fail_compile(f"cp.async.{cache} of {size} bytes (ca: 4, 8 or 16; cg: 16)")
    at, value, g = self.expr(idx), self.expr(val), self.guard(guard)
    def copy(s: _Run) -> None:
      mask = s.mask(g(s))
      if not mask.any(): return
      sh, start = self.shared_array(s, buf), s.lanes(np.asarray(at(s), np.int64))
      if (bad := start[mask] % width != 0).any(): s.fail(f"{s.who(self.rows(s, mask, bad), start)} cp.async to shared {buf} misaligned")
      dst = start[mask][:, None] + np.arange(width)
      v = s.lanes(under(s, mask, value), width)[mask].reshape(dst.shape)
      self.shared_elements(s, sh, mask, dst, v, at=start, record=False)  # the checks of a write: the copy lands at some time from now
      s.copies.issue(s, sh, np.flatnonzero(mask), dst, v)
    return copy

  def check_stores(self, s: _Run, buf: int, offs: np.ndarray, tid: np.ndarray, mask: np.ndarray) -> None:
    """Two threads storing to one element of a buffer: which value lands is up to the GPU."""
    if (key := id(s.bufs[buf])) not in s.stored:
      size = s.bufs[buf].size
      s.stored[key] = (np.full(size, NOBODY, np.int64), np.full(size, -1, np.int64))
    lo, hi = s.stored[key]
    t = np.broadcast_to(tid.reshape(-1, *([1] * (offs.ndim - 1))), offs.shape).ravel()
    np.minimum.at(lo, offs.ravel(), t)
    np.maximum.at(hi, offs.ravel(), t)
    if (clash := lo[offs] != hi[offs]).any():
      rows = clash.reshape(len(tid), -1).any(axis=1)
      where = np.zeros(s.n, bool)
      where[np.flatnonzero(mask)[rows]] = True
      first = offs.reshape(len(tid), -1)[rows][0].ravel()[0]
      s.fail(f"{s.who(where)} store to data{buf}[{first}], which threads {lo[first]} and {hi[first]} (flat ids) both store: a race")

  def check_loads(self, s: _Run, buf: int, offs: np.ndarray, mask: np.ndarray) -> None:
    """A thread reading an element of a buffer that another thread stored to earlier in the launch: nothing orders the two."""
    lo, hi = s.stored[id(s.bufs[buf])]
    tid = (s.g * self.launch[1] + s.t)[mask].reshape(-1, *([1] * (offs.ndim - 1)))
    if (other := ((lo[offs] != NOBODY) & ((lo[offs] != tid) | (hi[offs] != tid))).reshape(len(tid), -1).any(axis=1)).any():
      where = np.zeros(s.n, bool)
      where[np.flatnonzero(mask)[other]] = True
      first = offs.reshape(len(tid), -1)[other][0][0]
      s.fail(f"{s.who(where)} load data{buf}[{first}], which thread {lo[first] if lo[first] != tid[other][0].ravel()[0] else hi[first]} "
             "(flat id) stored to in this launch: a race")

  def offsets(self, s: _Run, buf: int, at: Any, width: int, mask: np.ndarray, what: str) -> np.ndarray:
    """The element offsets of the masked threads' access of `width` elements at `at`, checked against the buffer's bounds."""
    idx = s.lanes(np.asarray(at, np.int64))[mask]
    size = s.bufs[buf].size
    if width > 1:
      if (bad := idx % width != 0).any():
        where = np.zeros(s.n, bool)
        where[np.flatnonzero(mask)[bad]] = True
        s.fail(f"{s.who(where, s.lanes(np.asarray(at)))} {what} data{buf} with a misaligned {width}-wide vector access")
      idx = idx[:, None] + np.arange(width)
    if (bad := ((idx < 0) | (idx >= size)).reshape(len(idx), -1).any(axis=1)).any():
      where = np.zeros(s.n, bool)
      where[np.flatnonzero(mask)[bad]] = True
      s.fail(f"{s.who(where, s.lanes(np.asarray(at)))} {what} data{buf} out of its bounds [0, {size})")
    if (idx > np.iinfo(np.int32).max).any(): s.fail(f"an offset into data{buf} overflows CUDA's int index math")
    return idx

  def load(self, u: Node) -> Fn:
    (idx, valid), (_, width, buf), dt = u.src, u.arg, u.dtype
    at, ok, to = self.expr(idx), self.guard(valid), reg(dt)
    if isinstance(buf, str):
      def load_shared(s: _Run) -> Any: return self.shared_access(s, buf, at(s), width, s.mask(ok(s)))
      return load_shared
    def load(s: _Run) -> Any:
      a, v = at(s), ok(s)
      mem = s.bufs[buf]
      if s.full and v is True and np.ndim(a) == 0 and width == 1 and id(mem) not in s.stored:  # one element for every thread
        self.offsets(s, buf, np.full(s.n, a), 1, np.ones(s.n, bool), "loads from")
        return np.asarray(from_memory(mem[int(a)], dt), to)
      mask = s.mask(v)
      out = np.zeros((s.n, width) if width > 1 else s.n, to)
      if mask.any():
        offs = self.offsets(s, buf, a, width, mask, "loads from")
        if id(mem) in s.stored: self.check_loads(s, buf, offs, mask)
        out[mask] = from_memory(mem[offs], dt)
      return out
    return load

  # ***** shared memory *****
  def cell_access(self, cell: Node) -> Callable[..., Any]:
    """A CELL (`name[index text]`, the text a sum of products of numbers and variables) as an access of shared memory."""
    name, text = cell.arg
    terms = [[int(f) if f.lstrip("-").isdigit() else f for f in term.split("*")] for term in text.replace(" ", "").split("+")]
    def at(s: _Run) -> Any:
      total: Any = np.int64(0)
      for term in terms:
        p: Any = np.int64(1)
        for f in term: p = p * (f if isinstance(f, int) else s.env[f])
        total = total + p
      return total
    def access(s: _Run, mask: np.ndarray, value: Any = None) -> Any: return self.shared_access(s, name, at(s), 1, mask, value)
    return access

  def shared_array(self, s: _Run, name: str) -> _Shared:
    if (sh := s.shared.get(name)) is None: s.fail(f"{name} is used before its DEFINE_LOCAL")
    assert sh is not None
    return sh

  def shared_access(self, s: _Run, name: str, at: Any, width: int, mask: np.ndarray, value: Any = None) -> Any:
    """A read (value None) or write of `width` elements at `at` of shared array `name` by the masked threads, with the race checks; a
    read returns every thread's value (0 where masked off)."""
    sh, at = self.shared_array(s, name), s.lanes(np.asarray(at, np.int64))
    if not mask.any(): return None if value is not None else np.zeros((s.n, width) if width > 1 else s.n, reg(sh.dtype))
    idx = at[mask]
    if width > 1:
      if (bad := idx % width != 0).any():
        s.fail(f"{s.who(self.rows(s, mask, bad), at)} {'write' if value is not None else 'read'} shared {name}[{sh.size}] "
               f"with a misaligned {width}-wide vector access")
      idx = idx[:, None] + np.arange(width)
    return self.shared_elements(s, sh, mask, idx, None if value is None else s.lanes(value, width)[mask], at=at)

  @staticmethod
  def rows(s: _Run, mask: np.ndarray, bad: Any) -> np.ndarray:
    """The threads of `mask` whose rows (in order) are `bad`, as a mask over the lanes."""
    where = np.zeros(s.n, bool)
    where[np.flatnonzero(mask)[bad]] = True
    return where

  def shared_elements(self, s: _Run, sh: _Shared, mask: np.ndarray, idx: np.ndarray, value: Any = None, at: np.ndarray | None = None,
                      by: tuple[np.ndarray, np.ndarray] | None = None, record: bool = True) -> Any:
    """A read (value None) or write of elements `idx` of `sh` (a row for each thread of `mask`, in order: (rows,) or (rows, k)), with the
    race checks; `by` (first, last thread of each row): rows a warp's lanes access together; `record` False: only the checks (a
    cp.async's issue). A read returns every thread's values (0 where masked off)."""
    writing = value is not None
    out = None if writing else np.zeros((s.n, *idx.shape[1:]), reg(sh.dtype))
    if not mask.any(): return out
    def failing(bad: Any, why: str) -> None:
      s.fail(f"{s.who(self.rows(s, mask, bad), at)} {'write' if writing else 'read'} shared {sh.name}[{sh.size}] {why}")
    if (bad := ((idx < 0) | (idx >= sh.size)).reshape(len(idx), -1).any(axis=1)).any(): failing(bad, "out of its bounds")
    lo_t, hi_t = (s.t[mask], s.t[mask]) if by is None else by
    def per_row(x: np.ndarray) -> np.ndarray: return x.astype(np.int32).reshape(-1, *([1] * (idx.ndim - 1)))
    lo_t, hi_t = per_row(lo_t), per_row(hi_t)
    flat = per_row(s.local_g[mask]).astype(np.int64) * sh.size + idx
    def others(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:  # another thread than the row's is in [lo, hi]: it touched the element
      return ((lo[flat] != sh.NONE) & ((lo[flat] != lo_t) | (hi[flat] != hi_t))).reshape(len(idx), -1).any(axis=1)
    def other(lo: np.ndarray, hi: np.ndarray) -> str:
      clash = ((lo[flat] != sh.NONE) & ((lo[flat] != lo_t) | (hi[flat] != hi_t)))
      i, mine = flat[clash][0], np.broadcast_to(lo_t, flat.shape)[clash][0]
      return f"thread {lo[i] if lo[i] != mine else hi[i]}"
    if (bad := np.asarray(sh.copying[flat] > 0).reshape(len(idx), -1).any(axis=1)).any():
      failing(bad, "that a cp.async copies to, before a cp.async.wait_group covers its group: a race")
    if writing:
      if record:
        s.unfenced[mask] = True
        np.minimum.at(sh.wmin, flat.ravel(), np.broadcast_to(lo_t, flat.shape).ravel())
        np.maximum.at(sh.wmax, flat.ravel(), np.broadcast_to(hi_t, flat.shape).ravel())
      if (bad := others(sh.wmin, sh.wmax)).any(): failing(bad, f"that {other(sh.wmin, sh.wmax)} writes too with no barrier between: a race")
      if (bad := others(sh.rmin, sh.rmax)).any(): failing(bad, f"that {other(sh.rmin, sh.rmax)} read with no barrier between: a race")
      if not record: return None
      v = convert(np.broadcast_to(value, flat.shape), reg(sh.dtype))
      sh.data[flat] = round_half(v, sh.dtype) if sh.stored and sh.dtype.is_half else v  # C converts to the array's half: rounded
      sh.written[flat] = True
      return None
    if (bad := others(sh.wmin, sh.wmax)).any(): failing(bad, f"that {other(sh.wmin, sh.wmax)} wrote with no barrier between: a race")
    if (bad := ~sh.written[flat].reshape(len(idx), -1).all(axis=1)).any(): failing(bad, "that no thread wrote")
    np.minimum.at(sh.rmin, flat.ravel(), np.broadcast_to(lo_t, flat.shape).ravel())
    np.maximum.at(sh.rmax, flat.ravel(), np.broadcast_to(hi_t, flat.shape).ravel())
    assert out is not None
    out[mask] = sh.data[flat]
    return out

  # ***** values *****
  def value(self, u: Node) -> Fn:
    """What a value statement computes (its definition, not its name)."""
    op, dt = u.op, u.dtype
    if op is Ops.LOAD: return self.load(u)
    if op is Ops.DEFINE_ACC:
      ident = np.asarray(self.literal(u.src[0].arg, dt))
      if (w := u.arg.width) > 1: ident = np.full((1, w), ident)  # a vector the same in every thread
      return lambda s: ident
    if op is Ops.FOLD:
      if u.arg.across: raise CompileError(f"EMU: kernel {self.name}: no lane folds across vectors (the CPU's)")
      args, fn = [self.expr(x) for x in u.src], c_fn(u.arg.op, [x.dtype for x in u.src[:2]])
      def fold(s: _Run) -> Any:
        ret = args[0](s)
        for a in args[1:]: ret = fn(ret, a(s))
        return convert(ret, reg(dt))
      return fold
    if op in ALU:
      width, args, dts = u.arg.width, [self.expr(x) for x in u.src], [x.dtype for x in u.src]
      widths = [self.width(x) for x in u.src]
      half = dt.is_half and R.types[dt] == "float" and op is not Ops.CAST  # each result rounded to its 16-bit type, as the source does
      to, compute = reg(dt), None if op in (Ops.CAST, Ops.BITCAST) else c_fn(op, dts)
      def alu(s: _Run) -> Any:
        vals = [a(s) for a in args]
        if width > 1: vals = [v if w > 1 else lanewise(v) for v, w in zip(vals, widths)]
        if op is Ops.CAST: return cast(vals[0], dt) if width == 1 else vals[0]
        if op is Ops.BITCAST: return bitcast(vals[0], dts[0], dt)
        assert compute is not None
        ret = convert(compute(*vals), to)
        return round_half(ret, dt) if half else ret
      return alu
    return self.inline(u)

  def width(self, u: Node) -> int:
    if named(u) or u.op is Ops.LOAD: return u.arg.width
    return len(u.src) if u.op is Ops.VECTORIZE else 1

  def literal(self, v: Any, dt: DType) -> Any:
    """A constant as the source spells it: a 16-bit float constant is the value it rounds to."""
    if dt.is_half:
      with np.errstate(over="ignore"): return np.float32(float(dt.np(float(v))))
    return np.asarray(v).astype(reg(dt))[()]

  def expr(self, u: Node) -> Fn:
    """A value where a statement uses it: by name where a statement defines it, else computed in place (compiled once per node)."""
    if (fn := self.exprs.get(id(u))) is None:
      if named(u):
        name = u.arg.name
        def fn(s: _Run) -> Any: return s.env[name]
      else: fn = self.inline(u)
      self.exprs[id(u)] = fn
    return fn

  def inline(self, u: Node) -> Fn:
    op = u.op
    if op is Ops.CONST:
      c = self.literal(u.arg, u.dtype)
      return lambda s: c
    if op is Ops.VAR:
      name = u.arg[0]
      return lambda s: s.env[name]
    if op is Ops.GEP:
      vec, lane = self.expr(u.src[0]), u.arg
      return lambda s: np.asarray(vec(s))[..., lane]
    if op is Ops.VECTORIZE:
      items, to = [self.expr(x) for x in u.src], reg(u.dtype)
      def vectorize(s: _Run) -> Any:
        vals = [np.asarray(i(s)) for i in items]
        shape = np.broadcast_shapes(*(v.shape for v in vals))
        return np.stack([np.broadcast_to(v, shape) for v in vals], axis=-1).astype(to).reshape(-1, len(vals))  # (1, width): all threads
      return vectorize
    if op is Ops.LOAD: return self.load(u)
    if op is Ops.CELL:
      access = self.cell_access(u)
      return lambda s: access(s, s.active)
    if op is Ops.INRANGE:
      x, n = self.expr(u.src[0]), u.src[1].arg
      return lambda s: (0 <= (v := x(s))) & (v < n)
    if op is Ops.DEFINE_VAR:
      ok, x = self.expr(u.src[0]), self.expr(u.src[1])
      return lambda s: np.where(ok(s), x(s), 0).astype(np.int32)
    if op in ALU:  # index math: C's int arithmetic (in 64 bits here; offsets past 32 bits are an error where used)
      args, dts, floor = [self.expr(x) for x in u.src], [x.dtype for x in u.src], u.floor
      if op is Ops.CAST: return lambda s: cast(args[0](s), u.dtype)
      if op is Ops.AND: return lambda s: np.logical_and(args[0](s), args[1](s))
      fn = c_fn(op, dts, floor, index=True)
      if len(args) == 2:
        a, b = args
        return lambda s: fn(a(s), b(s))
      return lambda s: fn(*(a(s) for a in args))
    raise CompileError(f"EMU: kernel {self.name}: no value {op.name}")


# ***** the device *****

class EMUDevice(Compiled):
  """A CUDA GPU of TINYTUNE_EMU_ARCH (sm_80 or sm_90), emulated in NumPy (see the module's docstring). Its timings are host seconds of
  an interpreter: never a GPU's speed (`emulated`)."""
  name = "EMU"
  emulated = compiles_apart = True  # the process that renders a kernel keeps its lowered program for compile: the pair runs apart as on CUDA

  def __init__(self) -> None:
    self.arch = os.getenv("TINYTUNE_EMU_ARCH") or "sm_90"
    self.caps = emu_caps(self.arch)
    self.renderer = EMURenderer()

  def alloc(self, size: int, dtype: DType) -> np.ndarray: return np.zeros(size, dtype.np)
  def retype(self, mem: np.ndarray, size: int, dtype: DType) -> np.ndarray: return mem.view(dtype.np)
  def copyin(self, mem: np.ndarray, data: np.ndarray) -> None: np.copyto(mem, data)
  def copyout(self, mem: np.ndarray, size: int, dtype: DType) -> np.ndarray: return mem.copy()

  def compile(self, src: str) -> bytes:
    """The lowered program of a source this device's renderer made (in this process), as bytes a program is made from anywhere."""
    if (p := self.renderer.lowered(src)) is None:
      raise CompileError("EMU runs the programs its own renderer lowered: render the kernel with Device['EMU'].renderer first")
    return dump(p)

  def program(self, name: str, lib: bytes, launch: tuple[int, int] = (1, 1)) -> Program:
    return EMUProgram(name, load(lib), launch, self.caps.shared_bytes)

  def fingerprint(self) -> dict[str, str]:
    return {"kind": "EMU", "name": f"EMU {self.arch} (emulated: times are not GPU speed)", "arch": self.arch, "compiler": "numpy",
            "compiler_version": f"numpy {np.__version__}", "flags": ""}

