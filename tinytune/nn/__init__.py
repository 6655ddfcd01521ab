"""Neural network building blocks: layers, state dicts and safetensors files, datasets, and a data loader."""
from __future__ import annotations

from tinytune.nn import datasets, optim, state
from tinytune.nn.data import DataLoader
from tinytune.nn.layers import (
  BatchNorm,
  BatchNorm1d,
  BatchNorm2d,
  BatchNorm3d,
  Conv1d,
  Conv2d,
  ConvTranspose2d,
  Embedding,
  GroupNorm,
  InstanceNorm,
  LayerNorm,
  Linear,
  LSTMCell,
  RMSNorm,
)

__all__ = ["DataLoader", "datasets", "optim", "state",
           "BatchNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "Conv1d", "Conv2d", "ConvTranspose2d",
           "Embedding", "GroupNorm", "InstanceNorm", "LayerNorm", "Linear", "LSTMCell", "RMSNorm"]
