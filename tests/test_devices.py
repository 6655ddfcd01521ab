"""GPU-style devices without their hardware: the CUDA and HIP renderers' output compiled (not run) by nvcc and clang,
workgroup limits, and the one-line errors of devices that are absent. OpenCL runs for real in test_opts (pocl in CI)."""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
import pytest
from ops_support import hip_clang, hip_flags, nvrtc_missing, ptxas_stats_each

from tinytune import Kernel, KernelOptError, Opt, OptOps, Tensor, dtypes
from tinytune.codegen.cstyle import CUDARenderer, HIPRenderer, OpenCLRenderer
from tinytune.codegen.heuristic import hand_coded_optimizations
from tinytune.codegen.kernel import candidate_opts
from tinytune.dtype import DType
from tinytune.engine.schedule import ScheduleItem, create_schedule
from tinytune.kernels import WORKLOADS
from tinytune.runtime import Device, DeviceCaps, device_status

H100 = DeviceCaps(has_local=True, threads=1, max_upcast=256, simd_width=4, vector_registers=255, max_local=1024, shared_bytes=48 * 1024, gpu=True)


@functools.cache  # built once for the tests that render them; none changes a kernel
def catalog_kernels() -> tuple[Kernel, ...]:
  """Every kernel of every catalog workload at its default size, with no opts, the default opts and a random opt list."""
  rng, ret = random.Random(0), []
  for w in WORKLOADS.values():
    if w.name == "train_step": continue  # its forward, backward and update kernels are of the kinds the others have; 4x the compile time
    out, _ = w.instantiate(w.defaults, device="CPU")
    for item in create_schedule(out.uop, "CPU")[0]:
      base = Kernel(item.ast, H100)
      ret += [base, base.copy().apply_opts(hand_coded_optimizations(base))]
      k = base.copy()
      for _ in range(4):
        if opts := [o for o in candidate_opts(k) if _valid(k, o)]: k.apply_opt(rng.choice(opts))
      ret.append(k)
  return tuple(ret)


@functools.cache  # built once for the tests that render them; none changes a kernel
def bf16_kernels() -> tuple[Kernel, ...]:
  """bfloat16 catalog kernels (matmul, layernorm, softmax) with no opts, the default opts and one random opt list."""
  rng, ret = random.Random(1), []
  for name in ("matmul", "layernorm", "softmax"):
    w = WORKLOADS[name]
    out, _ = w.instantiate(w.params({k: min(v, 64) for k, v in w.defaults.items()}), dtypes.bfloat16, device="CPU")
    for item in create_schedule(out.uop, "CPU")[0]:
      base = Kernel(item.ast, H100)
      k = base.copy()
      for _ in range(4):
        if opts := [o for o in candidate_opts(k) if _valid(k, o)]: k.apply_opt(rng.choice(opts))
      ret += [base, base.copy().apply_opts(hand_coded_optimizations(base)), k]
  return tuple(ret)


# each dtype with one of the same size to bitcast to
BITCASTS = {dtypes.float64: dtypes.int64, dtypes.int8: dtypes.uint8, dtypes.int16: dtypes.float16, dtypes.uint16: dtypes.bfloat16,
            dtypes.uint32: dtypes.float32, dtypes.uint64: dtypes.float64, dtypes.bfloat16: dtypes.int16}


@functools.cache  # built once for the tests that render them; none changes a kernel
def dtype_kernels() -> tuple[Kernel, ...]:
  """Kernels of the less common dtypes (arithmetic, a sum, a max, a bitcast; float64 math), with no opts and the default opts."""
  ret = []
  for dt, to in BITCASTS.items():
    a, b = (Tensor(np.arange(64).reshape(8, 8), dtype=dt) for _ in range(2))
    outs = [(a * b + 3).max(1), (a - b).sum(1, dtype=dt), a.bitcast(to) + b.bitcast(to)]
    if dt == dtypes.float64: outs.append((a.exp() + a.sqrt() + a.sin() + a.log()) / b)
    if dt in (dtypes.float64, dtypes.bfloat16): outs.append(a.copysign(-b))
    if to == dtypes.float16: outs.append(a.bitcast(to).copysign(-b.bitcast(to)))
    for item in (item for out in outs for item in create_schedule(out.uop, "CPU")[0]):
      base = Kernel(item.ast, H100)
      ret += [base, base.copy().apply_opts(hand_coded_optimizations(base))]
  return tuple(ret)


@functools.cache  # built once for the tests that render them; none changes a kernel
def staged_matmuls() -> tuple[Kernel, ...]:
  """Float32 matmul-like kernels at the GPU suite's sizes (matmul and linear 4096^3, bmm 32x512^3, mlp's first layer) and an odd-sized
  one, with H100 caps and the default opts: the shared-memory tile (STAGE). Their inputs are never allocated."""
  def z(*shape: int) -> Tensor: return Tensor.zeros(*shape).contiguous()
  outs = [z(4096, 4096) @ z(4096, 4096), z(32, 512, 512) @ z(32, 512, 512), z(4096, 4096) @ z(4096, 4096).T + z(4096),
          (z(4096, 1024) @ z(1024, 4096) + z(4096)).relu(), z(4095, 4093) @ z(4093, 4097)]
  ret = []
  for out in outs:
    k = Kernel(create_schedule(out.uop, "CPU")[0][-1].ast, H100)
    ret.append(k.apply_opts(hand_coded_optimizations(k)))
  return tuple(ret)


@functools.cache  # rendered once for the tests that compile them
def cuda_sources(kernels: Callable[[], tuple[Kernel, ...]]) -> tuple[str, ...]:
  """The CUDA source of each of these kernels."""
  return tuple(CUDARenderer().render(k) for k in kernels())


def prefetched_matmul() -> Kernel:
  """matmul 4096^3 in the default's tiles with K tiles of 8, the next one loaded during the current one's compute (PREFETCH)."""
  k = staged_matmuls()[0]
  opts = [Opt(o.op, o.axis, 8) if o.op is OptOps.STAGE else o for o in k.opts] + [Opt(OptOps.PREFETCH, 0, 0)]
  return Kernel(k.ast, k.caps).apply_opts(opts)


