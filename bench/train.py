"""A training step against PyTorch eager on the same threads, in one run.

  python bench/train.py [--threads 2] [--rounds 5] [--steps 50] [--skip-cnn] [--target x86-64-v3] [--kernels N]

(a) the MLP 784 -> 128 -> 10, batch 128, Adam, data in memory: one step = sample a batch + forward + backward + update; tinytune
    under TinyJit against torch eager. The figure is torch's time per step over tinytune's (above 1: tinytune is faster).
(b) seed 004's beautiful_mnist CNN on 28x28 images, batch 128, Adam: the `train_step` workload's step (model=1, one-hot
    targets, batchnorm by batch statistics) under TinyJit against the same step in torch eager. Its kernels are the workload's,
    so `tinytune search train_step -p model=cnn --seconds 120` tunes them; run this again afterwards for the tuned figure.
Every figure is the median of --rounds rounds of --steps steps, tinytune's and torch's rounds in turn (a load that comes and
goes falls on both); the first steps (compile, capture) are not timed. With --target (or $TINYTUNE_CPU_TARGET) narrower than this
CPU, PyTorch is held to the target's ISA too (it reads that as it loads, so before it is imported here). --kernels N then runs each
kernel of tinytune's CNN step alone, in order, and lists the N slowest by their median (with OMP_NUM_THREADS=1 on a loaded machine).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable

import numpy as np


def per_step_s(a: Callable[[], object], b: Callable[[], object], steps: int, rounds: int) -> tuple[float, float]:
  """The median seconds per step of a and of b, their rounds taken in turn, so a shared machine's load falls on both alike."""
  for _ in range(3): a(), b()  # compile and capture
  times: tuple[list[float], list[float]] = ([], [])
  for _ in range(rounds):
    for step, results in ((a, times[0]), (b, times[1])):
      st = time.perf_counter()
      for _ in range(steps): step()
      results.append((time.perf_counter() - st) / steps)
  return statistics.median(times[0]), statistics.median(times[1])


def mlp_steps(X: np.ndarray, Y: np.ndarray, batch: int) -> tuple[Callable[[], object], Callable[[], object]]:
  import torch

  from tinytune import Tensor, TinyJit
  from tinytune.nn import optim
  rng = np.random.default_rng(0)
  w1, w2 = (rng.uniform(-1, 1, (784, 128)) / 28).astype(np.float32), (rng.uniform(-1, 1, (128, 10)) / 11).astype(np.float32)
  b1, b2 = np.zeros(128, np.float32), np.zeros(10, np.float32)

  params = [Tensor(p, requires_grad=True) for p in (w1, b1, w2, b2)]
  opt = optim.Adam(params, lr=1e-3)
  classes = Tensor.arange(10)

  @TinyJit
  def tt_step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    logits = ((x @ params[0] + params[1]).relu() @ params[2] + params[3])
    loss = -(logits.log_softmax(-1) * (y.unsqueeze(-1) == classes).cast(logits.dtype)).sum(-1).mean()
    loss.backward()
    return loss.realize(*opt.schedule_step())

  def tt() -> object:
    idx = rng.integers(0, len(X), batch)
    return tt_step(Tensor(X[idx]), Tensor(Y[idx]))

  tparams = [torch.tensor(p, requires_grad=True) for p in (w1, b1, w2, b2)]
  topt = torch.optim.Adam(tparams, lr=1e-3)
  TX, TY = torch.from_numpy(X), torch.from_numpy(Y.astype(np.int64))

  def pt() -> object:
    idx = torch.randint(0, len(TX), (batch,))
    topt.zero_grad()
    logits = (TX[idx] @ tparams[0] + tparams[1]).relu() @ tparams[2] + tparams[3]
    loss = torch.nn.functional.cross_entropy(logits, TY[idx])
    loss.backward()
    topt.step()
    return loss
  return tt, pt


