"""Kernel identity, the compile cache and debug output."""
from __future__ import annotations

import subprocess
import sys

from tinytune import Context, Device, Kernel, Tensor, dtypes, engine
from tinytune.engine import compile_kernel
from tinytune.runtime import cpu

KEY_SCRIPT = """
from tinytune import Tensor, engine
a, b = Tensor.rand({m}, 32).realize(), Tensor.rand(32, 16).realize()
print(engine.kernels(((a @ b).relu() + 1).uop, 'CPU')[0][1].key)
"""


def kernel_of(t: Tensor) -> Kernel:
  return engine.kernels(t.uop, t.device)[-1][1]


def keys_in_subprocesses(*ms: int) -> list[str]:
  """The kernel's key for each m, each in a fresh process; the processes run together."""
  procs = [subprocess.Popen([sys.executable, "-c", KEY_SCRIPT.format(m=m)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for m in ms]
  outs = [p.communicate(timeout=120) for p in procs]
  assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
  return [out.strip() for out, _ in outs]


def test_key_is_stable_across_processes() -> None:
  first, again, other = keys_in_subprocesses(8, 8, 12)
  assert first == again and first != other


def test_key_ignores_buffers_but_not_shapes_strides_dtypes() -> None:
  a, b = Tensor.rand(8, 8).realize(), Tensor.rand(8, 8).realize()
  assert kernel_of(a + b).key == kernel_of(Tensor.rand(8, 8).realize() + Tensor.rand(8, 8).realize()).key
  assert kernel_of(a + b).key != kernel_of(a + b.T).key
  assert kernel_of(a + b).key != kernel_of(a.cast(dtypes.float16) + b.cast(dtypes.float16)).key
  assert kernel_of(a + b).key != kernel_of(Tensor.rand(8, 9).realize() + Tensor.rand(8, 9).realize()).key


def test_compile_cache_hit(tmp_path, monkeypatch) -> None:
  k = kernel_of(Tensor.rand(4, 4).realize() * 3 + 1)  # the random numbers' own kernel compiles before the cache moves
  monkeypatch.setenv("TINYTUNE_CACHE_DIR", str(tmp_path))
  before = dict(cpu.compile_stats)
  Device["CPU"].compile(Device["CPU"].renderer.render(k))
  Device["CPU"].compile(Device["CPU"].renderer.render(k))
  assert cpu.compile_stats["misses"] == before["misses"] + 1 and cpu.compile_stats["hits"] == before["hits"] + 1
  assert len(list((tmp_path / "cpu").glob("*.so"))) == 1


def test_debug_levels(capsys) -> None:
  a = Tensor.rand(4, 4).realize()
  with Context(DEBUG=2): (a + 1).numpy()
  line = capsys.readouterr().out
  assert "E_4_4" in line and "GFLOPS" in line and "GB/s" in line and " us " in line
  with Context(DEBUG=4): (a + 2).numpy()
  assert " E_4_4(" in capsys.readouterr().out  # the kernel's head in any dialect: "void E_4_4(", CUDA's "__launch_bounds__(16) E_4_4("
  with Context(DEBUG=5): (a + 3).numpy()
  assert "BUFFER" in capsys.readouterr().out


def test_compile_error_is_reported() -> None:
  import pytest
  with pytest.raises(cpu.CompileError, match="failed"): Device["CPU"].compile("this is not C")


def test_source_is_deterministic() -> None:
  a, b = Tensor.rand(16, 16).realize(), Tensor.rand(16, 16).realize()
  k1, k2 = kernel_of(a @ b), kernel_of(a @ b)
  assert compile_kernel(k1, "CPU")[1] == compile_kernel(k2, "CPU")[1]
