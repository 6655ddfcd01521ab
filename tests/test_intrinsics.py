"""The CPU's C intrinsics in rendered kernels against NumPy: vector math (exp2, log2, sin, sqrt, max, where and comparisons in SIMD
lanes), streaming stores, bfloat16 dot products and 16-bit floats in vector lanes (test_clib tests the C helper library on its own)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ops_support import (
  FUZZ,
  examples,
  oob_guard,  # noqa: F401  (autouse: canary bytes around every buffer)
  rand,
  realize_or_reject,
)

from tinytune import Device, Kernel, Opt, OptOps, Tensor, dtypes, engine
from tinytune.dtype import DType
from tinytune.engine.schedule import ScheduleItem

# ***** vector math: the CPU's inline exp2, log2, sin, sqrt, max, where and comparisons in SIMD lanes, against NumPy *****

EDGES = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-40, 1.1754942e-38, 1.1754944e-38, 1.0, -1.0, 2.0, 0.5, 1.0000001,
                  0.99999994, 127.99, 128.0, 128.5, -126.0, -149.0, -149.5, -150.0, -151.0, -1e30, 1e30, 3.4028235e38, -3.4028235e38], np.float32)
VECTOR_ULPS = {"exp2": (np.exp2, 4), "log2": (np.log2, 4), "sin": (np.sin, 4), "sqrt": (np.sqrt, 0), "reciprocal": (np.reciprocal, 0)}


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
  """float32 ulps between two arrays; 0 where both are the same value (infinities, NaNs of any payload), inf where one is non-finite."""
  same = (got == want) | (np.isnan(got) & np.isnan(want))
  with np.errstate(invalid="ignore"):
    ret = np.abs(got.astype(np.float64) - want) / np.spacing(np.maximum(np.abs(want), np.float32(1e-45)))
  return np.where(same, 0.0, np.where(np.isfinite(ret), ret, np.inf))


@pytest.mark.usefixtures("each_device")
@pytest.mark.parametrize("name", sorted(VECTOR_ULPS))
@settings(max_examples=examples(15), **FUZZ)
@given(values=st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=64))
def test_vector_math_matches_numpy(name: str, values: list[float]) -> None:
  ref, max_ulps = VECTOR_ULPS[name]
  a = np.resize(np.concatenate([np.array(values, np.float32), EDGES]), 256)  # 256 elements: the CPU's kernel runs in vector lanes
  with np.errstate(all="ignore"): want = ref(a)
  got = realize_or_reject(lambda: getattr(Tensor(a), name)())
  bad = ulps(got, want) > max_ulps
  assert not bad.any(), f"{name}({a[bad][:4]}) = {got[bad][:4]}, NumPy: {want[bad][:4]}"


@pytest.mark.usefixtures("each_device")
@pytest.mark.parametrize("lo,hi", [(-160, 140), (-1, 1), (1e-38, 1e38)])
def test_vector_math_dense(lo: float, hi: float) -> None:
  a = np.concatenate([np.random.default_rng(0).uniform(lo, hi, 4096 - 32), EDGES, EDGES[:4]]).astype(np.float32)
  if lo > 0: a = np.abs(np.exp(np.random.default_rng(1).uniform(-87, 88, a.size))).astype(np.float32)
  a[:1024] = np.arange(1, 1025) * np.float32(np.pi / 2)  # sin near its zeros: the argument reduction must keep relative accuracy
  for name in ("exp2", "log2", "sin"):
    ref, max_ulps = VECTOR_ULPS[name]
    with np.errstate(all="ignore"): want = ref(a)
    assert ulps(getattr(Tensor(a), name)().numpy(), want).max() <= max_ulps


@pytest.mark.parametrize("cc", ["gcc", "clang"])
@pytest.mark.parametrize("lanes,isa", [(16, "avx512f"), (8, "avx2")])
def test_streaming_stores_write_every_line_aligned_or_not(cc: str, lanes: int, isa: str, tmp_path) -> None:
  """A STREAM kernel built by gcc and clang, with AVX-512 or AVX2 (non-temporal stores where the vector is aligned: a line, or
  two halves of one) and without (plain stores), writes the same values into an output that starts on a cache line and into one
  that does not."""
  import ctypes
  import shutil
  import subprocess

  from tinytune.codegen.cstyle import CRenderer
  from tinytune.engine.schedule import create_schedule
  from tinytune.runtime import DeviceCaps
  from tinytune.runtime.cpu import cpuinfo
  if shutil.which(cc) is None or isa not in cpuinfo().get("flags", "").split(): pytest.skip(f"needs {cc} and an {isa} CPU")
  x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
  items, _ = create_schedule(((Tensor(x) + 1) * 2).uop, "CPU")
  k = Kernel(items[-1].ast, DeviceCaps(threads=2, simd_width=lanes))
  k.apply_opts([Opt(OptOps.UPCAST, 0, 32), Opt(OptOps.THREAD, 0, 2), Opt(OptOps.STREAM, 0, 0)])
  (tmp_path / "s.c").write_text(src := CRenderer().render(k))
  assert f"tt_f{lanes}_stream" in src and "tt_fence();" in src
  march, without = ("-march=native", "-mno-avx512f") if lanes == 16 else ("-march=x86-64-v3", "-mno-avx")
  for extra in ([], [without]):
    lib = tmp_path / f"s{len(extra)}.so"
    subprocess.run([cc, "-O3", march, *extra, "-fPIC", "-shared", "s.c", "-o", str(lib)], cwd=tmp_path, check=True)
    fn = getattr(ctypes.CDLL(str(lib)), k.name)
    for skew in (0, 1):  # the output on a 64-byte line, then 4 bytes past one
      raw = np.zeros(x.size + 32, np.float32)
      out = raw[(-raw.ctypes.data % 64) // 4 + skew:][:x.size]
      fn(out.ctypes.data_as(ctypes.c_void_p), x.ctypes.data_as(ctypes.c_void_p))
      np.testing.assert_array_equal(out, (x + 1) * 2)


@pytest.mark.usefixtures("on_cpu")  # C built and called here, on the CPU's buffers
@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_bfloat16_dot_products_add_exact_pairs(cc: str, tmp_path) -> None:
  """The CPU's TC (bfloat16 pairs along K in vdpbf16ps) built by gcc and clang three ways: the compiler's builtin, the instruction
  in assembly (compilers whose builtin types changed), and float32 math (CPUs without AVX512_BF16). Matmuls with A's pairs adjacent
  and not (A transposed), a batch, padded columns, an UNROLL, vectors of 8 lanes, and x @ W.T with LANES along K (both inputs'
  pairs neighbours), against float64 on the same inputs."""
  import ctypes
  import shutil
  import subprocess

  from tinytune.codegen.cstyle import CRenderer
  from tinytune.engine.schedule import create_schedule
  from tinytune.runtime import DeviceCaps
  from tinytune.runtime.cpu import address, cpuinfo
  if shutil.which(cc) is None or "avx512_bf16" not in cpuinfo().get("flags", "").split(): pytest.skip(f"needs {cc} and a CPU with AVX512_BF16")
  caps, rng, T, U = DeviceCaps(threads=2, simd_width=16, tensor_cores=("bfloat16",)), np.random.default_rng(0), OptOps.TC, OptOps.UPCAST
  def bf16(*shape: int) -> Tensor: return Tensor(rng.standard_normal(shape).astype(np.float32)).cast(dtypes.bfloat16).realize()
  a, at, b, b48, batch = bf16(40, 64), bf16(64, 40), bf16(64, 40), bf16(64, 48), bf16(3, 8, 64)
  # (A, B, opts, the dot products in the loop: a row's A pair by a vector's B pair): columns padded to a vector read B lane by lane,
  # a sum of products as without TC
  cases = [(a, b, [Opt(T, 0, 0), Opt(U, 1, 8), Opt(U, 0, 4), Opt(OptOps.THREAD, 0, 2)], ("tt_dot8(acc", 4)),
           (at.T, b48, [Opt(T, 0, 0), Opt(OptOps.PADTO, 0, 16), Opt(U, 1, 16), Opt(U, 0, 3), Opt(OptOps.UNROLL, 0, 4)], ("tt_dot16(acc", 12)),
           (batch, b48, [Opt(T, 0, 0), Opt(U, 2, 16), Opt(U, 1, 4), Opt(OptOps.SWAP, 0, 1)], ("tt_dot16(acc", 4)),
           (a, b, [Opt(T, 0, 0), Opt(OptOps.PADTO, 1, 16), Opt(U, 1, 16)], ("tt_dot", 0)),
           (a, a.T, [Opt(T, 0, 0), Opt(OptOps.LANES, 0, 16), Opt(U, 1, 4), Opt(U, 0, 2)], ("tt_dot16(acc", 8)),  # x @ W.T: neighbours
           (a, a.T, [Opt(T, 0, 0), Opt(OptOps.LANES, 0, 8), Opt(U, 1, 2), Opt(OptOps.THREAD, 0, 2)], ("tt_dot8(acc", 2))]
  for i, (x, y, opts, (dot, n)) in enumerate(cases):
    items, _ = create_schedule((x @ y).uop, "CPU")
    k = Kernel(items[-1].ast, caps).apply_opts(opts)
    src = CRenderer().render(k)
    body = src.split(f"void {k.name}(")[1]  # A's pairs: one 32-bit word in every lane, but two elements where A is transposed
    assert src.count(dot) == n and ("tt_splat2" in body) == (i == 1) and ("tt_splat" in body) == (i < 3)
    asm = src.replace("__GNUC__ <= 12", "__GNUC__ <= 0").replace("__clang_major__ <= 14", "__clang_major__ <= 0")
    ref = np.matmul(x.float().numpy().astype(np.float64), y.float().numpy().astype(np.float64))
    outs = []
    for j, (text, extra) in enumerate([(src, []), (asm, []), (src, ["-mno-avx512bf16"])]):
      (tmp_path / f"k{i}{j}.c").write_text(text)
      lib = tmp_path / f"k{i}{j}.so"
      subprocess.run([cc, "-O2", "-march=native", *extra, "-fPIC", "-shared", f"k{i}{j}.c", "-o", str(lib)], cwd=tmp_path, check=True)
      out = np.zeros(ref.shape, dtypes.bfloat16.np)
      getattr(ctypes.CDLL(str(lib)), k.name)(*(ctypes.c_void_p(x) for x in (out.ctypes.data, *(address(buf) for buf in k.bufs))))
      outs.append(out.astype(np.float32))
      np.testing.assert_allclose(outs[-1], ref, rtol=2 ** -8, atol=1e-5, err_msg=f"case {i}, build {j}")
    assert (outs[0] == outs[1]).all()  # the same instruction


@pytest.mark.usefixtures("each_device")
@settings(max_examples=examples(15), **FUZZ)
@given(values=st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=2, max_size=64))
def test_vector_max_where_compare_match_numpy(values: list[float]) -> None:
  a = np.resize(np.array(values, np.float32), 256)
  b = np.resize(np.concatenate([EDGES, np.array(values[::-1], np.float32)]), 256)
  ta, tb = Tensor(a), Tensor(b)
  with np.errstate(all="ignore"):
    for got, want in [(ta.maximum(tb), np.maximum(a, b)), (ta.relu(), np.maximum(a, 0)), ((ta < tb).where(ta, tb), np.where(a < b, a, b)),
                      ((ta != tb).where(tb, 1.5), np.where(a != b, b, np.float32(1.5))), ((ta < tb).cast(dtypes.float32) * tb, (a < b) * b),
                      ((ta < 0.5).where(-0.0, ta), np.where(a < 0.5, np.float32(-0.0), a))]:
      out = realize_or_reject(lambda: got)
      assert (ulps(out, want) == 0).all() and (np.signbit(out) == np.signbit(want))[~np.isnan(want)].all(), f"{out} != {want}"


@pytest.mark.usefixtures("on_cpu")
def test_cpu_vector_math_stays_in_lanes() -> None:
  """exp2, log2, sqrt, max, comparisons and where on the CPU are vector calls, not one scalar call per lane."""
  from tinytune.engine import compile_kernel
  a, b = Tensor(rand(256)), Tensor(rand(256))
  out = ((a < b).where(a.exp2(), b.abs().log2()).maximum(a.abs().sqrt())).relu() + a.sin()
  ((_, kernel),) = engine.kernels(out.uop, "CPU")
  src = compile_kernel(kernel.apply_opts(engine.kernel_opts(kernel, "CPU", "default")), "CPU")[1]
  width = Device["CPU"].caps.simd_width
  for fn in ("tt_exp2", "tt_log2", "tt_sin", "tt_sqrt", "tt_max", "tt_where"): assert f"= {fn}{width}(" in src, fn
  assert "exp2f(" not in src and "log2f(" not in src and " sinf(" not in src


def rounding_case(dtype: DType) -> tuple[np.ndarray, np.ndarray, np.ndarray, ScheduleItem]:
  """x, y, NumPy's (ml_dtypes') result of a chain of ops on them done one op at a time in `dtype` (products feeding adds included),
  and the kernel's schedule item, with infinities, NaNs, signed zeros, subnormals, the largest finite values and halfway cases."""
  from tinytune.engine.schedule import create_schedule
  npd, f16 = dtype.np, dtype == dtypes.float16
  edges = [np.inf, -np.inf, np.nan, 0.0, -0.0, 65504.0 if f16 else 3.3e38, 2.0 ** -24 if f16 else 2.0 ** -133, 6.1e-5 if f16 else 1.2e-38, 1.0]
  x = np.concatenate([edges, [1.0, 1.0 + 2.0 ** (-10 if f16 else -7)], rand(256 - len(edges) - 2, lo=-4, hi=4)]).astype(npd)
  y = np.concatenate([edges[::-1], [2.0 ** (-11 if f16 else -8)] * 2, rand(256 - len(edges) - 2, lo=-4, hi=4, seed=1)]).astype(npd)
  with np.errstate(all="ignore"):  # x + y halfway between two values at [-11:-9]: to the even one
    want = np.maximum(x + y, x * y) - np.sqrt(np.where(x < y, np.abs(y), np.abs(x))) * (x.astype(np.float32) * np.float32(0.3)).astype(npd)
  tx, ty = Tensor(x, dtype=dtype, device="CPU"), Tensor(y, dtype=dtype, device="CPU")
  out = (tx + ty).maximum(tx * ty) - (tx < ty).where(ty.abs(), tx.abs()).sqrt() * (tx.cast(dtypes.float32) * 0.3).cast(dtype)
  (item,), _ = create_schedule(out.uop, "CPU")
  return x, y, want, item


