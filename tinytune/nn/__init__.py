"""Neural network building blocks: state dicts and safetensors files, and datasets."""
from __future__ import annotations

from tinytune.nn import datasets, state

__all__ = ["datasets", "state"]
