"""Generated sources before and after a code generator change: identical source is the best proof that a refactor kept behaviour.

  PYTHONPATH=<old tree> python bench/sources.py save sources.json [--sequences 8]   # with the code before the change
  PYTHONPATH=<new tree> python bench/sources.py check sources.json                  # after it: every difference, and a count

Every kernel of the opt fuzzer's cases and of the workload catalog (small sizes) is rendered with no opts, the default opts and
random valid opt lists (plus lists that start with TC or KBLOCK, which random picks rarely reach), on the C renderer with CPU caps
and on the OpenCL (with and without cl_khr_fp16), CUDA and HIP renderers with workgroup caps (and CUDA with CPU caps). `save` keeps
each opt list with its source, so `check` renders exactly those lists even where the opt rules changed in between. Run it from the repository root."""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import random
import sys
import zlib

from tests.test_kernels_catalog import SMALL
from tests.test_opts import CAPS, CASES, WORKGROUP_CAPS, random_sequence, valid_opts
from tinytune import Kernel, Tensor, dtypes
from tinytune.codegen.cstyle import CRenderer, CStyleRenderer, CUDARenderer, HIPRenderer, OpenCLRenderer
from tinytune.codegen.heuristic import default_opts
from tinytune.codegen.opts import OptOps, opts_from_json, opts_to_json
from tinytune.engine.schedule import create_schedule
from tinytune.kernels import get_workload
from tinytune.kernels.workload import schedule
from tinytune.runtime import DeviceCaps
from tinytune.uop import UOp

GPU_CAPS = dataclasses.replace(WORKGROUP_CAPS, tensor_cores=("float16", "bfloat16"))
RENDERERS: dict[str, tuple[CStyleRenderer, DeviceCaps]] = {
  "c": (CRenderer(), CAPS), "opencl": (OpenCLRenderer(), GPU_CAPS), "opencl_nofp16": (OpenCLRenderer(fp16=False), GPU_CAPS),
  "cuda": (CUDARenderer(), GPU_CAPS), "hip": (HIPRenderer(), GPU_CAPS),
  "cuda_cpu_caps": (CUDARenderer(), CAPS)}  # as bench/render.py renders CPU kernels: the renderer, not the caps, says workgroups


def asts() -> dict[str, UOp]:
  """Each kernel's AST by a stable id."""
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


def render(renderer: CStyleRenderer, k: Kernel) -> str:
  try: return renderer.render(k)
  except Exception as e: return f"!! {type(e).__name__}: {e}"  # a refusal is an outcome to keep too


def save(path: str, sequences: int) -> None:
  records = []
  for kid, ast in asts().items():
    for caps in (CAPS, GPU_CAPS):
      base, rng = Kernel(ast, caps), random.Random(zlib.crc32(f"{kid}/{caps.has_local}".encode()))
      lists = [[], default_opts(base.copy())] + [random_sequence(base, rng) for _ in range(sequences)]
      for first in (o for o in valid_opts(base) if o.op in (OptOps.TC, OptOps.KBLOCK)):
        lists += [[first]] + [random_sequence(base.copy().apply_opts([first]), rng) for _ in range(3)]
      for opts in lists:
        for name, (renderer, rcaps) in RENDERERS.items():
          if rcaps is not caps: continue
          records.append({"id": kid, "renderer": name, "opts": opts_to_json(opts), "src": render(renderer, base.copy().apply_opts(opts))})
  with open(path, "w") as f: json.dump(records, f)
  print(f"{len(records)} sources saved to {path}")


def check(path: str) -> int:
  with open(path) as f: records = json.load(f)
  kernels, differ = asts(), 0
  for rec in records:
    renderer, caps = RENDERERS[rec["renderer"]]
    src = render(renderer, Kernel(kernels[rec["id"]], caps).apply_opts(opts_from_json(rec["opts"])))
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
