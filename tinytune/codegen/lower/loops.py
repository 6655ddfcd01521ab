"""The loops around a program's statements."""
from __future__ import annotations

from typing import Sequence

from tinytune.codegen.kernel import AxisKind, Kernel
from tinytune.codegen.lower.program import TRUE, Kind, LocalArg, LoopArg, SpecialArg, Val, stmt, when
from tinytune.dtype import dtypes
from tinytune.helpers import prod
from tinytune.uop import Ops, UOp

Copies = tuple[tuple[list[UOp], list[UOp]], ...]  # STAGE's copies to shared memory: (loads, stores) of a K tile, one or two (PREFETCH)


class LoopNest:
  """The loops around a program's statements: each loop axis's variable, and the statement lists placed in the CPU's loop nest or
  in a GPU's workgroups and threads."""
  def __init__(self, k: Kernel):
    self.k = k
    names = {AxisKind.GLOBAL: "g", AxisKind.REDUCE: "r", AxisKind.THREAD: "t", AxisKind.LOCAL: "l", AxisKind.GROUP: "q", AxisKind.KBLOCK: "k",
             AxisKind.STAGE: "s"}
    self.vars = {i: UOp.var(f"{names[a.kind]}{i}", 0, max(a.size - 1, 0)) if a.size != 1 else UOp.const(dtypes.int64, 0)
                 for i, a in enumerate(k.axes) if a.kind in names}
    if k.raster is not None:  # RASTER: the dim's workgroup index is its band's first plus the place in the band (see group_ids)
      i, band = k.axes.index(k.remaining(k.raster[0])), k.raster[1]
      self.band = (UOp.var(f"g{i}b", 0, k.axes[i].size // band - 1), UOp.var(f"g{i}w", 0, band - 1))
      self.vars[i] = self.band[0] * band + self.band[1]

  def nest(self, axes: list[int], body: list[UOp], start: int = 0, end: int = -1, parallel: bool = False) -> list[UOp]:
    """The loops of `axes` (outermost first; a size-1 axis has none, a size-0 one runs no times) around `body`; `start` and `end`
    bound the outermost loop."""
    opened = []
    for n, i in enumerate(axes):
      if self.k.axes[i].size == 1: continue
      first, last = (start, end if end >= 0 else self.k.axes[i].size) if n == 0 else (0, self.k.axes[i].size)
      opened.append(stmt(Ops.RANGE, arg=LoopArg(self.vars[i].arg[0], first, last, parallel and n == 0)))
    return [*opened, *body, *(stmt(Ops.ENDRANGE) for _ in opened)]

  def cpu(self, bodies: list[list[UOp]], full_bodies: list[list[UOp]], split: int | None, combine: list[list[UOp]], decls: list[UOp],
          post: list[UOp], packs: dict[int, list[UOp]] | None = None, flags: tuple[list[UOp], list[UOp]] = ([], [])) -> list[UOp]:
    """The CPU's loop nest: THREAD parts across cores, then K blocks (inside the threads, which own their outputs), then the global
    loops, each output's accumulators, the reduce loops, the LANES combine and what follows the reduce. A row's statistic (see
    Kernel.reduce_out_dims) is reduced inside the loops of the dims it changes along only, once per row, before the row's loops; a
    chain of them (softmax's max, then its sum), one reduce loop after another. PACK's copies (`packs`, by the number of loops
    around them) go first inside their loops; `flags`' registers (Lowerer.flag_registers) are declared first in a thread's share and
    stored last in it."""
    k = self.k
    outer, t, n = k.cpu_loops()
    red, reduce = [i for i, a in enumerate(k.axes) if a.kind is AxisKind.REDUCE], []
    for stage, body in enumerate(bodies):
      if split is None: reduce += self.nest(red, body)
      else:  # the loop of the padded dim twice: its whole iterations with the body that has no masks, then the rest
        j, cut = red.index(split), k.padded[k.axes[split].dim] // k.axes[split].stride
        reduce += self.nest(red[:j], self.nest(red[j:], full_bodies[stage], 0, cut) + self.nest(red[j:], body, cut))
      reduce += combine[stage]
    # the thread's streaming stores, visible before the kernel ends: a fence last in its share
    fence = [stmt(Ops.BARRIER, arg="stores")] if any(u.op is Ops.STORE and u.arg.stream for u in post) else []
    body, end = decls + reduce + self.nest(outer[n:], post), n
    for at, copies in sorted((packs or {}).items(), reverse=True): body, end = copies + self.nest(outer[at:end], body), at
    return self.nest(outer[:t], flags[0] + self.nest(outer[t:end], body) + fence + flags[1], parallel=True)

  def staged(self, copies: Copies, body: list[UOp], landed: Sequence[UOp] = ()) -> list[UOp]:
    """STAGE's loop of K tiles around `body` (the loops in a tile): each iteration copies the tiles to shared memory (`copies`:
    loads and stores) between two barriers, the copy waiting until every thread is done reading the last tile, the reads until
    the copy is whole. With PREFETCH (two copies: the first tile's and the next's) the first tile is copied before the loop, and
    each iteration loads the next into registers before the compute and stores it after (the loads' latency behind the compute).
    With PIPELINE (S stages: S-1 copies before the loop, one in it) the copies are cp.async groups into a ring of S buffers: the first
    S-1 tiles' before the loop (a group each, empty past the last tile), and each iteration waits for its tile's group (all but the
    newest S-2), meets the others at one barrier (after which every thread is done reading the buffer of the tile before, which the
    copy of the tile S-1 ahead then fills) and issues that copy as a group before computing; `landed` follows the wait (wgmma's proxy
    fence: the tile's copies, landed, seen by its reads)."""
    tiles = next(i for i, a in enumerate(self.k.axes) if a.kind is AxisKind.STAGE)
    (loads, stores), barrier = copies[0], stmt(Ops.BARRIER)
    if (stages := self.k.stages) > 1:
      commit, (ahead_loads, ahead_stores) = stmt(Ops.BARRIER, arg="commit_group"), copies[-1]
      first = [u for ld, st in copies[:-1] for u in (*ld, *st, stmt(Ops.BARRIER, arg="commit_group"))]
      return first + self.nest([tiles], [stmt(Ops.BARRIER, arg=("wait_group", stages - 2)), *landed, barrier, *ahead_loads, *ahead_stores, commit,
                                         *body])
    if len(copies) == 1: return self.nest([tiles], [*loads, *stores, barrier, *body, stmt(Ops.BARRIER)])
    (next_loads, next_stores) = copies[1]
    return [*loads, *stores, barrier, *self.nest([tiles], [*next_loads, *body, stmt(Ops.BARRIER), *next_stores, stmt(Ops.BARRIER)])]

  def unflatten(self, axes: list[int], linear: str, mult: int = 1, outer: bool = False) -> list[UOp]:
    """Each axis's index from one linear id (over `mult`), the last axis fastest (`outer`: more come before the first)."""
    out = []
    for n, i in enumerate(reversed(axes)):
      size = self.k.axes[i].size
      if size > 1:
        out.append(stmt(Ops.SPECIAL, arg=SpecialArg(self.vars[i].arg[0], linear, mult, 0 if n == len(axes) - 1 and not outer else size)))
      mult *= size
    return out

  def group_ids(self) -> list[UOp]:
    """Each global axis's workgroup index from the workgroup id, in the global order, the last fastest. With RASTER (a dim, bands of
    b workgroups along it) that dim and the next one in the order, c, go in bands: consecutive ids walk down the b workgroups of a
    band in one column of c, then the next column, then the next band, so the workgroups at work together share their rows of one
    input and their columns of the other (in L2) where row after row would read every column of the other input."""
    k = self.k
    axes = [k.axes.index(k.remaining(d)) for d in k.global_order if d not in k.row_dims]  # a row's dims loop (see workgroups)
    if k.raster is None: return self.unflatten(axes, "group_id")
    d = axes.index(k.axes.index(k.remaining(k.raster[0])))
    (rows, cols), band, col, (first, place) = (k.axes[i].size for i in axes[d:d + 2]), k.raster[1], self.vars[axes[d + 1]], self.band
    out, mult = self.unflatten(axes[d + 2:], "group_id", outer=True), prod(k.axes[i].size for i in axes[d + 2:])
    if cols > 1: out.append(stmt(Ops.SPECIAL, arg=SpecialArg(col.arg[0], "group_id", mult * band, cols)))
    out.append(stmt(Ops.SPECIAL, arg=SpecialArg(place.arg[0], "group_id", mult, band)))
    out.append(stmt(Ops.SPECIAL, arg=SpecialArg(first.arg[0], "group_id", mult * band * cols, 0 if d == 0 else rows // band)))
    return out + self.unflatten(axes[:d], "group_id", mult * rows * cols)

  def workgroups(self, bodies: list[list[UOp]], combine: list[list[UOp]], decls: list[UOp], accs: list[tuple[UOp, tuple[UOp, ...], Val]],
                 width: int, post: list[UOp], copies: Copies) -> list[UOp]:
    """The global loops become workgroups and the LOCAL and GROUP parts their threads (in Kernel.thread_axes order), each index
    taken apart from one linear id. Each GROUP thread reduces its share into shared memory, and the group adds them (group_sum);
    its first thread stores. A row written after its statistic (Kernel.row_dims, softmax's) or a chain of statistics: every thread
    takes each total, then the row's loops run in every thread, each over its share of the row (its LOCAL parts). With STAGE, the K
    tiles' loop (see staged)."""
    k = self.k
    out = self.group_ids()
    threads = k.thread_axes
    if threads: out.append(stmt(Ops.SPECIAL, arg=SpecialArg("lid", "local_id", 1, 0)))
    out += self.unflatten(threads, "lid") + self.unflatten(k.row_thread_axes, "lid", outer=True)
    red = [i for i, a in enumerate(k.axes) if a.kind is AxisKind.REDUCE]
    groups = k.sizes_of(AxisKind.GROUP)
    every = groups > 1 and (len(k.reduceops) > 1 or bool(k.row_dims))  # every thread needs each total
    def partials(stage: int | None) -> list[tuple[UOp, UOp]]:
      return [(r, u) for r, _, acc in accs if stage is None or k.reduceops.index(r) == stage
              for u in (acc.lane(i) for i in range(width if acc.kind is not Kind.SCALAR else 1))]
    if groups > 1:
      most = max(len(partials(s)) for s in range(len(bodies))) if every else len(partials(None))
      dt = max((r.dtype for r in k.reduceops), key=lambda d: d.itemsize)
      decls = [*decls, stmt(Ops.DEFINE_LOCAL, arg=LocalArg("partials", most * k.launch_dims[1]), dtype=dt)]
      if every:  # the thread's group's first thread (group_sum): lid less its place in the group
        step = self.group_step()
        decls.append(stmt(Ops.SPECIAL, arg=SpecialArg("q0", "lid", groups, 0) if step == 1 else SpecialArg("q0", "lid", 1, step)))
    if copies: out += decls + self.staged(copies, self.nest(red, bodies[0])) + combine[0]  # one reduce (Kernel.stage_inputs)
    else:
      out += decls
      for stage, body in enumerate(bodies): out += self.nest(red, body) + combine[stage] + (self.group_sum(partials(stage), True) if every else [])
    if groups > 1 and not every: out += self.group_sum(partials(None), False)
    row = self.nest([k.axes.index(k.remaining(d)) for d in k.global_order if d in k.row_dims], post)
    if not every or (shared := prod(k.axes[i].size for i in k.row_thread_axes)) == groups: return out + row
    # fewer threads share the row than the group has (Kernel.apply_opt: they are its fastest): the others have nothing to write
    place = UOp.var("lid", 0, k.launch_dims[1] - 1) % groups
    return out + when(place.lt(shared), row)

  def group_step(self) -> int:
    """lid's step between a thread's GROUP neighbours: 1 where the GROUP parts are the fastest threads (Kernel.thread_axes)."""
    k = self.k
    return 1 if k.axes[k.thread_axes[-1]].kind is AxisKind.GROUP else k.launch_dims[1] // k.sizes_of(AxisKind.GROUP)

  def group_sum(self, partials: list[tuple[UOp, UOp]], every: bool) -> list[UOp]:
    """The GROUP threads' partials (reduce, accumulator) added up: each thread's into shared memory, then a group of a power of two
    adds them in a tree (half the threads each level, a barrier between levels: log2 steps, where one thread adding 255 partials one
    by one took thousands of cycles while the workgroup's other threads waited), any other group's first thread one by one. Then
    only the first thread goes on, or (`every`) each thread reads its group's total from the first's place, behind a barrier, and
    a barrier after it frees the partials for the next reduce."""
    k = self.k
    n, groups = k.launch_dims[1], k.sizes_of(AxisKind.GROUP)
    step = self.group_step()
    dt, lid = max((r.dtype for r in k.reduceops), key=lambda d: d.itemsize), UOp.var("lid", 0, n - 1)  # as workgroups declares them
    def cell(j: int, at: str) -> UOp: return UOp(Ops.CELL, dt, (), ("partials", f"{j * n}+{at}"))
    out = [stmt(Ops.ASSIGN, cell(j, "lid"), u, TRUE) for j, (_, u) in enumerate(partials)]
    place = lid % groups if step == 1 else lid // step  # the thread's place in its group: the first adds up the partials
    first, no = place.alu(Ops.CMPNE, UOp.const(dtypes.int64, 0)), UOp.const(dtypes.bool, False)
    out.append(stmt(Ops.BARRIER))
    if groups & (groups - 1):  # the first thread adds the others' partials one by one
      out.append(stmt(Ops.IF, place.lt(1).alu(Ops.CMPNE, no)) if every else stmt(Ops.EXIT, first))
      out.append(stmt(Ops.RANGE, arg=LoopArg("q", 1, groups, False)))
      at = "lid+q" if step == 1 else f"lid+q*{step}"
      out += [stmt(Ops.ASSIGN, u, cell(j, at), TRUE, arg=red.arg[0]) for j, (red, u) in enumerate(partials)]
      out.append(stmt(Ops.ENDRANGE))
      if not every: return out
      out += [*(stmt(Ops.ASSIGN, cell(j, "lid"), u, TRUE) for j, (_, u) in enumerate(partials)), stmt(Ops.ENDIF)]
    else:
      half = groups // 2
      while half:  # a power of two: the lower half adds the upper half's partials, then a barrier, until one is left
        out.append(stmt(Ops.IF, place.lt(half).alu(Ops.CMPNE, no)))
        out += [stmt(Ops.ASSIGN, u, cell(j, f"lid+{half * step}"), TRUE, arg=red.arg[0]) for j, (red, u) in enumerate(partials)]
        if half > 1 or every: out += [stmt(Ops.ASSIGN, cell(j, "lid"), u, TRUE) for j, (_, u) in enumerate(partials)]
        out.append(stmt(Ops.ENDIF))
        if half > 1: out.append(stmt(Ops.BARRIER))
        half //= 2
      if not every: return [*out, stmt(Ops.EXIT, first)]
    # every thread: its group's first thread is at lid - place
    at = f"q0*{groups}" if step == 1 else "q0"  # see workgroups
    return [*out, stmt(Ops.BARRIER), *(stmt(Ops.ASSIGN, u, cell(j, at), TRUE) for j, (_, u) in enumerate(partials)), stmt(Ops.BARRIER)]
