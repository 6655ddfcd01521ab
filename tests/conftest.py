from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _seed() -> None:
  np.random.seed(0)


def reset_postgres(url: str) -> None:
  """Drop every table of the test database at `url`: ours, our version table and optuna's."""
  from sqlalchemy import MetaData, create_engine
  engine = create_engine(url)
  metadata = MetaData()
  metadata.reflect(engine)
  metadata.drop_all(engine)
  engine.dispose()
