"""Dashboard sessions, kept on the server: the cookie holds only a random session id (issue 28, item 5).

A row says which token signed the session in, by a keyed id (:func:`service.dashboard.session.token_key`:
HMAC-SHA256 under the server's session secret, never the token's plain SHA-256, which a stolen cookie or
database dump would expose to offline guessing), when it began and ends, and when and why it was revoked
(sign-out, or its token removed from the configuration). The cookie's session id is stored only as its
SHA-256 (the id is 32 random bytes: nothing to guess), so the table gives no live session away.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, UTCDateTime


class DashboardSession(Base):
    """One sign-in to the dashboard; it counts only while not expired and not revoked."""

    __tablename__ = "dashboard_sessions"

    id: Mapped[int] = mapped_column(primary_key=True)
    # SHA-256 hex of the session id the cookie carries.
    id_digest: Mapped[str] = mapped_column(String(64), unique=True)
    # HMAC-SHA256 hex of the token's digest under the session secret: which token, without the token's digest.
    token_key: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # "signed out" or "token revoked".
    revoked_reason: Mapped[str | None] = mapped_column(String(50))
