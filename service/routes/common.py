"""What the query routes share: the errors they document and how a query's error becomes an HTTP one."""

from __future__ import annotations

from fastapi import HTTPException, status

from service.queries import NotFoundError

#: The errors every read route may answer.
READ_ERRORS: dict[int | str, dict[str, str]] = {
    400: {"description": "bad cursor, limit or sha"},
    401: {"description": "reads need a token and none (or a bad one) was given"},
    404: {"description": "no such target, branch, run, case or commit"},
}


def http_error(exc: Exception) -> HTTPException:
    """404 for something that does not exist, 400 for bad input."""
    code = status.HTTP_404_NOT_FOUND if isinstance(exc, NotFoundError) else status.HTTP_400_BAD_REQUEST
    return HTTPException(code, str(exc))
