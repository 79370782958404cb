"""The errors of watched targets: a user's mistake, said in one line (:mod:`service.targets`, :mod:`service.repositories`)."""

from __future__ import annotations


class TargetError(ValueError):
    """A target cannot be added, found or removed as asked; the message says why, in one line."""


class TargetNotFoundError(TargetError):
    """No target has that name."""


class TargetExistsError(TargetError):
    """A target with that name exists already."""
