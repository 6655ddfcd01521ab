"""Generated sources before and after a code generator change: identical source is the best proof that a refactor kept behaviour.

  PYTHONPATH=<old tree> python bench/sources.py save sources.json [--sequences 8]   # with the code before the change
  PYTHONPATH=<new tree> python bench/sources.py check sources.json                  # after it: every difference, and a count

Every kernel of the opt fuzzer's cases and of the workload catalog (small sizes) is rendered with no opts, the default opts and
random valid opt lists (plus lists that start with TC or KBLOCK, which random picks rarely reach), on the C renderer with CPU caps
and on the OpenCL (with and without cl_khr_fp16), CUDA and HIP renderers with workgroup caps (and CUDA with CPU caps). Then the
features random lists seldom reach (features()), with the opt lists their tests use: attention in one kernel (C, and CUDA, HIP and
OpenCL in tiles), on tensor cores (CUDA sm_80 and sm_90), PIPELINE, wgmma, AMD's WMMA and MFMA, RASTER, gathers' index checks, and the
GPU heuristics' plans at the catalog's GPU sizes. `save` keeps each opt list with its source, so `check` renders exactly those lists
even where the opt rules changed in between. Run it from the repository root; the tests it takes its kernels from are those beside
the tinytune imported."""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import random
import sys
import zlib

import tinytune
from tinytune import Context, Kernel, KernelOptError, Opt, OptOps, Tensor, dtypes, nn
from tinytune.codegen.caps import amd_caps, cuda_caps
from tinytune.codegen.cstyle import CRenderer, CStyleRenderer, CUDARenderer, HIPRenderer, OpenCLRenderer
from tinytune.codegen.heuristic import default_opts
from tinytune.codegen.kernel import candidate_opts
from tinytune.codegen.opts import opts_from_json, opts_to_json
from tinytune.dtype import DType
from tinytune.engine.schedule import create_schedule
from tinytune.kernels import WORKLOADS, get_workload
from tinytune.kernels.workload import schedule
from tinytune.runtime import DeviceCaps
from tinytune.uop import Ops, UOp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(tinytune.__file__))), "tests"))  # the tests of that tree
import test_attention  # noqa: E402
import test_hip_tc  # noqa: E402
import test_pipeline  # noqa: E402
import test_raster  # noqa: E402
import test_wgmma  # noqa: E402
from test_kernels_catalog import SMALL  # noqa: E402
from test_opts import CAPS, CASES, WORKGROUP_CAPS, random_sequence, valid_opts  # noqa: E402

GPU_CAPS = dataclasses.replace(WORKGROUP_CAPS, tensor_cores=("float16", "bfloat16"))
TILE_CAPS, SM80, SM90 = test_attention.GPU_CAPS, cuda_caps("sm_80"), cuda_caps("sm_90")  # TILE_CAPS: 48 KiB of shared memory, 1024 threads
RENDERERS: dict[str, tuple[CStyleRenderer, DeviceCaps]] = {
  "c": (CRenderer(), CAPS), "opencl": (OpenCLRenderer(), GPU_CAPS), "opencl_nofp16": (OpenCLRenderer(fp16=False), GPU_CAPS),
  "cuda": (CUDARenderer(), GPU_CAPS), "hip": (HIPRenderer(), GPU_CAPS),
  "cuda_cpu_caps": (CUDARenderer(), CAPS),  # as bench/render.py renders CPU kernels: the renderer, not the caps, says workgroups
  # the features' kernels (features()): attention's tiles, PIPELINE, wgmma, AMD's matrix cores, RASTER, the GPU heuristics' plans
  "cuda_tiles": (CUDARenderer(), TILE_CAPS), "hip_tiles": (HIPRenderer(), TILE_CAPS), "opencl_tiles": (OpenCLRenderer(), TILE_CAPS),
  "cuda_sm80": (CUDARenderer(), SM80), "cuda_sm90": (CUDARenderer(), SM90),
  "hip_gfx1100": (HIPRenderer(), amd_caps("gfx1100")), "hip_gfx942": (HIPRenderer(), amd_caps("gfx942"))}
