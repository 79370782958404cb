"""The SGLang adapter's bindings, dispatch and case catalogue, against fakes with the kernels' signature (runs
without SGLang installed).

The kernel-shaped fake is the Python transcription of the CUDA tree kernel's rule (target-only verification), which
takes the very arguments ``chain_speculative_sampling_triton`` takes: the chain layout of ``call_chain`` (node 0 the
last verified token, node i the i-th draft) is checked by the battery passing through it, and failing when the
layout is read one node off. The real Triton kernel runs in test_sglang_target.py under Triton's interpreter.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from specwatch.cases import DIRECT_CASES, select
from specwatch.experiments import ChainExperiment
from specwatch.protocol import Verdict
from specwatch.runner import SuiteConfig, run_suite
from specwatch.targets.sglang.bindings import AdapterError, bind, call_chain, engine_thresholds
from specwatch.targets.sglang.cases import LosslessOnly, chain_cases, dispatch_cases
from specwatch.targets.sglang.dispatch import compile_function, dispatch_sampler, greedy_verify, platform_flags
from specwatch.targets.sglang.tree import tree_rule_reference

pytestmark = pytest.mark.unit

#: sglang 0.5.23's predicate, as its eagle_utils.py spells it, and ROCm's treatment extended to CPU and XPU.
RELEASED = '''
def _verify_uses_greedy(*, is_all_greedy, is_cpu, is_hip, is_xpu, use_rejection_sampling):
    """Whether EAGLE verify must commit argmax instead of taking the sampling path."""
    return is_all_greedy or is_cpu or is_xpu or (is_hip and not use_rejection_sampling)
'''
PATCHED = RELEASED.replace(
    "is_all_greedy or is_cpu or is_xpu or (is_hip and not use_rejection_sampling)",
    "is_all_greedy or ((is_cpu or is_xpu or is_hip) and not use_rejection_sampling)",
)
CPU = torch.device("cpu")


def _predicate(tmp_path: Path, source: str):
    path = tmp_path / "eagle_utils.py"
    path.write_text("import torch\nfrom sglang.srt.utils import is_cpu\n\n_is_cpu = is_cpu()\n" + source)
    return compile_function(path, "_verify_uses_greedy")


def test_the_predicate_is_compiled_alone_from_the_release_s_file(tmp_path: Path) -> None:
    """The module's imports (sglang, here absent) are not run: only the function."""
    uses_greedy = _predicate(tmp_path, RELEASED)
    assert uses_greedy(is_all_greedy=False, use_rejection_sampling=True, **platform_flags(CPU))
    assert not uses_greedy(is_all_greedy=False, use_rejection_sampling=False, is_cpu=False, is_hip=False, is_xpu=False)
    with pytest.raises(AdapterError, match="defines no"):
        compile_function(tmp_path / "eagle_utils.py", "eagle_sample")


def test_platform_flags_follow_the_run_s_device() -> None:
    assert platform_flags(CPU) == {"is_cpu": True, "is_hip": False, "is_xpu": False}
    assert platform_flags(torch.device("cuda")) == {"is_cpu": False, "is_hip": bool(torch.version.hip), "is_xpu": False}


def test_greedy_verification_commits_the_argmax() -> None:
    step = select(["direct/far_apart/V8/g3"], DIRECT_CASES)[0].step()
    best = step.target_logits.argmax(dim=-1)
    drafts = torch.stack((best[:3], torch.tensor([best[0], (best[1] + 1) % 8, best[2]]), (best[:3] + 1) % 8))
    tokens, accepted = greedy_verify(step, drafts)
    assert accepted.tolist() == [3, 1, 0]
    assert tokens[0].tolist() == best.tolist()
    assert tokens[1].tolist() == [int(best[0]), int(best[1]), -1, -1]
    assert tokens[2].tolist() == [int(best[0]), -1, -1, -1]


def _dispatch_run(uses_greedy, rejection: bool) -> tuple[Verdict, str]:
    step = select(["direct/far_apart/V8/g3"], DIRECT_CASES)[0].step()
    sampler, branch = dispatch_sampler(
        uses_greedy, device=CPU, rejection_sampling=rejection, chain_kernel=None, tree_kernel=tree_rule_reference
    )
    case = select(["direct/far_apart/V8/g3"], DIRECT_CASES)[0]
    experiment = LosslessOnly(ChainExperiment(step, sampler))
    run = run_suite(
        [type(case)(id="engine/test", family="engine", description="", epsilon=0.1, make_experiment=lambda d: experiment)],
        sampler,
        SuiteConfig(seed=2, epsilon=0.3, max_trials=2048),
    )
    return run.results[0].verdict, branch


def test_on_a_cpu_the_released_dispatch_is_greedy_and_fails_and_the_patched_one_samples_and_passes(tmp_path: Path) -> None:
    """The dispatch case's two outcomes: sglang 0.5.23's predicate sends a sampled request to the greedy branch on a
    CPU (the finding: the case fails); with the patch and a sampled verification available (here the transcription
    as the tree kernel) it passes."""
    released, patched = _predicate(tmp_path, RELEASED), _predicate(tmp_path, PATCHED)
    assert _dispatch_run(released, rejection=False) == (Verdict.FAIL, "greedy (argmax)")
    assert _dispatch_run(patched, rejection=False)[1] == "greedy (argmax)"  # the patch still needs rejection sampling on CPU
    unavailable, _ = dispatch_sampler(patched, device=CPU, rejection_sampling=True, chain_kernel=None, tree_kernel=None)
    with pytest.raises(AdapterError, match="not available"):
        unavailable(DIRECT_CASES[0].step(), 4, torch.Generator())

    def cuda_like(**flags: bool) -> bool:
        return bool(patched(**{**flags, "is_cpu": False}))

    assert _dispatch_run(cuda_like, rejection=False) == (Verdict.PASS, "tree_speculative_sampling_target_only")


