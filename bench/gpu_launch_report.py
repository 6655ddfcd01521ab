"""What each kernel of a workload does on a big NVIDIA GPU, worked out from its lowered program with no GPU at hand.

  python bench/gpu_launch_report.py [conv2d reduce:axis=0 attention:seq=2048,causal=1 ...] [--schedule-device EMU] [--noopt]
      [--splitk N] [--raster B]

Each workload at its GPU sizes (`Workload.params({}, gpu=True)`; parameters after a colon override them) is scheduled on a
device with workgroups (EMU, which needs no driver; OPENCL or CUDA schedule the same kernels) and each kernel gets the default
opts for an H100/H200's caps. Per kernel: the launch (workgroups x threads per workgroup, the threads against the 132 SMs x 2048
a GPU holds at once, and the share of an SM's 2048 thread slots its workgroups can fill, at most 32 of them an SM and as many as its 228 KiB
of shared memory holds, before registers limit it), outputs and reduce-loop trips per thread, global loads per thread by buffer (count x
width), and for each global load or store how a warp's 32 neighbouring threads (threadIdx.x 0..31, every other index at 0) hit
memory: the share of the 32-byte sectors they touch that they use ("1.00": coalesced; "bcast": all read one value; below 0.25 is
a gather). Then the kernel's FLOPs, its least memory traffic (each buffer once), the sector bytes its global loads and stores
request (what L1 must serve; shared memory is not counted), and the times these give at 4.8 TB/s (H200 HBM3e), 60 TFLOPS (float32 FMA; a
TC kernel's 989, float16 tensor cores) and ~30 TB/s of L1 (132 SMs x 128 B x 1.755 GHz): the largest of them is the best that kernel can
do, and a measured time far above it names what to look at. For a kernel with a reduce, "wave MB": the input bytes that the workgroups at
work at once (a wave: as many as the SMs hold, by threads and by an estimate of registers, REGISTERS) read, each distinct tile of
an input once a wave (what the block raster order, RASTER, cuts), summed over the waves: where that is well above "min MB", the
inputs pass from memory to the 50 MB L2 more than once. Each workload's first row counts its kernels and the global loads of each
of its inputs per element over all of them (softmax 8192^2: 3 in three kernels, each reading the input from memory; 2 in one
kernel now, a workgroup a row, whose second load of a row of 32 KiB hits L1 or L2, the row's exps read back from shared memory).
--dtype makes the workloads' inputs of another float dtype (float16: TC's kernels). --splitk sets SPLITK for the schedule (0: no
split-K; N: every reduce that can be split, in N shares) and --raster B adds RASTER B to each kernel's opts along its first global axis
where that is valid. Estimates only: nothing here runs on a GPU."""
from __future__ import annotations

import argparse
import math
import operator
from typing import Any, Callable

from tinytune import Kernel, Tensor
from tinytune.codegen.caps import cuda_caps
from tinytune.codegen.cstyle import CUDARenderer
from tinytune.codegen.heuristic import default_opts
from tinytune.codegen.kernel import AxisKind
from tinytune.codegen.lower import LinearProgram, lower
from tinytune.codegen.opts import KernelOptError, Opt, OptOps
from tinytune.helpers import Context, prod
from tinytune.kernels import get_workload
from tinytune.kernels.workload import schedule
from tinytune.uop import Ops, UOp

# an H100/H200 as the CUDA device reports it (runtime/cuda.py), without opening one
GPU_CAPS = cuda_caps("sm_90")
SMS, THREADS_PER_SM, BLOCKS_PER_SM, HBM, FP32, L1 = 132, 2048, 32, 4.8e12, 60e12, 132 * 128 * 1.755e9
TENSOR = 989e12  # dense float16/bfloat16 FLOPS of an H100/H200's tensor cores: a TC kernel's compute bound
SHARED_PER_SM, SHARED_RESERVED = 228 << 10, 1 << 10  # an SM's shared memory, and what CUDA keeps of it for each workgroup
WARP, SECTOR = 32, 32
REGISTERS, REGISTER_FILE = 40, 65536  # registers a thread needs beyond one per output it holds (the 8x8 tile: 103 on sm_90); an SM's
WAVE_GROUPS = 1 << 16  # kernels with more workgroups than this get no "wave MB" (each workgroup's tiles are worked out in Python)
DEFAULT = ["conv2d", "reduce:axis=0", "reduce:axis=1", "softmax", "layernorm", "attention", "elementwise", "matmul"]

