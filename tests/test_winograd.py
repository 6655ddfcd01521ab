"""Winograd's F(4, 3) for 3x3 stride-1 convolutions: its matrices, its results against NumPy in float64 within the search's
verification tolerance, its gradients against torch, when conv2d takes it, and the kernels it makes (a cat's rows upcast, their
masked-out pieces gone from the source)."""
from __future__ import annotations

import numpy as np
import pytest

from tinytune import Device, Tensor, engine
from tinytune.codegen.heuristic import hand_coded_optimizations, stacked_dims
from tinytune.codegen.kernel import AxisKind
from tinytune.helpers import Context
from tinytune.runtime import device_status
from tinytune.search.worker import mismatches
from tinytune.tensor.functional import _winograd_matrices, _winograd_tile

DEVICES = [d for d in ("CPU", "OPENCL") if device_status(d) is None]


def reference(x: np.ndarray, w: np.ndarray, pad: int, bias: np.ndarray | None = None) -> np.ndarray:
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
  out = np.einsum("nchwij,ocij->nohw", win, w.astype(np.float64))
  return out if bias is None else out + bias.reshape(1, -1, 1, 1)


@pytest.mark.parametrize("m", [2, 4])
def test_matrices_compute_a_correlation_exactly(m: int) -> None:
  bt, g, at = _winograd_matrices(m)
  d, w = [3, -1, 4, 1, -5, 9][:m + 2], [2, -7, 1]
  got = [sum(at[i][j] * sum(g[j][k] * w[k] for k in range(3)) * sum(bt[j][t] * d[t] for t in range(m + 2)) for j in range(m + 2)) for i in range(m)]
  assert got == [sum(w[k] * d[i + k] for k in range(3)) for i in range(m)]
  assert all(x.denominator == 1 for row in bt for x in row) and all(x.denominator == 1 for row in at for x in row)  # fractions only in G


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n, c, o, h, w, pad, bias", [
  (2, 3, 4, 9, 9, 1, True), (1, 1, 2, 5, 5, 0, False), (2, 8, 5, 11, 7, 1, False), (3, 4, 6, 7, 13, 0, True), (1, 5, 3, 3, 3, 0, False),
  (1, 2, 3, 4, 6, 1, True), (2, 16, 16, 8, 8, 1, False),
])
def test_matches_numpy(device: str, n: int, c: int, o: int, h: int, w: int, pad: int, bias: bool) -> None:
  """Odd sizes, sizes that are not a multiple of the tile, padding 0 and 1, batch 1, one input channel, a bias: each within the
  tolerance a searched kernel is verified to (the tiles' transforms round relative to the largest outputs, not to each one)."""
  if device == "OPENCL" and (c, h) != (3, 9): pytest.skip("pocl builds slowly: one case on OpenCL")
  rng = np.random.default_rng(n * 100 + c * 10 + h)
  x, wt, b = (rng.standard_normal(s).astype(np.float32) for s in ((n, c, h, w), (o, c, 3, 3), (o,)))
  with Context(WINO=2):
    out = Tensor(x, device=device).conv2d(Tensor(wt, device=device), Tensor(b, device=device) if bias else None, padding=pad).numpy()
  ref = reference(x, wt, pad, b if bias else None)
  assert out.shape == ref.shape and not mismatches(out, ref, 1e-4, terms=c * 9).any()


def test_wide_channels_error() -> None:
  """64 channels at the benchmark's scale: the max error stays a few millionths of the largest output."""
  rng = np.random.default_rng(0)
  x, w = rng.standard_normal((2, 64, 12, 12)).astype(np.float32), rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
  out, ref = Tensor(x).conv2d(Tensor(w), padding=1).numpy(), reference(x, w, 1)
  assert np.abs(out - ref).max() / np.abs(ref).max() < 2e-5


@pytest.mark.usefixtures("on_cpu")  # the CPU takes Winograd's conv
def test_when_it_is_taken() -> None:
  x16, w16, x8, w8 = Tensor.empty(2, 16, 8, 8), Tensor.empty(16, 16, 3, 3), Tensor.empty(2, 8, 8, 8), Tensor.empty(16, 8, 3, 3)
  assert _winograd_tile(x16, w16, (1, 1), (1, 1), 1) == 4
  assert _winograd_tile(x8, w8, (1, 1), (1, 1), 1) == 0  # few channels: the transforms cost more than they save
  assert _winograd_tile(x16, w16, (2, 2), (1, 1), 1) == 0 and _winograd_tile(x16, w16, (1, 1), (2, 2), 1) == 0
  assert _winograd_tile(x16, Tensor.empty(16, 8, 3, 3), (1, 1), (1, 1), 2) == 0
  assert _winograd_tile(x16, Tensor.empty(16, 16, 5, 5), (1, 1), (1, 1), 1) == 0
  with Context(WINO=0): assert _winograd_tile(x16, w16, (1, 1), (1, 1), 1) == 0
  with Context(WINO=2): assert _winograd_tile(x8, w8, (1, 1), (1, 1), 1) == 4


