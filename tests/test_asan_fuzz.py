"""The opt fuzzer's CPU kernels built with AddressSanitizer (tests/asan_fuzz.py), so an out-of-bounds access fails even where it
does not segfault: every catalog workload at odd sizes, a sequence of 3 opts per kernel (TT_FUZZ_SCALE=2: 8), in one process: each ASan build
takes 0.4 s, and the run with 2 per kernel took 51 s."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tinytune.runtime import device_status
from tinytune.runtime.cpu import compiler_version, find_compiler

SCRIPT = Path(__file__).with_name("asan_fuzz.py")


def libasan() -> str | None:
  """The ASan runtime of the CPU device's compiler (gcc's libasan.so; clang's is not preloadable this way), None where absent."""
  if device_status("CPU") is not None or "clang" in compiler_version(cc := find_compiler()): return None
  path = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
  return path if os.path.isabs(path) and os.path.exists(path) else None


def fuzz(tmp_path: Path, *args: str, sanitize: bool = True) -> subprocess.CompletedProcess:
  env = {**os.environ, "TINYTUNE_CACHE_DIR": str(tmp_path), "TINYTUNE_DEVICE": "CPU"}
  if sanitize: env.update(LD_PRELOAD=str(libasan()), ASAN_OPTIONS="detect_leaks=0")
  return subprocess.run([sys.executable, str(SCRIPT), *args, *([] if sanitize else ["--plain"])], capture_output=True, text=True, env=env,
                        timeout=300)


needs_asan = pytest.mark.skipif(libasan() is None, reason="no gcc with libasan for the CPU device here")


@needs_asan
def test_opt_sequences_stay_in_bounds(tmp_path: Path) -> None:
  per_kernel = "8" if int(os.getenv("TT_FUZZ_SCALE", "1")) >= 2 else "1"
  out = fuzz(tmp_path, "--per-kernel", per_kernel)
  assert out.returncode == 0 and "AddressSanitizer" not in out.stderr, out.stdout + out.stderr[-4000:]
  assert int(out.stdout.split()[1]) >= 40, out.stdout  # every workload's kernels were built and run


@needs_asan
def test_the_sanitizer_catches_a_write_past_the_end_that_the_plain_run_misses(tmp_path: Path) -> None:
  """A planted write one element past a softmax kernel's output: the plain run passes (it lands in the device's padding), the
  sanitized run fails with ASan's report."""
  plain = fuzz(tmp_path, "--plant", "--per-kernel", "1", "softmax", sanitize=False)
  assert plain.returncode == 0 and plain.stdout.startswith("built"), plain.stderr[-2000:]
  sanitized = fuzz(tmp_path, "--plant", "--per-kernel", "1", "softmax")
  assert sanitized.returncode != 0 and "ERROR: AddressSanitizer: heap-buffer-overflow" in sanitized.stderr, sanitized.stderr[-2000:]
