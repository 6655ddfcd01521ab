"""tinytune.tune() on a Tensor graph and on a function, and first-use tuning's knobs (BEAM=N, TINYTUNE_BUDGET) and progress line."""
from __future__ import annotations

import io
import json
from types import SimpleNamespace
from typing import Iterator

import numpy as np
import pytest

from tinytune import Device, Kernel, Tensor, engine, tune
from tinytune.api import TUNE_COLUMNS, TUNE_DTYPES
from tinytune.codegen.opts import opts_to_json
from tinytune.engine.realize import capturing
from tinytune.engine.schedule import realized
from tinytune.helpers import tune_mode
from tinytune.results_db import Database
from tinytune.search.progress import ProgressLine
from tinytune.search.tune import first_use_tuner


@pytest.fixture
def db_path(tmp_path, monkeypatch) -> Iterator[str]:  # type: ignore[no-untyped-def]
  """A fresh results database that is also the one realizes read the tuning cache from; no first-use tuning."""
  path = str(tmp_path / "tune.db")
  monkeypatch.setenv("TINYTUNE_DB", path)
  for key in ("TINYTUNE_TUNE", "BEAM", "TINYTUNE_BUDGET", "TINYTUNE_CACHE"): monkeypatch.delenv(key, raising=False)
  engine.forget()
  yield path
  engine.forget()  # later tests do not run this database's opts


def kernels_of(out: Tensor) -> list[Kernel]:
  """The kernels `out` computes, as the default device (where tune() and a realize run them) schedules them."""
  return [k for _, k in engine.kernels(out.uop, Device.DEFAULT)]


def runs(path: str) -> list:
  db = Database(path)
  return [r for i in range(1, 50) if (r := db.run(i)) is not None]


def test_tune_a_tensor_graph_then_cache_hits_and_realize_runs_the_tuned_opts(db_path: str) -> None:
  a, b = Tensor.rand(24, 24).realize(), Tensor.rand(24, 24).realize()
  out = (a @ b).relu().sum(1)
  frame = tune(out, budget=3, db=db_path)
  kernels = kernels_of(out)
  assert list(frame.columns) == TUNE_COLUMNS and {k: str(frame[k].dtype) for k in TUNE_DTYPES} == TUNE_DTYPES
  assert list(frame["key"]) == [k.key for k in kernels] and frame["kernel"].is_unique and set(frame["dtype"]) == {"float32"}
  assert not frame["cache_hit"].any() and (frame["candidates"] > 0).all() and (frame["tuned_ms"] > 0).all()
  assert realized(out.uop) is None  # tuning realizes nothing
  assert runs(db_path)[0].workload == "tensor" and runs(db_path)[0].params == {"outputs": ["24 float32"]}

  again = tune(out, budget=3, db=db_path, quiet=True)
  assert again["cache_hit"].all() and (again["candidates"] == 0).all() and list(again["opts"]) == list(frame["opts"])

  with capturing() as ran: result = out.numpy()
  assert [json.loads(opts_to_json(ck.opts)) for ck, _ in ran] == list(frame["opts"])  # the cache's opts, not the defaults
  np.testing.assert_allclose(result, np.maximum(a.numpy() @ b.numpy(), 0).sum(1), rtol=1e-4)


def test_tune_a_function_with_several_outputs(db_path: str, capsys) -> None:  # type: ignore[no-untyped-def]
  def step(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]: return (x * y).sum(0), (x * y).sum(1) + 1
  x, y = Tensor.rand(16, 20).realize(), Tensor.rand(16, 20).realize()
  frame = tune(step, x, y, budget=2, db=db_path)
  assert list(frame["kernel"]) == ["r_20_16", "r_16_20"] and not frame["cache_hit"].any()
  assert runs(db_path)[0].workload.endswith("step") and runs(db_path)[0].params == {"inputs": ["16x20 float32", "16x20 float32"]}
  assert runs(db_path)[0].dtype == "float32"  # its outputs' dtype
  err = capsys.readouterr().err.splitlines()  # not a terminal: one final line per kernel
  assert len(err) == 2 and err[0].startswith("tuned r_20_16 (beam): ") and "candidates" in err[0] and "best" in err[0]
  assert tune(step, x, y, budget=2, db=db_path)["cache_hit"].all() and capsys.readouterr().err == ""


