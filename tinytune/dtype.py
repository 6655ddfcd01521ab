"""Data types: what the tensor API, the kernel IR and the renderers agree on."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from tinytune.errors import DTypeNameError


@dataclass(frozen=True, eq=False)  # each dtype is one object (the attributes of `dtypes`): equal means the same, a fast identity check
class DType:
  priority: int  # orders the types: bool, then ints by size (signed first), then floats by size
  itemsize: int
  name: str
  np: Any  # the numpy scalar type
  kind: str  # "b"ool, "u"nsigned, "i"nt, "f"loat

  def __repr__(self) -> str: return f"dtypes.{self.name}"
  __hash__ = object.__hash__  # equal means the same object; graph structure keys hash a dtype per node, and a Python __hash__ is a call
  @property
  def is_float(self) -> bool: return self.kind == "f"
  @property
  def is_half(self) -> bool: return self.kind == "f" and self.itemsize == 2  # float16 or bfloat16: a composite of them computes in float32
  @property
  def is_int(self) -> bool: return self.kind in "iu"
  @property
  def is_unsigned(self) -> bool: return self.kind == "u"


class dtypes:
  bool = DType(0, 1, "bool", np.bool_, "b")
  int8 = DType(1, 1, "int8", np.int8, "i")
  uint8 = DType(2, 1, "uint8", np.uint8, "u")
  int16 = DType(3, 2, "int16", np.int16, "i")
  uint16 = DType(4, 2, "uint16", np.uint16, "u")
  int32 = DType(5, 4, "int32", np.int32, "i")
  uint32 = DType(6, 4, "uint32", np.uint32, "u")
  int64 = DType(7, 8, "int64", np.int64, "i")
  uint64 = DType(8, 8, "uint64", np.uint64, "u")
  float16 = DType(9, 2, "float16", np.float16, "f")
  bfloat16 = DType(10, 2, "bfloat16", ml_dtypes.bfloat16, "f")  # float32's exponent, 8 significant bits: stored as 16 bits, computed in float32
  float32 = DType(11, 4, "float32", np.float32, "f")
  float64 = DType(12, 8, "float64", np.float64, "f")
  void = DType(-1, 0, "void", None, "v")  # a lowered program's statements that hold no value (loops, stores); no tensor has it
  all = (bool, int8, uint8, int16, uint16, int32, uint32, int64, uint64, float16, bfloat16, float32, float64)
  # C's and tinygrad's names
  half, float, double = float16, float32, float64
  char, uchar, short, ushort, int, uint, long, ulong = int8, uint8, int16, uint16, int32, uint32, int64, uint64
  # what Python floats and ints become, settable: `dtypes.default_float = dtypes.float64`
  default_float = float32
  default_int = int32

  @staticmethod
  def from_any(x: Any) -> DType:
    """A DType from a DType, its name (or alias), or a numpy dtype; TypeError for anything else (a name that names none is also an
    AttributeError, as a lookup on dtypes)."""
    if isinstance(x, DType): return x
    if isinstance(x, str) and isinstance(ret := getattr(dtypes, x, None), DType) and ret in dtypes.all: return ret
    try: npdt = np.dtype(x)
    except TypeError: npdt = None
    if npdt is not None and npdt.type in _BY_NP: return _BY_NP[npdt.type]
    raise (DTypeNameError if isinstance(x, str) else TypeError)(f"unsupported dtype {x!r}; use one of {', '.join(d.name for d in dtypes.all)}")

  @staticmethod
  def min(dt: DType) -> Any: return _MIN[dt.name]

  @staticmethod
  def max(dt: DType) -> Any: return _MAX[dt.name]


_BY_NP = {d.np: d for d in dtypes.all}
_MIN = {d.name: -float("inf") if d.is_float else False if d.kind == "b" else int(np.iinfo(d.np).min) for d in dtypes.all}
_MAX = {d.name: float("inf") if d.is_float else True if d.kind == "b" else int(np.iinfo(d.np).max) for d in dtypes.all}
_SIGNED = {d.itemsize: d for d in dtypes.all if d.kind == "i"}
_UNSIGNED = {d.itemsize: d for d in dtypes.all if d.kind == "u"}


def least_upper(*ds: DType) -> DType:
  """The type of a result mixing `ds`, as in PyTorch and tinygrad where the two agree: any float makes the result the widest float
  (float16 with bfloat16 is float32, since neither holds the other's values); ints take the widest int, and signed mixed with an
  unsigned type as wide or wider is the signed type of twice the unsigned one's size (int8 with uint8 is int16, int32 with uint32
  int64). int64 with uint64 has no such type: a TypeError (torch refuses it too; numpy goes to float64, tinygrad to float16)."""
  if floats := [d for d in ds if d.is_float]:
    ret = max(floats, key=lambda d: d.priority)
    return dtypes.float32 if ret == dtypes.bfloat16 and dtypes.float16 in floats else ret
  signed, unsigned = (max((d.itemsize for d in ds if d.kind == k), default=0) for k in "iu")
  if not signed and not unsigned: return dtypes.bool
  if signed > unsigned or not unsigned: return _SIGNED[signed]
  if not signed: return _UNSIGNED[unsigned]
  if unsigned == 8: raise TypeError("int64 and uint64 have no common int type; cast one of them first")
  return _SIGNED[unsigned * 2]
