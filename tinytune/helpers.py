"""Small shared helpers: environment knobs, math on shapes, the cache directory."""
from __future__ import annotations

import contextlib
import functools
import operator
import os
import pathlib
import re
import sys
from typing import Any, Iterable, Iterator, TypeVar

T = TypeVar("T")


def prod(xs: Iterable[int]) -> int: return functools.reduce(operator.mul, xs, 1)
def argfix(*x: Any) -> tuple:
  """Accept both f(1, 2) and f((1, 2))."""
  return tuple(x[0]) if len(x) == 1 and isinstance(x[0], (tuple, list)) else tuple(x)
def round_up(x: int, m: int) -> int: return -(-x // m) * m
def getenv(key: str, default: Any = 0) -> Any: return type(default)(os.getenv(key, default))
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
  """A knob read once from the environment and changeable with `with Context(NAME=value):`."""
  registry: dict[str, ContextVar] = {}

  def __init__(self, key: str, default: int):
    self.key, self.value = key, getenv(key, default)
    ContextVar.registry[key] = self

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


def env_count(key: str, least: int) -> int | None:
  """An integer knob from the environment (None where unset or empty); a ValueError that names it where it is not one >= least."""
  if not (text := os.getenv(key, "").strip()): return None
  try: value = int(text)
  except ValueError: value = least - 1
  if value < least: raise ValueError(f"{key}={text!r} is not an integer >= {least}")
  return value


def tune_mode() -> str:
  """What a kernel the tuning cache lacks runs with: $TINYTUNE_TUNE ("1" or unset: the heuristic defaults; "0": those even where
  the cache has opts; beam, optuna or random: tuned on first use), or "beam" where only tinygrad's BEAM=N (N > 0) is set."""
  if (mode := os.getenv("TINYTUNE_TUNE")) is not None: return mode
  return "beam" if env_count("BEAM", 0) else "1"


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


def cache_dir() -> pathlib.Path:
  """Where tinytune keeps compiled kernels and databases: $TINYTUNE_CACHE_DIR or the user cache dir."""
  base = os.getenv("TINYTUNE_CACHE_DIR") or os.path.join(os.getenv("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tinytune")
  path = pathlib.Path(base)
  try: path.mkdir(parents=True, exist_ok=True)
  except OSError as e:  # a file in the way, a read-only or missing mount
    raise RuntimeError(f"tinytune's cache folder {path} cannot be made ({e.strerror}): set TINYTUNE_CACHE_DIR to a writable folder") from None
  return path
