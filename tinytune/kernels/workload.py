"""A workload: a named tensor program with parameters, FLOP and byte counts, a NumPy reference and a PyTorch baseline.

A program builds one output tensor, or several that are realized together (a training step: the loss and every updated
parameter and optimizer state); its kernels are those `schedule` lists, the ones Tensor.realize runs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Union

import numpy as np

from tinytune.dtype import DType, dtypes
from tinytune.helpers import prod
from tinytune.tensor import Tensor

if TYPE_CHECKING:
  from tinytune.engine.schedule import ScheduleItem
  from tinytune.uop import UOp

Params = dict[str, int]


def floats(dtype: DType) -> bool: return dtype.is_float
def numbers(dtype: DType) -> bool: return dtype.is_float or dtype.kind == "i"  # sums and products: floats and signed integers
Built = Union[Tensor, tuple[Tensor, ...]]  # what a workload's build returns


@dataclass(frozen=True)
class Workload:
  name: str
  doc: str
  defaults: Params
  inputs: Callable[[Params], list[tuple[int, ...]]]  # input shapes
  build: Callable[..., Built]  # (params, *input tensors) -> output tensor or tensors, lazily
  reference: Callable[..., np.ndarray]  # (params, *input arrays) -> what `result` gives; also the NumPy baseline
  flops: Callable[[Params], int]
  output: Callable[[Params], tuple[int, ...]] | None = None  # output shape, for the byte count
  torch: Callable[..., Any] | None = None  # (params, *torch tensors) -> torch tensor: the PyTorch baseline
  help: dict[str, str] = field(default_factory=dict)  # what each parameter means, where its name does not say
  may_be_zero: tuple[str, ...] = ()  # flags and offsets; every other parameter is a size, at least 1
  prepare: Callable[[Params, list[np.ndarray]], list[np.ndarray]] | None = None  # the standard normal inputs made the workload's own
  takes: Callable[[DType], bool] = floats  # the dtypes it computes in (every dtype of `dtypes.all` it accepts, new ones included)

  def dtype(self, name: str | DType) -> DType:
    """The dtype `name` names, where the workload computes in it (else ValueError, one line saying which it takes): the one way
    search, bench and compare read --dtype."""
    dtype = dtypes.from_any(name)
    if not self.takes(dtype):
      raise ValueError(f"{self.name} does not compute in {dtype.name}; it takes {', '.join(d.name for d in dtypes.all if self.takes(d))}")
    return dtype
  names: dict[str, dict[str, int]] = field(default_factory=dict)  # values a parameter may also be given by name (-p model=cnn)
  gpu: Params = field(default_factory=dict)  # the defaults that differ on a GPU: data several times its L2, so launches do not dominate

  def params(self, overrides: dict[str, int], gpu: bool = False) -> Params:
    """The defaults with `overrides` applied; on a GPU (`gpu`) with none given, the GPU defaults."""
    if unknown := sorted(set(overrides) - set(self.defaults)):
      known = ", ".join(f"{k}={v}" for k, v in self.defaults.items())
      raise ValueError(f"{self.name} has no parameter {', '.join(unknown)}; its parameters (with defaults): {known}")
    if bad := [f"{k}={v}" for k, v in overrides.items() if v < (0 if k in self.may_be_zero else 1)]:
      zero = f", {', '.join(self.may_be_zero)} at least 0" if self.may_be_zero else ""
      raise ValueError(f"bad {self.name} parameter {', '.join(bad)}: sizes are at least 1{zero}")
    return {**self.defaults, **(self.gpu if gpu and not overrides else {}), **overrides}

  def nbytes(self, params: Params, itemsize: int = 4) -> int:
    """The least memory traffic: every input read once and the output written once, `itemsize` bytes each (the dtype's)."""
    shapes = self.inputs(params) + ([self.output(params)] if self.output is not None else [])
    return itemsize * sum(prod(s) for s in shapes)

  def arrays(self, params: Params, dtype: DType = dtypes.float32, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(shape) for shape in self.inputs(params)]
    return [a.astype(dtype.np) for a in (self.prepare(params, arrays) if self.prepare is not None else arrays)]

  def instantiate(self, params: Params, dtype: DType = dtypes.float32, device: str | None = None,
                  seed: int = 0) -> tuple[Built, list[np.ndarray]]:
    """Random inputs (realized) and the lazy output tensor or tensors."""
    arrays = self.arrays(params, dtype, seed)
    return self.build(params, *[Tensor(a, dtype=dtype, device=device) for a in arrays]), arrays


def outputs(built: Built) -> tuple[Tensor, ...]: return built if isinstance(built, tuple) else (built,)


def schedule(built: Built, device: str) -> tuple[list[ScheduleItem], list[UOp]]:
  """The kernels that realize a workload's outputs together, as Tensor.realize runs them (a pending assign writes its tensor's own
  memory), and the realized view of each output; nothing runs."""
  from tinytune.engine.realize import schedule_many
  outs = outputs(built)
  return schedule_many([t.uop for t in outs], device, [t._memory if t._pending else None for t in outs])


def result(built: Built) -> np.ndarray:
  """The values a workload's reference computes: its one output, or all of its outputs realized together, flattened end to end."""
  if isinstance(built, Tensor): return built.numpy()
  built[0].realize(*built[1:])
  return np.concatenate([t.numpy().ravel() for t in built])


WORKLOADS: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
  """Add a workload to the catalog (a module in tinytune/kernels/ calls this at import)."""
  WORKLOADS[workload.name] = workload
  return workload


def get_workload(name: str) -> Workload:
  if name not in WORKLOADS: raise ValueError(f"unknown workload {name!r}; available: {', '.join(WORKLOADS)}")
  return WORKLOADS[name]
