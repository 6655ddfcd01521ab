"""The CPU device's targets (TINYTUNE_CPU_TARGET, --target): caps and fingerprints from the target, not the host; kernels built
for each target the host runs, and a one-line error for one it cannot; the compiler rule and its note where OpenMP is missing."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys

import pytest
from ops_support import bench_module

from tinytune import helpers
from tinytune.cli import main
from tinytune.results_db import fingerprint_hash
from tinytune.runtime import Device, DeviceMissing
from tinytune.runtime import cpu as cpu_module
from tinytune.runtime.cpu import CPUDevice, cannot_run, cpu_target, normal_machine

X86 = normal_machine(platform.machine()) == "x86_64"
HOST_FLAGS = cpu_module.cpuinfo().get("flags", "").split()
AVX512_HOST = "avx512f amd avx512bw avx512cd avx512dq avx512vl avx2 avx fma bmi1 bmi2 f16c movbe ssse3 sse4_1 sse4_2 popcnt".split()
AVX2_HOST = [f for f in AVX512_HOST if not f.startswith("avx512")]


pytestmark = pytest.mark.usefixtures("on_cpu")  # all of it is the CPU device's, whatever TINYTUNE_DEVICE the suite runs under


def runnable(target: str) -> bool: return cannot_run(cpu_target(target)) is None


@pytest.mark.parametrize("target,lanes,registers", [("x86-64-v2", 4, 16), ("x86-64-v3", 8, 16), ("x86-64-v4", 16, 32), ("aarch64", 4, 32)])
def test_caps_come_from_the_target(target: str, lanes: int, registers: int, monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(cpu_module, "find_compiler", lambda t: "cc")  # caps need no cross compiler
  caps = CPUDevice(target).caps
  assert (caps.simd_width, caps.vector_registers, caps.tensor_cores) == (lanes, registers, ())
  assert caps.l1_bytes >= 16 << 10 and caps.l2_bytes >= caps.l1_bytes


def test_native_caps_follow_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
  for flags, lanes, registers, dot in [(AVX512_HOST + ["avx512_bf16"], 16, 32, ("bfloat16",)), (AVX2_HOST, 8, 16, ())]:
    monkeypatch.setattr(cpu_module, "cpuinfo", lambda flags=flags: {"flags": " ".join(flags), "model name": "some CPU"})
    target = cpu_target("native")
    assert (target.lanes, target.registers, target.dot, target.march) == (lanes, registers, dot, "-march=native")


def test_cache_sizes_are_read_from_the_machine() -> None:
  l1, l2 = cpu_module.cache_sizes()
  out = subprocess.run(["getconf", "LEVEL1_DCACHE_SIZE"], capture_output=True, text=True).stdout.strip() if shutil.which("getconf") else ""
  if out.isdigit() and int(out): assert l1 == int(out)
  assert l2 > l1


def test_fingerprint_names_the_target_and_not_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
  """Each target has its own fingerprint; a named target's is the same on every CPU (a cache tuned for x86-64-v3 is found on any
  AVX2 machine), where native's follows the CPU."""
  monkeypatch.setattr(cpu_module, "find_compiler", lambda t: "cc")
  hashes = {t: fingerprint_hash(CPUDevice(t).fingerprint()) for t in ("native", "x86-64-v2", "x86-64-v3", "x86-64-v4")}
  assert len(set(hashes.values())) == 4
  assert CPUDevice("x86-64-v3").fingerprint()["target"] == "x86-64-v3"
  monkeypatch.setattr(cpu_module, "cpuinfo", lambda: {"flags": " ".join(AVX2_HOST), "model name": "AMD EPYC 7B13"})
  assert fingerprint_hash(CPUDevice("x86-64-v3").fingerprint()) == hashes["x86-64-v3"]
  assert fingerprint_hash(CPUDevice("native").fingerprint()) != hashes["native"]


CHECK = """
import numpy as np
from tinytune import Tensor
from tinytune.runtime import Device
rng = np.random.default_rng(0)
a, b, x = rng.standard_normal((67, 45), np.float32), rng.standard_normal((45, 133), np.float32), rng.standard_normal((37, 300), np.float32)
np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
e = np.exp(x - x.max(1, keepdims=True))
np.testing.assert_allclose(Tensor(x).softmax(1).numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
np.testing.assert_allclose((Tensor(x).exp() * 2 + 1).sum(0).numpy(), (np.exp(x) * 2 + 1).sum(0), rtol=1e-4)
print(Device["CPU"].target.name, Device["CPU"].caps.simd_width)
"""


@pytest.mark.parametrize("target", ["native", "x86-64-v2", "x86-64-v3"])
def test_kernels_run_correctly_for_each_target(target: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
  if not X86 or not runnable(target): pytest.skip(f"this CPU does not run {target}")
  env = {**os.environ, "TINYTUNE_CPU_TARGET": target, "TINYTUNE_CACHE_DIR": str(tmp_path), "TINYTUNE_DEVICE": "CPU"}
  out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env)
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() == [target, str(cpu_target(target).lanes)]