def cnn_steps(batch: int) -> tuple[Callable[[], object], Callable[[], object]]:
  """The train_step workload's CNN step over a pool of 1024 random images, a fresh batch each step."""
  import torch

  from tinytune import Tensor, TinyJit
  from tinytune.kernels import get_workload
  from tinytune.kernels.train_step import Trainer, torch_forward
  w = get_workload("train_step")
  p = w.params({"model": 1, "batch": batch})
  _, _, *weights = w.arrays(p)
  rng = np.random.default_rng(0)
  X = rng.standard_normal((1024, 1, 28, 28), dtype=np.float32)
  Y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 1024)]
  trainer = Trainer(1, [Tensor(a) for a in weights])

  @TinyJit
  def tt_step(x: Tensor, y: Tensor) -> Tensor:
    outs = trainer.step(x, y)
    return outs[0].realize(*outs[1:])

  def tt() -> object:
    idx = rng.integers(0, len(X), batch)
    tt.inputs = [Tensor(X[idx]), Tensor(Y[idx])]  # type: ignore[attr-defined]  # the last step's, for --kernels
    return tt_step(*tt.inputs)  # type: ignore[attr-defined]
  tt.jit = tt_step  # type: ignore[attr-defined]

  tparams = [torch.tensor(a, requires_grad=True) for a in weights]
  topt = torch.optim.Adam(tparams, lr=1e-3)
  TX, TY = torch.from_numpy(X), torch.from_numpy(Y)

  def pt() -> object:
    idx = torch.randint(0, len(TX), (batch,))
    topt.zero_grad()
    loss = torch.nn.functional.cross_entropy(torch_forward(1, TX[idx], tparams), TY[idx])
    loss.backward()
    topt.step()
    return loss
  return tt, pt


def kernel_times(jit: object, inputs: list, rounds: int, top: int) -> None:
  """Each kernel of a captured TinyJit step run alone, in the step's order on the step's last inputs, `rounds` times: the `top`
  slowest by their median, with their opts (what a step's milliseconds are spent on)."""
  from tinytune.engine.jit import TinyJit, _input_buffer
  assert isinstance(jit, TinyJit) and jit.captured is not None
  ins = [_input_buffer(t) for t in inputs]
  steps = [(k, [ins[b] if isinstance(b, int) else b for b in bufs]) for k, bufs in jit.captured.steps]
  times: list[list[float]] = [[] for _ in steps]
  for _ in range(rounds):
    for (k, bufs), t in zip(steps, times): t.append(k.program(*bufs))
  meds = [statistics.median(t) for t in times]
  print(f"{len(steps)} kernels, their medians summed {sum(meds) * 1e3:.2f} ms; the slowest:")
  for i in sorted(range(len(steps)), key=lambda i: -meds[i])[:top]:
    k, opts = steps[i][0], " ".join(f"{o.op.name}:{o.axis}:{o.arg}" for o in steps[i][0].opts)
    print(f"  {i:3d} {meds[i] * 1e3:7.3f} ms {k.flops / meds[i] / 1e9:6.1f} GFLOPS {k.name:30s} {opts}")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--threads", type=int, default=2)
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--steps", type=int, default=50)
  ap.add_argument("--skip-cnn", action="store_true", help="only (a)")
  ap.add_argument("--kernels", type=int, default=0, metavar="N", help="then time the CNN step's kernels one by one and list the N slowest")
  ap.add_argument("--target", default=None, help="CPU target of tinytune's kernels and PyTorch's ISA: native (default), x86-64-v3, ...")
  args = ap.parse_args()
  from tinytune.kernels.baselines import torch_env
  from tinytune.runtime.cpu import cpu_target
  try: target = cpu_target(args.target).name
  except ValueError as e: raise SystemExit(f"error: {e}") from None
  os.environ.update(torch_env(target), TINYTUNE_CPU_TARGET=target)  # before tinytune's CPU device opens and before PyTorch loads
  import torch
  print(f"target {target}; PyTorch's CPU capability: {torch.backends.cpu.get_cpu_capability()}")
  torch.set_num_threads(args.threads)
  rng = np.random.default_rng(0)
  X, Y = rng.random((60000, 784), dtype=np.float32), rng.integers(0, 10, 60000).astype(np.int32)
  tt, pt = mlp_steps(X, Y, 128)
  t_tt, t_pt = per_step_s(tt, pt, args.steps, args.rounds)
  print(f"(a) MLP 784-128-10 Adam step, batch 128: tinytune+TinyJit {t_tt * 1e3:.3f} ms, torch eager {t_pt * 1e3:.3f} ms, "
        f"torch/tinytune {t_pt / t_tt:.2f}x (target >= 1.0)")
  if args.skip_cnn: return
  tt, pt = cnn_steps(128)
  steps = max(1, args.steps // 10)  # a CNN step is some ten times an MLP step
  t_tt, t_pt = per_step_s(tt, pt, steps, args.rounds)
  print(f"(b) CNN beautiful_mnist Adam step, batch 128, 28x28: tinytune+TinyJit {t_tt * 1e3:.2f} ms, torch eager {t_pt * 1e3:.2f} ms, "
        f"torch/tinytune {t_pt / t_tt:.2f}x (target >= 0.7; >= 1.0 after tuning: run `tinytune search train_step -p model=cnn "
        "--seconds 120`, then this again)")
  if args.kernels: kernel_times(tt.jit, tt.inputs, args.rounds * steps, args.kernels)  # type: ignore[attr-defined]


if __name__ == "__main__":
  main()
