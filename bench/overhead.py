"""What a program pays beyond its kernels: Tensor API calls against PyTorch eager on the same threads, in one run.

  python bench/overhead.py [--threads 2] [--rounds 7]
  python bench/overhead.py --host [--rounds 7]

--host: the Python a program pays per call on the CPU device, in CPU seconds of this process (time.process_time, one kernel
thread, so a loaded machine's other work is not counted) and in Python function calls (cProfile's count: the same on every run):
(1) the one-kernel step below, its kernel included (about a microsecond on 4096 floats);
(2) a TinyJit replay of the MLP 784-128-10 forward (batch 128, input passed in): the whole call, the device's batch call alone,
    and the call with the batch made a no-op, which is TinyJit's own Python;
(3) building a few common ops' lazy graphs (no realize).

(a) a one-kernel step `t = (t * 0.999 + 0.001).realize()` on 4096 floats, against torch eager;
(b) an MLP forward (64x512) @ (512x1024), relu, @ (1024x512) with a fresh input every call, against torch;
(c) the same MLP under TinyJit, against torch;
(d) the fused elementwise relu(a*b+c)*0.5-a over 16M floats (its kernel's time; the whole call's beside it), as a fraction of a
    STREAM triad compiled and run here;
(e) (a @ b).realize() at 512 with fresh inputs, against its kernel's own time.
Every figure is the median of --rounds rounds; inputs are made fresh (untimed) so no realize is memoized.
"""
from __future__ import annotations

import argparse
import cProfile
import ctypes
import os
import statistics
import subprocess
import tempfile
import time
from typing import Callable

import numpy as np

TRIAD = """
#include <stddef.h>
void triad(float* restrict a, const float* restrict b, const float* restrict c, float s, long n) {
  #pragma omp parallel for schedule(static)
  for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}
"""


def median_s(step: Callable[[], object], setup: Callable[[], object] | None, rounds: int, inner: int) -> float:
  """Median over rounds of the mean seconds of `inner` calls of step (setup, untimed, before each call)."""
  results = []
  for _ in range(rounds):
    total = 0.0
    for _ in range(inner):
      if setup is not None: setup()
      st = time.perf_counter(); step(); total += time.perf_counter() - st
    results.append(total / inner)
  return statistics.median(results)


def triad_gbs(n: int, rounds: int) -> float:
  with tempfile.TemporaryDirectory() as tmp:
    src, so = os.path.join(tmp, "triad.c"), os.path.join(tmp, "triad.so")
    with open(src, "w") as f: f.write(TRIAD)
    subprocess.run(["cc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", src, "-o", so], check=True)
    fn = ctypes.CDLL(so).triad
  a, b, c = (np.ones(n, np.float32) for _ in range(3))
  args = [ctypes.c_void_p(x.ctypes.data) for x in (a, b, c)] + [ctypes.c_float(0.5), ctypes.c_long(n)]
  fn(*args)
  return 3 * 4 * n / median_s(lambda: fn(*args), None, rounds, 5) / 1e9


def cpu_us(step: Callable[[], object], rounds: int, inner: int) -> tuple[float, float]:
  """(median over rounds of this process's CPU microseconds per call of step, Python function calls per call)."""
  for _ in range(3): step()
  results = []
  for _ in range(rounds):
    st = time.process_time()
    for _ in range(inner): step()
    results.append((time.process_time() - st) / inner * 1e6)
  prof = cProfile.Profile()
  prof.enable()
  for _ in range(10): step()
  prof.disable()
  calls = sum(stat.callcount for stat in prof.getstats()) / 10  # primitive and recursive calls alike
  return statistics.median(results), calls


