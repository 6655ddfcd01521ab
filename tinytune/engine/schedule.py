"""Cut a lazy graph into kernels.

Elementwise work and views are inlined into the kernel that consumes them. A kernel holds at most one reduce, with
its elementwise inputs before and its elementwise users after. A reduce becomes its own kernel's output (a buffer)
when it is read through an expanding or padding view or a gather, from inside another reduce, or beside a second reduce; the
elementwise work after it that nothing else reads goes with it (see _epilogue).
Elementwise work read through an expanding view becomes a kernel's output too where recomputing it at every place costs more
(see _computed_once): transcendental work a reduce reads (softmax's probabilities in softmax(x) @ v, computed as vectors once),
and the epilogue of a reduce nothing else reads (a matmul's bias and relu, computed in its kernel, not in the next matmul's).
Attention in one kernel (Ops.ATTENTION) is a kernel of its own whose queries, keys and values are buffers (or views of them)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tinytune.codegen.heuristic import gpu_split_k
from tinytune.codegen.kernel import Kernel, dims_read, same_rows
from tinytune.helpers import prod
from tinytune.runtime import Buffer, Device
from tinytune.shape import View
from tinytune.uop import ALU, BUFFER, CONST, TRANSCENDENTAL, VIEW, Ops, Pat, Rules, UOp, graph_rewrite


@dataclass
class ScheduleItem:
  ast: UOp  # the value to compute; BUFFER leaves are its inputs
  out: Buffer  # filled contiguously with ast.shape
  node: UOp  # the graph node this kernel realizes
  view: UOp  # the VIEW of `out` that stands for `node` once the kernel has run


_writes = 0  # how many times a kernel wrote into a buffer that already held a value (Tensor.assign)


def realized(u: UOp) -> UOp | None:
  """The VIEW of a buffer that holds `u`'s value once a kernel computed it, so later schedules reuse it. It is kept on the node
  itself: it lives exactly as long as the node does. A write into memory in place ends every such reuse (forget_realized), since the
  node's inputs may be that memory (a training step's next forward pass is the same graph over the same, updated, parameters)."""
  if (ret := u.__dict__.get("realized_as")) is not None and ret[1] == _writes: return ret[0]
  return None


def mark_realized(u: UOp, view: UOp) -> None:
  """Where `u` is a constant (or a constant broadcast), nothing: a graph that reads it computes it again, fused, and the schedule
  cache, which keeps constants alive in its keys, pins no buffer through them."""
  if u.op is CONST or u.op is VIEW and u.src[0].op is CONST: return
  u.__dict__["realized_as"] = (view, _writes)


def forget_realized() -> None:
  """Every node realized so far is computed again where a later graph reads it: memory was written in place."""
  global _writes
  _writes += 1


def keep_rewrite(asked: UOp, rewrite: UOp) -> None:
  """Keep the graph a realize of `asked` ran (its nodes hold what the kernels realized) alive as long as `asked` lives: a later graph
  that reads them rebuilds them by hash-consing and finds them computed."""
  asked.__dict__["rewritten"] = rewrite


def buffer_view(buf: Buffer, shape: tuple[int, ...], view: View | None = None) -> UOp:
  return UOp(VIEW, buf.dtype, (UOp(BUFFER, buf.dtype, (), buf),), view or View.create(shape))


def is_buffer_view(u: UOp) -> bool: return u.op is VIEW and u.src[0].op is BUFFER


# a view of a contiguous view reads the same flat offsets as the inner view's source: one view, so the kernel indexes the buffer
# directly instead of splitting each offset into the inner shape's dims and joining them again (a realized input under a pad)
merge_views = Rules([(Pat(Ops.VIEW, (Pat(Ops.VIEW, name="inner"),), name="outer"),
                      lambda outer, inner: UOp(Ops.VIEW, outer.dtype, inner.src, outer.arg) if inner.arg.contiguous else None)])


def _computed_once(u: UOp, roots: set[UOp], users: dict[UOp, set[UOp]], in_reduce: UOp | None, row: Callable[[UOp], bool]) -> bool:
  """Whether elementwise work that a reduce reads expanded is better computed once, in a kernel of its own, than at every place the
  reduce reads it: where it computes an exp, log or sin (read inside a reduce), or where it is the epilogue of a reduce that nothing
  else reads (a matmul's bias and relu, read by the next matmul, go to the first matmul's kernel; inlined, the second recomputed
  them for each of its output columns; a mean's scale goes to its sum's kernel), unless that reduce stays in the kernel as a row
  statistic (`row`, see _row_statistics; inside a reduce, one of the same rows). A statistic read back over its rows stays."""
  stack, seen = [(u, False)], {(u, False)}
  while stack:
    x, broadcast = stack.pop()
    if x.op in TRANSCENDENTAL and in_reduce is not None: return True
    if x.op is Ops.REDUCE:
      stays = row(x) and (in_reduce is None or same_rows(x, in_reduce))
      if not broadcast and users.get(x, set()) <= {y for y, _ in seen} and not stays: return True
      continue
    for s in x.src:
      if (s, b := broadcast or x.op is Ops.VIEW and x.arg.expands) not in seen and s not in roots and s.op not in (Ops.BUFFER, Ops.CONST):
        seen.add((s, b))
        stack.append((s, b))
  return False


def _kernel_reduces(root: UOp, roots: set[UOp], users: dict[UOp, set[UOp]], row: Callable[[UOp], bool]) -> set[UOp]:
  """Walk one kernel from its root; return the reduces (and the work a reduce reads expanded that is computed once, see
  _computed_once) that must become kernel boundaries. A reduce read expanded stays where `row` says so (see _row_statistics), if
  the kernel has no other reduce."""
  found: dict[UOp, bool] = {}  # reduce -> may be inlined
  statistics: set[UOp] = set()  # the reduces read expanded
  computed: set[UOp] = set()
  seen: set[tuple[UOp, bool, UOp | None]] = set()
  stack: list[tuple[UOp, bool, UOp | None]] = [(root, False, None)]  # (node, read expanded, the reduce whose source it is in)
  while stack:
    u, expanded, in_reduce = stack.pop()
    if (u, expanded, in_reduce) in seen: continue
    seen.add((u, expanded, in_reduce))
    if u is not root and u in roots or u.op in (Ops.BUFFER, Ops.CONST): continue
    if u.op is Ops.ATTENTION:  # a kernel of its own, reading its queries, keys and values from memory
      if u is not root: computed.add(u)
      else: computed.update(x for x in (_unviewed(s) for s in u.src) if x.op not in (Ops.BUFFER, Ops.CONST) and x not in roots)
      continue
    if u.op is Ops.REDUCE:
      # inside another reduce, only a statistic of the same rows, read expanded: one loop of the chain before the other (see Kernel)
      found[u] = found.get(u, True) and (not expanded or row(u)) and (in_reduce is None or expanded and same_rows(u, in_reduce))
      if expanded: statistics.add(u)
      stack.append((u.src[0], False, u))
    elif u.op is Ops.VIEW:
      if u.arg.expands:
        src = u.src[0]
        while src.op is Ops.VIEW and not src.arg.expands and src not in roots: src = src.src[0]
        if src.op not in (Ops.BUFFER, Ops.CONST, Ops.REDUCE, Ops.VIEW, Ops.GATHER) and src not in roots and \
           _computed_once(src, roots, users, in_reduce, row):
          computed.add(src)
          continue
      stack.append((u.src[0], expanded or u.arg.expands, in_reduce))
    elif u.op is Ops.GATHER: stack += [(u.src[0], True, in_reduce), (u.src[1], expanded, in_reduce)]  # a reduce read at gathered places: a buffer
    else: stack.extend((s, expanded, in_reduce) for s in u.src)
  inside = set().union(*(c.toposort for c in computed))  # the kernel of work computed once decides about the reduces it reads
  found = {r: ok for r, ok in found.items() if r not in inside}
  bad = {r for r, ok in found.items() if not ok}
  # keep the outermost reduce in this kernel, one read at each output (a matmul) before a row statistic; a row statistic keeps the
  # statistics of its rows with it (a chain)
  rest = sorted((r for r in found if r not in bad), key=lambda r: (r not in statistics, root.toposort.index(r)))
  chain = {r for r in rest if r in statistics and same_rows(r, rest[-1])} if rest and rest[-1] in statistics else set(rest[-1:])
  return {_epilogue(r, roots, users) for r in bad | (set(rest) - chain)} | computed


def _unviewed(u: UOp) -> UOp:
  while u.op is Ops.VIEW: u = u.src[0]
  return u


def split_k(ast: UOp, shares: int, device: str) -> tuple[ScheduleItem, UOp]:
  """A kernel whose one reduce (over one axis) is split into `shares` (see heuristic.gpu_split_k): the first kernel reduces each
  share of the axis into a buffer of partial results, the shares outermost (each share's partials contiguous, so the second kernel
  reads them coalesced, down its columns), and the kernel `ast` becomes one that reduces the partials, in order, where it read the
  reduce. Returns the first kernel's item and the second's ast."""
  red = next(u for u in ast.toposort if u.op is Ops.REDUCE)
  src, (op, (axis,)) = red.src[0], red.arg
  shape = src.shape
  split = shape[:axis] + (shares, shape[axis] // shares) + shape[axis + 1:]
  order = (axis, *(d for d in range(len(split)) if d != axis))
  def move(v: View) -> View | None: return None if (r := v.reshape(split)) is None else r.permute(order)
  partial = UOp(Ops.REDUCE, red.dtype, (_moved(src, move),), (op, (axis + 1,)))
  kept = (shares, *shape[:axis], *shape[axis + 1:])
  buf = Buffer(device, prod(kept), red.dtype)
  item = ScheduleItem(graph_rewrite(UOp(Ops.VIEW, red.dtype, (partial,), View.create(partial.shape).reshape(kept)), merge_views), buf, partial,
                      buffer_view(buf, kept))
  summed = UOp(Ops.REDUCE, red.dtype, (buffer_view(buf, kept),), (op, (0,)))
  return item, graph_rewrite(ast.substitute({red: UOp(Ops.VIEW, red.dtype, (summed,), View.create(summed.shape).reshape(red.shape))}), merge_views)


def _moved(u: UOp, move: Callable[[View], View | None]) -> UOp:
  """u's value seen through a movement (`move` of a contiguous view of its shape), pushed through elementwise ops into the views it
  composes with, so that a kernel still reads its buffers straight from memory (the tiles and tensor cores look for that)."""
  memo: dict[UOp, UOp] = {}
  def walk(x: UOp) -> UOp:
    if x not in memo:
      if x.op is Ops.VIEW and (v := move(x.arg)) is not None: memo[x] = UOp(Ops.VIEW, x.dtype, x.src, v)
      elif x.op in ALU: memo[x] = UOp(x.op, x.dtype, tuple(s if s.op is Ops.CONST else walk(s) for s in x.src), x.arg)
      else: memo[x] = UOp(Ops.VIEW, x.dtype, (x,), move(View.create(x.shape)))
    return memo[x]
  return walk(u)


def _epilogue(red: UOp, roots: set[UOp], users: dict[UOp, set[UOp]]) -> UOp:
  """What a reduce that becomes a kernel's output hands on: the end of its elementwise epilogue that nothing else reads, up to a
  widening cast (attention's scores cast to bfloat16 and scaled go out as that, rounded once, in half the bytes; read by the
  next kernel as the sum, they were rounded again in each of its passes). Its other operands are constants and buffers."""
  x = ret = red
  while len(us := users.get(x, set())) == 1 and (y := next(iter(us))) not in roots:
    if y.op is Ops.VIEW and y.arg.contiguous and prod(y.shape) == prod(x.shape): x = y  # a reshape
    elif y.op in ALU and y.shape == x.shape and y.dtype.itemsize <= x.dtype.itemsize and \
         all(s is x or s.op is Ops.CONST or s.op is Ops.VIEW and s.src[0].op in (Ops.CONST, Ops.BUFFER) for s in y.src): x = ret = y
    else: break
  return ret



ROW_BYTES = 256 << 10  # a row statistic stays in the kernel that reads it back where one row of its inputs fits in L2


def _row_statistics(roots: set[UOp]) -> set[UOp]:
  """The reduces that a kernel reads expanded but that cannot stay in it: where it stays, the CPU computes it once per row (the
  loops it does not change along run after it, as a "reduce, then write the row" kernel: softmax's sum and layernorm's variance
  with their normalization, the row read again from cache). That needs the dims it changes along to be the kernel's leading ones,
  one row of its inputs to fit in cache, and no other kernel to read it (it would be computed twice)."""
  frozen, bad = frozenset(roots), set()
  regions = {root: _region(root, frozen) for root in roots}
  for root, region in regions.items():
    for red in (u for u in region if u.op is Ops.REDUCE and u is not root):
      dims = dims_read(root, red, frozen)
      row = prod(red.src[0].shape[a] for a in red.arg[1]) * sum(u.dtype.itemsize for u in red.src[0].toposort if u.op is Ops.VIEW)
      leading = dims | {d for d, s in enumerate(root.shape) if s == 1} >= set(range(max(dims, default=-1) + 1))  # size-1 dims anywhere
      if not leading or row > ROW_BYTES or any(red in r for o, r in regions.items() if o is not root): bad.add(red)
  return bad


def _region(root: UOp, roots: frozenset[UOp]) -> set[UOp]:
  """The nodes of root's kernel: what it reads, up to the other kernels' outputs."""
  seen, stack = {root}, [root]
  while stack:
    for s in stack.pop().src:
      if s not in seen and s not in roots: seen.add(s); stack.append(s)
  return seen


def create_schedule(target: UOp, device: str, into: Buffer | None = None) -> tuple[list[ScheduleItem], UOp]:
  """The kernels that compute `target`, in order, and the realized node that replaces it; the last kernel writes into `into`
  where one is given (a contiguous buffer of target's size)."""
  # a graph of constants is the same node on every device: reuse only what was realized on this one
  target = target.substitute({u: v for u in target.toposort if (v := realized(u)) is not None and v.src[0].arg.device == device})
  if into is None and is_buffer_view(target) and target.arg.contiguous and prod(target.shape) == target.src[0].arg.size: return [], target
  if into is not None and (is_buffer_view(target) or target.op is Ops.CONST): target = UOp(Ops.CONTIGUOUS, target.dtype, (target,))  # a copy
  roots: set[UOp] = {target} | {u for u in target.toposort if u.op is Ops.CONTIGUOUS}
  users: dict[UOp, set[UOp]] = {}
  for u in target.toposort:
    for s in u.src: users.setdefault(s, set()).add(u)
  # row statistics stay in their kernels (the CPU's loops, a GPU's workgroup per row: see Kernel.row_dims), but for those
  # _row_statistics refuses: the cut is made again without them
  outputs_only, refused = set(roots), set[UOp]()
  def row(u: UOp) -> bool: return u not in refused
  while True:
    roots = set(outputs_only)
    while new := set().union(*(_kernel_reduces(root, roots, users, row) for root in roots)) - roots: roots |= new
    if not (new := _row_statistics(roots) - refused): break
    refused |= new
  order = [u for u in target.toposort if u in roots]
  outputs: dict[UOp, UOp] = {}
  items = []
  for root in order:
    ast = graph_rewrite(root.substitute({r: outputs[r] for r in outputs}), merge_views)
    if Device[device].caps.has_local and (shares := gpu_split_k(Kernel(ast, Device[device].caps))) > 1:
      part, ast = split_k(ast, shares, device)
      items.append(part)
    buf = into if into is not None and root is target else Buffer(device, prod(root.shape), root.dtype)
    outputs[root] = buffer_view(buf, root.shape)
    items.append(ScheduleItem(ast, buf, root, outputs[root]))
  return items, outputs[target]
