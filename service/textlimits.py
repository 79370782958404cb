"""Text from outside (a signed payload, the code under test) cut to a size, visibly.

Every field specwatch stores or sends from such a source has a limit; past it the text keeps its start and
ends with :data:`CUT_MARKER`, so a reader sees that something was left out (issue 28, items 3 and 6).
"""

from __future__ import annotations

from typing import overload

#: Where a text cut by :func:`cut` ends.
CUT_MARKER = "… [cut]"


@overload
def cut(text: str, limit: int) -> str: ...
@overload
def cut(text: None, limit: int) -> None: ...
def cut(text: str | None, limit: int) -> str | None:
    """``text`` whole if it has at most ``limit`` characters, else its start and :data:`CUT_MARKER` in ``limit``."""
    if text is None or len(text) <= limit:
        return text
    return text[: max(0, limit - len(CUT_MARKER))] + CUT_MARKER
