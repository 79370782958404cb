"""What every table shares: the declarative base with its constraint naming convention, timezone-aware UTC
timestamps on both backends, and enum columns stored by value."""

from __future__ import annotations

import enum
from datetime import UTC, datetime

from sqlalchemy import DateTime, Dialect, Enum, MetaData, TypeDecorator
from sqlalchemy.orm import DeclarativeBase

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(TypeDecorator[datetime]):
    """``DateTime(timezone=True)`` that always gives back aware UTC datetimes.

    PostgreSQL stores ``timestamptz``; SQLite has no time zones and returns naive values, so values are
    written as UTC and read back with ``tzinfo=UTC``. Naive datetimes are refused on the way in: they are bugs.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: use an aware one (datetime.now(UTC))")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _values(enum_class: type[enum.Enum]) -> list[str]:
    return [str(member.value) for member in enum_class]


def enum_column(enum_class: type[enum.Enum], name: str) -> Enum:
    """An enum column stored by value, as VARCHAR with a named CHECK constraint (``ck_<table>_<name>``)."""
    return Enum(enum_class, name=name, values_callable=_values, native_enum=False, create_constraint=True, length=32)
