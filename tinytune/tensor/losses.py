"""Losses: cross-entropy over classes, negative log likelihood and binary cross-entropy, each reduced by `reduction` ("none", "sum" or
"mean"). Class targets pick their class with a one-hot built by comparing with arange, so a loss fuses with the log_softmax before it."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tinytune.dtype import dtypes
from tinytune.errors import OpError
from tinytune.tensor.checks import require

if TYPE_CHECKING:
  from tinytune.tensor import Tensor, TensorLike

REDUCTIONS = ("none", "sum", "mean")


def cross_entropy(self: Tensor, Y: Tensor, reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
  """Cross-entropy of logits self (classes on dim 1, or dim 0 of a 1-d tensor) against class indices Y, or against class probabilities Y
  of self's shape. An index out of range raises IndexError, as in torch (-100, torch's ignore_index, picks nothing)."""
  _check(reduction, label_smoothing)
  dim = 0 if self.ndim == 1 else 1
  if self.ndim == 0: raise ValueError("cross_entropy needs logits with a class dim, got a 0-d tensor")
  if Y.dtype.is_float and Y.shape != self.shape:
    raise OpError(f"cross_entropy: class probabilities Y need the logits' shape {self.shape}, got {Y.shape}")
  def fn(x: Tensor) -> Tensor:
    logp, n = x.log_softmax(dim), x.shape[dim]
    if Y.dtype.is_float: return -(logp * (Y * (1 - label_smoothing) + label_smoothing / n)).sum(dim)
    return -_smoothed(_pick(logp, _targets(Y, x, dim, "cross_entropy"), dim), logp, dim, label_smoothing)
  return _reduce(self._in_f32(fn), reduction)


def nll_loss(self: Tensor, Y: Tensor, weight: Tensor | None = None, ignore_index: int | None = None, reduction: str = "mean") -> Tensor:
  """Negative log likelihood of log-probabilities self (classes on dim 1, or dim 0 of a 1-d tensor) at class indices Y, times the
  class weight. "mean" divides by the summed weights of the targets taken; a target out of range (like torch's -100) is left out."""
  _check(reduction)
  if self.ndim == 0: raise ValueError("nll_loss needs log-probabilities with a class dim, got a 0-d tensor")
  dim = 0 if self.ndim == 1 else 1
  hot = _targets(Y, self, dim, "nll_loss", -100 if ignore_index is None else ignore_index)
  if weight is not None and weight.shape != (self.shape[dim],):
    raise ValueError(f"nll_loss weight needs shape ({self.shape[dim]},), one per class, got {weight.shape}")
  w = 1.0 if weight is None else weight.reshape(tuple(-1 if i == dim else 1 for i in range(self.ndim)))
  taken = hot.where(w, 0.0).sum(dim)
  if ignore_index is not None: taken = (Y != ignore_index).where(taken, 0.0)
  nll = -_pick(self._float(), hot, dim) * taken
  return nll.sum() / taken.sum() if reduction == "mean" else _reduce(nll, reduction)


def binary_crossentropy(self: Tensor, Y: TensorLike, reduction: str = "mean") -> Tensor:
  """Binary cross-entropy of probabilities self against targets Y; each log is at least -100, as in torch, so 0 and 1 give finite losses."""
  _check(reduction)
  return _reduce(self._in_f32(lambda p: -(Y * p.log().maximum(-100) + (1 - Y) * (1 - p).log().maximum(-100))), reduction)


def binary_crossentropy_logits(self: Tensor, Y: TensorLike, reduction: str = "mean", pos_weight: TensorLike | None = None) -> Tensor:
  """Binary cross-entropy of sigmoid(self) against Y, from logsigmoid so that large logits stay finite; pos_weight scales the positive term."""
  _check(reduction)
  pw = 1.0 if pos_weight is None else pos_weight
  return _reduce(self._in_f32(lambda x: -(pw * Y * x.logsigmoid() + (1 - Y) * (-x).logsigmoid())), reduction)


def sparse_categorical_crossentropy(self: Tensor, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0,
                                    reduction: str = "mean") -> Tensor:
  """Cross-entropy of logits self with the classes on the last dim against class indices Y (self's shape without its last dim); targets
  equal to ignore_index count for nothing, and "mean" divides by the targets not ignored."""
  _check(reduction, label_smoothing)
  if self.ndim == 0: raise ValueError("sparse_categorical_crossentropy needs logits with a class dim, got a 0-d tensor")
  keep = Y != ignore_index
  def fn(x: Tensor) -> Tensor:
    logp = x.log_softmax(-1)
    hot = _targets(Y, x, x.ndim - 1, "sparse_categorical_crossentropy", ignore_index)
    return keep.where(-_smoothed(_pick(logp, hot, -1), logp, -1, label_smoothing), 0.0)
  loss = self._in_f32(fn)
  return loss.sum() / keep.sum() if reduction == "mean" else _reduce(loss, reduction)


def _check(reduction: str, label_smoothing: float = 0.0) -> None:
  if reduction not in REDUCTIONS: raise ValueError(f"reduction is one of {REDUCTIONS}, got {reduction!r}")
  if not 0.0 <= label_smoothing <= 1.0: raise ValueError(f"label_smoothing is in [0, 1], got {label_smoothing!r}")


def _reduce(loss: Tensor, reduction: str) -> Tensor: return loss if reduction == "none" else loss.sum() if reduction == "sum" else loss.mean()


def _targets(Y: Tensor, x: Tensor, dim: int, what: str, ignore: int = -100) -> Tensor:
  """The one-hot (bool) of class indices Y along dim of x: Y has x's shape without dim. A target out of range but `ignore` (torch's
  ignore_index) raises IndexError, as in torch."""
  if not isinstance(Y, Tensor) or not Y.dtype.is_int: raise TypeError(f"{what} needs class indices as an int Tensor, got {Y!r}")
  want = x.shape[:dim] + x.shape[dim + 1:]
  if Y.shape != want: raise OpError(f"{what}: targets of shape {Y.shape} do not fit logits of shape {x.shape} (want {want})")
  n = x.shape[dim]
  require(Y, lambda v: (v != ignore) & ((v < 0) | (v >= n)), lambda v: IndexError(f"Target {v} is out of bounds."))
  classes = Tensor.arange(x.shape[dim], dtype=dtypes.int32, device=x.device).reshape(tuple(-1 if i == dim else 1 for i in range(x.ndim)))
  return Y.unsqueeze(dim) == classes


def _pick(logp: Tensor, hot: Tensor, dim: int) -> Tensor: return hot.where(logp, 0.0).sum(dim)  # where, not *: -inf * 0 is NaN


def _smoothed(picked: Tensor, logp: Tensor, dim: int, label_smoothing: float) -> Tensor:
  """(1 - eps) * log p[target] + eps * mean log p: the target's weight spread over every class by label smoothing."""
  return picked if label_smoothing == 0 else (1 - label_smoothing) * picked + label_smoothing * logp.mean(dim)
