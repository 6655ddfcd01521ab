"""One training step: forward, cross-entropy, backward and an Adam update (lr 1e-3), built as a training loop builds it and
realized together (`loss.realize(*opt.schedule_step())`), so a search tunes the backward's and the optimizer's kernels, the
very ones a jitted training step runs.

model=0 (or model=mlp) is the MLP din -> hidden -> classes with a ReLU; model=1 (model=cnn) seed 004's beautiful_mnist CNN on
size x size images: two 5x5 convs of `channels`, batchnorm, max-pool, two 3x3 convs of 2 * channels, batchnorm, max-pool, a
linear layer (ReLU after each conv; batchnorm by the batch's statistics: running statistics are not part of the step). The inputs are the batch, its
one-hot targets and the parameters (scaled as PyTorch initializes them); the outputs, which the reference gives flattened end
to end, are the loss, Adam's b1**t and b2**t, then each parameter's first moment, second moment and updated value."""
from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from tinytune.dtype import DType
from tinytune.kernels.workload import Params, Workload, register
from tinytune.tensor import Tensor

LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8


def pooled(p: Params) -> int:
  """The CNN's height and width before its linear layer."""
  return ((p["size"] - 8) // 2 - 4) // 2


def param_shapes(p: Params) -> list[tuple[int, ...]]:
  c, k = p["classes"], p["channels"]
  if p["model"] == 0: return [(p["din"], p["hidden"]), (p["hidden"],), (p["hidden"], c), (c,)]
  return [(k, 1, 5, 5), (k,), (k, k, 5, 5), (k,), (k,), (k,), (2 * k, k, 3, 3), (2 * k,), (2 * k, 2 * k, 3, 3), (2 * k,), (2 * k,), (2 * k,),
          (2 * k * pooled(p) ** 2, c), (c,)]


def input_shapes(p: Params) -> list[tuple[int, ...]]:
  if p["model"] not in (0, 1): raise ValueError(f"train_step model={p['model']}: 0 (mlp) is the MLP, 1 (cnn) the CNN")
  if p["model"] == 1 and pooled(p) < 1: raise ValueError(f"train_step model=1 needs size >= 20 (two convs and pools), got {p['size']}")
  x = (p["batch"], p["din"]) if p["model"] == 0 else (p["batch"], 1, p["size"], p["size"])
  return [x, (p["batch"], p["classes"]), *param_shapes(p)]


def prepare(p: Params, arrays: list[np.ndarray]) -> list[np.ndarray]:
  """One-hot targets at each row's largest value; weights and biases over sqrt(fan in), batchnorm scales near 1, shifts near 0."""
  x, y, *weights = arrays
  targets = np.eye(p["classes"])[y.argmax(1)]
  scaled, fan_in = [], 1
  for i, w in enumerate(weights):
    if w.ndim > 1: fan_in = int(np.prod(w.shape[1:])) if w.ndim == 4 else w.shape[0]
    if p["model"] == 1 and i in (4, 10): scaled.append(1 + 0.1 * w)  # a batchnorm's scale
    elif p["model"] == 1 and i in (5, 11): scaled.append(0.1 * w)  # and its shift
    else: scaled.append(w / np.sqrt(fan_in))
  return [x, targets, *scaled]


def forward(model: int, x: Tensor, w: list[Tensor]) -> Tensor:
  if model == 0: return (x @ w[0] + w[1]).relu() @ w[2] + w[3]

  def batchnorm(h: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
    return h.batchnorm(scale, shift, h.mean((0, 2, 3)), (h.var((0, 2, 3), correction=0) + 1e-5).rsqrt(), batch=True)
  for i in (0, 6):
    x = x.conv2d(w[i], w[i + 1]).relu().conv2d(w[i + 2], w[i + 3]).relu()
    x = batchnorm(x, w[i + 4], w[i + 5]).max_pool2d(2)  # type: ignore[assignment]
  return x.flatten(1) @ w[12] + w[13]


class Trainer:
  """A model's parameters (these tensors, trained in place) and its Adam optimizer: `step(x, y)` is one step's lazy outputs."""

  def __init__(self, model: int, weights: list[Tensor]):
    from tinytune.nn.optim import Adam
    self.model, self.params = model, [w.requires_grad_() for w in weights]
    self.opt = Adam(self.params, lr=LR, b1=B1, b2=B2, eps=EPS)

  def step(self, x: Tensor, y: Tensor) -> tuple[Tensor, ...]:
    self.opt.zero_grad()
    loss = forward(self.model, x, self.params).cross_entropy(y)
    loss.backward()
    return (loss, *self.opt.schedule_step())


def reference(p: Params, x: np.ndarray, y: np.ndarray, *weights: np.ndarray) -> np.ndarray:
  """NumPy for the MLP: forward, backward and Adam's first step. The CNN's is PyTorch's step (torch needed), as a NumPy
  convolution, pooling and batchnorm with their gradients would be a second implementation as long as the workload."""
  if p["model"] == 1:
    import torch
    return torch_step(p, *[torch.from_numpy(np.asarray(a, np.float32)) for a in (x, y, *weights)], fresh=True).numpy()
  x, y, w1, b1, w2, b2 = [a.astype(np.float64) for a in (x, y, *weights)]
  h = x @ w1 + b1
  logits = np.maximum(h, 0) @ w2 + b2
  z = logits - logits.max(1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(1, keepdims=True))
  loss = -(y * logp).sum() / len(x)
  dlogits = (np.exp(logp) * y.sum(1, keepdims=True) - y) / len(x)
  dh = (dlogits @ w2.T) * (h > 0)
  grads = [x.T @ dh, dh.sum(0), np.maximum(h, 0).T @ dlogits, dlogits.sum(0)]
  parts = [np.array([loss, B1, B2])]  # b1**t and b2**t after the first step
  for w, g in zip((w1, b1, w2, b2), grads):
    m, v = (1 - B1) * g, (1 - B2) * g * g
    parts += [m.ravel(), v.ravel(), (w - LR * (m / (1 - B1)) / (np.sqrt(v / (1 - B2)) + EPS)).ravel()]
  return np.concatenate(parts).astype(np.float32)


def torch_forward(model: int, x: Any, w: list[Any]) -> Any:
  import torch.nn.functional as F
  if model == 0: return (x @ w[0] + w[1]).relu() @ w[2] + w[3]
  for i in (0, 6):
    x = F.conv2d(F.conv2d(x, w[i], w[i + 1]).relu(), w[i + 2], w[i + 3]).relu()
    x = F.max_pool2d(F.batch_norm(x, None, None, w[i + 4], w[i + 5], training=True, eps=1e-5), 2)
  return x.flatten(1) @ w[12] + w[13]


_torch_trainer: list[Any] = []  # the baseline's (inputs, parameters, optimizer): its later calls go on training, as tinytune's do


def torch_step(p: Params, x: Any, y: Any, *weights: Any, fresh: bool = False) -> Any:
  """The same step in PyTorch eager (autograd and torch.optim.Adam), flattened as `reference`; the baseline's first call starts
  from the inputs, later calls on the same tensors take further steps."""
  import torch
  with torch.inference_mode(False), torch.enable_grad():
    if fresh or not _torch_trainer or any(a is not b for a, b in zip(_torch_trainer[0], (x, y, *weights))):
      params = [w.detach().clone().requires_grad_() for w in weights]
      _torch_trainer[:] = [(x, y, *weights), params, torch.optim.Adam(params, lr=LR, betas=(B1, B2), eps=EPS)]
    _, params, opt = _torch_trainer
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(torch_forward(p["model"], x, params), y)
    loss.backward()
    opt.step()
    t = float(opt.state[params[0]]["step"])
    parts = [loss.detach().reshape(1), torch.tensor([B1 ** t, B2 ** t], dtype=loss.dtype)]
    for w in params: parts += [opt.state[w]["exp_avg"].flatten(), opt.state[w]["exp_avg_sq"].flatten(), w.detach().flatten()]
    return torch.cat(parts)


def flops(p: Params) -> int:
  """About: the forward's multiply-adds three times (forward, and the gradients of inputs and weights), Adam's ~10 per parameter."""
  n = sum(int(np.prod(s)) for s in param_shapes(p))
  if p["model"] == 0: return 3 * 2 * p["batch"] * (p["din"] * p["hidden"] + p["hidden"] * p["classes"]) + 10 * n
  k, s = p["channels"], p["size"]
  convs = [(k, 1, 5, s - 4), (k, k, 5, s - 8), (2 * k, k, 3, (s - 8) // 2 - 2), (2 * k, 2 * k, 3, (s - 8) // 2 - 4)]
  fwd = sum(2 * cout * cin * kk * kk * o * o for cout, cin, kk, o in convs) + 2 * 2 * k * pooled(p) ** 2 * p["classes"]
  return 3 * p["batch"] * fwd + 10 * n


def holds_eps(dtype: DType) -> bool:
  """A float whose normal numbers reach down to Adam's eps (float16's stop at 6e-5: its second moments vanish and updates blow up)."""
  return dtype.is_float and float(ml_dtypes.finfo(dtype.np).tiny) < EPS


train_step = register(Workload(
  "train_step", "one training step (forward, cross-entropy, backward, Adam) of an MLP (model=0) or beautiful_mnist's CNN (model=1)",
  {"batch": 128, "din": 784, "hidden": 128, "classes": 10, "model": 0, "size": 28, "channels": 32},
  inputs=input_shapes,
  build=lambda p, x, y, *weights: Trainer(p["model"], list(weights)).step(x, y),
  reference=reference,
  flops=flops,
  output=lambda p: (3 + 3 * sum(int(np.prod(s)) for s in param_shapes(p)),),
  torch=torch_step,
  help={"din": "MLP input features", "hidden": "MLP hidden units", "model": "0 (mlp): the MLP, 1 (cnn): the CNN (its reference needs PyTorch)",
        "size": "CNN image height and width (at least 20)", "channels": "CNN channels of the first two convs (the last two have twice)"},
  may_be_zero=("model",),
  prepare=prepare,
  takes=holds_eps,
  names={"model": {"mlp": 0, "cnn": 1}},
))
