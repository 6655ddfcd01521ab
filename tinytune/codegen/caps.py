"""What a device's kernels may use: the renderer's target, which the opt checks and the heuristics read (runtime re-exports it)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceCaps:
  """What a device's kernels may use; the opt checks read these."""
  has_local: bool = False  # workgroups (LOCAL, GROUP)
  threads: int = 1  # cores a THREAD opt can split across
  max_upcast: int = 256  # elements computed per thread in registers
  simd_width: int = 8  # float32 lanes of one vector register
  vector_registers: int = 16
  max_local: int = 0  # threads in one workgroup (LOCAL x GROUP)
  shared_bytes: int = 0  # shared memory of one workgroup, the most it may have (CUDA: the opt-in maximum, past STATIC_SHARED dynamic)
  tensor_cores: tuple[str, ...] = ()  # input dtypes the matrix units take (TC)
  tc_args: tuple[int, ...] = (0, 1)  # the TC args its renderer spells: 0 (CUDA's wmma API, AMD's WMMA or MFMA), 1 (PTX mma.sync), 2 (wgmma, sm_90's)
  warp: int = 32  # the lanes that TC's matrix instructions work across: a CUDA warp, RDNA3's wave32, CDNA's 64-lane wavefront
  no_tc: str = ""  # why a GPU's matrix units are not TC's: what TC is refused with there
  l1_bytes: int = 32 << 10  # data cache of one core (CPUs: what K blocks and B panels are sized by)
  l2_bytes: int = 1 << 20
  gpu: bool = False  # a GPU, whose shared memory is on chip (pocl's CPU device runs workgroups, with shared memory in ordinary memory)
  async_copy: bool = False  # cp.async (CUDA, sm_80+): PIPELINE's copies of STAGE's tiles to shared memory, in flight while the compute runs
  sms: int = 0  # a GPU's multiprocessors (CUDA's SMs, AMD's CUs): what the GPU planners size the workgroups they launch by (0: unknown)


CUDA_ARCHS = ("sm_80", "sm_90")  # the architectures whose caps a device without the GPU (EMU) can take
ARCH_SMS = {"sm_80": 108, "sm_90": 132}  # the SMs of each architecture's flagship (A100, H100 SXM and H200): what EMU schedules for
STATIC_SHARED = 48 << 10  # the shared memory a CUDA block may declare statically: past it, it is dynamic (extern), opted into per function
# a block's most shared memory by architecture, opted into (the CUDA programming guide's table: 96, 64, 163, 99, 163, 99, 227 KB); a GPU's own
# is its driver's CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
SHARED_OPT_IN = {"sm_70": 98304, "sm_75": 65536, "sm_80": 166912, "sm_86": 101376, "sm_87": 166912, "sm_89": 101376, "sm_90": 232448}


def cuda_caps(arch: str, max_local: int = 1024, sms: int = 0, shared_bytes: int = 0) -> DeviceCaps:
  """An NVIDIA GPU's caps by its architecture (`sm_90`), what the CUDA device and the emulator (EMU) both schedule kernels for;
  `max_local` is the GPU's threads per block (1024 on every architecture since sm_20), `sms` its SMs (the flagship's where 0),
  `shared_bytes` a block's most shared memory, opted into (SHARED_OPT_IN's where 0)."""
  major, minor = divmod(int(arch.removeprefix("sm_")), 10)
  shared_bytes = shared_bytes or SHARED_OPT_IN.get(arch, STATIC_SHARED)
  return DeviceCaps(has_local=True, threads=1, max_upcast=256, simd_width=4, vector_registers=255, max_local=max_local, shared_bytes=shared_bytes,
                    tensor_cores=("float16", "bfloat16") if (major, minor) >= (8, 0) else (), gpu=True, sms=sms or ARCH_SMS.get(arch, 0),
                    tc_args=(0, 1, 2) if arch == "sm_90" else (0, 1),  # wgmma is sm_90a's alone (not sm_100's)
                    async_copy=major >= 8)


def amd_caps(arch: str, max_local: int = 1024, shared_bytes: int = 64 * 1024) -> DeviceCaps:
  """An AMD GPU's caps by its gfx target (`gfx1100`, `gfx90a:xnack-`). TC is RDNA3's WMMA (gfx11xx, across a wave32) or CDNA's MFMA
  (gfx908, gfx90a, gfx94x, across a 64-lane wavefront; gfx908's has no bfloat16 of 16x16x16); RDNA4's WMMA lays its fragments out
  otherwise and CDNA4 (gfx95x) is newer than the clang that checks the MFMA source, so TC says why it is refused there and elsewhere."""
  gfx, warp, tcs = arch.split(":")[0], 32, ("float16", "bfloat16")[:1 if arch.startswith("gfx908") else 2]
  if gfx.startswith("gfx11"): no_tc = ""
  elif gfx in ("gfx908", "gfx90a") or gfx.startswith("gfx94"): no_tc, warp = "", 64
  elif gfx.startswith("gfx12"): no_tc = f"TC on {gfx} (RDNA4): its WMMA lays fragments out otherwise than RDNA3's (gfx11xx), the one TC renders"
  elif gfx.startswith("gfx95"): no_tc = f"TC on {gfx} (CDNA4): its MFMA is not rendered yet, as no clang here compiles for it (gfx90a and gfx94x are)"
  else: no_tc = f"TC needs matrix units: {gfx} has none that TC renders (RDNA3's WMMA, gfx11xx; CDNA's MFMA, gfx908 to gfx94x)"
  return DeviceCaps(has_local=True, threads=1, max_upcast=256, simd_width=4, vector_registers=255, max_local=max_local, shared_bytes=shared_bytes,
                    tensor_cores=() if no_tc else tcs, tc_args=(0,), no_tc=no_tc, gpu=True, warp=warp)
