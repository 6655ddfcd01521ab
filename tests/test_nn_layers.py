"""nn layers against torch.nn with copied weights (forward, input and weight gradients), batchnorm's running statistics, and the
convolution and pooling functions against torch.nn.functional."""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest
from oracle import helper_test_op, torch

from tinytune import Tensor, dtypes, nn
from tinytune.nn.state import get_parameters, get_state_dict, load_state_dict

F = torch.nn.functional


def check_layer(ours: Any, theirs: Any, shape: tuple[int, ...], ints: int | None = None, tol: float = 1e-4, hc: tuple | None = None) -> None:
  """Copy theirs' state into ours, run both on one input (and an LSTM's hc), compare the outputs, then the gradients of the input and
  every parameter."""
  load_state_dict(ours, {k: v.detach().numpy() for k, v in theirs.state_dict().items()})
  rng = np.random.default_rng(0)
  x = rng.integers(0, ints, shape) if ints else rng.uniform(-2, 2, shape).astype(np.float32)
  tx, ox = torch.tensor(x, requires_grad=not ints), Tensor(x, requires_grad=None if ints else True)
  want, got = (theirs(tx), ours(ox)) if hc is None else (theirs(tx, tuple(map(torch.tensor, hc))), ours(ox, tuple(map(Tensor, hc))))
  wants, gots = (want, got) if isinstance(want, tuple) else ((want,), (got,))
  cotangents = [rng.uniform(-1, 1, w.shape).astype(np.float32) for w in wants]
  for w, g in zip(wants, gots): np.testing.assert_allclose(g.numpy(), w.detach().numpy(), atol=tol, rtol=tol, err_msg="forward")
  sum((w * torch.tensor(c)).sum() for w, c in zip(wants, cotangents)).backward()
  sum((g * Tensor(c)).sum() for g, c in zip(gots, cotangents)).backward()
  if not ints: np.testing.assert_allclose(ox.grad.numpy(), tx.grad.numpy(), atol=tol, rtol=tol, err_msg="input gradient")
  params = get_state_dict(ours)
  for name, p in theirs.named_parameters():
    assert params[name].requires_grad, f"{name} does not require grad"
    np.testing.assert_allclose(params[name].grad.numpy(), p.grad.numpy(), atol=tol, rtol=tol, err_msg=f"gradient of {name}")


LAYERS: list[tuple[str, Callable[[], Any], Callable[[], Any], tuple[int, ...]]] = [
  ("linear", lambda: nn.Linear(5, 3), lambda: torch.nn.Linear(5, 3), (4, 5)),
  ("linear_3d_nobias", lambda: nn.Linear(5, 3, bias=False), lambda: torch.nn.Linear(5, 3, bias=False), (2, 4, 5)),
  ("conv1d", lambda: nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2), lambda: torch.nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2), (2, 4, 9)),
  ("conv2d", lambda: nn.Conv2d(3, 4, (3, 2), padding=1, dilation=(1, 2)), lambda: torch.nn.Conv2d(3, 4, (3, 2), padding=1, dilation=(1, 2)),
   (2, 3, 7, 8)),
  ("conv2d_same", lambda: nn.Conv2d(2, 3, 4, padding="same"), lambda: torch.nn.Conv2d(2, 3, 4, padding="same"), (1, 2, 6, 7)),
  ("conv_transpose2d", lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
   lambda: torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2), (2, 4, 5, 4)),
  ("layernorm", lambda: nn.LayerNorm((4, 5)), lambda: torch.nn.LayerNorm((4, 5)), (3, 4, 5)),
  ("rmsnorm", lambda: nn.RMSNorm(6), lambda: torch.nn.RMSNorm(6), (3, 6)),
  ("groupnorm", lambda: nn.GroupNorm(2, 6), lambda: torch.nn.GroupNorm(2, 6), (3, 6, 4, 3)),
  ("instancenorm", lambda: nn.InstanceNorm(3, affine=True), lambda: torch.nn.InstanceNorm2d(3, affine=True), (2, 3, 4, 5)),
  ("instancenorm_plain", lambda: nn.InstanceNorm(3), lambda: torch.nn.InstanceNorm1d(3), (2, 3, 7)),
  ("batchnorm_eval", lambda: nn.BatchNorm2d(3), lambda: torch.nn.BatchNorm2d(3).eval(), (4, 3, 2, 3)),
  ("batchnorm_no_stats", lambda: nn.BatchNorm(3, track_running_stats=False), lambda: torch.nn.BatchNorm1d(3, track_running_stats=False), (5, 3)),
]


