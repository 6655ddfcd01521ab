"""The results database: every device, kernel, search run, candidate and baseline, and the tuning cache (see DESIGN.md)."""
from __future__ import annotations

from tinytune.results_db.db import (
  BaselineRow,
  CandidateRow,
  Database,
  DatabaseError,
  PeakRow,
  RunRow,
  SchemaError,
  TunedRow,
  database_url,
  default_url,
  fingerprint_hash,
  to_json,
)
from tinytune.results_db.migrate import HEAD, VERSION_TABLE
from tinytune.results_db.models import (
  OUTCOMES,
  SCHEMA_VERSION,
  STATUSES,
  Base,
  Baseline,
  Candidate,
  Claim,
  Device,
  KernelRecord,
  Meta,
  Peak,
  SearchRun,
  Tuned,
)

__all__ = ["Database", "DatabaseError", "database_url", "default_url", "fingerprint_hash", "to_json",
           "SchemaError", "CandidateRow", "RunRow", "TunedRow", "BaselineRow",
           "PeakRow", "SCHEMA_VERSION", "STATUSES", "OUTCOMES", "Base", "Device", "KernelRecord", "SearchRun", "Candidate", "Tuned", "Baseline",
           "Peak", "Meta", "Claim", "HEAD", "VERSION_TABLE"]
