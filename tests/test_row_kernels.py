"""A row written after its statistics (softmax, layernorm) as one kernel on devices with workgroups: a workgroup per row, the
statistics' chain shared by its GROUP threads, every thread taking each total, then each writing its share of the row."""
from __future__ import annotations

import numpy as np
import pytest

from tinytune import Tensor, engine
from tinytune.codegen.cstyle import CUDARenderer
from tinytune.codegen.heuristic import default_opts
from tinytune.engine.schedule import create_schedule
from tinytune.helpers import Context
from tinytune.kernels import get_workload
from tinytune.kernels.workload import schedule
from tinytune.runtime import device_status

WORKGROUPS = [d for d in ("OPENCL", "EMU") if device_status(d) is None]


def softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def layernorm(x: np.ndarray) -> np.ndarray: return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)


CASES = {"softmax": (lambda t: t.softmax(-1), softmax), "log_softmax": (lambda t: t.log_softmax(-1), lambda x: np.log(softmax(x))),
         "layernorm": (lambda t: t.layernorm(), layernorm)}


@pytest.mark.parametrize("device", WORKGROUPS)
@pytest.mark.parametrize("shape", [(8, 256), (3, 1024), (5, 60), (2, 3, 128), (4, 7)])
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("noopt", [0, 1])
def test_row_kernel_matches_numpy(device: str, shape: tuple[int, ...], name: str, noopt: int) -> None:
  """One kernel, with the default opts (a GROUP of 64 threads sharing each row of 256, 15 of 60: no power of two, its first thread
  adds the partials) and with none (a workgroup of one thread a row); EMU checks every shared-memory read against the barriers."""
  fn, ref = CASES[name]
  x = np.random.randn(*shape).astype(np.float32)
  out = fn(Tensor(x, device=device))
  assert len(create_schedule(out.uop, device)[0]) == 1
  with Context(NOOPT=noopt): np.testing.assert_allclose(out.numpy(), ref(x), rtol=1e-4, atol=1e-5)


def test_gpu_softmax_reads_its_input_in_one_kernel() -> None:
  """Softmax and layernorm at 8192^2 on an H200's caps: three kernels before (the max, the sum of exps, the normalized row: the input
  read by each), one now, a workgroup of 256 threads per row writing float4s; softmax's exps kept in shared memory, 32 KiB a row,
  written by the sum's loop and read back by the row's (the input read twice, where the row's loop had read it a third time)."""
  for name in ("softmax", "layernorm"):
    w = get_workload(name)
    p = w.params({"rows": 8192, "cols": 8192})
    ins = [Tensor(np.zeros(s, np.float32), device="EMU") for s in w.inputs(p)]
    ((_, k),) = engine.kernels(schedule(w.build(p, *ins), "EMU")[0], "EMU")
    k.apply_opts(default_opts(k))
    assert k.launch_dims == (8192, 256) and k.row_dims == frozenset({1}), name
    src = CUDARenderer().render(k)
    # the statistics' loops read the input 4 times an iteration each; the row's loop reads float4s of it, or softmax's of row0
    assert src.count("data1[") == 8 and ("float row0[8192]" in src) == ("tt_f4_load(data1" not in src) == (name == "softmax"), name


def test_a_row_local_shares_the_group_threads() -> None:
  """LOCAL along a row written after its statistic splits the row over the GROUP threads: it needs them, and no more than they are."""
  from tinytune import KernelOptError, Opt, OptOps
  ((_, k),) = engine.kernels(Tensor(np.zeros((4, 64), np.float32), device="EMU").softmax(-1).uop, "EMU")
  with pytest.raises(KernelOptError, match="GROUP"): k.copy().apply_opt(Opt(OptOps.LOCAL, 1, 8))
  k.apply_opt(Opt(OptOps.GROUP, 0, 8))
  with pytest.raises(KernelOptError): k.copy().apply_opt(Opt(OptOps.LOCAL, 1, 16))
  k.apply_opt(Opt(OptOps.LOCAL, 1, 8))
  assert k.launch_dims == (4, 8)