def test_big_float32_matmuls_stage_their_tiles_by_default() -> None:
  assert all(Opt(OptOps.STAGE, 0, 16) in k.opts and k.launch_dims[1] == 256 for k in staged_matmuls())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: the staged matmuls' register use is not checked here")
def test_staged_matmuls_compile_without_spills(tmp_path) -> None:  # type: ignore[no-untyped-def]
  """ptxas for sm_90 fits the default shared-memory tiles (8x8 accumulators a thread) in registers, with no spills, and their tiles in
  the 48 KiB of static shared memory a workgroup has; with K tiles of 8 and PREFETCH too (125 registers: 16 of K took 155)."""
  kernels = [*staged_matmuls(), prefetched_matmul()]
  for k, stats in zip(kernels, ptxas_stats_each(tmp_path, [*cuda_sources(staged_matmuls), CUDARenderer().render(kernels[-1])], "sm_90")):
    assert stats["bytes spill stores"] == stats["bytes spill loads"] == 0 and stats["registers"] < 255, (k.opts, stats)
    assert stats["bytes smem"] == k.stage_bytes() <= 48 * 1024, (k.opts, stats)


def _valid(k: Kernel, opt: Opt) -> bool:
  try: k.copy().apply_opt(opt)
  except KernelOptError: return False
  return True


def _compile_all(cmd: list[str], suffix: str, srcs: list[str]) -> list[str]:
  """Compile the sources with `cmd` (the file name appended); the errors, if any. The compiler starts in seconds, so the sources
  go in a few files of many, each in a namespace of its own; a file that fails is compiled source by source to name the culprit."""
  def one(src: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, f"k{suffix}")
      with open(path, "w") as f: f.write(src)
      res = subprocess.run([*cmd, path, "-o", os.path.join(tmp, "k.out")], capture_output=True, text=True, cwd=tmp)
      return "" if res.returncode == 0 else f"{res.stderr[:2000]}\n{src}"
  def many(part: list[str]) -> list[str]:
    lines = [src.splitlines() for src in part]
    head = dict.fromkeys(line for ls in lines for line in ls if line.startswith("#"))
    body = [f"namespace k{i} {{\n" + "\n".join(line.replace('extern "C" ', "") for line in ls if not line.startswith("#")) + "\n}"
            for i, ls in enumerate(lines)]
    return [] if not one("\n".join([*head, *body])) else [e for e in map(one, part) if e]
  unique = list(dict.fromkeys(srcs))
  n = os.cpu_count() or 1
  with ThreadPoolExecutor(n) as pool: return [e for errors in pool.map(many, [unique[i::n] for i in range(n)]) for e in errors]


def test_catalog_kernels_cover_workgroup_opts() -> None:
  ops = {o.op for k in catalog_kernels() for o in k.opts}
  assert {OptOps.LOCAL, OptOps.GROUP, OptOps.UPCAST} <= ops


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: the CUDA renderer's output is not compile-checked here")
def test_cuda_source_compiles_with_nvcc() -> None:
  srcs = [src for kernels in (catalog_kernels, bf16_kernels, dtype_kernels, staged_matmuls) for src in cuda_sources(kernels)]
  assert not (errors := _compile_all(["nvcc", "-arch=sm_90", "-cubin"], ".cu", srcs)), errors[0]


@pytest.mark.skipif(hip_clang("gfx90a") is None, reason="no clang that compiles HIP for gfx90a: the HIP renderer's output is not compile-checked")
def test_hip_source_compiles_with_clang() -> None:
  srcs = [HIPRenderer().render(k) for k in catalog_kernels() + bf16_kernels() + dtype_kernels() + staged_matmuls()]
  assert not (errors := _compile_all([str(hip_clang("gfx90a")), *hip_flags("gfx90a")], ".hip", srcs)), errors[0]


@pytest.mark.skipif(hip_clang("gfx90a") is None, reason="no clang that compiles HIP for gfx90a: the HIP renderer's output is not compile-checked")
def test_hip_float16_products_do_not_fuse(tmp_path) -> None:  # type: ignore[no-untyped-def]
  """HIP computes float16 natively, where clang fused a product and the add after it into v_fma_f16 (rounded once; NumPy rounds twice)."""
  a, b, c = (Tensor(np.arange(64), dtype=dtypes.float16, device="CPU") for _ in range(3))
  (item,), _ = create_schedule((a * b + c * 3 - a * c).uop, "CPU")
  (tmp_path / "k.hip").write_text(HIPRenderer().render(Kernel(item.ast, H100)))
  subprocess.run([str(hip_clang("gfx90a")), *hip_flags("gfx90a"), "k.hip", "-o", "k.s"], cwd=tmp_path, check=True, capture_output=True, timeout=120)
  asm = (tmp_path / "k.s").read_text()
  assert "v_mul_f16" in asm and not re.findall(r"\bv_(?:pk_)?(?:fma|fmac|mad|mac)_(?:f16|mix)", asm)


def test_group_reduce_renders_shared_memory_and_a_barrier() -> None:
  a, b = Tensor.rand(64, 32), Tensor.rand(32, 48)
  k = Kernel(create_schedule((a @ b).uop, "CPU")[0][0].ast, H100).apply_opts([Opt(OptOps.LOCAL, 1, 16), Opt(OptOps.GROUP, 0, 4)])
  assert k.launch_dims == (64 * 3, 64)
  cuda, cl = CUDARenderer().render(k), OpenCLRenderer().render(k)
  assert "__shared__ __align__(32) float partials[64]" in cuda and "__syncthreads();" in cuda and "__launch_bounds__(64)" in cuda
  assert "__local float partials[64]" in cl and "barrier(CLK_LOCAL_MEM_FENCE);" in cl and "reqd_work_group_size(64, 1, 1)" in cl


