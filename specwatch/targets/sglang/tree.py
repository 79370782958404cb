"""A tree step of SGLang's target-only verification, its exact law, and a Python transcription of the kernel's rule.

SGLang verifies a draft *tree* (EAGLE with ``topk > 1``; a chain is the tree with one child per node) with the CUDA
kernel ``tree_speculative_sampling_target_only`` (``kernels/jit/include/sgl_kernel/speculative/sampling.cuh``).
Node 0 is the root (the last verified token); node i > 0 holds the draft token ``candidates[i]``; the children of a
node are a linked list (``retrive_next_token``: first child, ``retrive_next_sibling``: next sibling, -1 ends);
``target_probs[i]`` is the target's (processed) next-token law after node i. Its rule, per request:

- at the current node v, one coin u (``uniform_samples[v]``); walk v's children c_1, c_2, ... in sibling order,
  adding their target probabilities: accept c_i at the first i with p_v(c_i) > 0 and
  ``u < (p_v(c_1) + ... + p_v(c_i)) / threshold_acc`` or ``p_v(c_i) >= threshold_single``; then v := c_i;
  each rejected child's token gets ``draft_probs[v][c] := p_v(c)``;
- when no child is accepted (or v has none), or ``accept_index`` is full, the last token is drawn by inverse CDF
  with ``uniform_samples_for_final_sampling`` from ``relu(p_v - draft_probs[v])`` (from p_v alone when every slot
  was accepted): p_v with the rejected children removed.

**Exact law** (derived here; tested against this module's transcription and, on CUDA, the kernel). Let the children
of every node carry distinct tokens, fixed before the coins are drawn (how EAGLE's top-k tree is built). At the
lossless defaults ``threshold_single = threshold_acc = 1`` the walk over the children is inverse-CDF sampling from
p_v with the children's tokens ordered first: child c is accepted with probability p_v(c), and otherwise the
emitted token is drawn from p_v restricted to the tokens that are not children, renormalised, so that token y not
a child of v has probability (1 - sum_c p_v(c)) * p_v(y) / (1 - sum_c p_v(c)) = p_v(y). Hence, with reach(v) the
product of p along the path from the root to v,

    P(last accepted node = v, last token = y) = reach(v) * p_v(y)   for y not a child token of v (any y at a leaf),

and 0 for y a child token of v: the emitted tokens follow the target's autoregressive law, stopped when they leave
the tree. The draft's own probabilities play no part (drafts sampled from any law independent of the coins give the
same law). A threshold below 1 accepts more (a child is accepted with probability min(1, sum/threshold_acc) minus
the earlier ones', or always when p_v(c) >= threshold_single): lossy by design. Two children with the same token
would have that token's probability counted twice: also lossy (:class:`DraftTree` refuses them).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from specwatch.experiments import CheckSpec, Observation, Violation
from specwatch.laws import validate_law
from specwatch.protocol import Layer
from specwatch.sampling import TargetRaised
from specwatch.targets.base import LibraryExperiment

#: A verification kernel with ``tree_speculative_sampling_target_only``'s (and ``chain_speculative_sampling_triton``'s)
#: arguments: it writes ``predicts``, ``accept_index`` and ``accept_token_num``.
Kernel = Callable[..., Any]


def coins(n: int, k: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Verification coins as SGLang's ``_verify_coins`` draws them: float32 ``torch.rand`` (an edge check's forced
    extreme is then float32's largest value below 1, the kernel's own)."""
    return torch.rand((n, k), generator=generator, dtype=torch.float32, device=device)


