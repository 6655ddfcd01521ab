"""Fusion: how many kernels a program becomes, and that laziness holds."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import WORKGROUP_DEVICES

from tinytune import Context, Device, GlobalCounters, Tensor, engine
from tinytune.engine.schedule import _computed_once, create_schedule
from tinytune.uop import Ops, UOp


def kernels(t: Tensor) -> int:
  return len(create_schedule(t.uop, t.device)[0])


def test_nothing_runs_before_realize() -> None:
  a = Tensor.rand(8, 8)  # random numbers come from a kernel, run at once
  GlobalCounters.reset()
  b = (a * 2 + 1).relu().sum(1)
  assert GlobalCounters.kernel_count == 0
  b.numpy()
  assert GlobalCounters.kernel_count == 1


@pytest.mark.parametrize("build, count", [
  (lambda a, b, c: (a * b + c).relu().sum(1), 1),
  (lambda a, b, c: a @ b, 1),
  (lambda a, b, c: (a @ b).relu() + c, 1),
  (lambda a, b, c: a.softmax(1), 1),  # the max, the sum of exp, then the row written with them (on a GPU: a workgroup a row)
  (lambda a, b, c: a.log_softmax(0), 3),  # column statistics: the loops they change along are not outermost
  (lambda a, b, c: (a + b).sum() * 2, 1),
  (lambda a, b, c: a.sum(0) + b.sum(1), 2),
  (lambda a, b, c: (a @ b) @ c, 2),
  (lambda a, b, c: a.T.contiguous() + 1, 2),
  (lambda a, b, c: a.layernorm(), 1),
  (lambda a, b, c: a - a.mean(1, keepdim=True), 1),
  (lambda a, b, c: (a.relu() + 1) @ b, 1),  # cheap elementwise work stays in the product's kernel
  (lambda a, b, c: a.exp() @ b, 2),  # an exp the product reads once per output column: computed as vectors once, then read
  (lambda a, b, c: a.softmax(1) @ b, 2),  # the probabilities, the product
  (lambda a, b, c: a.exp().sum(1), 1),  # an exp read once stays in its reduce
  (lambda a, b, c: a.scaled_dot_product_attention(b, c), 3),  # scores, the probabilities, the product
])
def test_fusion_counts(build, count) -> None:
  """The same counts on every device: a row statistic stays in the kernel that writes the row (on devices with workgroups, one a row)."""
  a, b, c = (Tensor.rand(16, 16).realize() for _ in range(3))
  with Context(FLASH=0): out = build(a, b, c)  # attention as its graph (in one kernel: tests/test_attention.py)
  assert kernels(out) == count


def test_a_products_epilogue_goes_with_it_not_into_the_next_product() -> None:
  """relu(a @ b + c) @ d: the bias and relu are the first product's epilogue, computed once; inlined into the second product's
  inputs they were computed again for each of its output columns (an MLP's 10-wide last layer: 290 -> 65 us). Where the first
  product is also read elsewhere (a backward's relu mask), it stays a kernel of its own."""
  a, b, c, d = Tensor.rand(32, 16).realize(), Tensor.rand(16, 24).realize(), Tensor.rand(24).realize(), Tensor.rand(24, 10).realize()
  h = (a @ b + c).relu()
  first, second = create_schedule((h @ d).uop, a.device)[0]
  assert first.node.op is Ops.MAX and not any(u.op is Ops.MAX for u in second.ast.toposort)
  np.testing.assert_allclose((h @ d).numpy(), np.maximum(a.numpy() @ b.numpy() + c.numpy(), 0) @ d.numpy(), rtol=1e-5, atol=1e-5)
  epilogue, product = h.uop, next(u for u in h.uop.toposort if u.op is Ops.REDUCE)
  users = {product: {u for u in epilogue.toposort if product in u.src}}
  assert _computed_once(epilogue, set(), users, False, lambda r: False)
  users[product].add(UOp(Ops.NEG, product.dtype, (product,)))  # the product read elsewhere too: computed once, in its own kernel
  assert not _computed_once(epilogue, set(), users, False, lambda r: False)


@pytest.mark.usefixtures("on_cpu")  # the CPU's kernel counts: a GPU splits the 512x64 product's K too (split-K: 3 kernels)
def test_transposed_matmul_operand_is_packed() -> None:
  """x @ w.T (nn.Linear) with a large w copies w.T into rows first: read in place, each vector of the product gathered 16 elements
  a row apart (1024 x 1024: 246 ms, packed 23 ms). A small or already contiguous B, or one few rows read, is read in place, as is
  one whose K is over 4 times the rows (dot products along K)."""
  a, b = Tensor.rand(256, 256).realize(), Tensor.rand(256, 256).realize()
  assert kernels(a @ b.T) == 2 and kernels(a @ b) == 1 and kernels(a[:, :32] @ b[:32, :32].T) == 1 and kernels(a[:128] @ b.T) == 1
  x, w = Tensor.rand(512, 2048).realize(), Tensor.rand(64, 2048).realize()
  assert kernels(x @ w.T) == 2 and kernels(x[:256] @ w.T) == 1
  np.testing.assert_allclose((a @ b.T).numpy(), a.numpy() @ b.numpy().T, rtol=1e-5, atol=1e-5)
  # attention's Q @ K^T, K^T's rows 64 apart: float32 gathers them, a 16-bit float (a load and a conversion a lane) is packed
  q, k = Tensor.rand(4, 512, 64).realize(), Tensor.rand(4, 512, 64).realize()
  q16, k16 = q.half().realize(), k.half().realize()
  assert kernels(q @ k.transpose(-1, -2)) == 1 and kernels(q16 @ k16.transpose(-1, -2)) == 2
  want = q16.numpy().astype(np.float32) @ k16.numpy().astype(np.float32).transpose(0, 2, 1)
  np.testing.assert_allclose((q16 @ k16.transpose(-1, -2)).numpy().astype(np.float32), want, rtol=2e-3)


def test_a_reduce_hands_on_its_epilogue() -> None:
  """A sum that another kernel's reduces read goes out with the elementwise work after it that nothing else reads, up to a widening
  cast: bfloat16 attention's scores, cast and scaled, leave their matmul's kernel in bfloat16, rounded once (the softmax's kernel
  rounded the float32 sum twice in each of its passes: 4.4 ms of its 1024x1024x8, now 1.9). Work another kernel reads too stays."""
  from tinytune import dtypes
  rng = np.random.default_rng(0)
  q, k = (Tensor(rng.standard_normal((2, 64, 32)).astype(np.float32)).cast(dtypes.bfloat16).realize() for _ in range(2))
  s = (q @ k.transpose(-1, -2)) * 0.125
  items, _ = create_schedule(s.softmax(-1).uop, "CPU")
  scores = next(i for i in items if any(u.op is Ops.REDUCE and u.dtype == dtypes.float32 and u.src[0].op is Ops.MUL for u in i.ast.toposort))
  assert scores.out.dtype == dtypes.bfloat16 and scores.ast.op is Ops.MUL and scores.node is s.uop
  b16 = dtypes.bfloat16.np
  sr = ((q.numpy().astype(np.float32) @ k.numpy().astype(np.float32).transpose(0, 2, 1)).astype(b16) * b16(0.125)).astype(np.float32)
  e = np.exp(sr - sr.max(-1, keepdims=True))
  np.testing.assert_allclose(s.softmax(-1).numpy().astype(np.float32), (e / e.sum(-1, keepdims=True)).astype(b16).astype(np.float32), rtol=1e-2)
  a, b = Tensor.rand(16, 32).realize(), Tensor.rand(32, 16).realize()
  widened = ((a @ b).half() * 2).float().sum(-1)
  first = create_schedule(widened.uop, "CPU")[0][0]
  assert first.out.dtype == dtypes.float16 and first.ast.op is Ops.MUL  # up to the widening cast
  prod = a @ b
  first = create_schedule(((prod * 2).sum(-1) + prod.max(-1)).uop, "CPU")[0][0]
  assert first.node.op is Ops.REDUCE  # the max reads the product too


def test_matmul_has_no_materialized_broadcast() -> None:
  a, b = Tensor.rand(32, 16).realize(), Tensor.rand(16, 24).realize()
  (item,), _ = create_schedule((a @ b).uop, a.device)
  assert item.out.size == 32 * 24  # the (32, 24, 16) product only exists inside the kernel


def test_a_mask_beside_numbers_stays_a_mask() -> None:
  """relu's gradient, (x > 0).where(g, 0.0): where's condition, broadcast beside float32 operands, was a float32 cast back to bool
  (each SIMD lane of the comparison taken out, converted twice and put back); it is the comparison itself."""
  x, g = Tensor.rand(4, 8).realize(), Tensor.rand(4, 8).realize()
  (item,), _ = create_schedule((x > 0.5).where(g, 0.0).uop, x.device)
  assert not any(u.op is Ops.CAST for u in item.ast.toposort)
  np.testing.assert_array_equal(((x > 0.5).where(g, 0.0)).numpy(), np.where(x.numpy() > 0.5, g.numpy(), 0))
  assert (x > 0.5).cast("float32").cast("bool").uop is (x > 0.5).uop and (x * 2).cast("int32").cast("bool").uop.op is Ops.CAST


def test_realized_results_are_reused() -> None:
  a = Tensor.rand(16, 16).realize()
  m = a.max(1, keepdim=True)
  m.numpy()
  GlobalCounters.reset()
  (a - m).numpy()  # the max is already a buffer
  assert GlobalCounters.kernel_count == 1


@pytest.mark.skipif(not WORKGROUP_DEVICES, reason="needs a second device (OPENCL through pocl in CI)")
def test_constants_realized_on_one_device_are_not_reused_on_another() -> None:
  """Constants carry no device, so their graphs are one node everywhere; a buffer realized on the CPU must not feed another
  device's kernel (it did, when the garbage collector had not yet dropped the CPU's: a flaky failure on OpenCL in CI)."""
  on_cpu = Tensor.full((6,), 1.0, device="CPU").contiguous()
  on_cpu.numpy()
  other = WORKGROUP_DEVICES[0]
  out = Tensor(np.arange(6, dtype=np.float32), device=other) + Tensor.full((6,), 1.0, device=other).contiguous()
  assert out.numpy().tolist() == [1, 2, 3, 4, 5, 6] and on_cpu.numpy().tolist() == [1] * 6


def test_counters_count_ops_and_bytes() -> None:
  a, b = Tensor.rand(64, 64).realize(), Tensor.rand(64, 64).realize()
  GlobalCounters.reset()
  (a @ b).numpy()
  assert GlobalCounters.kernel_count == 1
  assert GlobalCounters.global_ops >= 2 * 64 ** 3
  assert GlobalCounters.global_mem >= 3 * 64 * 64 * 4
  if Device[Device.DEFAULT].asynchronous:  # a launch that returns at once has no time to count: DEBUG=2 waits for each kernel
    assert GlobalCounters.time_sum_s == 0
    with Context(DEBUG=2): (a @ b).numpy()
  assert GlobalCounters.time_sum_s > 0


def test_softmax_values() -> None:
  x = np.random.randn(7, 33).astype(np.float32)
  e = np.exp(x - x.max(1, keepdims=True))
  np.testing.assert_allclose(Tensor(x).softmax().numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_scheduling_without_running_marks_nothing_realized() -> None:
  a = Tensor.rand(8, 8).realize()
  t = a * 3
  assert kernels(t) == 1 and kernels(t) == 1  # a schedule that never ran must not stand in for the result
  np.testing.assert_allclose(t.numpy(), a.numpy() * 3)


def test_shared_copy_of_a_reduce_is_one_kernel() -> None:
  """A copy into memory (CONTIGUOUS) of a reshaped reduce that two targets read is realized once, with its reduce inside; it used to
  be the reduce's own kernel and then a copy of it (a wide convolution's output read by the forward and the backward)."""
  from tinytune.engine.realize import schedule_many
  x = Tensor(np.arange(24, dtype=np.float32).reshape(4, 6))
  c = x.sum(1).reshape(2, 2).contiguous()
  items, _ = schedule_many([(c + 1).uop, (c * 2).uop], "CPU")
  assert len(items) == 3 and sum(u.op.name == "REDUCE" for u in items[0].ast.toposort) == 1


def test_view_of_a_realized_input_is_one_view() -> None:
  """A pad of a realized tensor indexes its buffer directly: one view, no offset split into the inner shape's dims and joined again."""
  x = Tensor(np.ones((2, 3, 4), np.float32)).realize()
  items, _ = create_schedule((x.reshape(6, 4) * 2).contiguous().pad(((1, 1), (2, 0))).uop, "CPU")
  views = [u for u in items[-1].ast.toposort if u.op.name == "VIEW"]
  assert views and not any(v.src[0].op.name == "VIEW" for v in views)
  np.testing.assert_allclose((x.reshape(6, 4) * 2).contiguous().pad(((1, 1), (2, 0))).numpy()[1:-1, 2:], 2.0)


def test_a_row_statistic_is_computed_once_per_row_then_the_row_is_written() -> None:
  """softmax's max and sum, layernorm's mean and variance stay in the kernel that writes the row, on the CPU: the reduces run in
  the row's loop, one loop after another, before the loop over the row's elements (not once per element), their lanes and the
  row's stores both in vectors."""
  from tinytune.codegen.heuristic import default_opts
  x = np.random.default_rng(0).standard_normal((64, 1000)).astype(np.float32)
  def softmax(x: np.ndarray) -> np.ndarray: return np.exp(x - x.max(1, keepdims=True)) / np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)
  for build, ref in ((lambda t: t.softmax(1), softmax),
                     (lambda t: t.layernorm(), lambda x: (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5))):
    out = build(Tensor(x, device="CPU"))
    ((_, k),) = engine.kernels(out.uop, "CPU")
    assert k.n_global == 2 and len(k.reduceops) == 2 and k.reduce_out_dims == {0}
    k.apply_opts(opts := default_opts(k))
    assert {o.op.name for o in opts} >= {"LANES", "UPCAST"}
    src = Device["CPU"].renderer.render(k)
    body = src[src.index(f"void {k.name}"):]
    first, second = body.index("for (long r"), body.rindex("for (long r")  # the row's reduces, then its vectors
    assert first < second < body.index("for (long g1") and "_store(data0" in body
    np.testing.assert_allclose(out.numpy(), ref(x.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_a_row_statistic_leaves_where_it_cannot_stay() -> None:
  """Column statistics, rows too long for the cache, statistics another kernel reads too: a kernel of its own, as before; on
  devices with workgroups a row's statistic stays (a workgroup a row), as on the CPU."""
  from tinytune.engine.schedule import ROW_BYTES
  a = Tensor.rand(16, 16).realize()
  assert kernels(a - a.mean(0, keepdim=True)) == 2
  wide = Tensor.rand(2, ROW_BYTES // 4 + 64).realize()
  assert kernels(wide - wide.max(1, keepdim=True)) == 2
  s = a.sum(1, keepdim=True)
  assert kernels((a / s).contiguous() * 2 + a * s) == 3  # s once, not in both kernels that read it
  for device in WORKGROUP_DEVICES:
    b = Tensor.rand(16, 16, device=device).realize()
    assert kernels(b - b.mean(1, keepdim=True)) == 1 and kernels(b - b.mean(0, keepdim=True)) == 2
