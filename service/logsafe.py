"""Values from outside (headers, payload fields, URLs) made safe to log, and access logs without query strings.

A log line is one record: :func:`loggable` escapes control characters (a newline in a pushed ref would
otherwise forge a second record) and truncates (an unsigned 1 MB header would otherwise write a 1 MB line).
:class:`RedactQueryStrings` removes the values of query parameters from uvicorn's access log: a token sent
as ``?token=...`` is refused by the API, but the access log would keep it verbatim.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl

#: The longest logged value, in characters, before the ``…(N chars)`` marker.
LOG_VALUE_MAX = 200
ACCESS_LOGGER = "uvicorn.access"
REDACTED = "[redacted]"


def loggable(value: object, limit: int = LOG_VALUE_MAX) -> str:
    """``value`` as one printable line: control and non-printable characters escaped (``\\n``, ``\\x1b``,
    ``\\u2028``), at most ``limit`` characters of it kept, and the original length said when cut."""
    text = value if isinstance(value, str) else str(value)
    cut = text[:limit]
    escaped = "".join(c if c.isprintable() and c != "\\" else c.encode("unicode_escape").decode("ascii") for c in cut)
    return escaped if len(text) <= limit else f"{escaped}…({len(text)} chars)"


def redact_query(target: str) -> str:
    """A request target with every query parameter's value replaced (names kept, for debugging)."""
    path, sep, query = target.partition("?")
    if not sep:
        return target
    names = [name for name, _ in parse_qsl(query, keep_blank_values=True)]
    shown = "&".join(f"{loggable(name, 40)}={REDACTED}" for name in names[:10])
    more = f"&…({len(names) - 10} more)" if len(names) > 10 else ""
    return f"{loggable(path)}?{shown or REDACTED}{more}"


class RedactQueryStrings(logging.Filter):
    """A filter for uvicorn's access logger: its records carry ``(client, method, path?query, version, status)``
    as arguments; the path is escaped and truncated and the query string's values are redacted."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True


def install_access_log_redaction() -> None:
    """Add :class:`RedactQueryStrings` to uvicorn's access logger once per process (idempotent)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, RedactQueryStrings) for f in logger.filters):
        logger.addFilter(RedactQueryStrings())