def test_a_target_this_cpu_cannot_run_compiles_but_does_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
  """aarch64 code on x86 (with the cross compiler) and AVX-512 code on an AVX2 CPU: rendered and compiled, then a one-line error."""
  monkeypatch.setattr(cpu_module, "cpuinfo", lambda: {"flags": " ".join(AVX2_HOST), "model name": "an AVX2 CPU"})
  assert "lacks avx512f avx512bw" in str(cannot_run(cpu_target("x86-64-v4")))
  assert cannot_run(cpu_target("x86-64-v3")) is None and cannot_run(cpu_target("x86-64-v2")) is None
  targets = ["x86-64-v4"] + (["aarch64"] if shutil.which("aarch64-linux-gnu-gcc") or not X86 else [])
  for target in targets:
    dev = CPUDevice(target)
    lib = dev.compile("void k(float* x) { x[0] = 1.0f; }")
    with open(lib.decode(), "rb") as f: machine = int.from_bytes(f.read(20)[18:20], "little")  # the ELF header's e_machine
    assert machine == {"x86-64-v4": 62, "aarch64": 183}[target]
    with pytest.raises(DeviceMissing, match=f"built for {target} cannot run here .*TINYTUNE_CPU_TARGET") as e: dev.program("k", lib)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("argv,env", [(["--target", "avx9"], {}), ([], {"TINYTUNE_CPU_TARGET": "x86-64-v9"})])
