"""The SGLang target's cases: the chain battery through the Triton chain sampler (classic and block verification),
draft trees through the CUDA tree kernel, and a sampled request's verification as ``eagle_sample`` dispatches it.

Ids: ``direct/...`` and ``direct_block/...`` (the battery's fixtures), ``tree/...`` (draft trees, :mod:`.tree`),
``engine/verify_dispatch/...`` (:mod:`.dispatch`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from specwatch.cases import DIRECT_CASES, EDGE_CASES, Case
from specwatch.experiments import ChainExperiment, CheckSpec, Experiment, Observation
from specwatch.laws import MAX_JOINT_CELLS
from specwatch.sampling import Sampler
from specwatch.targets.base import LibraryExperiment
from specwatch.targets.sglang.bindings import chain_sampler, has_block_verification
from specwatch.targets.sglang.dispatch import dispatch_sampler
from specwatch.targets.sglang.tree import DraftTree, Kernel, TreeExperiment, fixture_tree
from specwatch.targets.vllm.bindings_v2 import BlockVerificationExperiment

#: Trials of a fingerprint probe under Triton's interpreter (tens of milliseconds a trial there).
INTERPRETER_PROBE_TRIALS = 64

#: Draft trees (name, vocabulary, children per node at each depth): a chain (topk 1), EAGLE-like trees of two and
#: three children per node, and a tree whose width shrinks with depth.
TREES: tuple[tuple[str, int, tuple[int, ...]], ...] = (
    ("chain/V8/d3", 8, (1, 1, 1)),
    ("branching2/V8/d2", 8, (2, 2)),
    ("branching3/V16/d2", 16, (3, 3)),
    ("branching321/V64/d3", 64, (3, 2, 1)),
)


def tree_fixtures() -> tuple[tuple[str, DraftTree], ...]:
    return tuple((f"tree/{name}", fixture_tree(f"tree/{name}", vocab, widths)) for name, vocab, widths in TREES)


def tree_cases(kernel: Kernel | None, *, skip_reason: str | None = None, **thresholds: float) -> tuple[Case, ...]:
    """The draft trees through ``kernel`` (the CUDA tree kernel, or the transcription in tests), or skipped cases
    with ``skip_reason`` where it cannot run."""
    cases = []
    for case_id, tree in tree_fixtures():
        description = f"draft tree of {tree.nodes - 1} drafts, depth {tree.max_depth}, V = {tree.vocab_size}: target-only verification"

        def experiment(device: torch.device, tree: DraftTree = tree) -> Experiment:
            assert kernel is not None
            return TreeExperiment(tree, kernel, device, **thresholds)

        cases.append(
            Case(
                id=case_id,
                family="tree",
                description=description,
                epsilon=0.05,
                make_experiment=None if kernel is None else experiment,
                skip_reason=skip_reason if kernel is None else None,
            )
        )
    return tuple(cases)


class LosslessOnly(LibraryExperiment):
    """A chain step through a verification whose acceptance is not Leviathan's (target-only verification accepts
    a draft with probability p(draft), not min(1, p/q)): its lossless checks only."""

    acceptance_unmeasured = "target-only verification accepts with probability p(draft), not Leviathan's min(1, p/q)"

    def __init__(self, chain: ChainExperiment) -> None:
        self.chain = chain
        self.probe_trials = chain.probe_trials
        self._checks = tuple(c for c in chain.checks if c.layer.value == "lossless")

    @property
    def checks(self) -> Sequence[CheckSpec]:
        return self._checks

    @property
    def accepted_per_trial_max(self) -> int:
        return self.chain.accepted_per_trial_max

    def run(self, n: int, generator: torch.Generator) -> Observation:
        obs = self.chain.run(n, generator)
        return dataclasses.replace(obs, counts={c.name: obs.counts[c.name] for c in self._checks if c.name in obs.counts})


def _experiment(case: Case, sampler: Sampler, probe_trials: int | None, wrap: Callable[[ChainExperiment], Any] | None) -> Case:
    make = case.make_step
    assert make is not None

    def experiment(device: torch.device) -> Experiment:
        chain = ChainExperiment(make().to(device), sampler)
        if probe_trials is not None:
            chain.probe_trials = probe_trials
        wrapped: Experiment = wrap(chain) if wrap is not None else chain
        return wrapped

    return dataclasses.replace(case, make_experiment=experiment)


def chain_cases(kernel: Callable[..., Any], *, probe_trials: int | None = None) -> tuple[Case, ...]:
    """The battery through ``chain_speculative_sampling_triton`` (same ids), its edge checks (the kernel takes its
    coins as inputs), and the battery through its block verification (``direct_block/...``: checked on what it
    claims, the completed joint law or its adjacent pairs; skipped at V >= 1024, where both exceed the cells)."""
    classic = tuple(_experiment(c, chain_sampler(kernel), probe_trials, None) for c in DIRECT_CASES)
    edges = tuple(dataclasses.replace(c, make_step=c.make_step) for c in EDGE_CASES)
    if not has_block_verification(kernel):
        reason = "not reachable: this release's chain_speculative_sampling_triton has no block_verification"
        blocks = tuple(_as_block(dataclasses.replace(c, skip_reason=reason, make_step=None)) for c in DIRECT_CASES)
        return classic + edges + blocks
    block_sampler = chain_sampler(kernel, block=True)
    block_cases: list[Case] = []
    for case in DIRECT_CASES:
        step = case.step()
        if step.vocab_size ** (step.gamma + 1) > MAX_JOINT_CELLS and step.vocab_size**2 > MAX_JOINT_CELLS:
            reason = (
                "not reachable: block verification is checked on the completed joint law or its adjacent pairs, and at "
                f"V = {step.vocab_size} both exceed {MAX_JOINT_CELLS} cells"
            )
            block_cases.append(_as_block(dataclasses.replace(case, make_step=None, skip_reason=reason)))
        else:
            block_cases.append(_as_block(_experiment(case, block_sampler, probe_trials, BlockVerificationExperiment)))
    return classic + edges + tuple(block_cases)


def _as_block(case: Case) -> Case:
    return dataclasses.replace(
        case,
        id=case.id.replace("direct/", "direct_block/", 1),
        family="direct_block",
        description=f"block verification: {case.description}",
    )


#: The fixture a dispatch case verifies: peaked, far-apart p and q, three drafts.
DISPATCH_FIXTURE = "direct/far_apart/V8/g3"


def dispatch_cases(
    uses_greedy: Callable[..., bool], *, chain_kernel: Kernel | None, tree_kernel: Kernel | None, source: str
) -> tuple[Case, ...]:
    """A sampled request's verification as ``eagle_sample`` dispatches it on the run's device, with rejection
    sampling off (the default) and on; the branch taken is in the description once the case is built."""
    base = next(c for c in DIRECT_CASES if c.id == DISPATCH_FIXTURE)
    cases = []
    for rejection, suffix in ((False, "default"), (True, "rejection_sampling")):

        def experiment(device: torch.device, rejection: bool = rejection) -> Experiment:
            sampler, _branch = dispatch_sampler(
                uses_greedy, device=device, rejection_sampling=rejection, chain_kernel=chain_kernel, tree_kernel=tree_kernel
            )
            assert base.make_step is not None
            return LosslessOnly(ChainExperiment(base.make_step().to(device), sampler))

        cases.append(
            Case(
                id=f"engine/verify_dispatch/{suffix}/V8/g3",
                family="engine",
                description=(
                    f"a sampled request (temperature 1) verified as eagle_sample dispatches it on the run's device "
                    f"(speculative_use_rejection_sampling={rejection}; {source}): the greedy branch commits the target's argmax"
                ),
                epsilon=0.05,
                make_experiment=experiment,
            )
        )
    return tuple(cases)
