"""The tuning harness: strategies on real CPU kernels, failure paths, the results database and the tuning cache."""
from __future__ import annotations

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, wait

import numpy as np
import pytest

from tinytune import Device, Kernel, Tensor, engine
from tinytune.codegen.caps import cuda_caps
from tinytune.codegen.heuristic import alternative_opts, default_opts
from tinytune.codegen.opts import Opt, OptOps, opts_to_json
from tinytune.dtype import DType, dtypes
from tinytune.engine.schedule import create_schedule
from tinytune.results_db import Database
from tinytune.runtime import Buffer
from tinytune.search.evaluate import Built, Evaluator, Result, Timing, TimingPolicy, _Sent, _Worker, source_hash
from tinytune.search.space import actions
from tinytune.search.strategy import STRATEGIES, Budget, SearchContext, run_strategy


def cpu_kernel(t: Tensor) -> Kernel:
  """The first kernel of t's program on the CPU."""
  return engine.kernels(t.uop, "CPU")[0][1]


def matmul_kernel(n: int = 64, dtype: DType = dtypes.float32) -> Kernel:
  a, b = Tensor.rand(n, n).cast(dtype).realize(), Tensor.rand(n, n).cast(dtype).realize()
  return cpu_kernel(a @ b)


def tinytune(*args: str, db: str, timeout: float = 240) -> subprocess.CompletedProcess:
  env = {**os.environ, "TINYTUNE_DB": db}
  return subprocess.run([sys.executable, "-m", "tinytune.cli", *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_actions_are_valid_and_bounded() -> None:
  k = matmul_kernel()
  acts = actions(k)
  assert acts and all(o.op not in (OptOps.LOCAL, OptOps.GROUP, OptOps.TC) for o in acts)
  for o in acts: k.copy().apply_opt(o)
  kinds = {(o.op, o.axis) for o in acts}
  assert {(o.op, o.axis) for o in acts[:len(kinds)]} == kinds  # every kind of move before a second amount of any


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_finds_a_verified_kernel_no_slower_than_default(strategy: str) -> None:
  k = matmul_kernel()
  with Evaluator(k, "CPU") as ev:
    result = run_strategy(strategy, k, ev, Budget(8), default_opts(k))
  assert result.counts().get("ok", 0) >= 2
  assert 2 <= sum(v for s, v in result.counts().items() if s != "invalid") <= 8 + 2
  assert result.best_s <= result.default_s
  k.copy().apply_opts(result.best)


def _inject(marker: Opt, body: str):
  """A render hook that swaps in a broken kernel body for candidates holding `marker`."""
  def render(k: Kernel) -> str:
    src = Device["CPU"].renderer.render(k)
    if marker not in k.opts: return src
    head = src[:src.index("{", src.index(f"void {k.name}(")) + 1]
    return head + body + "}\n"
  return render


@pytest.mark.parametrize("body, status", [
  ("*(volatile int*)0 = 1;", "crashed"),
  ("for (volatile int i = 1; i; ) {}", "timeout"),
  ("data0[0] = 12345.0f;", "wrong"),
  ("this is not C;", "compile_error"),
])
def test_broken_candidates_are_recorded_and_search_goes_on(body: str, status: str) -> None:
  k = matmul_kernel(32)
  bad = Opt(OptOps.UPCAST, 0, 2)
  seen = []
  with Evaluator(k, "CPU", timeout_s=2.0, render=_inject(bad, body), on_result=seen.append) as ev:
    results = ev.evaluate([(bad,), (Opt(OptOps.UPCAST, 1, 4),), ()])
  assert [r.status for r in results] == [status, "ok", "ok"]
  assert results[0].error and next(r for r in seen if r.opts == (bad,)).status == status  # reported as it finished: maybe after others


def test_a_worker_that_checks_on_the_device_finds_a_wrong_candidate() -> None:  # it writes one output: the others keep the NaN filled in
  k, bad = matmul_kernel(32), Opt(OptOps.UPCAST, 0, 2)
  with Evaluator(k, "CPU", device_check=True, render=_inject(bad, "data0[0] = 12345.0f;")) as ev:
    results = ev.evaluate([(bad,), (Opt(OptOps.UPCAST, 1, 4),), ()])
    assert ev.checked_on == "device"
  with Evaluator(k, "CPU") as ev:  # the CPU's NumPy reads the output's own memory: compared on the host unless asked
    assert ev.evaluate([()])[0].status == "ok" and ev.checked_on == "host"
  assert [r.status for r in results] == ["wrong", "ok", "ok"] and results[0].error.startswith("1024 of 1024 outputs differ"), results[0].error


@pytest.mark.parametrize("dtype", [dtypes.bfloat16, dtypes.float16, dtypes.int32], ids=lambda d: d.name)
def test_a_worker_restarted_after_a_crash_still_verifies(dtype: DType) -> None:
  """A new worker reads the reference its first one saved: a bfloat16 one came back from the file as raw bytes (numpy's 'V2'), so
  every candidate after a crash crashed too and the search ended early."""
  k, bad = matmul_kernel(32, dtype), Opt(OptOps.UPCAST, 0, 2)
  with Evaluator(k, "CPU", timeout_s=2.0, render=_inject(bad, "*(volatile int*)0 = 1;")) as ev:
    results = ev.evaluate([(bad,), (Opt(OptOps.UPCAST, 1, 4),), ()])
  assert [r.status for r in results] == ["crashed", "ok", "ok"], [r.error for r in results]


def test_duplicates_by_source_are_timed_once() -> None:
  k = matmul_kernel(32)
  seen = []
  with Evaluator(k, "CPU", on_result=seen.append) as ev:
    a, b = ev.evaluate([(Opt(OptOps.UPCAST, 1, 4),), (Opt(OptOps.UPCAST, 1, 4),)])
  assert len(seen) == 1 and a.median_s == b.median_s


def test_search_command_then_cache_hit(tmp_path) -> None:
  db = f"sqlite:///{tmp_path}/t.db"
  first = tinytune("search", "matmul", "-p", "m=64", "-p", "n=64", "-p", "k=64", "--budget", "8", "--json", db=db)
  assert first.returncode == 0, first.stderr
  out = json.loads(first.stdout)
  assert not out["cache_hit"] and out["kernels"][0]["candidates"]["ok"] >= 2
  st = time.perf_counter()
  second = tinytune("search", "matmul", "-p", "m=64", "-p", "n=64", "-p", "k=64", "--budget", "8", "--json", db=db)
  hit = json.loads(second.stdout)
  assert hit["cache_hit"] and hit["kernels"][0]["opts"] == out["kernels"][0]["opts"]
  assert hit["elapsed_ms"] < out["elapsed_ms"]  # the whole command's, from its process's start
  assert time.perf_counter() - st < 10 or Device[Device.DEFAULT].emulated  # EMU runs the default kernels in NumPy: 14 s on 2 cores
  rows = Database(db).run_candidates(1)
  assert len(rows) == sum(out["kernels"][0]["candidates"].values())
  stored = Database(db).tuned(out["kernels"][0]["key"], out["fingerprint"])  # the figures printed are the ones stored, then read back
  assert stored is not None and stored.default_s is not None
  for k in (out["kernels"][0], hit["kernels"][0]):
    assert (k["tuned_ms"], k["default_ms"]) == pytest.approx((stored.best_s * 1e3, stored.default_s * 1e3), rel=1e-6)  # JSON rounds ms to 10 decimals


def test_tuned_opts_are_used_in_a_fresh_process(tmp_path) -> None:
  db = f"sqlite:///{tmp_path}/t.db"
  found = tinytune("search", "matmul", "-p", "m=48", "-p", "n=48", "-p", "k=48", "--budget", "6", "--json", "--device", "CPU", db=db)
  assert found.returncode == 0, found.stderr
  script = ("from tinytune import Tensor, Context\nimport numpy as np\n"
            "a, b = Tensor.rand(48, 48), Tensor.rand(48, 48)\nwith Context(DEBUG=3): c = (a @ b).numpy()\n"
            "assert np.allclose(c, a.numpy() @ b.numpy(), atol=1e-4)\n")
  stored = json.loads(found.stdout)["kernels"][0]["opts"]  # what the search stored (a later search reads the same back: test above)
  env = {**os.environ, "TINYTUNE_DB": db, "TINYTUNE_DEVICE": "CPU"}  # the CPU's opts, under any TINYTUNE_DEVICE the suite runs with
  run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
  assert run.returncode == 0, run.stderr
  expected = repr([Opt(OptOps[o[0]], o[1], o[2]) for o in stored])
  assert f"opts {expected}" in run.stdout
  off = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env={**env, "TINYTUNE_TUNE": "0"})
  assert off.returncode == 0, off.stderr
  assert f"opts {list(default_opts(matmul_kernel(48)))}" in off.stdout  # TINYTUNE_TUNE=0: the heuristic defaults, whatever is stored


def test_kill_and_resume(tmp_path) -> None:
  db = f"sqlite:///{tmp_path}/t.db"
  args = [sys.executable, "-m", "tinytune.cli", "search", "matmul", "-p", "m=96", "-p", "n=96", "-p", "k=96", "--budget", "20", "--quiet", "--json"]
  proc = subprocess.Popen(args, env={**os.environ, "TINYTUNE_DB": db}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  deadline = time.time() + 120
  while time.time() < deadline:
    time.sleep(0.5)
    if os.path.exists(f"{tmp_path}/t.db") and len(Database(db).run_candidates(1)) >= 5: break
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  before = Database(db).run_candidates(1)
  assert len(before) >= 5
  resumed = tinytune("search", "matmul", "-p", "m=96", "-p", "n=96", "-p", "k=96", "--budget", "20", "--quiet", "--json", "--resume", db=db)
  assert resumed.returncode == 0, resumed.stderr
  after = Database(db).run_candidates(1)
  assert after[:len(before)] == before  # the same run goes on
  opts = [r.opts_json for r in after]
  assert len(opts) == len(set(opts))  # nothing stored was timed again
  assert Database(db).run(1).outcome == "done"


def test_concurrent_searches_share_one_sqlite_database(tmp_path) -> None:
  db = f"sqlite:///{tmp_path}/t.db"
  env = {**os.environ, "TINYTUNE_DB": db}
  procs = [subprocess.Popen([sys.executable, "-m", "tinytune.cli", "search", "matmul", "-p", f"m={m}", "-p", "n=32", "-p", "k=32", "--budget", "6",
                             "--quiet", "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for m in (32, 40, 48)]
  outs = [p.communicate(timeout=240) for p in procs]
  assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
  total = sum(sum(json.loads(o[0])["kernels"][0]["candidates"].values()) for o in outs)
  database = Database(db)
  assert sum(len(database.run_candidates(i)) for i in (1, 2, 3)) == total


def test_bad_input_is_one_line_and_nonzero(tmp_path) -> None:
  env = {**os.environ, "TINYTUNE_DB": f"sqlite:///{tmp_path}/t.db"}
  argvs = (["search", "nope"], ["search", "matmul", "-p", "x=3"], ["search", "matmul", "-p", "m"], ["search", "matmul", "--strategy", "anneal"],
           ["search", "matmul", "--device", "tpu"], ["search", "matmul", "--dtype", "float128"])
  procs = [subprocess.Popen([sys.executable, "-m", "tinytune.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
           for args in argvs]  # together: each is mostly a Python start
  for args, proc in zip(argvs, procs):
    err = proc.communicate(timeout=240)[1]
    assert proc.returncode == 2 and err.startswith("tinytune: error:") and len(err.strip().splitlines()) == 1, (args, err)


def test_verification_tolerates_rounding_of_long_sums_but_not_wrong_outputs() -> None:
  from tinytune.search.worker import mismatches
  rng = np.random.default_rng(0)
  x, w = (rng.standard_normal(s).astype(np.float32) * 10 for s in ((64, 3072), (3072, 96)))  # outputs in the thousands, some near 0
  exact = x.astype(np.float64) @ w.astype(np.float64)
  ordered = np.zeros((64, 96), np.float32)
  for k in range(3072): ordered += x[:, k:k + 1] * w[k]  # float32 sums in another order, as an unrolled kernel adds them
  assert not np.allclose(ordered, exact, rtol=1e-4, atol=1e-4)  # what the check used to demand (bench mlp refused a correct result)
  assert not mismatches(ordered, exact.astype(np.float32), 1e-4, terms=3072).any()
  wrong = ordered.copy()
  wrong[3, 5] += 0.02 * np.abs(exact).max()
  assert mismatches(wrong, exact.astype(np.float32), 1e-4, terms=3072).sum() == 1
  assert mismatches(np.array([1, 2, 3]), np.array([1, 2, 4]), 0).tolist() == [False, False, True]
  assert not mismatches(np.array([np.nan, np.inf], np.float32), np.array([np.nan, np.inf], np.float32), 1e-4).any()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_a_reference_compares_as_isclose_does_every_time(dtype: type) -> None:
  """Reference works out the reference's side once and compares in the output's precision: the same verdicts as np.isclose in
  float64 on values clearly inside or outside the limit, on inf and NaN (equal only to themselves), and on a second output."""
  from tinytune.search.worker import Reference
  rng = np.random.default_rng(1)
  ref = (rng.standard_normal(4000) * 10).astype(dtype)
  ref[:4] = [np.inf, -np.inf, np.nan, 0.0]
  tol = {np.float16: 1e-2, np.float32: 1e-4, np.float64: 1e-9}[dtype]
  limit = tol * np.abs(ref[4:].astype(np.float64)) + tol * np.abs(ref[4:].astype(np.float64)).max()
  check = Reference(ref, tol)
  for _ in range(2):
    out = ref.copy()
    step = rng.choice([0.25, 4.0], ref.size - 4) * limit * rng.choice([-1, 1], ref.size - 4)
    out[4:] = (ref[4:].astype(np.float64) + step).astype(dtype)
    expect = ~np.isclose(out.astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol * float(np.abs(ref[4:]).max()), equal_nan=True)
    assert check.mismatches(out).tolist() == expect.tolist()
    out[:4] = [np.inf, np.inf, 1.0, np.nan]  # -inf and NaN lost, a NaN where 0 was
    assert check.mismatches(out)[:4].tolist() == [False, True, True, True]


@pytest.mark.parametrize("device", ["CPU", "EMU", "OPENCL"])
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.int32], ids=lambda d: d.name)
def test_the_device_check_finds_what_the_host_comparison_finds(device: str, dtype: DType) -> None:
  """DeviceCheck runs Reference's rule as kernels on the device that holds the output (a GPU's 4096x4096 output took 178 ms to copy
  out and compare on the host): the same count of mismatches as the host's comparison, inf and NaN included, the worst difference
  among them (inf for a NaN), and an output filled before a candidate runs wrong everywhere."""
  from tinytune.runtime import device_status
  from tinytune.search.worker import DeviceCheck, Reference
  if why := device_status(device): pytest.skip(why)
  rng, n, tol = np.random.default_rng(2), 3 * 1024, {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-4}.get(dtype.name, 0)
  ref = (rng.standard_normal(n) * 10).astype(dtype.np) if tol else rng.integers(0, 8, n).astype(dtype.np)
  if tol: ref[:4] = [np.inf, -np.inf, np.nan, 0.0]
  check, out = Reference(ref, tol, terms=300), Buffer(device, n, dtype)
  on_device = DeviceCheck(check, out)
  for trial in range(3):
    got = ref.copy()
    if trial: got[rng.choice(n, 7 * trial, replace=False)] += ref.dtype.type(1) if not tol else ref.dtype.type(np.abs(ref[4:]).max() * tol * 40)
    if trial == 2 and tol: got[:4] = [np.inf, np.inf, 1.0, np.nan]  # -inf and NaN lost, a NaN where 0 was
    out.copyin(got)
    bad = check.mismatches(got)
    with np.errstate(invalid="ignore"): diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    worst = float(np.where(np.isnan(diff), np.inf, diff)[bad].max()) if bad.any() else 0.0
    count, found = on_device()
    assert count == int(bad.sum()) and found == pytest.approx(worst, rel=1e-2), (trial, count, int(bad.sum()), found, worst)
  on_device.fill(out)
  assert on_device()[0] == int(check.mismatches(out.numpy_view()).sum()) >= n - 1  # all but the reference's NaN, which a NaN matches
  assert DeviceCheck.tried(check, out.copyin(ref)) is not None  # the worker's test of it before use, on the reference it just ran
  assert DeviceCheck.tried(check, out.copyin(got)) is None  # one that finds that output wrong is not used


def test_the_device_checks_kernels_compile_with_nvrtc() -> None:
  """The device check's kernels as a GPU runs them (scheduled for sm_90's caps with their default opts, rendered as CUDA) compile with
  NVRTC, for each output dtype: the fill, the count and the worst difference."""
  from ops_support import nvrtc_missing
  if why := nvrtc_missing(): pytest.skip(why)
  from tinytune.codegen.caps import cuda_caps
  from tinytune.codegen.cstyle import CUDARenderer
  from tinytune.runtime.cuda import _nvrtc
  from tinytune.search.worker import DeviceCheck, Reference
  srcs = []
  for dtype, tol in ((dtypes.float16, 1e-2), (dtypes.bfloat16, 5e-2), (dtypes.float32, 1e-4), (dtypes.int32, 0)):
    out = Buffer("EMU", 64 * 4096, dtype)
    check = DeviceCheck(Reference(np.ones(out.size, dtype.np), tol, terms=4096), out)
    for target, into in ((check.sentinel, out), (check.count, None), (check.worst, None)):
      for item in create_schedule(target, "EMU", into)[0]:
        k = Kernel(item.ast, cuda_caps("sm_90"))
        srcs.append(CUDARenderer().render(k.apply_opts(default_opts(k))))
  for src in dict.fromkeys(srcs): _nvrtc(src, "sm_90")


def test_a_stop_signal_whose_raise_was_swallowed_still_stops_the_search(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
  """A SIGHUP that lands in a weakref callback (the UOp cache's run all the time) raises there, where Python prints "Exception
  ignored" and goes on: the search used to run to its end and exit 0 (seen under load). The search stops at its next candidates."""
  import weakref

  from tinytune import helpers
  from tinytune.cli import main
  class Node: pass
  def stop_in_callback() -> None:
    node = Node()
    ref = weakref.ref(node, lambda _: helpers.on_stop_signal(signal.SIGHUP, None))
    del node  # the callback raises Stopped; Python prints it as ignored
    assert ref() is None
  db = f"sqlite:///{tmp_path / 'r.db'}"
  stop_in_callback()
  assert main(["search", "elementwise", "-p", "n=4096", "--budget", "50", "--db", db]) == 128 + signal.SIGHUP
  assert "interrupted" in capsys.readouterr().err and not helpers._stop_signal  # handled: the next command starts clean
  assert main(["search", "elementwise", "-p", "n=4096", "--budget", "3", "--db", db]) == 0


@pytest.mark.parametrize("strategy", ["beam", "random"])
def test_seconds_is_a_hard_budget_for_the_whole_program(tmp_path, strategy: str) -> None:  # type: ignore[no-untyped-def]
  from tinytune.kernels import get_workload
  from tinytune.search.tune import Tuner
  workload = get_workload("mlp")  # several kernels: the budget is shared, not given to each
  params = workload.params({"batch": 32, "din": 128, "hidden": 256, "dout": 64})
  out, _ = workload.instantiate(params)
  tuner = Tuner(Database(f"sqlite:///{tmp_path / 'r.db'}"), "CPU", strategy, {"candidates": None, "seconds": 4.0})
  st = time.monotonic()
  outcomes = tuner.tune_program(out.uop, "mlp", params)
  elapsed = time.monotonic() - st
  assert len(outcomes) >= 2 and all(o.best_s > 0 for o in outcomes)
  assert elapsed < 4.0 * 1.1 + 3.0, f"a 4 s search took {elapsed:.1f} s"  # and up to a second per kernel: a candidate timed at the deadline
  # it spends most of the time it has (a loaded machine slows the last candidates, which the deadline then skips)
  assert strategy != "beam" or elapsed > 4.0 * 0.5, f"a 4 s beam search stopped after {elapsed:.1f} s"


def test_evaluation_stops_at_the_deadline() -> None:
  with Evaluator(matmul_kernel(), "CPU") as ev:
    ev.deadline = time.monotonic() - 1
    assert ev.evaluate([(Opt(OptOps.UPCAST, 0, 2),), (Opt(OptOps.UPCAST, 1, 2),)]) == []
    ev.deadline = None
    assert [r.status for r in ev.evaluate([(Opt(OptOps.UPCAST, 0, 2),)])] == ["ok"]


def test_ties_go_to_the_default_then_the_shortest_opts() -> None:
  from tinytune.search.strategy import choose
  up, pad = Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.PADTO, 2, 5)
  default = (up, Opt(OptOps.THREAD, 0, 2))
  assert choose(default, [(*default, pad)], [1.0, 0.995], []).best == default  # PADTO appended for no real gain
  assert choose(default, [(*default, pad), (up,)], [1.0, 0.8, 0.805], []).best == (up,)
  assert choose(default, [(*default, pad)], [1.0, 0.9], []).best == (*default, pad)


def test_optuna_space_holds_real_amounts_each_valid_by_itself() -> None:
  from tinytune.search.space import opts_from_params, parameter_space
  k = matmul_kernel(48)
  space = parameter_space(k)
  assert set(space) == {"upcast0", "upcast1", "lanes0", "unroll0", "swap", "pack"} | ({"thread"} if k.caps.threads > 1 else set())
  assert parameter_space(matmul_kernel(512))["stream"] == ("off", "on")  # 1 MiB of output: STREAM is worth a try
  assert space["upcast0"][:4] == (1, 2, 3, 4) and all(48 % a == 0 for a in space["upcast0"])  # amounts, not log2 indices
  assert space["swap"] == ("off", "0,1")
  for name, choices in space.items():
    for choice in choices: k.copy().apply_opts(opts_from_params(k, {name: choice}))
  up, unroll, swap = Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.SWAP, 0, 1)
  assert opts_from_params(k, {"upcast0": 4, "unroll0": 2, "swap": "0,1", "stream": "on"}) == (up, unroll, swap, Opt(OptOps.STREAM, 0, 0))
  packed = opts_from_params(k, {"upcast1": 8, "upcast0": 4, "swap": "0,1", "pack": "on"})  # after the swap, which puts B's panels outside
  assert packed[-1] == Opt(OptOps.PACK, 0, 0) and k.copy().apply_opts(packed).pack_tiles()[0][0].arg.strides[0] == 0
  assert opts_from_params(k, {name: choices[0] for name, choices in space.items()}) == ()


def test_a_worker_that_replaces_one_reads_the_reference_back() -> None:
  """The reference runs once per search: at 2048^3 the kernel with no opts took most of a minute, and a worker replaced after each
  timeout that ran it again (with only the candidate timeout to do it in) ended the search."""
  k = matmul_kernel(16)
  with Evaluator(k, "CPU") as ev:
    assert ev.evaluate([()])[0].status == "ok"
    saved = os.path.join(ev.ref_dir.name, "ref.npy")
    np.save(saved, np.load(saved) + 1)  # a wrong reference, to see which one the next worker uses
    assert ev.worker is not None
    ev.worker.kill()
    ev.worker = None
    assert ev.evaluate([(Opt(OptOps.UPCAST, 0, 4),)])[0].status == "wrong"


def test_k_blocks_are_in_both_search_spaces() -> None:
  from tinytune.search.space import opts_from_params, parameter_space
  k = matmul_kernel(256)
  assert {o.arg for o in actions(k) if o.op is OptOps.KBLOCK} == {64, 128}  # shorter blocks are not worth a candidate
  assert parameter_space(k)["kblock0"] == (1, 64, 128)
  opts = opts_from_params(k, {"kblock0": 128, "unroll0": 4})
  assert opts == (Opt(OptOps.KBLOCK, 0, 128), Opt(OptOps.UNROLL, 0, 4))  # blocks of K first, then the unroll inside a block
  k.copy().apply_opts(opts)


def test_optuna_study_reads_back_through_optunas_api(tmp_path) -> None:  # type: ignore[no-untyped-def]
  import optuna

  from tinytune.kernels import get_workload
  from tinytune.search.space import parameter_space
  from tinytune.search.tune import Tuner
  url = f"sqlite:///{tmp_path / 'r.db'}"
  workload = get_workload("softmax")  # two of its kernels share a name: their studies do not
  params = workload.params({"rows": 2, "cols": 66000})  # rows too long to stay in cache: the sum is a kernel of its own (ROW_BYTES)
  out, _ = workload.instantiate(params)
  seen: dict[str, list] = {}
  tuner = Tuner(Database(url), "CPU", "optuna", {"candidates": 6, "seconds": None}, on_result=lambda k, r: seen.setdefault(k.key, []).append(r))
  outcomes = tuner.tune_program(out.uop, "softmax", params)
  assert sorted(s.study_name for s in optuna.get_all_study_summaries(url)) == \
    ["softmax-E_2_66000-CPU-run1", "softmax-r_2_1_66000#2-CPU-run1", "softmax-r_2_1_66000-CPU-run1"]
  kernels = [k for _, k in engine.kernels(out.uop, "CPU")]
  for k, o, name in zip(kernels, outcomes, ["r_2_1_66000", "r_2_1_66000#2", "E_2_66000"]):
    study = optuna.load_study(study_name=f"softmax-{name}-CPU-run1", storage=url)
    attrs = study.user_attrs
    assert (attrs["workload"], attrs["params"], attrs["kernel"], attrs["device"], attrs["dtype"]) == ("softmax", params, name, "CPU", "float32")
    assert attrs["kernel_key"] == k.key and attrs["default_ms"] > 0 and study.metric_names == ["ms"]
    assert {t.state for t in study.trials} <= {optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED}  # no invalid kernel FAILs
    invalid = {t.user_attrs["opts"] for t in study.trials if t.user_attrs["status"].startswith("invalid")}
    assert o.counts.get("invalid", 0) == len(invalid) and sum(v for s, v in o.counts.items() if s != "invalid") <= 6
    space = parameter_space(k)
    for t in study.trials: assert all(v in space[p] for p, v in t.params.items())  # the amounts themselves
    measured = {r.opts_json: r.median_s * 1e3 for r in seen[k.key] if r.status == "ok"}
    best = min((t for t in study.trials if t.value is not None), key=lambda t: t.value)
    assert any(abs(best.value - ms) < 1e-9 for ms in measured.values())  # the objective is the measured median, in ms
    assert seen[k.key][0].opts == tuple(default_opts(k))  # the live speedup's baseline is the final table's: the default opts


def test_optuna_stops_with_a_warning_when_the_space_is_used_up(capsys) -> None:  # type: ignore[no-untyped-def]
  from tinytune.search.space import parameter_space
  a = Tensor.rand(4).realize()
  k = cpu_kernel(a * 2)
  size = math.prod(len(c) for c in parameter_space(k).values())
  with Evaluator(k, "CPU") as ev:
    result = run_strategy("optuna", k, ev, Budget(50), default_opts(k), patience=20)
  assert sum(result.counts().values()) <= size + 1
  assert "optuna stopped searching E_4 early" in capsys.readouterr().err


def test_a_kernel_the_program_runs_twice_is_searched_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
  from tinytune.engine.realize import schedule_many
  from tinytune.search.tune import Tuner
  a, b = Tensor.rand(64).realize(), Tensor.rand(64).realize()
  items = schedule_many([(a * 3 + 1).uop, (b * 3 + 1).uop], "CPU")[0]  # one kernel over two pairs of buffers
  db = Database(f"sqlite:///{tmp_path / 'r.db'}")
  tuner = Tuner(db, "CPU", "beam", {"candidates": 6, "seconds": None})
  assert len(items) == 2 and len({k.key for _, k in engine.kernels(items, "CPU")}) == 1
  assert len(tuner.tune_program(items, "twice", {})) == 1  # it searched the same kernel twice, the second time with half the budget


def test_the_reference_keeps_each_sum_as_the_plain_kernel_adds_it() -> None:
  """Candidates are checked against the kernel with its default threads and register tiles only (the plain 1024^3 matmul took
  7.3 s, this 0.02 s): no opt that splits or reorders a sum, and its values are the plain kernel's to rounding."""
  from tinytune.search.evaluate import ORDER_KEEPING, reference_kernel
  from tinytune.search.worker import mismatches
  k = matmul_kernel(96)
  ref = reference_kernel(k)
  assert ref.opts and {o.op for o in ref.opts} <= ORDER_KEEPING and OptOps.UPCAST in {o.op for o in ref.opts}
  rows = cpu_kernel(Tensor.rand(64, 4096).realize().sum(1))
  assert OptOps.LANES in {o.op for o in default_opts(rows)} and not {o.op for o in reference_kernel(rows).opts} - ORDER_KEEPING
  rng = np.random.default_rng(0)
  bufs = [Buffer("CPU", b.size, b.dtype).copyin(rng.standard_normal(b.size).astype(np.float32)) for b in k.bufs]
  outs = []
  for kernel in (k, ref):
    out = Buffer("CPU", 96 * 96, dtypes.float32)
    Device["CPU"].program(kernel.name, Device["CPU"].compile(Device["CPU"].renderer.render(kernel)), kernel.launch_dims)(out, *bufs)
    outs.append(out.numpy_view().copy())
  assert not mismatches(outs[1], outs[0], 1e-6, 96).any()


def test_a_candidate_far_slower_than_the_best_is_cut_off_not_waited_for() -> None:
  k = matmul_kernel(16)
  with Evaluator(k, "CPU", timeout_s=30) as ev:
    assert ev.evaluate([()])[0].status == "ok"
    def hang(kernel: Kernel) -> str:  # spins at the kernel's end for hours
      src = Device["CPU"].renderer.render(kernel)
      return src[:src.rindex("\n}")] + "\n  for (volatile long s = 0; s < 1L << 40; s++);" + src[src.rindex("\n}"):]
    ev.render_source = hang
    st = time.monotonic()
    [res] = ev.evaluate([(Opt(OptOps.UPCAST, 0, 4),)])
  assert res.status == "timeout" and "cut off after 3.0 s" in res.error and time.monotonic() - st < 10


def test_a_queued_candidate_is_cut_at_the_budgets_end_however_late_it_began() -> None:
  """A candidate sent while the one before runs begins when that one is answered: its cut-off at the budget's end counts from then
  (counted from when it was sent, one queued behind a slow candidate ran that much past the budget)."""
  class Fake:
    ready, timeouts = ["ready", "host"], []
    def send(self, msg: list) -> None: pass
    def reply(self, timeout: float) -> list: self.timeouts.append(timeout); return ["timeout", "no answer"]
  with Evaluator(matmul_kernel(16), "CPU") as ev:
    ev.by_source = {"best": Result((), "ok", 1.0, 1.0)}  # a slow kernel: its cut-off from the best is the 10 s timeout
    ev.worker, ev.end = Fake(), time.monotonic() + 5  # type: ignore[assignment]
    ev._send(s := _Sent(None, (), ev.kernel_for(()), Future(), Built("h", "lib", 0.0, 0.0)))
    s.at -= 4; ev.end -= 4; s.end -= 4  # sent 4 s ago, and the one before it answered only now: 1 s of the budget is left
    ev.answered = time.monotonic()
    ev._receive([], [])
  assert s.cut == 10 and Fake.timeouts[0] <= 2.0, Fake.timeouts  # CUT_MIN_S from when it began, not the 5 s left when sent


def test_no_candidate_starts_that_would_end_past_the_deadline() -> None:
  with Evaluator(matmul_kernel(16), "CPU") as ev:
    ev.deadline = time.monotonic() + 2
    assert not ev.past_deadline()
    ev.run_s = [0.1, 5.0, 4.0]  # candidates take seconds each here: one started now would end after the deadline
    assert ev.past_deadline() and ev.evaluate([(Opt(OptOps.UPCAST, 0, 4),)]) == []


class TableEvaluator:
  """An evaluator that times nothing: each opt list takes its time in `times` (1 s where it has none), so a strategy's choices
  show in microseconds. Each opt list is a kernel of its own."""
  def __init__(self, kernel: Kernel, times: dict[tuple[Opt, ...], float]): self.kernel, self.times = kernel, times
  def kernel_for(self, opts) -> Kernel: return self.kernel.copy().apply_opts(opts)  # type: ignore[no-untyped-def]
  def time(self, opts) -> float: return self.times.get(tuple(opts), 1.0)  # type: ignore[no-untyped-def]
  def evaluate(self, candidates, following=None) -> list[Result]:  # type: ignore[no-untyped-def]
    results = [Result(tuple(o), "ok", self.time(o), self.time(o), source_hash=opts_to_json(tuple(o))) for o in candidates]
    if following is not None: following(results[:len(results) // 2])  # what it would compile early: named from half the round
    return results
  def retime(self, candidates) -> list[Timing]: return [Timing(self.time(o), 0.0, 1) for o in candidates]  # type: ignore[no-untyped-def]
  def past_deadline(self) -> bool: return False  # a candidate takes no time


def test_beam_spends_a_budget_in_seconds_on_runners_up_it_would_have_stopped_before() -> None:
  k = matmul_kernel(16)
  x, y, z = Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 4)
  times = {(x,): 0.9, (y,): 0.95, (y, z): 0.5}  # (y, z) is past a runner-up: with width 1, x is expanded, and none of its next opts gains
  stops = run_strategy("beam", k, TableEvaluator(k, times), Budget(200), (), width=1)
  assert stops.best == (x,) and sum(stops.counts().values()) < 100  # a budget of candidates: it stops at the first round without gain
  st = time.monotonic()
  spends = run_strategy("beam", k, TableEvaluator(k, times), Budget(None, 1.0), (), width=1)
  elapsed = time.monotonic() - st
  # on to the end of the budget, less what its evaluator predicts the candidates left and the finalists' re-time take (nothing here);
  # it stopped at 90% of the budget, whatever they took
  assert spends.best == (y, z) and 0.97 < elapsed < 1.1, elapsed
  assert sum(spends.counts().values()) > 2 * sum(stops.counts().values())


def test_candidates_stop_where_those_left_and_the_finalists_re_time_would_overrun_the_budget() -> None:
  """A search starts candidates until the budget's end less what they and the finalists' re-time are predicted to take, from the
  candidates measured so far (a fast GPU left the last 10% of every budget unused, the re-time taking a fraction of it)."""
  k = matmul_kernel(16)
  with Evaluator(k, "CPU") as ev:
    ev.by_source = {str(i): Result((), "ok", 1e-3, 1e-3) for i in range(6)}
    ev.run_s, ev.overhead_s = [0.05], [0.01]
    # a round of the default and 3 finalists, each request its overhead and up to 1 + 3 + 5 runs of 1 ms (the first, the warm-up, the repeats)
    assert ev.retime_round_s() == pytest.approx(4 * (0.01 + 0.001 + 0.003 + 0.005))
    closing = 5 * ev.retime_round_s()  # 5 rounds, under a tenth of the budget's 10 s
    ev.deadline = ev.end = time.monotonic() + 0.05 + closing + 0.5
    ev.budget_s = 10.0
    assert not ev.past_deadline()
    ev.deadline = ev.end = time.monotonic() + 0.05 + closing - 0.1  # a candidate fits, the re-time after it does not
    assert ev.past_deadline()
    ev.budget_s = 0.5  # where 5 rounds take more than a tenth of the budget, it keeps a tenth, or one round
    assert not ev.past_deadline()
    ev.deadline = ev.end = time.monotonic() + 0.05 + ev.retime_round_s() - 0.05
    assert ev.past_deadline()
    ev.end = None  # a deadline that is not the budget's end (tests, the study): no re-time follows it
    assert not ev.past_deadline()
    budget = Budget(None, 10.0)
    ev.deadline = ev.end = budget.deadline()
    budget.fits = lambda: not ev.past_deadline()  # as run_strategy links them
    assert budget.deadline() == pytest.approx(budget.started + 10.0) and budget.left(0) > 0
    ev.run_s = [20.0]  # a candidate takes longer than the budget has left
    assert budget.left(0) == 0


def test_the_re_time_starts_no_round_that_would_end_past_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
  """The finalists' re-time goes on round by round while the budget has room for one more (it started one while any time was
  left, and a slow round, seconds on a loaded CPU, ran that far past the budget)."""
  k, entries = matmul_kernel(16), [(), (Opt(OptOps.UPCAST, 0, 2),)]
  with Evaluator(k, "CPU") as ev:
    ev.libs = {opts: "built" for opts in entries}
    def slow(msg: list, timeout: float | None = None) -> list:
      time.sleep(0.3)
      return ["ok", [1e-3]]
    monkeypatch.setattr(ev, "_request", slow)
    ev.end = time.monotonic() + 1.0  # a round takes 0.6 s: the second would end at 1.2 s
    times = ev.retime(entries)
  assert [t.n for t in times] == [1, 1] and time.monotonic() < ev.end


def test_beam_starts_from_the_plan_the_heuristics_hold_in_reserve() -> None:
  """A big float32 matmul on a GPU defaults to the shared-memory tile, a planner with plans no GPU has timed yet (UNMEASURED_PLANNERS):
  BEAM's first round has the register tile read from memory (the default before it) as well, so where that is faster the search keeps it."""
  def z(*shape: int) -> Tensor: return Tensor.zeros(*shape).contiguous()
  k = Kernel(create_schedule((z(2048, 2048) @ z(2048, 2048)).uop, "CPU")[0][-1].ast, cuda_caps("sm_90"))
  default, [old] = tuple(default_opts(k)), alternative_opts(k)
  assert Opt(OptOps.STAGE, 0, 16) in default and not any(o.op is OptOps.STAGE for o in old)
  result = run_strategy("beam", k, TableEvaluator(k, {default: 0.8, tuple(old): 0.5}), Budget(1), default)
  assert result.best == tuple(old)
  small = Kernel(create_schedule((z(64, 64) @ z(64, 64)).uop, "CPU")[0][-1].ast, cuda_caps("sm_90"))
  assert alternative_opts(small) == [] and alternative_opts(matmul_kernel(16)) == []  # register tiles already; the CPU's planners


def test_beam_returns_early_when_nothing_new_is_left_to_try() -> None:
  k = cpu_kernel(Tensor.rand(4).realize() * 2)
  st = time.monotonic()
  result = run_strategy("beam", k, TableEvaluator(k, {}), Budget(None, 60.0), ())
  assert time.monotonic() - st < 5 and result.best == ()


def test_a_budget_in_seconds_goes_mostly_to_the_kernels_that_run_longest() -> None:
  from tinytune.search.tune import time_share
  a = Tensor.rand(256, 256).realize()
  big, small = matmul_kernel(256), cpu_kernel(a + 1)
  assert time_share(big, [big, small]) + time_share(small, [big, small]) == pytest.approx(1)
  assert time_share(big, [big, small]) > 0.7 and time_share(small, [big, small]) > 0.25 / 2  # each keeps half of an even share at least
  assert time_share(small, [small]) == pytest.approx(1)  # the last kernel gets all that is left


def test_search_seconds_alone_end_the_search_and_budget_alone_counts_200() -> None:
  from tinytune.cli import build_parser, search_budget
  def budget(*args: str) -> dict: return search_budget(build_parser().parse_args(["search", "matmul", *args]))
  assert budget("--seconds", "60") == {"candidates": None, "seconds": 60.0}  # 200 candidates used to end a 60 s search early
  assert budget() == {"candidates": 200, "seconds": None}
  assert budget("--seconds", "60", "--budget", "50") == {"candidates": 50, "seconds": 60.0}


def test_the_search_pads_only_axes_that_do_not_split_into_vectors() -> None:
  a, b = Tensor.rand(58, 64).realize(), Tensor.rand(64, 1).realize()
  k = cpu_kernel(a @ b)  # sizes 58 (= 2 * 29), 1, and 64 summed
  assert k.sizes == [58, 1, 64] and {o.axis for o in actions(k) if o.op is OptOps.PADTO} == {0}
  assert {o.arg for o in actions(k) if o.op is OptOps.PADTO} >= {4, 8}  # 58 -> 60 or 64: then it splits into vectors of 4 or 8


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_each_strategy_declares_its_options_and_takes_just_those(name: str) -> None:
  import inspect

  from tinytune.search.strategy import check_options, get_strategy, strategy_options
  table = strategy_options(name)
  assert list(inspect.signature(get_strategy(name)).parameters)[5:] == list(table)  # after (kernel, ev, budget, default, context)
  assert check_options(name, {k: o.default for k, o in table.items()}) == {k: o.default for k, o in table.items()}  # its defaults pass
  assert check_options(name, {k: str(o.default) for k, o in table.items()}) == {k: o.default for k, o in table.items()}  # text is read
  with pytest.raises(ValueError, match=f"{name} has no option 'nonsense'; it takes {', '.join(table)}"): check_options(name, {"nonsense": 1})


@pytest.mark.parametrize("name,options,message", [
  ("optuna", {"sampler": "nonsense"}, "optuna option sampler='nonsense' is not one of tpe, cmaes, gp"),
  ("beam", {"width": 0}, "beam option width=0 is not at least 1"),
  ("beam", {"width": "2.5"}, "beam option width='2.5' is not a whole number"),
  ("beam", {"width": True}, "beam option width=True is not a int"),
  ("beam", {"min_gain": "nan"}, "beam option min_gain='nan' is not a finite number"),
  ("random", {"seed": 1.5}, "random option seed=1.5 is not a int"),
])
def test_a_bad_option_value_is_refused(name: str, options: dict, message: str) -> None:
  from tinytune.search.strategy import check_options
  with pytest.raises(ValueError, match=message): check_options(name, options)
  k = cpu_kernel(Tensor.rand(8) + 1)
  with pytest.raises(ValueError, match=message): run_strategy(name, k, TableEvaluator(k, {}), Budget(1), (), **options)  # checked there too


def test_option_help_lists_every_strategys_options(capsys) -> None:  # type: ignore[no-untyped-def]
  from tinytune.cli import main
  assert main(["search", "matmul", "--option", "help"]) == 0
  out = capsys.readouterr().out
  assert all(f"{name}:" in out for name in STRATEGIES) and "  width=4  " in out and "(one of tpe, cmaes, gp)" in out


def test_a_slow_render_counts_against_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
  """A tensor-core candidate takes 0.2-0.4 s of Python to render, and the evaluator renders a chunk in turn before running any:
  no render starts that would end past the deadline (a fake clock: each render takes 10 s of it, runs none)."""
  from tinytune.search import evaluate
  clock = [1000.0]
  monkeypatch.setattr(evaluate.time, "monotonic", lambda: clock[0])
  k = matmul_kernel(32)
  def render(kernel: Kernel) -> str:
    clock[0] += 10.0
    return Device["CPU"].renderer.render(kernel)
  candidates = [[Opt(OptOps.UPCAST, 0, u)] for u in (2, 4, 8)] + [[Opt(OptOps.UPCAST, 1, u)] for u in (2, 4, 8)]
  with Evaluator(k, "CPU", render=render) as ev:
    ev.deadline = clock[0] + 25  # two renders; the compiles then have 5 real seconds
    done = ev.evaluate(candidates)
  assert len(ev.render_s) == 2 and clock[0] <= ev.deadline, "a render ran past the deadline"
  assert [r.status for r in done] == ["ok", "ok"]


def test_compiles_past_the_deadline_are_not_waited_for() -> None:
  """A chunk's compiles started before the deadline ran 2.4 s past a 5 s budget on pocl, the evaluator waiting for all of them:
  now the candidates whose compile is not done at the deadline are left out, and closing the evaluator waits for none."""
  k = matmul_kernel(32)
  candidates = [[Opt(OptOps.UPCAST, 0, u)] for u in (2, 4, 8)]
  with Evaluator(k, "CPU") as ev:
    def slow(src: str, render_s: float) -> Built:
      time.sleep(5)
      return Built(source_hash(src), None, render_s, 5.0, "too slow")
    ev._compile = slow  # type: ignore[method-assign]
    st = time.monotonic()
    ev.deadline = st + 1.0
    assert ev.evaluate(candidates) == []
  assert time.monotonic() - st < 3.5


def test_a_noisy_retime_is_measured_again_then_said_not_a_speedup(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.delenv("TINYTUNE_NOISE_CHECK", raising=False)
  from tinytune.search.strategy import finalize
  default, up = (), (Opt(OptOps.UPCAST, 0, 4),)
  history = [Result(default, "ok", 4.5e-4, 4.7e-4, source_hash="d"), Result(up, "ok", 2.3e-4, 2.4e-4, source_hash="u")]

  class Retimes:  # the re-times a busy machine gives: the default 16x its search median (the 7.87 ms against 0.470 ms)
    def __init__(self, *rounds: list[Timing], end: float | None = None) -> None: self.rounds, self.calls, self.end = list(rounds), 0, end
    def retime(self, candidates: list) -> list[Timing]:
      self.calls += 1
      return self.rounds.pop(0)
  outlier, quiet = [Timing(7.87e-3, 0.05, 25), Timing(2.4e-4, 0.02, 25)], [Timing(4.8e-4, 0.02, 25), Timing(2.4e-4, 0.03, 25)]
  ev = Retimes(outlier, quiet)
  result = finalize(ev, history, default)  # type: ignore[arg-type]
  assert ev.calls == 2 and result.note == "" and result.best == up and result.speedup == pytest.approx(2.0) and result.repeats == 25
  ev = Retimes(outlier, [Timing(4.8e-4, 0.8, 25), Timing(2.4e-4, 0.03, 25)])  # still disturbed: its spread now
  result = finalize(ev, history, default)  # type: ignore[arg-type]
  assert ev.calls == 2 and result.note.startswith("noisy: the machine was busy (load ") and math.isnan(result.speedup)
  ev = Retimes(quiet)
  assert finalize(ev, history, default).note == "" and ev.calls == 1  # type: ignore[arg-type]
  ev = Retimes(outlier, quiet, end=time.monotonic())  # the budget's seconds are spent: not measured again, and said to be noisy
  assert finalize(ev, history, default).note.startswith("noisy") and ev.calls == 1  # type: ignore[arg-type]
  monkeypatch.setenv("TINYTUNE_NOISE_CHECK", "0")  # trust every re-time
  ev = Retimes(outlier)
  assert finalize(ev, history, default).note == "" and ev.calls == 1  # type: ignore[arg-type]
  monkeypatch.delenv("TINYTUNE_NOISE_CHECK", raising=False)
  ev = Retimes([Timing(9.4e-4, 0.1, 25), Timing(4.8e-4, 0.1, 25)])  # a load that slowed both alike: no matter
  assert finalize(ev, history, default).note == "" and ev.calls == 1  # type: ignore[arg-type]
  ev = Retimes([Timing(2.4e-4, 0.1, 25), Timing(2.4e-3, 0.9, 25)])  # the default still wins: no speedup claimed, nothing to doubt
  assert finalize(ev, history, default).best == default and ev.calls == 1  # type: ignore[arg-type]



def _group(pgid: int) -> list[int]:
  """The live processes of a process group (zombies are gone already: they run nothing)."""
  pids = []
  for entry in os.listdir("/proc"):
    try:
      with open(f"/proc/{entry}/stat") as f: fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError): continue
    if entry.isdigit() and int(fields[2]) == pgid and fields[0] != "Z": pids.append(int(entry))
  return pids


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stopped_search_records_stops_its_workers_and_resumes(tmp_path, signum: int) -> None:  # type: ignore[no-untyped-def]
  db = f"sqlite:///{tmp_path}/t.db"
  args = ["search", "matmul", "-p", "m=96", "-p", "n=96", "-p", "k=96", "--budget", "40", "--quiet", "--json"]
  # kernels compiled afresh: from a warm compile cache this search's 44 candidates take 2 s, and it ended before the signal came
  env = {**os.environ, "TINYTUNE_DB": db, "TINYTUNE_CACHE_DIR": str(tmp_path / "cc")}
  proc = subprocess.Popen([sys.executable, "-m", "tinytune.cli", *args], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True)  # its own group, as a shell's job is
  deadline = time.time() + 120
  while time.time() < deadline and proc.poll() is None:
    time.sleep(0.3)
    if os.path.exists(f"{tmp_path}/t.db") and len(Database(db).run_candidates(1)) >= 4: break
  os.killpg(proc.pid, signum)  # a terminal's Ctrl-C or hangup reaches the whole group; a scheduler's SIGTERM too
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 128 + signum and "Traceback" not in err and "interrupted" in err, err
  assert _group(proc.pid) == []  # none of its workers is left running
  assert Database(db).run(1).outcome == "interrupted" and len(before := Database(db).run_candidates(1)) >= 4
  resumed = tinytune(*args, "--resume", db=db)
  assert resumed.returncode == 0, resumed.stderr
  assert Database(db).run_candidates(1)[:len(before)] == before and Database(db).run(1).outcome == "done"


def test_a_search_with_workers_stopped_by_its_scheduler_stops_them_all(tmp_path) -> None:  # type: ignore[no-untyped-def]
  db = f"sqlite:///{tmp_path}/t.db"
  args = ["search", "matmul", "-p", "m=96", "-p", "n=96", "-p", "k=96", "--budget", "40", "--quiet", "--json", "--workers", "2", "--oversubscribe"]
  proc = subprocess.Popen([sys.executable, "-m", "tinytune.cli", *args, "--db", db], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, env={**os.environ, "TINYTUNE_CACHE_DIR": str(tmp_path / "cc")})  # compiled afresh, as above
  deadline = time.time() + 120
  while time.time() < deadline and proc.poll() is None:
    time.sleep(0.3)
    if os.path.exists(f"{tmp_path}/t.db") and sum(len(Database(db).run_candidates(i)) for i in (1, 2)) >= 4: break
  proc.send_signal(signal.SIGTERM)  # to the search alone, as a scheduler does: it stops the processes it started
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
  assert _group(proc.pid) == []
  assert {Database(db).run(i).outcome for i in (1, 2)} == {"interrupted"}  # type: ignore[union-attr]


@pytest.mark.parametrize("workload,seconds", [("mlp", 10.0), ("conv2d", 12.0)])
def test_seconds_is_the_whole_commands_wall_time_beside_a_cpu_hog(tmp_path, workload: str, seconds: float) -> None:  # type: ignore[no-untyped-def]
  if Device[Device.DEFAULT].emulated: pytest.skip(f"{Device.DEFAULT}'s setup (the default kernels run in NumPy) took 10.5 s of these seconds")
  hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a busy core beside the search
  try:
    st = time.monotonic()
    found = tinytune("search", workload, "--seconds", str(seconds), "--json", "--quiet", db=f"sqlite:///{tmp_path}/t.db")
    wall = time.monotonic() - st
  finally: hog.kill(); hog.wait()
  assert found.returncode == 0, found.stderr
  elapsed = json.loads(found.stdout)["elapsed_ms"] / 1e3  # from the process's start (imports, setup, re-time and writing included)
  assert elapsed <= seconds * 1.1 + 1, f"a {seconds} s search of {workload} took {elapsed:.1f} s ({wall:.1f} s with the interpreter's start)"
  assert elapsed > seconds * 0.5, f"a {seconds} s search of {workload} stopped after {elapsed:.1f} s"


def test_a_budget_too_small_for_the_setup_says_so(tmp_path) -> None:  # type: ignore[no-untyped-def]
  found = tinytune("search", "conv2d", "--seconds", "0.01", "--quiet", db=f"sqlite:///{tmp_path}/t.db")
  assert found.returncode == 2 and found.stderr.count("\n") == 1 and "s after the setup" in found.stderr, found.stderr


def test_the_first_error_of_each_kind_is_in_the_search_table() -> None:
  from tinytune.search.strategy import SearchResult
  from tinytune.search.tune import KernelOutcome, outcome_frame
  up = [(Opt(OptOps.UPCAST, 0, n),) for n in (2, 4, 8, 16)]
  history = [Result((), "ok", 1e-3, 1e-3, source_hash="a"), Result(up[0], "crashed", source_hash="b", error="the worker died (exit code -11)"),
             Result(up[1], "crashed", source_hash="c", error="the worker died (exit code -6)"), Result(up[2], "invalid", error="too wide"),
             Result(up[3], "timeout", source_hash="d", error="cut off after 2.0 s, over 9x the best so far")]
  result = SearchResult((), 1e-3, (), 1e-3, history)
  assert result.errors() == "crashed: the worker died (exit code -11); timeout: cut off after 2.0 s, over 9x the best so far"
  outcome = KernelOutcome("k", "r_8", (), 1e-3, 1e-3, False, result.counts(), 0.01, "", result.errors())
  (row,) = outcome_frame([outcome]).to_dict("records")
  assert row["errors"] == result.errors() and row["candidates"] == {"crashed": 2, "invalid": 1, "ok": 1, "timeout": 1}


def emu_matmul_kernel(n: int) -> Kernel:
  a, b = Tensor.rand(n, n, device="EMU").realize(), Tensor.rand(n, n, device="EMU").realize()
  return Kernel(create_schedule((a @ b).uop, "EMU")[0][0].ast, Device["EMU"].caps)


SLOW_S = 0.2  # a GPU's render and compile, as sleeps: a TC candidate took 60 ms to render and 600 to compile, 165 to verify and time (H200)
EMU_CANDIDATES = [[Opt(OptOps.UPCAST, d, u)] for d in (0, 1) for u in (2, 4)] + [[Opt(OptOps.LOCAL, d, 4)] for d in (0, 1)]


def slow_emu_builds(monkeypatch: pytest.MonkeyPatch) -> None:
  """EMU renders and compiles as slowly as a GPU's TC candidates do (the forked compile processes inherit the patches)."""
  from tinytune.runtime.emu import EMUDevice, EMURenderer
  render, compile = EMURenderer.render, EMUDevice.compile
  def slow_render(self: EMURenderer, k: Kernel) -> str:
    time.sleep(SLOW_S)
    return render(self, k)
  def slow_compile(self: EMUDevice, src: str) -> bytes:
    time.sleep(SLOW_S)
    return compile(self, src)
  monkeypatch.setattr(EMURenderer, "render", slow_render)
  monkeypatch.setattr(EMUDevice, "compile", slow_compile)


def test_a_gpu_compiles_candidates_while_it_times_others(monkeypatch: pytest.MonkeyPatch) -> None:
  """Where the device compiles apart (CUDA, EMU), forked processes render and compile the next candidates while the worker verifies
  and times one: the wall time is about the runs' (the builds, two at a time, take less), not the sum of builds and runs, as when
  the evaluator rendered each chunk of candidates in turn before running them. Each result says where its seconds went."""
  slow_emu_builds(monkeypatch)
  policy = TimingPolicy(warmup_seconds=2 * SLOW_S, warmup_runs=None, max_seconds=0.05)  # each candidate's timing takes as long as its build, or more
  with Evaluator(emu_matmul_kernel(32), "EMU", jobs=2, policy=policy) as ev:
    assert ev.evaluate([()])[0].status == "ok"  # the worker started, the compile processes forked
    st = time.monotonic()
    done = ev.evaluate(EMU_CANDIDATES)
    wall = time.monotonic() - st
  ok = [r for r in done if r.status == "ok"]
  assert len(ok) >= 5, [(r.opts, r.status, r.error) for r in done]
  assert all(r.render_s >= SLOW_S and r.compile_s >= SLOW_S and 0 < r.verify_s < r.run_s for r in ok)
  serial = sum(r.render_s + r.compile_s + r.run_s for r in ok)
  assert wall < 0.7 * serial, f"{wall:.2f} s for {len(ok)} candidates whose renders, compiles and runs took {serial:.2f} s in all"


def test_the_next_round_compiles_while_this_one_runs(monkeypatch: pytest.MonkeyPatch) -> None:
  """BEAM names its likely next round from a round's results so far (`following`), and the evaluator compiles it while the worker
  runs the round's last candidates: the next call finds them built and the worker waits for no compile (a TC round on an H200 is 7 to
  30 candidates, each run in ~40 ms once verified on the device, while a compile took 227 to 506 ms)."""
  slow_emu_builds(monkeypatch)
  first, second = [tuple(c) for c in EMU_CANDIDATES[:3]], [tuple(c) for c in EMU_CANDIDATES[3:]]
  seen: list[int] = []
  def following(so_far: list[Result]) -> list[tuple[Opt, ...]]:
    seen.append(len(so_far))
    return second
  with Evaluator(emu_matmul_kernel(32), "EMU", jobs=2, policy=TimingPolicy(max_seconds=0.05)) as ev:
    assert ev.evaluate([()])[0].status == "ok"
    assert [r.status for r in ev.evaluate(first, following)] == ["ok"] * 3
    # asked before any result came, and again as they came; those built once the round's last were with the worker went to it too
    assert seen[0] == 0 and set(ev.early) | {s.opts for s in ev.sent} | set(ev.ahead) == set(second)
    wait([build for _, build in ev.early.values()])
    st = time.monotonic()
    done = ev.evaluate(second)
    waited = time.monotonic() - st - sum(r.run_s for r in done)
  assert [r.status for r in done] == ["ok"] * 3 and not ev.early
  assert waited < SLOW_S, f"the worker waited {waited:.2f} s for builds that were done"


def test_early_builds_no_longer_likely_are_dropped_once_built() -> None:
  """A build `following` named that a later guess no longer names goes once it is built, not at the evaluator's close: a long search
  guesses a new round at every result, and kept every program it once thought likely."""
  first, second = [tuple(c) for c in EMU_CANDIDATES[:3]], [tuple(c) for c in EMU_CANDIDATES[3:]]
  with Evaluator(emu_matmul_kernel(32), "EMU", jobs=2) as ev:
    ev._compile_early(first)
    wait([build for _, build in ev.early.values()])
    ev._compile_early(second)
    assert set(ev.early) == set(second)


def test_the_worker_starts_with_the_first_candidate_to_measure() -> None:
  """No worker starts (nor the reference compiles) for candidates all stored already, as a resume of a finished search finds them:
  a GPU's worker takes a second or more to start. The first candidate that needs measuring starts it."""
  k = matmul_kernel(16)
  stored = {opts_to_json(opts): Result(opts, "ok", 1e-3, 1e-3, source_hash=str(i), stored=True)
            for i, opts in enumerate([(), tuple(default_opts(k))])}
  with Evaluator(k, "CPU", known=stored) as ev:
    assert [r.status for r in ev.evaluate([(), default_opts(k)])] == ["ok", "ok"]
    assert ev.worker is None and ev.ref is None
    assert ev.evaluate([[Opt(OptOps.UPCAST, 0, 2)]])[0].status == "ok" and ev.worker is not None


@pytest.mark.parametrize("strategy", ["random", "optuna"])
def test_random_and_optuna_keep_the_compiles_busy(strategy: str, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
  """Random search draws, and optuna asks for, its next candidates while the worker runs a batch (optuna's constant liar counts the
  batch's as bad guesses), and the evaluator compiles them meanwhile (`following`): each batch after the first finds every one of
  its new candidates built or building, where a GPU's 16 compile processes idled at the end of every batch (of 8, of 4) before,
  and the worker waited for the next batch's first compiles. Trials asked ahead and never run are told so."""
  if strategy == "optuna": pytest.importorskip("optuna")
  ready: list[float] = []
  evaluate = Evaluator.evaluate
  def spy(self: Evaluator, candidates: list, following: object = None) -> list[Result]:
    early = set(self.early) | set(self.ahead) | {s.opts for s in self.sent}  # building or built, with the worker, or measured
    ready.append(sum(tuple(c) in early for c in candidates) / max(1, len(candidates)))
    return evaluate(self, candidates, following)  # type: ignore[arg-type]
  monkeypatch.setattr(Evaluator, "evaluate", spy)
  k = emu_matmul_kernel(32)
  with Evaluator(k, "EMU", jobs=2, policy=TimingPolicy(max_seconds=0.01)) as ev:
    db = f"sqlite:///{tmp_path}/optuna.db"
    result = run_strategy(strategy, k, ev, Budget(14), default_opts(k), SearchContext(db, 1, "matmul", device="EMU"), batch=4)
  if strategy == "optuna":
    import optuna
    (summary,) = optuna.get_all_study_summaries(db)
    states = {t.state.name for t in optuna.load_study(study_name=summary.study_name, storage=db).trials}
    assert "RUNNING" not in states and "COMPLETE" in states, states
  assert len(ready) >= 4 and all(r == 1.0 for r in ready[1:] if r), ready
  assert sum(r > 0 for r in ready[1:]) >= 3, ready
  assert sum(r.status != "invalid" for r in result.history) == 14


@pytest.mark.parametrize("strategy", ["beam", "random", "optuna"])
def test_the_worker_has_the_next_candidate_while_it_runs_one(strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
  """The evaluator sends the worker its next candidate before reading the answer to the one it runs, within a call and across
  calls (the next call's likely candidates, compiled early, go to it once this call's last are with it): the worker no longer waits
  for this process to record a result, nor for the strategy to draw, ask or expand between calls (on a fake GPU it sat idle for
  most of a search)."""
  if strategy == "optuna": pytest.importorskip("optuna")
  queued: list[int] = []  # at each answer the search reads, the requests the worker had
  reply = _Worker.reply
  def spy(self: _Worker, timeout: float) -> list:
    if ev.sent: queued.append(len(ev.sent))
    return reply(self, timeout)
  monkeypatch.setattr(_Worker, "reply", spy)
  k = emu_matmul_kernel(32)
  # each candidate's run takes 0.1 s or more, its build (EMU: rendering it) much less: every answer can find the next one built
  with Evaluator(k, "EMU", jobs=2, policy=TimingPolicy(warmup_seconds=0.1, warmup_runs=None, max_seconds=0.01)) as ev:
    options = {} if strategy == "beam" else {"batch": 3}
    result = run_strategy(strategy, k, ev, Budget(12), default_opts(k), **options)
  assert sum(r.status != "invalid" for r in result.history) >= 10
  # one at a time before; with calls of 3 and only a call's own candidates queued, at most 2 answers in 3
  assert sum(n >= 2 for n in queued) >= 0.8 * (len(queued) - 1), queued
  # and by the worker's own clock it waited for its requests (after the first, which waits for the first build) far less than it ran them
  waited, ran = (sum(x) for x in zip(*ev.worker_s[1:]))
  assert len(ev.worker_s) == len(queued) and waited < 0.5 * ran, ev.worker_s


def test_a_gpu_search_keeps_its_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
  """A BEAM search on a GPU with compiles in flight at the deadline ends within 10% of its --seconds: they are not waited for."""
  slow_emu_builds(monkeypatch)
  k = emu_matmul_kernel(32)
  with Evaluator(k, "EMU", jobs=2, policy=TimingPolicy(warmup_seconds=0.1, warmup_runs=None, max_seconds=0.05)) as ev:
    st = time.monotonic()
    result = run_strategy("beam", k, ev, Budget(None, 5.0), default_opts(k))
    wall = time.monotonic() - st
  assert wall <= 5.5 and result.counts().get("ok", 0) >= 1, (wall, result.counts())


def test_compile_processes_end_quietly_under_the_commands_stop_handler(capfd: pytest.CaptureFixture[str]) -> None:
  """A search command raises Stopped on SIGTERM; the compile processes it forks must not: the search terminates them at its end (and
  a Ctrl-C reaches them with it), and each printed a traceback of Stopped raised in its queue's wait."""
  from tinytune.helpers import on_stop_signal
  before = signal.signal(signal.SIGTERM, on_stop_signal)
  try:
    with Evaluator(emu_matmul_kernel(32), "EMU", jobs=2) as ev: assert [r.status for r in ev.evaluate(EMU_CANDIDATES[:2])] == ["ok"] * 2
  finally: signal.signal(signal.SIGTERM, before)
  time.sleep(0.5)  # the terminated processes' last words
  assert "Traceback" not in capfd.readouterr().err


def test_a_slow_compile_holds_up_no_other(monkeypatch: pytest.MonkeyPatch) -> None:
  """The worker runs whichever candidate in flight is built first: a TC candidate's compile took from 1.3 to 38 s (loaded Zen 4),
  and the candidates given after it are measured while it compiles."""
  from tinytune.runtime.emu import EMUDevice
  k, first, *rest = emu_matmul_kernel(32), *EMU_CANDIDATES[:4]
  slow_src, compile = Device["EMU"].renderer.render(k.copy().apply_opts(first)), EMUDevice.compile
  def slow(self: EMUDevice, src: str) -> bytes:
    if src == slow_src: time.sleep(3)
    return compile(self, src)
  monkeypatch.setattr(EMUDevice, "compile", slow)
  order: list[tuple[Opt, ...]] = []
  with Evaluator(k, "EMU", jobs=2, on_result=lambda r: order.append(r.opts)) as ev:
    assert ev.evaluate([()])[0].status == "ok"
    done = ev.evaluate([first, *rest])
  assert [r.status for r in done] == ["ok"] * 4 and [r.opts for r in done] == [tuple(c) for c in [first, *rest]]
  assert order[1:] == [*map(tuple, rest), tuple(first)], order
