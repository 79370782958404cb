"""The instance's identity: one row, written by the migration that created it, never changed.

A database is one specwatch instance. What a worker keeps on its machine for an instance (its mirrors and the
scratch folders of run attempts) lives under a folder named by :func:`service.instance.instance_key`, derived from
this row and the database's own identity, so two instances on one machine (two databases whose run ids both start
at 1) never share a folder, and one never touches another's leftovers.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String, func
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, UTCDateTime


class InstanceIdentity(Base):
    """The single row (``id`` 1): a random id drawn when the database was migrated."""

    __tablename__ = "instance_identity"

    id: Mapped[int] = mapped_column(primary_key=True)
    # 32 hex digits (uuid4), drawn by the migration (or on first use, should the row be missing).
    uuid: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, server_default=func.now())
