"""A model's tensors by name: state dicts from object trees, loading them back in place, and safetensors files."""
from __future__ import annotations

import os
import secrets
import types
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from safetensors import SafetensorError, deserialize
from safetensors.numpy import save_file

from tinytune.tensor import Tensor

# safetensors' dtype names -> numpy; safetensors.numpy reads no BF16, so files are read through safetensors.deserialize and this table
_NP_TYPES: dict[str, Any] = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16, "U32": np.uint32, "I32": np.int32,
                             "U64": np.uint64, "I64": np.int64, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F32": np.float32, "F64": np.float64}


def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
  """Every Tensor reachable from `obj` through attributes, lists, tuples and dicts, by dotted name: `l1.weight`, `layers.0.bias`.
  A tensor reached by two paths (a shared layer) is there under both names."""
  return _walk(obj, prefix, set())


def _walk(obj: Any, prefix: str, path: set[int]) -> dict[str, Tensor]:
  if isinstance(obj, Tensor): return {prefix.rstrip("."): obj}
  if id(obj) in path or isinstance(obj, (type, types.ModuleType, str, bytes)): return {}  # a cycle, or nothing that holds a model's tensors
  if hasattr(obj, "_asdict"): items = obj._asdict().items()  # a namedtuple
  elif isinstance(obj, dict): items = obj.items()
  elif isinstance(obj, (list, tuple)): items = enumerate(obj)
  elif hasattr(obj, "__dict__"): items = vars(obj).items()
  else: return {}
  path.add(id(obj))
  ret: dict[str, Tensor] = {}
  for k, v in list(items): ret.update(_walk(v, f"{prefix}{k}.", path))
  path.discard(id(obj))
  return ret


def get_parameters(obj: Any) -> list[Tensor]:
  """The Tensors of `obj`'s state dict, each once even when it has two names."""
  return list({id(t): t for t in get_state_dict(obj).values()}.values())


def load_state_dict(model: Any, state_dict: dict[str, Any], strict: bool = True) -> None:
  """Put each value of `state_dict` (Tensors or numpy arrays) into the place of the model tensor of that name, on that tensor's
  device and in its dtype. Strict: a name missing from either side is an error; strict=False skips them. A shape that differs is
  always an error. Everything is checked before anything is loaded."""
  own = get_state_dict(model)
  missing, unexpected = [k for k in own if k not in state_dict], [k for k in state_dict if k not in own]
  if strict and (missing or unexpected):
    raise ValueError(f"state dict does not fit the model: {_names('missing', missing)}{'; ' if missing and unexpected else ''}"
                   f"{_names('unexpected', unexpected)} (strict=False skips them)")
  shapes = [f"{k}: model {own[k].shape}, state dict {tuple(v.shape)}" for k, v in state_dict.items() if k in own and own[k].shape != tuple(v.shape)]
  if shapes: raise ValueError(f"state dict shapes do not fit the model: {'; '.join(shapes)}")
  for k, v in state_dict.items():
    if k not in own: continue
    t = own[k]
    t.assign(Tensor(v.numpy() if isinstance(v, Tensor) else np.asarray(v), device=t.device, dtype=t.dtype)).realize()  # in place: a TinyJit reads it


def _names(what: str, keys: list[str], most: int = 10) -> str:
  if not keys: return ""
  return f"{len(keys)} {what} ({', '.join(keys[:most])}{', ...' if len(keys) > most else ''})"


def safe_save(state_dict: dict[str, Any], path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
  """Write the tensors (or numpy arrays) to a safetensors file, which PyTorch's safetensors.torch reads too. The file is written
  whole under a temporary name in the same folder and then renamed, so `path` never holds half a file."""
  if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
    raise TypeError("safetensors metadata is a dict of str to str")
  if bad := [k for k in state_dict if not isinstance(k, str)]: raise TypeError(f"state dict names are str, got {bad[:5]}")
  arrays = {k: np.asarray(v.numpy() if isinstance(v, Tensor) else v, order="C") for k, v in state_dict.items()}
  path = Path(path)
  tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")  # not mkstemp: its files are private to the user
  try:
    save_file(arrays, tmp, metadata=metadata)
    os.replace(tmp, path)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise


def safe_load(path: str | os.PathLike, device: str | None = None) -> dict[str, Tensor]:
  """The tensors of a safetensors file, by name, on `device`."""
  try: specs = deserialize(Path(path).read_bytes())
  except SafetensorError as e: raise ValueError(f"{path} is not a safetensors file: {e}") from None
  ret = {}
  for name, spec in specs:
    if spec["dtype"] not in _NP_TYPES: raise TypeError(f"{path}: tensor {name!r} has dtype {spec['dtype']}, which tinytune does not read")
    ret[name] = Tensor(np.frombuffer(spec["data"], dtype=_NP_TYPES[spec["dtype"]]).reshape(spec["shape"]), device=device)
  return ret
