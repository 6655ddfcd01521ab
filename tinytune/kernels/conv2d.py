"""2-d convolution, NCHW."""
from __future__ import annotations

from typing import Any

import numpy as np

from tinytune.kernels.workload import Params, Workload, numbers, register


def out_size(p: Params) -> int: return (p["size"] + 2 * p["padding"] - p["kernel"]) // p["stride"] + 1


def reference(p: Params, x: np.ndarray, w: np.ndarray) -> np.ndarray:
  k, s, pad, o = p["kernel"], p["stride"], p["padding"], out_size(p)
  xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::s, ::s][:, :, :o, :o]
  return np.einsum("nchwij,ocij->nohw", win, w, optimize=True)


def _torch(p: Params, x: Any, w: Any) -> Any:
  import torch.nn.functional as F
  return F.conv2d(x, w, stride=p["stride"], padding=p["padding"])


conv2d = register(Workload(
  "conv2d", "2-d convolution of a (batch, cin, size, size) input with (cout, cin, kernel, kernel) weights",
  {"batch": 4, "cin": 32, "cout": 32, "size": 32, "kernel": 3, "stride": 1, "padding": 1},
  inputs=lambda p: [(p["batch"], p["cin"], p["size"], p["size"]), (p["cout"], p["cin"], p["kernel"], p["kernel"])],
  build=lambda p, x, w: x.conv2d(w, stride=p["stride"], padding=p["padding"]),
  reference=reference,
  flops=lambda p: 2 * p["batch"] * p["cout"] * p["cin"] * p["kernel"] ** 2 * out_size(p) ** 2,
  output=lambda p: (p["batch"], p["cout"], out_size(p), out_size(p)),
  torch=_torch,
  help={"cin": "input channels", "cout": "output channels", "size": "input height and width", "kernel": "kernel height and width"},
  may_be_zero=("padding",),
  takes=numbers,
  gpu={"batch": 32, "cin": 64, "cout": 64, "size": 56}))
