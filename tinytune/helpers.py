"""Small shared helpers: environment knobs, math on shapes, the cache directory."""
from __future__ import annotations

import contextlib
import functools
import math
import operator
import os
import pathlib
import re
import sys
import tempfile
from typing import Any, Iterable, Iterator, TypeVar

T = TypeVar("T")


def prod(xs: Iterable[int]) -> int: return functools.reduce(operator.mul, xs, 1)
def argfix(*x: Any) -> tuple:
  """Accept both f(1, 2) and f((1, 2))."""
  return tuple(x[0]) if len(x) == 1 and isinstance(x[0], (tuple, list)) else tuple(x)
def round_up(x: int, m: int) -> int: return -(-x // m) * m
def getenv(key: str, default: Any = 0) -> Any:
  """An environment knob of `default`'s type: integers (the usual kind) parsed by env_int, which names the variable when it is wrong."""
  return env_int(key, default) if type(default) is int else type(default)(os.getenv(key, default))
def divisors(n: int) -> list[int]: return [d for d in range(1, n + 1) if n % d == 0]


def unique_names(kernels: Iterable[tuple[Any, str]]) -> dict[Any, str]:
  """(key, name) pairs of a program's kernels in order -> key: a name unique in the program (the second of two different kernels
  named r_1024_1_1024 is r_1024_1_1024#2; the same kernel twice keeps one name)."""
  labels: dict[Any, str] = {}
  seen: dict[str, int] = {}
  for key, name in kernels:
    if key in labels: continue
    seen[name] = seen.get(name, 0) + 1
    labels[key] = name if seen[name] == 1 else f"{name}#{seen[name]}"
  return labels


class ContextVar:
  """A knob read from the environment when first used (so a bad value is an error that names it, raised where it is used, which
  the CLI turns into one line) and changeable with `with Context(NAME=value):`."""
  registry: dict[str, ContextVar] = {}
  value: int  # a plain attribute once read or set, not a property: every realize and kernel run reads some (a call each)

  def __init__(self, key: str, default: int):
    self.key, self.default = key, default
    ContextVar.registry[key] = self

  def __getattr__(self, name: str) -> int:
    """`value` before its first read: the environment's now."""
    if name != "value": raise AttributeError(name)
    self.value = env_int(self.key, self.default)
    return self.value

  def __bool__(self) -> bool: return bool(self.value)
  def __ge__(self, x: int) -> bool: return self.value >= x
  def __gt__(self, x: int) -> bool: return self.value > x
  def __lt__(self, x: int) -> bool: return self.value < x


# DEBUG=2: a line per kernel run; 3: its opts; 4: the generated source; 5: the kernel IR.
DEBUG = ContextVar("DEBUG", 0)
# NOOPT=1: run every kernel with no opts (the reference the optimized kernels are checked against).
NOOPT = ContextVar("NOOPT", 0)
# WINO=0: 3x3 stride-1 convolutions always as direct sums, never by Winograd's transforms; 2: by Winograd's wherever they apply.
WINO = ContextVar("WINO", 1)
# FLASH=0: attention always as its graph (scores, softmax, P @ V); 1: in one kernel (online softmax) on the devices where that is the
# default (see tensor/functional.py's _flash); 2: in one kernel wherever it applies.
FLASH = ContextVar("FLASH", 1)
# SPLITK=0: a GPU's reduces never split across workgroups (split-K); N > 1: every reduce that can be, into N shares; unset: where
# the GPU planner says its workgroups are too few to fill the GPU (heuristic.gpu_split_k).
SPLITK = ContextVar("SPLITK", -1)


def env_int(key: str, default: int, least: int | None = None) -> int:
  """An integer from the environment (`default` where unset or empty); a ValueError that names the variable where it is not one
  (`DEBUG='abc' is not an integer: ...`) or is below `least`."""
  if not (text := os.getenv(key, "").strip()): return default
  try: value: int | None = int(text)
  except ValueError: value = None
  if value is None or (least is not None and value < least):
    raise ValueError(f"{key}={text!r} is not an integer{'' if least is None else f' >= {least}'}: set it to one or unset it")
  return value


def env_count(key: str, least: int) -> int | None:
  """An integer knob from the environment (None where unset or empty); a ValueError that names it where it is not one >= least."""
  return env_int(key, None, least) if os.getenv(key, "").strip() else None  # type: ignore[arg-type]


def env_seconds(key: str, default: float) -> float:
  """A positive number of seconds from the environment (`default` where unset); a ValueError that names the variable otherwise."""
  if not (text := os.getenv(key, "").strip()): return default
  try: value = float(text)
  except ValueError: value = math.nan
  if not (math.isfinite(value) and value > 0): raise ValueError(f"{key}={text!r} is not a positive number of seconds: set one or unset it")
  return value


# every number-valued variable tinytune reads, with how it is parsed: `check_environment` parses them all at once
ENVIRONMENT: dict[str, Any] = {
  **{v.key: (lambda v=v: v.value) for v in (DEBUG, NOOPT, WINO, FLASH, SPLITK)},
  "BEAM": lambda: env_count("BEAM", 0), "TINYTUNE_BUDGET": lambda: env_count("TINYTUNE_BUDGET", 1),
  "TINYTUNE_POOL_BYTES": lambda: env_count("TINYTUNE_POOL_BYTES", 0), "TINYTUNE_DB_TIMEOUT": lambda: db_timeout(),
  **{k: (lambda k=k: env_int(k, 0, 0)) for k in ("TINYTUNE_OPENCL_DEVICE", "TINYTUNE_CUDA_DEVICE", "TINYTUNE_AMD_DEVICE")},
}


class Stopped(KeyboardInterrupt):
  """A SIGINT, SIGTERM or SIGHUP, raised where the program is as Ctrl-C's KeyboardInterrupt is, so a search records what it finished."""
  def __init__(self, signum: int) -> None: self.signum = signum


_stop_signal = 0  # the stop signal that came, until the command that installed on_stop_signal has handled it


def on_stop_signal(signum: int, frame: Any) -> None:
  global _stop_signal
  _stop_signal = signum
  raise Stopped(signum)


def check_stop() -> None:
  """Raise Stopped again for a stop signal whose own raise was lost: one that lands in a weakref callback or a __del__ (the UOp
  cache's are frequent) is printed as "Exception ignored" and swallowed, and a search then ran to its end and exited 0."""
  if _stop_signal: raise Stopped(_stop_signal)


def stop_handled() -> None:
  global _stop_signal
  _stop_signal = 0


def check_environment() -> None:
  """Parse every variable in ENVIRONMENT: the first bad one raises its ValueError (the CLI's one line and exit 2)."""
  for parse in ENVIRONMENT.values(): parse()


def db_timeout() -> float:
  """How long to wait for a database another process holds locked: $TINYTUNE_DB_TIMEOUT seconds, default 60."""
  return env_seconds("TINYTUNE_DB_TIMEOUT", 60.0)


def tune_mode() -> str:
  """What a kernel the tuning cache lacks runs with: $TINYTUNE_TUNE ("1" or unset: the heuristic defaults; "0": those even where
  the cache has opts; beam, optuna or random: tuned on first use), or "beam" where only tinygrad's BEAM=N (N > 0) is set."""
  if (mode := environ_get("TINYTUNE_TUNE")) is not None: return mode
  return "beam" if environ_get("BEAM") and env_count("BEAM", 0) else "1"


_ENVIRON = getattr(os.environ, "_data", None) if os.name == "posix" else None  # os.environ's own table: name and value as bytes


def environ_get(key: str) -> str | None:
  """os.environ.get(key), without the KeyError it raises and catches for a name that is not set (1.5 us: every realize asks)."""
  if _ENVIRON is None: return os.environ.get(key)
  return None if (value := _ENVIRON.get(key.encode())) is None else os.fsdecode(value)


@contextlib.contextmanager
def Context(**kwargs: int) -> Iterator[None]:
  """Temporarily set knobs: `with Context(DEBUG=4): ...`."""
  unknown = [k for k in kwargs if k not in ContextVar.registry]
  if unknown: raise ValueError(f"unknown context variable(s) {unknown}; known: {sorted(ContextVar.registry)}")
  old = {k: ContextVar.registry[k].value for k in kwargs}
  for k, v in kwargs.items(): ContextVar.registry[k].value = v
  try: yield
  finally:
    for k, v in old.items(): ContextVar.registry[k].value = v


_warned: set[str] = set()


def warn_once(message: str) -> None:
  """One `tinytune: warning:` line of at most 200 characters on stderr per distinct message per process."""
  message = " ".join(message.split())
  if len(message) > 180: message = re.sub(r"/\S+/(?=[^/\s]+/[^/\s]+)", ".../", message)  # long paths keep their last two parts
  if len(message) > 180: message = message[:88] + "..." + message[-89:]  # then the middle goes; the end says what to do
  if message not in _warned:
    _warned.add(message)
    print(f"tinytune: warning: {message}", file=sys.stderr)


def cache_dir(writable: bool = True) -> pathlib.Path:
  """Where tinytune keeps compiled kernels and databases: $TINYTUNE_CACHE_DIR or the user cache dir, made if missing. `writable`:
  a folder that is there but cannot be written (read-only, full) costs one warning and a temporary folder instead."""
  base = os.getenv("TINYTUNE_CACHE_DIR") or os.path.join(os.getenv("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tinytune")
  return _writable(base) if writable else _made(base)


def _made(base: str) -> pathlib.Path:
  path = pathlib.Path(base)
  try: path.mkdir(parents=True, exist_ok=True)
  except OSError as e:  # a file in the way, a read-only or missing mount
    raise RuntimeError(f"tinytune's cache folder {path} cannot be made ({e.strerror}): set TINYTUNE_CACHE_DIR to a writable folder") from None
  return path


@functools.lru_cache(maxsize=None)
def _writable(base: str) -> pathlib.Path:
  path = _made(base)
  try:  # a page written and synced: what a full disk or a read-only folder refuses
    with tempfile.TemporaryFile(dir=path) as f:
      f.write(bytes(4096))
      f.flush()
      os.fsync(f.fileno())
    return path
  except OSError as e:
    fallback = pathlib.Path(tempfile.gettempdir()) / f"tinytune-{os.getuid()}"
    fallback.mkdir(mode=0o700, exist_ok=True)
    if fallback.is_symlink() or fallback.stat().st_uid != os.getuid(): fallback = pathlib.Path(tempfile.mkdtemp(prefix="tinytune-"))  # not ours
    warn_once(f"tinytune's cache folder {path} cannot be written ({e.strerror}): using {fallback} for now; set TINYTUNE_CACHE_DIR to fix it")
    return fallback