def rounding_kernels(item: ScheduleItem, widths: tuple[int, ...] = (1, 16, 8, 4)) -> list[tuple[int, Kernel]]:
  """The kernel as scalar code (width 1) and in vector lanes of 16, 8 and 4 (AVX-512's, F16C's and the compiler's conversions)."""
  from tinytune.runtime import DeviceCaps
  return [(w, Kernel(item.ast, DeviceCaps(threads=1, simd_width=max(w, 4))).apply_opts([] if w == 1 else [Opt(OptOps.UPCAST, 0, 2 * w)]))
          for w in widths]


def rounding_mismatch(width: int, x: np.ndarray, y: np.ndarray, want: np.ndarray, got: np.ndarray) -> str:
  """'' where got has want's bits (any NaN for a NaN), else what differs."""
  bad = np.where(np.isnan(want), ~np.isnan(got), got.view(np.uint16) != want.view(np.uint16))
  return f"{width} lanes: {got[bad][:4]}, NumPy: {want[bad][:4]} (x {x[bad][:4]}, y {y[bad][:4]})" if bad.any() else ""


@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_16_bit_floats_in_vector_lanes_round_each_op(dtype: DType) -> None:
  """float16 and bfloat16 on the CPU load into float32 vector lanes of 16, 8 and 4 (AVX-512's, F16C's and the compiler's
  conversions), and each op's result rounds to the 16-bit type: the same bits as the scalar code and as NumPy (ml_dtypes) doing
  one op at a time."""
  from tinytune.engine import compile_kernel
  x, y, want, item = rounding_case(dtype)
  for width, kernel in rounding_kernels(item):
    program, src = compile_kernel(kernel, "CPU")
    assert width == 1 or f"tt_f{width}_load{'_f16' if dtype == dtypes.float16 else '_bf16'}(" in src
    program(item.out, *kernel.bufs)
    assert not (bad := rounding_mismatch(width, x, y, want, item.out.numpy_view().copy())), bad


