"""The run path: schedule and lowering caches, TinyJit, counter-based random numbers, the buffer pool."""
from __future__ import annotations

import gc
import weakref
from typing import Iterator

import numpy as np
import pytest

from tinytune import Context, GlobalCounters, Tensor, TinyJit, dtypes, engine
from tinytune.runtime import POOL, Buffer, Device, device_status
from tinytune.uop import Ops, UOp


@pytest.fixture
def own_garbage() -> Iterator[None]:
  """Garbage collection during the test sees only the objects the test made (gc.freeze): other tests' cyclic garbage, collected
  midway, would give the pool memory this test did not free, and a gc.collect() over the full suite's heap took seconds."""
  gc.freeze()
  try: yield
  finally: gc.unfreeze()


def mlp_step(x: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
  h = (x @ w1).relu()
  return (h @ w2).softmax(-1).realize()


def reference(x: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
  y = np.maximum(x @ w1, 0) @ w2
  e = np.exp(y - y.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_same_structure_renders_and_compiles_nothing() -> None:
  rng = np.random.default_rng(1)
  w1, w2 = Tensor(rng.standard_normal((16, 32), dtype=np.float32)).realize(), Tensor(rng.standard_normal((32, 8), dtype=np.float32)).realize()
  mlp_step(Tensor(rng.standard_normal((4, 16), dtype=np.float32)), w1, w2)
  GlobalCounters.reset()
  x = rng.standard_normal((4, 16), dtype=np.float32)
  out = mlp_step(Tensor(x), w1, w2)
  assert (GlobalCounters.renders, GlobalCounters.compiles, GlobalCounters.schedule_misses) == (0, 0, 0)
  assert GlobalCounters.schedule_hits == 1 and GlobalCounters.kernel_count >= 2
  np.testing.assert_allclose(out.numpy(), reference(x, w1.numpy(), w2.numpy()), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("shapes", [((5, 3), (3, 4)), ((2, 5, 3), (3, 4)), ((5, 3), (2, 3, 4)), ((2, 1, 5, 3), (4, 3, 2)), ((3,), (3, 4)),
                                    ((5, 3), (3,)), ((1, 1), (1, 7)), ((0, 3), (3, 2))])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_matmul_builds_the_graph_the_general_path_builds(shapes: tuple[tuple[int, ...], ...], dtype: str) -> None:
  """Outside autograd, matmul builds its graph directly: node for node the one the Tensor ops build (so its kernels, and
  their keys in a tuning cache, are the same), and the same values."""
  a, b = (Tensor(np.random.rand(*s).astype(dtype)) for s in shapes)
  fast = a @ b
  general = a.requires_grad_() @ b  # autograd takes the general path
  assert fast.uop is general.uop and fast.shape == np.matmul(a.numpy(), b.numpy()).shape
  if b.ndim < 2: return
  a.requires_grad_(False)
  lazy = (a + 0) @ (b.transpose(-1, -2) * 2).transpose(-1, -2)  # computed inputs, and a permuted view that cannot merge
  assert lazy.uop is ((a + 0).requires_grad_() @ (b.transpose(-1, -2) * 2).transpose(-1, -2)).uop
  np.testing.assert_allclose(lazy.numpy(), np.matmul(a.numpy(), 2 * b.numpy()), rtol=1e-5, atol=1e-6)


def test_matmul_of_views_builds_the_general_paths_graph() -> None:
  """The fast path's views are worked out once per (shapes, input views): equal shapes over other views are other graphs."""
  rng = np.random.default_rng(2)
  base = Tensor(rng.random((6, 6), dtype=np.float32)).realize()
  views = [base, base.T, base.flip(0), base.pad(((1, 0), (0, 0))).shrink(((0, 6), (0, 6))), base[::1, ::1] * 2, base.reshape(36).reshape(6, 6)]
  for x in views:
    for y in views:
      fast = x @ y
      assert fast.uop is (x.requires_grad_() @ y).uop
      x.requires_grad_(False)
      np.testing.assert_allclose(fast.numpy(), x.numpy() @ y.numpy(), rtol=1e-5)


@pytest.mark.usefixtures("on_cpu")
def test_the_schedule_cache_tells_dtypes_devices_and_the_tuning_policy_apart(monkeypatch: pytest.MonkeyPatch) -> None:
  def misses(x: Tensor) -> tuple[int, list]:
    GlobalCounters.reset()
    out = (x * 3 + 1).numpy()
    return GlobalCounters.schedule_misses, out.tolist()
  ones = np.ones(5)
  assert misses(Tensor(ones.astype(np.float32))) in ((0, [4.0] * 5), (1, [4.0] * 5))
  assert misses(Tensor(ones.astype(np.float32))) == (0, [4.0] * 5)
  assert misses(Tensor(ones.astype(np.float64)))[0] == 1 and misses(Tensor(ones.astype(np.float64)))[0] == 0
  assert misses(Tensor(ones.astype(np.int32))) == (1, [4] * 5)
  monkeypatch.setenv("TINYTUNE_TUNE", "0")  # another opts policy: the plan's programs may be others
  assert misses(Tensor(ones.astype(np.float32))) == (1, [4.0] * 5)
  monkeypatch.delenv("TINYTUNE_TUNE")
  assert misses(Tensor(ones.astype(np.float32)))[0] == 0
  if device_status("OPENCL") is None: assert misses(Tensor(ones.astype(np.float32), device="OPENCL")) == (1, [4.0] * 5)


@pytest.mark.usefixtures("on_cpu", "own_garbage")
def test_pooled_memory_keeps_its_address_under_another_dtype() -> None:
  from tinytune.runtime.cpu import address
  POOL.clear()
  a = (Tensor(np.arange(1000, dtype=np.float32)) * 2).realize()
  place = address(a.uop.src[0].arg)
  del a
  gc.collect()
  b = (Tensor(np.arange(1000, dtype=np.int32)) + 5).realize()  # the first input takes the 4000 bytes back
  buffers = [u.arg for u in b.uop.toposort if u.op is Ops.BUFFER]
  assert all(address(buf) == buf.mem.__array_interface__["data"][0] for buf in buffers) and place in [address(buf) for buf in buffers]
  np.testing.assert_equal(b.numpy(), np.arange(1000) + 5)


def test_a_new_structure_misses_the_schedule_cache_but_reuses_equal_kernels() -> None:
  a = Tensor(np.ones((8, 8), np.float32)).realize()
  (a * 3 + 1).realize()
  GlobalCounters.reset()
  ((a * 3 + 1) * 1).realize()  # another graph; its kernel is another kernel
  assert GlobalCounters.schedule_misses == 1 and GlobalCounters.renders == 1
  GlobalCounters.reset()
  b = Tensor(np.ones((8, 8), np.float32)).realize()
  np.testing.assert_equal((b * 3 + 1).numpy(), np.full((8, 8), 4, np.float32))
  assert GlobalCounters.schedule_hits == 1 and GlobalCounters.renders == 0


def test_the_opts_policy_in_force_picks_the_programs() -> None:
  from tinytune.engine.realize import capturing
  def opts_of_a_matmul() -> tuple:
    a = Tensor(np.ones((64, 64), np.float32)).realize()
    with capturing() as captured: assert np.all((a @ a).numpy() == 64)
    return captured[0][0].opts
  assert opts_of_a_matmul()
  with Context(NOOPT=1): assert opts_of_a_matmul() == ()
  assert opts_of_a_matmul()


def test_equal_constants_of_other_signs_are_other_schedules() -> None:
  a = Tensor(np.ones(4, np.float32)).realize()
  assert (a * 0.0).numpy().tolist() == [0.0] * 4
  assert [str(v) for v in (a * -0.0).numpy().tolist()] == ["-0.0"] * 4


@pytest.mark.usefixtures("each_device")
def test_tinyjit_replays_equal_the_plain_run() -> None:
  rng = np.random.default_rng(2)
  w1n, w2n = rng.standard_normal((16, 32), dtype=np.float32), rng.standard_normal((32, 8), dtype=np.float32)
  w1, w2 = Tensor(w1n).realize(), Tensor(w2n).realize()
  jitted = TinyJit(mlp_step)
  for i in range(10):
    x = rng.standard_normal((4, 16), dtype=np.float32)
    GlobalCounters.reset()
    out = jitted(Tensor(x), w1, w2)
    np.testing.assert_allclose(out.numpy(), reference(x, w1n, w2n), rtol=1e-4, atol=1e-6)
    if i >= 2: assert GlobalCounters.renders == 0 and GlobalCounters.schedule_hits + GlobalCounters.schedule_misses == 0, "a replay scheduled"
  assert jitted.captured is not None and len(jitted.captured.steps) >= 2


@pytest.mark.usefixtures("each_device")
def test_tinyjit_replays_a_function_with_no_tensor_arguments() -> None:
  """A step that samples its own batch has no Tensor arguments: its replay finds the device from the kernels' buffers (off the CPU
  it read the first Tensor argument's, an IndexError), and draws new numbers each call as the plain run does."""
  w = Tensor(np.arange(4, dtype=np.float32)).realize()
  def step() -> Tensor: return (Tensor.rand(4) + w * 2).realize()
  Tensor.manual_seed(5)
  plain = [step().numpy() for _ in range(5)]
  Tensor.manual_seed(5)
  jitted = TinyJit(step)
  replayed = [jitted().numpy() for _ in range(5)]
  assert jitted.captured is not None and jitted.calls == 5
  for a, b in zip(plain, replayed): np.testing.assert_allclose(a, b, rtol=1e-6)
  assert len({tuple(r) for r in replayed}) == 5


def test_tinyjit_captures_kernels_an_earlier_realize_already_ran() -> None:
  rng = np.random.default_rng(3)
  w = Tensor(rng.random(8, dtype=np.float32)).realize()
  def f(x: Tensor) -> Tensor: return (x * w + 1).realize()
  jitted = TinyJit(f)
  x = Tensor(rng.random(8, dtype=np.float32)).realize()
  y = x * w + 1
  held = y.uop  # the graph node stays alive, realized: the capture's graph over x is this very node
  y.realize()
  for _ in range(2): jitted(x)  # the second call captures: it must run the kernel, not reuse the realized node
  for _ in range(3):
    xn = rng.random(8, dtype=np.float32)
    np.testing.assert_allclose(jitted(Tensor(xn)).numpy(), xn * w.numpy() + 1, rtol=1e-6)
  assert held.__dict__.get("realized_as") is not None


@pytest.mark.usefixtures("on_cpu")
def test_tinyjit_on_the_cpu_is_one_native_call() -> None:
  jitted = TinyJit(lambda x: ((x + 1) * 2).sum().realize())
  for v in range(4): assert jitted(Tensor(np.full(8, v, np.float32))).item() == 16 * (v + 1)
  assert jitted.captured is not None and jitted.captured.batch is not None


def test_tinyjit_refuses_other_shapes_dtypes_and_arguments() -> None:
  jitted = TinyJit(lambda x, scale: (x * scale).realize())
  for _ in range(3): jitted(Tensor(np.ones(4, np.float32)), 2.0)
  with pytest.raises(ValueError, match=rf"captured by TinyJit with Tensor arguments \(4,\) float32 on {Device.DEFAULT}, not \(5,\) float32"):
    jitted(Tensor(np.ones(5, np.float32)), 2.0)
  with pytest.raises(ValueError, match="not \\(4,\\) int32"): jitted(Tensor(np.ones(4, np.int32)), 2.0)
  with pytest.raises(ValueError, match="other arguments"): jitted(Tensor(np.ones(4, np.float32)), 3.0)
  jitted.reset()
  assert jitted(Tensor(np.ones(5, np.float32)), 3.0).numpy().tolist() == [3.0] * 5


def test_tinyjit_inputs_that_are_views() -> None:
  jitted = TinyJit(lambda x: (x * 2).realize())
  base = np.arange(20, dtype=np.float32).reshape(4, 5)
  for i in range(4):
    got = jitted(Tensor(base + i)[1:3, 2:]).numpy()  # a view into a larger buffer: copied in, as on every call
    np.testing.assert_equal(got, (base + i)[1:3, 2:] * 2)


def test_tinyjit_takes_tuples_and_keywords_among_its_other_arguments() -> None:
  """A positional tuple is an other argument like any (a 1-tuple raised IndexError), and so is a keyword that is not a Tensor."""
  jitted = TinyJit(lambda x, k, scale=1.0: (x * k[0] * scale).realize())
  for i in range(4): out = jitted(Tensor(np.full(4, i, np.float32)), (2.0,), scale=0.5)
  assert out.numpy().tolist() == [3.0] * 4
  with pytest.raises(ValueError, match="other arguments"): jitted(Tensor(np.ones(4, np.float32)), (3.0,), scale=0.5)
  with pytest.raises(ValueError, match="other arguments"): jitted(Tensor(np.ones(4, np.float32)), (2.0,), scale=2.0)


def test_tinyjit_inputs_pending_or_lazy_are_realized_before_a_replay() -> None:
  """A replay reads an input's buffer as it is once realized: a pending assign is written first, a lazy input computed."""
  jitted = TinyJit(lambda x: (x + 1).realize())
  for _ in range(3): jitted(Tensor(np.zeros(4, np.float32)).realize())
  x = Tensor(np.zeros(4, np.float32)).realize()
  x.assign(Tensor(np.full(4, 5, np.float32)))
  assert jitted(x).numpy().tolist() == [6.0] * 4
  assert jitted(Tensor(np.ones(4, np.float32)) * 3).numpy().tolist() == [4.0] * 4


def threefry_reference(k0: int, k1: int, x0: int, x1: int) -> tuple[int, int]:
  """Threefry-2x32-20 in plain Python, from the paper's description."""
  m, rot = 0xFFFFFFFF, (13, 15, 26, 6, 17, 29, 16, 24)
  ks = (k0, k1, k0 ^ k1 ^ 0x1BD11BDA)
  x0, x1 = (x0 + ks[0]) & m, (x1 + ks[1]) & m
  for r in range(20):
    x0 = (x0 + x1) & m
    x1 = (((x1 << rot[r % 8]) | (x1 >> (32 - rot[r % 8]))) & m) ^ x0
    if r % 4 == 3:
      s = r // 4 + 1
      x0, x1 = (x0 + ks[s % 3]) & m, (x1 + ks[(s + 1) % 3] + s) & m
  return x0, x1


def test_threefry_matches_the_published_answer_and_a_reference() -> None:
  assert threefry_reference(0, 0, 0, 0) == (0x6B200159, 0x99BA4EFE)  # Random123's known-answer vector for key 0, counter 0
  seed = 0x12345678_9ABCDEF0
  Tensor.manual_seed(seed)
  first = Tensor.rand(3).numpy()
  second = Tensor.rand(5).numpy()  # counters 3..7
  want = [threefry_reference(seed & 0xFFFFFFFF, seed >> 32, c, 0)[0] >> 8 for c in range(8)]
  np.testing.assert_equal(np.concatenate([first, second]), np.array(want, np.float64) / 2 ** 24)


def test_random_numbers_repeat_under_a_seed() -> None:
  Tensor.manual_seed(7)
  a = [Tensor.rand(64).numpy(), Tensor.randn(8, 8).numpy(), Tensor.randint(16, low=2, high=9).numpy()]
  Tensor.manual_seed(7)
  b = [Tensor.rand(64).numpy(), Tensor.randn(8, 8).numpy(), Tensor.randint(16, low=2, high=9).numpy()]
  for x, y in zip(a, b): np.testing.assert_equal(x, y)
  assert not np.array_equal(Tensor.rand(64).numpy(), a[0])
  assert a[2].min() >= 2 and a[2].max() < 9 and a[2].dtype == np.int32


def test_random_numbers_look_uniform_and_normal() -> None:
  u = Tensor.rand(1 << 16).numpy()
  assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
  n = Tensor.randn(1 << 16).numpy()
  assert abs(n.mean()) < 0.02 and abs(n.std() - 1) < 0.02 and np.isfinite(n).all()


def test_random_ops_under_tinyjit_draw_anew_and_follow_the_seed() -> None:
  def step(x: Tensor) -> Tensor:
    Tensor.training = True
    try: return (x.dropout(0.5) + Tensor.rand(4) + Tensor.randn(4)).realize()
    finally: Tensor.training = False
  x = np.ones(4, np.float32)
  Tensor.manual_seed(3)
  plain = [step(Tensor(x)).numpy() for _ in range(6)]
  Tensor.manual_seed(3)
  jitted = TinyJit(step)
  replayed = [jitted(Tensor(x)).numpy() for _ in range(6)]
  assert jitted.captured is not None and len(jitted.captured.draws) == 3  # dropout's mask, rand, randn's pair
  for a, b in zip(plain, replayed): np.testing.assert_allclose(a, b, rtol=1e-6)
  assert len({tuple(r) for r in replayed}) == 6, "a replay repeated the numbers of another call"


def test_dropout_only_while_training() -> None:
  x = Tensor(np.ones(1000, np.float32))
  assert x.dropout(0.3) is x
  Tensor.training = True
  try: kept = x.dropout(0.3).numpy()
  finally: Tensor.training = False
  assert set(np.unique(kept).tolist()) <= {0.0, np.float32(1 / 0.7)} and 0.6 < (kept > 0).mean() < 0.8


@pytest.mark.usefixtures("own_garbage")
def test_the_pool_reuses_freed_memory() -> None:
  POOL.clear()
  a = Buffer("CPU", 1000, dtypes.float32)
  address = a.mem.__array_interface__["data"][0]
  del a
  gc.collect()
  b = Buffer("CPU", 1000, dtypes.int32)  # the same 4000 bytes
  assert b.mem.__array_interface__["data"][0] == address and b.mem.dtype == np.int32


@pytest.mark.usefixtures("on_cpu", "own_garbage")
def test_the_pool_never_hands_out_live_memory(monkeypatch: pytest.MonkeyPatch) -> None:
  """Each step's input goes back to the pool, which hands that memory out again: to the next steps, never to a buffer still alive."""
  POOL.clear()
  taken: list[bool] = []
  take = POOL.take
  monkeypatch.setattr(POOL, "take", lambda device, nbytes: taken.append((mem := take(device, nbytes)) is not None) or mem)
  rng = np.random.default_rng(4)
  kept = []
  for _ in range(20):  # each step frees temporaries of the same size as the tensors kept alive
    x = Tensor(rng.random(4096, dtype=np.float32))
    y = (x * 2 + 1).realize()  # one kernel for all steps (a constant per step compiled 20); x tells the outputs apart
    kept.append((y, x.numpy() * 2 + 1))
    del x
    gc.collect()
  assert sum(taken) >= len(kept) // 2, taken  # most steps got pooled memory
  addresses = [t.uop.src[0].arg.mem.__array_interface__["data"][0] for t, _ in kept]
  assert len(set(addresses)) == len(addresses)
  for t, want in kept: np.testing.assert_allclose(t.numpy(), want, rtol=1e-6)


def test_a_realized_graph_is_freed_without_the_garbage_collector() -> None:
  (Tensor(np.ones(1000, np.float32)) * 2 + 1).realize()  # compiled (rendering leaves cycles once per kernel), then cached
  gc.collect()
  gc.disable()  # reference counting alone must give the buffers back to the pool: a cycle would hold them until a collection
  try:
    x = Tensor(np.ones(1000, np.float32)).realize()
    buffer = weakref.ref(x.uop.src[0].arg)
    y = (x * 2 + 1).realize()
    np.testing.assert_allclose(y.numpy(), 3)
    del x, y
    assert buffer() is None
  finally: gc.enable()


def test_cpu_memory_starts_on_a_cache_line() -> None:
  POOL.clear()
  for size, dtype in ((1 << 20, dtypes.float32), (3, dtypes.int8), (1000, dtypes.float64)):
    mem = Buffer("CPU", size, dtype).mem
    assert mem.__array_interface__["data"][0] % 64 == 0 and mem.size == size and mem.dtype == dtype.np


def test_the_pool_is_bounded_and_frees_what_it_drops(monkeypatch: pytest.MonkeyPatch) -> None:
  """Memory past the limit goes back to its device (cuMemFree on CUDA: dropped CUDA memory was never freed), as does a buffer too big to
  pool; the newest stays pooled."""
  from tinytune.runtime import BufferPool, Device
  freed: list[str] = []
  monkeypatch.setattr(type(Device["CPU"]), "free", lambda self, mem: freed.append(mem))
  pool = BufferPool(limit=10_000)
  for i in range(5): pool.give("CPU", 4000, (f"mem{i}", None))
  pool.give("CPU", 20_000, ("big", None))
  assert freed == ["mem0", "mem1", "mem2", "big"] and pool.held == 8000
  assert pool.take("CPU", 4000) == ("mem4", None) and pool.take("CPU", 4000) == ("mem3", None) and pool.take("CPU", 4000) is None


def test_opts_are_looked_up_once_per_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
  from tinytune.results_db.cache import TuningCache
  calls = []
  real = TuningCache.lookup
  def counting(self, kernel, device):  # type: ignore[no-untyped-def]
    calls.append(kernel.key)
    return real(self, kernel, device)
  monkeypatch.setattr(TuningCache, "lookup", counting)
  engine.forget()
  a = Tensor(np.ones((3, 7), np.float32)).realize()
  for _ in range(3): (a.sum(1) * 5).realize()
  assert len(calls) == 1
  engine.forget()
  (Tensor(np.ones((3, 7), np.float32)).sum(1) * 5).realize()
  (Tensor(np.ones((3, 7), np.float32)).sum(1) * 6).realize()  # another schedule with an equal-looking kernel: a lookup of its own key
  assert len(calls) == 3 and calls[1] == calls[0]


def test_capture_records_kernels_with_their_buffers() -> None:
  from tinytune.engine.realize import capturing
  with capturing() as captured: out = (Tensor(np.ones(4, np.float32)) + 1).realize()
  ((kernel, bufs),) = captured
  assert bufs[0] is out.uop.src[0].arg and kernel.name.startswith("E_")
  assert isinstance(out.uop, UOp) and out.uop.op is Ops.VIEW


def test_kernels_of_a_program_in_order_with_labels_unique_in_it() -> None:
  a, b = Tensor.rand(16, 20).realize(), Tensor.rand(16, 20).realize()
  items = engine.schedule_many([a.sum(1).uop, b.sum(1).uop, (a * 2).sum(1).uop], "CPU")[0]
  labelled = engine.kernels(items, "CPU")
  assert [label for label, _ in labelled] == ["r_16_20", "r_16_20", "r_16_20#2"]  # the same kernel twice keeps its label
  assert labelled[0][1].key == labelled[1][1].key != labelled[2][1].key
  graph = (a * 2).sum(1).uop
  assert [(label, k.key) for label, k in engine.kernels(graph, "CPU")] == [("r_16_20", labelled[2][1].key)]  # a graph: its schedule


def test_kernel_opts_by_policy(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
  from tinytune.codegen.heuristic import default_opts
  from tinytune.codegen.opts import Opt, OptOps, opts_to_json
  from tinytune.results_db import Database, fingerprint_hash
  from tinytune.runtime import device_fingerprint
  monkeypatch.setenv("TINYTUNE_DB", path := str(tmp_path / "t.db"))
  for key in ("TINYTUNE_TUNE", "BEAM", "TINYTUNE_CACHE"): monkeypatch.delenv(key, raising=False)
  engine.forget()
  [(_, kernel)] = engine.kernels((Tensor.rand(64, 64).realize() * 3).sum(1).uop, "CPU")
  default = tuple(default_opts(kernel))
  assert engine.kernel_opts(kernel, "CPU", "default") == default == engine.kernel_opts(kernel, "CPU")  # nothing tuned: the run's are the defaults
  assert engine.kernel_opts(kernel, "CPU", "tuned") is None
  tuned = (Opt(OptOps.UNROLL, 0, 4),)
  Database(path).set_tuned(kernel.key, fingerprint_hash(device_fingerprint("CPU")), opts_to_json(tuned), 1e-6, 2e-6, None)
  assert engine.kernel_opts(kernel, "CPU", "tuned") == tuned and engine.kernel_opts(kernel, "CPU", "tuned", Database(path)) == tuned
  assert engine.kernel_opts(kernel, "CPU") == default  # the run's are read once per process ...
  engine.forget()
  assert engine.kernel_opts(kernel, "CPU") == tuned  # ... until forget()
  monkeypatch.setenv("TINYTUNE_TUNE", "0")
  assert engine.kernel_opts(kernel, "CPU") == default  # the cache skipped
  with pytest.raises(ValueError, match="unknown opts policy 'best'"): engine.kernel_opts(kernel, "CPU", "best")  # type: ignore[call-overload]
  engine.forget()


def test_the_run_path_loads_no_search_and_the_api_registers_its_tuner() -> None:
  import os
  import subprocess
  import sys
  code = ("import sys; from tinytune import Tensor, api; from tinytune.engine import program; (Tensor.ones(4) + 1).numpy()\n"
          "assert 'tinytune.search.tune' not in sys.modules and program._first_use_tuner is api._tune_on_first_use")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "TINYTUNE_TUNE": "1"})
  assert proc.returncode == 0, proc.stderr


def test_a_nan_constant_hits_the_schedule_cache() -> None:
  """A constant is in the schedule's key as its node (hash-consed by its repr): NaN, which equals nothing, still finds its plan."""
  (Tensor(np.ones(4, np.float32)).realize() * float("nan")).realize()
  GlobalCounters.reset()
  assert np.isnan((Tensor(np.ones(4, np.float32)).realize() * float("nan")).numpy()).all()
  assert (GlobalCounters.schedule_hits, GlobalCounters.schedule_misses) == (1, 0)


def test_a_graph_realized_again_after_an_assign_to_its_input_is_computed_again() -> None:
  """The same graph (the very nodes, by hash-consing) over memory that an assign wrote in place: computed again, never memoized."""
  a = Tensor.zeros(4).contiguous().realize()
  a.assign(Tensor.ones(4)).realize()  # a's own memory from here on
  assert (a * 2 + 1).numpy().tolist() == [3.0] * 4
  a.assign(Tensor.full((4,), 5.0)).realize()  # the same memory, written in place
  assert (a * 2 + 1).numpy().tolist() == [11.0] * 4
  a.assign(a * 2).realize()  # a write that reads the memory it writes
  assert (a * 2 + 1).numpy().tolist() == [21.0] * 4


def test_a_realized_constant_pins_no_buffer_while_the_schedule_cache_keeps_it() -> None:
  """A constant's broadcast is kept alive by the schedule cache's key (the next step finds it built): realizing that constant by
  itself marks nothing on it, so its buffer goes with the tensor, and graphs that read the constant compute it again."""
  x = Tensor(np.ones(1000, np.float32)).realize()
  assert (x + 0.25).numpy().tolist() == [1.25] * 1000  # the key holds the broadcast 0.25 of 1000 places
  quarter = Tensor.full((1000,), 0.25).realize()
  buffer = weakref.ref(quarter.uop.src[0].arg)
  del quarter
  gc.collect()
  assert buffer() is None
  assert (x * 0.0 + 0.25).numpy().tolist() == [0.25] * 1000 and (Tensor(np.zeros(1000, np.float32)) + 0.25).numpy().tolist() == [0.25] * 1000


def test_a_step_imports_nothing_per_call() -> None:
  """The functions every step runs hold no import statement: one in Tensor.realize cost 1.3 us of a one-kernel step's 27 (the
  module lookup and its locks run at every call, imported already or not)."""
  import dis
  import importlib

  from tinytune.engine.jit import TinyJit as Jit
  from tinytune.runtime import KernelArgs, KernelGraph
  from tinytune.runtime.cpu import CPUProgram
  from tinytune.runtime.cuda import CUDAGraph, CUDAProgram  # importable without NVIDIA's bindings
  realize = importlib.import_module("tinytune.engine.realize")  # the module, which tinytune.engine's realize function shadows
  hot = [Tensor.realize, Tensor.assign, Tensor._binop, Tensor._broadcasted, Tensor._alu, Tensor._of, realize.realize, realize.structure,
         realize.Plan.run, realize.run_kernel, Jit.__call__, Jit._replay, KernelGraph.__call__, KernelArgs.set, CPUProgram.__call__,
         CUDAProgram.__call__, CUDAGraph.update, CUDAGraph.launch, Buffer.__init__, Buffer.__del__, UOp.__new__]
  imports = [f"{fn.__qualname__}: {i.argval}" for fn in hot for i in dis.get_instructions(fn) if i.opname == "IMPORT_NAME"]
  assert not imports, imports


def test_structure_walks_the_graph_in_toposort_order() -> None:
  """engine.realize.structure, which takes leaves (buffers, constants and their broadcasts) as it meets them instead of pushing each
  on its stack (7% of a one-kernel step's CPU time): the nodes in toposort's order, constants' broadcasts not walked into, each
  buffer once in the order met, and the same key for the same graph over other buffers."""
  import importlib
  structure = importlib.import_module("tinytune.engine.realize").structure
  a, b, c = (Tensor(np.full((4, 4), i, np.float32)).realize() for i in range(3))
  def graph(x: Tensor, y: Tensor) -> UOp: return ((x * 0.5 + y).relu() @ x.T + 2.0 + y.sum(1, keepdim=True)).uop
  found = structure(graph(a, b), "CPU")
  assert found is not None
  topo, key, buffers, index = found
  inside_constants = {s for u in topo if u.op is Ops.VIEW and u.src[0].op is Ops.CONST for s in u.src}
  assert topo == [u for u in graph(a, b).toposort if u not in inside_constants] and index == {u: i for i, u in enumerate(topo)}
  assert buffers == [a.uop.src[0].arg, b.uop.src[0].arg]
  other = structure(graph(c, a), "CPU")
  assert other is not None and other[1] == key and other[2] == [c.uop.src[0].arg, a.uop.src[0].arg]
