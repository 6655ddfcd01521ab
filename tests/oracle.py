"""The PyTorch oracle: one op run on the same random inputs in torch and in tinytune, compared with a tolerance for the dtype.

    helper_test_op([(3, 4), (4,)], lambda a, b: a + b)                   # the same function for both
    helper_test_op([(3, 4)], torch.nn.functional.elu, Tensor.elu)         # or one for each
    helper_test_op(None, lambda a: a.floor(), vals=[[-1.5, 0.5, math.nan]])  # given values instead of random ones

A test module that imports this one is skipped, with the reason, where torch is not installed."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pytest

from tinytune import Tensor, dtypes
from tinytune.dtype import DType

torch = pytest.importorskip("torch", reason="the PyTorch oracle needs torch: pip install torch")

TOLERANCE = {"float32": (1e-5, 1e-5), "float16": (1e-3, 1e-2), "bfloat16": (1e-2, 5e-2), "float64": (1e-10, 1e-10)}  # (atol, rtol)


def to_torch(x: np.ndarray, requires_grad: bool = False) -> Any:
  ret = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16) if x.dtype == dtypes.bfloat16.np else torch.from_numpy(x.copy())
  return ret.requires_grad_(requires_grad and ret.is_floating_point())


def random_input(shape: tuple[int, ...], dtype: DType, low: float, high: float, rng: np.random.Generator) -> np.ndarray:
  if dtype == dtypes.bool: return rng.random(shape) < 0.5
  if dtype.is_int: return rng.integers(int(low), int(high) + 1, shape).astype(dtype.np)
  return rng.uniform(low, high, shape).astype(dtype.np)


def compare(got: np.ndarray, want: Any, dtype_name: str, atol: float | None, rtol: float | None, what: str) -> None:
  want = want.detach().float().numpy() if want.dtype == torch.bfloat16 else want.detach().numpy()
  assert got.shape == want.shape, f"{what}: shape {got.shape}, torch gives {want.shape}"
  if dtype_name not in TOLERANCE: np.testing.assert_array_equal(got, want, err_msg=what); return
  da, dr = TOLERANCE[dtype_name]
  np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), atol=atol if atol is not None else da,
                             rtol=rtol if rtol is not None else dr, equal_nan=True, err_msg=what)


def helper_test_op(shapes: Sequence[tuple[int, ...]] | None, torch_fn: Callable[..., Any], tinytune_fn: Callable[..., Any] | None = None, *,
                   vals: Sequence[Any] | None = None, dtype: DType = dtypes.float32, low: float = -2.0, high: float = 2.0,
                   atol: float | None = None, rtol: float | None = None, seed: int = 0, grad: bool = True,
                   grad_atol: float | None = None, grad_rtol: float | None = None, untracked: bool = False) -> None:
  """Run torch_fn on torch tensors and tinytune_fn (torch_fn where None) on Tensors of the same inputs; compare the outputs
  (a tensor or a tuple of them) in value and shape. With grad, where the inputs are floats, compare too the gradients of
  sum(output * random cotangent) with respect to each input: by backward() on inputs that require grad, or (untracked) by
  loss.gradient(*inputs) on inputs made without requires_grad, as tinygrad's users write it."""
  rng = np.random.default_rng(seed)
  inputs = [np.asarray(v, dtype=dtype.np) for v in vals] if vals is not None else [random_input(s, dtype, low, high, rng) for s in shapes or ()]
  grad = grad and dtype.is_float
  torch_inputs = [to_torch(x, grad) for x in inputs]
  tt_inputs = [Tensor(x, dtype=dtype, requires_grad=(grad and not untracked) or None) for x in inputs]
  want = torch_fn(*torch_inputs)
  got = (tinytune_fn or torch_fn)(*tt_inputs)
  wants, gots = (want, got) if isinstance(want, (tuple, list)) else ((want,), (got,))
  assert len(wants) == len(gots), f"{len(gots)} outputs, torch gives {len(wants)}"
  for i, (w, g) in enumerate(zip(wants, gots)):
    w = w if isinstance(w, torch.Tensor) else torch.tensor(w)
    assert isinstance(g, Tensor), f"output {i} is a {type(g).__name__}, not a Tensor"
    want_dtype = str(w.dtype).removeprefix("torch.")
    compare(g.numpy(), w, want_dtype, atol, rtol, f"output {i} ({g.dtype.name}, torch {want_dtype})")
  pairs = [(w, g) for w, g in zip(wants, gots) if isinstance(w, torch.Tensor) and w.requires_grad]
  if not grad or not pairs: return
  cotangents = [rng.uniform(-1, 1, w.shape).astype(np.float32) for w, _ in pairs]
  try: sum((w.float() * torch.from_numpy(c)).sum() for (w, _), c in zip(pairs, cotangents)).backward()
  except RuntimeError as e:  # torch has no derivative for some ops (scatter): nothing to compare
    if "not implemented" in str(e): return
    raise
  if untracked:  # realized, a tensor that does not require grad dropped its graph (as in tinygrad): the output again
    again = (tinytune_fn or torch_fn)(*tt_inputs)
    pairs = [(w, g) for w, g in zip(wants, again if isinstance(want, (tuple, list)) else (again,)) if isinstance(w, torch.Tensor) and w.requires_grad]
  loss = sum((g.cast(dtypes.float32) * Tensor(c)).sum() for (_, g), c in zip(pairs, cotangents))
  if untracked: got_grads = [g.numpy() for g in loss.gradient(*tt_inputs)]  # type: ignore[union-attr]
  else:
    assert all(g.requires_grad for _, g in pairs), "torch's output requires grad, tinytune's does not"
    loss.backward()  # type: ignore[union-attr]
    got_grads = [tt.grad.numpy() if tt.grad is not None else np.zeros(tt.shape, tt.dtype.np) for tt in tt_inputs]
  for i, (tx, got_grad) in enumerate(zip(torch_inputs, got_grads)):
    want_grad = tx.grad if tx.grad is not None else torch.zeros_like(tx)
    compare(got_grad, want_grad, str(want_grad.dtype).removeprefix("torch."), grad_atol if grad_atol is not None else atol,
            grad_rtol if grad_rtol is not None else rtol, f"gradient of input {i}")