@pytest.mark.usefixtures("on_cpu")  # the CPU takes Winograd's conv
def test_kernels() -> None:
  """The transforms' stacked dims are upcast (whole where a vector of 16 lanes leaves room), so their masked pieces are vector
  selects at most, never scalar ones; the tile points' matmul is one kernel."""
  x, w = Tensor.randn(2, 16, 8, 8).realize(), Tensor.randn(16, 16, 3, 3).realize()
  kernels = [k for _, k in engine.kernels(x.conv2d(w, padding=1).uop, "CPU")]
  assert [k.name for k in kernels] == ["E_2_10_10_16", "E_6_2_2_2_6_16", "E_16_6_6_16", "r_6_8_6_16_16", "E_2_2_4_2_4_16", "E_2_16_8_8"]
  gemm = {a.dim: a.size for a in kernels[3].apply_opts(hand_coded_optimizations(kernels[3])).axes if a.kind is AxisKind.UPCAST}
  # the register tile, as the target's registers hold it: the 16 output channels in one or two vectors, by as many of the 8 tiles'
  # rows as leave 4 registers free (AVX-512: 8 rows of one vector; AVX2: 4 rows of two)
  caps = Device["CPU"].caps
  lanes = min(16, 2 * caps.simd_width)
  assert gemm == {1: max(r for r in (8, 4, 2) if r * lanes // caps.simd_width <= caps.vector_registers - 4), 3: lanes}
  for k in kernels[1:3] + kernels[4:5]:
    assert len(stacked_dims(k)) == 2
    src = Device["CPU"].renderer.render(k.apply_opts(hand_coded_optimizations(k)))
    assert "?" not in src[src.index("void E_"):]


@pytest.mark.parametrize("pad", [0, 1])
def test_gradients(pad: int) -> None:
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(pad)
  x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 4, 7, 9), (5, 4, 3, 3), (5,)))
  tx, tw, tb = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w, b))
  g = rng.standard_normal(tuple(torch.nn.functional.conv2d(tx, tw, tb, padding=pad).shape))
  (torch.nn.functional.conv2d(tx, tw, tb, padding=pad) * torch.tensor(g)).sum().backward()
  with Context(WINO=2):
    xx, ww, bb = (Tensor(a, requires_grad=True) for a in (x, w, b))
    (xx.conv2d(ww, bb, padding=pad) * Tensor(g.astype(np.float32))).sum().backward()
    for ours, theirs in ((xx, tx), (ww, tw), (bb, tb)):
      assert ours.grad is not None and theirs.grad is not None
      np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-4, atol=1e-4 * float(np.abs(theirs.grad.numpy()).max()))


@pytest.mark.parametrize("k, pad, dilation, stride, wino", [
  (3, 1, 1, 1, 0), (5, 2, 1, 1, 1), (3, 2, 2, 1, 1), (1, 0, 1, 1, 1), (3, (1, 2), 1, 1, 0), (3, 1, 1, 2, 1), (5, 2, 1, 2, 1), (1, 0, 1, 2, 1),
  (3, 1, 2, 3, 1),
])
def test_direct_convs(k: int, pad, dilation: int, stride: int, wino: int) -> None:
  """Stride 1: the direct convolution over rows laid end to end, with the padding (and a few columns more, so the rows' span is a
  multiple of 32) in the copy that lays them out. Strided: the windows copied out as rows, times the weight channels last. Odd
  sizes, asymmetric padding, dilation."""
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(k)
  x, w = rng.standard_normal((2, 16, 9, 11)).astype(np.float32), rng.standard_normal((16, 16, k, k)).astype(np.float32)
  with Context(WINO=wino): out = Tensor(x).conv2d(Tensor(w), padding=pad, dilation=dilation, stride=stride).numpy()
  ref = torch.nn.functional.conv2d(torch.tensor(x, dtype=torch.float64), torch.tensor(w, dtype=torch.float64), stride=stride,
                                   padding=pad if isinstance(pad, int) else (pad[0], pad[1]), dilation=dilation).numpy()
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)


def test_strided_gradients() -> None:
  """A strided convolution's forward by the rows-times-weight matmul, its gradients by their own rules, against torch."""
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(7)
  x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 9, 10), (16, 3, 3, 3), (16,)))
  tx, tw, tb = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w, b))
  torch.nn.functional.conv2d(tx, tw, tb, stride=2, padding=1).square().sum().backward()
  xx, ww, bb = (Tensor(a, requires_grad=True) for a in (x, w, b))
  xx.conv2d(ww, bb, stride=2, padding=1).square().sum().backward()
  for ours, theirs in ((xx, tx), (ww, tw), (bb, tb)):
    assert ours.grad is not None and theirs.grad is not None
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-4, atol=1e-4 * float(np.abs(theirs.grad.numpy()).max()))