TILES = ("cuda_tiles", "hip_tiles", "opencl_tiles")
SPLIT_SIZES = {"matmul": [{"m": 16, "n": 1024, "k": 4096}, {"m": 8, "n": 64, "k": 1024}, {"m": 128, "n": 128, "k": 784}]}  # test_split_k's
Plans = dict[str, list[list[Opt]]]  # a renderer's name -> the opt lists it renders


def fuzzed() -> dict[str, UOp]:
  """The kernels fuzzed with random opt lists, by a stable id: the opt fuzzer's cases and the catalog's (small sizes)."""
  ret: dict[str, UOp] = {}
  Tensor.manual_seed(0)
  for name, case in CASES.items():
    for i, item in enumerate(create_schedule(case().uop, "CPU")[0]): ret[f"case/{name}/{i}"] = item.ast
  for name, sizes in SMALL.items():
    w = get_workload(name)
    for j, params in enumerate(sizes):
      for dt in (dtypes.float32, dtypes.float16) if name in ("matmul", "softmax", "reduce") else (dtypes.float32,):
        built, _ = w.instantiate(w.params(params), dt)
        for i, item in enumerate(schedule(built, "CPU")[0]): ret[f"workload/{name}/{j}/{dt.name}/{i}"] = item.ast
  return ret


def last_ast(out: Tensor, device: str) -> UOp: return create_schedule(out.uop, device)[0][-1].ast


def inputs(device: str, dt: DType, *shapes: tuple[int, ...]) -> list[Tensor]:
  return [Tensor.full(s, i + 1.0, dtype=dt, device=device).contiguous() for i, s in enumerate(shapes)]  # buffers of their own, never allocated


def matmul(device: str, dt: DType, m: int, k: int, n: int, ta: bool = False, tb: bool = False, batch: tuple[int, ...] = ()) -> tuple[str, UOp]:
  a, b = inputs(device, dt, (*batch, k, m) if ta else (*batch, m, k), (*batch, n, k) if tb else (*batch, k, n))
  name = f"{device}/matmul/{'x'.join(map(str, (*batch, m, k, n)))}/{dt.name}" + "/ta" * ta + "/tb" * tb
  return name, last_ast((a.transpose(-1, -2) if ta else a) @ (b.transpose(-1, -2) if tb else b), device)


def attention(device: str, dt: DType, q: tuple[int, ...], kv: tuple[int, ...], ev: int, causal: bool, mask: str = "") -> tuple[str, UOp]:
  """FLASH=2's one kernel: queries `q`, keys `kv`, values of `ev` dims, an optional mask of the scores ('bool' or 'float')."""
  tq, tk, tv = inputs(device, dt, q, kv, (*kv[:-1], ev))
  m = inputs(device, dtypes.bool if mask == "bool" else dt, (q[-2], kv[-2]))[0] if mask else None
  with Context(FLASH=2): out = tq.scaled_dot_product_attention(tk, tv, m, is_causal=causal)
  name = f"{device}/attention/{'x'.join(map(str, q))}/{'x'.join(map(str, kv))}/{ev}/{dt.name}" + "/causal" * causal + f"/{mask}" * bool(mask)
  return name, last_ast(out, device)


