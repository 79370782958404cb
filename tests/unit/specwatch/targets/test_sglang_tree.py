"""The exact law of a draft-tree step under SGLang's target-only verification, against an independent derivation,
and the suite's tree experiment on the Python transcription of the kernel's rule (runs without SGLang).

The law (specwatch/targets/sglang/tree.py): (last accepted node v, last token y) has probability reach(v) p_v(y)
for y not a child token of v. Here it is recomputed by enumerating the ancestral process it claims to equal (draw
from p_v; a child's token moves to that child, any other token stops), and the transcription is run through the
suite: it passes at the lossless thresholds and fails below them (the target's own known-lossy settings) and with
the rule's mutants (a fresh coin per sibling, a residual that keeps the rejected siblings). On CUDA the real kernel
runs the same experiments (test_sglang_target.py).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from specwatch.cases import Case
from specwatch.protocol import Verdict
from specwatch.runner import SuiteConfig, run_suite
from specwatch.targets.sglang.cases import TREES, tree_cases, tree_fixtures
from specwatch.targets.sglang.tree import DraftTree, TreeExperiment, fixture_tree, run_tree_kernel, tree_rule_reference

pytestmark = pytest.mark.unit


def ancestral_law(tree: DraftTree) -> np.ndarray:
    """The law of (stopping node, token) of autoregressive sampling from the target, stopped when the token is not a
    child of the current node, by explicit recursion over the tree (not the module's reach/law code)."""
    p = tree.target_probs.double().numpy()
    out = np.zeros((tree.nodes, tree.vocab_size))

    def walk(v: int, mass: float) -> None:
        child_of = {tree.tokens[c]: c for c in range(1, tree.nodes) if tree.parent[c] == v}
        for y in range(tree.vocab_size):
            if y in child_of:
                walk(child_of[y], mass * p[v, y])
            else:
                out[v, y] += mass * p[v, y]

    walk(0, 1.0)
    return out.reshape(-1)


@pytest.mark.parametrize(("name", "vocab", "widths"), TREES)
def test_the_tree_law_is_the_target_s_ancestral_law_stopped_on_leaving_the_tree(name: str, vocab: int, widths: tuple[int, ...]) -> None:
    tree = fixture_tree(f"tree/{name}", vocab, widths)
    law = tree.law()
    assert law.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(law, ancestral_law(tree), atol=1e-12)
    assert tree.max_depth == len(widths)
    assert tree.nodes == 1 + sum(int(np.prod(widths[: d + 1])) for d in range(len(widths)))
    # Every child token's cell is impossible; expected acceptance is the sum of the drafts' reach.
    cells = law.reshape(tree.nodes, vocab)
    for c in range(1, tree.nodes):
        assert cells[tree.parent[c], tree.tokens[c]] == 0.0
    assert tree.expected_accepted == pytest.approx(float(tree.reach[1:].sum()))


def test_a_tree_with_two_children_of_one_token_is_refused() -> None:
    with pytest.raises(ValueError, match="two children with the same token"):
        DraftTree((-1, 0, 0), (0, 3, 3), torch.full((3, 4), 0.25, dtype=torch.float64))
    with pytest.raises(ValueError, match="parent"):
        DraftTree((-1, 2, 0), (0, 1, 2), torch.full((3, 4), 0.25, dtype=torch.float64))


def test_the_transcription_emits_paths_of_the_tree_in_the_kernel_s_layout() -> None:
    tree = fixture_tree("tree/branching2/V8/d2", 8, (2, 2))
    trials = run_tree_kernel(tree_rule_reference, tree, 500, torch.Generator().manual_seed(0), device=torch.device("cpu"))
    assert trials.violations == ()
    assert set(trials.accepted.tolist()) <= {0, 1, 2}
    for v, k in zip(trials.last_node.tolist(), trials.accepted.tolist(), strict=True):
        assert tree.depth(v) == k
    law = tree.law().reshape(tree.nodes, 8)
    cells = torch.stack((trials.last_node, trials.last_token), 1).tolist()
    assert all(law[v, y] > 0 for v, y in cells)  # no impossible (node, token) pair


def _case(tree: DraftTree, kernel=tree_rule_reference, **thresholds: float) -> Case:
    return Case(
        id="tree/test",
        family="tree",
        description="",
        epsilon=0.1,
        make_experiment=lambda device: TreeExperiment(tree, kernel, device, **thresholds),
    )


def _verdict(case: Case) -> tuple[Verdict, str]:
    run = run_suite([case], None, SuiteConfig(seed=5, epsilon=0.1))  # type: ignore[arg-type]  # tree cases ignore the sampler
    return run.results[0].verdict, run.results[0].reason or ""


def test_the_transcription_at_the_lossless_thresholds_passes_and_its_acceptance_matches() -> None:
    tree = fixture_tree("tree/branching3/V16/d2", 16, (3, 3))
    run = run_suite([_case(tree)], None, SuiteConfig(seed=5, epsilon=0.1))  # type: ignore[arg-type]
    (result,) = run.results
    assert result.verdict == Verdict.PASS, result.reason
    assert result.acceptance is not None
    assert result.acceptance.observed == pytest.approx(tree.expected_accepted, abs=0.1)


@pytest.mark.parametrize("thresholds", [{"threshold_acc": 0.5}, {"threshold_single": 0.1}])
def test_a_threshold_below_one_is_lossy_and_fails(thresholds: dict[str, float]) -> None:
    """SGLang's ``speculative_accept_threshold_acc`` / ``_single`` below 1 (lossy by design), through the transcription
    (labelled: the kernel itself is CUDA-only and runs these in test_sglang_target.py on a GPU)."""
    tree = fixture_tree("tree/branching3/V16/d2", 16, (3, 3))
    verdict, reason = _verdict(_case(tree, **thresholds))
    assert verdict == Verdict.FAIL
    assert "lossless/tree" in reason or "lossless/pos1" in reason


def _fresh_coin_per_sibling(*args: object, **kwargs: torch.Tensor) -> None:
    """A mutant of the rule: each sibling tested with its own coin (its node's), not its parent's one coin."""
    coins = kwargs["uniform_samples"]
    shifted = torch.roll(coins, 1, dims=1)  # the coin of the previous node in order: siblings no longer share one
    kwargs["uniform_samples"] = torch.where(torch.rand_like(coins) < 0.5, coins, shifted)
    tree_rule_reference(*args, **kwargs)  # type: ignore[arg-type]


def _keeps_rejected_siblings(*args: object, **kwargs: torch.Tensor) -> None:
    """A mutant: the residual is p at the stopping node, rejected children included (draft_probs never written)."""
    draft = kwargs["draft_probs"]
    kwargs["draft_probs"] = _Sink(draft)  # type: ignore[assignment]
    tree_rule_reference(*args, **kwargs)  # type: ignore[arg-type]


class _Sink:
    """Draft probabilities that swallow writes and read as zeros."""

    def __init__(self, like: torch.Tensor) -> None:
        self.like = like

    def __setitem__(self, key: object, value: object) -> None:
        pass

    def __getitem__(self, key: object) -> torch.Tensor:
        return torch.zeros_like(self.like[key])


@pytest.mark.parametrize("mutant", [_fresh_coin_per_sibling, _keeps_rejected_siblings], ids=["fresh_coin", "keeps_rejected"])
def test_mutants_of_the_tree_rule_are_caught(mutant) -> None:
    tree = fixture_tree("tree/branching3/V16/d2", 16, (3, 3))
    verdict, _reason = _verdict(_case(tree, kernel=functools.partial(mutant)))
    assert verdict == Verdict.FAIL


def test_tree_cases_without_the_kernel_are_skipped_with_the_reason_and_run_with_it() -> None:
    skipped = tree_cases(None, skip_reason="not reachable: no CUDA")
    assert [c.id for c in skipped] == [case_id for case_id, _ in tree_fixtures()]
    assert all(c.skip_reason == "not reachable: no CUDA" and c.make_experiment is None for c in skipped)
    running = tree_cases(tree_rule_reference)
    assert all(c.skip_reason is None and c.make_experiment is not None for c in running)
    experiment = running[0].make_experiment(torch.device("cpu"))  # type: ignore[misc]
    assert isinstance(experiment, TreeExperiment)
