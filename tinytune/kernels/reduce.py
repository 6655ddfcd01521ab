"""Sum over one axis."""
from __future__ import annotations

from tinytune.kernels.workload import Workload, numbers, register

reduce = register(Workload(
  "reduce", "sum over one axis of (rows, cols)", {"rows": 1024, "cols": 1024, "axis": 1},
  inputs=lambda p: [(p["rows"], p["cols"])],
  build=lambda p, x: x.sum(p["axis"]),
  reference=lambda p, x: x.sum(p["axis"]),
  flops=lambda p: p["rows"] * p["cols"],
  output=lambda p: (p["cols"] if p["axis"] == 0 else p["rows"],),
  torch=lambda p, x: x.sum(p["axis"]),
  help={"axis": "0 sums the rows, 1 the columns"},
  may_be_zero=("axis",),
  takes=numbers,
  gpu={"rows": 8192, "cols": 8192}))
