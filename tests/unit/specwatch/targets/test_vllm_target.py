"""The vLLM target against an installed vLLM (a CPU build here: ``vllm-cpu``).

Marked ``vllm``: ``make test-vllm`` installs the CPU build and runs them with it first on PYTHONPATH
(CI does, after ``make test``, which leaves them out). The binding logic itself is tested without vLLM in
test_vllm_binding.py.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from specwatch.cases import select
from specwatch.protocol import Failure, Verdict
from specwatch.runner import SuiteConfig, run_suite
from specwatch.targets.loader import resolve
from specwatch.targets.vllm.e2e import E2E_HORIZON

pytestmark = [
    pytest.mark.vllm,
    # vLLM's import chain warns (torch.compile in vllm.utils.deep_gemm reaches torch.jit.script_method; the
    # kernel-override registry probes torch.distributed.reduce_op): the library's warnings are not under test.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    # numba warns (NumbaPendingDeprecationWarning) when it compiles vLLM's ngram proposer, whose batch_propose_numba
    # takes a reflected list: on the first ngram proposal of a process, inside LLM.generate.
    pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
]

_REPRO = Path(__file__).resolve().parents[4] / "docs" / "repro" / "vllm_cpu_expand_kernel.py"


@pytest.fixture(scope="module")
def target():
    pytest.importorskip("vllm", reason="the vLLM target needs vllm (vllm-cpu on CPU) first on PYTHONPATH (make test-vllm)")
    return resolve("vllm")


def _run(target, patterns, **config):
    cases = select(patterns, target.cases)
    assert cases, patterns
    return run_suite(cases, target.sampler, SuiteConfig(seed=3, **config), target=target.spec, library=target.library)


def _verdicts(run):
    return {r.case_id: r.verdict for r in run.results}


def test_the_adapter_records_the_builds_identity(target):
    import vllm

    assert target.library.version == vllm.__version__
    assert target.library.distribution in ("vllm", "vllm-cpu")
    assert target.library.details["torch"]
    ids = {c.id for c in target.cases}
    assert {
        "direct/greedy_draft/V8/g3",
        "direct/verify_path/V64/g3",
        "e2e/ngram/processed",
        "e2e/greedy/draft_model",
        "e2e/eagle/plain",
        "e2e/eagle3/plain",
        "e2e/eagle3/processed",
        "e2e/greedy/eagle3",
    } <= ids
    assert not [c.id for c in target.cases if c.id.startswith("e2e/") and c.skip_reason], "vllm-cpu 0.32.0 runs every e2e engine"


def test_the_default_profile_designs_sampling_cases_at_tv_0_03_and_direct_cases_at_0_05_the_large_vocabulary_at_0_1(target):
    sampling = [c for c in target.cases if c.family == "e2e" and not c.id.startswith("e2e/greedy/")]
    assert sampling
    assert {c.epsilon for c in sampling} == {0.03}
    direct = [c for c in target.cases if c.family == "direct"]
    assert {c.id: c.epsilon for c in direct if c.id.startswith("direct/large_vocab/")} == {"direct/large_vocab/V50257/g1": 0.1}
    assert min(c.epsilon for c in direct) >= 0.05
    assert min(SuiteConfig(quick=True).epsilon_for(c) for c in target.cases if c.quick) == 0.05  # issue 39: --quick at TV 0.05


def test_unprocessed_direct_cases_pass_through_vllms_own_rejection_sample(target):
    run = _run(target, ["direct/far_apart/V8/g1", "direct/onehot_q/V64/g3", "direct/greedy_draft/V8/g3"], quick=True)
    assert run.verdict == Verdict.PASS, [(r.case_id, r.reason) for r in run.results if r.verdict != Verdict.PASS]


def _cpu_build(target) -> bool:
    return target.library.details["platform"] == "cpu"


def test_finding_cpu_expand_kernel_breaks_every_processed_verification(target):
    """docs/findings.md, "vLLM on CPU: speculative sampling verifies with uninitialised temperature, top-k and
    top-p": an expected failure on CPU builds of vLLM 0.32.0, kept visible."""
    if not _cpu_build(target):
        pytest.skip("the finding is in the CPU backend's kernel overrides")
    run = _run(target, ["direct/top_p_target/V64/g3", "direct/verify_path/V64/g3"], quick=True)
    assert all(v != Verdict.PASS for v in _verdicts(run).values()), _verdicts(run)


