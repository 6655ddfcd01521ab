from __future__ import annotations

import numpy as np
import pytest

from tinytune import engine
from tinytune.dtype import dtypes
from tinytune.kernels import WORKLOADS, get_workload
from tinytune.kernels.baselines import numpy_baseline, time_callable, torch_baseline
from tinytune.kernels.workload import outputs, result
from tinytune.search.evaluate import TimingPolicy

# two small sizes per workload, so every builder is checked against its NumPy reference quickly
SMALL = {
  "matmul": [{"m": 16, "n": 8, "k": 12}, {"m": 33, "n": 17, "k": 5}],
  "bmm": [{"batch": 2, "m": 8, "n": 8, "k": 8}, {"batch": 3, "m": 5, "n": 7, "k": 9}],
  "linear": [{"m": 4, "n": 8, "k": 16}, {"m": 5, "n": 7, "k": 1030}],
  "conv2d": [{"batch": 1, "cin": 2, "cout": 3, "size": 8, "kernel": 3, "stride": 1, "padding": 1},
             {"batch": 2, "cin": 3, "cout": 2, "size": 9, "kernel": 3, "stride": 2, "padding": 0}],
  "softmax": [{"rows": 4, "cols": 16}, {"rows": 7, "cols": 33}],
  "layernorm": [{"rows": 4, "cols": 16}, {"rows": 7, "cols": 33}],
  "reduce": [{"rows": 8, "cols": 16, "axis": 1}, {"rows": 9, "cols": 5, "axis": 0}],
  "elementwise": [{"n": 64}, {"n": 1001}],
  "attention": [{"batch": 1, "heads": 2, "seq": 8, "dim": 4, "causal": 0}, {"batch": 2, "heads": 1, "seq": 9, "dim": 8, "causal": 1}],
  "mlp": [{"batch": 4, "din": 8, "hidden": 16, "dout": 8}, {"batch": 3, "din": 5, "hidden": 7, "dout": 2}],
  # the MLP (its NumPy reference); the CNN's reference is PyTorch's: test_cnn_train_step_matches_torch
  "train_step": [{"batch": 8, "din": 12, "hidden": 16, "classes": 4}, {"batch": 5, "din": 7, "hidden": 6, "classes": 3}],
}
FAST = TimingPolicy(min_repeats=2, max_repeats=3, max_seconds=0.05, warmup_seconds=0.0)


def test_every_workload_has_small_sizes() -> None:
  assert set(SMALL) == set(WORKLOADS)


@pytest.mark.parametrize("name,index", [(n, i) for n in SMALL for i in range(2)])
def test_builder_matches_reference(name: str, index: int) -> None:
  w = get_workload(name)
  params = w.params(SMALL[name][index])
  out, arrays = w.instantiate(params)
  ref, got = w.reference(params, *arrays), result(out)
  assert got.shape == ref.shape == w.output(params)  # type: ignore[misc]
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
  assert w.flops(params) > 0 and w.nbytes(params) >= 4 * ref.size


# one size per workload large enough for the heuristics' vector tiles, lane counts and row passes
MEDIUM = {
  "matmul": {"m": 100, "n": 72, "k": 40}, "bmm": {"batch": 3, "m": 64, "n": 48, "k": 80}, "linear": {"m": 24, "n": 40, "k": 1024},
  "conv2d": {"batch": 2, "cin": 8, "cout": 16, "size": 20, "kernel": 3, "stride": 1, "padding": 1},
  "softmax": {"rows": 33, "cols": 100}, "layernorm": {"rows": 64, "cols": 256}, "reduce": {"rows": 77, "cols": 256, "axis": 0},
  "elementwise": {"n": 5001}, "attention": {"batch": 1, "heads": 2, "seq": 50, "dim": 16, "causal": 1},
  "mlp": {"batch": 32, "din": 64, "hidden": 128, "dout": 32}, "train_step": {"batch": 32, "din": 64, "hidden": 64, "classes": 10},
}