def test_name_and_retune(db_path: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
  x = Tensor.rand(8, 12).realize()
  assert not tune(lambda t: t.sum(1), x, budget=2, db=db_path, name="rowsum", quiet=True)["cache_hit"].any()
  assert runs(db_path)[0].workload == "rowsum"  # not <lambda>
  for key in ("TINYTUNE_RETUNE", "IGNORE_BEAM_CACHE"):  # each forces a fresh search of what the cache has
    monkeypatch.setenv(key, "1")
    again = tune(lambda t: t.sum(1), x, budget=2, db=db_path, quiet=True)
    assert not again["cache_hit"].any() and (again["candidates"] > 0).all()
    monkeypatch.delenv(key)
  assert tune(lambda t: t.sum(1), x, budget=2, db=db_path, quiet=True)["cache_hit"].all()
  with pytest.raises(TypeError, match="name must be a non-empty str"): tune(x + 1, name="")


def test_first_use_retune_searches_what_the_cache_has(db_path: str, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
  out = (Tensor.rand(10, 26).realize() * 2).sum(1)
  tune(out, budget=2, db=db_path, quiet=True)
  (kernel,) = kernels_of(out)
  monkeypatch.setenv("TINYTUNE_TUNE", "beam")
  monkeypatch.setenv("TINYTUNE_BUDGET", "2")
  capsys.readouterr()
  engine.kernel_opts(kernel, Device.DEFAULT)
  assert capsys.readouterr().err == ""  # the cache has it
  engine.forget()
  monkeypatch.setenv("TINYTUNE_RETUNE", "1")
  engine.kernel_opts(kernel, Device.DEFAULT)
  assert capsys.readouterr().err.startswith("tuned r_10_26 (beam): ")


def test_bad_arguments_are_clear_errors(db_path: str) -> None:
  t = Tensor.rand(4, 4) + 1
  with pytest.raises(TypeError, match="Tensor, a list of Tensors or a function"): tune(3)
  with pytest.raises(TypeError, match="returned int"): tune(lambda: 3)
  with pytest.raises(TypeError, match="example inputs are for a function"): tune(t, t)
  with pytest.raises(ValueError, match="budget must be at least 1"): tune(t, budget=0)
  with pytest.raises(TypeError, match="budget must be an int"): tune(t, budget=2.5)  # type: ignore[arg-type]
  with pytest.raises(ValueError, match="seconds must be a positive number"): tune(t, seconds=-1)
  with pytest.raises(ValueError, match="unknown strategy 'bem'"): tune(t, strategy="bem")
  assert runs(db_path) == []  # nothing was recorded
  empty = tune(Tensor.rand(4, 4).realize())  # realized already: no kernels
  assert empty.empty and list(empty.columns) == TUNE_COLUMNS and {k: str(empty[k].dtype) for k in TUNE_DTYPES} == TUNE_DTYPES


def test_beam_alias_and_budget_knob(monkeypatch) -> None:  # type: ignore[no-untyped-def]
  for key in ("TINYTUNE_TUNE", "BEAM", "TINYTUNE_BUDGET"): monkeypatch.delenv(key, raising=False)
  assert tune_mode() == "1" and first_use_tuner("CPU", "beam").budget["candidates"] == 200 and first_use_tuner("CPU", "beam").options == {}
  monkeypatch.setenv("BEAM", "2")
  assert tune_mode() == "beam" and first_use_tuner("CPU", "beam").options == {"width": 2}
  monkeypatch.setenv("TINYTUNE_TUNE", "random")  # TINYTUNE_TUNE wins; BEAM's width is the beam's only
  assert tune_mode() == "random" and first_use_tuner("CPU", "random").options == {}
  monkeypatch.setenv("TINYTUNE_TUNE", "beam")
  assert first_use_tuner("CPU", "beam").options == {"width": 2}
  monkeypatch.delenv("TINYTUNE_TUNE")
  monkeypatch.setenv("BEAM", "0")
  assert tune_mode() == "1"
  monkeypatch.setenv("TINYTUNE_BUDGET", "7")
  assert first_use_tuner("CPU", "beam").budget == {"candidates": 7, "seconds": None}
  for key, value in (("TINYTUNE_BUDGET", "0"), ("BEAM", "two")):
    monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=f"{key}='{value}' is not an integer"): first_use_tuner("CPU", "beam") if key != "BEAM" else tune_mode()
    monkeypatch.delenv(key)


def test_first_use_tuning_records_the_kernel_with_its_shape(db_path: str, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
  a = Tensor.rand(12, 28).realize()
  monkeypatch.setenv("BEAM", "2")
  monkeypatch.setenv("TINYTUNE_BUDGET", "2")
  capsys.readouterr()
  np.testing.assert_allclose((a * 3).sum(1).numpy(), a.numpy().sum(1) * 3, rtol=1e-5)
  (run,) = runs(db_path)
  assert run.workload == "r_12_28" and run.params == {"shape": [12], "reduce": [28], "dtype": "float32"}
  assert run.settings == {"strategy": "beam", "width": 2} and run.budget == {"candidates": 2, "seconds": None}
  assert capsys.readouterr().err.startswith("tuned r_12_28 (beam): ")


def test_progress_line_redraws_on_a_terminal_and_ends_each_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
  """Each kernel's line is redrawn in place with the candidates left and about how long they take at the pace so far (the issue's live
  line had no budget and no ETA), and ends on its final figures."""
  monkeypatch.setenv("COLUMNS", "120")  # a line wider than the terminal is cut to it
  class Terminal(io.StringIO):
    def isatty(self) -> bool: return True
  out, now = Terminal(), iter(range(0, 100, 2))  # each candidate takes 2 s
  line = ProgressLine("beam", 10, {"k2": "r_8#2"}, stream=out, clock=lambda: next(now))
  for key, name, status, t in (("k1", "r_8", "ok", 2e-3), ("k1", "r_8", "ok", 1e-3), ("k1", "r_8", "crashed", 0.0), ("k2", "r_8", "ok", 4e-3)):
    line(SimpleNamespace(key=key, name=name), SimpleNamespace(status=status, time=t))  # type: ignore[arg-type]
  line.done()
  text = out.getvalue()
  assert "\rtuning r_8 (beam): 2/10 candidates (up to 16 s more), best 1 ms (2.00x the default 2 ms)\x1b[K" in text  # 8 more at 2 s
  assert "\rtuned r_8 (beam): 3 candidates, 1 failed, best 1 ms (2.00x the default 2 ms)\x1b[K\n" in text
  assert text.endswith("\rtuned r_8#2 (beam): 1 candidates, best 4 ms (1.00x the default 4 ms)\x1b[K\n")


def test_print_tuning_lists_each_candidate_with_its_part_of_the_best(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
  from tinytune.codegen.opts import Opt, OptOps
  from tinytune.search.evaluate import Result
  monkeypatch.setenv("TINYTUNE_PRINT_TUNING", "1")  # Triton's TRITON_PRINT_AUTOTUNING; `tinytune search --verbose`
  line, kernel = ProgressLine("beam", 10), SimpleNamespace(key="k", name="r_8")
  for r in (Result((), "ok", 2e-3, 2e-3), Result((Opt(OptOps.UPCAST, 0, 4),), "ok", 1e-3, 1e-3), Result((), "crashed", error="exit -11")):
    line(kernel, r)  # type: ignore[arg-type]
  err = capsys.readouterr().err.splitlines()
  assert err == ["  r_8 #1 (none): 2 ms, 100% of the best", "  r_8 #2 UPCAST:0:4: 1 ms, 100% of the best", "  r_8 #3 (none): crashed (exit -11)"]
  monkeypatch.delenv("TINYTUNE_PRINT_TUNING")
  line = ProgressLine("beam", 10)
  line(kernel, Result((), "ok", 2e-3, 2e-3))  # type: ignore[arg-type]
  assert capsys.readouterr().err == ""


def test_one_number_per_measurement_and_nothing_noisy_stored(db_path: str, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
  out = (Tensor.rand(14, 30).realize() + 1).sum(1)
  capsys.readouterr()
  frame = tune(out, budget=3, db=db_path)
  err = capsys.readouterr().err  # the final line shows the re-time the frame and the tuning cache keep, and says so
  (row,) = frame.to_dict("records")
  assert f"best {row['tuned_ms']:.3g} ms" in err and "re-timed: median of " in err and f"the default {row['default_ms']:.3g} ms" in err
  assert 0 <= row["spread"] < 1 and row["note"] == ""
  from tinytune.results_db.cache import TuningCache
  (kernel,) = kernels_of(out)
  assert TuningCache(Database(db_path)).lookup(kernel, Device.DEFAULT).best_s == pytest.approx(row["tuned_ms"] / 1e3)  # type: ignore[union-attr]

  import tinytune.search.strategy as strategy
  monkeypatch.setattr(strategy, "noisy", lambda times, searched, winner: True)  # a machine too busy to trust
  other = (Tensor.rand(14, 34).realize() + 1).sum(1)
  (row,) = tune(other, budget=3, db=db_path).to_dict("records")
  assert row["note"].startswith("noisy: the machine was busy (load ") and np.isnan(row["speedup"])
  assert "noisy: the machine was busy" in capsys.readouterr().err
  (kernel,) = kernels_of(other)
  assert TuningCache(Database(db_path)).lookup(kernel, Device.DEFAULT) is None  # not stored


def test_debug_2_names_where_each_kernels_opts_came_from(db_path: str, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
  from tinytune.helpers import Context
  out = (Tensor.rand(10, 22).realize() * 3).sum(1)
  (kernel,) = kernels_of(out)
  def source() -> str:
    engine.forget()
    with Context(DEBUG=2): engine.kernel_opts(kernel, Device.DEFAULT)
    return capsys.readouterr().out
  capsys.readouterr()
  assert source() == f"r_10_22 on {Device.DEFAULT}: opts from the heuristic defaults (not in the tuning cache)\n"
  tune(out, budget=2, db=db_path, quiet=True)
  assert source().startswith(f"r_10_22 on {Device.DEFAULT}: opts from the tuning cache (sqlite:///") and "tune.db)" in source()
  monkeypatch.setenv("TINYTUNE_TUNE", "0")
  assert source() == f"r_10_22 on {Device.DEFAULT}: opts from the heuristic defaults (TINYTUNE_TUNE=0)\n"
  monkeypatch.setenv("TINYTUNE_TUNE", "beam")
  monkeypatch.setenv("TINYTUNE_RETUNE", "1")
  monkeypatch.setenv("TINYTUNE_BUDGET", "2")
  assert f"r_10_22 on {Device.DEFAULT}: opts from a first-use beam search\n" in source()


def test_objective_min_ranks_by_the_fastest_run(db_path: str, capsys) -> None:  # type: ignore[no-untyped-def]
  from tinytune.search.evaluate import Result
  assert Result((), "ok", 1e-3, 3e-3, objective="min").time == 1e-3 and Result((), "ok", 1e-3, 3e-3).time == 3e-3
  out = (Tensor.rand(12, 20).realize() * 5).sum(1)
  frame = tune(out, budget=2, db=db_path, objective="min")
  assert "re-timed: min of " in capsys.readouterr().err and runs(db_path)[0].settings["objective"] == "min"
  rows = [r for r in Database(db_path).run_candidates(1) if r.status == "ok"]
  assert frame["tuned_ms"][0] > 0 and min(r.min_s for r in rows) <= min(r.median_s for r in rows)
  with pytest.raises(ValueError, match="unknown objective 'mean'; choose median or min"): tune(out, objective="mean")
