"""Data types: what the tensor API, the kernel IR and the renderers agree on."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np


@dataclass(frozen=True, eq=True)
class DType:
  priority: int  # higher wins in type promotion
  itemsize: int
  name: str
  np: Any  # the numpy scalar type
  kind: str  # "b"ool, "u"nsigned, "i"nt, "f"loat

  def __repr__(self) -> str: return f"dtypes.{self.name}"
  @property
  def is_float(self) -> bool: return self.kind == "f"
  @property
  def is_int(self) -> bool: return self.kind in "iu"


class dtypes:
  bool = DType(0, 1, "bool", np.bool_, "b")
  uint8 = DType(1, 1, "uint8", np.uint8, "u")
  int32 = DType(3, 4, "int32", np.int32, "i")
  int64 = DType(4, 8, "int64", np.int64, "i")
  float16 = DType(5, 2, "float16", np.float16, "f")
  bfloat16 = DType(6, 2, "bfloat16", ml_dtypes.bfloat16, "f")  # float32's exponent, 8 significant bits: stored as 16 bits, computed in float32
  float32 = DType(7, 4, "float32", np.float32, "f")
  default_float = float32
  default_int = int32
  all = (bool, uint8, int32, int64, float16, bfloat16, float32)

  @staticmethod
  def from_any(x: Any) -> DType:
    """A DType from a DType, its name, or a numpy dtype; TypeError for anything else."""
    if isinstance(x, DType): return x
    if isinstance(x, str) and x in _BY_NAME: return _BY_NAME[x]
    try: npdt = np.dtype(x)
    except TypeError: npdt = None
    if npdt is not None and npdt.type in _BY_NP: return _BY_NP[npdt.type]
    if npdt == np.float64: return dtypes.float32  # numpy's default float comes in as ours
    raise TypeError(f"unsupported dtype {x!r}; use one of {', '.join(d.name for d in dtypes.all)}")

  @staticmethod
  def min(dt: DType) -> Any: return -float("inf") if dt.is_float else (False if dt == dtypes.bool else int(np.iinfo(dt.np).min))

  @staticmethod
  def max(dt: DType) -> Any: return float("inf") if dt.is_float else (True if dt == dtypes.bool else int(np.iinfo(dt.np).max))


_BY_NAME = {d.name: d for d in dtypes.all}
_BY_NP = {d.np: d for d in dtypes.all}


def least_upper(*ds: DType) -> DType:
  """The type of a result mixing `ds`; float16 with bfloat16 is float32, since neither holds the other's values."""
  ret = max(ds, key=lambda d: d.priority)
  return dtypes.float32 if ret == dtypes.bfloat16 and dtypes.float16 in ds else ret