# targets whose float16 arithmetic is native: (compiler, -march, an fp16 FMA in its assembly, an fp16 multiply, the CPU target's
# vector widths). There gcc and clang fused a float16 product and the add after it into one FMA under -ffp-contract=fast (rounded
# once, where NumPy rounds twice): found on a Sapphire Rapids host, where the scalar kernel disagreed with its vector lanes and NumPy
X86_FMA, ARM_FMA = r"\bvf(?:n?m(?:add|sub)|m(?:addsub|subadd))\d+[ps]h\b", r"\bf(?:n?m(?:add|sub)|ml[as])\s+[hv]\d+(?:\.\d*h)?,"
NATIVE_F16 = {"gcc-sapphirerapids": ("gcc", "sapphirerapids", X86_FMA, r"\bvmul[ps]h\b", (1, 16, 8, 4)),
              "clang-sapphirerapids": ("clang", "sapphirerapids", X86_FMA, r"\bvmul[ps]h\b", (1, 16, 8, 4)),
              "gcc-aarch64-fp16": ("aarch64-linux-gnu-gcc", "armv8.2-a+fp16", ARM_FMA, r"\bfmul\s+h\d+,", (1, 4))}


def _cross_compile(cc: str, march: str, src: str, tmp: Path, *flags: str) -> subprocess.CompletedProcess:
  """src built by cc for -march=march with the CPU device's flags (less -march, -shared, -fPIC and OpenMP)."""
  from tinytune.runtime.cpu import FLAGS
  (tmp / "k.c").write_text(src)
  base = [f for f in FLAGS if not f.startswith("-march=") and f not in ("-shared", "-fPIC")]
  return subprocess.run([cc, *base, f"-march={march}", *flags, "k.c"], cwd=tmp, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("target", sorted(NATIVE_F16))
def test_float16_products_do_not_fuse_where_float16_is_native(target: str, tmp_path: Path) -> None:
  """Built for a CPU with float16 arithmetic (AVX512-FP16, ARMv8.2's FP16), the scalar and vector float16 kernels have no float16
  FMA in their assembly, and the scalar one does multiply in float16 (so the check means something)."""
  cc, march, fma, mul, widths = NATIVE_F16[target]
  if shutil.which(cc) is None: pytest.skip(f"{cc} is not installed")
  if _cross_compile(cc, march, "int x;\n", tmp_path, "-S", "-o", "k.s").returncode != 0: pytest.skip(f"{cc} does not know -march={march}")
  from tinytune.codegen.cstyle import CRenderer
  for width, kernel in rounding_kernels(rounding_case(dtypes.float16)[3], widths):
    res = _cross_compile(cc, march, CRenderer().render(kernel), tmp_path, "-S", "-o", "k.s")
    assert res.returncode == 0, res.stderr[-2000:]
    asm = (tmp_path / "k.s").read_text()
    assert not (fused := re.findall(f"^.*{fma}.*$", asm, re.M)), f"{width} lanes, {target}: {fused[:3]}"
    assert width > 1 or re.search(mul, asm), f"no float16 multiply for {target}: the check checks nothing"


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None or shutil.which("qemu-aarch64") is None,
                    reason="needs aarch64-linux-gnu-gcc and qemu-aarch64 (apt install gcc-aarch64-linux-gnu qemu-user)")
