"""Time a workload the way the search times a candidate: tinytune's kernels (default or tuned opts), PyTorch, NumPy.

Every timing goes through the same loop as the search's worker (warm-up, then repeats until the spread settles or the time
cap is hit) with the same `TimingPolicy`, so the numbers compare like with like."""
from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

import numpy as np

from tinytune.dtype import DType, dtypes
from tinytune.kernels.workload import Params, Workload
from tinytune.search.evaluate import TimingPolicy
from tinytune.search.worker import timed

TORCH_MISSING = 'PyTorch is not installed: pip install "tinytune[torch]"'
LIBRARIES = ("tinytune-default", "tinytune-tuned", "torch", "numpy")


@dataclass(frozen=True)
class Timing:
  """One implementation of a workload, timed: `times` are the repeats in seconds."""
  library: str
  version: str
  times: list[float]
  output: np.ndarray | None = None
  note: str = ""
  untuned: bool = False  # a tuned timing with no kernel in the tuning cache: the defaults, not worth storing as tuned
  kernels: tuple[dict[str, Any], ...] = ()  # tinytune's: each kernel's name, FLOPs, bytes, opts ([op, axis, arg] lists) and their source

  @property
  def min_s(self) -> float: return min(self.times)
  @property
  def median_s(self) -> float: return statistics.median(self.times)
  @property
  def spread(self) -> float: return (self.median_s - self.min_s) / self.median_s if self.median_s > 0 else 0.0  # as the search's


def time_callable(run: Callable[[], float], policy: TimingPolicy | None = None) -> list[float]:
  """Seconds of each timed call of `run` (which does one call and returns its seconds: device time for tinytune's programs),
  by the search worker's own loop."""
  return timed(run, asdict(policy or TimingPolicy()))


def wall(fn: Callable[[], Any]) -> Callable[[], float]:
  """`fn` as a run for time_callable: its wall-clock seconds (synchronize inside `fn` where the work is asynchronous)."""
  def run() -> float:
    st = time.perf_counter()
    fn()
    return time.perf_counter() - st
  return run


def torch_module() -> Any:
  try:
    import torch
  except ImportError:
    raise RuntimeError(TORCH_MISSING) from None
  return torch


def torch_device(device: str) -> str:
  """PyTorch's name for a tinytune device: CUDA and AMD (HIP builds of PyTorch call it "cuda") when PyTorch can see a GPU."""
  torch = torch_module()
  if device == "CPU": return "cpu"
  if device in ("CUDA", "AMD", "HIP") and torch.cuda.is_available(): return "cuda"
  raise RuntimeError(f"this PyTorch ({torch.__version__}) cannot run on {device}")


def torch_dtype(dtype: DType) -> Any:
  """PyTorch's dtype of the same name (RuntimeError where it has none)."""
  torch = torch_module()
  if not isinstance(found := getattr(torch, dtype.name, None), torch.dtype): raise RuntimeError(f"PyTorch has no {dtype.name}")
  return found