def test_workgroup_limits() -> None:
  a, b = Tensor.rand(64, 64), Tensor.rand(64, 64)
  ast = create_schedule((a @ b).uop, "CPU")[0][0].ast
  small = DeviceCaps(has_local=True, threads=1, simd_width=1, max_local=64, shared_bytes=1024)
  k = Kernel(ast, small).apply_opts([Opt(OptOps.LOCAL, 1, 16), Opt(OptOps.LOCAL, 0, 4)])
  with pytest.raises(KernelOptError, match="workgroup of over 64"): k.apply_opt(Opt(OptOps.LOCAL, 0, 2))
  k = Kernel(ast, small).apply_opts([Opt(OptOps.GROUP, 0, 16), Opt(OptOps.UPCAST, 0, 4)])  # 16 threads x 4 partials x 4 bytes
  with pytest.raises(KernelOptError, match="shared memory"): k.apply_opt(Opt(OptOps.UPCAST, 1, 8))
  with pytest.raises(KernelOptError, match="workgroups"): Kernel(ast, DeviceCaps()).apply_opt(Opt(OptOps.LOCAL, 0, 2))
  with pytest.raises(KernelOptError, match="threads"): Kernel(ast, small).apply_opt(Opt(OptOps.THREAD, 0, 2))


@pytest.mark.parametrize("name", ["CUDA", "AMD", "HIP"])
def test_absent_device_says_what_is_missing(name: str) -> None:
  if (why := device_status(name)) is None: pytest.skip(f"{name} is present here")
  assert "\n" not in why and any(w in why for w in ("needs", "found no", "could not"))
  with pytest.raises(Exception, match=re.escape(why[:20])): Device[name]


def test_the_suite_on_a_device_that_is_not_here_stops_with_one_line() -> None:
  name = next((d for d in ("CUDA", "AMD") if device_status(d) is not None), "TPU")
  r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(os.path.dirname(__file__), "test_basic.py")],
                     capture_output=True, text=True, env={**os.environ, "TINYTUNE_DEVICE": name}, timeout=120)
  assert r.returncode == 4 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
  assert f"tinytune's tests cannot run on TINYTUNE_DEVICE={name}: " in r.stdout + r.stderr


def test_unknown_device() -> None:
  with pytest.raises(ValueError, match="unknown device 'TPU'; available: CPU, OPENCL, CUDA, AMD"): Device.canonicalize("TPU")


@pytest.mark.parametrize("env,message", [
  ({"TINYTUNE_DEVICE": "TPU"}, "TINYTUNE_DEVICE: unknown device 'TPU'; available: CPU"), ({"TINYTUNE_DEVICE": ""}, None),
  ({"TINYTUNE_POOL_BYTES": "1GB"}, "TINYTUNE_POOL_BYTES='1GB' is not an integer >= 0"), ({"TINYTUNE_POOL_BYTES": "0"}, None),
  ({"TINYTUNE_CC": "false", "TINYTUNE_DEVICE": "CPU"},
   "false --version failed (exit 1): it is not a C compiler; set TINYTUNE_CC to one, or unset it"),
  ({"TINYTUNE_CC": "/bin/true", "TINYTUNE_DEVICE": "CPU"},
   "CompileError /bin/true exited 0 but wrote no shared object: it is not a C compiler; set TINYTUNE_CC to one"),
  ({"TINYTUNE_TUNE": "beam", "TINYTUNE_DB": "garbage://x"},
   "TINYTUNE_DB='garbage://x' cannot record first-use tuning: Database('garbage://x'): Can't load plugin")])
def test_a_bad_environment_variable_is_named_in_the_error(env: dict[str, str], message: str | None, tmp_path) -> None:
  """A program run under a bad TINYTUNE_* variable raises an error that names it (TINYTUNE_POOL_BYTES failed the import of tinytune
  with int()'s message, TINYTUNE_CC=false a CalledProcessError: on the CPU, whose compiler it names); an empty TINYTUNE_DEVICE is the
  default device."""
  code = "from tinytune import Tensor\ntry: print((Tensor([1.0, 2.0]) * 3).tolist())\nexcept Exception as e: print(type(e).__name__, e)"
  env = {**os.environ, "TINYTUNE_CACHE_DIR": str(tmp_path), **env}
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
  assert out.returncode == 0 and (message or "[3.0, 6.0]") in out.stdout, out


def test_a_bad_cuda_device_number_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
  """TINYTUNE_CUDA_DEVICE='abc' is its own error naming it, not int()'s message inside "CUDA found no GPU"."""
  cuda = pytest.importorskip("tinytune.runtime.cuda")
  if cuda.cu is None: pytest.skip("NVIDIA's Python bindings are not installed")
  monkeypatch.setenv("TINYTUNE_CUDA_DEVICE", "abc")
  with pytest.raises(ValueError, match="TINYTUNE_CUDA_DEVICE='abc' is not an integer >= 0"): cuda.CUDADevice()


def test_kernels_keep_to_the_cores_whatever_omp_num_threads_says(tmp_path) -> None:
  """OMP_NUM_THREADS=100000 segfaulted a 256x256 matmul (exit 139): the CPU device caps OpenMP at the cores it may use."""
  code = "import numpy as np\nfrom tinytune import Tensor\na, b = Tensor.rand(256, 256), Tensor.rand(256, 256)\n" \
         "print(np.allclose((a @ b).numpy(), a.numpy() @ b.numpy(), atol=1e-3))"
  env = {**os.environ, "TINYTUNE_CACHE_DIR": str(tmp_path), "OMP_NUM_THREADS": "100000", "TINYTUNE_DEVICE": "CPU"}
  env.pop("OMP_THREAD_LIMIT", None)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
  assert out.returncode == 0 and out.stdout.strip() == "True", out


H100_TC = dataclasses.replace(H100, tensor_cores=("float16", "bfloat16"))


def _matmul16(*shapes: tuple[int, ...], transpose_a: bool = False, transpose_b: bool = False, dtype: DType = dtypes.float16) -> Kernel:
  a, b = (Tensor.rand(*s).cast(dtype).realize() for s in shapes)
  return Kernel(create_schedule(((a.T if transpose_a else a) @ (b.T if transpose_b else b)).uop, "CPU")[0][0].ast, H100_TC)


