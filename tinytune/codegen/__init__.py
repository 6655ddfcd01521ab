"""Kernels, opts, heuristics and renderers."""
from __future__ import annotations

# Bump when a change to lowering or rendering can change what a given list of opts produces: tuned opts are
# stored per code generator version, so old entries are never applied to code they were not measured on.
# 2: GPU renderers, MAX keeps NaNs, gcc without loop if-conversion, size-0 loops; 3: bfloat16, 16-bit constants rounded;
# 4: the C renderer's inline vector math (exp2, log2, sqrt, max, where, comparisons in SIMD lanes), lanes past size-1 dims, 8-wide vectors
# 5: LANES (a reduce's partial accumulators in SIMD lanes); row reduces default to it, threads by estimated time
# 6: masked-out view pieces dropped (Winograd's stacks); KBLOCK (K blocks outside the output loops, the sums so far kept in the
#    output), and the heuristics' K blocks for large matmuls
# 7: exp2's polynomial of degree 6 (a fit, was Taylor's of degree 7); on AVX-512 it clamps and scales in single instructions;
#    the CPU keeps a row statistic's transcendental source in an array of the row (softmax's exps computed once); a chain of
#    statistics over the same dims in one kernel; AVX-512 max in two instructions
# 8: STREAM (the CPU's whole-line output stores past the caches, a fence per thread); Winograd's stacks leave room for 16 lanes;
#    column sums past the caches in K blocks of 8 rows
# 9: float16 and bfloat16 in the C renderer's float32 vector lanes (converting loads and stores, each op rounded), their scalar
#    math as the lanes'; a row of a 16-bit float statistic's source kept before its widening cast; tiles copied across rows
#    (transposes) compiled without gcc's loop vectorizer
# 10: TC on CPUs with AVX512_BF16 (bfloat16 matmuls' K in pairs, vdpbf16ps), first in their default opts; x @ W.T with a long K
#     as dot products along K (LANES); a reduce's kernel takes along the elementwise work after it that nothing else reads
# 11: bfloat16 rounding in vector lanes through AVX512_BF16's vcvtneps2bf16 where no lane is a NaN or subnormal
# 12: STREAM on AVX2 (two 8-lane non-temporal stores a line); the CPU's index checks kept in a register per thread; PACK 1 (B's K
#     block copied outside the row loop); index math without the parts a factor of the divisor keeps below it; padded copies of
#     computed values indexed by the source's own dims; comparison masks kept as vectors
CODEGEN_VERSION = "12"
