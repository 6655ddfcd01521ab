"""The CPU's C helper library, as C source that CRenderer puts before a kernel: float32 vector math (where, max, exp2, log2, sin and
sqrt by polynomials, in AVX-512 instructions where the target has them), float16 and bfloat16 vector loads, stores and rounding,
streaming stores, lane folds and bfloat16 dot pairs. Dialects (cstyle.py) hold only their tables; the math lives here."""
from __future__ import annotations

import math

import numpy as np

from tinytune.dtype import DType, dtypes


def _f32(x: float) -> str: return f"{float(np.float32(x))!r}f"


# 2**f on [-1/2, 1/2] to degree 6, 1 + f ln 2 + ...: a fit of the relative error on Chebyshev nodes (least squares reweighted
# toward the minimax), 2e-9 relative; rounded to float32 and evaluated by Horner in float32 it stays within 0.9 ulp
EXP2_POLY = [_f32(c) for c in (1.0, 0.6931471824645996, 0.24022647738456726, 0.055503323674201965, 0.009618437848985195,
                               0.0013398875016719103, 0.00015353327034972608)]
# sin and cos on [-pi/4, pi/4]: Taylor coefficients (-1)**k / (2k+1)! and (-1)**k / (2k)!; remainders under 3e-9 relative
SIN_POLY = [_f32((-1) ** j / math.factorial(2 * j + 1)) for j in range(5)]
COS_POLY = [_f32((-1) ** j / math.factorial(2 * j)) for j in range(6)]


def _split(x: float, bits: int) -> float:  # x cut to its leading `bits` significant bits
  return math.ldexp(math.floor(math.ldexp(x, bits - math.frexp(x)[1])), math.frexp(x)[1] - bits)


# pi/2 as hi + mid + lo in double, hi and mid with 30 significant bits so that q * hi and q * mid are exact for |q| < 2**12 (Cody and
# Waite); the reduction runs in double, so a result near a multiple of pi keeps its relative accuracy
PIO2_HI = _split(math.pi / 2, 30)
PIO2_MID = _split(math.pi / 2 - PIO2_HI, 30)
PIO2_LO = math.pi / 2 - PIO2_HI - PIO2_MID + math.sin(math.pi) / 2  # sin(fl(pi)) = pi - fl(pi) to double precision
SIN_BIG = 4096.0  # past this |x| each lane calls the C library's sinf, which reduces the argument exactly
# log2(m) = 2 atanh(s) / ln 2 with s = (m-1)/(m+1), |s| < 0.172 for m in [sqrt(1/2), sqrt(2)]: coefficients 2 / ((2j+1) ln 2) of s**(2j+1)
LOG2_POLY = [_f32(2 / ((2 * j + 1) * math.log(2))) for j in range(6)]
# AVX-512 (and AVX-512VL for 8 lanes): 2**n scales in one instruction (vscalefps, rounding once into the denormals), max and min
# are one each (vmaxps: a > b ? a : b, so b where either is NaN), a NaN-keeping max two (vmaxps where a is ordered, else a). gcc
# and clang name these builtins apart, and immintrin.h would add 0.2 s to every compile: lanes -> (the target's macros,
# {macro: (its gcc spelling, its clang spelling)})
_M16, _M8 = "(unsigned short)-1", "(unsigned char)-1"
_ORD16, _ORD8 = f"__builtin_ia32_cmpps512_mask(a, a, 7, {_M16}, 4)", f"__builtin_ia32_cmpps256_mask(a, a, 7, {_M8})"
AVX512 = {
  16: ("defined(__AVX512F__)", {
    "MAX": (f"__builtin_ia32_maxps512_mask(a, b, a, {_M16}, 4)", "__builtin_ia32_maxps512(a, b, 4)"),
    "MIN": (f"__builtin_ia32_minps512_mask(a, b, a, {_M16}, 4)", "__builtin_ia32_minps512(a, b, 4)"),
    "NANMAX": (f"__builtin_ia32_maxps512_mask(a, b, a, {_ORD16}, 4)", f"__builtin_ia32_selectps_512({_ORD16}, __builtin_ia32_maxps512(a, b, 4), a)"),
    "SCALEF": (f"__builtin_ia32_scalefps512_mask(a, b, a, {_M16}, 4)",) * 2}),
  8: ("defined(__AVX512F__) && defined(__AVX512VL__)", {
    "MAX": ("__builtin_ia32_maxps256(a, b)",) * 2, "MIN": ("__builtin_ia32_minps256(a, b)",) * 2,
    "NANMAX": (f"__builtin_ia32_maxps256_mask(a, b, a, {_ORD8})", f"__builtin_ia32_selectps_256({_ORD8}, __builtin_ia32_maxps256(a, b), a)"),
    "SCALEF": (f"__builtin_ia32_scalefps256_mask(a, b, a, {_M8})",) * 2})}