def test_dispatch_cases_name_both_settings() -> None:
    cases = dispatch_cases(lambda **_: True, chain_kernel=None, tree_kernel=None, source="_verify_uses_greedy")
    assert [c.id for c in cases] == ["engine/verify_dispatch/default/V8/g3", "engine/verify_dispatch/rejection_sampling/V8/g3"]


def test_the_chain_layout_passes_through_a_kernel_shaped_fake_and_a_layout_one_node_off_fails() -> None:
    """``call_chain`` with target-only draft probabilities through the transcription: lossless; the same with the
    candidates shifted by one node (the draft read where the root is) is caught."""
    case = select(["direct/far_apart/V8/g3"], DIRECT_CASES)[0]

    def sampler_for(kernel):
        def sampler(step, n, generator):
            from specwatch.sampling import SpecOutput, sample_rows, uniforms

            drafts = sample_rows(step.draft_probs, uniforms(n, step.gamma, generator, step.device))
            tokens, k = call_chain(kernel, step, drafts, generator, block=False, target_only=True)
            return SpecOutput(drafts=drafts, tokens=tokens, n_accepted=k)

        return sampler

    def shifted(*args, candidates, **kwargs):
        tree_rule_reference(*args, candidates=torch.roll(candidates, 1, dims=1), **kwargs)

    shifted.__signature__ = inspect.signature(tree_rule_reference)  # type: ignore[attr-defined]
    results = {}
    for name, kernel in (("plain", tree_rule_reference), ("shifted", shifted)):
        sampler = sampler_for(kernel)
        experiment = LosslessOnly(ChainExperiment(case.step(), sampler))
        probe = type(case)(id=f"direct/{name}", family="direct", description="", epsilon=0.1, make_experiment=lambda d, e=experiment: e)
        results[name] = run_suite([probe], sampler, SuiteConfig(seed=4, epsilon=0.3, max_trials=2048)).results[0].verdict
    assert results == {"plain": Verdict.PASS, "shifted": Verdict.FAIL}


def _kernel(*, threshold_single=1.0, block_verification=False):
    def kernel(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        uniform_samples,
        uniform_samples_for_final_sampling,
        target_probs,
        draft_probs,
        threshold_single=threshold_single,
        threshold_acc=1.0,
        deterministic=True,
        *,
        block_verification=block_verification,
    ) -> None:
        pass

    return kernel


def test_binding_by_signature() -> None:
    core = {name: None for name in inspect.signature(_kernel()).parameters if name != "block_verification"}
    assert bind(_kernel(), core, label="k", chosen={"block_verification": True})["block_verification"] is True
    with pytest.raises(AdapterError, match=r"defaults to 0\.5"):
        bind(_kernel(threshold_single=0.5), core, label="k")
    with pytest.raises(AdapterError, match="no parameter"):
        bind(_kernel(), {**core, "temperature": 1.0}, label="k")

    def older(predicts, accept_index, extra):
        pass

    with pytest.raises(AdapterError, match="no block_verification"):
        bind(older, {"predicts": 0, "accept_index": 0, "extra": 0}, label="k", chosen={"block_verification": True})
    with pytest.raises(AdapterError, match="requires unknown argument 'extra'"):
        bind(older, {"predicts": 0, "accept_index": 0}, label="k")


def test_the_engine_s_thresholds_must_default_to_one() -> None:
    lossless = {"speculative_accept_threshold_single": 1.0, "speculative_accept_threshold_acc": 1.0}
    assert engine_thresholds(lossless) == {"threshold_single": 1.0, "threshold_acc": 1.0}
    with pytest.raises(AdapterError, match=r"defaults to 0\.9"):
        engine_thresholds({**lossless, "speculative_accept_threshold_acc": 0.9})
    with pytest.raises(AdapterError, match=r"no speculative_accept_threshold_single"):
        engine_thresholds({"speculative_accept_threshold_acc": 1.0})


def test_the_chain_catalogue_has_classic_edge_and_block_cases_and_skips_block_where_the_kernel_lacks_it() -> None:
    cases = chain_cases(tree_rule_reference)  # no block_verification parameter
    ids = {c.id: c for c in cases}
    assert "direct/far_apart/V8/g1" in ids
    assert "edge/transformers_fixture/V10/g3/u_max" in ids
    assert (
        ids["direct_block/far_apart/V8/g1"].skip_reason
        == "not reachable: this release's chain_speculative_sampling_triton has no block_verification"
    )
    with_block = {c.id: c for c in chain_cases(_kernel())}
    assert with_block["direct_block/far_apart/V8/g1"].skip_reason is None
    assert with_block["direct_block/large_vocab/V50257/g1"].skip_reason.startswith("not reachable: block verification")  # type: ignore[union-attr]