@pytest.mark.parametrize("make, make_torch, shape", [c[1:] for c in LAYERS], ids=[c[0] for c in LAYERS])
def test_layer_matches_torch(make: Callable[[], Any], make_torch: Callable[[], Any], shape: tuple[int, ...]) -> None:
  torch.manual_seed(0)
  check_layer(make(), make_torch(), shape)


def test_batchnorm_trains_like_torch() -> None:
  torch.manual_seed(0)
  with Tensor.train(): check_layer(nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3), (4, 3, 2, 3))


def test_embedding() -> None:
  torch.manual_seed(0)
  check_layer(nn.Embedding(7, 4), torch.nn.Embedding(7, 4), (3, 5), ints=7)


def test_lstm_cell() -> None:
  torch.manual_seed(0)
  rng = np.random.default_rng(1)
  h, c = rng.uniform(-1, 1, (2, 2, 5)).astype(np.float32)
  check_layer(nn.LSTMCell(3, 5), torch.nn.LSTMCell(3, 5), (2, 3), hc=(h, c))
  check_layer(nn.LSTMCell(3, 5), torch.nn.LSTMCell(3, 5), (2, 3))  # h and c start at zeros


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm_running_stats(momentum: float | None) -> None:
  ours, theirs = nn.BatchNorm2d(3, momentum=momentum), torch.nn.BatchNorm2d(3, momentum=momentum)
  rng = np.random.default_rng(0)
  with Tensor.train():
    for step in range(3):
      x = rng.normal(step, 1 + step, (4, 3, 2, 3)).astype(np.float32)
      np.testing.assert_allclose(ours(Tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(), atol=1e-5, rtol=1e-5)
      for name in ("running_mean", "running_var"):
        np.testing.assert_allclose(getattr(ours, name).numpy(), getattr(theirs, name).numpy(), atol=1e-5, rtol=1e-5, err_msg=f"{name} at step {step}")
  assert ours.num_batches_tracked.item() == 3
  theirs.eval()
  x, before = rng.normal(0, 1, (2, 3, 2, 3)).astype(np.float32), ours.running_mean.numpy()
  np.testing.assert_allclose(ours(Tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(), atol=1e-5, rtol=1e-5)
  np.testing.assert_array_equal(ours.running_mean.numpy(), before)  # eval leaves the statistics alone


def test_parameters_and_init() -> None:
  Tensor.manual_seed(0)  # the ranges below compare a few dozen random draws with torch's: fixed seeds, not the earlier tests' state
  torch.manual_seed(0)
  layer = nn.Linear(100, 50)
  params = get_parameters(layer)
  assert {id(p) for p in params} == {id(layer.weight), id(layer.bias)} and all(p.requires_grad for p in params)
  w, bound = layer.weight.numpy(), 1 / math.sqrt(100)  # kaiming_uniform(a=sqrt(5)) on fan_in 100
  assert np.abs(w).max() <= bound and abs(w.std() - bound / math.sqrt(3)) < 0.1 * bound
  bn = nn.BatchNorm2d(4)
  assert [id(p) for p in get_parameters(bn) if p.requires_grad] == [id(bn.weight), id(bn.bias)]
  layers = [("Conv2d", (3, 4, 3)), ("LSTMCell", (3, 5)), ("ConvTranspose2d", (4, 6, 3, 1, 0, 0, 2)), ("BatchNorm2d", (3,)), ("Embedding", (7, 4))]
  for name, args in layers:
    ours, theirs = get_state_dict(getattr(nn, name)(*args)), getattr(torch.nn, name)(*args).state_dict()
    assert {k: v.shape for k, v in ours.items()} == {k: tuple(v.shape) for k, v in theirs.items()}
    for k, v in theirs.items():  # the same distribution's range as torch's
      if v.is_floating_point() and v.numel() > 10: assert abs(np.abs(ours[k].numpy()).max() - v.abs().max().item()) < 0.3 * v.abs().max().item(), k


# ***** the functions against torch.nn.functional *****
CONVS: list[tuple[str, list, Callable, Callable]] = [
  ("conv1d", [(2, 4, 11), (6, 2, 3), (6,)], lambda x, w, b: F.conv1d(x, w, b, 2, 1, 1, 2), lambda x, w, b: x.conv2d(w, b, 2, 1, 1, 2)),
  ("conv3d", [(1, 2, 5, 6, 5), (3, 2, 2, 3, 2), (3,)], lambda x, w, b: F.conv3d(x, w, b, 1, (1, 0, 1), (1, 2, 1)),
   lambda x, w, b: x.conv2d(w, b, 1, (1, 0, 1), (1, 2, 1))),
  ("conv2d_4_sided", [(2, 3, 7, 8), (4, 3, 3, 3), (4,)], lambda x, w, b: F.conv2d(F.pad(x, (2, 0, 1, 3)), w, b, 2),
   lambda x, w, b: x.conv2d(w, b, 2, (2, 0, 1, 3))),
  ("conv2d_negative", [(2, 3, 7, 8), (4, 3, 3, 3), (4,)], lambda x, w, b: F.conv2d(F.pad(x, (1, -1, -2, 0)), w, b),
   lambda x, w, b: x.conv2d(w, b, padding=(1, -1, -2, 0))),
  ("conv_transpose1d", [(2, 4, 6), (4, 3, 3), (3,)], lambda x, w, b: F.conv_transpose1d(x, w, b, 3, 1, 2, 1, 2),
   lambda x, w, b: x.conv_transpose2d(w, b, 3, 1, 2, 1, 2)),
  ("conv_transpose2d", [(2, 4, 5, 4), (4, 3, 3, 2), (6,)], lambda x, w, b: F.conv_transpose2d(x, w, b, (2, 1), 1, (1, 0), 2, 1),
   lambda x, w, b: x.conv_transpose2d(w, b, (2, 1), 1, (1, 0), 2)),
  ("conv_transpose2d_dilated", [(1, 2, 4, 5), (2, 3, 3, 3), (3,)], lambda x, w, b: F.conv_transpose2d(x, w, b, 2, 2, 1, 1, 2),
   lambda x, w, b: x.conv_transpose2d(w, b, 2, 2, 1, 1, 2)),
  ("conv_transpose3d", [(1, 2, 3, 4, 3), (2, 2, 2, 2, 3), (2,)], lambda x, w, b: F.conv_transpose3d(x, w, b, 2),
   lambda x, w, b: x.conv_transpose2d(w, b, 2)),
]


@pytest.mark.parametrize("shapes, torch_fn, fn", [c[1:] for c in CONVS], ids=[c[0] for c in CONVS])
def test_conv(shapes: list, torch_fn: Callable, fn: Callable) -> None:
  helper_test_op(shapes, torch_fn, fn, atol=1e-4, rtol=1e-4, grad_atol=1e-3, grad_rtol=1e-3)


POOLS: list[tuple[str, tuple[int, ...], Callable, Callable]] = [
  ("max1d", (2, 3, 10), lambda x: F.max_pool1d(x, 3, 2, 1, ceil_mode=True), lambda x: x.max_pool2d((3,), 2, 1, ceil_mode=True)),
  ("max2d_ceil", (2, 3, 9, 10), lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True), lambda x: x.max_pool2d(3, 2, ceil_mode=True)),
  ("max2d_dilation", (2, 2, 9, 10), lambda x: F.max_pool2d(x, (2, 3), 2, 1, (2, 1)), lambda x: x.max_pool2d((2, 3), 2, 1, (2, 1))),
  ("max3d", (1, 2, 5, 6, 5), lambda x: F.max_pool3d(x, 2, (1, 2, 2), 1), lambda x: x.max_pool2d((2, 2, 2), (1, 2, 2), 1)),
  ("max2d_indices", (2, 3, 9, 10), lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True),
   lambda x: x.max_pool2d(3, 2, 1, ceil_mode=True, return_indices=True)),
  ("max1d_indices", (2, 3, 11), lambda x: F.max_pool1d(x, 2, dilation=2, return_indices=True),
   lambda x: x.max_pool2d((2,), dilation=2, return_indices=True)),
  ("avg1d", (2, 3, 10), lambda x: F.avg_pool1d(x, 3, 2, 1, count_include_pad=False), lambda x: x.avg_pool2d((3,), 2, 1, count_include_pad=False)),
  ("avg2d_ceil", (2, 3, 9, 10), lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), lambda x: x.avg_pool2d(3, 2, 1, ceil_mode=True)),
  ("avg2d_ceil_no_pad", (2, 3, 9, 10), lambda x: F.avg_pool2d(x, (3, 2), 2, 1, True, False), lambda x: x.avg_pool2d((3, 2), 2, 1, True, False)),
  ("avg2d_divisor", (2, 3, 6, 6), lambda x: F.avg_pool2d(x, 2, divisor_override=3), lambda x: x.avg_pool2d(2, divisor_override=3)),
  ("avg3d", (1, 2, 5, 6, 5), lambda x: F.avg_pool3d(x, 2, 2, 1, count_include_pad=False),
   lambda x: x.avg_pool2d((2, 2, 2), 2, 1, count_include_pad=False)),
  ("interpolate_nearest", (2, 3, 5, 6), lambda x: F.interpolate(x, (7, 4)), lambda x: x.interpolate((7, 4), "nearest")),
  ("interpolate_nearest_exact", (2, 3, 5, 6), lambda x: F.interpolate(x, (3, 9), mode="nearest-exact"),
   lambda x: x.interpolate((3, 9), "nearest-exact")),
  ("interpolate_linear", (2, 3, 5), lambda x: F.interpolate(x, 8, mode="linear"), lambda x: x.interpolate((8,))),
  ("interpolate_bilinear", (2, 3, 5, 6), lambda x: F.interpolate(x, (7, 4), mode="bilinear"), lambda x: x.interpolate((7, 4), "bilinear")),
  ("interpolate_align_corners", (2, 3, 5, 6), lambda x: F.interpolate(x, (9, 3), mode="bilinear", align_corners=True),
   lambda x: x.interpolate((9, 3), "bilinear", align_corners=True)),
  ("interpolate_trilinear", (1, 2, 3, 4, 5), lambda x: F.interpolate(x, (5, 2, 6), mode="trilinear"),
   lambda x: x.interpolate((5, 2, 6), "trilinear")),
]


