"""The results database schema: devices, kernels, search runs, candidates, the tuning cache, baselines, device peaks, and the schema version.

JSON-valued columns hold text (canonical `json.dumps`), so every SQLAlchemy backend stores them the same way and the opts text
that identifies a candidate compares byte for byte."""
from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import BigInteger, CheckConstraint, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint, or_, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

SCHEMA_VERSION = 4  # bump together with a new migration in migrations/versions (see migrate.py)
STATUSES = ("ok", "wrong", "crashed", "timeout", "compile_error", "invalid")
OUTCOMES = ("done", "interrupted", "failed")


def utcnow() -> datetime: return datetime.now(timezone.utc)


class Base(DeclarativeBase):
  pass


class Meta(Base):
  """One row: the schema version this database was created with."""
  __tablename__ = "meta"
  id: Mapped[int] = mapped_column(Integer, primary_key=True)
  schema_version: Mapped[int] = mapped_column(Integer)

  @classmethod
  def find(cls, session: Session) -> Meta | None: return session.get(cls, 1)


class Device(Base):
  """A device as the code generator sees it: the fingerprint covers the hardware, the compiler and its flags, the codegen version."""
  __tablename__ = "devices"
  id: Mapped[int] = mapped_column(Integer, primary_key=True)
  fingerprint_hash: Mapped[str] = mapped_column(String(64), unique=True)
  kind: Mapped[str] = mapped_column(String(32))
  name: Mapped[str] = mapped_column(String(256), default="")
  arch: Mapped[str] = mapped_column(String(128), default="")
  compiler: Mapped[str] = mapped_column(String(256), default="")
  compiler_version: Mapped[str] = mapped_column(String(256), default="")
  flags: Mapped[str] = mapped_column(Text, default="")
  codegen_version: Mapped[str] = mapped_column(String(64), default="")
  fingerprint: Mapped[str] = mapped_column(Text)  # the whole fingerprint as JSON, including keys without a column

  @classmethod
  def find(cls, session: Session, fingerprint_hash: str) -> Device | None:
    return session.scalars(select(cls).where(cls.fingerprint_hash == fingerprint_hash)).one_or_none()


class KernelRecord(Base):
  """A kernel by its key: a hash of the AST, stable across processes."""
  __tablename__ = "kernels"
  id: Mapped[int] = mapped_column(Integer, primary_key=True)
  key: Mapped[str] = mapped_column(String(64), unique=True)
  name: Mapped[str] = mapped_column(String(256))
  ast_text: Mapped[str] = mapped_column(Text)
  sizes: Mapped[str] = mapped_column(Text)  # JSON list of the full shape
  dtypes: Mapped[str] = mapped_column(Text)  # JSON list of the buffers' dtype names
  flops: Mapped[int] = mapped_column(BigInteger)
  nbytes: Mapped[int] = mapped_column(BigInteger)

  @classmethod
  def find(cls, session: Session, key: str) -> KernelRecord | None:
    return session.scalars(select(cls).where(cls.key == key)).one_or_none()


class SearchRun(Base):
  """One search: what was searched, where, how, and how it ended. `outcome` is NULL while running (or after a SIGKILL)."""
  __tablename__ = "runs"
  id: Mapped[int] = mapped_column(Integer, primary_key=True)
  workload: Mapped[str] = mapped_column(String(128))
  params: Mapped[str] = mapped_column(Text)
  device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"), index=True)
  strategy: Mapped[str] = mapped_column(String(64))
  settings: Mapped[str] = mapped_column(Text)
  budget: Mapped[str] = mapped_column(Text)
  signature: Mapped[str] = mapped_column(Text, index=True)  # what a `--resume` matches on (JSON, often longer than 256 characters)
  started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
  ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
  outcome: Mapped[str | None] = mapped_column(String(32), nullable=True)
  worker: Mapped[str] = mapped_column(String(256), default="", server_default="")  # host:pid of the process that ran it
  dtype: Mapped[str | None] = mapped_column(String(32), nullable=True)  # what the program computes in; NULL: unknown (a run from before schema 4)

  @classmethod
  def latest_unfinished(cls, session: Session, signature: str) -> SearchRun | None:
    stmt = select(cls).where(cls.signature == signature, or_(cls.outcome.is_(None), cls.outcome != "done")).order_by(cls.id.desc()).limit(1)
    return session.scalars(stmt).first()