def test_a_bad_target_is_a_one_line_error(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
  monkeypatch.setenv("TINYTUNE_CPU_TARGET", "native")  # and put back as it was after main() sets it
  for k, v in env.items(): monkeypatch.setenv(k, v)
  monkeypatch.setattr(Device, "_opened", {})  # the CPU device opens again, for the target asked
  assert main(["bench", "matmul", "-p", "m=8", "-p", "n=8", "-p", "k=8", "--no-store", "--no-peak", *argv]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "is not a CPU target" in err and "x86-64-v3" in err, err


@pytest.mark.parametrize("argv,env", [(["--target", "avx9"], {}), ([], {"TINYTUNE_CPU_TARGET": "x86-64-v9"})])
def test_a_bad_target_is_an_error_on_any_device(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
  """`bench --device cuda --target avx9` ran without a word: the target is the CPU's, which a GPU's bench never opened."""
  monkeypatch.setenv("TINYTUNE_CPU_TARGET", "native")  # and put back as it was after main() sets it
  for k, v in env.items(): monkeypatch.setenv(k, v)
  for device in ("CUDA", "EMU"):  # absent here, or present: the target is checked before either opens
    assert main(["bench", "matmul", "-p", "m=8", "-p", "n=8", "-p", "k=8", "--no-store", "--no-peak", "--device", device, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a CPU target" in err and "x86-64-v3" in err, err


def test_a_compiler_without_openmp_is_not_chosen_over_one_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.delenv("TINYTUNE_CC", raising=False)
  monkeypatch.setattr(shutil, "which", lambda cc: f"/usr/bin/{cc}")
  monkeypatch.setattr(cpu_module, "openmp_works", lambda cc: cc == "gcc")
  cpu_module.find_compiler.cache_clear()
  try: assert cpu_module.find_compiler(cpu_target("native")) == "gcc"
  finally: cpu_module.find_compiler.cache_clear()


def test_openmp_counts_only_where_the_loop_calls_a_runtime() -> None:
  """gcc's -fopenmp builds a parallel loop; clang's -fopenmp=libgomp builds too, links libgomp and drops the pragma (clang compiles
  OpenMP for libomp only): not OpenMP, or its kernels would run one thread while the device counts two."""
  if shutil.which("gcc"): assert cpu_module.openmp_works("gcc")
  if shutil.which("clang"): assert not cpu_module.openmp_works("clang", "-fopenmp=libgomp")


def test_one_thread_without_openmp_is_said_once(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
  """TINYTUNE_CC=clang where clang has no libomp (Debian's clang 14): the kernels lose their threads, and the device says so once,
  with the fix."""
  if not shutil.which("clang"): pytest.skip("needs clang")
  monkeypatch.setenv("TINYTUNE_CC", "clang")
  monkeypatch.setattr(cpu_module, "openmp_works", lambda cc: False)
  monkeypatch.setattr(helpers, "_warned", set())
  cpu_module.find_compiler.cache_clear()
  try: devices = [CPUDevice() for _ in range(2)]
  finally: cpu_module.find_compiler.cache_clear()
  err = capsys.readouterr().err
  assert err.count("tinytune: warning: clang cannot build OpenMP here, so CPU kernels run on one thread: apt-get install libomp-dev") == 1, err
  assert all(d.caps.threads == 1 and "-fopenmp" not in d.flags for d in devices)


HARNESS = """
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char** argv) {
  void* bufs[%(n)d];
  long sizes[%(n)d] = {%(sizes)s};
  for (int i = 0; i < %(n)d; i++) {
    bufs[i] = aligned_alloc(64, (sizes[i] + 63) / 64 * 64);
    if (i == 0) continue;
    FILE* f = fopen(argv[i], "rb");
    if (!f || fread(bufs[i], 1, sizes[i], f) != (size_t)sizes[i]) return 1;
    fclose(f);
  }
  %(name)s(%(args)s);
  FILE* f = fopen(argv[%(n)d], "wb");
  fwrite(bufs[0], 1, sizes[0], f);
  fclose(f);
  return 0;
}
"""


def aarch64_samples() -> list[tuple[str, object, object]]:
  """(name, lazy Tensor, NumPy reference) of kernels that each compile to one kernel: a matmul (a register tile of vectors),
  softmax (row statistics, exp), a column sum and an elementwise chain with a transcendental."""
  import numpy as np

  from tinytune import Tensor
  rng = np.random.default_rng(0)
  a, b, x = rng.standard_normal((37, 45), np.float32), rng.standard_normal((45, 72), np.float32), rng.standard_normal((29, 130), np.float32)
  e = np.exp(x - x.max(1, keepdims=True))
  return [("matmul", Tensor(a) @ Tensor(b), a @ b), ("softmax", Tensor(x).softmax(1), e / e.sum(1, keepdims=True)),
          ("column_sum", Tensor(x).sum(0), x.sum(0)), ("elementwise", (Tensor(x).exp2() * 0.5 + Tensor(x).abs()).sqrt(),
                                                      np.sqrt(np.exp2(x) * 0.5 + np.abs(x)))]


@pytest.mark.skipif(not (shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64")),
                    reason="needs aarch64-linux-gnu-gcc and qemu-aarch64 (apt-get install gcc-aarch64-linux-gnu qemu-user)")
def test_aarch64_kernels_run_under_qemu(tmp_path) -> None:  # type: ignore[no-untyped-def]
  """A sample of kernels with their default opts for the aarch64 target (4 lanes, 32 registers), cross-compiled with Debian's
  gcc into a small C harness (static, one thread: no ctypes across architectures) and run under qemu-aarch64 against NumPy."""
  import numpy as np

  from tinytune.codegen.heuristic import default_opts
  from tinytune.codegen.kernel import Kernel
  from tinytune.engine.schedule import create_schedule
  dev = CPUDevice("aarch64")
  flags = [f for f in dev.flags if f not in ("-shared", "-fPIC", "-fopenmp")]
  for name, out, ref in aarch64_samples():
    (item,), _ = create_schedule(out.uop, "CPU")  # type: ignore[attr-defined]
    kernel = Kernel(item.ast, dev.caps)
    kernel.apply_opts(default_opts(kernel))
    bufs = [item.out, *kernel.bufs]
    src = dev.renderer.render(kernel) + HARNESS % {"n": len(bufs), "sizes": ", ".join(str(b.nbytes) for b in bufs), "name": kernel.name,
                                                   "args": ", ".join(f"bufs[{i}]" for i in range(len(bufs)))}
    assert name != "matmul" or "tt_f4" in src  # NEON's vectors of 4 floats
    (tmp_path / f"{name}.c").write_text(src)
    build = subprocess.run([dev.cc, *flags, "-static", "-Wno-unknown-pragmas", f"{name}.c", "-o", name, "-lm"], cwd=tmp_path, capture_output=True,
                           text=True)
    assert build.returncode == 0, build.stderr
    for i, b in enumerate(bufs[1:], 1): b.numpy_view().tofile(tmp_path / f"{name}.in{i}")
    run = subprocess.run(["qemu-aarch64", f"./{name}", *(f"{name}.in{i}" for i in range(1, len(bufs))), f"{name}.out"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, (name, run.stderr)
    got = np.fromfile(tmp_path / f"{name}.out", item.out.dtype.np).reshape(np.shape(ref))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("target", ["x86-64-v2", "x86-64-v3", "x86-64-v4", "aarch64"])
@pytest.mark.parametrize("m,n,k", [(1024, 1024, 1024), (128, 3072, 768), (64, 1024, 512), (100, 64, 32), (97, 61, 80), (37, 70, 45),
                                   (1000, 1000, 8)])
def test_register_tile_fills_the_targets_registers(target: str, m: int, n: int, k: int, monkeypatch: pytest.MonkeyPatch) -> None:
  """A matmul's default register tile, from the target's caps: accumulators (rows x vectors) within the registers less 4 (for B's
  vectors and a broadcast of A), and at least 12 of them where rows padded by at most 1/16 allow it (AVX2's 6x16: FMAs enough in
  flight for two units); odd sizes (97x61) in whole vectors, padded by at most 1/8, never scalar."""
  import numpy as np

  from tinytune import Tensor
  from tinytune.codegen.heuristic import default_opts
  from tinytune.codegen.kernel import AxisKind, Kernel
  from tinytune.codegen.opts import OptOps
  from tinytune.engine.schedule import create_schedule
  monkeypatch.setattr(cpu_module, "find_compiler", lambda t: "cc")
  caps = CPUDevice(target).caps
  (item,), _ = create_schedule((Tensor(np.ones((m, k), np.float32)) @ Tensor(np.ones((k, n), np.float32))).uop, "CPU")
  kernel = Kernel(item.ast, caps)
  opts = default_opts(kernel)
  kernel.apply_opts(opts)
  tile = {a.dim: a.size for a in kernel.axes if a.kind is AxisKind.UPCAST}
  rows, vectors = tile.get(0, 1), -(-tile.get(1, 1) // caps.simd_width)
  assert tile.get(1, 1) >= 4 and rows > 1 and rows * vectors <= caps.vector_registers - 4, (opts, caps)
  assert (kernel.sizes[0] - m) * 8 <= m and (kernel.sizes[1] - n) * 8 <= n
  assert (kernel.sizes[:2] == [m, n]) == all(o.op is not OptOps.PADTO for o in opts)
  if caps.vector_registers == 16 and (m % 6 == 0 or (-m % 6) * 16 <= m): assert rows * vectors == 12, opts


def test_a_cache_tuned_for_a_target_is_exported_for_it(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                       tmp_path) -> None:  # type: ignore[no-untyped-def]
  """`search --target x86-64-v3` stores its opts under the target's fingerprint, and `cache export --target x86-64-v3` ships them
  (native's export has none of them): the cache a fleet of AVX2 machines reads."""
  import json

  from tinytune.codegen import CODEGEN_VERSION
  from tinytune.engine import forget, program
  if not runnable("x86-64-v3"): pytest.skip("needs an x86 CPU with AVX2")
  monkeypatch.setenv("TINYTUNE_CPU_TARGET", "native")  # and put back as it was after main() sets it
  monkeypatch.setattr(Device, "_opened", {})
  monkeypatch.setattr(program, "_programs", {})
  db, small = str(tmp_path / "t.db"), ["-p", "m=16", "-p", "n=16", "-p", "k=16"]
  try:
    assert main(["search", "matmul", *small, "--budget", "3", "--db", db, "--target", "x86-64-v3", "--json"]) == 0
    v3 = json.loads(capsys.readouterr().out)["fingerprint"]
    assert v3 == fingerprint_hash({**CPUDevice("x86-64-v3").fingerprint(), "codegen_version": CODEGEN_VERSION})
    for target, entries in (("x86-64-v3", 1), ("native", 0)):
      monkeypatch.setattr(Device, "_opened", {})
      assert main(["cache", "export", "--db", db, "--target", target, "--out", str(tmp_path / f"{target}.db")]) == 0
      assert f": {entries} entries" in capsys.readouterr().out
  finally: forget()


def test_column_panels_follow_the_l2_size() -> None:
  """A matmul with too few rows to pack B (PACK_MIN_ROWS_PER_LANE) whose B (384 KB) fits in half of a 1 MB L2 keeps its rows outer; with a
  512 KB L2 (Zen 3) its rows are swept inside each column panel. With enough rows, B's panels are packed and swept by the rows
  whatever the L2."""
  import dataclasses

  import numpy as np

  from tinytune import Tensor
  from tinytune.codegen.heuristic import default_opts
  from tinytune.codegen.kernel import Kernel
  from tinytune.codegen.opts import OptOps
  from tinytune.engine.schedule import create_schedule
  avx2 = cpu_target("x86-64-v3")
  for rows in (24, 512):
    (item,), _ = create_schedule((Tensor(np.ones((rows, 384), np.float32)) @ Tensor(np.ones((384, 256), np.float32))).uop, "CPU")
    for l2, swapped in ((1 << 20, rows == 512), (512 << 10, True)):
      kernel = Kernel(item.ast, dataclasses.replace(Device["CPU"].caps, simd_width=avx2.lanes, vector_registers=avx2.registers, l2_bytes=l2))
      opts = default_opts(kernel)
      assert any(o.op is OptOps.SWAP for o in opts) == swapped and any(o.op is OptOps.PACK for o in opts) == (rows == 512), (rows, l2)


def test_transposes_no_tile_splits_read_whole_runs() -> None:
  """conv2d's NCHW -> padded NHWC copy at 4x32x32x32 (rows of 34: no 8 or 4 tile splits them; channels 4 KiB apart, 8 of an L1's lines
  at that stride) reads each padded row's run inside 4 channels, on AVX2 and AVX-512, and is right; a transpose whose gathered rows
  spread over the L1's sets (520 bytes apart) keeps its vectors, and so does one whose run's output rows would share 2 sets (2 KiB
  apart)."""
  import dataclasses

  import numpy as np

  from tinytune import Tensor
  from tinytune.codegen.heuristic import default_opts, l1_lines
  from tinytune.codegen.kernel import Kernel
  from tinytune.codegen.opts import Opt, OptOps
  from tinytune.engine.schedule import create_schedule
  def opts(out: Tensor, target: str) -> list[Opt]:
    (item,), _ = create_schedule(out.uop, "CPU")
    t = cpu_target(target)
    caps = dataclasses.replace(Device["CPU"].caps, simd_width=t.lanes, vector_registers=t.registers, l1_bytes=32 << 10)
    return default_opts(Kernel(item.ast, caps))
  x = np.random.default_rng(0).standard_normal((4, 32, 32, 32), np.float32)
  pad = lambda: Tensor(x).pad(((0, 0), (0, 0), (1, 1), (1, 1))).permute(0, 2, 3, 1)  # noqa: E731
  for target in ("x86-64-v3", "x86-64-v4"):
    assert opts(pad(), target) == [Opt(OptOps.SWAP, 2, 3), Opt(OptOps.UPCAST, 3, 4)], target
    assert all(o.op is not OptOps.SWAP for o in opts(Tensor(np.ones((512, 130), np.float32)).T, target)), target
    assert all(o.op is not OptOps.SWAP for o in opts(Tensor(np.ones((512, 1024), np.float32))[:, :130].T, target)), target
  kernel = Kernel(create_schedule(pad().contiguous().uop, "CPU")[0][0].ast, Device["CPU"].caps)
  assert [l1_lines(kernel, s) for s in (4096, 2048, 128, 520, 4)] == [kernel.caps.l1_bytes // 4096 * n for n in (1, 2, 32, 64, 64)]
  np.testing.assert_array_equal(pad().numpy(), np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))).transpose(0, 2, 3, 1))


def test_matmuls_pack_b_where_enough_rows_read_its_panels() -> None:
  """On AVX2 (16 registers of 8 lanes) a 1024^3 matmul takes a 6x16 tile whose B panels are packed (PACK), the threads splitting the
  columns so each core packs its own; B gathered along K (x @ W.T) too from 64 rows, where AVX-512's 16 lanes keep dot products
  (LANES) below 128 rows, as do 16 rows on AVX2; a K of 4096 on AVX-512 (panels of 32 columns: 512 KiB) in blocks that keep a
  panel within PACK_BYTES."""
  import dataclasses

  import numpy as np

  from tinytune import Tensor
  from tinytune.codegen.heuristic import default_opts
  from tinytune.codegen.kernel import Kernel
  from tinytune.codegen.opts import Opt, OptOps
  from tinytune.engine.schedule import create_schedule
  def opts(m: int, n: int, k: int, target: str, gathered: bool = False) -> list[Opt]:
    b = Tensor(np.ones((n, k), np.float32)).T if gathered else Tensor(np.ones((k, n), np.float32))
    (item,), _ = create_schedule((Tensor(np.ones((m, k), np.float32)) @ b).uop, "CPU")
    t = cpu_target(target)
    kernel = Kernel(item.ast, dataclasses.replace(Device["CPU"].caps, threads=2, simd_width=t.lanes, vector_registers=t.registers))
    return default_opts(kernel)
  ops = lambda opts: {o.op for o in opts}  # noqa: E731
  assert opts(1024, 1024, 1024, "x86-64-v3") == [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.PADTO, 0, 6), Opt(OptOps.UPCAST, 0, 6),
                                                 Opt(OptOps.THREAD, 1, 2), Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PACK, 0, 0)]
  assert OptOps.PACK in ops(opts(64, 1024, 1024, "x86-64-v3", gathered=True))
  assert ops(opts(16, 1024, 1024, "x86-64-v3", gathered=True)) & {OptOps.PACK, OptOps.LANES} == {OptOps.LANES}
  assert ops(opts(64, 1024, 1024, "x86-64-v4", gathered=True)) & {OptOps.PACK, OptOps.LANES} == {OptOps.LANES}
  assert {OptOps.PACK, OptOps.KBLOCK} <= ops(opts(256, 4096, 4096, "x86-64-v4", gathered=True))


def test_attentions_matmuls_take_3_rows_of_4_vectors_on_16_registers() -> None:
  """On AVX2 attention's Q.K^T (K of 64) and P.V (64 columns) take 3 rows by 4 vectors (P.V's rows of P pass twice, not 4 times), as
  does a batch of matmuls with a K of 64; AVX-512's 32 registers keep 6 by 2, as do AVX2's 1024^3 matmul and a batch whose K and
  columns are both 64 (Winograd's GEMMs)."""
  import dataclasses

  import numpy as np

  from tinytune import Tensor
  from tinytune.codegen.heuristic import default_opts
  from tinytune.codegen.kernel import Kernel
  from tinytune.codegen.opts import OptOps
  from tinytune.engine.schedule import create_schedule
  def tiles(t: Tensor, target: str) -> list[list[int]]:  # each kernel's UPCASTs of its matmul (those with a reduce)
    items, _ = create_schedule(t.uop, "CPU")
    caps = dataclasses.replace(Device["CPU"].caps, threads=2, simd_width=cpu_target(target).lanes, vector_registers=cpu_target(target).registers)
    kernels = [Kernel(item.ast, caps) for item in items]
    return [[o.arg for o in default_opts(k) if o.op is OptOps.UPCAST] for k in kernels if k.reduceop is not None and k.n_global == 4]
  ones = lambda *shape: Tensor(np.ones(shape, np.float32))  # noqa: E731
  q = ones(1, 8, 1024, 64)
  assert tiles(q.scaled_dot_product_attention(ones(1, 8, 1024, 64), ones(1, 8, 1024, 64)), "x86-64-v3") == [[32, 3], [16], [32, 3]]
  assert tiles(q.scaled_dot_product_attention(ones(1, 8, 1024, 64), ones(1, 8, 1024, 64)), "x86-64-v4") == [[32, 8], [32], [32, 8]]
  assert tiles(ones(1, 16, 256, 64) @ ones(1, 16, 64, 256), "x86-64-v3") == [[32, 3]]
  assert tiles(ones(1, 36, 256, 64) @ ones(1, 36, 64, 64), "x86-64-v3") == [[16, 6]]
  assert tiles(ones(1, 1, 1024, 1024) @ ones(1, 1, 1024, 1024), "x86-64-v3") == [[16, 6]]


def test_outputs_stream_past_the_caches_from_a_size_per_target() -> None:
  """STREAM by default for float32 outputs of whole lines: AVX-512 (a line a store) from 8 MiB (STREAM_BYTES), AVX2 (two stores a line)
  only from 32 MiB (STREAM_HALF_LINES_BYTES, past the L3), its source storing each line's two halves non-temporally; SSE's 4 lanes never."""
  import dataclasses

  import numpy as np

  from tinytune import Tensor
  from tinytune.codegen.cstyle import CRenderer
  from tinytune.codegen.heuristic import default_opts
  from tinytune.codegen.kernel import Kernel
  from tinytune.engine.schedule import create_schedule
  def kernel(n: int, target: str) -> Kernel:  # an elementwise kernel of n float32 outputs with its default opts
    (item,), _ = create_schedule((Tensor(np.ones(n, np.float32)) + 1).uop, "CPU")
    t = cpu_target(target)
    k = Kernel(item.ast, dataclasses.replace(Device["CPU"].caps, threads=2, simd_width=t.lanes, vector_registers=t.registers))
    return k.apply_opts(default_opts(k))
  assert [kernel(n, "x86-64-v3").stream for n in (4 << 20, 8 << 20)] == [False, True]  # 16 and 32 MiB
  assert kernel(2 << 20, "x86-64-v4").stream and not kernel(8 << 20, "x86-64-v2").stream
  assert "tt_f8_stream(" in CRenderer().render(kernel(8 << 20, "x86-64-v3"))


def test_packed_panels_k_blocks_follow_the_l2_size() -> None:
  """A packed panel of B stays within half the target's L2 (and PACK_BYTES): AVX2's 1024^3 panel of 16 columns by all of K (64 KiB)
  is whole with a 1 MB L2 or 128 KiB, and K is cut in blocks of 512 (32 KiB) with 64 KiB."""
  import dataclasses

  import numpy as np

  from tinytune import Tensor
  from tinytune.codegen.heuristic import default_opts
  from tinytune.codegen.kernel import Kernel
  from tinytune.codegen.opts import OptOps
  from tinytune.engine.schedule import create_schedule
  (item,), _ = create_schedule((Tensor(np.ones((1024, 1024), np.float32)) @ Tensor(np.ones((1024, 1024), np.float32))).uop, "CPU")
  t = cpu_target("x86-64-v3")
  for l2, block in ((1 << 20, None), (128 << 10, None), (64 << 10, 512)):
    caps = dataclasses.replace(Device["CPU"].caps, threads=2, simd_width=t.lanes, vector_registers=t.registers, l2_bytes=l2)
    opts = default_opts(Kernel(item.ast, caps))
    assert OptOps.PACK in {o.op for o in opts} and next((o.arg for o in opts if o.op is OptOps.KBLOCK), None) == block, (l2, opts)


def test_k_blocked_matmuls_pack_blocks_of_b_within_the_l2() -> None:
  """Where B's panels would be packed and K blocked (AVX2's 2048^3), B's K block is packed many column tiles wide (PACK 1) with the
  rows outside the columns, within half the L2 and PACK_BLOCK_BYTES: a K of 256 by 256 columns with a 1 MB L2 (the cores' column
  blocks as THREAD 8), 128 by 256 with 256 KiB; a K of 4096 in blocks of 128 by 512 columns. 1024^3 keeps its panels of all of K,
  and x @ W.T of 256x4096x4096 its panels in K blocks of 2048 (long enough runs of A's rows, see PANEL_RUN_MAX)."""
  import dataclasses

  import numpy as np

  from tinytune import Tensor
  from tinytune.codegen.heuristic import default_opts
  from tinytune.codegen.kernel import Kernel
  from tinytune.codegen.opts import Opt, OptOps
  from tinytune.engine.schedule import create_schedule
  t = cpu_target("x86-64-v3")
  def opts(n: int, l2: int = 1 << 20, m: int = 0, gathered: bool = False) -> list[Opt]:
    b = Tensor(np.ones((n, n), np.float32))
    (item,), _ = create_schedule((Tensor(np.ones((m or n, n), np.float32)) @ (b.T if gathered else b)).uop, "CPU")
    caps = dataclasses.replace(Device["CPU"].caps, threads=2, simd_width=t.lanes, vector_registers=t.registers, l2_bytes=l2)
    return default_opts(Kernel(item.ast, caps))
  tile = [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.PADTO, 0, 6), Opt(OptOps.UPCAST, 0, 6)]
  assert opts(2048) == [*tile, Opt(OptOps.THREAD, 1, 8), Opt(OptOps.KBLOCK, 0, 256), Opt(OptOps.PACK, 0, 1)]
  assert opts(2048, 256 << 10)[3:] == [Opt(OptOps.THREAD, 1, 8), Opt(OptOps.KBLOCK, 0, 128), Opt(OptOps.PACK, 0, 1)]
  assert opts(4096)[-3:] == [Opt(OptOps.THREAD, 1, 8), Opt(OptOps.KBLOCK, 0, 128), Opt(OptOps.PACK, 0, 1)]  # after STREAM
  assert opts(1024)[3:] == [Opt(OptOps.THREAD, 1, 2), Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PACK, 0, 0)]
  assert opts(4096, m=256, gathered=True)[3:] == [Opt(OptOps.THREAD, 1, 2), Opt(OptOps.SWAP, 0, 1), Opt(OptOps.KBLOCK, 0, 2048),
                                                  Opt(OptOps.PACK, 0, 0)]


def test_conv_weight_gradients_k_blocks_follow_the_l2_size() -> None:
  """The CNN step's 5x5 weight gradient (32x32 channels over 128 images of 20x20, 16 MB of inputs) sums its images in blocks whose
  inputs stay in half the L2: 4 images with a 1 MB L2, 8 with 2 MB, and no blocks where all of them fit."""
  import dataclasses

  from tinytune import Kernel, dtypes
  from tinytune.codegen.heuristic import default_opts
  from tinytune.codegen.opts import OptOps
  from tinytune.kernels import get_workload
  from tinytune.kernels.workload import schedule
  w = get_workload("train_step")
  built, _ = w.instantiate(w.params({"model": 1, "batch": 128}), dtypes.float32)
  ast = next(it.ast for it in schedule(built, "CPU")[0] if Kernel(it.ast, Device["CPU"].caps).name.startswith("r_1_5_5_32_32_"))
  t = cpu_target("x86-64-v3")
  for l2, block in ((1 << 20, 4), (2 << 20, 8), (64 << 20, None)):
    caps = dataclasses.replace(Device["CPU"].caps, threads=2, simd_width=t.lanes, vector_registers=t.registers, l2_bytes=l2)
    opts = default_opts(Kernel(ast, caps))
    assert next((o.arg for o in opts if o.op is OptOps.KBLOCK), None) == block, (l2, opts)


def test_conv_weight_gradient_of_a_biased_input_k_blocks() -> None:
  """The 3x3 64 -> 64 weight gradient of the CNN step reads relu(x + b) (3.3 MB of inputs): the bias, which the reduce does not move,
  keeps it from no K blocks; it sums its images in blocks whose inputs stay in half a 1 MB L2."""
  import dataclasses

  from tinytune import Kernel, dtypes
  from tinytune.codegen.heuristic import default_opts
  from tinytune.codegen.opts import OptOps
  from tinytune.kernels import get_workload
  from tinytune.kernels.workload import schedule
  w = get_workload("train_step")
  built, _ = w.instantiate(w.params({"model": 1, "batch": 128}), dtypes.float32)
  ast = next(it.ast for it in schedule(built, "CPU")[0] if Kernel(it.ast, Device["CPU"].caps).name.startswith("r_1_3_3_64_64_"))
  t = cpu_target("x86-64-v3")
  caps = dataclasses.replace(Device["CPU"].caps, threads=2, simd_width=t.lanes, vector_registers=t.registers, l2_bytes=1 << 20)
  k = Kernel(ast, caps)
  opts = default_opts(k)
  block = next((o.arg for o in opts if o.op is OptOps.KBLOCK), None)
  assert block is not None and sum(b.nbytes for b in k.bufs) * block <= 128 * (1 << 19), opts


@pytest.mark.parametrize("target", ["x86-64-v3", "x86-64-v4"])
def test_a_register_tile_takes_an_odd_row_dim_whole(target: str) -> None:
  """The CNN step's 1 -> 32 5x5 weight gradient tiles its 32 output channels by the kernel's 5 columns (10 accumulators with AVX2),
  where no row count that divides 5 was tried and the tile was 2 vectors: 23.6 -> 69.9 GFLOPS on x86-64-v3 (one thread)."""
  import dataclasses

  from tinytune import Kernel, dtypes
  from tinytune.codegen.heuristic import default_opts
  from tinytune.codegen.kernel import AxisKind
  from tinytune.helpers import prod
  from tinytune.kernels import get_workload
  from tinytune.kernels.workload import schedule
  w = get_workload("train_step")
  built, _ = w.instantiate(w.params({"model": 1, "batch": 128}), dtypes.float32)
  ast = next(it.ast for it in schedule(built, "CPU")[0] if Kernel(it.ast, Device["CPU"].caps).name.startswith("r_1_5_5_1_32_"))
  t = cpu_target(target)
  caps = dataclasses.replace(Device["CPU"].caps, threads=2, simd_width=t.lanes, vector_registers=t.registers)
  k = Kernel(ast, caps).apply_opts(default_opts(Kernel(ast, caps)))
  ups = [a for a in k.axes if a.kind is AxisKind.UPCAST]
  assert {a.dim for a in ups} == {2, 4} and prod(a.size for a in ups) // t.lanes <= t.registers - 4, k.opts


def test_short_trailing_dims_no_vector_fits_are_unrolled() -> None:
  """The CNN step's batchnorm written into its pool's 2x2 windows (128x32x10x10x2x2): no vector fits the last dim, so the two
  window dims are unrolled whole, where they were loops of two (3.96 -> 1.89 ms on x86-64-v3, one thread)."""
  from tinytune import Kernel, dtypes
  from tinytune.codegen.heuristic import default_opts
  from tinytune.codegen.kernel import AxisKind
  from tinytune.kernels import get_workload
  from tinytune.kernels.workload import schedule
  w = get_workload("train_step")
  built, _ = w.instantiate(w.params({"model": 1, "batch": 128}), dtypes.float32)
  ast = next(it.ast for it in schedule(built, "CPU")[0] if Kernel(it.ast, Device["CPU"].caps).name == "E_128_32_10_10_2_2")
  k = Kernel(ast, Device["CPU"].caps)
  k.apply_opts(default_opts(Kernel(ast, Device["CPU"].caps)))
  assert {a.dim for a in k.axes if a.kind is AxisKind.UPCAST} >= {4, 5} and k.upcast_size() <= 16, k.opts


@pytest.mark.parametrize("target", ["x86-64-v3", "x86-64-v4"])
def test_a_transpose_of_computed_values_takes_the_small_tile(target: str) -> None:
  """relu's gradient written channels last (the CNN step's 128x24x24x32, x and the gradient both read 672 floats apart along the
  channels) in 4x4 tiles, not the 8x8 of a copy: 4.9 -> 2.7 ms on a Zen 4, at x86-64-v3 and natively alike."""
  import dataclasses

  from tinytune import Kernel, dtypes
  from tinytune.codegen.heuristic import default_opts
  from tinytune.codegen.kernel import AxisKind
  from tinytune.kernels import get_workload
  from tinytune.kernels.workload import schedule
  w = get_workload("train_step")
  built, _ = w.instantiate(w.params({"model": 1, "batch": 128}), dtypes.float32)
  ast = next(it.ast for it in schedule(built, "CPU")[0] if Kernel(it.ast, Device["CPU"].caps).name == "E_1_128_24_24_32")
  t = cpu_target(target)
  caps = dataclasses.replace(Device["CPU"].caps, threads=2, simd_width=t.lanes, vector_registers=t.registers)
  k = Kernel(ast, caps).apply_opts(default_opts(Kernel(ast, caps)))
  assert sorted(a.size for a in k.axes if a.kind is AxisKind.UPCAST) == [4, 4], k.opts


def test_bench_compare_says_what_regressed(tmp_path) -> None:  # type: ignore[no-untyped-def]
  """bench/kernels.py --compare FILE: the shapes whose torch/tinytune ratio fell below 90% of the file's, and a file of another CPU
  family refused in one line."""
  bench = bench_module("kernels")
  table = ["| workload | params | tinytune ms | torch ms | torch/tt | GB/s |", "| --- | --- | --- | --- | --- | --- |",
           "| matmul | m=256 n=256 k=256 | 1.0 | 2.0 | 2.00 |  |", "| softmax | rows=4096 cols=4096 | 1.0 | 1.5 | 1.50 | 30.0 |"]
  (path := tmp_path / "same.md").write_text("\n".join([f"# {bench.family()}", "", *table]) + "\n")
  lines = bench.compare(str(path), {("matmul", "m=256 n=256 k=256"): 1.7, ("softmax", "rows=4096 cols=4096"): 1.45, ("reduce", "rows=1"): 1.0})
  assert lines == [f"against {path}: 1 regressed (ratio below 90% of the file's)", "matmul m=256 n=256 k=256: torch/tinytune 2.00 -> 1.70"]
  (other := tmp_path / "other.md").write_text("\n".join(["# cpu-intel-6-85-avx512", "", *table]) + "\n")
  with pytest.raises(SystemExit, match="holds figures of cpu-intel-6-85-avx512, this is cpu-"): bench.compare(str(other), {})


def test_padded_rows_of_a_batched_register_tile_read_one_value(monkeypatch: pytest.MonkeyPatch) -> None:
  """Attention's scores (8 heads of 1024 queries by 1024 keys) in AVX2's 6x16 register tile, its rows padded to 1026: the tile's last
  two rows read one value of Q for all their lanes, as the other four do (each lane read Q on its own before, 16 loads a step)."""
  import numpy as np

  from tinytune import Tensor
  from tinytune.codegen.cstyle import CRenderer
  from tinytune.codegen.heuristic import default_opts
  from tinytune.codegen.kernel import Kernel
  from tinytune.engine.schedule import create_schedule
  monkeypatch.setattr(cpu_module, "find_compiler", lambda t: "cc")
  q, k = (Tensor(np.ones((1, 8, 1024, 64), np.float32)) for _ in range(2))
  (item,), _ = create_schedule((q @ k.transpose(-1, -2)).uop, "CPU")
  kernel = Kernel(item.ast, CPUDevice("x86-64-v3").caps)
  kernel.apply_opts(default_opts(kernel))
  assert kernel.sizes[2] == 1026
  src = CRenderer().render(kernel)
  assert "(tt_f8){v" not in src, src[src.index("void "):]