# AVX without AVX-512 (x86-64-v3): max and min are one instruction each too (the same spelling in gcc and clang), a NaN-keeping max
# three (vmaxps, then a blend back to a where it is unordered); 2**n stays two built factors. gcc 12 at x86-64-v3, a loop over vectors:
# exp2 30 -> 25 instructions a vector, a running max 10 -> 6; softmax 64x1024 (in L2, one thread) 0.051-0.054 -> 0.043-0.044 ms
AVX = {8: ("defined(__AVX__)", {"MAX": "__builtin_ia32_maxps256(a, b)", "MIN": "__builtin_ia32_minps256(a, b)",
                                 "NANMAX": "__builtin_ia32_blendvps256(__builtin_ia32_maxps256(a, b), a, __builtin_ia32_cmpps256(a, a, 3))"})}


# float16 <-> float32 in one instruction: lanes -> (the target's macro, float16 bits to float32, float32 to float16 bits rounded to nearest even)
HALF_CONVERT = {16: ("defined(__AVX512F__)", "__builtin_ia32_vcvtph2ps512_mask(h, (tt_f16){0}, (unsigned short)-1, 4)",
                     "__builtin_ia32_vcvtps2ph512_mask(x, 0, (tt_h16){0}, (unsigned short)-1)"),
                8: ("defined(__F16C__)", "__builtin_ia32_vcvtph2ps256(h)", "__builtin_ia32_vcvtps2ph256(x, 0)")}


# a non-temporal vector store (vmovntps: AVX-512's of a whole 64-byte line, AVX's of half of one, each where the address is aligned to
# it; elsewhere a plain store), and the fence after a thread's last one, so that its stores are visible once the kernel returns
STREAM_ISA = {16: ("defined(__AVX512F__)", "__builtin_ia32_movntps512"), 8: ("defined(__AVX__)", "__builtin_ia32_movntps256")}


def streaming_stores(w: int) -> str:
  """tt_f{w}_stream and tt_fence (see STREAM_ISA), for the vectors of `w` float32 lanes that have a non-temporal store."""
  if w not in STREAM_ISA: return ""
  isa, movnt = STREAM_ISA[w]
  return f"""#if {isa}
static inline void tt_f{w}_stream(float* p, tt_f{w} v) {{
  if ((__UINTPTR_TYPE__)p % {4 * w}) tt_f{w}_store(p, v);
#ifdef __clang__
  else __builtin_nontemporal_store(v, (tt_f{w}*)p);
#else
  else {movnt}(p, v);
#endif
}}
#define tt_fence() __builtin_ia32_sfence()
#else
#define tt_f{w}_stream tt_f{w}_store
#define tt_fence()
#endif
"""


def horner(x: str, coeffs: list[str]) -> str:
  p = coeffs[-1]
  for c in reversed(coeffs[:-1]): p = f"({p})*{x}+{c}"
  return f"({p})"