class Candidate(Base):
  """One evaluated set of opts for a kernel on a device. Timings of a failed candidate are NULL."""
  __tablename__ = "candidates"
  __table_args__ = (Index("ix_candidates_kernel_device_opts", "kernel_id", "device_id", "opts"),
                    CheckConstraint(f"status IN ({', '.join(repr(s) for s in STATUSES)})", name="ck_candidates_status"))
  id: Mapped[int] = mapped_column(Integer, primary_key=True)
  run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
  kernel_id: Mapped[int] = mapped_column(ForeignKey("kernels.id"))
  device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
  opts: Mapped[str] = mapped_column(Text)  # opts_to_json
  source_hash: Mapped[str] = mapped_column(String(64), default="")
  compile_s: Mapped[float] = mapped_column(Float, default=0.0)
  status: Mapped[str] = mapped_column(String(16))
  min_s: Mapped[float | None] = mapped_column(Float, nullable=True)
  median_s: Mapped[float | None] = mapped_column(Float, nullable=True)
  spread: Mapped[float | None] = mapped_column(Float, nullable=True)
  error: Mapped[str] = mapped_column(Text, default="")
  created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

  @classmethod
  def for_kernel(cls, session: Session, kernel_id: int, device_id: int) -> list[Candidate]:
    return list(session.scalars(select(cls).where(cls.kernel_id == kernel_id, cls.device_id == device_id).order_by(cls.id)))

  @classmethod
  def for_run(cls, session: Session, run_id: int) -> list[Candidate]:
    return list(session.scalars(select(cls).where(cls.run_id == run_id).order_by(cls.id)))


class Tuned(Base):
  """The tuning cache: (kernel key, device fingerprint hash) -> best opts. Keys, not row ids, so a cache file travels on its own."""
  __tablename__ = "tuned"
  __table_args__ = (UniqueConstraint("kernel_key", "device_hash", name="uq_tuned_kernel_device"),)
  id: Mapped[int] = mapped_column(Integer, primary_key=True)
  kernel_key: Mapped[str] = mapped_column(String(64))
  device_hash: Mapped[str] = mapped_column(String(64))
  opts: Mapped[str] = mapped_column(Text)
  best_s: Mapped[float] = mapped_column(Float)
  default_s: Mapped[float | None] = mapped_column(Float, nullable=True)
  run_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # no foreign key: an imported entry's run lives in another database
  updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
  # what made the kernel, so an exported entry can be rebuilt and re-run elsewhere (`tinytune cache verify --run`)
  kernel_name: Mapped[str] = mapped_column(String(256), default="", server_default="")
  workload: Mapped[str] = mapped_column(String(128), default="", server_default="")
  params: Mapped[str] = mapped_column(Text, default="{}", server_default="{}")

  @classmethod
  def find(cls, session: Session, kernel_key: str, device_hash: str, for_update: bool = False) -> Tuned | None:
    stmt = select(cls).where(cls.kernel_key == kernel_key, cls.device_hash == device_hash)
    return session.scalars(stmt.with_for_update() if for_update else stmt).one_or_none()


class Claim(Base):
  """Workers sharing a study claim a candidate (by the hash of its source, as the evaluator dedupes) before measuring it, so each is
  measured and recorded once."""
  __tablename__ = "claims"
  __table_args__ = (UniqueConstraint("study", "kernel_id", "device_id", "source_hash", name="uq_claims_study_kernel_device_source"),)
  id: Mapped[int] = mapped_column(Integer, primary_key=True)
  study: Mapped[str] = mapped_column(String(256))
  kernel_id: Mapped[int] = mapped_column(ForeignKey("kernels.id"))
  device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
  source_hash: Mapped[str] = mapped_column(String(64))
  run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))  # the run that measures (and records) it
  claimed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

  @classmethod
  def find(cls, session: Session, study: str, kernel_id: int, device_id: int, source_hash: str) -> Claim | None:
    stmt = select(cls).where(cls.study == study, cls.kernel_id == kernel_id, cls.device_id == device_id, cls.source_hash == source_hash)
    return session.scalars(stmt).one_or_none()


class Baseline(Base):
  """A peer library's time for a workload on a device (PyTorch, NumPy), measured the same way as our kernels."""
  __tablename__ = "baselines"
  __table_args__ = (Index("ix_baselines_device_workload", "device_id", "workload"),)
  id: Mapped[int] = mapped_column(Integer, primary_key=True)
  device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
  workload: Mapped[str] = mapped_column(String(128))
  params: Mapped[str] = mapped_column(Text)
  library: Mapped[str] = mapped_column(String(64))
  library_version: Mapped[str] = mapped_column(String(64), default="")
  dtype: Mapped[str] = mapped_column(String(32), default="float32", server_default="float32")
  median_s: Mapped[float] = mapped_column(Float)
  min_s: Mapped[float] = mapped_column(Float)
  created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Peak(Base):
  """A device's peak throughput as tinytune's probe measured it (`tinytune.kernels.peaks`): the roof of the roofline plot."""
  __tablename__ = "peaks"
  id: Mapped[int] = mapped_column(Integer, primary_key=True)
  device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"), unique=True)
  gflops: Mapped[float] = mapped_column(Float)
  gbs: Mapped[float] = mapped_column(Float)
  probe: Mapped[str] = mapped_column(Text, default="")  # how it was measured
  created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

  @classmethod
  def find(cls, session: Session, device_id: int, for_update: bool = False) -> Peak | None:
    stmt = select(cls).where(cls.device_id == device_id)
    return session.scalars(stmt.with_for_update() if for_update else stmt).one_or_none()
