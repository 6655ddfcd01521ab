"""Neural-network functions: matmul, convolution, pooling, normalization, softmax, dropout."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tinytune.dtype import dtypes, least_upper
from tinytune.helpers import prod
from tinytune.shape import View
from tinytune.tensor import autograd
from tinytune.tensor.movement import view_uop

if TYPE_CHECKING:
  from tinytune.tensor import Tensor


def dropout(self: Tensor, p: float = 0.5) -> Tensor:
  """While Tensor.training: zero each element with probability p and scale the rest by 1/(1-p); otherwise the tensor itself."""
  if not 0 <= p <= 1: raise ValueError(f"dropout probability {p} is not in [0, 1]")
  if not Tensor.training or p == 0: return self
  if p == 1: return self.zeros_like()
  return self * (Tensor.rand(*self.shape, device=self.device) >= p).cast(self.dtype) * (1 / (1 - p))


def softmax(self: Tensor, axis: int = -1) -> Tensor:
  x = self._float()
  e = (x - x.max(axis, keepdim=True)).exp()
  return e / e.sum(axis, keepdim=True)


def log_softmax(self: Tensor, axis: int = -1) -> Tensor:
  x = self._float()
  shifted = x - x.max(axis, keepdim=True)
  return shifted - shifted.exp().sum(axis, keepdim=True).log()


def matmul(self: Tensor, w: Tensor) -> Tensor:
  if not isinstance(w, Tensor): raise TypeError(f"matmul needs a Tensor, got {type(w).__name__}")
  if self.ndim == 0 or w.ndim == 0: raise ValueError("matmul needs tensors of at least one dim")
  x, y = (self.unsqueeze(0) if self.ndim == 1 else self), (w.unsqueeze(-1) if w.ndim == 1 else w)
  if x.shape[-1] != y.shape[-2]: raise ValueError(f"matmul shapes {self.shape} and {w.shape} do not match (inner {x.shape[-1]} != {y.shape[-2]})")
  bx, by = x.shape[:-2], y.shape[:-2]
  if any(a != b and 1 not in (a, b) for a, b in zip(bx[::-1], by[::-1])):
    raise ValueError(f"matmul shapes {self.shape} and {w.shape}: batch dims {bx} and {by} do not broadcast")
  ret = (x.unsqueeze(-2) * y.transpose(-1, -2).unsqueeze(-3)).sum(-1, dtype=least_upper(x.dtype, y.dtype))
  if self.ndim == 1: ret = ret.squeeze(-2)
  return ret.squeeze(-1) if w.ndim == 1 else ret


def dot(self: Tensor, w: Tensor) -> Tensor: return self.matmul(w)


def _windows(self: Tensor, k: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int]) -> Tensor:
  """(..., H, W) -> (..., OH, OW, KH, KW) sliding windows as one strided view."""
  *lead, h, w = self.shape
  oh, ow = (h - dilation[0] * (k[0] - 1) - 1) // stride[0] + 1, (w - dilation[1] * (k[1] - 1) - 1) // stride[1] + 1
  if oh <= 0 or ow <= 0: raise ValueError(f"window {k} with dilation {dilation} does not fit input {h}x{w}")
  lead_strides = [prod(self.shape[i + 1:]) for i in range(len(lead))]
  view = View.create((*lead, oh, ow, *k), (*lead_strides, stride[0] * w, stride[1], dilation[0] * w, dilation[1]))
  windows = view_uop(self.uop, lambda v: None if not v.contiguous else View.create(view.shape, view.strides, v.offset), view.shape)
  ret = Tensor(windows, device=self.device)
  return autograd.record(ret, (self,), autograd.window_rule(self, k, stride, dilation)) if autograd.tracking(self) else ret


def conv2d(self: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Tensor:
  if self.ndim != 4 or weight.ndim != 4:
    raise ValueError(f"conv2d needs a (N, C, H, W) input and (O, C/groups, KH, KW) weight, got {self.shape} and {weight.shape}")
  (n, cin, _, _), (cout, cg, kh, kw) = self.shape, weight.shape
  if not isinstance(groups, int) or groups < 1: raise ValueError(f"conv2d groups is a positive int, got {groups!r}")
  if cin % groups or cout % groups or cin // groups != cg:
    raise ValueError(f"conv2d: {cin} input channels, weight {weight.shape} and groups {groups} do not match")
  if bias is not None and bias.shape != (cout,): raise ValueError(f"conv2d bias needs shape ({cout},), got {bias.shape}")
  st, pd, dl = (_pair(stride, 1), _pair(padding), _pair(dilation, 1))
  x = self.pad(((0, 0), (0, 0), (pd[0], pd[0]), (pd[1], pd[1])))._windows((kh, kw), st, dl)  # (N, C, OH, OW, KH, KW)
  oh, ow = x.shape[2:4]
  x = x.reshape(n, groups, 1, cg, oh, ow, kh, kw)
  wt = weight.reshape(1, groups, cout // groups, cg, 1, 1, kh, kw)
  ret = (x * wt).permute(0, 1, 2, 4, 5, 3, 6, 7).sum((5, 6, 7), dtype=least_upper(x.dtype, wt.dtype)).reshape(n, cout, oh, ow)
  return ret if bias is None else ret + bias.reshape(1, cout, 1, 1)


def max_pool2d(self: Tensor, kernel_size: Any = 2, stride: Any = None, padding: Any = 0, dilation: Any = 1) -> Tensor:
  if self.ndim < 2: raise ValueError(f"max_pool2d needs a tensor of at least 2 dims (..., H, W), got {self.shape}")
  k, pd = _pair(kernel_size, 1), _pair(padding)
  fill = -math.inf if self.dtype.is_float else dtypes.min(self.dtype)
  x = self.pad(((0, 0),) * (self.ndim - 2) + ((pd[0], pd[0]), (pd[1], pd[1])), value=fill)
  return x._windows(k, _pair(stride, 1) if stride is not None else k, _pair(dilation, 1)).max((-2, -1))


def avg_pool2d(self: Tensor, kernel_size: Any = 2, stride: Any = None, padding: Any = 0) -> Tensor:
  if self.ndim < 2: raise ValueError(f"avg_pool2d needs a tensor of at least 2 dims (..., H, W), got {self.shape}")
  k, pd = _pair(kernel_size, 1), _pair(padding)
  x = self.pad(((0, 0),) * (self.ndim - 2) + ((pd[0], pd[0]), (pd[1], pd[1])))
  return x._windows(k, _pair(stride, 1) if stride is not None else k, (1, 1)).mean((-2, -1))


def layernorm(self: Tensor, axis: Any = -1, eps: float = 1e-5, weight: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
  x = self._float()
  y = (x - x.mean(axis, keepdim=True)) * (x.var(axis, keepdim=True, correction=0) + eps).rsqrt()
  if weight is not None: y = y * weight
  return y if bias is None else y + bias


def _pair(x: Any, lo: int = 0) -> tuple[int, int]:
  ret = tuple(x) if isinstance(x, (tuple, list)) else (x, x)
  if len(ret) != 2 or not all(isinstance(v, int) and v >= lo for v in ret): raise ValueError(f"expected an int >= {lo} or a pair of them, got {x!r}")
  return ret  # type: ignore[return-value]


def scaled_dot_product_attention(self: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, enable_gqa: bool = False) -> Tensor:
  """softmax(self @ key^T / sqrt(head size) + mask) @ value for queries self (..., L, E), keys (..., S, E) and values (..., S, Ev).
  A bool attn_mask keeps the scores where it is True, a float one is added; is_causal keeps query i to keys 0..i. dropout_p drops
  attention weights while Tensor.training. enable_gqa shares each key and value head among a group of query heads (dim -3)."""
  if is_causal and attn_mask is not None: raise ValueError("scaled_dot_product_attention takes attn_mask or is_causal, not both")
  if self.ndim < 2 or key.ndim < 2 or value.ndim < 2:
    raise ValueError(f"scaled_dot_product_attention needs queries, keys and values of at least 2 dims, got {self.shape}, {key.shape}, {value.shape}")
  if enable_gqa and self.ndim >= 3 and key.ndim >= 3 and key.shape[-3] != self.shape[-3]:
    heads, kv = self.shape[-3], key.shape[-3]
    if heads % kv: raise ValueError(f"scaled_dot_product_attention: {heads} query heads are not a multiple of {kv} key heads")
    def share(t: Tensor) -> Tensor:  # (..., kv, S, E) -> (..., kv, group, S, E) -> (..., heads, S, E)
      *lead, s, e = t.shape
      return t.unsqueeze(-3).expand(*lead, heads // kv, s, e).reshape(*lead[:-1], heads, s, e)
    key, value = share(key), share(value)
  scores = self.matmul(key.transpose(-2, -1)) * (1 / math.sqrt(self.shape[-1]))
  if is_causal:
    n, m = scores.shape[-2:]
    attn_mask = Tensor.arange(n, device=self.device).reshape(n, 1) >= Tensor.arange(m, device=self.device).reshape(1, m)
  if attn_mask is not None: scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype == dtypes.bool else scores + attn_mask
  return scores.softmax(-1).dropout(dropout_p).matmul(value)
