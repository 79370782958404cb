"""Git order (:func:`service.ancestry.ancestry_order`): a stable topological sort of a branch's commits."""

from __future__ import annotations

import pytest

from service.ancestry import ancestry_order


class TestAncestryOrder:
    def test_a_late_ancestor_moves_before_its_first_descendant_with_its_own_ancestors(self) -> None:
        # A poll saw H; a push then brought X and Y (Y's parent X, H's parent Y).
        assert ancestry_order(["p", "h", "x", "y"], {"h": ["y"], "y": ["x"], "x": ["p"]}) == ["p", "x", "y", "h"]

    def test_commits_without_ancestry_between_them_keep_their_order(self) -> None:
        assert ancestry_order(["p", "h", "q", "x"], {"h": ["x"]}) == ["p", "x", "h", "q"]
        assert ancestry_order(["c", "a", "b"], {}) == ["c", "a", "b"]

    def test_parents_off_the_branch_are_ignored_and_a_merge_follows_both_parents(self) -> None:
        order = ancestry_order(["m", "a", "b"], {"m": ["a", "b"], "a": ["elsewhere"]})
        assert order == ["a", "b", "m"]

    @pytest.mark.parametrize("parents", [{"a": ["b"], "b": ["a"]}, {"a": ["a"]}])
    def test_a_corrupt_cycle_terminates_with_every_commit_once(self, parents: dict[str, list[str]]) -> None:
        assert sorted(ancestry_order(["a", "b"], parents)) == ["a", "b"]
