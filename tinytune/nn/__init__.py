"""Neural network building blocks: state dicts and safetensors files."""
from __future__ import annotations

from tinytune.nn import state

__all__ = ["state"]
