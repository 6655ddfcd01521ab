"""The search spaces: the valid next opts of a kernel on its device (beam, random), and the parameters optuna picks amounts for."""
from __future__ import annotations

from tinytune.codegen.kernel import Kernel, KernelOptError, candidate_opts
from tinytune.codegen.opts import Opt, OptOps
from tinytune.dtype import dtypes
from tinytune.helpers import prod

SEARCH_AMOUNTS = (2, 3, 4, 5, 6, 7, 8, 16, 32)  # register splits worth compiling; larger ones only bloat the code
LANES_AMOUNTS = (2, 4, 8, 16, 32, 64, 128)  # partial accumulators: whole vectors of 4, 8 or 16 lanes, up to 4 or 8 of them
STREAM_SEARCH_MIN = 1 << 20  # bytes of output from which the search tries STREAM
KBLOCK_SEARCH_MIN = 64  # the search tries K blocks down to half the default's shortest (heuristic.KBLOCK_MIN): shorter ones reload the sums too often


def actions(kernel: Kernel) -> list[Opt]:
  """Every opt that applies to `kernel` as it stands (opts already applied included), each kind of move (op and axis) before a
  second amount of any: a round of BEAM that the deadline cuts short (a big kernel's) has tried a little of everything."""
  ret: list[tuple[int, Opt]] = []
  nth: dict[tuple[OptOps, int], int] = {}  # how many amounts of this op on this axis are in already
  for opt in candidate_opts(kernel):
    if opt.op in (OptOps.UPCAST, OptOps.UNROLL) and opt.arg not in SEARCH_AMOUNTS: continue
    if opt.op is OptOps.LANES and opt.arg not in LANES_AMOUNTS or opt.op is OptOps.KBLOCK and opt.arg < KBLOCK_SEARCH_MIN: continue
    # a pad only adds work to an axis that splits into vectors already (a third of attention's candidates padded 1024 or 1 to 1026 or 2)
    if opt.op is OptOps.PADTO and (kernel.sizes[opt.axis] % 4 == 0 or kernel.sizes[opt.axis] == 1): continue
    # a small output stays in cache for whatever reads it next, and one that is not float32 has no whole-line vector stores
    if opt.op is OptOps.STREAM and (kernel.ast.dtype != dtypes.float32 or prod(kernel.out_shape) * 4 < STREAM_SEARCH_MIN): continue
    try: kernel.copy().apply_opt(opt)
    except KernelOptError: continue
    ret.append((nth.setdefault((opt.op, opt.axis), 0), opt))
    nth[opt.op, opt.axis] += 1
  return [opt for _, opt in sorted(ret, key=lambda t: t[0])]


Choice = int | str


def parameter_space(kernel: Kernel) -> dict[str, tuple[Choice, ...]]:
  """The optuna search's parameters, named for the opt they make, with the choices valid on `kernel` one at a time: per global
  axis an upcast amount, per reduce axis a K block length, a lanes and an unroll amount (1: none), the axis split across the
  cores, a pair of axes to swap ("off": none), whether the output goes past the caches and whether B is packed (PACK: "on" its
  panels, "block" its K blocks many panels wide).
  A parameter with one choice is left out. Choices can still break a joint limit (an upcast product too large, a thread count that
  no longer divides, a PACK with no panel to pack): applying the opts finds those before anything is compiled."""
  valid = actions(kernel)
  def amounts(op: OptOps, axis: int) -> tuple[int, ...]: return (1, *sorted({o.arg for o in valid if o.op is op and o.axis == axis}))
  space: dict[str, tuple[Choice, ...]] = {f"upcast{d}": amounts(OptOps.UPCAST, d) for d in range(kernel.n_global)}
  space.update({f"lanes{r}": amounts(OptOps.LANES, r) for r in range(kernel.n_reduce)})
  space.update({f"unroll{r}": amounts(OptOps.UNROLL, r) for r in range(kernel.n_reduce)})
  space.update({f"kblock{r}": amounts(OptOps.KBLOCK, r) for r in range(kernel.n_reduce)})
  space["thread"] = ("off", *sorted({o.axis for o in valid if o.op is OptOps.THREAD and o.arg == kernel.caps.threads}))
  big = [d for d in range(kernel.n_global) if kernel.sizes[d] > 1]  # a swap with an axis of size 1 changes nothing
  space["swap"] = ("off", *(f"{o.axis},{o.arg}" for o in valid if o.op is OptOps.SWAP and o.axis in big and o.arg in big))
  space["stream"] = ("off", *(["on"] if any(o.op is OptOps.STREAM for o in valid) else []))
  space["pack"] = ("off", *(["on", "block"] if any(o.op is OptOps.PACK for o in valid) else []))
  return {name: choices for name, choices in space.items() if len(choices) > 1}


def opts_from_params(kernel: Kernel, params: dict[str, Choice]) -> tuple[Opt, ...]:
  """The opts a point of parameter_space stands for (a parameter left out is off), not yet checked against the joint limits."""
  opts = [Opt(OptOps.UPCAST, d, int(params.get(f"upcast{d}", 1))) for d in reversed(range(kernel.n_global))]
  opts += [Opt(OptOps.KBLOCK, r, int(params.get(f"kblock{r}", 1))) for r in range(kernel.n_reduce)]  # the outer part: blocks of K
  opts += [Opt(OptOps.LANES, r, int(params.get(f"lanes{r}", 1))) for r in range(kernel.n_reduce)]  # the inner part: contiguous lanes
  opts += [Opt(OptOps.UNROLL, r, int(params.get(f"unroll{r}", 1))) for r in range(kernel.n_reduce)]
  if (axis := params.get("thread", "off")) != "off": opts.append(Opt(OptOps.THREAD, int(axis), kernel.caps.threads))
  if (pair := params.get("swap", "off")) != "off": opts.append(Opt(OptOps.SWAP, *map(int, str(pair).split(","))))
  if params.get("stream", "off") == "on": opts.append(Opt(OptOps.STREAM, 0, 0))
  if (pack := params.get("pack", "off")) != "off": opts.append(Opt(OptOps.PACK, 0, int(pack == "block")))  # last: it depends on the loop order
  return tuple(o for o in opts if o.op not in (OptOps.UPCAST, OptOps.LANES, OptOps.UNROLL, OptOps.KBLOCK) or o.arg > 1)
