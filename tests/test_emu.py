"""EMU, the CUDA GPU emulated in NumPy: its results against NumPy's and the CPU's, the errors it raises where a GPU's result would be
undefined (races, accesses out of bounds), its CUDA source and its place among the devices. The opt fuzzer (test_opts.py) and the
property tests (each_device) run on it too, with the caps of sm_80 and sm_90."""
from __future__ import annotations

import json
import os
import random
import re
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from test_opts import KERNELS, case, kernel_cases, random_sequence

from tinytune import Device, Kernel, Opt, OptOps, Tensor, dtypes
from tinytune.cli import main
from tinytune.codegen.caps import cuda_caps
from tinytune.codegen.lower import TRUE, LinearProgram, LoadArg, LocalArg, SpecialArg, StoreArg, lower, stmt
from tinytune.dtype import DType
from tinytune.engine.schedule import create_schedule
from tinytune.helpers import Context
from tinytune.runtime import Buffer, CompileError, device_status
from tinytune.runtime.emu import EmuError, EMUProgram, bf16_bits, c_op, convert, dump, emu_caps, load
from tinytune.uop import Ops, UOp


def emu_kernel(out: Tensor, opts: list[Opt]) -> tuple[Kernel, Buffer]:
  """The last kernel of `out` on EMU with `opts`, and its output buffer."""
  items, _ = create_schedule(out.uop, "EMU")
  return Kernel(items[-1].ast, Device["EMU"].caps).apply_opts(opts), items[-1].out


def run_emu(k: Kernel, out: Buffer) -> np.ndarray:
  dev = Device["EMU"]
  dev.program(k.name, dev.compile(dev.renderer.render(k)), k.launch_dims)(out, *k.bufs)
  return out.numpy_view()


# ***** results *****

@pytest.mark.parametrize("dtype,op", [(dtypes.float32, "sum"), (dtypes.int32, "sum"), (dtypes.float16, "sum"), (dtypes.float32, "max"),
                                      (dtypes.int8, "max")])
@pytest.mark.parametrize("opts", [[Opt(OptOps.GROUP, 0, 16)], [Opt(OptOps.GROUPTOP, 0, 8), Opt(OptOps.LOCAL, 0, 2)],
                                  [Opt(OptOps.GROUP, 0, 4), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 2)]])
def test_group_reduce_matches_numpy(dtype: DType, op: str, opts: list[Opt]) -> None:
  """GROUP partials meet in shared memory behind a barrier; thread 0 of each group adds them."""
  a = (np.random.default_rng(1).standard_normal((8, 64)) * 20).astype(dtype.np)
  k, out = emu_kernel(getattr(Tensor(a, device="EMU"), op)(-1), opts)
  want = a.sum(-1, dtype=dtype.np) if op == "sum" and dtype.is_int else getattr(a.astype(np.float64), op)(-1)
  assert any(u.op is Ops.BARRIER for u in lower(k, Device["EMU"].renderer).uops)
  np.testing.assert_allclose(run_emu(k, out).astype(np.float64), want, rtol=1e-2 if dtype == dtypes.float16 else 1e-5)


def test_references_match_the_cpu() -> None:
  """The opt fuzzer's references on EMU (each kernel with no opts) are the CPU's: EMU is checked against more than itself."""
  cpu, emu = kernel_cases("CPU"), kernel_cases("EMU:sm_90")
  # the inputs are random numbers each device computes in float32 (its own exp2, log2, sin), so float64 results agree as float32 ones do
  tol = {dtypes.float16: 1e-3, dtypes.bfloat16: 1e-2, dtypes.float32: 1e-5, dtypes.float64: 1e-5}
  for name in sorted(set(cpu) & set(emu)):  # a long float sum rounds relative to its terms (the CPU's C may contract multiply-adds)
    ref, rtol = cpu[name].ref, tol.get(emu[name].item.out.dtype, 0)
    np.testing.assert_allclose(emu[name].ref, ref, rtol=rtol, atol=rtol * float(np.abs(ref.astype(np.float64)).max(initial=1)), err_msg=name)