@pytest.mark.usefixtures("on_cpu")  # a CPU target's kernels
@pytest.mark.parametrize("target", ["x86-64-v3", "x86-64-v2"])
def test_defaults_on_narrower_cpus(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
  """Every workload's default kernels for an AVX2 target (8 lanes, 16 registers) or an SSE one (4 lanes), compiled for it, against
  the reference: CI runs on AVX-512, where the heuristics pick 16 lanes. Then the 16-bit floats' lanes: F16C's conversions (AVX2)
  and the compiler's (SSE)."""
  from tinytune.engine import forget, program
  from tinytune.runtime import Device
  from tinytune.runtime.cpu import CPUDevice, cannot_run, cpu_target
  if why := cannot_run(cpu_target(target)): pytest.skip(why)
  monkeypatch.setitem(Device._opened, "CPU", cpu := CPUDevice(target))
  width = cpu.caps.simd_width
  monkeypatch.setattr(program, "_programs", {})  # no kernel compiled for this machine, nor a plan that runs one
  forget()
  try:
    for name, p in MEDIUM.items():
      w = get_workload(name)
      params = w.params(p)
      out, arrays = w.instantiate(params)
      ref = w.reference(params, *arrays)
      np.testing.assert_allclose(result(out), ref.ravel() if isinstance(out, tuple) else ref, rtol=1e-3, atol=1e-3, err_msg=name)
    for name, dtype in [(n, d) for n in ("elementwise", "softmax", "layernorm", "matmul") for d in (dtypes.float16, dtypes.bfloat16)]:
      w = get_workload(name)
      params = w.params(MEDIUM[name])
      out, arrays = w.instantiate(params, dtype)
      ref = w.reference(params, *[a.astype(np.float32) for a in arrays])
      np.testing.assert_allclose(result(out).astype(np.float32), ref, rtol=3e-2, atol=3e-2, err_msg=f"{name} {dtype.name}")
  finally: forget()  # the plans run kernels built for the narrower CPU
  assert {f"tt_f{width}" in ck.src for ck in program._programs.values()} == {True, False}  # vector kernels, and scalar ones
  assert any(f"tt_f{width}_load_f16(" in ck.src for ck in program._programs.values())
  assert any(f"tt_f{width}_load_bf16(" in ck.src for ck in program._programs.values())


def test_cnn_train_step_matches_torch() -> None:
  """The CNN step (convolutions, batchnorm by batch statistics, max-pools) against PyTorch's autograd and Adam, given by name."""
  pytest.importorskip("torch")
  from tinytune.cli import parse_params
  w = get_workload("train_step")
  params = w.params(parse_params(["model=cnn", "batch=3", "size=20", "channels=2", "classes=3"], w.names))
  out, arrays = w.instantiate(params)
  ref, got = w.reference(params, *arrays), result(out)
  assert params["model"] == 1 and got.shape == ref.shape == w.output(params)  # type: ignore[misc]
  np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4)
  with pytest.raises(ValueError, match="or one of mlp, cnn"): parse_params(["model=rnn"], w.names)


