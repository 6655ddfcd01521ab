"""tinytune: a lazy-tensor kernel generator with an autotuning harness."""
from __future__ import annotations

from tinytune.api import tune
from tinytune.codegen.kernel import Kernel, KernelOptError
from tinytune.codegen.opts import Opt, OptOps
from tinytune.dtype import DType, dtypes
from tinytune.engine import GlobalCounters, TinyJit
from tinytune.helpers import Context
from tinytune.runtime import Device
from tinytune.tensor import Tensor
from tinytune.tensor.autograd import no_grad

__version__ = "0.1.0"
__all__ = ["Tensor", "tune", "no_grad", "dtypes", "DType", "Device", "GlobalCounters", "TinyJit", "Context", "Kernel", "KernelOptError", "Opt",
           "OptOps"]