@dataclass(frozen=True)
class DraftTree:
    """A draft tree as SGLang lays it out: ``parent[i]`` (-1 for the root, node 0; a parent precedes its children,
    which are in sibling order), ``tokens[i]`` the token of node i (the root's is the last verified token), and
    ``target_probs[i]`` the target's next-token law after node i (float64, rows summing to 1)."""

    parent: tuple[int, ...]
    tokens: tuple[int, ...]
    target_probs: torch.Tensor

    def __post_init__(self) -> None:
        nodes = len(self.parent)
        if self.parent[0] != -1 or any(not 0 <= p < i for i, p in enumerate(self.parent) if i):
            raise ValueError(f"parent must list -1 for node 0 and an earlier node for every other: {self.parent}")
        if len(self.tokens) != nodes or tuple(self.target_probs.shape[:1]) != (nodes,):
            raise ValueError("tokens and target_probs need one entry per node")
        for v in range(nodes):
            child_tokens = [self.tokens[c] for c in self.children(v)]
            if len(set(child_tokens)) != len(child_tokens):
                raise ValueError(f"node {v} has two children with the same token: {child_tokens}")

    @property
    def nodes(self) -> int:
        return len(self.parent)

    @property
    def vocab_size(self) -> int:
        return int(self.target_probs.shape[1])

    def children(self, v: int) -> list[int]:
        return [c for c in range(1, self.nodes) if self.parent[c] == v]

    def depth(self, v: int) -> int:
        d = 0
        while self.parent[v] != -1:
            v, d = self.parent[v], d + 1
        return d

    @property
    def max_depth(self) -> int:
        return max(self.depth(v) for v in range(self.nodes))

    def retrieve(self) -> tuple[list[int], list[int]]:
        """SGLang's ``retrive_next_token`` (first child, -1 if none) and ``retrive_next_sibling`` (-1 ends)."""
        first, sibling = [-1] * self.nodes, [-1] * self.nodes
        for v in range(self.nodes):
            kids = self.children(v)
            if kids:
                first[v] = kids[0]
            for a, b in itertools.pairwise(kids):
                sibling[a] = b
        return first, sibling

    @cached_property
    def reach(self) -> NDArray[np.float64]:
        """reach(v): the probability that the walk accepts node v (the product of p along its path)."""
        p = self.target_probs.double().cpu().numpy()
        reach = np.zeros(self.nodes)
        reach[0] = 1.0
        for v in range(1, self.nodes):
            reach[v] = reach[self.parent[v]] * p[self.parent[v], self.tokens[v]]
        return reach

    def law(self) -> NDArray[np.float64]:
        """The exact law of (last accepted node v, last token y) over cells v * V + y (module docstring)."""
        p = self.target_probs.double().cpu().numpy()
        cells = self.reach[:, None] * p
        for v in range(self.nodes):
            for c in self.children(v):
                cells[v, self.tokens[c]] = 0.0
        return validate_law("tree step", cells.reshape(-1))

    def first_token_law(self) -> NDArray[np.float64]:
        """The first emitted token's law: p_root."""
        return validate_law("tree first token", self.target_probs[0].double().cpu().numpy())

    @property
    def expected_accepted(self) -> float:
        """Expected accepted drafts per step: the sum of reach(v) over the non-root nodes."""
        return float(self.reach[1:].sum())


def tree_rule_reference(  # noqa: PLR0917 - the kernel's positional signature
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,  # the kernel's argument: a reduction order, no law
) -> None:
    """A Python transcription of ``TreeSpeculativeSamplingTargetOnly`` (sglang 0.5.23), same arguments and
    effects (float32 as the kernel); not SGLang's code. The kernel's block-wide inverse-CDF scan becomes a cumsum:
    the first token whose running sum exceeds u * sum, else the last token with positive mass, else V - 1."""
    batch, spec_tokens = accept_index.shape
    vocab = target_probs.shape[-1]
    thr_acc = max(float(np.float32(threshold_acc)), 1e-9)
    thr_single = float(np.float32(threshold_single))
    for b in range(batch):
        coin = float(uniform_samples[b, 0])
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, cur, row = 0, 0, 0
        for _ in range(1, spec_tokens):
            cur = int(retrive_next_token[b, cur])
            prob_acc = torch.tensor(0.0, dtype=torch.float32)
            while cur != -1:
                token = int(candidates[b, cur])
                single = target_probs[b, row, token].float()
                prob_acc = prob_acc + single
                if float(single) > 0 and (coin < float(prob_acc) / thr_acc or float(single) >= thr_single):
                    row, coin = cur, float(uniform_samples[b, cur])
                    predicts[last] = token
                    accepted += 1
                    last = int(retrive_index[b, cur])
                    accept_index[b, accepted] = last
                    break
                draft_probs[b, row, token] = target_probs[b, row, token]
                cur = int(retrive_next_sibling[b, cur])
            if cur == -1:
                break
        accept_token_num[b] = accepted
        p = target_probs[b, row].float()
        residual = p if accepted == spec_tokens - 1 else (p - draft_probs[b, row].float()).clamp(min=0)
        u = float(uniform_samples_for_final_sampling[b]) * float(residual.sum())
        above = torch.nonzero(torch.cumsum(residual, 0) > u)
        if len(above):
            predicts[last] = int(above[0])
        else:
            positive = torch.nonzero(residual > 0)
            predicts[last] = int(positive[-1]) if len(positive) else vocab - 1


