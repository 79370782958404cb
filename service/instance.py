"""Which instance a database is: a short key, stable for one database, different for any two.

A worker keeps an instance's mirrors and the scratch folders of its run attempts on its machine. Run ids start at
1 in every database, so two instances sharing a folder would meet each other's ``run-1-attempt-1``; by default
each instance's folders are named by this key (:meth:`workers.settings.WorkerSettings.folders`).

The key hashes the random id the migration drew (:class:`~service.models.InstanceIdentity`: a database created
again is a new instance) with the database's own identity: on PostgreSQL the server's system identifier and the
database's name (a database copied from a template, or restored from another's dump, keeps the row but not both of
these), on SQLite the database file's absolute path.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from service.models import InstanceIdentity

#: Hex digits of the key (64 bits: no two databases a machine serves will share one).
KEY_LENGTH = 16


def instance_uuid(session: Session) -> str:
    """The instance's random id; drawn and stored now should the row be missing (a database restored without it)."""
    row = session.get(InstanceIdentity, 1)
    if row is not None:
        return row.uuid
    try:
        with session.begin_nested():
            session.add(InstanceIdentity(id=1, uuid=uuid.uuid4().hex))
    except IntegrityError:  # another process stored it first
        pass
    stored = session.get(InstanceIdentity, 1, populate_existing=True)
    assert stored is not None
    return stored.uuid


def database_identity(session: Session) -> str:
    """The database itself, as its server names it (see the module docstring)."""
    url = session.get_bind().engine.url
    dialect = url.get_backend_name()
    if dialect == "sqlite":
        database = url.database or ""
        return f"sqlite:{Path(database).resolve() if database and database != ':memory:' else ':memory:'}"
    name = session.scalar(text("SELECT current_database()"))
    try:
        with session.begin_nested():
            system = session.scalar(text("SELECT system_identifier FROM pg_control_system()"))
    except DBAPIError:  # the function's privilege revoked: the server's address stands in for it
        system = url.render_as_string(hide_password=True).rsplit("/", 1)[0]
    return f"{dialect}:{system}:{name}"


def instance_key(session: Session) -> str:
    """The instance's key: :data:`KEY_LENGTH` hex digits."""
    digest = hashlib.sha256(f"{instance_uuid(session)}\0{database_identity(session)}".encode())
    return digest.hexdigest()[:KEY_LENGTH]