def test_c_semantics() -> None:
  """C's integer division and remainder truncate; a float cast to an int saturates (PTX's cvt); bfloat16 rounds to nearest even and
  a NaN becomes the quiet NaN of its sign."""
  a, b = np.array([7, -7, 7, -7, 5]), np.array([2, 2, -2, -2, 0])
  assert c_op(Ops.IDIV, [a, b], [dtypes.int32] * 2).tolist() == [3, -3, -3, 3, 0]
  assert c_op(Ops.MOD, [a, b], [dtypes.int32] * 2).tolist() == [1, -1, 1, -1, 0]
  assert c_op(Ops.IDIV, [a, b[:4].tolist() + [1]], [dtypes.int32] * 2, floor=True).tolist() == [3, -4, -4, 3, 5]
  assert convert(np.array([3e9, -3e9, np.nan, -2.7], np.float32), np.int32).tolist() == [2**31 - 1, -2**31, 0, -2]
  assert convert(np.array([300, -129], np.int32), np.int8).tolist() == [44, 127]
  f = np.array([1.00390625, 1.01171875, -np.nan, np.nan], np.float32)  # halfway cases: to even, down then up
  assert bf16_bits(f).tolist() == [0x3F80, 0x3F82, 0xFFC0, 0x7FC0]


def test_half_rounds_each_op() -> None:
  """float16 computes in float32 and rounds each op's result to half, as the CUDA source does (2049 is no half: it rounds to 2048)."""
  x = Tensor(np.array([2048], np.float16), device="EMU")
  assert ((x + 1) + 1).numpy().tolist() == [2048.0]


@pytest.mark.parametrize("device", ["CUDA", "OPENCL"])
@pytest.mark.parametrize("name", KERNELS)
def test_emu_matches_a_gpu(name: str, device: str) -> None:
  """EMU against a device with workgroups on the same inputs, each kernel with no opts and with random opt lists: against CUDA (the
  GPU it emulates, where there is one: the suite on a GPU runs it) it renders the same source, and ints agree exactly; floats up to
  the FMAs the GPU's compiler contracts. pocl's OpenCL, another compiler of the same programs, with TT_FUZZ_SCALE=2."""
  if device_status(device) is not None: pytest.skip(f"{device} is not here")
  if device == "OPENCL" and int(os.getenv("TT_FUZZ_SCALE", "1")) < 2: pytest.skip("pocl builds slowly: with TT_FUZZ_SCALE=2")
  kc, rng = case(name, device), random.Random(zlib.crc32(name.encode()))
  seqs = [[], *(random_sequence(kc.kernel(), rng) for _ in range(4))]
  tol = {dtypes.float32: 1e-5, dtypes.float16: 1e-3, dtypes.bfloat16: 1e-2, dtypes.float64: 1e-12}.get(kc.item.out.dtype, 0)
  for opts in (s for s in seqs if all(o.op is not OptOps.TC for o in s)):
    k, outs = kc.kernel().apply_opts(opts), []
    for dev in (device, "EMU"):
      bufs = k.bufs if dev == device else [Buffer("EMU", b.size, b.dtype).copyin(b.numpy_view()) for b in k.bufs]
      out, src = Buffer(dev, kc.item.out.size, kc.item.out.dtype), Device[dev].renderer.render(k)
      Device[dev].program(k.name, Device[dev].compile(src), k.launch_dims)(out, *bufs)
      outs.append((out.numpy_view().copy(), src))
    (gpu, gpu_src), (emu, emu_src) = outs
    assert device != "CUDA" or gpu_src == emu_src
    ref = np.abs(gpu.astype(np.float64)).max(initial=1)
    np.testing.assert_allclose(emu.astype(np.float64), gpu.astype(np.float64), rtol=tol, atol=tol * ref, err_msg=f"{name} {opts}")


# ***** errors *****

T = 8
LID = UOp.var("lid", 0, T - 1)


