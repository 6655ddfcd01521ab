"""The workload catalog: named tensor programs with parameters, FLOP and byte counts, NumPy references and PyTorch baselines.

Adding a workload is one module here that calls `register(Workload(...))`, plus its name in the import list below."""
from __future__ import annotations

from tinytune.kernels import attention, bmm, conv2d, elementwise, layernorm, linear, matmul, mlp, reduce, softmax, train_step  # noqa: F401  (each registers itself)
from tinytune.kernels.workload import WORKLOADS, Params, Workload, get_workload, register

__all__ = ["Workload", "WORKLOADS", "Params", "get_workload", "register"]
