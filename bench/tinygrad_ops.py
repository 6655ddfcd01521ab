"""Run a test file written for tinygrad's Tensor (tinygrad's own test/test_ops.py, say) on tinytune, through import aliases.

  python bench/tinygrad_ops.py PATH/test_ops.py [pytest args...]     # e.g. -q -x -k relu
  python bench/tinygrad_ops.py PATH/test_ops.py::TestOps::test_cat PATH/test_ops.py::TestOps::test_stack -q   # pytest's node ids

The file is not part of tinytune (fetch it yourself); this script maps the names such a file imports from tinygrad (tinygrad,
tinygrad.helpers, tinygrad.tensor, tinygrad.device) to tinytune's, then runs pytest on it in this process. Names tinytune has no
use for (the environment knobs, Context) are stand-ins that change nothing. pytest's summary line is the count.
"""
from __future__ import annotations

import contextlib
import os
import sys
import types
from typing import Any

import pytest

from tinytune import Tensor, dtypes
from tinytune.dtype import DType


class _Device:
  DEFAULT = "CPU"


def _getenv(key: str, default: Any = 0) -> Any: return type(default)(os.environ.get(key, default))


def _module(name: str, **names: Any) -> types.ModuleType:
  mod = types.ModuleType(name)
  mod.__dict__.update(names)
  sys.modules[name] = mod
  return mod


def install() -> None:
  """tinygrad's import names, as modules in sys.modules that hold tinytune's objects."""
  root = _module("tinygrad", Tensor=Tensor, Device=_Device, dtypes=dtypes)
  root.__path__ = []  # a package, so that `from tinygrad.helpers import ...` finds its submodules in sys.modules
  _module("tinygrad.helpers", getenv=_getenv, IMAGE=0, DEBUG=0, CI=True, CPU_LLVM=0, AMD_LLVM=0, EMULATE=0,
          Context=lambda **_: contextlib.nullcontext())
  _module("tinygrad.tensor", Tensor=Tensor, _to_np_dtype=lambda dt: dt.np)
  _module("tinygrad.device", is_dtype_supported=lambda dt, device=None: isinstance(dt, DType))


if __name__ == "__main__":
  if len(sys.argv) < 2 or not os.path.exists(sys.argv[1].split("::")[0]):
    sys.exit("usage: python bench/tinygrad_ops.py PATH/test_ops.py[::TEST] [pytest args...]")
  install()
  sys.exit(pytest.main([*sys.argv[1:], "-p", "no:cacheprovider"]))