def max_exp2(fp: str, w: int) -> str:
  """max (a NaN in either operand wins) and 2**x (2**round(x) times a polynomial of the rest) on vectors of `w` float32 lanes, in
  AVX-512 or AVX instructions where the target has them: every way computes the same bits (exp2 scales the polynomial exactly by
  2**round(x), rounding once)."""
  F, I, U = f"tt_f{w}", f"tt_i{w}", f"tt_u{w}"
  p = horner("f", EXP2_POLY)
  def splat(v: str) -> str: return f"({F}){{{', '.join([v] * w)}}}"
  head = f"{fp} {F} tt_exp2{w}({F} x) {{\n  {F} lo = {splat('-160.0f')}, hi = {splat('130.0f')};  /* beyond these 2**x is 0 or inf */\n"
  clamp = f"  {F} xc = TT_MIN{w}(hi, TT_MAX{w}(lo, x));  /* x where it is NaN: the polynomial and the scaling pass it on */\n"
  round_ = f"  {F} n = (xc + 12582912.0f) - 12582912.0f, f = xc - n;  /* n = round(x) by the 1.5*2**23 trick, |f| <= 1/2 */\n"
  scale = f"""  {I} ni = __builtin_convertvector(n, {I}), h = ni >> 1;  /* 2**n in two factors, each a normal float, so denormal results round once */
  {F} r = {p} * ({F})(({U})(h + 127) << 23) * ({F})(({U})(ni - h + 127) << 23);
"""
  generic = f"""{fp} {F} tt_max{w}({F} a, {F} b) {{ return tt_where{w}((a > b) | (a != a), a, b); }}
{head}  {F} xc = tt_where{w}(x < lo, lo, tt_where{w}(x > hi, hi, x));
{round_}{scale}  return tt_where{w}(x != x, x, r);
}}
"""
  if w not in AVX512: return generic
  target, macros = AVX512[w]
  nanmax = f"{fp} {F} tt_max{w}({F} a, {F} b) {{ return TT_NANMAX{w}(a, b); }}\n"  # AVX-512's and AVX's: the same name, their own macro
  def define(i: int) -> str: return "".join(f"#define TT_{m}{w}(a, b) {spellings[i]}\n" for m, spellings in macros.items())
  ret = f"""#if {target}
#ifdef __clang__
{define(1)}#else
{define(0)}#endif
{nanmax}{head}{clamp}  {F} n = (xc + 12582912.0f) - 12582912.0f, f = xc - n, p = {p};
  return TT_SCALEF{w}(p, n);
}}
"""
  if w in AVX:
    target, spelled = AVX[w]
    ret += f"#elif {target}\n" + "".join(f"#define TT_{m}{w}(a, b) {spelling}\n" for m, spelling in spelled.items())
    ret += f"{nanmax}{head}{clamp}{round_}{scale}  return r;\n}}\n"
  return ret + f"#else\n{generic}#endif\n"


def vector_math(fp: str, width: int) -> str:
  """Float32 math on GCC/clang vectors of `width` lanes that the compiler keeps in vector registers: where (select by a mask of
  -1 and 0 lanes), max (a NaN in either operand wins), exp2, log2, sin and sqrt (inf, NaN, zero and denormal inputs as NumPy has them).
  Width 0: scalar versions (tt_exp2s, ...) computed the same way on one-lane vectors, so every lane and scalar agree."""
  w, scalar_fp = width or 1, fp
  # one-lane vectors are passed in memory: a call that is not inlined pushed its argument, and gcc 12 never popped it inside a
  # long unrolled loop, so the thread's stack overflowed (softmax 1024^2 with UPCAST 1 32, UPCAST 0 8, UNROLL 0 8, SWAP)
  if width == 0: fp += " __attribute__((always_inline))"
  F, I, U, D = f"tt_f{w}", f"tt_i{w}", f"tt_u{w}", f"tt_d{w}"
  def splat(v: str) -> str: return f"({F}){{{', '.join([v] * w)}}}"
  types = (f"typedef float {F} __attribute__((vector_size({4 * w})));\n" if width == 0 else "") + \
    f"typedef int {I} __attribute__((vector_size({4 * w})));\ntypedef unsigned int {U} __attribute__((vector_size({4 * w})));\n" \
    f"typedef double {D} __attribute__((vector_size({8 * w})));\n"
  code = types + f"""\
{fp} {F} tt_where{w}({I} m, {F} a, {F} b) {{ return ({F})((({I})a & m) | (({I})b & ~m)); }}
{fp} {F} tt_sqrt{w}({F} x) {{ {F} r; for (int i = 0; i < {w}; i++) r[i] = __builtin_sqrtf(x[i]); return r; }}
{max_exp2(fp, w)}{fp} {F} tt_log2{w}({F} x) {{
  {I} sub = x < 1.17549435e-38f;  /* denormals (and zero, negatives) scaled by 2**23 first */
  {I} b = ({I})tt_where{w}(sub, x * 8388608.0f, x);
  {I} e = ((b >> 23) & 0xff) - 127 - (sub & 23);
  {F} m = ({F})((b & 0x7fffff) | 0x3f800000);  /* x = m 2**e, m in [1, 2) */
  {I} big = m > 1.41421356f;
  m = tt_where{w}(big, m * 0.5f, m);
  e = e - big;
  {F} s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
  {F} r = __builtin_convertvector(e, {F}) + s * ({horner("s2", LOG2_POLY)});
  {F} zero = {splat("0.0f")}, inf = {splat("__builtin_inff()")};
  r = tt_where{w}(x == zero, -inf, tt_where{w}(x == inf, x, r));
  return tt_where{w}((x < zero) | (x != x), {splat('__builtin_nanf("")')}, r);
}}
{fp} {F} tt_sin{w}({F} x) {{
  {F} q = (x * 0.636619772f + 12582912.0f) - 12582912.0f;  /* the nearest multiple of pi/2 */
  {D} qd = __builtin_convertvector(q, {D});
  {F} r = __builtin_convertvector(((__builtin_convertvector(x, {D}) - qd * {PIO2_HI!r}) - qd * {PIO2_MID!r}) - qd * {PIO2_LO!r}, {F}), r2 = r * r;
  {F} s = r + r * r2 * ({horner("r2", SIN_POLY[1:])}), c = {horner("r2", COS_POLY)};
  {I} n = __builtin_convertvector(q, {I});
  {F} ret = tt_where{w}(((n & 1) != 0), c, s);
  ret = tt_where{w}(((n & 2) != 0), -ret, ret);
  {I} big = (x > {SIN_BIG}f) | (x < -{SIN_BIG}f);
  int any = 0;
  for (int i = 0; i < {w}; i++) any |= big[i];
  if (any) for (int i = 0; i < {w}; i++) if (big[i]) ret[i] = __builtin_sinf(x[i]);
  return tt_where{w}(x != x, x, tt_where{w}((x == {splat("__builtin_inff()")}) | (x == -{splat("__builtin_inff()")}), x - x, ret));
}}
"""
  if width == 0:
    code += "".join(f"{scalar_fp} float tt_{f}s(float x) {{ {F} v = {{x}}; return tt_{f}1(v)[0]; }}\n" for f in ("exp2", "log2", "sqrt", "sin"))
    code += f"{scalar_fp} float tt_maxs(float a, float b) {{ {F} x = {{a}}, y = {{b}}; return tt_max1(x, y)[0]; }}\n"  # no branch to mispredict
  return code


