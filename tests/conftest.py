from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest

from tinytune.runtime import Device, device_status

# devices with workgroups that open here; CI has OPENCL through pocl
WORKGROUP_DEVICES = [d for d in ("OPENCL", "CUDA", "AMD") if device_status(d) is None]


@pytest.fixture(autouse=True)
def _seed() -> None:
  np.random.seed(0)


@pytest.fixture(params=["CPU", *WORKGROUP_DEVICES])
def each_device(request: pytest.FixtureRequest) -> Iterator[str]:
  """Run a test once per device, with tensors made on it by default (`@pytest.mark.usefixtures("each_device")`)."""
  default, Device.DEFAULT = Device.DEFAULT, request.param
  try: yield request.param
  finally: Device.DEFAULT = default


def reset_postgres(url: str) -> None:
  """Drop every table of the test database at `url`: ours, our version table and optuna's."""
  from sqlalchemy import MetaData, create_engine
  engine = create_engine(url)
  metadata = MetaData()
  metadata.reflect(engine)
  metadata.drop_all(engine)
  engine.dispose()