@pytest.mark.parametrize("march", ["armv8-a", "armv8.2-a+fp16"])  # the aarch64 target's; native on most ARM servers (float16 arithmetic)
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_16_bit_floats_round_each_op_on_aarch64(dtype: DType, march: str, tmp_path: Path) -> None:
  """The 16-bit float kernels built for aarch64 and run under qemu give NumPy's bits, scalar and in the aarch64 target's vector lanes
  (4)."""
  from tinytune.codegen.cstyle import CRenderer
  x, y, want, item = rounding_case(dtype)
  for width, kernel in rounding_kernels(item, (1, 4)):
    bufs = [item.out, *dict.fromkeys(kernel.bufs)]  # the kernel's arguments, read from stdin but the output
    sizes = [b.size * b.dtype.itemsize for b in bufs]
    main = ("\n#include <stdio.h>\nint main(void) {\n" + "".join(f"  static _Alignas(64) unsigned char b{i}[{n}];\n" for i, n in enumerate(sizes))
            + "".join(f"  if (fread(b{i}, 1, {n}, stdin) != {n}) return 1;\n" for i, n in enumerate(sizes) if i)
            + f"  {kernel.name}({', '.join(f'(void*)b{i}' for i in range(len(bufs)))});\n"
            + f"  return fwrite(b0, 1, {sizes[0]}, stdout) != {sizes[0]};\n}}\n")
    res = _cross_compile("aarch64-linux-gnu-gcc", march, CRenderer().render(kernel) + main, tmp_path, "-static", "-o", "k", "-lm")
    assert res.returncode == 0, res.stderr[-2000:]
    inputs = b"".join(b.numpy_view().tobytes() for b in bufs[1:])
    run = subprocess.run(["qemu-aarch64", "./k"], cwd=tmp_path, input=inputs, capture_output=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert not (bad := rounding_mismatch(width, x, y, want, np.frombuffer(run.stdout, dtype.np))), f"{march}, {bad}"