def features() -> dict[str, tuple[UOp, Plans]]:
  """The kernels of the features the fuzzer's random lists seldom or never reach, each with the opt lists and the renderers (by their
  caps) the tests exercise it with: attention in one kernel (CPU and GPU), in tiles (STAGE) and on tensor cores; PIPELINE's cp.async
  stages; wgmma (TC 2); AMD's WMMA and MFMA; RASTER; gathers' index checks (CHECK); the GPU heuristics' plans of the catalog at its GPU
  sizes (split K among them)."""
  ret: dict[str, tuple[UOp, Plans]] = {}
  def add(named: tuple[str, UOp], renderers: tuple[str, ...], *lists: list[Opt]) -> None:
    for name in renderers: ret.setdefault(named[0], (named[1], {}))[1].setdefault(name, []).extend(lists)
  def around(named: tuple[str, UOp], renderers: tuple[str, ...], *lists: list[Opt]) -> None:
    """`lists`, no opts, the defaults, each candidate opt alone and after the defaults (test_every_valid_opt's), for each renderer."""
    for name in renderers:
      k = Kernel(named[1], RENDERERS[name][1])
      tuned = k.copy().apply_opts(default_opts(k))
      add(named, (name,), [], tuned.opts, *lists, *([o] for o in candidate_opts(k)), *(tuned.opts + [o] for o in candidate_opts(tuned)))
  f16, bf16, f32 = dtypes.float16, dtypes.bfloat16, dtypes.float32
  tc, tiles = Opt(OptOps.TC, 0, 1), [Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.LOCAL, 2, 128)]
  for causal in (False, True):  # attention: in each thread's registers (attention.py) and in tiles (flash.py)
    around(attention("CPU", f32, (2, 2, 32, 16), (2, 2, 32, 16), 16, causal), ("c",))
    around(attention("EMU", f32, (2, 2, 32, 16), (2, 2, 32, 16), 16, causal), TILES, tiles)
    for dt in (f32, f16):
      for q, kv, ev in [((2, 3, 17, 8), (2, 3, 17, 8), 8), ((1, 2, 33, 16), (1, 2, 40, 16), 4), ((5, 12), (7, 12), 3)]:
        add(cpu := attention("CPU", dt, q, kv, ev, causal), ("c",), [], default_opts(Kernel(cpu[1], CAPS)))
        add(gpu := attention("EMU", dt, q, kv, ev, causal), TILES, [], tiles, default_opts(Kernel(gpu[1], TILE_CAPS)))
      for ev in (4, 8):
        add(attention("EMU", dt, (1, 2, 16, 8), (1, 2, 48, 8), ev, causal), TILES, *test_attention.TILES)
    for dt in (f32, f16, bf16):  # the catalog's GPU size
      named = attention("EMU", dt, (4, 16, 1024, 64), (4, 16, 1024, 64), 64, causal)
      add(named, TILES, default_opts(Kernel(named[1], TILE_CAPS)))
      add(named, ("cuda_sm90",), default_opts(Kernel(named[1], SM90)))
    for dt in (f16, bf16):  # on tensor cores
      add(attention("EMU", dt, (1, 2, 64, 32), (1, 2, 96, 32), 16, causal), ("cuda_sm80", "cuda_sm90"), [tc], [tc, Opt(OptOps.LOCAL, 2, 2)])
      add(attention("EMU", dt, (1, 2, 1024, 64), (1, 2, 1024, 64), 64, causal), ("cuda_sm90",), [tc, Opt(OptOps.LOCAL, 2, 4)])
  for mask in ("bool", "float"):
    around(attention("CPU", f32, (2, 3, 9, 8), (2, 3, 24, 8), 8, False, mask), ("c",))
    around(attention("EMU", f32, (2, 3, 9, 8), (2, 3, 24, 8), 8, False, mask), TILES)
  for i, (m, k, n, dt, tb, opts) in enumerate(test_pipeline.CASES):  # PIPELINE, its cp.async stages; the same tiles in one stage
    named = matmul("EMU", dt, m, k, n, tb=tb, batch=test_pipeline.BATCH.get(i, ()))
    add(named, ("cuda_sm80", "cuda_sm90"), opts, [o for o in opts if o.op is not OptOps.PIPELINE])
  for m, k, n, tb, opts in test_pipeline.SWIZZLED: add(matmul("EMU", f16, m, k, n, tb=tb), ("cuda_sm90",), opts)
  for dt in (f16, f32):  # the GPU defaults of a big matmul (PIPELINE since the H200 timed it)
    named = matmul("EMU", dt, 4096, 4096, 4096)
    for name in ("cuda_sm80", "cuda_sm90"): add(named, (name,), default_opts(Kernel(named[1], RENDERERS[name][1])))
  for dt in (f16, bf16):  # wgmma: TC's arg 2, with PIPELINE too, at test_wgmma's sizes and the GPU suite's
    wg = Opt(OptOps.TC, 0, 2)
    for ta, tb, m, n, k, opts in test_wgmma.WGMMA_CASES: add(matmul("EMU", dt, m, k, n, ta, tb), ("cuda_sm90",), [wg, *opts])
    for ta, tb, m, n, k, opts, _ in test_wgmma.PIPELINED: add(matmul("EMU", dt, m, k, n, ta, tb), ("cuda_sm90",), [wg, *opts])
    add(matmul("EMU", dt, 64, 32, 32, batch=(2,)), ("cuda_sm90",), [wg])
    add(matmul("EMU", dt, 64, 32, 16, batch=(4,)), ("cuda_sm90",), [wg, Opt(OptOps.UPCAST, 0, 2)])
    after = Kernel((named := matmul("EMU", dt, 128, 128, 64, tb=True))[1], SM90).apply_opts([wg])  # test_random_sequences_after_tc_wgmma's
    add(named, ("cuda_sm90",), *(random_sequence(after, random.Random(zlib.crc32(f"{named[0]}/{i}".encode()))) for i in range(6)))
    add(matmul("EMU", dt, 4096, 4096, 4096), ("cuda_sm90",), *([wg, Opt(OptOps.UPCAST, 1, 8), *more] for more in (
      [Opt(OptOps.PIPELINE, 0, 3)], [Opt(OptOps.PIPELINE, 0, 4)], [Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.PIPELINE, 0, 3)])))
  for ta, tb, k, dt, opts in test_hip_tc.CASES:  # AMD's matrix cores: RDNA3's WMMA, CDNA3's MFMA
    add(matmul("EMU", dt, 64, k, 48, ta, tb), ("hip_gfx1100", "hip_gfx942"), opts)
  raster = Opt(OptOps.RASTER, 0, 2)  # RASTER over test_raster's tiles, and the big tile in bands
  add(matmul("EMU", f32, 128, 32, 64), (*TILES, "cuda_sm90"), [*test_raster.LOCAL_TILE, Opt(OptOps.RASTER, 0, 4)])
  add(matmul("EMU", f32, 64, 16, 48, batch=(3,)), (*TILES, "cuda_sm90"), [Opt(OptOps.LOCAL, 2, 8), Opt(OptOps.LOCAL, 1, 8),
                                                                           Opt(OptOps.RASTER, 1, 2)])
  add(matmul("EMU", f32, 512, 32, 256), (*TILES, "cuda_sm90"), [*test_raster.STAGED_TILE, raster])
  add(matmul("EMU", f32, 4096, 256, 4096), ("cuda_sm90",), [*test_raster.STAGED_TILE, Opt(OptOps.RASTER, 0, 8)])
  A, X, emb = inputs("CPU", f32, (4096,), (300, 64)) + [nn.Embedding(1000, 64)]  # CHECK: indices checked in the kernel that reads them
  emb.weight = inputs("CPU", f32, (1000, 64))[0]  # a buffer, not its random start
  for name, gather, shape in [("A[idx]", lambda i: A[i], (4096,)), ("X[idx]", lambda i: X[i], (32,)), ("X[idx].sum(1)", lambda i: X[i].sum(1), (32,)),
                              ("embedding", emb, (16, 64))]:
    for dt in (dtypes.int32, dtypes.int64):
      named = (f"CPU/{name}/{'x'.join(map(str, shape))}/{dt.name}", last_ast(gather(inputs("CPU", dt, shape)[0]), "CPU"))
      add(named, ("c",), [], default_opts(Kernel(named[1], CAPS)))
      add(named, TILES, [], default_opts(Kernel(named[1], TILE_CAPS)))
  for name, w in WORKLOADS.items():  # the GPU heuristics' plans at the catalog's GPU sizes, split K among them (test_split_k's sizes too)
    for params in [w.params({}, gpu=True)] + [w.params(p) for p in SPLIT_SIZES.get(name, [])]:
      built = w.build(params, *inputs("EMU", f32, *w.inputs(params)))
      for i, item in enumerate(it for it in schedule(built, "EMU")[0] if any(u.op is Ops.BUFFER for u in it.ast.toposort)):  # no inputs' fills
        add((f"EMU/{name}/{'/'.join(f'{p}={v}' for p, v in params.items())}/{i}", item.ast), ("cuda_sm90",), default_opts(Kernel(item.ast, SM90)))
  for ast, plans in ret.values():  # only the lists that apply, once each
    for name, lists in plans.items():
      plans[name] = list({json.dumps(opts_to_json(opts)): opts for opts in lists if applies(name, ast, opts)}.values())
  return ret


