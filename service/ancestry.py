"""Git order for a branch's commits: ancestors before descendants, whatever order they arrived in.

A branch's commits are numbered by ``branch_order``; every reader (history, the overview's head, the
bisection) walks that order. Commits arrive from pushes, pollers and the mirror in any order (a poll that saw
only the head, then a push listing its ancestors), so the order is derived from ancestry, never from arrival:
:func:`ancestry_order` is a *stable* topological sort. Commits keep their relative order unless ancestry says
otherwise; a commit that turns out to be an ancestor of one placed earlier moves to just before its first
descendant (a late-arriving ancestor lands in its place), with its own ancestors before it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def ancestry_order(shas: Sequence[str], parents: Mapping[str, Sequence[str]]) -> list[str]:
    """``shas`` (in their current order) reordered so that every commit comes after its ancestors among them.

    ``parents`` gives each commit's parents as recorded (missing or empty: unknown); parents outside ``shas``
    are ignored. Stable: with no ancestry between two commits, their current order stays. A cycle (a corrupt
    record) cannot loop: a commit already being placed is not placed again.
    """
    present = set(shas)
    placed: list[str] = []
    done: set[str] = set()
    for sha in shas:
        if sha in done:
            continue
        # Depth-first, iteratively: a commit's on-branch parents (first parent first) before the commit.
        stack: list[tuple[str, list[str]]] = [(sha, list(parents.get(sha, ())))]
        visiting = {sha}
        while stack:
            current, pending = stack[-1]
            while pending and (pending[0] not in present or pending[0] in done or pending[0] in visiting):
                pending.pop(0)
            if pending:
                parent = pending.pop(0)
                visiting.add(parent)
                stack.append((parent, list(parents.get(parent, ()))))
                continue
            stack.pop()
            visiting.discard(current)
            done.add(current)
            placed.append(current)
    return placed