def host(rounds: int) -> None:
  from tinytune import Tensor, TinyJit
  rng = np.random.default_rng(0)
  rows = []
  state = {"t": Tensor(rng.random(4096, dtype=np.float32), device="CPU").realize()}
  def step() -> None: state["t"] = (state["t"] * 0.999 + 0.001).realize()
  rows.append(("(1) one-kernel step, 4096 floats", *cpu_us(step, rounds, 2000)))

  w1, w2 = (Tensor(rng.standard_normal(s, dtype=np.float32) * 0.05, device="CPU").realize() for s in ((784, 128), (128, 10)))
  x = Tensor(rng.standard_normal((128, 784), dtype=np.float32), device="CPU").realize()
  forward = TinyJit(lambda x: ((x @ w1).relu() @ w2).realize())
  for _ in range(3): forward(x)
  assert forward.captured is not None and forward.captured.batch is not None, "the MLP forward replays as one batch call"
  batch, inputs = forward.captured.batch, [x.uop.src[0].arg]
  rows.append(("(2) TinyJit replay, MLP 784-128-10 forward", *cpu_us(lambda: forward(x), rounds, 300)))
  rows.append(("    its batch call alone", *cpu_us(lambda: batch(inputs), rounds, 300)))
  forward.captured.batch = lambda inputs: None  # what is left is TinyJit's own Python (the difference of the two above is noisier)
  rows.append(("    TinyJit's Python (the batch a no-op)", *cpu_us(lambda: forward(x), rounds, 3000)))

  a, b = (Tensor(rng.random((64, 64), dtype=np.float32), device="CPU").realize() for _ in range(2))
  ops: list[tuple[str, Callable[[], object]]] = [
    ("a + b", lambda: a + b), ("a * 0.5", lambda: a * 0.5), ("a.relu()", lambda: a.relu()), ("a.exp()", lambda: a.exp()),
    ("a.sum(1)", lambda: a.sum(1)), ("a.reshape(16, 256)", lambda: a.reshape(16, 256)), ("a.T", lambda: a.T),
    ("a[1:3]", lambda: a[1:3]), ("a @ b", lambda: a @ b), ("a.softmax(1)", lambda: a.softmax(1))]
  for name, fn in ops: rows.append((f"(3) build {name}, 64x64", *cpu_us(fn, rounds, 2000)))
  print(f"CPU device, this process's CPU time per call (OMP_NUM_THREADS=1), median of {rounds} rounds; Python function calls per call")
  width = max(len(r[0]) for r in rows)
  print(f"{'what':{width}}  {'us/call':>8}  {'calls/call':>10}")
  for name, us, calls in rows: print(f"{name:{width}}  {us:8.1f}  {calls:10.0f}")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--threads", type=int, default=2)
  ap.add_argument("--rounds", type=int, default=7)
  ap.add_argument("--host", action="store_true", help="the Python cost per call on the CPU device, in CPU time and function calls")
  args = ap.parse_args()
  if args.host:
    os.environ["OMP_NUM_THREADS"] = "1"  # the kernels' threads would count in this process's CPU time
    return host(args.rounds)
  os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
  import torch

  from tinytune import GlobalCounters, Tensor, TinyJit
  torch.set_num_threads(args.threads)
  rng = np.random.default_rng(0)
  rows = []

  # (a) a one-kernel step
  state = {"t": Tensor(rng.random(4096, dtype=np.float32)).realize(), "tt": torch.from_numpy(rng.random(4096, dtype=np.float32))}
  def tt_step() -> None: state["t"] = (state["t"] * 0.999 + 0.001).realize()
  def torch_step() -> None: state["tt"] = state["tt"] * 0.999 + 0.001
  tt_step(); tt_step()
  a_tt, a_torch = median_s(tt_step, None, args.rounds, 200), median_s(torch_step, None, args.rounds, 200)
  rows.append(("(a) one-kernel step, 4096 floats", f"{a_tt * 1e6:.1f} us", f"{a_torch * 1e6:.1f} us", f"{a_tt / a_torch:.2f}x torch", "<= 8x"))

  # (b), (c) the MLP forward, fresh inputs every call
  w1n, w2n = (rng.standard_normal(s, dtype=np.float32) * 0.05 for s in ((512, 1024), (1024, 512)))
  w1, w2 = Tensor(w1n).realize(), Tensor(w2n).realize()
  w1t, w2t = torch.from_numpy(w1n), torch.from_numpy(w2n)
  box: dict[str, object] = {}
  def fresh() -> None:
    x = rng.standard_normal((64, 512), dtype=np.float32)
    box["x"], box["xt"] = Tensor(x).realize(), torch.from_numpy(x)
  def mlp(x: Tensor) -> Tensor: return ((x @ w1).relu() @ w2).realize()
  jit_mlp = TinyJit(mlp)
  def tt_mlp() -> None: mlp(box["x"])  # type: ignore[arg-type]
  def jit_call() -> None: jit_mlp(box["x"])  # type: ignore[arg-type]
  def torch_mlp() -> None: (box["xt"] @ w1t).relu() @ w2t  # type: ignore[operator]
  for fn in (tt_mlp, jit_call, jit_call, jit_call): fresh(); fn()
  fresh()
  want = (box["xt"] @ w1t).relu() @ w2t  # type: ignore[operator]
  assert np.allclose(jit_mlp(box["x"]).numpy(), want.numpy(), rtol=1e-3, atol=1e-3), "the jitted MLP is wrong"
  b_tt, b_torch = median_s(tt_mlp, fresh, args.rounds, 20), median_s(torch_mlp, fresh, args.rounds, 20)
  c_tt = median_s(jit_call, fresh, args.rounds, 20)
  rows.append(("(b) MLP forward, fresh input", f"{b_tt * 1e3:.3f} ms", f"{b_torch * 1e3:.3f} ms", f"{b_tt / b_torch:.2f}x torch", "<= 1.25x"))
  rows.append(("(c) MLP forward under TinyJit", f"{c_tt * 1e3:.3f} ms", f"{b_torch * 1e3:.3f} ms", f"{c_tt / b_torch:.2f}x torch", "<= 1.0x"))

  # (d) the fused elementwise kernel against a triad
  n = 1 << 24
  ew: dict[str, Tensor] = {}
  def ew_fresh() -> None: ew.update({k: Tensor(rng.random(n, dtype=np.float32)).realize() for k in "abc"}); ew.pop("out", None)
  def ew_run() -> None: ew["out"] = (((ew["a"] * ew["b"] + ew["c"]).relu()) * 0.5 - ew["a"]).realize()
  ew_fresh(); ew_run()
  ew_kernel_s: list[float] = []
  def ew_counted() -> None:
    GlobalCounters.reset(); ew_run(); ew_kernel_s.append(GlobalCounters.time_sum_s)
  d_tt = median_s(ew_counted, ew_fresh, args.rounds, 3)
  triad = triad_gbs(n, args.rounds)
  gbs, call_gbs = 4 * 4 * n / statistics.median(ew_kernel_s) / 1e9, 4 * 4 * n / d_tt / 1e9
  rows.append(("(d) relu(a*b+c)*0.5-a, 16M floats", f"{gbs:.1f} GB/s (call {call_gbs:.1f})", f"triad {triad:.1f} GB/s", f"{gbs / triad:.0%} of triad",
               ">= 80%"))

  # (e) a 512 matmul through the Tensor API against its kernel's own time
  mm: dict[str, Tensor] = {}
  def mm_fresh() -> None: mm.update({k: Tensor(rng.random((512, 512), dtype=np.float32)).realize() for k in "ab"})
  def mm_run() -> None: (mm["a"] @ mm["b"]).realize()
  mm_fresh(); mm_run()
  kernel_s = []
  def mm_counted() -> None:
    GlobalCounters.reset(); mm_run(); kernel_s.append(GlobalCounters.time_sum_s)
  e_tt = median_s(mm_counted, mm_fresh, args.rounds, 5)
  e_kernel = statistics.median(kernel_s)
  rows.append(("(e) (a @ b).realize(), 512", f"{e_tt * 1e3:.3f} ms", f"kernel {e_kernel * 1e3:.3f} ms", f"{e_tt / e_kernel:.2f}x kernel", "<= 1.10x"))

  print(f"{args.threads} threads, median of {args.rounds} rounds, torch {torch.__version__}")
  widths = [max(len(r[i]) for r in rows) for i in range(5)]
  for r in [("what", "tinytune", "reference", "ratio", "target"), *rows]: print("  ".join(c.ljust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
  main()