@pytest.mark.parametrize("shape, torch_fn, fn", [c[1:] for c in POOLS], ids=[c[0] for c in POOLS])
def test_pool_and_resize(shape: tuple[int, ...], torch_fn: Callable, fn: Callable) -> None:
  helper_test_op([shape], torch_fn, fn, atol=1e-5, rtol=1e-5, grad_atol=1e-5, grad_rtol=1e-4)


def test_max_unpool2d() -> None:
  x = torch.tensor(np.random.default_rng(0).normal(size=(2, 3, 6, 8)).astype(np.float32))
  for kernel, stride, padding, size in [(2, None, 0, None), (3, 2, 1, (6, 8)), (2, 2, 0, (7, 9))]:
    v, i = F.max_pool2d(x, kernel, stride, padding, return_indices=True)
    want = F.max_unpool2d(v, i, kernel, stride, padding, size)
    np.testing.assert_array_equal(Tensor(v.numpy()).max_unpool2d(Tensor(i.numpy()), kernel, stride, padding, size).numpy(), want.numpy())
  v, i = F.max_pool1d(x[0], 2, return_indices=True)
  np.testing.assert_array_equal(Tensor(v.numpy()).max_unpool2d(Tensor(i.numpy()), (2,)).numpy(), F.max_unpool1d(v, i, 2).numpy())