BINARY: dict[Ops, Callable[[Any, Any], Any]] = {
  Ops.ADD: operator.add, Ops.MUL: operator.mul, Ops.IDIV: operator.floordiv, Ops.MOD: operator.mod, Ops.CMPLT: operator.lt,
  Ops.CMPNE: operator.ne, Ops.MAX: max, Ops.AND: operator.and_, Ops.OR: operator.or_}


def evaluate(u: UOp, env: dict[str, int]) -> int | None:
  """An index expression's value with its variables set (those not in env at 0); None for an op this does not know."""
  if u.op is Ops.CONST: return u.arg
  if u.op is Ops.VAR: return env.get(u.arg[0], 0)
  vals = [evaluate(s, env) for s in u.src]
  if any(v is None for v in vals): return None
  if u.op in BINARY: return int(BINARY[u.op](vals[0], vals[1]))
  if u.op is Ops.WHERE: return vals[1] if vals[0] else vals[2]
  if u.op is Ops.NEG: return -vals[0]  # type: ignore[operator]
  if u.op is Ops.CAST: return vals[0]
  return None


def thread_env(uops: list[UOp], lid: int) -> dict[str, int]:
  """Each variable that a SPECIAL takes from the thread id, for thread `lid` of workgroup 0."""
  env = {"lid": lid}
  for u in uops:
    if u.op is Ops.SPECIAL and u.arg.id in ("lid", "local_id"):
      v = env.get(u.arg.id, lid) // u.arg.divisor
      env[u.arg.var] = v % u.arg.modulus if u.arg.modulus else v
  return env


def warp_access(addrs: list[int | None], nbytes: int, itemsize: int) -> tuple[int, str]:
  """A warp's access (each thread's element address, `nbytes` from it): the 32-byte sectors it touches, and the share of their
  bytes it uses ('bcast' where every thread reads one place, '?' where an address could not be worked out)."""
  if None in addrs: return 0, "?"
  used = {a * itemsize + b for a in addrs for b in range(nbytes)}  # type: ignore[operator]
  sectors = len({b // SECTOR for b in used})
  return sectors, "bcast" if len(set(addrs)) == 1 and len(addrs) > 1 else f"{len(used) / (sectors * SECTOR):.2f}"


def group_env(uops: list[UOp], gid: int) -> dict[str, int]:
  """Each variable that a SPECIAL takes from the workgroup id, for workgroup `gid` (RASTER's parts of a dim's index among them)."""
  env: dict[str, int] = {}
  for u in uops:
    if u.op is Ops.SPECIAL and u.arg.id == "group_id":
      v = gid // u.arg.divisor
      env[u.arg.var] = v % u.arg.modulus if u.arg.modulus else v
  return env


def wave_bytes(k: Kernel, prog: LinearProgram) -> float | None:
  """The input bytes the kernel's waves of workgroups read from memory (see the docstring's "wave MB"), from its lowered program
  `prog`; None for a kernel without a reduce or with over WAVE_GROUPS workgroups. A workgroup's tile of an input is told by where its
  first load of it reads with every loop and thread index at 0; the input's bytes are shared out evenly among its distinct tiles."""
  groups, threads = k.launch_dims
  if k.reduceop is None or groups > WAVE_GROUPS: return None
  loads = [u.src[1] if u.op is Ops.STORE and u.arg.cp_async else u for u in prog.uops]  # PIPELINE's cp.async: a load inside
  first = {u.arg.buf: u.src[0] for u in reversed(loads) if u.op is Ops.LOAD and isinstance(u.arg.buf, int)}
  per_sm = max(1, min(BLOCKS_PER_SM, THREADS_PER_SM // threads, REGISTER_FILE // (threads * (prod(a.size for a in k.axes if a.kind is AxisKind.UPCAST)
                                                                                             + REGISTERS))))
  wave = SMS * per_sm
  tiles = [{b: evaluate(idx, env) for b, idx in first.items()} for env in (group_env(prog.uops, g) for g in range(groups))]
  total = 0.0
  for b in first:
    every = len({t[b] for t in tiles})
    total += sum(len({t[b] for t in tiles[w:w + wave]}) for w in range(0, groups, wave)) / every * k.bufs[b - 1].nbytes
  return total