@pytest.mark.parametrize("name", list(SMALL))
def test_builder_in_bfloat16(name: str) -> None:
  """bfloat16 inputs (each step rounds to 8 significant bits) against the reference on the same inputs in float32."""
  w = get_workload(name)
  params = w.params(SMALL[name][1])
  out, arrays = w.instantiate(params, dtypes.bfloat16)
  assert outputs(out)[0].dtype == dtypes.bfloat16 and all(a.dtype == dtypes.bfloat16.np for a in arrays)
  np.testing.assert_allclose(result(out).astype(np.float32), w.reference(params, *[a.astype(np.float32) for a in arrays]), rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("name", list(SMALL))
def test_torch_baseline_matches_reference(name: str) -> None:
  pytest.importorskip("torch")
  w = get_workload(name)
  params = w.params(SMALL[name][1])
  timing = torch_baseline(w, params, "CPU", FAST)
  np.testing.assert_allclose(timing.output, w.reference(params, *w.arrays(params)), rtol=1e-4, atol=1e-4)
  assert 0 < timing.min_s <= timing.median_s and timing.library == "torch" and timing.version


def test_torch_baseline_runs_on_the_targets_isa(monkeypatch: pytest.MonkeyPatch) -> None:
  """PyTorch is held to the CPU target's ISA (ATEN_CPU_CAPABILITY, DNNL_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS, read as it loads), in a
  process of its own, whatever this process imported: an AVX2 target's baseline runs AVX2 on an AVX-512 host."""
  torch = pytest.importorskip("torch")
  from tinytune.runtime import Device
  from tinytune.runtime.cpu import CPUDevice, cannot_run, cpu_target
  if cannot_run(cpu_target("x86-64-v3")): pytest.skip("needs an x86 CPU with AVX2")
  for name in ("ATEN_CPU_CAPABILITY", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"): monkeypatch.delenv(name, raising=False)
  w = get_workload("matmul")
  params = w.params(SMALL["matmul"][0])
  monkeypatch.setitem(Device._opened, "CPU", CPUDevice("x86-64-v3"))
  timing = torch_baseline(w, params, "CPU", FAST)
  assert timing.version.endswith(" avx2") and f"{Device['CPU'].caps.threads} threads" in timing.version, timing.version
  np.testing.assert_allclose(timing.output, w.reference(params, *w.arrays(params)), rtol=1e-4, atol=1e-4)
  monkeypatch.setitem(Device._opened, "CPU", CPUDevice("native"))
  assert torch_baseline(w, params, "CPU", FAST).version.endswith(" " + torch.backends.cpu.get_cpu_capability().lower())


def test_numpy_baseline_and_timing() -> None:
  w = get_workload("matmul")
  timing = numpy_baseline(w, w.params(SMALL["matmul"][0]), FAST)
  assert timing.library == "numpy" and timing.version == np.__version__ and 0 < timing.min_s <= timing.median_s
  times = time_callable(lambda: 1e-3, FAST)
  assert 2 <= len(times) <= 3 and times[0] == 1e-3


def test_gpu_defaults_outgrow_the_l2() -> None:
  """On a GPU with no parameters given, each workload but the training step takes its GPU defaults: the data at least an H100's
  50 MB L2, so a figure is not launch overhead; any -p given means the CPU defaults with it, as everywhere."""
  for w in WORKLOADS.values():
    if w.name == "train_step": continue
    p = w.params({}, gpu=True)
    assert p != w.params({}) and w.params({}, gpu=False) == w.defaults, w.name
    assert w.nbytes(p) >= 50e6, (w.name, w.nbytes(p))
  assert get_workload("matmul").params({"m": 64}, gpu=True) == {"m": 64, "n": 512, "k": 512}
  from tinytune.cli import is_gpu
  from tinytune.runtime import device_status
  assert not is_gpu("CPU") and (device_status("AMD") is None or not is_gpu("AMD"))  # an absent device is not a GPU to the CLI


def test_bad_parameters() -> None:
  with pytest.raises(ValueError, match="has no parameter"): get_workload("matmul").params({"q": 1})
  with pytest.raises(ValueError, match="unknown workload"): get_workload("nope")


def test_peaks_measured_once_and_stored(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
  from tinytune.kernels import peaks
  from tinytune.results_db import Database
  gflops, gbs, how = peaks.measure_peaks("CPU", n=64, copy_mb=1)
  assert gflops > 0 and gbs > 0 and "numpy" in how
  calls = []
  monkeypatch.setattr(peaks, "measure_peaks", lambda device: calls.append(device) or (50.0, 10.0, "fake"))
  db = Database(f"sqlite:///{tmp_path / 'p.db'}")
  fp = {"kind": "CPU", "name": "test"}
  assert peaks.device_peaks(db, "CPU", fp, measure=False) is None
  assert peaks.device_peaks(db, "CPU", fp) == (50.0, 10.0) == peaks.device_peaks(db, "CPU", fp) and calls == ["CPU"]
  stored = db.peak(db.device_id(fp))
  assert stored is not None and stored.probe == "fake"
  db.set_peak(db.device_id(fp), 60.0, 12.0, "again")
  assert peaks.device_peaks(db, "CPU", fp) == (60.0, 12.0)
  db.set_peak(db.device_id(fp), 40.0, 15.0, "under load")  # a probe beside other work measures low: each peak only rises
  assert peaks.device_peaks(db, "CPU", fp) == (60.0, 15.0)


def test_tuned_timing_uses_the_cache(tmp_path) -> None:  # type: ignore[no-untyped-def]
  from tinytune.codegen.opts import Opt, OptOps, opts_to_json
  from tinytune.kernels.baselines import tinytune_timing
  from tinytune.results_db import Database, fingerprint_hash
  from tinytune.runtime import device_fingerprint
  w = get_workload("elementwise")
  params = w.params({"n": 256})
  db = Database(f"sqlite:///{tmp_path / 'c.db'}")
  default = tinytune_timing(w, params, "CPU", False, FAST, db)
  untuned = tinytune_timing(w, params, "CPU", True, FAST, db, default)
  assert untuned.untuned and untuned.times == default.times and untuned.kernels[0]["opts_from"] == "defaults"
  out, _ = w.instantiate(params)
  ((_, kernel),) = engine.kernels(out.uop, "CPU")
  opts = [Opt(OptOps.UPCAST, 0, 4)]
  db.set_tuned(kernel.key, fingerprint_hash(device_fingerprint("CPU")), opts_to_json(opts), 1e-6, 2e-6, None)
  tuned = tinytune_timing(w, params, "CPU", True, FAST, db, default)
  assert not tuned.untuned and tuned.note == "" and tuned.kernels[0]["opts_from"] == "tuning cache"
  assert "UPCAST" in {o[0] for o in tuned.kernels[0]["opts"]}
  np.testing.assert_allclose(tuned.output, w.reference(params, *w.arrays(params)), rtol=1e-4, atol=1e-6)


# (workload, params) -> the default opts' kinds on the CPU with 16 float32 lanes and 2 threads, per kernel: the heuristics read a
# kernel's structure (which inputs vary along which dims), not its workload
STRUCTURE_CASES = [
  ("bmm", {}, [{"tile"}]),
  ("linear", {"k": 256}, [{"tile"}]), ("linear", {"k": 512}, [{"rows"}]),  # a long K: dot products along it (each output's sums in lanes)
  ("mlp", {}, [{"tile"}, {"tile"}]),  # a size-1 output axis; the second layer's inputs are computed (bias, relu): a wider tile
  # with WINO=0 (Winograd's: tests/test_winograd.py): the padded rows laid end to end (34 wide: no lanes), the implicit GEMM over
  # them, and the output copied out of the rows' junk columns
  ("conv2d", {}, [set(), {"tile"}, {"lanes"}]),
  # scores; the probabilities as vectors once (not a scalar per tile and step of the product), after the row's max and sum; the product
  ("attention", {"seq": 64}, [{"tile"}, {"rows"}, {"tile"}]),
  ("reduce", {"axis": 1}, [{"rows"}]),
  ("reduce", {"axis": 0}, [{"columns"}]),
  ("elementwise", {}, [{"lanes"}]),
]


@pytest.mark.parametrize("name,params,want", STRUCTURE_CASES, ids=[f"{c[0]}{c[1]}" for c in STRUCTURE_CASES])
def test_default_opts_follow_kernel_structure(name: str, params: dict[str, int], want: list[set[str]]) -> None:
  from tinytune.codegen.heuristic import THREAD_MIN_SECONDS, hand_coded_optimizations, lane_dim, single_core_seconds
  from tinytune.codegen.kernel import AxisKind, Kernel
  from tinytune.engine.schedule import create_schedule
  from tinytune.helpers import Context
  from tinytune.runtime import DeviceCaps
  w = get_workload(name)
  with Context(WINO=0): out, _ = w.instantiate(w.params(params), device="CPU")
  caps = DeviceCaps(has_local=False, threads=2, max_upcast=256, simd_width=16, vector_registers=32)
  got = []
  for item in create_schedule(out.uop, "CPU")[0]:
    k = Kernel(item.ast, caps)
    k.apply_opts(hand_coded_optimizations(k))
    upcast = {a.dim: a.size for a in k.axes if a.kind is AxisKind.UPCAST}
    lane = lane_dim(k)
    kinds = {"tile"} if len(upcast) == 2 and upcast.get(lane, 0) >= 16 else {"rows"} if any(a.kind is AxisKind.LANES for a in k.axes) \
      else {"columns"} if upcast.get(lane, 0) >= 64 else {"lanes"} if upcast.get(lane, 0) >= 16 else set(map(str, k.opts))
    if single_core_seconds(k) >= THREAD_MIN_SECONDS: assert any(a.kind is AxisKind.THREAD for a in k.axes), f"{k.name}: no threads"
    got.append(kinds)
  assert got == want


@pytest.mark.parametrize("what,shape,threads", [
  ("sum", (1024, 1024), False),  # 4 MB at cache speed: ~45 us on one core, where waking a second costs more than it saves
  ("sum", (4096, 4096), True), ("max", (256, 16384), True),  # 16-64 MB
  ("softmax", (1024, 1024), True),  # an exp of each element: ~0.3 ms
  ("matmul", (64, 64), False), ("matmul", (512, 512), True),
])
def test_threads_follow_estimated_time(what: str, shape: tuple[int, int], threads: bool) -> None:
  from tinytune import Tensor
  from tinytune.codegen.heuristic import hand_coded_optimizations
  from tinytune.codegen.kernel import Kernel
  from tinytune.engine.schedule import create_schedule
  from tinytune.runtime import DeviceCaps
  x = Tensor.rand(*shape).realize()
  out = {"sum": lambda: x.sum(1), "max": lambda: x.max(1), "softmax": lambda: x.softmax(-1), "matmul": lambda: x @ x}[what]()
  caps = DeviceCaps(has_local=False, threads=2, max_upcast=256, simd_width=16, vector_registers=32)
  k = Kernel(create_schedule(out.uop, "CPU")[0][-1].ast, caps)  # softmax: its last kernel, e / sum e
  assert any(o.op.name == "THREAD" for o in hand_coded_optimizations(k)) == threads


@pytest.mark.parametrize("n,k,swapped", [(1024, 1024, True), (64, 1024, False), (256, 256, False)])
def test_rows_sweep_column_panels_only_where_b_outgrows_l2(n: int, k: int, swapped: bool) -> None:
  """A @ B with B of 4 MB sweeps the tile rows inside each column panel (the loops swapped); with B of 256 KB (attention's P.V
  per head, a 256 matmul) the rows stay outer, each block of them reused from L1 by every column tile."""
  from tinytune import Tensor
  from tinytune.codegen.heuristic import hand_coded_optimizations
  from tinytune.codegen.kernel import Kernel
  from tinytune.codegen.opts import Opt, OptOps
  from tinytune.engine.schedule import create_schedule
  from tinytune.runtime import DeviceCaps
  a, b = Tensor.rand(512, k).realize(), Tensor.rand(k, n).realize()
  caps = DeviceCaps(has_local=False, threads=2, max_upcast=256, simd_width=16, vector_registers=32)
  (item,), _ = create_schedule((a @ b).uop, "CPU")
  assert (Opt(OptOps.SWAP, 0, 1) in hand_coded_optimizations(Kernel(item.ast, caps))) == swapped


@pytest.mark.parametrize("cols,dtype,want", [
  (1024, "float32", "[Opt(LANES, 0, 64)]"),  # 4 vectors of 16 lanes
  (1000, "float32", "[Opt(PADTO, 1, 64), Opt(LANES, 0, 64)]"),  # whole vectors; the loop's last iteration masks (split)
  (40, "float32", "[Opt(PADTO, 1, 16), Opt(LANES, 0, 16)]"),  # two whole iterations before the padding
  (1024, "int32", "[Opt(LANES, 0, 16)]"),  # scalar partials that the compiler vectorizes
])
def test_row_reduce_lanes(cols: int, dtype: str, want: str) -> None:
  from tinytune import Tensor, dtypes
  from tinytune.codegen.heuristic import hand_coded_optimizations
  from tinytune.codegen.kernel import Kernel
  from tinytune.engine.schedule import create_schedule
  from tinytune.runtime import DeviceCaps
  x = Tensor.rand(64, cols).cast(getattr(dtypes, dtype)).realize()
  caps = DeviceCaps(has_local=False, threads=2, max_upcast=256, simd_width=16, vector_registers=32)
  (item,), _ = create_schedule(x.max(1).uop, "CPU")
  assert str(hand_coded_optimizations(Kernel(item.ast, caps))) == want