def applies(name: str, ast: UOp, opts: list[Opt]) -> bool:
  try: Kernel(ast, RENDERERS[name][1]).apply_opts(opts)
  except KernelOptError: return False
  return True


def source(name: str, ast: UOp, opts: list[Opt]) -> str:
  renderer, caps = RENDERERS[name]
  try: return renderer.render(Kernel(ast, caps).apply_opts(opts))
  except Exception as e: return f"!! {type(e).__name__}: {e}"  # a refusal is an outcome to keep too


def save(path: str, sequences: int) -> None:
  records = []
  def keep(kid: str, name: str, ast: UOp, opts: list[Opt]) -> None:
    records.append({"id": kid, "renderer": name, "opts": opts_to_json(opts), "src": source(name, ast, opts)})
  for kid, ast in fuzzed().items():
    for caps in (CAPS, GPU_CAPS):
      base, rng = Kernel(ast, caps), random.Random(zlib.crc32(f"{kid}/{caps.has_local}".encode()))
      lists = [[], default_opts(base.copy())] + [random_sequence(base, rng) for _ in range(sequences)]
      for first in (o for o in valid_opts(base) if o.op in (OptOps.TC, OptOps.KBLOCK)):
        lists += [[first]] + [random_sequence(base.copy().apply_opts([first]), rng) for _ in range(3)]
      for opts in lists:
        for name in (name for name, (_, rcaps) in RENDERERS.items() if rcaps is caps): keep(kid, name, ast, opts)
  for kid, (ast, plans) in features().items():
    for name, lists in plans.items():
      for opts in lists: keep(kid, name, ast, opts)
  with open(path, "w") as f: json.dump(records, f)
  print(f"{len(records)} sources saved to {path}")


def check(path: str) -> int:
  with open(path) as f: records = json.load(f)
  kernels, differ = fuzzed() | {kid: ast for kid, (ast, _) in features().items()}, 0
  for rec in records:
    src = source(rec["renderer"], kernels[rec["id"]], opts_from_json(rec["opts"])) if rec["id"] in kernels else "!! no such kernel here"
    if src != rec["src"]:
      differ += 1
      diff = difflib.unified_diff(rec["src"].splitlines(True), src.splitlines(True), n=1)
      print(f"{rec['id']} on {rec['renderer']} with {rec['opts']}:\n" + "".join(diff))
  print(f"{len(records) - differ} of {len(records)} sources identical, {differ} differ")
  return 1 if differ else 0


if __name__ == "__main__":
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("action", choices=["save", "check"])
  ap.add_argument("path")
  ap.add_argument("--sequences", type=int, default=8, help="random opt lists per kernel and device kind")
  args = ap.parse_args()
  sys.exit(save(args.path, args.sequences) if args.action == "save" else check(args.path))