def program(*body: UOp, shared: int = T) -> list[UOp]:
  """A kernel of one workgroup of T threads: thread ids, a shared array `tile` of `shared` floats, then `body`."""
  return [stmt(Ops.SPECIAL, arg=SpecialArg("lid", "local_id", 1, 0)), stmt(Ops.DEFINE_LOCAL, arg=LocalArg("tile", shared), dtype=dtypes.float32),
          *body]


def load_(buf: int | str, idx: UOp, name: str) -> UOp: return stmt(Ops.LOAD, idx, TRUE, arg=LoadArg(name, 1, buf), dtype=dtypes.float32)
def store(buf: int | str, idx: UOp, val: UOp) -> UOp: return stmt(Ops.STORE, idx, val, TRUE, arg=StoreArg(1, buf, False), dtype=dtypes.float32)
def barrier() -> UOp: return stmt(Ops.BARRIER)


def run_program(uops: list[UOp], groups: int = 1) -> np.ndarray:
  k, _ = emu_kernel(Tensor.ones(T, device="EMU") + 1, [])  # only its name: the program is the one given
  x = Buffer("EMU", T, dtypes.float32).copyin(np.arange(T, dtype=np.float32))
  out = Buffer("EMU", T * groups, dtypes.float32)
  EMUProgram("handmade", load(dump(LinearProgram(k, 1, uops))), (groups, T))(out, x)
  return out.numpy_view()


def neighbour(then: Callable[[UOp], list[UOp]], with_barrier: bool = True, shared: int = T) -> list[UOp]:
  """Each thread writes its element of `tile` (of `shared` floats), then reads its neighbour's (lid + 1) % T; `then` follows."""
  v = load_(1, LID, "v1")
  w = load_("tile", (LID + 1) % T, "v2")
  return program(v, store("tile", LID, v), *([barrier()] if with_barrier else []), w, *then(w), shared=shared)


def test_shared_memory_with_barrier() -> None:
  assert run_program(neighbour(lambda w: [store(0, LID, w)])).tolist() == np.roll(np.arange(T), -1).tolist()


def test_race_without_barrier_is_an_error() -> None:
  with pytest.raises(EmuError, match=r"kernel handmade: threads \(group 0, thread 0\) at \[1\], \(group 0, thread 1\) at \[2\], .* and 5 more "
                                     r"read shared tile\[8\] that thread 1 wrote with no barrier between: a race"):
    run_program(neighbour(lambda w: [store(0, LID, w)], with_barrier=False))


@pytest.mark.parametrize("opt", [Opt(OptOps.GROUP, 0, 16), Opt(OptOps.GROUPTOP, 0, 4)])
def test_group_kernel_without_its_barrier_races(opt: Opt) -> None:
  """A GROUP reduce with its barrier taken out: thread 0 reads the partials of the others before any barrier orders them, every time."""
  k, out = emu_kernel(Tensor(np.ones((4, 64), np.float32), device="EMU").sum(-1), [opt])
  p = lower(k, Device["EMU"].renderer)
  racy = EMUProgram(k.name, load(dump(LinearProgram(k, p.width, [u for u in p.uops if u.op is not Ops.BARRIER]))), k.launch_dims)
  messages = set()
  for _ in range(2):
    with pytest.raises(EmuError, match=f"kernel {k.name}: .* read shared partials.* wrote with no barrier between: a race") as e: racy(out, *k.bufs)
    messages.add(str(e.value))
  assert len(messages) == 1


def test_write_after_read_race() -> None:
  """Writing an element another thread read since the last barrier (the tile's next load, with no barrier after its use)."""
  with pytest.raises(EmuError, match="write shared tile.* that thread .* read with no barrier between: a race"):
    run_program(neighbour(lambda w: [store("tile", LID, w)]))