# AVX512_BF16's vcvtneps2bf16 rounds float32 lanes to bfloat16 (to nearest even) but reads subnormals as zero and keeps a NaN's
# payload: vectors with neither (vfpclassps: 0x01 quiet NaN, 0x20 subnormal, 0x80 signalling NaN) take it, the rest the integer code
BF16_ROUND = {16: ("defined(__AVX512BF16__) && defined(__AVX512DQ__)", "__builtin_ia32_fpclassps512_mask(x, 0xa1, (unsigned short)-1)"),
              8: ("defined(__AVX512BF16__) && defined(__AVX512DQ__) && defined(__AVX512VL__)",
                  "__builtin_ia32_fpclassps256_mask(x, 0xa1, (unsigned char)-1)")}


def half_vectors(fp: str, w: int, used: set[DType]) -> str:
  """float16 and bfloat16 buffers read into and written from float32 vectors of `w` lanes, and a float32 vector rounded to either
  (to nearest even; a NaN to bfloat16 is the quiet NaN of its sign, as the scalar code has it). One op in float32 rounded to a
  16-bit float is that op in the 16-bit float: float32's 24 bits are at least twice its bits plus 2. The lanes of a 16-bit float
  vector hold values of its type (loaded, or rounded by the op that made them), so a store only narrows them."""
  F, U, H, fast = f"tt_f{w}", f"tt_u{w}", f"tt_h{w}", HALF_CONVERT.get(w)
  code = (f"typedef short {H} __attribute__((vector_size({2 * w})));\n"  # {H}_u: stored as {F}_store is (see CRenderer.vector_prelude)
          f"typedef short {H}_u __attribute__((vector_size({2 * w}), aligned(2), may_alias));\n") if used & {dtypes.float16, dtypes.bfloat16} else ""
  if dtypes.float16 in used:  # AVX-512F converts 16 lanes in an instruction, F16C 8; elsewhere the compiler's conversion
    generic = (f"typedef _Float16 tt_hf{w} __attribute__((vector_size({2 * w})));\n"
               f"{fp} {F} tt_up{w}({H} h) {{ return __builtin_convertvector((tt_hf{w})h, {F}); }}\n"
               f"{fp} {H} tt_down{w}({F} x) {{ return ({H})__builtin_convertvector(x, tt_hf{w}); }}\n")
    code += generic if fast is None else f"""#if {fast[0]}
{fp} {F} tt_up{w}({H} h) {{ return {fast[1]}; }}
{fp} {H} tt_down{w}({F} x) {{ return {fast[2]}; }}
#else
{generic}#endif
"""
    code += (f"{fp} {F} {F}_load_f16(const _Float16* p) {{ {H} h; __builtin_memcpy(&h, p, sizeof h); return tt_up{w}(h); }}\n"
             f"{fp} void {F}_store_f16(_Float16* p, {F} x) {{ *({H}_u*)p = tt_down{w}(x); }}\n"
             f"{fp} {F} {F}_round_f16({F} x) {{ return tt_up{w}(tt_down{w}(x)); }}\n")
  if dtypes.bfloat16 in used:  # a bfloat16 is a float32's high half: its lanes go to and from the odd shorts (one permute)
    W, widen = f"tt_w{w}", f"__builtin_shufflevector(z, h, {', '.join(f'{i}, {w + i}' for i in range(w))})"
    fast_round = "" if w not in BF16_ROUND else f"""
#if {BF16_ROUND[w][0]}
  if (!{BF16_ROUND[w][1]}) {{  /* no NaN or subnormal lane: the instruction rounds the rest to nearest even */
    {H} h, z = {{0}};
    __asm__("vcvtneps2bf16 %1, %0" : "=v"(h) : "v"(x));
    return ({F}){widen};
  }}
#endif"""
    code += f"""typedef short {W} __attribute__((vector_size({4 * w})));
{fp} {F} {F}_load_bf16(const unsigned short* p) {{
  {H} h, z = {{0}};
  __builtin_memcpy(&h, p, sizeof h);
  return ({F}){widen};
}}
{fp} {F} {F}_round_bf16({F} x) {{{fast_round}
  {U} u = ({U})x, nan = ({U})((u & 0x7fffffffu) > 0x7f800000u);
  return ({F})(((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u & ~nan) | (((u & 0x80000000u) | 0x7fc00000u) & nan));
}}
{fp} void {F}_store_bf16(unsigned short* p, {F} x) {{  /* x's lanes are bfloat16 values: each op rounded them */
  {W} r = ({W})x;
  *({H}_u*)p = __builtin_shufflevector(r, r, {', '.join(str(2 * i + 1) for i in range(w))});
}}
"""
  return code