def test_finding_cpu_expand_kernel_patched_direct_cases_pass(target, monkeypatch):
    """The proposed patch (docs/repro/vllm_cpu_expand_kernel.py) makes the same cases pass."""
    if not _cpu_build(target):
        pytest.skip("the finding is in the CPU backend's kernel overrides")
    _patch_expand_kernel(monkeypatch)
    run = _run(target, ["direct/top_p_target/V64/g3", "direct/verify_path/V64/g3", "direct/greedy_draft_processed/V64/g5"], quick=True)
    assert run.verdict == Verdict.PASS, [(r.case_id, r.reason) for r in run.results if r.verdict != Verdict.PASS]


def test_finding_edge_checks_accept_a_p_zero_draft_when_the_uniform_is_zero(target):
    """docs/findings.md, "vLLM's ratio test accepts a draft the target forbids when the uniform is 0"."""
    run = _run(target, ["edge/p_zero_draft/V4/g1/*"])
    assert _verdicts(run) == {"edge/p_zero_draft/V4/g1/u_min": Verdict.FAIL, "edge/p_zero_draft/V4/g1/u_max": Verdict.PASS}


def _checks(run, case_id):
    (result,) = [r for r in run.results if r.case_id == case_id]
    return result, {c.name: c for c in result.checks}


def test_e2e_control_passes_every_token_of_the_long_horizon_against_its_conditional_law(target):
    """Plain sampling (no speculation) with processing on: the joint law and both conditional checks pass, and
    the conditional checks saw every token of the 12-token horizon but the rows too close to call."""
    run = _run(target, ["e2e/control/processed"], quick=True)
    result, checks = _checks(run, "e2e/control/processed")
    assert result.verdict == Verdict.PASS, result.reason
    assert {"lossless/first3", "lossless/pit_id", "lossless/pit_prob"} <= set(checks)
    assert checks["lossless/pit_id"].observations > 0.9 * 12 * result.n_trials


def _patch_expand_kernel(monkeypatch) -> None:
    """The proposed patch of docs/findings.md (docs/repro/vllm_cpu_expand_kernel.py), process-wide until the test ends."""
    spec = importlib.util.spec_from_file_location("vllm_cpu_expand_kernel", _REPRO)
    assert spec is not None
    assert spec.loader is not None
    repro = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "vllm_cpu_expand_kernel", repro)
    spec.loader.exec_module(repro)
    from vllm.v1.sample import rejection_sampler

    monkeypatch.setattr(rejection_sampler.expand_kernel, "_impl", repro.patched_expand_kernel_impl)


def test_e2e_draft_model_acceptance_matches_sum_min_p_q_once_the_cpu_build_is_patched(target, monkeypatch):
    """With the CPU expand kernel patched, the draft-model cases (greedy drafting: q one-hot; probabilistic: q the
    draft's tempered law) pass every check, the acceptance check among them: the accepted drafts per trial
    (counted from vLLM's per-request verification record) agree with Σ min(p, q) summed over the drafts the
    trials reached (seed 3: 1.79 against 2.00, 2.62 against 2.60, and 7.07 against 7.07 probabilistic), and
    coverage reached its design. Unpatched, the same record shows the finding as acceptance far from expectation."""
    if _cpu_build(target):
        _patch_expand_kernel(monkeypatch)
    cases = ["e2e/draft_model/plain", "e2e/draft_model/processed", "e2e/draft_model_probabilistic/plain"]
    # The early pass stops these after 128 to 192 trials, where the mean accepted per trial is off by chance by up
    # to about 11 % (1.79 against 2.00 at 192 trials of seed 3; standard error about 0.1): the bound below is 25 %.
    # Run to the quick cap (1,024 trials) they agree within 2 % (seed 3: 1.92 against 1.95, 2.56 against 2.54, 7.05
    # against 7.09), but running them that far here leaves the process in a state where the patched EAGLE cases
    # that follow fail (docs/findings.md, "vLLM on CPU": the patched engine's output depends on what ran before).
    run = _run(target, cases, quick=True)
    for case_id in cases:
        result, checks = _checks(run, case_id)
        assert result.verdict == Verdict.PASS, result.reason
        assert checks["conformance/acceptance"].observations > 2 * result.n_trials
        observed, expected = result.acceptance.observed, result.acceptance.expected
        assert expected is not None
        assert observed is not None
        assert abs(observed - expected) < 0.25 * expected, (observed, expected)
        assert result.acceptance.per_trial_max == E2E_HORIZON - 1  # the drift test's range: indices 1 .. horizon - 1
        assert observed <= result.acceptance.per_trial_max
        assert result.coverage is not None
        assert result.coverage["shortfalls"] == []
        assert "acceptance not measured" not in result.reason