@functools.cache  # built once for the tests that render them; none changes a kernel
def tc_kernels() -> tuple[Kernel, ...]:
  t, o = OptOps, Opt
  ret = [_matmul16((64, 32), (32, 48)).apply_opts(hand_coded_optimizations(_matmul16((64, 32), (32, 48))))]
  ret += [_matmul16((64, 32), (32, 48)).apply_opts(opts) for opts in [
    [o(t.TC, 0, 0)], [o(t.TC, 0, 0), o(t.UPCAST, 0, 2), o(t.LOCAL, 1, 3), o(t.UNROLL, 0, 2)], [o(t.TC, 0, 0), o(t.SWAP, 0, 1), o(t.UPCAST, 1, 3)]]]
  ret.append(_matmul16((48, 32), (64, 32), transpose_b=True).apply_opts([o(t.TC, 0, 0), o(t.UPCAST, 1, 2)]))  # B column major
  ret.append(_matmul16((2, 32, 16), (2, 16, 32)).apply_opts([o(t.TC, 0, 0), o(t.LOCAL, 0, 2)]))  # batched
  bf16 = _matmul16((64, 32), (32, 48), dtype=dtypes.bfloat16)
  ret += [bf16.copy().apply_opts(hand_coded_optimizations(bf16)), bf16.copy().apply_opts([o(t.TC, 0, 0), o(t.UPCAST, 0, 2), o(t.UNROLL, 0, 2)])]
  ret.append(_matmul16((48, 32), (64, 32), transpose_b=True, dtype=dtypes.bfloat16).apply_opts([o(t.TC, 0, 0), o(t.LOCAL, 1, 2)]))
  return tuple(ret)


@functools.cache
def mma_kernels() -> tuple[Kernel, ...]:
  """TC's arg 1, PTX mma.sync: A row and column major, B both ways, float16 and bfloat16."""
  t, o = OptOps, Opt
  return (_matmul16((64, 32), (32, 48)).apply_opts([o(t.TC, 0, 1), o(t.UPCAST, 0, 2), o(t.LOCAL, 1, 3), o(t.UNROLL, 0, 2)]),
          _matmul16((48, 32), (64, 32), transpose_b=True, dtype=dtypes.bfloat16).apply_opts([o(t.TC, 0, 1), o(t.LOCAL, 1, 2)]),
          _matmul16((32, 64), (32, 48), transpose_a=True).apply_opts([o(t.TC, 0, 1), o(t.UPCAST, 1, 3)]),
          # from shared memory (STAGE), both instructions
          _matmul16((64, 64), (64, 48)).apply_opts([o(t.TC, 0, 1), o(t.STAGE, 0, 2), o(t.LOCAL, 1, 3)]),
          _matmul16((64, 64), (48, 64), transpose_b=True, dtype=dtypes.bfloat16).apply_opts([o(t.TC, 0, 0), o(t.STAGE, 0, 2), o(t.LOCAL, 1, 3)]))


def test_tensor_core_opt() -> None:
  ks = tc_kernels()
  assert all(k.tc is not None for k in ks) and ks[0].opts[0] == Opt(OptOps.TC, 0, 0) and len(ks[0].opts) >= 3
  assert ks[4].tc is not None and (ks[4].tc.a_layout, ks[4].tc.b_layout) == ("row_major", "col_major")
  assert ks[1].launch_dims == (4 * 3, 32) and all(k.tc is not None and k.tc.a.dtype == dtypes.bfloat16 for k in ks[6:])
  bf16_on_f16_only = Kernel(_matmul16((64, 32), (32, 48), dtype=dtypes.bfloat16).ast, dataclasses.replace(H100, tensor_cores=("float16",)))
  with pytest.raises(KernelOptError, match="float16 inputs"): bf16_on_f16_only.apply_opt(Opt(OptOps.TC, 0, 0))
  with pytest.raises(KernelOptError, match="tensor cores"): Kernel(_matmul16((64, 32), (32, 48)).ast, H100).apply_opt(Opt(OptOps.TC, 0, 0))
  with pytest.raises(KernelOptError, match="multiples of 16"): _matmul16((24, 32), (32, 48)).apply_opt(Opt(OptOps.TC, 0, 0))
  with pytest.raises(KernelOptError, match="first"): _matmul16((64, 32), (32, 48)).apply_opts([Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.TC, 0, 0)])
  with pytest.raises(KernelOptError, match="combine"): _matmul16((64, 32), (32, 48)).apply_opts([Opt(OptOps.TC, 0, 0), Opt(OptOps.GROUP, 0, 2)])
  f32 = Kernel(create_schedule((Tensor.rand(32, 32) @ Tensor.rand(32, 32)).uop, "CPU")[0][0].ast, H100_TC)
  with pytest.raises(KernelOptError, match="float16"): f32.apply_opt(Opt(OptOps.TC, 0, 0))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: the CUDA renderer's output is not compile-checked here")
def test_tensor_core_source_compiles_with_nvcc() -> None:
  srcs = cuda_sources(tc_kernels)
  assert all("wmma::mma_sync" in s for s in srcs) and sum("16, __nv_bfloat16, wmma::" in s for s in srcs) == 3
  mma = cuda_sources(mma_kernels)
  assert all("mma.sync.aligned.m16n8k16.row.col.f32" in s and "wmma" not in s for s in mma[:-1]) and sum(".bf16.bf16" in s for s in mma) == 1
  assert [k.tc.mma and (k.tc.a_layout, k.tc.b_layout) for k in mma_kernels()[:3]] == [  # type: ignore[union-attr]
    ("row_major", "row_major"), ("row_major", "col_major"), ("col_major", "row_major")]
  assert all("__shared__ __align__(32) " + ty + " tile0[" in s for s, ty in zip(mma[3:], ("half", "__nv_bfloat16")))  # tiles as stored
  assert "wmma::load_matrix_sync(a" in mma[-1] and "tile0+" in mma[-1]
  # mma.sync's tiles in shared memory (in memory's order: A row-major, B row-major) go through ldmatrix, B's .trans; global memory
  # through each lane's loads
  assert [s[s.index('extern "C"'):].count("tt_ldmatrix_x4_trans(") for s in mma[:4]] == [0, 0, 0, 1]
  assert [s[s.index('extern "C"'):].count("tt_ldmatrix_x4(") for s in mma[:4]] == [0, 0, 0, 1]
  assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in mma[3]
  with pytest.raises(KernelOptError, match="GPU"): Kernel(_matmul16((64, 32), (32, 48)).ast, Device["CPU"].caps).apply_opt(Opt(OptOps.TC, 0, 1))
  assert not (errors := _compile_all(["nvcc", "-arch=sm_90", "-cubin"], ".cu", [*srcs, *mma])), errors[0]