# the CPU's TC: AVX512_BF16's vdpbf16ps adds two bfloat16 products into each float32 lane (exact products, denormals flushed). The
# builtins of the compilers tested, whose operand types later versions changed (to __bf16 vectors); elsewhere the instruction in
# assembly (which cannot fold A's broadcast into it: 10% slower); without the instruction, the same sum in float32
DOT = {16: ("__builtin_ia32_dpbf16ps_v16sf(acc, a, b)", "__builtin_ia32_dpbf16ps_512(acc, (tt_i16)a, (tt_i16)b)", "defined(__AVX512BF16__)"),
       8: ("__builtin_ia32_dpbf16ps_v8sf(acc, a, b)", "__builtin_ia32_dpbf16ps_256(acc, (tt_i8)a, (tt_i8)b)",
           "defined(__AVX512BF16__) && defined(__AVX512VL__)")}


def fold_functions(fp: str, w: int) -> str:
  """tt_fold_add{w} and tt_fold_max{w}: of `w` vectors, the vector whose lane j folds vector j's lanes. Each step combines pairs of
  vectors that hold blocks of lanes of as many vectors, the low half of every block beside the high half: blocks half as wide,
  twice as many. Blocks of 128 bits or more move whole (vshuff32x4 and the like), smaller ones within each 128 bits (vshufps):
  shuffles by constants, none by an index vector held in a register (gcc kept those live through the reduce loop before, short of
  registers for its loads). Which vector's fold ends in which lane follows; the inputs go in so that vector j's is lane j."""
  owner, c, steps = [[i] * w for i in range(w)], w, []  # owner: for each vector of the step, the input each lane holds part of
  while c > 1:
    if c > 4:  # x's blocks, then y's, each block's halves whole 128-bit lanes or more
      lo = [b * c + i for b in range(w // c) for i in range(c // 2)]
      lo += [w + x for x in lo]
    else:  # within each 128 bits: x's halves of its blocks there, then y's
      lo = [q * 4 + b * c + i + side * w for q in range(w // 4) for side in (0, 1) for b in range(4 // c) for i in range(c // 2)]
    hi = [x + c // 2 for x in lo]
    steps.append((lo, hi))
    pairs = list(zip(owner[::2], owner[1::2]))
    owner = [[(x + y)[i] for i in lo] for x, y in pairs]
    assert owner == [[(x + y)[i] for i in hi] for x, y in pairs]  # each lane adds two parts of one input
    c //= 2
  slot = {o: j for j, o in enumerate(owner[0][k] for k in range(w))}  # input slot -> the vector that goes in it
  out = ""
  for name, fn in (("add", "{}+{}"), ("max", f"tt_max{w}({{}}, {{}})")):
    vs, lines = [f"v[{slot[i]}]" for i in range(w)], []
    for n, (lo, hi) in enumerate(steps):
      nxt = [f"s{n}_{i // 2}" for i in range(0, len(vs), 2)]
      for i, x in zip(range(0, len(vs), 2), nxt):
        pick = [f"__builtin_shufflevector({vs[i]}, {vs[i + 1]}, {', '.join(map(str, idx))})" for idx in (lo, hi)]
        lines.append(f"  tt_f{w} {x} = {fn.format(*pick)};")
      vs = nxt
    out += f"{fp} tt_f{w} tt_fold_{name}{w}(const tt_f{w}* v) {{\n" + "\n".join(lines) + f"\n  return {vs[0]};\n}}\n"
  return out


def dot_pairs(fp: str, w: int) -> str:
  """bfloat16 pairs in vectors of `w` lanes (a pair in each 32-bit lane: two neighbours or two elements in every lane, two rows'
  elements interleaved, or neighbours) and acc += the products of two of them, lane by lane."""
  F, U, H, P = f"tt_f{w}", f"tt_u{w}", f"tt_h{w}", f"tt_p{w}"
  generic = f"  {U} x = ({U})a, y = ({U})b;\n  return acc + ({F})(x << 16) * ({F})(y << 16) + ({F})(x & 0xffff0000u) * ({F})(y & 0xffff0000u);\n"
  if w in DOT:
    gcc, clang, target = DOT[w]
    asm = '  __asm__("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));\n  return acc;\n'
    generic = f"""#if {target} && !defined(__clang__) && __GNUC__ >= 10 && __GNUC__ <= 12
  return {gcc};
#elif {target} && defined(__clang__) && __clang_major__ >= 9 && __clang_major__ <= 14
  return {clang};
#elif {target}
{asm}#else
{generic}#endif
"""
  return f"""typedef short {P} __attribute__((vector_size({4 * w})));
{fp} {P} tt_rows{w}(const unsigned short* p, const unsigned short* q) {{
  {H} a, b;
  __builtin_memcpy(&a, p, sizeof a);
  __builtin_memcpy(&b, q, sizeof b);
  return __builtin_shufflevector(a, b, {', '.join(f'{i}, {w + i}' for i in range(w))});
}}
{fp} {P} tt_splat{w}(const unsigned short* p) {{
  unsigned int u;
  __builtin_memcpy(&u, p, 4);
  return ({P})({U}){{{', '.join(['u'] * w)}}};
}}
{fp} {P} tt_splat2{w}(const unsigned short* p, const unsigned short* q) {{
  unsigned int u = *p | (unsigned int)*q << 16;
  return ({P})({U}){{{', '.join(['u'] * w)}}};
}}
{fp} {P} tt_neighbours{w}(const unsigned short* p) {{ {P} r; __builtin_memcpy(&r, p, sizeof r); return r; }}
{fp} {F} tt_dot{w}({F} acc, {P} a, {P} b) {{
{generic}}}
"""


def vector_library(fp: str, width: int, used: set[DType]) -> str:
  """What a program with vectors of `width` float32 lanes may call: the vector math, streaming stores (16 lanes; the 8 lanes' where a
  program streams, see CRenderer.program_prelude) and the conversions of the 16-bit floats in `used`."""
  return vector_math(fp, width) + (streaming_stores(width) if width == 16 else "") + half_vectors(fp, width, used)
