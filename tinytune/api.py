"""`tinytune.tune`: tune every kernel of a user's program, from Python, into the tuning cache that later realizes read."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

from tinytune.codegen.kernel import Kernel
from tinytune.codegen.opts import Opt
from tinytune.engine.program import register_first_use_tuner
from tinytune.helpers import env_count
from tinytune.tensor import Tensor

if TYPE_CHECKING:
  import pandas as pd

  from tinytune.results_db import Database

TUNE_COLUMNS = ["kernel", "key", "device", "dtype", "default_ms", "tuned_ms", "spread", "speedup", "opts", "candidates", "cache_hit", "note",
                "errors"]
TUNE_DTYPES = {"default_ms": "float64", "tuned_ms": "float64", "spread": "float64", "speedup": "float64",  # also when empty
               "candidates": "int64", "cache_hit": "bool"}


def tune(program: Tensor | Sequence[Tensor] | Callable[..., Any], *example_inputs: Any, strategy: str = "beam", budget: int | None = None,
         seconds: float | None = None, db: Database | str | None = None, device: str | None = None, options: dict[str, Any] | None = None,
         force: bool = False, quiet: bool = False, name: str | None = None, objective: str = "median") -> pd.DataFrame:
  """Tune every kernel that computes `program`: a Tensor or a list of Tensors (their lazy graph; nothing is realized), or a function,
  which is called on `example_inputs` to get its output Tensor(s). A kernel the tuning cache has already is not searched again.

  `strategy` is beam, optuna or random, with `options` for it ({"width": 2} for beam); `budget` is candidates per kernel (default
  $TINYTUNE_BUDGET, else 200; no limit where only `seconds` is given); `seconds` limits the whole program. Results go to `db` (a
  Database, URL or SQLite path; default $TINYTUNE_DB or ~/.cache/tinytune/tinytune.db), which is the tuning cache that realizes
  read only where it is that default database: otherwise export it as a cache file and list it in $TINYTUNE_CACHE. `device`
  defaults to the outputs'. `force` searches kernels the cache has too (so does TINYTUNE_RETUNE=1); `quiet` drops the progress line on
  stderr; `name` is what the database and reports call the program (default: the function's name, or "tensor"); `objective`
  what ranks candidates: the "median" of their runs (the default, robust to a busy moment) or their fastest, "min".

  Returns a DataFrame, one row per distinct kernel in schedule order: kernel (its name, unique in the program: the second of
  two different kernels named r_1024_1_1024 is r_1024_1_1024#2), key, device, dtype (its output's), default_ms and tuned_ms (NaN where unknown),
  speedup, opts ([op, axis, arg] lists), candidates (how many this call measured: 0 on a cache hit) and cache_hit. Afterwards,
  realizing the same graph in this process (or any later one) runs the tuned opts.

  tune() realizes nothing, and that includes a training step's updates: a function that calls `opt.schedule_step()` (or
  `assign`s) leaves those assigns pending on the parameters and optimizer state, as calling it does without tune(). The next
  realize that touches them (the next step, or just `w.numpy()`) applies them: the example batch's update happens then, once.
  To keep the parameters as they were, tune a step built on copies of them (`Tensor(w.numpy())`): its kernels are the same."""
  from tinytune import engine
  from tinytune.engine.realize import schedule_many
  from tinytune.results_db import Database
  from tinytune.search.progress import ProgressLine
  from tinytune.search.strategy import check_options
  from tinytune.search.tune import KernelOutcome, Tuner, outcome_frame

  outputs, workload, params = _outputs(program, example_inputs)
  if name is not None and (not isinstance(name, str) or not name.strip()): raise TypeError(f"name must be a non-empty str, not {name!r}")
  workload = name or workload
  if not isinstance(strategy, str): raise TypeError(f"strategy must be a name (beam, optuna, random), not {type(strategy).__name__}")
  check_options(strategy, dict(options or {}))  # an unknown name or option, or a missing optional dependency, fails before anything runs
  budget, dev = _budget(budget, seconds), _device(outputs, device)
  database = db if isinstance(db, Database) else Database(db)

  # the kernels a realize of all the outputs together runs (a training step's shared gradients once, its assigns in place)
  items = schedule_many([t.uop for t in outputs], dev, [t._memory if t._pending else None for t in outputs])[0] if outputs else []
  kernels = {k.key: (label, k) for label, k in engine.kernels(items, dev)}  # in schedule order
  progress = ProgressLine(strategy, budget, {key: label for key, (label, _) in kernels.items()}, quiet=quiet)
  tuner = Tuner(database, dev, strategy, {"candidates": budget, "seconds": seconds}, dict(options or {}), force=force, on_result=progress,
                objective=objective)
  outcomes: list[KernelOutcome] = []
  try:
    dtype = dtypes.pop() if len(dtypes := {t.dtype.name for t in outputs}) == 1 else None  # the run's dtype: its outputs', where they agree
    if items: outcomes = tuner.tune_program(items, workload, params, dtype)
  finally: progress.done()
  engine.forget()  # realizes in this process look the kernels up again

  frame = outcome_frame(outcomes, lambda o: {"device": dev, "dtype": kernels[o.key][1].ast.dtype.name})
  frame["candidates"] = [sum(c.values()) for c in frame.get("candidates", [])]  # a cache hit measured none
  return frame.reindex(columns=TUNE_COLUMNS).astype(TUNE_DTYPES)


def _budget(budget: Any, seconds: Any) -> int | None:
  """tune()'s candidates per kernel, once `budget` and `seconds` are checked: where neither is given, $TINYTUNE_BUDGET or the default."""
  from tinytune.search.tune import DEFAULT_CANDIDATES
  if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)): raise TypeError(f"budget must be an int, not {budget!r}")
  if budget is not None and budget < 1: raise ValueError(f"budget must be at least 1 candidate per kernel, not {budget}")
  if seconds is not None and not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
    raise ValueError(f"seconds must be a positive number, not {seconds!r}")
  return (env_count("TINYTUNE_BUDGET", 1) or DEFAULT_CANDIDATES) if budget is None and seconds is None else budget


