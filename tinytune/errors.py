"""Errors of a bad call that are two Python exceptions at once: Python's convention (ValueError for a bad value, TypeError for a bad
type) and the one PyTorch raises for the same call (RuntimeError, or its NotImplementedError for an option or dtype it has no kernel
for), so code written for either catches them (tinygrad's tests expect PyTorch's)."""
from __future__ import annotations


class OpError(ValueError, RuntimeError):
  """Shapes, dims or options that do not fit the op, where PyTorch raises RuntimeError."""


class OpIndexError(IndexError, RuntimeError):
  """A dim the tensor does not have, where PyTorch raises RuntimeError (cat of 0-d tensors)."""


class OpDTypeError(TypeError, NotImplementedError):
  """A dtype the op is not defined for (bitwise ops of floats), where PyTorch has no kernel for it."""


class OpUnsupported(ValueError, NotImplementedError):
  """A mode the op does not have (pad's mode), or arguments it does not define, where PyTorch raises NotImplementedError or reads
  outside the tensor."""


class DTypeNameError(TypeError, AttributeError):
  """A dtype name that names none: a bad argument, and a failed lookup on `dtypes` (as in tinygrad)."""
