"""Kernels, opts, heuristics and renderers."""
from __future__ import annotations

# Bump when a change to lowering or rendering can change what a given list of opts produces: tuned opts are
# stored per code generator version, so old entries are never applied to code they were not measured on.
CODEGEN_VERSION = "3"  # 2: GPU renderers, MAX keeps NaNs, gcc without loop if-conversion, size-0 loops; 3: bfloat16, 16-bit constants rounded
