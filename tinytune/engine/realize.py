"""Run a lazy graph: its schedule comes from a cache keyed by the graph's structure (buffers left out), so a graph built again
over other buffers runs its compiled kernels at once, with no scheduling, lowering or rendering."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from tinytune.dtype import DType, dtypes
from tinytune.engine import program, schedule
from tinytune.engine.program import CompiledKernel, GlobalCounters, compiled, kernels
from tinytune.engine.schedule import ScheduleItem, buffer_view, create_schedule, is_buffer_view, mark_realized, realized
from tinytune.helpers import DEBUG, NOOPT, SPLITK, prod, tune_mode
from tinytune.runtime import Buffer, Device
from tinytune.shape import View
from tinytune.uop import BUFFER, CONST, VIEW, Ops, UOp


def structure(target: UOp, device: str) -> tuple[list[UOp], tuple, list[Buffer], dict[UOp, int]] | None:
  """The graph's nodes in toposort's order; its structure, each buffer replaced by its place among the graph's buffers; those
  buffers; each node's position. None where a node of it was realized before on this device (see _reused). One walk, not toposort
  and then a pass over its nodes: every realize makes one."""
  index: dict[UOp, int] = {}
  topo: list[UOp] = []
  buffers: list[Buffer] = []
  parts: list[Any] = []
  stack: list[tuple[UOp | None, Iterator[UOp]]] = [(None, iter((target,)))]  # a root above target: target is walked as a source
  while True:
    u, srcs = stack[-1]
    for s in srcs:
      if s in index: continue
      if (op := s.op) is BUFFER:  # a leaf is taken at once, not pushed and popped (a step's graph is mostly leaves)
        if "realized_as" in s.__dict__ and (v := realized(s)) is not None and v is not s and v.src[0].arg.device == device: return None
        part: Any = (op, s.dtype, s.arg.size, s.arg.device)
        buffers.append(s.arg)
      # a constant and its broadcasts (never realized: schedule.mark_realized): the node itself, hash-consed by dtype, value (-0.0 apart
      # from 0.0) and view, and kept alive by the key, so the next step's graph finds it built
      elif op is CONST or op is VIEW and s.src[0].op is CONST: part = s
      else:
        stack.append((s, iter(s.src)))
        break
      index[s] = len(topo)
      topo.append(s)
      parts.append(part)
    else:
      if u is None: return topo, tuple(parts), buffers, index
      stack.pop()
      if "realized_as" in u.__dict__ and (v := realized(u)) is not None and v is not u and v.src[0].arg.device == device: return None
      index[u] = len(topo)
      topo.append(u)
      parts.append((u.op, u.dtype, u.arg, tuple(map(index.__getitem__, u.src))))


def _reused(topo: list[UOp], device: str) -> dict[UOp, UOp]:
  """What was realized before, on this device only (constants are one graph everywhere): the VIEW of the buffer that holds it."""
  return {u: v for u in topo if (v := realized(u)) is not None and v is not u and v.src[0].arg.device == device}


class Flag(Buffer):
  """The integers (one, or one a work-item: the renderer's flag_size) into which the kernels that compute a CHECK(x, flag) node (arg
  (lo, hi)) store an element of x outside [lo, hi): each holds lo until one does. `check` after those kernels ran raises error(that
  element), and takes the flag back to lo, so the next run of those kernels checks their values again."""
  def __init__(self, device: str, lo: int, error: Callable[[int], Exception], dtype: DType = dtypes.int64):
    dev = Device[device]
    super().__init__(device, dev.renderer.flag_size(dev.caps), dtype)
    self.lo, self.error = lo, error
    self.copyin(np.full(self.size, lo))

  def check(self) -> None:
    if (bad := (got := self.numpy_view()) != self.lo).any():
      v = int(got[bad][0])  # before the copy in: the CPU's view is the flag's memory
      self.copyin(np.full(self.size, self.lo))
      raise self.error(v)


@dataclass(frozen=True)
class Step:
  kernel: CompiledKernel
  slots: tuple[int, ...]  # the output's buffer, then the inputs', as places in the plan's buffer list


@dataclass(frozen=True)
class Plan:
  """A graph's schedule over numbered buffers: the graph's own buffers come first, then the ones the plan makes."""
  made: tuple[tuple[int, DType], ...]  # (size, dtype) of each buffer the kernels fill
  steps: tuple[Step, ...]
  roots: tuple[tuple[int, int, View], ...]  # (position in the graph, buffer, contiguous view) of each node a kernel realizes
  flags: tuple[int, ...] = ()  # the buffers that are CHECK nodes' flags, read once the kernels ran

  def run(self, topo: list[UOp], inputs: list[Buffer], device: str) -> UOp | None:
    """Run the kernels; the VIEW that holds the last node a kernel realizes (the graph's own, where no `into` took it)."""
    bufs = inputs.copy()
    for size, dtype in self.made: bufs.append(Buffer(device, size, dtype))
    for step in self.steps: run_kernel(step.kernel, list(map(bufs.__getitem__, step.slots)), device)
    for f in self.flags: bufs[f].check()  # type: ignore[attr-defined]  # before anything is taken as realized: a rerun checks again
    ret = None
    for pos, slot, view in self.roots: mark_realized(topo[pos], ret := buffer_view(bufs[slot], view.shape, view))
    return ret


def make_plan(target: UOp, inputs: list[Buffer], index: dict[UOp, int], device: str, into: Buffer | None) -> Plan:
  """`into`, where given, is the last of `inputs`: the buffer the last kernel writes."""
  items, _ = create_schedule(target, device, into)
  slot = {id(b): i for i, b in enumerate(inputs)}
  if into is not None: slot[id(into)] = len(inputs) - 1
  made = [item for item in items if item.out is not into]
  for i, item in enumerate(made): slot[id(item.out)] = len(inputs) + i
  run = [item for item in items if item.out.size]  # an empty output: nothing to compute
  steps = [Step(compiled(k, device), tuple(slot[id(b)] for b in (item.out, *k.bufs))) for item, (_, k) in zip(run, kernels(run, device))]
  return Plan(tuple((item.out.size, item.out.dtype) for item in made), tuple(steps),
              tuple((index[item.node], slot[id(item.out)], View.create(item.node.shape)) for item in made if item.node in index),
              tuple(dict.fromkeys(slot[id(u.src[1].arg)] for u in index if u.op is Ops.CHECK)))


_plans: dict[tuple, Plan] = {}
MAX_PLANS = 4096


def forget() -> None:
  """Consult the tuning cache again (a search or `cache import` in this process changed it); compiled programs stay."""
  program.opts_memo.clear()
  _plans.clear()


def realize(target: UOp, device: str, into: Buffer | None = None) -> UOp:
  """Compute `target` on `device`; the VIEW of a buffer that now holds it: `into` where given (it must not be read by target), else
  a new one or, where target is one already, the buffer it views."""
  asked = target
  # reuse what was realized; again while the new graph holds nodes that were realized before (hash-consing makes a substituted node
  # the very node an earlier realize computed)
  while (found := structure(target, device)) is None: target = target.substitute(_reused(target.toposort, device))
  if into is None and is_buffer_view(target) and target.arg.contiguous and prod(target.shape) == target.src[0].arg.size: return target
  topo, key, inputs, index = found
  alias = -1
  if into is not None:
    alias = next((i for i, b in enumerate(inputs) if b is into), -1)  # the write's memory may be one the graph reads too
    inputs.append(into)
  key = (key, into is not None, alias, device, NOOPT.value, tune_mode(), SPLITK.value)  # the opts policy (and split-K's) picks the plan's programs
  if (plan := _plans.get(key)) is None:
    GlobalCounters.schedule_misses += 1
    if len(_plans) >= MAX_PLANS: del _plans[next(iter(_plans))]  # a program of ever new shapes keeps the newest
    plan = _plans[key] = make_plan(target, inputs, index, device, into)
  else: GlobalCounters.schedule_hits += 1
  ret = plan.run(topo, inputs, device)
  if asked is not target: schedule.keep_rewrite(asked, target)
  if into is None:
    assert ret is not None, "a graph's last kernel realizes it"
    if asked is not target: mark_realized(asked, ret)  # the node that was asked for, and that other graphs hold, not only its rewrite
    return ret
  return buffer_view(into, target.shape)


Target = tuple[UOp, str, "Buffer | None"]  # (graph, device, the memory it is written into: a pending assign's, or None)


def realize_all(targets: list[Target]) -> list[UOp]:
  """Realize (graph, device, memory) targets together, in plan_order: each value is computed from memory as it was, and a target
  with memory (a pending assign) ends up in it."""
  def step(u: UOp, device: str, into: Buffer | None) -> UOp:
    ret = realize(u, device, into)
    if into is not None: mark_realized(u, ret)  # later writes' graphs read the new value, until forget_realized below
    return ret
  try: return plan_order(targets, lambda u: realized(u) is not None, step)
  finally:
    if any(memory is not None for _, _, memory in targets): schedule.forget_realized()  # what was realized before may have read that memory


def plan_order(targets: list[Target], computed: Callable[[UOp], bool], step: Callable[[UOp, str, Buffer | None], UOp]) -> list[UOp]:
  """The one order in which targets are computed together, by `step(graph, device, into)` (realize, or schedule without running):
  the reduces and copies they share first, each its own kernel, then each target. A write goes straight from the value's own kernel
  where nothing still to run reads that memory otherwise (an optimizer's moments, then the parameter that reads their new values);
  else the value goes to a new buffer first, and is copied in once everything else ran. Where anything is written, the index checks
  come first, each its own kernel over its index, so that a bad index raises before any write (a check fused into a kernel that
  writes memory would leave it half written). `computed` says what is realized already."""
  if any(memory is not None for _, _, memory in targets):
    for u, device in _index_checks(targets, computed):
      if not computed(u): step(u, device, None)
  for u in shared_reduces([u for u, _, _ in targets]): step(u, next(d for t, d, _ in targets if u in t.toposort), None)
  direct = _direct_writes(targets, computed)
  views: list[UOp | None] = [None if i in direct else step(u, device, None) for i, (u, device, _) in enumerate(targets)]
  for i in sorted(direct): views[i] = step(*targets[i])
  return [step(v, device, memory) if memory is not None and i not in direct else v  # type: ignore[misc, arg-type]
          for i, (v, (_, device, memory)) in enumerate(zip(views, targets))]


def _index_checks(targets: list[Target], computed: Callable[[UOp], bool]) -> list[tuple[UOp, str]]:
  """The CHECK nodes the targets compute (not past computed nodes), each with its target's device, sources first."""
  found: dict[UOp, str] = {}
  for root, device, _ in targets:
    seen, stack = set(), [root]
    while stack:
      if (u := stack.pop()) in seen or computed(u): continue
      seen.add(u)
      if u.op is Ops.CHECK: found.setdefault(u, device)
      stack.extend(u.src)
  return sorted(found.items(), key=lambda c: len(c[0].toposort))


def _direct_writes(targets: list[Target], computed: Callable[[UOp], bool]) -> set[int]:
  """The targets whose value may be written into their memory by its own kernel: that kernel reads the memory only where it
  writes (the same element, outside any reduce), and no target written after it reads the memory other than through its value."""
  direct = {i for i, (_, _, memory) in enumerate(targets) if memory is not None}
  while True:
    unsafe = {i for i in direct if not _reads_in_place(targets[i][0], targets[i][2], computed)}
    for j in direct:  # j's kernel reads the values written before it from their memory, and everything else as it is
      read = _buffers_read(targets[j][0], {targets[k][0] for k in direct if k < j}, computed)
      unsafe |= {i for i in direct if i < j and targets[i][2] in read}
    if not unsafe: return direct
    direct -= unsafe


def _buffers_read(root: UOp, stops: set[UOp], computed: Callable[[UOp], bool]) -> set[Buffer]:
  """The buffers root's graph reads, not looking past computed nodes or `stops`."""
  ret, seen, stack = set(), set(), [root]
  while stack:
    u = stack.pop()
    if u in seen or (u is not root and u in stops) or computed(u): continue
    seen.add(u)
    if u.op is Ops.BUFFER: ret.add(u.arg)
    stack.extend(u.src)
  return ret


def _reads_in_place(value: UOp, memory: Buffer | None, computed: Callable[[UOp], bool]) -> bool:
  whole = buffer_view(memory, value.shape)  # type: ignore[arg-type]
  seen, stack = set(), [(value, False)]
  while stack:
    u, elsewhere = stack.pop()  # elsewhere: read at other places than the one written (inside a reduce, or gathered)
    if (u, elsewhere) in seen or computed(u): continue
    seen.add((u, elsewhere))
    if u.op is Ops.BUFFER and u.arg is memory: return False  # reached through a view other than the whole one, or read elsewhere
    if u is whole and not elsewhere: continue
    stack.extend((s, elsewhere or u.op in (Ops.REDUCE, Ops.ATTENTION) or (u.op is Ops.GATHER and i == 0)) for i, s in enumerate(u.src))
  return True


def shared_reduces(targets: list[UOp]) -> list[UOp]:
  """The reduces and copies into memory (CONTIGUOUS) that more than one of the targets computes, sources first: realized once
  before the targets, they are read by each (a gradient that an optimizer's moment, second moment and parameter updates all use).
  A copy counts as a target of its own, so a reduce that only it reads stays in its kernel."""
  if len(targets) < 2: return []
  count: dict[UOp, int] = {}
  units, seen = list(targets), set(targets)
  while units:
    unit = units.pop()
    stack, visited = [unit], {unit}
    while stack:
      for s in stack.pop().src:
        if s in visited or realized(s) is not None: continue
        visited.add(s)
        if s.op in (Ops.REDUCE, Ops.CONTIGUOUS): count[s] = count.get(s, 0) + 1
        if s.op is Ops.CONTIGUOUS:
          if s not in seen: seen.add(s); units.append(s)
        else: stack.append(s)
  order: dict[UOp, int] = {}
  for t in targets:  # one order for all the targets' nodes, sources first
    for u in t.toposort: order.setdefault(u, len(order))
  return sorted((u for u, n in count.items() if n > 1), key=lambda u: order[u])


def schedule_many(targets: list[UOp], device: str, into: Sequence[Buffer | None] = ()) -> tuple[list[ScheduleItem], list[UOp]]:
  """The kernels realize_all runs for these targets together (see plan_order), in order, without running them, with each `into`
  given (a pending assign's memory, one per target or None); and the realized view of each target. What a kernel realizes is read
  as its buffer in later graphs, as realize does; for one target and no `into` this is create_schedule."""
  done: dict[UOp, UOp] = {}
  items: list[ScheduleItem] = []

  def schedule_one(asked: UOp, _: str, buf: Buffer | None) -> UOp:
    u = asked
    while reuse := {n: v for n in u.toposort if (v := done.get(n)) is not None and v is not n}: u = u.substitute(reuse)
    new, view = create_schedule(u, device, buf)
    items.extend(new)
    done.update({item.node: item.view for item in new})
    done[asked] = done[u] = view
    return view

  memories = [*into, *[None] * (len(targets) - len(into))]
  return items, plan_order([(t, device, m) for t, m in zip(targets, memories)], lambda u: u in done, schedule_one)


Captured = list[tuple[CompiledKernel, list[Buffer]]]
_captured: Captured | None = None


@contextlib.contextmanager
def capturing() -> Iterator[Captured]:
  """Record every kernel run inside the block, with its buffers (TinyJit replays them)."""
  global _captured
  _captured = captured = Captured()
  try: yield captured
  finally: _captured = None


def run_kernel(kernel: CompiledKernel, bufs: list[Buffer], device: str) -> None:
  debug = DEBUG.value
  seconds = kernel.program(*bufs, wait=debug >= 2)  # an asynchronous device's launch returns at once, with no time unless asked
  if _captured is not None: _captured.append((kernel, bufs))
  GlobalCounters.kernel_count += 1
  GlobalCounters.global_ops += kernel.flops
  GlobalCounters.global_mem += kernel.mem_bytes
  if seconds is None: return
  GlobalCounters.time_sum_s += seconds
  if debug >= 2:
    gflops, gbs = (kernel.flops / seconds / 1e9, kernel.mem_bytes / seconds / 1e9) if seconds else (0.0, 0.0)
    print(f"{GlobalCounters.kernel_count:4d} {kernel.name:30s} {device:5s} bufs {len(bufs):2d} mem {kernel.mem_bytes / 1e6:8.2f} MB "
          f"{seconds * 1e6:9.1f} us {gflops:8.2f} GFLOPS {gbs:7.2f} GB/s" + (" emulated: host time" if Device[device].emulated else "")
          + (f"  opts {list(kernel.opts)}" if DEBUG >= 3 else ""))
    if debug >= 4: print(kernel.src)
    if debug >= 5: print(kernel.ast_text)