def test_write_write_race_and_stores() -> None:
  with pytest.raises(EmuError, match=r"write shared tile\[8\] that thread 1 writes too"):
    run_program(program(store("tile", LID // 2, UOp.const(dtypes.float32, 1.0))))
  with pytest.raises(EmuError, match=r"store to data0\[0\], which threads 0 and 7 \(flat ids\) both store: a race"):
    run_program(program(store(0, UOp.const(dtypes.int64, 0), UOp.const(dtypes.float32, 1.0))))


def test_load_of_what_another_thread_stored() -> None:
  """Global memory a thread stored to, read by another thread in the same launch: no barrier orders global memory across workgroups."""
  v = load_(0, (LID + 1) % T, "v2")
  with pytest.raises(EmuError, match=r"threads \(group 0, thread 0\), .* load data0\[1\], which thread 1 \(flat id\) stored to in this launch"):
    run_program(program(store(0, LID, UOp.const(dtypes.float32, 1.0)), v))
  assert run_program(program(store(0, LID, UOp.const(dtypes.float32, 1.0)), load_(0, LID, "v2"))).tolist() == [1.0] * T  # its own: fine


def test_out_of_bounds_and_unwritten() -> None:
  with pytest.raises(EmuError, match=r"thread \(group 0, thread 7\) at \[8\] read shared tile\[8\] out of its bounds"):
    run_program(program(v := load_(1, LID, "v1"), store("tile", LID, v), barrier(), load_("tile", LID + 1, "v2")))
  with pytest.raises(EmuError, match=r"thread \(group 0, thread 7\) at \[8\] stores to data0 out of its bounds \[0, 8\)"):
    run_program(program(store(0, LID + 1, UOp.const(dtypes.float32, 1.0))))
  with pytest.raises(EmuError, match=r"thread \(group 0, thread 0\) at \[-1\] loads from data1 out of its bounds"):
    run_program(program(load_(1, LID - 1, "v1")))
  with pytest.raises(EmuError, match="read shared tile.* that no thread wrote"):
    run_program(program(load_("tile", LID, "v1")))


def test_guarded_reads_only_where_the_guard_holds() -> None:
  """A guarded store's inline read of shared memory happens only in the threads that store (thread 7 would read out of bounds)."""
  cell = UOp(Ops.CELL, dtypes.float32, (), ("tile", "lid+1"))
  guard = LID.lt(T - 1)
  guarded = stmt(Ops.STORE, LID, cell, guard, arg=StoreArg(1, 0, False), dtype=dtypes.float32)
  uops = program(v := load_(1, LID, "v1"), store("tile", LID, v), barrier(), guarded)
  assert run_program(uops)[:T - 1].tolist() == list(range(1, T))


def test_limits_of_a_block() -> None:
  """Past the 48 KiB a block declares statically its shared memory is dynamic, up to what it may opt into (sm_90: 227 KiB)."""
  assert run_program(neighbour(lambda w: [store(0, LID, w)], shared=16384)).tolist() == np.roll(np.arange(T), -1).tolist()
  with pytest.raises(CompileError, match=r"kernel handmade: 240000 bytes of shared memory, over the 232448 a CUDA block may opt into"):
    run_program(program(shared=60000))


def test_barrier_in_divergent_code() -> None:
  with pytest.raises(EmuError, match=r"__syncthreads\(\) in code that only some threads of a workgroup run: thread \(group 0, thread 0\)"):
    run_program(program(stmt(Ops.IF, LID.alu(Ops.CMPNE, UOp.const(dtypes.int64, 0))), barrier(), stmt(Ops.ENDIF)))


def test_barrier_in_a_branch_of_some_workgroups() -> None:
  """A branch the same in every thread of a workgroup may hold a barrier, and it orders only that workgroup's threads: the others,
  which skip it, still race."""
  odd = stmt(Ops.SPECIAL, arg=SpecialArg("odd", "group_id", 1, 2))
  def body(w: UOp) -> list[UOp]: return [store(0, UOp.var("g", 0, 1) * T + LID, w)]
  racy = neighbour(body, with_barrier=False)
  branch = [stmt(Ops.IF, UOp.var("odd", 0, 1).alu(Ops.CMPNE, UOp.const(dtypes.int64, 0))), barrier(), stmt(Ops.ENDIF)]
  uops = [stmt(Ops.SPECIAL, arg=SpecialArg("g", "group_id", 1, 0)), odd, *racy[:4], *branch, *racy[4:]]
  with pytest.raises(EmuError, match=r"threads \(group 0, thread 0\) at \[1\].* read shared tile\[8\] that thread 1 wrote"):
    run_program(uops, groups=2)
  uops = [stmt(Ops.SPECIAL, arg=SpecialArg("g", "group_id", 1, 0)), odd, *racy[:4], *branch[:2], stmt(Ops.ELSE), barrier(), stmt(Ops.ENDIF),
          *racy[4:]]
  assert run_program(uops, groups=2).tolist() == np.roll(np.arange(T), -1).tolist() * 2


def test_exit_and_workgroups() -> None:
  """Threads that exit stop storing; each workgroup's shared memory is its own (3 workgroups of 8, side by side)."""
  g = UOp.var("g", 0, 2)
  body = [stmt(Ops.SPECIAL, arg=SpecialArg("g", "group_id", 1, 0)), v := load_(1, LID, "v1"), store("tile", LID, v), barrier(),
          stmt(Ops.EXIT, LID.alu(Ops.CMPNE, UOp.const(dtypes.int64, 0)))]
  reads = [load_("tile", UOp.const(dtypes.int64, j), f"w{j}") for j in range(T)]
  body += [*reads, *(store(0, g * T + j, w) for j, w in enumerate(reads))]
  assert run_program(program(*body), groups=3).tolist() == list(range(T)) * 3


# ***** the device *****

def test_caps_are_cudas() -> None:
  for arch in ("sm_80", "sm_90"): assert emu_caps(arch) == cuda_caps(arch) and emu_caps(arch).tensor_cores == ("float16", "bfloat16")
  with pytest.raises(ValueError, match="TINYTUNE_EMU_ARCH='sm_75': EMU emulates sm_80 or sm_90"): emu_caps("sm_75")


def test_compile_takes_only_its_renderers_sources() -> None:
  with pytest.raises(CompileError, match="EMU runs the programs its own renderer lowered"): Device["EMU"].compile("__global__ void f() {}")
  with pytest.raises(CompileError, match="not an EMU program"): Device["EMU"].program("f", b"garbage")


def test_debug4_prints_the_cuda_source(capsys: pytest.CaptureFixture[str]) -> None:
  with Context(DEBUG=4): (Tensor(np.arange(16, dtype=np.float32), device="EMU") * 3).realize()
  out = capsys.readouterr().out
  assert re.search(r'extern "C" __global__ void __launch_bounds__\(\d+\) E_16\(float\* __restrict__ data0', out) and "EMU" in out


def test_bench_says_its_times_are_no_gpus(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
  args = ["bench", "matmul", "-p", "m=8", "-p", "n=8", "-p", "k=8", "--device", "EMU", "--db", str(tmp_path / "t.db"), "--against", "numpy"]
  assert main([*args, "--repeats", "3", "--format", "md"]) == 0
  out, err = capsys.readouterr()
  assert "EMU is an emulator: its times are its host seconds, not a GPU's speed" in err
  assert "on EMU (emulated: times are host seconds, not GPU speed)" in out
  with Context(DEBUG=2): (Tensor(np.arange(16, dtype=np.float32), device="EMU") + 1).realize()
  assert "emulated: host time" in capsys.readouterr().out
  assert main(["search", "matmul", "-p", "m=8", "--device", "EMU", "--seconds", "0.001", "--db", str(tmp_path / "t.db")]) == 2
  assert capsys.readouterr().err.count("\n") == 1  # bad input: its one line, no note before it


def test_devices_lists_emu(capsys: pytest.CaptureFixture[str]) -> None:
  assert main(["devices", "--format", "json"]) == 0
  rows = {r["device"]: r for r in json.loads(capsys.readouterr().out)["devices"]}
  assert rows["EMU"]["present"] is True and "emulated: times are not GPU speed" in rows["EMU"]["name"]
