"""The train_step workload: its kernels are a real jitted training step's, and search and bench run it end to end."""
from __future__ import annotations

import gc
import hashlib
import json

import numpy as np
import pytest

from tinytune import Tensor, TinyJit, engine
from tinytune.engine import schedule_many
from tinytune.engine.realize import capturing
from tinytune.engine.schedule import create_schedule
from tinytune.kernels import get_workload
from tinytune.kernels.train_step import Trainer
from tinytune.kernels.workload import schedule

SMALL = {"batch": 16, "din": 32, "hidden": 16}


def keys(items: list) -> list[str]: return [k.key for _, k in engine.kernels(items, "CPU")]


def test_schedule_many_of_one_target_is_create_schedule() -> None:
  x, w = Tensor.rand(8, 16).realize(), Tensor.rand(16, 4).realize()
  out = (x @ w).relu().softmax(-1)
  items, views = schedule_many([out.uop], "CPU")
  want, view = create_schedule(out.uop, "CPU")
  assert keys(items) == keys(want) and len(items) >= 2 and views[0].shape == view.shape
  np.testing.assert_allclose(out.numpy().sum(-1), 1, rtol=1e-5)  # scheduling ran nothing and marked nothing realized


def test_schedule_many_is_what_realize_runs() -> None:
  x = Tensor.rand(8, 16).realize()
  s = x.sum(0)  # read by both targets: one kernel, first
  a, b = s * 2 + 1, (x - s).max(0)
  items, _ = schedule_many([a.uop, b.uop], "CPU")
  with capturing() as ran: a.realize(b)
  assert keys(items) == [hashlib.sha256(k.ast_text.encode()).hexdigest()[:24] for k, _ in ran] and len(items) == 3
  np.testing.assert_allclose(b.numpy(), (x.numpy() - x.numpy().sum(0)).max(0), rtol=1e-5)


def test_workload_kernels_are_a_jitted_steps() -> None:
  """Tuning carries over: the workload's kernels, in order, are those a TinyJit training step captures."""
  gc.collect()  # realized nodes of earlier tests that only a reference cycle keeps would be reused instead of computed
  w = get_workload("train_step")
  p = w.params(SMALL)
  built, arrays = w.instantiate(p)
  planned = keys(schedule(built, "CPU")[0])
  x, y, *weights = [Tensor(a) for a in arrays]
  trainer = Trainer(0, weights)

  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    outs = trainer.step(x, y)
    return outs[0].realize(*outs[1:])

  losses = [step(x, y).item() for _ in range(3)]
  assert trainer.opt.params[0] is weights[0] and losses[2] < losses[0]
  assert step.captured is not None
  captured = [hashlib.sha256(k.ast_text.encode()).hexdigest()[:24] for k, _ in step.captured.steps]
  assert captured == planned and len(set(planned)) > 10


def test_cnn_schedule_at_a_small_size() -> None:
  w = get_workload("train_step")
  p = w.params({"model": 1, "batch": 2, "size": 20, "channels": 2, "classes": 3})
  built, _ = w.instantiate(p)
  items, views = schedule(built, "CPU")
  assert len(views) == 3 + 3 * 14 and len(items) > 3 * 14 and w.output(p)[0] == 3 + sum(int(np.prod(v.shape)) for v in views[3:])
  with pytest.raises(ValueError, match="size >= 20"): w.instantiate(w.params({"model": 1, "size": 16}))


def test_search_then_bench(tmp_path, capsys: pytest.CaptureFixture) -> None:  # type: ignore[no-untyped-def]
  from tinytune.cli import main
  db, params = f"sqlite:///{tmp_path / 't.db'}", [x for k, v in SMALL.items() for x in ("-p", f"{k}={v}")]
  assert main(["search", "train_step", *params, "--budget", "2", "--db", db, "--json", "--device", "CPU"]) == 0  # torch's step: CPU tensors
  found = json.loads(capsys.readouterr().out)
  assert len(found["kernels"]) > 10 and all(k["tuned_ms"] is not None for k in found["kernels"])
  pytest.importorskip("torch")
  assert main(["bench", "train_step", *params, "--db", db, "--json", "--no-peak", "--repeats", "3", "--device", "CPU"]) == 0
  rows = {r["implementation"]: r for r in json.loads(capsys.readouterr().out)["implementations"]}
  assert {"tinytune-default", "tinytune-tuned", "torch", "numpy"} <= set(rows) and rows["torch"]["median_ms"] > 0
