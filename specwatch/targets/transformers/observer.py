"""What the library's candidate generators do in a ``generate()`` call: drafts, acceptances, rounds (coverage)."""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator
from typing import Any

from specwatch.experiments import Coverage


class DraftObserver:
    """Counts what the library's candidate generators do, by wrapping their own calls without changing them.

    While :meth:`watching` is open, ``get_candidates`` and ``update_candidate_strategy`` of every class in
    ``transformers.generation.candidate_generator`` that defines them are replaced by wrappers that call
    the original with the same arguments, return its result unchanged and record: drafts per
    verification (candidate length returned), accepted drafts (``num_matches`` the library reports after
    the round), verification rounds per ``generate()`` call and accepted drafts per call (``call_accepted``,
    in call order). A nested call (a subclass's ``super().get_candidates``) is counted once. Process-wide: the
    suite runs one case at a time per process.
    """

    _METHODS = ("get_candidates", "update_candidate_strategy")

    def __init__(self) -> None:
        self.drafts: dict[int, int] = {}
        self.accepted: dict[int, int] = {}
        self.rounds: dict[int, int] = {}
        self.full = 0
        self.partial = 0
        self._depth = 0
        self._pending: int | None = None
        self._rounds_this_call = 0
        self._accepted_this_call = 0
        self.call_accepted: list[int] = []

    def _got_candidates(self, drafts: int) -> None:
        self._pending = drafts
        self._rounds_this_call += 1
        self.drafts[drafts] = self.drafts.get(drafts, 0) + 1

    def _verified(self, accepted: int) -> None:
        self.accepted[accepted] = self.accepted.get(accepted, 0) + 1
        self._accepted_this_call += accepted
        drafts = self._pending if self._pending is not None else 0
        if drafts >= 2 and accepted >= drafts:
            self.full += 1
        elif drafts >= 2 and 0 < accepted < drafts:
            self.partial += 1
        self._pending = None

    def call_done(self) -> None:
        """Close one generate() call: its number of verification rounds goes into the histogram."""
        self.rounds[self._rounds_this_call] = self.rounds.get(self._rounds_this_call, 0) + 1
        self.call_accepted.append(self._accepted_this_call)
        self._rounds_this_call = 0
        self._accepted_this_call = 0
        self._pending = None

    def coverage(self) -> Coverage:
        return Coverage(
            dict(sorted(self.drafts.items())),
            dict(sorted(self.accepted.items())),
            dict(sorted(self.rounds.items())),
            self.full,
            self.partial,
        )

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        observer = self

        @functools.wraps(original)
        def wrapper(generator: Any, *args: Any, **kwargs: Any) -> Any:
            observer._depth += 1
            try:
                result = original(generator, *args, **kwargs)
            finally:
                observer._depth -= 1
            if observer._depth == 0:
                if name == "get_candidates":
                    input_ids = args[0] if args else kwargs["input_ids"]
                    observer._got_candidates(int(result[0].shape[-1]) - int(input_ids.shape[-1]))
                else:
                    matches = args[2] if len(args) > 2 else kwargs["num_matches"]
                    observer._verified(int(matches))
            return result

        return wrapper

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        module = importlib.import_module("transformers.generation.candidate_generator")
        patched: list[tuple[type, str, Any]] = []
        for cls in vars(module).values():
            if not isinstance(cls, type) or cls.__module__ != module.__name__:
                continue
            for name in self._METHODS:
                if name in vars(cls):
                    original = vars(cls)[name]
                    patched.append((cls, name, original))
                    setattr(cls, name, self._wrap(name, original))
        try:
            yield
        finally:
            for cls, name, original in reversed(patched):
                setattr(cls, name, original)