def test_e2e_eagle_head_built_from_a_config_is_lossless_once_the_cpu_build_is_patched(target, monkeypatch):
    """Before the ngram test (see there). EAGLE runs on the CPU build with a random one-layer head saved beside the
    tiny target (no hub): patched,
    sampling with processing off and on passes with its coverage reached (acceptance is not measured, and the
    case says why), and greedy speculative output equals plain greedy output."""
    if _cpu_build(target):
        _patch_expand_kernel(monkeypatch)
    run = _run(target, ["e2e/eagle/plain", "e2e/eagle/processed", "e2e/greedy/eagle"], quick=True)
    assert run.verdict == Verdict.PASS, [(r.case_id, r.reason) for r in run.results if r.verdict != Verdict.PASS]
    for case_id in ("e2e/eagle/plain", "e2e/eagle/processed"):
        result, _ = _checks(run, case_id)
        assert result.coverage is not None
        assert result.coverage["shortfalls"] == [], result.coverage
        assert "acceptance not measured: an EAGLE head's q depends on the target's hidden states" in result.reason


def test_finding_cpu_expand_kernel_breaks_eagle_too(target):
    """docs/findings.md: every speculative method verifies through ``RejectionSampler.forward``; EAGLE is refuted
    on the CPU build like the draft model."""
    if not _cpu_build(target):
        pytest.skip("the finding is in the CPU backend's kernel overrides")
    run = _run(target, ["e2e/eagle/plain"], quick=True)
    result, _ = _checks(run, "e2e/eagle/plain")
    assert (result.verdict, result.failure) == (Verdict.FAIL, Failure.LOSSLESS), result.reason


def test_e2e_eagle3_head_built_from_a_config_is_lossless_once_the_cpu_build_is_patched(target, monkeypatch):
    """EAGLE-3 runs on the CPU build with a random one-layer head over three of the tiny target's hidden states
    (the embedding and the residual stream after each of its two layers) and a draft vocabulary of 6 of the 8
    tokens (``d2t``), saved beside the target (no hub). Patched, sampling with processing off and on passes
    against the target's exact law, with several drafts per verification, verifications accepting all and some
    of them, and several rounds per request (coverage reached); acceptance is not measured, and the case says
    why. Greedy speculative output equals plain greedy output."""
    if _cpu_build(target):
        _patch_expand_kernel(monkeypatch)
    run = _run(target, ["e2e/eagle3/plain", "e2e/eagle3/processed", "e2e/greedy/eagle3"], quick=True)
    assert run.verdict == Verdict.PASS, [(r.case_id, r.reason) for r in run.results if r.verdict != Verdict.PASS]
    for case_id in ("e2e/eagle3/plain", "e2e/eagle3/processed"):
        result, _ = _checks(run, case_id)
        assert result.coverage is not None
        assert result.coverage["shortfalls"] == [], result.coverage
        assert set(result.coverage["drafts"]) == {"3"}, result.coverage
        assert min(int(rounds) for rounds in result.coverage["rounds"]) >= 3, result.coverage
        assert "acceptance not measured: an EAGLE head's q depends on the target's hidden states" in result.reason


