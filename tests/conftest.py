from __future__ import annotations

import contextlib
import os
import zlib
from typing import Iterator

import numpy as np
import pytest

from tinytune.codegen.caps import CUDA_ARCHS
from tinytune.runtime import Device, device_status
from tinytune.runtime.emu import emu_caps

# the suite runs on shared, loaded machines where tiny kernels' re-times are often noisy: tests of the tuning cache need what a search
# finds stored; the tests of noise detection turn it back on (monkeypatch.delenv)
os.environ.setdefault("TINYTUNE_NOISE_CHECK", "0")

# devices with workgroups that open here; CI has OPENCL through pocl
WORKGROUP_DEVICES = [d for d in ("OPENCL", "CUDA", "AMD") if device_status(d) is None]


def pytest_configure(config: pytest.Config) -> None:
  """A TINYTUNE_DEVICE that names no device, or one that does not open here, stops the run with one line, not a failure per test."""
  if not os.getenv("TINYTUNE_DEVICE"): return
  try: why = device_status(Device.DEFAULT)
  except ValueError as e: why = str(e)
  if why is not None: pytest.exit(f"tinytune's tests cannot run on TINYTUNE_DEVICE={os.environ['TINYTUNE_DEVICE']}: {why}", returncode=4)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  """pocl compiles a kernel in about 0.2 s: on OpenCL, a parametrized test runs few cases that bring each of its parameter values
  once (picked greedily, the case with the most values not yet brought first), and a fixed eighth of the others (the CPU runs
  them all); TT_FUZZ_SCALE=2 runs them all."""
  if int(os.getenv("TT_FUZZ_SCALE", "1")) >= 2: return
  by_test: dict[str, list[pytest.Item]] = {}
  for item in items:
    params = getattr(getattr(item, "callspec", None), "params", {})
    if params.get("each_device", params.get("device")) == "OPENCL":
      by_test.setdefault(item.module.__name__ + item.originalname, []).append(item)  # type: ignore[attr-defined]
  keep = {item.nodeid for cases in by_test.values() for item in cases if zlib.crc32(item.nodeid.encode()) % 8 == 0}
  for cases in by_test.values():
    values = {item.nodeid: {(k, repr(v)) for k, v in item.callspec.params.items()} for item in cases}  # type: ignore[attr-defined]
    seen: set[tuple[str, str]] = set()
    while values[(best := max(cases, key=lambda item: len(values[item.nodeid] - seen))).nodeid] - seen:
      keep.add(best.nodeid)
      seen |= values[best.nodeid]
  drop = [item for cases in by_test.values() for item in cases if item.nodeid not in keep]
  if drop:
    config.hook.pytest_deselected(items=drop)
    dropped = {item.nodeid for item in drop}
    items[:] = [item for item in items if item.nodeid not in dropped]


@pytest.fixture(autouse=True)
def _seed() -> None:
  np.random.seed(0)


@pytest.fixture
def on_cpu() -> Iterator[None]:
  """The CPU as the default device, for a test of something true of the CPU alone (its memory, its one native call, its kernels'
  C source), whatever TINYTUNE_DEVICE the suite runs under (`@pytest.mark.usefixtures("on_cpu")`)."""
  default, Device.DEFAULT = Device.DEFAULT, "CPU"
  try: yield
  finally: Device.DEFAULT = default


@contextlib.contextmanager
def emu_arch(arch: str) -> Iterator[None]:
  """EMU with the caps of `arch` (sm_80, sm_90) for the duration."""
  dev = Device["EMU"]
  saved = dev.arch, dev.caps  # type: ignore[attr-defined]
  dev.arch, dev.caps = arch, emu_caps(arch)  # type: ignore[attr-defined]
  try: yield
  finally: dev.arch, dev.caps = saved  # type: ignore[attr-defined]


@pytest.fixture(params=["CPU", *WORKGROUP_DEVICES, "EMU"])
def each_device(request: pytest.FixtureRequest) -> Iterator[str]:
  """Run a test once per device, with tensors made on it by default (`@pytest.mark.usefixtures("each_device")`); the test gets the
  device's name. EMU runs each test once, with one of CUDA_ARCHS' caps picked by the test's id (both archs over the suite: EMU is
  slow, and running every test on both had made the suite 3900 tests long)."""
  name, arch = request.param, ""
  if name == "EMU": arch = CUDA_ARCHS[zlib.crc32(request.node.nodeid.encode()) % len(CUDA_ARCHS)]
  default, Device.DEFAULT = Device.DEFAULT, name
  try:
    with emu_arch(arch) if arch else contextlib.nullcontext(): yield name
  finally: Device.DEFAULT = default


@pytest.fixture(params=["CPU", *WORKGROUP_DEVICES])
def oracle_device(request: pytest.FixtureRequest) -> Iterator[str]:
  """each_device without EMU, for the PyTorch-oracle checks of behaviours (errors, edge values, gradients) that a GPU's kernels
  must keep as the CPU's do: the CPU and the devices with workgroups here (OPENCL through pocl)."""
  default, Device.DEFAULT = Device.DEFAULT, request.param
  try: yield request.param
  finally: Device.DEFAULT = default


def reset_postgres(url: str) -> None:
  """Drop every table of the test database at `url`: ours, our version table and optuna's."""
  from sqlalchemy import MetaData, create_engine
  engine = create_engine(url)
  metadata = MetaData()
  metadata.reflect(engine)
  metadata.drop_all(engine)
  engine.dispose()


FAKE_CPU = {"kind": "CPU", "name": "Fake CPU", "arch": "x86_64-test", "compiler": "cc", "compiler_version": "cc 1.0", "flags": "-O3",
            "codegen_version": "1"}


@pytest.fixture
def report_db(tmp_path):  # type: ignore[no-untyped-def]
  """A recorded results database with fake timings: two matmul sizes, beam and random searches, the tuning cache, baselines, peaks."""
  from tinytune.results_db import Database, fingerprint_hash
  db = Database(f"sqlite:///{tmp_path / 'results.db'}")
  dev = db.device_id(FAKE_CPU)
  db.set_peak(dev, 100.0, 20.0, "fake probe")
  for n in (64, 128):
    params = {"m": n, "n": n, "k": n}
    kernel = db.kernel_id(f"key{n}", f"r_{n}_{n}_{n}", "ast", [n, n, n], ["float32"], 2 * n ** 3, 12 * n * n)
    for strategy, times in (("beam", [4.0, 3.0, 3.5, 2.0, None]), ("random", [4.0, 3.8, None, 2.5, 2.6])):
      run = db.start_run("matmul", params, dev, strategy, {}, {"candidates": 5}, f"sig {n} {strategy}", "float32")
      for i, t in enumerate(times):
        s = t * n / 64e3 if t else None
        db.record_candidate(run, kernel, dev, f'[["UPCAST",0,{i}]]', f"h{i}", 0.1, "ok" if t else "crashed", s, s, 0.01 if t else None,
                            "" if t else "the worker died")
      db.finish_run(run, "done")
    db.set_tuned(f"key{n}", fingerprint_hash(FAKE_CPU), '[["UPCAST",0,3]]', 2.0 * n / 64e3, 4.0 * n / 64e3, run)
    for library, ms in (("tinytune-default", 4.0), ("tinytune-tuned", 2.0), ("torch", 1.0), ("numpy", 1.5)):
      db.add_baseline(dev, "matmul", params, library, "1.0", ms * n / 64e3, ms * n / 70e3)
  db.close()
  return f"sqlite:///{tmp_path / 'results.db'}"
