from __future__ import annotations

import numpy as np

from tinytune import Tensor


def test_add_and_matmul() -> None:
  a, b = np.random.randn(5, 7).astype(np.float32), np.random.randn(7, 3).astype(np.float32)
  np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose((Tensor(a) + 1).numpy(), a + 1)
