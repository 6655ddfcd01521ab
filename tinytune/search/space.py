"""The action space: the valid next opts of a kernel on its device, bounded by the device's limits."""
from __future__ import annotations

from tinytune.codegen.kernel import Kernel, KernelOptError, candidate_opts
from tinytune.codegen.opts import Opt, OptOps

SEARCH_AMOUNTS = (2, 3, 4, 5, 6, 7, 8, 16, 32)  # register splits worth compiling; larger ones only bloat the code


def actions(kernel: Kernel) -> list[Opt]:
  """Every opt that applies to `kernel` as it stands (opts already applied included)."""
  ret = []
  for opt in candidate_opts(kernel):
    if opt.op in (OptOps.UPCAST, OptOps.UNROLL) and opt.arg not in SEARCH_AMOUNTS: continue
    try: kernel.copy().apply_opt(opt)
    except KernelOptError: continue
    ret.append(opt)
  return ret