@dataclass(frozen=True)
class TreeTrials:
    """What n requests of one tree step produced: the last accepted node and the last token of each, and any
    structural violation (an accepted path that is not a path of the tree, a predicted token that is not the
    accepted child's)."""

    last_node: torch.Tensor
    last_token: torch.Tensor
    first_token: torch.Tensor
    accepted: torch.Tensor
    violations: tuple[Violation, ...]


def run_tree_kernel(
    kernel: Kernel, tree: DraftTree, n: int, generator: torch.Generator, *, device: torch.device, **thresholds: float
) -> TreeTrials:
    """n requests of ``tree`` through ``kernel`` in one call (the batch of its grid), coins from ``generator``;
    ``thresholds``: ``threshold_single`` and ``threshold_acc`` (1.0, the defaults, unless given)."""
    nodes, vocab = tree.nodes, tree.vocab_size
    first, sibling = tree.retrieve()
    rows = torch.arange(n, device=device, dtype=torch.int64)[:, None] * nodes

    def as_batch(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device).expand(n, nodes).contiguous()

    target = tree.target_probs.to(device=device, dtype=torch.float32)
    spec_tokens = tree.max_depth + 1
    out_predicts = torch.full((n * nodes,), -1, dtype=torch.int32, device=device)
    accept_index = torch.full((n, spec_tokens), -1, dtype=torch.int32, device=device)
    accept_num = torch.zeros(n, dtype=torch.int32, device=device)
    kernel(
        predicts=out_predicts,
        accept_index=accept_index,
        accept_token_num=accept_num,
        candidates=as_batch(list(tree.tokens)),
        retrive_index=(rows + torch.arange(nodes, device=device)).contiguous(),
        retrive_next_token=as_batch(first),
        retrive_next_sibling=as_batch(sibling),
        uniform_samples=coins(n, nodes, generator, device),
        uniform_samples_for_final_sampling=coins(n, 1, generator, device).reshape(n),
        target_probs=target[None].expand(n, nodes, vocab).contiguous(),
        draft_probs=torch.zeros((n, nodes, vocab), dtype=torch.float32, device=device),
        threshold_single=thresholds.get("threshold_single", 1.0),
        threshold_acc=thresholds.get("threshold_acc", 1.0),
        deterministic=True,
    )
    return read_paths(tree, out_predicts.long().cpu(), accept_index.long().cpu(), accept_num.long().cpu())