# magnitudes and signs of copysign with both signs of zero and of NaN; an H200 gave 4.0 for copysign(-4, -NaN) in float16 and +NaN
# for copysign(NaN, -1) in float64
SIGNS = ([1.0, -2.0, 3.0, -4.0, 0.0, -0.0, math.nan, 5.0, -math.nan, math.inf],
         [-0.0, 0.0, math.nan, -math.nan, -1.0, 1.0, -1.0, -math.inf, 2.0, -math.nan])


def _sign_kernels(dt: DType) -> list[tuple[Kernel, ScheduleItem]]:
  """copysign(magnitudes, signs) and signbit(magnitudes) in `dt`, each a kernel with no opts."""
  mag, sign = (Tensor(np.array(v, dt.np), device="CPU") for v in SIGNS)
  return [(Kernel(item.ast, H100), item) for out in (mag.copysign(sign), mag.signbit()) for item in create_schedule(out.uop, "CPU")[0]]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: the CUDA renderer's output is not compile-checked here")
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_cuda_copysign_sets_the_sign_bit_by_integer_ops(dt: DType, tmp_path) -> None:  # type: ignore[no-untyped-def]
  """copysign's CUDA code has no float negation: PTX's neg.f64 (and neg.f32, cvt.f32.f16 on a GPU) may give a NaN of either sign."""
  for k, _ in _sign_kernels(dt)[:1]:
    (tmp_path / "k.cu").write_text(CUDARenderer().render(k))
    subprocess.run(["nvcc", "-arch=sm_90", "-ptx", "k.cu", "-o", "k.ptx"], cwd=tmp_path, check=True, capture_output=True, timeout=300)
    ptx = (tmp_path / "k.ptx").read_text()
    assert not re.search(r"\b(neg|abs)\.f", ptx) and re.search(r"\band\.b(16|32|64)\b", ptx), ptx[ptx.index(".entry"):]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: CUDA's float16 conversions are not checked here")
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_cuda_16_bit_floats_keep_nan_signs(dt: DType, tmp_path) -> None:  # type: ignore[no-untyped-def]
  """copysign and signbit of CUDA's float16 and bfloat16, their kernels' source built for the host by nvcc (each block a call) with
  cuda_fp16.h's and cuda_bf16.h's host conversions, which give the canonical NaN whatever its sign as the GPU's cvt does: NumPy's
  signs, NaNs' and zeros' included."""
  for k, item in _sign_kernels(dt):
    src = CUDARenderer().render(k).replace("__device__", "__host__ __device__").replace("blockIdx.x", "tt_block")
    src = re.sub(r'extern "C" __global__ void __launch_bounds__\(\d+\)', "void", src)
    bufs = [item.out, *dict.fromkeys(k.bufs)]
    sizes = [b.size * b.dtype.itemsize for b in bufs]
    main = ("#include <cstdio>\nstatic int tt_block;\n" + src
            + "struct tt_any { void* p; template <class T> operator T*() const { return (T*)p; } };\n"
            + "int main() {\n" + "".join(f"  static unsigned char b{i}[{n}];\n" for i, n in enumerate(sizes))
            + "".join(f"  if (fread(b{i}, 1, {n}, stdin) != {n}) return 1;\n" for i, n in enumerate(sizes) if i)
            + f"  for (tt_block = 0; tt_block < {k.launch_dims[0]}; tt_block++) {k.name}({', '.join(f'tt_any{{b{i}}}' for i in range(len(bufs)))});\n"
            + f"  return fwrite(b0, 1, {sizes[0]}, stdout) != {sizes[0]};\n}}\n")
    (tmp_path / "k.cu").write_text(main)
    subprocess.run(["nvcc", "k.cu", "-o", "k"], cwd=tmp_path, check=True, capture_output=True, timeout=300)
    run = subprocess.run(["./k"], cwd=tmp_path, input=b"".join(b.numpy_view().tobytes() for b in bufs[1:]), capture_output=True, timeout=60)
    assert run.returncode == 0, run.stderr
    got, (mag, sign) = np.frombuffer(run.stdout, item.out.dtype.np), (np.array(v) for v in SIGNS)
    if item.out.dtype == dtypes.bool: assert np.array_equal(got, np.signbit(mag)), f"signbit {got} where NumPy gives {np.signbit(mag)}"
    else:
      want = np.copysign(mag, sign)
      assert np.array_equal(np.signbit(got), np.signbit(want)) and np.array_equal(np.isnan(got), np.isnan(want)), f"copysign {got}, NumPy {want}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: CUDA's bfloat16 rounding is not checked here")
