"""Layers: objects that hold parameters (Tensors that require grad) and are called on an input. Initialized as PyTorch's defaults,
with PyTorch's parameter names, so a torch state dict loads into them."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from tinytune.dtype import dtypes
from tinytune.helpers import prod
from tinytune.tensor import Tensor
from tinytune.tensor.autograd import no_grad
from tinytune.tensor.checks import checked


def _param(t: Tensor) -> Tensor: return t.requires_grad_()
def _full(shape: tuple[int, ...], value: float) -> Tensor: return _param(Tensor(np.full(shape, value, dtypes.default_float.np)))
def _uniform(shape: tuple[int, ...], bound: float) -> Tensor: return _param(Tensor.uniform(*shape, low=-bound, high=bound))


def _kaiming_uniform(shape: tuple[int, ...], fan_in: int, a: float = math.sqrt(5)) -> Tensor:
  """PyTorch's kaiming_uniform_ (leaky-relu gain for slope a); with a = sqrt(5) the bound is 1/sqrt(fan_in)."""
  return _uniform(shape, math.sqrt(2 / (1 + a * a)) * math.sqrt(3 / fan_in))


def _tuple(x: Any, n: int) -> tuple[int, ...]: return tuple(x) if isinstance(x, (tuple, list)) else (x,) * n


def _set(t: Tensor, value: Tensor) -> None:
  """Write the value into t's memory now (in place: a TinyJit replay of a training step updates the running statistics)."""
  t.assign(value.cast(t.dtype).detach()).realize()


class Linear:
  """y = x @ weight.T + bias, weight (out_features, in_features)."""
  def __init__(self, in_features: int, out_features: int, bias: bool = True):
    self.weight = _kaiming_uniform((out_features, in_features), in_features)
    self.bias = _uniform((out_features,), 1 / math.sqrt(in_features)) if bias else None

  def __call__(self, x: Tensor) -> Tensor:
    ret = x @ self.weight.T
    return ret if self.bias is None else ret + self.bias