def _device(outputs: list[Tensor], device: str | None) -> str:
  """The one device of the outputs (`device` where given), or the default device where there are none."""
  from tinytune.runtime import Device
  devices = {Device.canonicalize(device or t.device) for t in outputs}
  if len(devices) > 1: raise ValueError(f"the outputs are on several devices ({', '.join(sorted(devices))}); pass device= to tune for one")
  return devices.pop() if devices else Device.canonicalize(device)


def _outputs(program: Any, example_inputs: tuple) -> tuple[list[Tensor], str, dict[str, Any]]:
  """The output Tensors of what tune() was given, and the workload name and params its search run is recorded under."""
  if isinstance(program, Tensor) or (isinstance(program, (list, tuple)) and program and all(isinstance(t, Tensor) for t in program)):
    if example_inputs: raise TypeError("example inputs are for a function; a Tensor's graph is tuned as it is")
    outputs = [program] if isinstance(program, Tensor) else list(program)
    return outputs, "tensor", {"outputs": _shapes(outputs)}
  if callable(program) and not isinstance(program, type):
    ret = program(*example_inputs)
    outputs = [ret] if isinstance(ret, Tensor) else list(ret) if isinstance(ret, (list, tuple)) else []
    if not outputs or not all(isinstance(t, Tensor) for t in outputs):
      raise TypeError(f"tune() needs a function that returns a Tensor or a list of Tensors; {_name(program)} returned {type(ret).__name__}")
    return outputs, _name(program), {"inputs": _shapes([x for x in example_inputs if isinstance(x, Tensor)])}
  raise TypeError(f"tune() takes a Tensor, a list of Tensors or a function, not {type(program).__name__}")


def _name(fn: Callable) -> str: return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
def _shapes(tensors: list[Tensor]) -> list[str]: return [f"{'x'.join(map(str, t.shape)) or 'scalar'} {t.dtype.name}" for t in tensors]


def _tune_on_first_use(kernel: Kernel, device: str, strategy: str) -> tuple[Opt, ...]:
  """The engine's first-use tuner (TINYTUNE_TUNE=beam): the search, and SQLAlchemy with it, load when it first tunes a kernel."""
  from tinytune.search.tune import tune_on_first_use
  return tune_on_first_use(kernel, device, strategy)


register_first_use_tuner(_tune_on_first_use)
