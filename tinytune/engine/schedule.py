"""Cut a lazy graph into kernels.

Elementwise work and views are inlined into the kernel that consumes them. A kernel holds at most one reduce, with
its elementwise inputs before and its elementwise users after. A reduce becomes its own kernel's output (a buffer)
when it is read through an expanding or padding view or a gather, from inside another reduce, or beside a second reduce.
Elementwise work read through an expanding view becomes a kernel's output too where recomputing it at every place costs more
(see _computed_once): transcendental work a reduce reads (softmax's probabilities in softmax(x) @ v, computed as vectors once),
and the epilogue of a reduce nothing else reads (a matmul's bias and relu, computed in its kernel, not in the next matmul's)."""
from __future__ import annotations

from dataclasses import dataclass

from tinytune.helpers import prod
from tinytune.runtime import Buffer
from tinytune.shape import View
from tinytune.uop import Ops, Pat, Rules, UOp, graph_rewrite


@dataclass
class ScheduleItem:
  ast: UOp  # the value to compute; BUFFER leaves are its inputs
  out: Buffer  # filled contiguously with ast.shape
  node: UOp  # the graph node this kernel realizes
  view: UOp  # the VIEW of `out` that stands for `node` once the kernel has run


writes = [0]  # how many times a kernel wrote into a buffer that already held a value (Tensor.assign)


def realized(u: UOp) -> UOp | None:
  """The VIEW of a buffer that holds `u`'s value once a kernel computed it, so later schedules reuse it. It is kept on the node
  itself: it lives exactly as long as the node does. A write into memory in place ends every such reuse, since the node's
  inputs may be that memory (a training step's next forward pass is the same graph over the same, updated, parameters)."""
  if (ret := u.__dict__.get("realized_as")) is not None and ret[1] == writes[0]: return ret[0]
  return None


def mark_realized(u: UOp, view: UOp) -> None: u.__dict__["realized_as"] = (view, writes[0])


def buffer_view(buf: Buffer, shape: tuple[int, ...], view: View | None = None) -> UOp:
  return UOp(Ops.VIEW, buf.dtype, (UOp(Ops.BUFFER, buf.dtype, (), buf),), view or View.create(shape))


def is_buffer_view(u: UOp) -> bool: return u.op is Ops.VIEW and u.src[0].op is Ops.BUFFER


# a view of a contiguous view reads the same flat offsets as the inner view's source: one view, so the kernel indexes the buffer
# directly instead of splitting each offset into the inner shape's dims and joining them again (a realized input under a pad)
merge_views = Rules([(Pat(Ops.VIEW, (Pat(Ops.VIEW, name="inner"),), name="outer"),
                      lambda outer, inner: UOp(Ops.VIEW, outer.dtype, inner.src, outer.arg) if inner.arg.contiguous else None)])


TRANSCENDENTAL = (Ops.EXP2, Ops.LOG2, Ops.SIN)


def _computed_once(u: UOp, roots: set[UOp], users: dict[UOp, set[UOp]], in_reduce: bool) -> bool:
  """Whether elementwise work that a reduce reads expanded is better computed once, in a kernel of its own, than at every place the
  reduce reads it: where it computes an exp, log or sin (read inside a reduce), or where it is the epilogue of a reduce that nothing
  else reads (a matmul's bias and relu, read by the next matmul, go to the first matmul's kernel; inlined, the second recomputed
  them for each of its output columns; a mean's scale goes to its sum's kernel). A statistic read back over its rows stays."""
  stack, seen = [(u, False)], {(u, False)}
  while stack:
    x, broadcast = stack.pop()
    if x.op in TRANSCENDENTAL and in_reduce: return True
    if x.op is Ops.REDUCE:
      if not broadcast and users.get(x, set()) <= {y for y, _ in seen}: return True
      continue
    for s in x.src:
      if (s, b := broadcast or x.op is Ops.VIEW and x.arg.expands) not in seen and s not in roots and s.op not in (Ops.BUFFER, Ops.CONST):
        seen.add((s, b))
        stack.append((s, b))
  return False


def _kernel_reduces(root: UOp, roots: set[UOp], users: dict[UOp, set[UOp]]) -> set[UOp]:
  """Walk one kernel from its root; return the reduces (and the work a reduce reads expanded that is computed once, see
  _computed_once) that must become kernel boundaries."""
  found: dict[UOp, bool] = {}  # reduce -> may be inlined
  computed: set[UOp] = set()
  seen: set[tuple[UOp, bool, bool]] = set()
  stack = [(root, False, False)]
  while stack:
    u, expanded, in_reduce = stack.pop()
    if (u, expanded, in_reduce) in seen: continue
    seen.add((u, expanded, in_reduce))
    if u is not root and u in roots or u.op in (Ops.BUFFER, Ops.CONST): continue
    if u.op is Ops.REDUCE:
      found[u] = found.get(u, True) and not expanded and not in_reduce
      stack.append((u.src[0], False, True))
    elif u.op is Ops.VIEW:
      if u.arg.expands:
        src = u.src[0]
        while src.op is Ops.VIEW and not src.arg.expands and src not in roots: src = src.src[0]
        if src.op not in (Ops.BUFFER, Ops.CONST, Ops.REDUCE, Ops.VIEW, Ops.GATHER) and src not in roots and \
           _computed_once(src, roots, users, in_reduce):
          computed.add(src)
          continue
      stack.append((u.src[0], expanded or u.arg.expands, in_reduce))
    elif u.op is Ops.GATHER: stack += [(u.src[0], True, in_reduce), (u.src[1], expanded, in_reduce)]  # a reduce read at gathered places: a buffer
    else: stack.extend((s, expanded, in_reduce) for s in u.src)
  bad = {r for r, ok in found.items() if not ok}
  rest = sorted((r for r in found if r not in bad), key=lambda r: root.toposort.index(r))
  return bad | set(rest[:-1]) | computed  # keep the outermost reduce in this kernel


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
  while new := set().union(*(_kernel_reduces(root, roots, users) for root in roots)) - roots: roots |= new
  order = [u for u in target.toposort if u in roots]
  outputs: dict[UOp, UOp] = {}
  items = []
  for root in order:
    ast = graph_rewrite(root.substitute({r: outputs[r] for r in outputs}), merge_views)
    buf = into if into is not None and root is target else Buffer(device, prod(root.shape), root.dtype)
    outputs[root] = buffer_view(buf, root.shape)
    items.append(ScheduleItem(ast, buf, root, outputs[root]))
  return items, outputs[target]