def accesses(k: Kernel, prog: LinearProgram) -> list[dict[str, Any]]:
  """Each global load and store of the kernel's lowered program `prog`: buffer, width, executions per thread, sectors per warp, warp use."""
  envs = [thread_env(prog.uops, t) for t in range(min(WARP, k.launch_dims[1]))]
  trips, ret = [1], []
  for u in prog.uops:
    if u.op is Ops.RANGE: trips.append(trips[-1] * max(u.arg.end - u.arg.start, 0))
    elif u.op is Ops.ENDRANGE: trips.pop()
    elif u.op is Ops.STORE and u.arg.cp_async: u = u.src[1]  # PIPELINE's cp.async: a global load to shared memory, in one
    if u.op in (Ops.LOAD, Ops.STORE) and isinstance(u.arg.buf, int):
      itemsize = (u.dtype if u.op is Ops.LOAD else u.src[1].dtype).itemsize
      sectors, use = warp_access([evaluate(u.src[0], env) for env in envs], u.arg.width * itemsize, itemsize)
      ret.append(dict(store=u.op is Ops.STORE, buf=u.arg.buf, width=u.arg.width, trips=trips[-1], sectors=sectors, use=use))
  return ret


def report(k: Kernel) -> dict[str, Any]:
  """The kernel's row of the table (see COLUMNS)."""
  groups, threads = k.launch_dims
  prog = lower(k, CUDARenderer())
  acc, loads, use = accesses(k, prog), dict[int, int](), dict[str, list[str]]()
  for a in acc:
    if not a["store"]: loads[a["buf"]] = loads.get(a["buf"], 0) + a["trips"] * a["width"]
    use.setdefault("out" if a["store"] else f"in{a['buf']}", []).append(a["use"])
  reads = {id(k.bufs[b - 1]): n * groups * threads / k.bufs[b - 1].size for b, n in loads.items()}  # passes over each input
  sector_bytes = sum(a["sectors"] * a["trips"] for a in acc) * SECTOR * groups * math.ceil(threads / WARP)
  tc = k.tc is not None or k.flash_tc  # TC on attention: its two products by mma.sync (lower.flash.flash_attention_tc)
  times = {"hbm": k.mem_bytes / HBM, "tc" if tc else "fp32": k.flops / (TENSOR if tc else FP32), "l1": sector_bytes / L1}
  def size(kind: AxisKind) -> int: return prod(a.size for a in k.axes if a.kind is kind)
  shared = sum(u.arg.size * u.dtype.itemsize for u in prog.uops if u.op is Ops.DEFINE_LOCAL)
  blocks = min(BLOCKS_PER_SM, SHARED_PER_SM // (shared + SHARED_RESERVED)) if shared else BLOCKS_PER_SM
  return dict(name=k.name, opts=" ".join(f"{o.op.name[:2]}{o.axis},{o.arg}" for o in k.opts), launch=f"{groups}x{threads}",
              fill=groups * threads / (SMS * THREADS_PER_SM), occupancy=min(THREADS_PER_SM, blocks * threads) / THREADS_PER_SM,
              outputs=size(AxisKind.UPCAST), trips=size(AxisKind.REDUCE), loads=" ".join(f"in{b}:{n}" for b, n in sorted(loads.items())),
              use=" ".join(f"{b}:{'/'.join(dict.fromkeys(v))}" for b, v in use.items()), gflop=k.flops / 1e9, mb=k.mem_bytes / 1e6,
              l1mb=sector_bytes / 1e6, best_us=max(times.values()) * 1e6, bound=max(times, key=lambda t: times[t]),
              wavemb="-" if (wave := wave_bytes(k, prog)) is None else f"{wave / 1e6:.1f}", reads=reads)


COLUMNS = [("kernel", "name", "{}"), ("opts", "opts", "{}"), ("launch", "launch", "{}"), ("threads/GPU", "fill", "{:.2f}"),
           ("SM use", "occupancy", "{:.2f}"), ("out/thread", "outputs", "{}"), ("trips", "trips", "{}"), ("loads/thread", "loads", "{}"),
           ("warp use", "use", "{}"), ("GFLOP", "gflop", "{:.3f}"), ("min MB", "mb", "{:.1f}"), ("L1 MB", "l1mb", "{:.1f}"),
           ("best us", "best_us", "{:.1f}"), ("bound", "bound", "{}"), ("wave MB", "wavemb", "{}")]


def parse(spec: str) -> tuple[str, dict[str, int]]:
  name, _, rest = spec.partition(":")
  return name, {k: int(v) for k, v in (kv.split("=") for kv in rest.split(",") if kv)}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("workloads", nargs="*", default=DEFAULT, help="name or name:param=value,... (the GPU sizes otherwise)")
  ap.add_argument("--schedule-device", default="EMU", help="a device with workgroups to schedule on (only the inputs are made there)")
  ap.add_argument("--noopt", action="store_true", help="the kernels with no opts")
  ap.add_argument("--splitk", type=int, default=-1, help="SPLITK for the schedule: 0 no split-K, N > 1 every reduce that can be in N shares")
  ap.add_argument("--raster", type=int, default=0, help="RASTER B after the default opts, along each kernel's first global axis, where valid")
  ap.add_argument("--dtype", default="float32", help="the float dtype of the workloads' float inputs (default float32)")
  args = ap.parse_args()
  print("| " + " | ".join(c for c, _, _ in COLUMNS) + " |")
  print("|" + " --- |" * len(COLUMNS))
  for spec in args.workloads:
    name, over = parse(spec)
    w = get_workload(name)
    params = {**w.params({}, gpu=True), **{k: v for k, v in w.params(over).items() if k in over}}
    # a buffer each, holding nothing of interest (equal constants would be one buffer: Q, K and V of attention the same)
    try: dtype = w.dtype(args.dtype)
    except ValueError as e: ap.error(str(e))
    ins = [Tensor.full(shape, i + 1.0, device=args.schedule_device, dtype=dtype).contiguous().realize() for i, shape in enumerate(w.inputs(params))]
    built = w.build(params, *ins)
    with Context(SPLITK=args.splitk): items, _ = schedule(built, args.schedule_device)
    rows = []
    for item in items:
      k = Kernel(item.ast, GPU_CAPS)
      if not args.noopt: k.apply_opts(default_opts(k))
      if args.raster:
        try: k.apply_opt(Opt(OptOps.RASTER, k.global_order[0], args.raster))
        except KernelOptError: pass
      rows.append(report(k))
    made = {id(item.out) for item in items}
    inputs = list(dict.fromkeys(id(u.arg) for item in items for u in item.ast.toposort if u.op is Ops.BUFFER and id(u.arg) not in made))
    passes = " ".join(f"input{i}:{sum(r['reads'].get(b, 0) for r in rows):.2f}" for i, b in enumerate(inputs))
    label = f"**{name}** {dtype.name} " + " ".join(f"{k}={v}" for k, v in params.items())
    label += f" ({len(items)} kernels; reads per input element {passes})"
    print(f"| {label} |" + " |" * (len(COLUMNS) - 1))
    for row in rows: print("| " + " | ".join(fmt.format(row[key]) for _, key, fmt in COLUMNS) + " |", flush=True)


if __name__ == "__main__":
  main()