def test_finding_cpu_expand_kernel_breaks_eagle3_too(target):
    """docs/findings.md: EAGLE-3 verifies through the same ``RejectionSampler.forward`` and is refuted on the CPU
    build like EAGLE-1 and the draft model."""
    if not _cpu_build(target):
        pytest.skip("the finding is in the CPU backend's kernel overrides")
    run = _run(target, ["e2e/eagle3/plain"], quick=True)
    result, _ = _checks(run, "e2e/eagle3/plain")
    assert (result.verdict, result.failure) == (Verdict.FAIL, Failure.LOSSLESS), result.reason


def test_e2e_ngram_says_its_acceptance_is_not_measured(target, monkeypatch):
    """After the EAGLE tests: on this machine, an EAGLE or EAGLE-3 engine built in a process where an ngram engine
    has run emits output off the target's law even patched, greedy included (docs/findings.md, "vLLM on CPU",
    seen 2026-12-04; an earlier machine passed them in that order)."""
    if _cpu_build(target):
        _patch_expand_kernel(monkeypatch)
    run = _run(target, ["e2e/ngram/plain"], quick=True)
    result, checks = _checks(run, "e2e/ngram/plain")
    assert result.verdict == Verdict.PASS, result.reason
    assert "conformance/acceptance" not in checks
    assert "acceptance not measured: ngram drafts come from vLLM's prompt lookup" in result.reason
    assert result.acceptance.expected is None
    assert result.acceptance.observed is not None
    assert result.acceptance.observed > 0  # accepted drafts within the horizon, from the same record
    assert result.acceptance.per_trial_max == E2E_HORIZON - 1
    assert result.coverage is not None
    assert result.coverage["shortfalls"] == []


def test_finding_cpu_expand_kernel_is_seen_end_to_end_by_the_conditional_check_and_as_a_raise(target):
    """Last in the module: its big first batch and the engines it discards change the state of the process the
    other cases run in (see the EAGLE tests). The CPU build's uninitialised processing (docs/findings.md) end to
    end: unprocessed, the draft-model run is refuted, a conditional check over the 12-token horizon rejects on its
    own, and the acceptance check measures vLLM's record of the verification steps; processed, vLLM's top-k indexes out
    of bounds inside ``LLM.generate``: a finding about the library (``failure: raised``)."""
    if not _cpu_build(target):
        pytest.skip("the finding is in the CPU backend's kernel overrides")
    # The acceptance check rides along (not designed): the case stops at the first look where a check rejects, so
    # it needs that look to hold enough trials. The default profile without the early pass looks first after an
    # eighth of its cap (362 trials, about 4,000 verification steps); --quick with the early pass looks after 32
    # (about 350 steps: log E 0.8 to 17.6 over seeds 3 to 5, short of the threshold on two of them).
    run = _run(target, ["e2e/draft_model/plain", "e2e/draft_model/processed"], early_pass=False)
    plain, checks = _checks(run, "e2e/draft_model/plain")
    assert plain.verdict == Verdict.FAIL, plain.reason
    assert checks["lossless/pit_id"].rejected or checks["lossless/pit_prob"].rejected, {n: c.log_e_value for n, c in checks.items()}
    # vLLM's own record of each request's verification steps rides along: the acceptance it shows depends on the
    # uninitialised memory (accepted drafts per trial against expected: 0.82, 0.91 and 1.18 against 1.94, 1.92 and
    # 1.88 in lone runs of seeds 3 to 5; 2.33 against 1.85 once inside this module; and once in CI close enough to
    # Σ min(p, q) that the acceptance check did not reject, log E 1.6 over 4,058 steps). So the finding's proof is the
    # conditional check above; here the acceptance is only required to have been measured from vLLM's record.
    acceptance = checks["conformance/acceptance"]
    assert acceptance.observations > 1000, acceptance
    assert plain.acceptance.expected is not None
    assert plain.acceptance.observed is not None
    processed, _ = _checks(run, "e2e/draft_model/processed")
    assert (processed.verdict, processed.failure) == (Verdict.FAIL, Failure.RAISED), processed.reason
    assert "out of bounds" in processed.reason