def read_paths(tree: DraftTree, predicts: torch.Tensor, accept_index: torch.Tensor, accept_num: torch.Tensor) -> TreeTrials:
    """The kernel's outputs read back into (last node, last token, first token, accepted), checking each path."""
    n, nodes = accept_index.shape[0], tree.nodes
    violations: list[Violation] = []
    local = accept_index - torch.arange(n)[:, None] * nodes
    last_node = torch.zeros(n, dtype=torch.long)
    last_token = torch.zeros(n, dtype=torch.long)
    first_token = torch.zeros(n, dtype=torch.long)
    for b in range(n):
        k = int(accept_num[b])
        path = [int(x) for x in local[b, : k + 1]] if 0 <= k < accept_index.shape[1] else []
        if not path or path[0] != 0 or any(not 0 <= v < nodes or tree.parent[v] != u for u, v in itertools.pairwise(path)):
            violations.append(Violation(Layer.LOSSLESS, f"request {b}: accept_index {local[b].tolist()} is not a path of the tree"))
            break
        emitted = [int(predicts[b * nodes + v]) for v in path]
        if emitted[:-1] != [tree.tokens[v] for v in path[1:]]:
            violations.append(Violation(Layer.LOSSLESS, f"request {b}: predicted {emitted[:-1]} differ from the accepted drafts"))
            break
        if not 0 <= emitted[-1] < tree.vocab_size:
            violations.append(Violation(Layer.LOSSLESS, f"request {b}: last token {emitted[-1]} outside [0, {tree.vocab_size})"))
            break
        last_node[b], last_token[b], first_token[b] = path[-1], emitted[-1], emitted[0]
    return TreeTrials(last_node, last_token, first_token, accept_num, tuple(violations))


class TreeExperiment(LibraryExperiment):
    """Trials of one tree step through a verification kernel, against the exact law of the module docstring:
    ``lossless/tree`` ((last accepted node, last token) ~ reach(v) p_v(y)) and ``lossless/pos1`` (the first token ~
    p_root). Acceptance is compared with sum of reach(v) over the drafts."""

    probe_trials = 256

    def __init__(self, tree: DraftTree, kernel: Kernel, device: torch.device, **thresholds: float) -> None:
        self.tree, self.kernel, self.device, self.thresholds = tree, kernel, device, thresholds
        self._checks = (
            CheckSpec("lossless/tree", Layer.LOSSLESS, tree.law(), 1.0),
            CheckSpec("lossless/pos1", Layer.LOSSLESS, tree.first_token_law(), 1.0),
        )

    @property
    def checks(self) -> Sequence[CheckSpec]:
        return self._checks

    @property
    def expected_acceptance(self) -> float:
        return self.tree.expected_accepted

    @property
    def accepted_per_trial_max(self) -> int:
        return self.tree.max_depth

    def run(self, n: int, generator: torch.Generator) -> Observation:
        try:
            trials = run_tree_kernel(self.kernel, self.tree, n, generator, device=self.device, **self.thresholds)
        except Exception as exc:
            raise TargetRaised(exc) from exc
        if trials.violations:
            return Observation({}, trials.violations, 0, b"")
        vocab = self.tree.vocab_size
        cells = trials.last_node * vocab + trials.last_token
        counts = {
            "lossless/tree": torch.bincount(cells, minlength=self.tree.nodes * vocab).numpy().astype(np.int64),
            "lossless/pos1": torch.bincount(trials.first_token, minlength=vocab).numpy().astype(np.int64),
        }
        sample = cells[:256].numpy().astype(np.int64).tobytes()
        return Observation(counts, (), int(trials.accepted.sum()), sample)


def fixture_tree(name: str, vocab: int, branching: Sequence[int], *, concentration: float = 0.5) -> DraftTree:
    """A deterministic tree: each node at depth d has ``branching[d]`` children whose tokens are the most likely
    tokens of a noisy copy of the node's target law (how EAGLE's top-k picks them), target rows Dirichlet."""
    import hashlib  # noqa: PLC0415

    rng = np.random.default_rng(int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big"))
    parent, tokens, rows = [-1], [int(rng.integers(vocab))], [rng.dirichlet(np.full(vocab, concentration))]
    frontier = [0]
    for width in branching:
        nxt = []
        for v in frontier:
            noisy = np.log(rows[v] + 1e-12) + rng.normal(0, 1.0, vocab)
            for token in np.argsort(-noisy)[:width]:
                parent.append(v)
                tokens.append(int(token))
                rows.append(rng.dirichlet(np.full(vocab, concentration)))
                nxt.append(len(parent) - 1)
        frontier = nxt
    return DraftTree(tuple(parent), tuple(tokens), torch.tensor(np.array(rows), dtype=torch.float64))
