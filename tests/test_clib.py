"""The CPU's C helper library (codegen/clib.py) on its own: each helper compiled with the CPU's flags, with and without the
instructions it has a fast path for, and run on edge values against NumPy."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest

from tinytune.codegen.clib import dot_pairs, fold_functions, streaming_stores, vector_math
from tinytune.codegen.cstyle import CRenderer
from tinytune.dtype import dtypes
from tinytune.runtime.cpu import FLAGS, cpuinfo

FP = "static inline"
EDGES = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-40, 1.1754942e-38, 1.1754944e-38, 1.0, -1.0, 2.0, 0.5, 1.0000001,
                  0.99999994, 127.99, 128.0, 128.5, -126.0, -149.0, -149.5, -150.0, -151.0, -1e30, 1e30, 3.4028235e38, -3.4028235e38,
                  np.pi, -np.pi / 2, 4095.9, 4096.5, -1e4, 1e4], np.float32)
WIDTHS = (0, 4, 8, 16)  # 0: the scalar versions
MATH = {"exp2": (np.exp2, 1), "log2": (np.log2, 3), "sin": (np.sin, 2), "sqrt": (np.sqrt, 0)}  # NumPy's function, the most ulps off
NO_AVX512 = ["-mno-avx512f"]
NO_AVX = ["-mno-avx512f", "-U__AVX__"]  # the generic code at 8 lanes, still with FMAs (-mno-avx would drop them and round otherwise)


def build(tmp_path: Path, src: str, name: str, extra: Sequence[str] = (), cc: str = "gcc") -> ctypes.CDLL:
  if shutil.which(cc) is None: pytest.skip(f"needs {cc}")
  (tmp_path / f"{name}.c").write_text(src)
  subprocess.run([cc, *FLAGS, *extra, f"{name}.c", "-o", f"{name}.so"], cwd=tmp_path, check=True)
  return ctypes.CDLL(str(tmp_path / f"{name}.so"))


def call(fn: Any, *arrays: np.ndarray) -> None: fn(*(a.ctypes.data_as(ctypes.c_void_p) for a in arrays), ctypes.c_int(arrays[0].size))


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
  """float32 ulps from the float64 `want`; 0 where `want` rounds to `got` (infinities, NaNs of any payload)."""
  with np.errstate(invalid="ignore", over="ignore"):
    same = (got == want.astype(np.float32)) | (np.isnan(got) & np.isnan(want))
    ret = np.abs(got.astype(np.float64) - want) / np.spacing(np.maximum(np.abs(want.astype(np.float32)), np.float32(1e-45)))
  return np.where(same, 0.0, np.where(np.isfinite(ret), ret, np.inf))


def math_source() -> str:
  """f_{name}{w}(x, y, n): y = name(x) in vectors of w lanes (0: the scalar version), and f_max{w}(x, y, z, n): z = max(x, y)."""
  src = vector_math(FP, 0)
  for w in WIDTHS[1:]: src += f"typedef float tt_f{w} __attribute__((vector_size({4 * w})));\n" + vector_math(FP, w)
  for w in WIDTHS:
    step, F = max(w, 1), f"tt_f{max(w, 1)}"
    def loop(name: str, args: str, body: str) -> str:
      return f"void f_{name}{w}({args}, int n) {{ for (int i = 0; i < n; i += {step}) {{ {body} }} }}\n"
    for f in MATH:
      src += loop(f, "const float* x, float* y", f"y[i] = tt_{f}s(x[i]);" if w == 0 else
                  f"{F} v; __builtin_memcpy(&v, x + i, sizeof v); v = tt_{f}{w}(v); __builtin_memcpy(y + i, &v, sizeof v);")
    src += loop("max", "const float* x, const float* y, float* z", "z[i] = tt_maxs(x[i], y[i]);" if w == 0 else
                f"{F} a, b; __builtin_memcpy(&a, x + i, sizeof a); __builtin_memcpy(&b, y + i, sizeof b); a = tt_max{w}(a, b); "
                f"__builtin_memcpy(z + i, &a, sizeof a);")
  return src


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_vector_math_matches_numpy_in_every_width(cc: str, tmp_path: Path) -> None:
  """exp2, log2, sin, sqrt and max in scalars and in 4, 8 and 16 lanes (AVX-512's instructions, AVX's and the generic code) compute the
  same bits, within an ulp of float64 NumPy rounded to float32 (sqrt exactly), with NumPy's infinities, NaNs, zeros and denormals;
  max lets a NaN in either operand win."""
  rng = np.random.default_rng(0)
  x = np.concatenate([EDGES, rng.uniform(-160, 140, 2048), rng.uniform(-8, 8, 2048), np.exp2(rng.uniform(-149, 127, 2048)),
                      rng.uniform(-5000, 5000, 2048 - EDGES.size)]).astype(np.float32)
  y = np.ascontiguousarray(x[::-1])
  outs = {}
  for extra in ([], NO_AVX512, NO_AVX):
    lib = build(tmp_path, math_source(), f"math{len(extra)}", extra, cc)
    for w in WIDTHS:
      for f in MATH:
        outs[f, w, len(extra)] = out = np.empty_like(x)
        call(getattr(lib, f"f_{f}{w}"), x, out)
      outs["max", w, len(extra)] = out = np.empty_like(x)
      call(getattr(lib, f"f_max{w}"), x, y, out)
  for f, (ref, most) in MATH.items():
    with np.errstate(all="ignore"): want = ref(x.astype(np.float64))
    got = outs[f, 0, 0]
    assert all((o.view(np.uint32) == got.view(np.uint32)).all() for (g, _, _), o in outs.items() if g == f), f"{f}: lanes differ"
    bad = ulps(got, want) > most
    assert not bad.any(), f"{f}({x[bad][:4]}) = {got[bad][:4]}, NumPy: {want[bad][:4]}"
  want = np.where(np.isnan(x) | np.isnan(y), np.nan, np.maximum(x, y))
  sign = np.where(x > y, np.signbit(x), np.signbit(y))  # of two zeros, the second
  assert all(((o == want) | (np.isnan(o) & np.isnan(want))).all() and (np.signbit(o) == sign)[~np.isnan(want)].all()
             for (g, _, _), o in outs.items() if g == "max")


@pytest.mark.parametrize("w", [4, 8, 16])
def test_half_vectors_round_load_and_store_as_numpy(w: int, tmp_path: Path) -> None:
  """float16 and bfloat16 vectors of w lanes, with the CPU's conversion instructions and without: a float32 rounds to each as NumPy
  and ml_dtypes round it (to nearest even, ties, overflow to inf, subnormals; a NaN to bfloat16 the quiet NaN of its sign), and a
  store then a load give back the rounded values."""
  src = CRenderer().vector_prelude(w, {dtypes.float16, dtypes.bfloat16})
  for h, t in (("f16", "_Float16"), ("bf16", "unsigned short")):
    src += (f"void round_{h}(const float* x, float* y, {t}* s, float* z, int n) {{ for (int i = 0; i < n; i += {w}) {{\n"
            f"  tt_f{w} v = tt_f{w}_load(x + i), r = tt_f{w}_round_{h}(v); tt_f{w}_store(y + i, r);\n"
            f"  tt_f{w}_store_{h}(s + i, r); tt_f{w}_store(z + i, tt_f{w}_load_{h}(s + i)); }} }}\n")
  rng = np.random.default_rng(w)
  bits = np.concatenate([rng.integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32),  # every kind of float32, and ties of both
                         (rng.integers(0, 2 ** 15, 1024, dtype=np.uint32) << 16) | 0x8000,
                         (rng.integers(0, 2 ** 19, 1024, dtype=np.uint32) << 13) | 0x1000])
  x = np.concatenate([EDGES, bits.view(np.float32), rng.uniform(-70000, 70000, 1024).astype(np.float32)])
  x = np.resize(x, x.size // 16 * 16).astype(np.float32)
  x[:64] = np.resize(EDGES, 64)  # vectors with a NaN or subnormal lane and vectors without
  x[64:128] = np.resize(np.array([1.0, 65504.0, 65520.0, -1.00390625, 1.01171875, 3.4e38], np.float32), 64)
  for extra in ([], NO_AVX512 + ["-mno-f16c"]):
    lib = build(tmp_path, src, f"half{len(extra)}", extra)
    for h, np_dtype in (("f16", np.float16), ("bf16", dtypes.bfloat16.np)):
      y, z, s = np.empty_like(x), np.empty_like(x), np.zeros(x.size, np.uint16)
      getattr(lib, f"round_{h}")(*(a.ctypes.data_as(ctypes.c_void_p) for a in (x, y, s, z)), ctypes.c_int(x.size))
      with np.errstate(all="ignore"): want = x.astype(np_dtype)
      nan = np.isnan(x)
      np.testing.assert_array_equal(y[~nan], want.astype(np.float32)[~nan], err_msg=f"{h} {extra}")
      assert np.isnan(y[nan]).all() and np.isnan(z[nan]).all()
      np.testing.assert_array_equal(z[~nan], y[~nan])
      if h == "bf16": assert (s[nan] == np.where(np.signbit(x[nan]), 0xffc0, 0x7fc0)).all()
      else: assert (s[~nan] == want[~nan].view(np.uint16)).all()


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_lane_folds_put_each_vectors_fold_in_its_lane(cc: str, tmp_path: Path) -> None:
  """tt_fold_add and tt_fold_max of 16, 8 and 4 vectors (LANES accumulators after their loop, as many at once as a vector has
  lanes): lane j holds vector j's sum (to float32 rounding, in another order) or max (exactly; a NaN wins), built by gcc and clang."""
  src = "".join(f"typedef float tt_f{w} __attribute__((vector_size({4 * w})));\n" + vector_math(FP, w) + fold_functions(FP, w) +
                f"void f{w}(const float* x, float* s, float* m) {{ tt_f{w} v[{w}], r; __builtin_memcpy(v, x, sizeof v);\n"
                f"  r = tt_fold_add{w}(v); __builtin_memcpy(s, &r, sizeof r); r = tt_fold_max{w}(v); __builtin_memcpy(m, &r, sizeof r); }}\n"
                for w in (16, 8, 4))
  lib = build(tmp_path, src, "fold", cc=cc)
  for w in (16, 8, 4):
    x = np.random.default_rng(w).standard_normal((w, w)).astype(np.float32)
    x[1, 3] = np.nan
    s, m = np.empty(w, np.float32), np.empty(w, np.float32)
    getattr(lib, f"f{w}")(*(a.ctypes.data_as(ctypes.c_void_p) for a in (x, s, m)))
    np.testing.assert_allclose(s, x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(m, x.max(1))


@pytest.mark.parametrize("cc", ["gcc", "clang"])
@pytest.mark.parametrize("w", [8, 16])
def test_streaming_stores_write_every_line(w: int, cc: str, tmp_path: Path) -> None:
  """tt_f{w}_stream stores a vector where the address is aligned to it (non-temporally, with AVX-512 at 16 lanes, AVX at 8) and where
  it is not, built by gcc and clang; without those instructions it is a plain store."""
  src = CRenderer().vector_prelude(w, set())
  if w == 16: assert streaming_stores(16) in src  # every 16-lane program has it; an 8-lane one where it streams (program_prelude)
  else: src += streaming_stores(w)
  src += f"void f(const float* x, float* y, int n) {{ for (int i = 0; i < n; i += {w}) tt_f{w}_stream(y + i, tt_f{w}_load(x + i)); tt_fence(); }}\n"
  x = np.random.default_rng(0).standard_normal(1024).astype(np.float32)
  for extra in ([], NO_AVX512 if w == 16 else NO_AVX):
    fn = build(tmp_path, src, f"stream{len(extra)}", extra, cc).f
    for skew in (0, 1, 8):
      raw = np.zeros(x.size + 32, np.float32)
      out = raw[(-raw.ctypes.data % 64) // 4 + skew:][:x.size]
      call(fn, x, out)
      np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize("w", [8, 16])
def test_dot_pairs_add_bfloat16_products(w: int, tmp_path: Path) -> None:
  """tt_dot{w} adds two rows' bfloat16 products into each float32 lane (vdpbf16ps, or float32 math without AVX512_BF16); tt_rows
  interleaves two rows, tt_splat2 repeats a pair of two elements, tt_splat a pair of neighbours, tt_neighbours loads pairs."""
  src = f"typedef float tt_f{w} __attribute__((vector_size({4 * w})));\ntypedef int tt_i{w} __attribute__((vector_size({4 * w})));\n"
  src += f"typedef unsigned int tt_u{w} __attribute__((vector_size({4 * w})));\ntypedef short tt_h{w} __attribute__((vector_size({2 * w})));\n"
  src += dot_pairs(FP, w) + f"""
void rows(const unsigned short* a, const unsigned short* b, float* out, int n) {{  /* out[j] = a[0] b[0][j] + a[1] b[1][j] */
  tt_f{w} acc = {{0}};
  acc = tt_dot{w}(acc, tt_splat2{w}(a, a + 1), tt_rows{w}(b, b + {w}));
  acc = tt_dot{w}(acc, tt_splat{w}(a + 2), tt_neighbours{w}(b + 2 * {w}));
  __builtin_memcpy(out, &acc, sizeof acc);
}}
"""
  rng = np.random.default_rng(w)
  a = rng.standard_normal(4).astype(dtypes.bfloat16.np)
  b = rng.standard_normal(4 * w).astype(dtypes.bfloat16.np)
  a64, b64 = a.astype(np.float64), b.astype(np.float64).reshape(4, w)
  want = np.empty(w)
  want[:] = a64[0] * b64[0] + a64[1] * b64[1]
  pairs = b64[2:].reshape(-1)  # tt_neighbours: lane j holds elements 2j and 2j+1 of the two rows after
  want += a64[2] * pairs[0::2] + a64[3] * pairs[1::2]
  flags = cpuinfo().get("flags", "").split()
  for extra in ([], ["-mno-avx512bf16"]) if "avx512_bf16" in flags else ([],):
    out = np.empty(w, np.float32)
    build(tmp_path, src, f"dot{len(extra)}", extra).rows(a.ctypes.data_as(ctypes.c_void_p), b.ctypes.data_as(ctypes.c_void_p),
                                                        out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(w))
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6, err_msg=str(extra))