def test_batchnorm_function() -> None:
  helper_test_op([(4, 3, 2, 2), (3,), (3,), (3,), (3,)], lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, False, eps=1e-3),
                 lambda x, w, b, m, v: x.batchnorm(w, b, m, (v + 1e-3).rsqrt()), low=0.5, grad=False)
  def by_hand(x, w, b, m, v): return (x - m.reshape(3, 1, 1)) * (v.reshape(3, 1, 1) + 1e-3).rsqrt() * w.reshape(3, 1, 1) + b.reshape(3, 1, 1)
  helper_test_op([(4, 3, 2, 2), (3,), (3,), (3,), (3,)], by_hand, lambda x, w, b, m, v: x.batchnorm(w, b, m, (v + 1e-3).rsqrt()), low=0.5)
  x = Tensor.ones(2, 3, 4)
  np.testing.assert_allclose(x.batchnorm(None, None, Tensor([0.5, 1.0, 1.5, 2.0]), Tensor(2.0), axis=-1).numpy()[0, 0], [1.0, 0.0, -1.0, -2.0])


BAD_CALLS: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
  ("conv2d weight", lambda: Tensor.zeros(1, 1, 3, 3).conv2d(np.zeros((1, 1, 1, 1))), TypeError, "conv2d weight is a Tensor"),
  ("conv1d ndim", lambda: Tensor.zeros(1, 3, 3).conv2d(Tensor.zeros(1, 3, 3, 1)), ValueError,
   r"conv2d needs a \(N, C, H, W\) input and \(O, C/groups, KH, KW\)"),
  ("conv3d padding", lambda: Tensor.zeros(1, 1, 3, 3, 3).conv2d(Tensor.zeros(1, 1, 1, 1, 1), padding=(1, 1)), ValueError,
   r"padding is an int, 3 ints or 6 ints, got \(1, 1\)"),
  ("conv3d stride", lambda: Tensor.zeros(1, 1, 3, 3, 3).conv2d(Tensor.zeros(1, 1, 1, 1, 1), stride=(1, 1)), ValueError, "or a tuple of 3 of them"),
  ("conv negative padding too much", lambda: Tensor.zeros(1, 1, 3, 3).conv2d(Tensor.zeros(1, 1, 2, 2), padding=-1), ValueError, "does not fit"),
  ("conv_transpose2d channels", lambda: Tensor.zeros(1, 3, 4, 4).conv_transpose2d(Tensor.zeros(2, 1, 3, 3)), ValueError, "3 input channels"),
  ("conv_transpose2d output_padding", lambda: Tensor.zeros(1, 2, 4, 4).conv_transpose2d(Tensor.zeros(2, 1, 3, 3), stride=2, output_padding=2),
   ValueError, "output_padding .* must be smaller than stride"),
  ("pool padding", lambda: Tensor.zeros(1, 4, 4).max_pool2d(2, padding=(1, 1, 1)), ValueError, "max_pool2d padding is an int, 2 ints or 4 ints"),
  ("pool 3d on 2d", lambda: Tensor.zeros(4, 4).avg_pool2d((2, 2, 2)), ValueError, r"at least 3 dims \(..., D, H, W\)"),
  ("unpool float indices", lambda: Tensor.zeros(1, 2, 2).max_unpool2d(Tensor.zeros(1, 2, 2)), TypeError, "indices are ints"),
  ("unpool shapes", lambda: Tensor.zeros(1, 2, 2).max_unpool2d(Tensor.zeros(1, 2, 3, dtype=dtypes.int32)), ValueError, "one shape"),
  ("interpolate mode", lambda: Tensor.zeros(1, 2, 2).interpolate((3, 3), "cubic"), ValueError, "no mode 'cubic'"),
  ("interpolate size", lambda: Tensor.zeros(2, 2).interpolate((3, 3, 3)), ValueError, "up to 2 positive ints"),
  ("interpolate corners", lambda: Tensor.zeros(2, 2).interpolate((3,), "nearest", True), ValueError, "align_corners is only for the linear"),
  ("conv2d same stride", lambda: nn.Conv2d(1, 1, 3, stride=2, padding="same"), ValueError, "padding='same' needs stride 1"),
  ("conv2d groups", lambda: nn.Conv2d(3, 4, 3, groups=2), ValueError, "do not split into 2 groups"),
  ("batchnorm channels", lambda: nn.BatchNorm2d(3)(Tensor.zeros(2, 4, 2, 2)), ValueError, r"BatchNorm\(3\) needs a \(N, 3, ...\) input"),
  ("layernorm shape", lambda: nn.LayerNorm(4)(Tensor.zeros(2, 3)), ValueError, r"LayerNorm\(4,\) does not fit"),
  ("groupnorm groups", lambda: nn.GroupNorm(4, 6), ValueError, "6 channels do not split into 4 groups"),
  ("embedding float", lambda: nn.Embedding(3, 2)(Tensor([0.0])), TypeError, "Embedding takes an int Tensor"),
]


@pytest.mark.parametrize("fn, exc, match", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_calls_raise_clearly(fn: Callable[[], Any], exc: type[Exception], match: str) -> None:
  with pytest.raises(exc, match=match): fn()