class Conv2d:
  """Convolution over the spatial dims of (N, C, *spatial), as many as kernel_size has (2 for an int). padding: an int, one per dim,
  tinygrad's two per dim (last dim first), "valid" or "same" (stride 1)."""
  def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
               groups: int = 1, bias: bool = True, dims: int = 2):
    self.kernel_size = _tuple(kernel_size, dims)
    if in_channels % groups or out_channels % groups:
      raise ValueError(f"{type(self).__name__}: {in_channels} in and {out_channels} out channels do not split into {groups} groups")
    self.stride, self.dilation, self.groups = stride, dilation, groups
    self.padding = self._padding(padding)
    fan_in = in_channels // groups * prod(self.kernel_size)
    self.weight = _kaiming_uniform((out_channels, in_channels // groups, *self.kernel_size), fan_in)
    self.bias = _uniform((out_channels,), 1 / math.sqrt(fan_in)) if bias else None

  def _padding(self, padding: Any) -> Any:
    if padding == "valid": return 0
    if padding != "same": return padding
    if _tuple(self.stride, len(self.kernel_size)) != (1,) * len(self.kernel_size): raise ValueError("padding='same' needs stride 1")
    total = [dl * (k - 1) for dl, k in zip(_tuple(self.dilation, len(self.kernel_size)), self.kernel_size)]
    return [p for t in reversed(total) for p in (t // 2, t - t // 2)]  # torch puts the odd one after

  def __call__(self, x: Tensor) -> Tensor: return x.conv2d(self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv1d(Conv2d):
  """Convolution over the last dim of (N, C, L)."""
  def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
               groups: int = 1, bias: bool = True):
    super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, dims=1)


class ConvTranspose2d:
  """The transpose of Conv2d, weight (in_channels, out_channels/groups, *kernel_size)."""
  def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0, output_padding: Any = 0,
               groups: int = 1, bias: bool = True, dilation: Any = 1):
    self.kernel_size = _tuple(kernel_size, 2)
    if in_channels % groups or out_channels % groups:
      raise ValueError(f"ConvTranspose2d: {in_channels} in and {out_channels} out channels do not split into {groups} groups")
    self.stride, self.padding, self.output_padding, self.groups, self.dilation = stride, padding, output_padding, groups, dilation
    fan_in = out_channels // groups * prod(self.kernel_size)  # torch computes the fan from the weight's dim 1
    self.weight = _kaiming_uniform((in_channels, out_channels // groups, *self.kernel_size), fan_in)
    self.bias = _uniform((out_channels,), 1 / math.sqrt(fan_in)) if bias else None

  def __call__(self, x: Tensor) -> Tensor:
    return x.conv_transpose2d(self.weight, self.bias, self.stride, self.padding, self.output_padding, self.groups, self.dilation)


class BatchNorm:
  """Normalize each channel (dim 1) of (N, C, *) by the batch's statistics while Tensor.training, by the running ones otherwise.
  Training updates running_mean and running_var (the unbiased variance) in place: new = (1 - momentum) * old + momentum * batch,
  or the cumulative average when momentum is None."""
  def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True, track_running_stats: bool = True):
    self.num_features, self.eps, self.momentum, self.track_running_stats = num_features, eps, momentum, track_running_stats
    self.weight: Tensor | None = _full((num_features,), 1) if affine else None
    self.bias: Tensor | None = _full((num_features,), 0) if affine else None
    if track_running_stats:
      self.running_mean = Tensor(np.zeros(num_features, dtypes.default_float.np))
      self.running_var = Tensor(np.ones(num_features, dtypes.default_float.np))
      self.num_batches_tracked = Tensor(np.zeros((), np.int64))

  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim < 2 or x.shape[1] != self.num_features:
      raise ValueError(f"BatchNorm({self.num_features}) needs a (N, {self.num_features}, ...) input, got {x.shape}")
    if batch := Tensor.training or not self.track_running_stats:
      axes = tuple(i for i in range(x.ndim) if i != 1)
      mean, var = x.mean(axes), x.var(axes, correction=0)
      if Tensor.training and self.track_running_stats: self._update(mean, var, x.numel() // self.num_features)
    else: mean, var = self.running_mean, self.running_var
    return x.batchnorm(self.weight, self.bias, mean, (var + self.eps).rsqrt(), batch=batch)

  def _update(self, mean: Tensor, var: Tensor, n: int) -> None:
    with no_grad():
      _set(self.num_batches_tracked, self.num_batches_tracked + 1)
      m = self.momentum if self.momentum is not None else 1 / self.num_batches_tracked.item()
      _set(self.running_mean, self.running_mean * (1 - m) + mean.detach() * m)
      _set(self.running_var, self.running_var * (1 - m) + var.detach() * (m * n / max(n - 1, 1)))


BatchNorm1d = BatchNorm2d = BatchNorm3d = BatchNorm


class LayerNorm:
  """Normalize over the last len(normalized_shape) dims, then scale by weight and shift by bias."""
  def __init__(self, normalized_shape: int | tuple[int, ...], eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True):
    self.normalized_shape, self.eps = _tuple(normalized_shape, 1), eps
    self.weight = _full(self.normalized_shape, 1) if elementwise_affine else None
    self.bias = _full(self.normalized_shape, 0) if elementwise_affine and bias else None

  def __call__(self, x: Tensor) -> Tensor:
    n = len(self.normalized_shape)
    if x.shape[-n:] != self.normalized_shape: raise ValueError(f"LayerNorm{self.normalized_shape} does not fit an input of shape {x.shape}")
    return x.layernorm(tuple(range(-n, 0)), self.eps, self.weight, self.bias)


class RMSNorm:
  """x / sqrt(mean(x^2) + eps) * weight over the last len(normalized_shape) dims; eps None is the input dtype's machine epsilon, as torch."""
  def __init__(self, normalized_shape: int | tuple[int, ...], eps: float | None = None, elementwise_affine: bool = True):
    self.normalized_shape, self.eps = _tuple(normalized_shape, 1), eps
    self.weight = _full(self.normalized_shape, 1) if elementwise_affine else None

  def __call__(self, x: Tensor) -> Tensor:
    n = len(self.normalized_shape)
    if x.shape[-n:] != self.normalized_shape: raise ValueError(f"RMSNorm{self.normalized_shape} does not fit an input of shape {x.shape}")
    x = x._float()
    eps = self.eps if self.eps is not None else float(np.finfo(x.dtype.np).eps)
    ret = x * (x.square().mean(tuple(range(-n, 0)), keepdim=True) + eps).rsqrt()
    return ret if self.weight is None else ret * self.weight


class GroupNorm:
  """Normalize each of num_groups groups of channels of (N, C, *) together, then scale and shift each channel."""
  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
    if num_channels % num_groups: raise ValueError(f"GroupNorm: {num_channels} channels do not split into {num_groups} groups")
    self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
    self.weight: Tensor | None = _full((num_channels,), 1) if affine else None
    self.bias: Tensor | None = _full((num_channels,), 0) if affine else None

  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim < 2 or x.shape[1] != self.num_channels:
      raise ValueError(f"GroupNorm needs a (N, {self.num_channels}, ...) input, got {x.shape}")
    y = x.reshape(x.shape[0], self.num_groups, -1).layernorm(-1, self.eps).reshape(x.shape)
    if self.weight is None or self.bias is None: return y
    shape = (1, self.num_channels) + (1,) * (x.ndim - 2)
    return y * self.weight.reshape(shape) + self.bias.reshape(shape)


class InstanceNorm(GroupNorm):
  """Normalize each channel of each sample of (N, C, *) alone; no affine parameters unless asked, as torch."""
  def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = False):
    super().__init__(num_features, num_features, eps, affine)


class Embedding:
  """Row idx of weight (num_embeddings, embedding_dim) for each int in idx: a one-hot comparison times the weight, so it fuses."""
  def __init__(self, num_embeddings: int, embedding_dim: int):
    self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
    self.weight = _param(Tensor.randn(num_embeddings, embedding_dim))

  def __call__(self, idx: Tensor) -> Tensor:
    if not isinstance(idx, Tensor) or idx.dtype.is_float or idx.dtype == dtypes.bool:
      raise TypeError(f"Embedding takes an int Tensor of indices, got {idx.dtype.name if isinstance(idx, Tensor) else type(idx).__name__}")
    idx = checked(idx, 0, self.num_embeddings, lambda v: IndexError("index out of range in self"))
    one_hot = idx.unsqueeze(-1) == Tensor.arange(self.num_embeddings, dtype=idx.dtype, device=idx.device)
    return one_hot.cast(self.weight.dtype) @ self.weight


class LSTMCell:
  """One step of an LSTM: (x, (h, c)) -> (h', c'), gates in torch's order (input, forget, cell, output); h and c start at zeros."""
  def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
    self.hidden_size, bound = hidden_size, 1 / math.sqrt(hidden_size)
    self.weight_ih, self.weight_hh = _uniform((4 * hidden_size, input_size), bound), _uniform((4 * hidden_size, hidden_size), bound)
    self.bias_ih: Tensor | None = _uniform((4 * hidden_size,), bound) if bias else None
    self.bias_hh: Tensor | None = _uniform((4 * hidden_size,), bound) if bias else None

  def __call__(self, x: Tensor, hc: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    if hc is None: hc = (Tensor.zeros(*x.shape[:-1], self.hidden_size, device=x.device),) * 2
    h, c = hc
    gates = x @ self.weight_ih.T + h @ self.weight_hh.T
    if self.bias_ih is not None and self.bias_hh is not None: gates = gates + self.bias_ih + self.bias_hh
    n = self.hidden_size
    i, f, g, o = (gates[..., k * n:(k + 1) * n] for k in range(4))
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()
    return o.sigmoid() * c.tanh(), c
