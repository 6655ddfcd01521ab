"""Neural network building blocks: state dicts and safetensors files, datasets, and a data loader."""
from __future__ import annotations

from tinytune.nn import datasets, optim, state
from tinytune.nn.data import DataLoader

__all__ = ["DataLoader", "datasets", "optim", "state"]