def test_cuda_bfloat16_rounding_matches_ml_dtypes(tmp_path) -> None:
  """The CUDA renderer's float32 -> bfloat16 conversion, built for the host by nvcc (its helper is the device code, made __host__ too),
  gives ml_dtypes' bits: cuda_bf16.h's __float2bfloat16_rn alone makes every NaN 0x7fff, not the quiet NaN of its sign."""
  r = CUDARenderer()
  bits = np.array([0x7FC00000, 0xFFC00001, 0x7F800001, 0xFFFFFFFF, 0x3F808000, 0x3F818000, 0x7F7FFFFF, 0xFF800000, 0x80000000, 0x00018000,
                   *np.random.default_rng(0).integers(0, 2 ** 32, 64, dtype=np.uint32)], np.uint32)
  src = ("#include <cuda_bf16.h>\n#include <cstdio>\n#include <cstring>\n" + r.bf16_prelude().replace("__device__", "__host__ __device__")
         + "int main() { unsigned int u[] = {" + ", ".join(f"{b}u" for b in bits) + "};\n"
         f"  for (unsigned int x : u) {{ float f; memcpy(&f, &x, 4); __nv_bfloat16 b = {r.bf16_out}(f); unsigned short h; memcpy(&h, &b, 2); "
         'printf("%u\\n", h); } }\n')
  (tmp_path / "t.cu").write_text(src)
  subprocess.run(["nvcc", "t.cu", "-o", "t"], cwd=tmp_path, check=True, capture_output=True, timeout=300)
  got = np.array(subprocess.run(["./t"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split(), np.uint16)
  with np.errstate(invalid="ignore", over="ignore"): exp = bits.view(np.float32).astype(dtypes.bfloat16.np).view(np.uint16)
  np.testing.assert_array_equal(got, exp)


@pytest.mark.skipif(bool(nvrtc_missing()), reason=str(nvrtc_missing()))
def test_cuda_source_compiles_with_nvrtc() -> None:
  """The CUDA device's own compile path, NVRTC through cuda-bindings with the headers it finds, needs no GPU: every catalog, TC and
  dtype kernel (bitcasts and copysign included: nvcc takes GNU statement expressions, NVRTC does not)."""
  from tinytune.runtime import CompileError
  from tinytune.runtime.cuda import _nvrtc
  def one(src: str) -> str:
    try: _nvrtc(src, "sm_90")
    except CompileError as e: return str(e)[:3000]
    return ""
  srcs = dict.fromkeys([*(src for kernels in (catalog_kernels, bf16_kernels, tc_kernels, mma_kernels, dtype_kernels, staged_matmuls)
                          for src in cuda_sources(kernels)), CUDARenderer().render(prefetched_matmul())])
  with ThreadPoolExecutor(os.cpu_count() or 1) as pool: assert not (errors := [e for e in pool.map(one, srcs) if e]), errors[0]


def test_search_on_an_absent_device_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
  from tinytune.cli import main
  if device_status("AMD") is None: pytest.skip("AMD is present here")
  assert main(["search", "matmul", "--device", "amd", "--budget", "1"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("tinytune: error: AMD needs") and err.count("\n") == 1


@pytest.mark.skipif(not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(tempfile.gettempdir()).st_dev,
                    reason="needs /dev/shm on another filesystem than the cache folder")
def test_a_tmpdir_on_another_filesystem(tmp_path) -> None:  # type: ignore[no-untyped-def]
  env = {**os.environ, "TMPDIR": "/dev/shm", "TINYTUNE_CACHE_DIR": str(tmp_path), "TINYTUNE_DEVICE": "CPU"}  # the C compiler's temporary files
  run = subprocess.run([sys.executable, "-c", "from tinytune import Tensor; print((Tensor.ones(4) * 3).numpy().tolist())"], env=env,
                       capture_output=True, text=True, timeout=120)
  assert run.returncode == 0 and run.stdout.strip() == "[3.0, 3.0, 3.0, 3.0]", run.stderr[-500:]
  assert not [p for p in (tmp_path / "cpu").iterdir() if not p.name.endswith(".so")]  # no temporary files left


def test_threads_compiling_the_same_kernel(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
  monkeypatch.setenv("TINYTUNE_CACHE_DIR", str(tmp_path))
  src = "void same(float* restrict a) { a[0] = 1.0f; }\n"
  with ThreadPoolExecutor(8) as pool: paths = set(pool.map(lambda _: Device["CPU"].compile(src), range(16)))
  assert len(paths) == 1 and sorted(p.name for p in (tmp_path / "cpu").iterdir()) == [os.path.basename(paths.pop().decode())]


class _FakeDriver:
  """The driver calls CUDAGraph makes, recorded: each kernel node's argument addresses are read when given, as the driver copies them."""
  def __init__(self, cu: object):
    self.CUDA_KERNEL_NODE_PARAMS, self.calls, self.nodes = cu.CUDA_KERNEL_NODE_PARAMS, [], []  # type: ignore[attr-defined]
    self.CUresult, self.cuGetErrorName = cu.CUresult, cu.cuGetErrorName  # type: ignore[attr-defined]

  @staticmethod
  def _addresses(p: object) -> list[int]:
    import ctypes
    n = int(p.func)  # type: ignore[attr-defined]  # the fake programs' function handle is their argument count
    return [ctypes.c_void_p.from_address(a).value or 0 for a in (ctypes.c_void_p * n).from_address(p.kernelParams)]  # type: ignore[attr-defined]
  def cuGraphCreate(self, flags: int) -> tuple: return (0, "graph")
  def cuGraphAddKernelNode(self, graph: str, deps: list, n: int, p: object) -> tuple:
    assert deps == self.nodes[-1:] and n == len(deps) and (p.gridDimX, p.blockDimX, p.gridDimY, p.blockDimZ) == (3, 32, 1, 1)  # type: ignore[attr-defined]
    self.nodes.append(f"node{len(self.nodes)}")
    self.calls.append(("add", self._addresses(p)))
    return (0, self.nodes[-1])
  def cuGraphInstantiate(self, graph: str, flags: int) -> tuple: self.calls.append(("instantiate",)); return (0, "exec")
  def cuGraphDestroy(self, graph: str) -> tuple: self.calls.append(("destroy", graph)); self.nodes.clear(); return (0,)
  def cuGraphExecDestroy(self, graph: str) -> tuple: self.calls.append(("destroy", graph)); return (0,)
  def cuGraphExecKernelNodeSetParams(self, exe: str, node: str, p: object) -> tuple:
    if node not in self.nodes: return (self.CUresult.CUDA_ERROR_INVALID_VALUE,)  # as the driver: a node of a graph that was destroyed
    self.calls.append(("set", node, self._addresses(p)))
    return (0,)
  def cuGraphLaunch(self, exe: str, stream: int) -> tuple: self.calls.append(("launch",)); return (0,)


def test_tinyjit_cuda_graph_is_built_once_and_relaunched_with_moved_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
  """With a recording fake of the driver: the graph chains the kernels with their buffers' addresses, is built at the first replay,
  sets again only the nodes whose input moved, and launches once per replay."""
  cuda = pytest.importorskip("tinytune.runtime.cuda")
  if cuda.cu is None: pytest.skip("no cuda-bindings here: pip install -e '.[cuda]'")
  fake = _FakeDriver(cuda.cu)
  class Mem:
    def __init__(self, mem: int): self.mem = mem
  def program(nargs: int) -> object:
    p = object.__new__(cuda.CUDAProgram)
    p.function, p.launch = cuda.cu.CUfunction(nargs), (3, 32)
    return p
  steps = [(program(2), [Mem(0x1000), 0]), (program(2), [1, Mem(0x1000)]), (program(1), [Mem(0x1000)])]
  monkeypatch.setattr(cuda, "cu", fake)
  graph = cuda.CUDAGraph(steps)
  graph([Mem(0x2000), Mem(0x3000)])
  assert fake.calls == [("add", [0x1000, 0x2000]), ("add", [0x3000, 0x1000]), ("add", [0x1000]), ("instantiate",), ("launch",)]
  fake.calls.clear()
  graph([Mem(0x2000), Mem(0x4000)])  # input 1 moved: only the node that reads it is set again
  graph([Mem(0x2000), Mem(0x4000)])
  assert fake.calls == [("set", "node1", [0x4000, 0x1000]), ("launch",), ("launch",)]
  fake.calls.clear()
  del graph
  assert fake.calls == [("destroy", "exec"), ("destroy", "graph")]


class _FakeHIP:
  """The HIP calls HIPGraph makes, recorded the same way, through ctypes' own arguments (no ROCm here)."""
  def __init__(self) -> None: self.calls: list[tuple] = []
  @staticmethod
  def _addresses(p: object) -> list[int]:
    import ctypes
    n = p.func  # type: ignore[attr-defined]  # the fake programs' function handle is their argument count
    return [ctypes.c_void_p.from_address(a).value or 0 for a in (ctypes.c_void_p * n).from_address(p.kernelParams)]  # type: ignore[attr-defined]
  def hipGraphCreate(self, out: object, flags: int) -> int: out._obj.value = 1; return 0  # type: ignore[attr-defined]
  def hipGraphAddKernelNode(self, out: object, graph: object, deps: object, n: object, p: object) -> int:
    params = p._obj  # type: ignore[attr-defined]
    assert (params.gridDim.x, params.blockDim.x, params.gridDim.y) == (3, 32, 1) and n.value == (0 if deps is None else 1)  # type: ignore[attr-defined]
    self.calls.append(("add", self._addresses(params)))
    out._obj.value = 100 + len(self.calls)  # type: ignore[attr-defined]
    return 0
  def hipGraphInstantiate(self, out: object, *args: object) -> int: out._obj.value = 7; self.calls.append(("instantiate",)); return 0  # type: ignore[attr-defined]
  def hipGraphDestroy(self, graph: object) -> int: self.calls.append(("destroy graph",)); return 0
  def hipGraphExecDestroy(self, exe: object) -> int: self.calls.append(("destroy exec",)); return 0
  def hipGraphExecKernelNodeSetParams(self, exe: object, node: object, p: object) -> int:
    if ("destroy graph",) in self.calls: return 1  # hipErrorInvalidValue, as HIP: a node of a graph that was destroyed
    self.calls.append(("set", node.value, self._addresses(p._obj)))  # type: ignore[attr-defined]
    return 0
  def hipGraphLaunch(self, exe: object, stream: object) -> int: self.calls.append(("launch",)); return 0


def test_tinyjit_hip_graph_is_built_once_and_relaunched_with_moved_inputs() -> None:
  """HIP's graph, with a recording fake of the HIP library: the same chain, updates and one launch per replay as CUDA's."""
  import ctypes

  from tinytune.runtime.amd import AMDDevice, AMDProgram, HIPGraph
  class Mem:
    def __init__(self, mem: int): self.mem = ctypes.c_void_p(mem)
  def program(nargs: int) -> AMDProgram:
    p = object.__new__(AMDProgram)
    p.function, p.launch = ctypes.c_void_p(nargs), (3, 32)
    return p
  dev = object.__new__(AMDDevice)
  dev.hip = fake = _FakeHIP()  # type: ignore[assignment]
  graph = HIPGraph(dev, [(program(2), [Mem(0x1000), 0]), (program(2), [1, Mem(0x1000)]), (program(1), [Mem(0x1000)])])  # type: ignore[list-item]
  graph([Mem(0x2000), Mem(0x3000)])  # type: ignore[list-item]
  assert fake.calls == [("add", [0x1000, 0x2000]), ("add", [0x3000, 0x1000]), ("add", [0x1000]), ("instantiate",), ("launch",)]
  fake.calls.clear()
  graph([Mem(0x2000), Mem(0x4000)])  # type: ignore[list-item]
  assert fake.calls == [("set", 102, [0x4000, 0x1000]), ("launch",)]
  fake.calls.clear()
  del graph
  assert fake.calls == [("destroy exec",), ("destroy graph",)]


class _Memory:
  """A GPU buffer's stand-in: `mem` as the device gives it; how many times it was read."""
  def __init__(self, mem: object): self._mem, self.reads = mem, 0
  @property
  def mem(self) -> object:
    self.reads += 1
    return self._mem


def _launched(params: int, n: int) -> list[int]:
  """The argument values a driver reads at a launch from its parameter block (an array of pointers to each value)."""
  import ctypes
  return [ctypes.c_void_p.from_address(a).value or 0 for a in (ctypes.c_void_p * n).from_address(params)]


def test_cuda_launches_keep_one_argument_block(monkeypatch: pytest.MonkeyPatch) -> None:
  """With a recording fake of cuLaunchKernel: each launch gives its buffers' addresses, from one parameter block the program keeps
  (the driver copies the arguments at the launch) rather than ctypes objects built per launch; a buffer's address is read once."""
  cuda = pytest.importorskip("tinytune.runtime.cuda")
  if cuda.cu is None: pytest.skip("no cuda-bindings here: pip install -e '.[cuda]'")
  launches: list[tuple[int, list[int]]] = []
  class Driver:
    @staticmethod
    def cuLaunchKernel(fn: object, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int, stream: int, params: int, extra: int) -> tuple:
      assert (gx, bx, gy, bz) == (3, 32, 1, 1)
      launches.append((params, _launched(params, 2)))
      return (0,)
  monkeypatch.setattr(cuda, "cu", Driver)
  program = object.__new__(cuda.CUDAProgram)
  program.function, program.launch, program.args = "kernel", (3, 32), None
  a, b, c = _Memory(0x1000), _Memory(0x2000), _Memory(0x3000)
  for bufs in ((a, b), (a, b), (c, b), (a, c)): assert program(*bufs) is None  # type: ignore[arg-type]
  assert [args for _, args in launches] == [[0x1000, 0x2000], [0x1000, 0x2000], [0x3000, 0x2000], [0x1000, 0x3000]]
  assert len({params for params, _ in launches}) == 1 and (a.reads, b.reads, c.reads) == (1, 1, 1)


def test_cuda_dynamic_shared_memory_is_opted_into_once_and_given_at_each_launch(monkeypatch: pytest.MonkeyPatch) -> None:
  """A kernel past 48 KB of shared memory (its source's arrays in dynamic shared memory): its lib carries the bytes after the cubin's
  header, loading it sets the function's dynamic limit once, and every launch and graph node gives them; a plain cubin gives none."""
  cuda = pytest.importorskip("tinytune.runtime.cuda")
  if cuda.cu is None: pytest.skip("no cuda-bindings here: pip install -e '.[cuda]'")
  from tinytune.codegen.cstyle import DYNAMIC_SHARED, dynamic_shared
  real, calls = cuda.cu, list[tuple]()
  class Driver:
    CUfunction_attribute, CUDA_KERNEL_NODE_PARAMS = real.CUfunction_attribute, real.CUDA_KERNEL_NODE_PARAMS
    @staticmethod
    def cuModuleLoadData(cubin: bytes) -> tuple: calls.append(("load", cubin)); return (0, "module")
    @staticmethod
    def cuModuleGetFunction(module: str, name: bytes) -> tuple: return (0, real.CUfunction(len(name)))  # "big" 3, "plain" 5
    @staticmethod
    def cuFuncSetAttribute(fn: object, attr: object, value: int) -> tuple: calls.append(("attribute", int(fn), attr, value)); return (0,)  # type: ignore[call-overload]
    @staticmethod
    def cuLaunchKernel(fn: object, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int, stream: int, params: int, extra: int) -> tuple:
      calls.append(("launch", int(fn), shared))  # type: ignore[call-overload]
      return (0,)
  monkeypatch.setattr(cuda, "cu", Driver)
  src = f"{DYNAMIC_SHARED.format(81920)}\n"
  assert dynamic_shared(src) == 81920 and dynamic_shared("__shared__ float tile[16];") == 0
  lib = cuda.pack_lib(b"\x7fELF cubin", dynamic_shared(src))
  assert cuda.unpack_lib(lib) == (b"\x7fELF cubin", 81920) and cuda.pack_lib(b"\x7fELF cubin", 0) == b"\x7fELF cubin"
  big, plain = cuda.CUDAProgram(None, "big", lib, (3, 32)), cuda.CUDAProgram(None, "plain", b"\x7fELF cubin", (3, 32))
  for _ in range(2): big(_Memory(0x1000)), plain(_Memory(0x1000))  # type: ignore[arg-type]
  attr = real.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
  assert calls == [("load", b"\x7fELF cubin"), ("attribute", 3, attr, 81920), ("load", b"\x7fELF cubin"),
                   *[("launch", 3, 81920), ("launch", 5, 0)] * 2]
  assert [cuda.CUDAGraph._params(p, cuda._arguments([0x1000])).sharedMemBytes for p in (big, plain)] == [81920, 0]


def test_hip_launches_keep_one_argument_block() -> None:
  """HIP's launches the same way, with a recording fake of hipModuleLaunchKernel."""
  import ctypes

  from tinytune.runtime.amd import AMDDevice, AMDProgram
  launches: list[tuple[int, list[int]]] = []
  class HIP:
    @staticmethod
    def hipModuleLaunchKernel(fn: object, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int, stream: object, params: ctypes.c_void_p,
                              extra: object) -> int:
      launches.append((params.value or 0, _launched(params.value or 0, 2)))
      return 0
  dev = object.__new__(AMDDevice)
  dev.hip = HIP()  # type: ignore[assignment]
  program = object.__new__(AMDProgram)
  program.dev, program.function, program.launch, program.args = dev, ctypes.c_void_p(1), (3, 32), None
  a, b, c = _Memory(ctypes.c_void_p(0x1000)), _Memory(ctypes.c_void_p(0x2000)), _Memory(ctypes.c_void_p(0x3000))
  for bufs in ((a, b), (c, b), (c, b)): program(*bufs)  # type: ignore[arg-type]
  assert [args for _, args in launches] == [[0x1000, 0x2000], [0x3000, 0x2000], [0x3000, 0x2000]]
  assert len({params for params, _ in launches}) == 1 and (a.reads, b.reads, c.reads) == (1, 1, 1)


@pytest.mark.skipif(device_status("OPENCL") is not None, reason=str(device_status("OPENCL")))
def test_gpu_style_launches_return_at_once_and_reads_wait() -> None:
  """OPENCL is asynchronous as CUDA is: a launch returns no time, a read waits for it, wait=True and Device.timed give device
  seconds around the work, and a TinyJit replay there goes kernel by kernel (it has no batch) on the same queue."""
  from tinytune.engine.schedule import create_schedule as schedule
  dev = Device["OPENCL"]
  x = Tensor(np.arange(4096, dtype=np.float32), device="OPENCL").realize()
  (item,), _ = schedule((x * 2 + 1).uop, "OPENCL")
  k = Kernel(item.ast, dev.caps)
  k.apply_opts(hand_coded_optimizations(k))
  program = dev.program(k.name, dev.compile(dev.renderer.render(k)), k.launch_dims)
  assert dev.asynchronous and program(item.out, *k.bufs) is None
  np.testing.assert_equal(item.out.numpy_view(), np.arange(4096) * 2 + 1)
  assert program.timed(item.out, *k.bufs) > 0 and dev.timed(lambda: [program(item.out, *k.bufs) for _ in range(3)]) > 0
  assert dev.batch([(program, [item.out, *k.bufs])]) is None