# PyTorch held to a CPU target's ISA (read once, as PyTorch loads): what the baseline of a target narrower than the host runs on
TORCH_ISA = {"x86-64-v2": {"ATEN_CPU_CAPABILITY": "default", "DNNL_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
             "x86-64-v3": {"ATEN_CPU_CAPABILITY": "avx2", "DNNL_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
             "x86-64-v4": {"ATEN_CPU_CAPABILITY": "avx512", "DNNL_MAX_CPU_ISA": "AVX512_CORE", "MKL_ENABLE_INSTRUCTIONS": "AVX512"}}


def torch_env(target: str) -> dict[str, str]:
  """The environment of the process PyTorch's CPU baselines run in: this one's, with PyTorch's ISA held to the target's where the
  user has not set those variables."""
  return {**os.environ, **{k: v for k, v in TORCH_ISA.get(target, {}).items() if k not in os.environ}}


class TorchProcess:
  """A `python -m tinytune.kernels.baselines` process that times PyTorch's CPU baselines: PyTorch's OpenMP threads never spin on
  the cores while tinytune's kernels run (nor the reverse: in one process the two libgomps, or the one they share, wait by
  spinning after every parallel region), and PyTorch loads there with the target's ISA. Speaks JSON lines; outputs come back
  as .npy files."""

  def __init__(self, target: str):
    self.proc = subprocess.Popen([sys.executable, "-m", "tinytune.kernels.baselines"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, env=torch_env(target))

  def time(self, request: dict[str, Any]) -> tuple[dict[str, Any], np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
      assert self.proc.stdin is not None and self.proc.stdout is not None
      self.proc.stdin.write(json.dumps({**request, "out": os.path.join(tmp, "out.npy")}) + "\n")
      self.proc.stdin.flush()
      if not (line := self.proc.stdout.readline()): raise RuntimeError(f"PyTorch's baseline process died (exit {self.proc.wait()})")
      if (reply := json.loads(line)).get("error"): raise RuntimeError(reply["error"])
      return reply, np.load(os.path.join(tmp, "out.npy"))


_torch_processes: dict[str, TorchProcess] = {}


def torch_baseline(workload: Workload, params: Params, device: str, policy: TimingPolicy | None = None, dtype: DType = dtypes.float32) -> Timing:
  """PyTorch on the same device, in the same dtype, with as many CPU threads as tinytune's kernels use; on the CPU in a process of
  its own (TorchProcess), held to the CPU target's ISA. On a GPU timed as tinytune is: CUDA events around the call, after an L2 flush
  unless policy.warm_cache; float32 with TF32 off (cuDNN and cuBLAS would otherwise use TF32 tensor cores, not float32 arithmetic)."""
  from tinytune.runtime import Device
  if importlib.util.find_spec("torch") is None: raise RuntimeError(TORCH_MISSING)
  if workload.torch is None: raise RuntimeError(f"{workload.name} has no PyTorch baseline")
  request: dict[str, Any] = {"workload": workload.name, "params": params, "dtype": dtype.name, "policy": asdict(policy or TimingPolicy())}
  if device != "CPU": return torch_timing(**request, device=device, threads=1)
  target = getattr(Device[device], "target").name
  if (proc := _torch_processes.get(target)) is None or proc.proc.poll() is not None: proc = _torch_processes[target] = TorchProcess(target)
  reply, output = proc.time({**request, "threads": Device[device].caps.threads})
  return Timing("torch", reply["version"], reply["times"], output)


def torch_timing(workload: str, params: Params, dtype: str, policy: dict[str, Any], device: str, threads: int) -> Timing:
  """PyTorch's baseline timed in this process; on the CPU its version names the ISA PyTorch runs on."""
  from tinytune.kernels import get_workload
  torch, w, dt = torch_module(), get_workload(workload), dtypes.from_any(dtype)
  dev, tdt, fn = torch_device(device), torch_dtype(dt), w.torch
  assert fn is not None
  torch.set_num_threads(threads)
  # the same values as tinytune's inputs; NumPy types PyTorch cannot take (ml_dtypes' bfloat16) pass through float32 exactly
  tensors = [torch.from_numpy(a if a.dtype.isbuiltin == 1 else a.astype(np.float32)).to(dev, tdt) for a in w.arrays(params, dt)]
  sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

  def call() -> Any:
    out = fn(params, *tensors)
    sync()
    return out

  run, note = wall(call), ""
  if dev == "cuda":
    run, note = _cuda_events(torch, lambda: fn(params, *tensors), policy.get("warm_cache", False)), "CUDA events"
    if dt == dtypes.float32: note += ", TF32 off"  # cudnn's and matmul's allow_tf32 False: float32 arithmetic (bench/METHOD.md)
  tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
  try:
    if dt == dtypes.float32: torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    with torch.inference_mode():
      out = call().cpu()
      output = (out.float() if out.dtype == torch.bfloat16 else out).numpy()
      times = time_callable(run, TimingPolicy(**policy))
  finally: torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
  isa = torch.backends.cpu.get_cpu_capability().lower()
  version = f"{torch.__version__} {threads} threads {isa}" if dev == "cpu" else f"{torch.__version__} {dev}"
  return Timing("torch", version, times, output, note)


def _cuda_events(torch: Any, fn: Callable[[], Any], warm_cache: bool) -> Callable[[], float]:
  """`fn` as a run for time_callable on a GPU: seconds between CUDA events around it, after writing twice the L2 (at least 64 MiB)
  unless warm_cache, as tinytune's CUDA device times its programs."""
  l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)
  scratch = None if warm_cache else torch.empty(max(2 * l2, 64 << 20), dtype=torch.int8, device="cuda")
  start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
  def run() -> float:
    if scratch is not None: scratch.zero_()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3
  return run


def torch_process() -> None:
  """The loop of a TorchProcess: a request a line in, a reply a line out."""
  for line in sys.stdin:
    request = json.loads(line)
    out = request.pop("out")
    try:
      timing = torch_timing(**request, device="CPU")
      assert timing.output is not None
      np.save(out, timing.output)
      reply: dict[str, Any] = {"times": timing.times, "version": timing.version}
    except Exception as e: reply = {"error": (str(e).strip().splitlines() or [type(e).__name__])[0]}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()


def numpy_baseline(workload: Workload, params: Params, policy: TimingPolicy | None = None, dtype: DType = dtypes.float32) -> Timing:
  """The NumPy reference on inputs in `dtype`, timed (always on the CPU)."""
  arrays = workload.arrays(params, dtype)
  times = time_callable(wall(lambda: workload.reference(params, *arrays)), policy)
  return Timing("numpy", np.__version__, times, workload.reference(params, *arrays))


def tinytune_timing(workload: Workload, params: Params, device: str, tuned: bool, policy: TimingPolicy | None = None, db: Any = None,
                    default: Timing | None = None, dtype: DType = dtypes.float32) -> Timing:
  """tinytune's kernels for the workload, all of them per call, with the tuning cache's opts (`tuned`) or the heuristic defaults.
  A tuned timing whose kernels the cache does not (all) have says so in `note` and uses the defaults for those; where every kernel
  runs its default opts the `default` timing, if given, stands for it (the same programs: timing them again would only add noise)."""
  import tinytune
  from tinytune import engine
  from tinytune.codegen import CODEGEN_VERSION
  from tinytune.kernels.workload import schedule
  from tinytune.runtime import Device, Program
  from tinytune.tensor import Tensor

  built, _ = workload.instantiate(params, dtype, device)
  items, views = schedule(built, device)
  calls: list[tuple[Program, tuple]] = []  # each program with its buffers
  missing, same, kernels = 0, 0, []
  for item, (label, kernel) in zip(items, engine.kernels(items, device)):
    cached = engine.kernel_opts(kernel, device, "tuned", db) if tuned else None
    missing += tuned and cached is None
    defaults = engine.kernel_opts(kernel, device, "default")
    same += cached is None or cached == defaults
    kernel.apply_opts(cached if cached is not None else defaults)
    kernels.append({"kernel": label, "dtype": kernel.ast.dtype.name, "flops": kernel.flops, "bytes": kernel.mem_bytes,
                    "opts": [o.to_json() for o in kernel.opts], "opts_from": "tuning cache" if cached is not None else "defaults"})
    program, _ = engine.compile_kernel(kernel, device)
    calls.append((program, (item.out, *kernel.bufs)))

  note = f"{missing} of {len(items)} kernels not in the tuning cache" if missing else ""
  if tuned and default is not None and same == len(items):
    return replace(default, library="tinytune-tuned", note=(note + ": " if note else "") + "the defaults", untuned=missing == len(items),
                   kernels=tuple(kernels))

  dev, warm = Device[device], policy is not None and policy.warm_cache
  def launch() -> None:
    for program, bufs in calls: program(*bufs)
  def run() -> float:
    """Device seconds: on a GPU between events around the whole program (gaps between kernels count), after an L2 flush unless
    warm_cache; on the CPU the sum of its kernels' times, as the search counts them."""
    if not dev.asynchronous: return sum(program.timed(*bufs) for program, bufs in calls)
    if not warm: dev.flush_cache()
    return dev.timed(launch)

  launch()
  values = [Tensor(view, device=device).numpy() for view in views]  # the buffers the kernels filled, as `result` joins them
  output = (values[0] if isinstance(built, Tensor) else np.concatenate([v.ravel() for v in values])) if items else None
  return Timing("tinytune-tuned" if tuned else "tinytune-default", f"{tinytune.__version__} codegen {CODEGEN_VERSION}", time_callable(run, policy),
                output, note, kernels=tuple(kernels))


def measure(workload: Workload, params: Params, device: str, libraries: list[str], policy: TimingPolicy | None = None,
            db: Any = None, dtype: DType = dtypes.float32) -> dict[str, Timing]:
  """Timings for each library asked for, by name (see LIBRARIES), all in `dtype`; tuned opts come from `db`'s tuning cache (None:
  the default one)."""
  done: dict[str, Timing] = {}
  runners: dict[str, Callable[[], Timing]] = {
    "tinytune-default": lambda: tinytune_timing(workload, params, device, False, policy, db, dtype=dtype),
    "tinytune-tuned": lambda: tinytune_timing(workload, params, device, True, policy, db, done.get("tinytune-default"), dtype),
    "torch": lambda: torch_baseline(workload, params, device, policy, dtype),
    "numpy": lambda: numpy_baseline(workload, params, policy, dtype),
  }
  if unknown := [lib for lib in libraries if lib not in runners]: raise ValueError(f"unknown baseline {', '.join(unknown)}; known: torch, numpy")
  for lib in libraries: done[lib] = runners[lib]()
  return done


def store(db: Any, workload: Workload, params: Params, device: str, timing: Timing, dtype: DType = dtypes.float32) -> int | None:
  """Add a timing to the results database's baselines, under the device it ran on (NumPy: the CPU) and its dtype; an untuned
  "tuned" timing is skipped."""
  from tinytune.runtime import device_fingerprint
  if timing.untuned: return None
  device_id = db.device_id(device_fingerprint("CPU" if timing.library == "numpy" else device))
  return db.add_baseline(device_id, workload.name, params, timing.library, timing.version, timing.median_s, timing.min_s, dtype.name)


if __name__ == "__main__":
  torch_process()
