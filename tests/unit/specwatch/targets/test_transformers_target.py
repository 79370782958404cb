"""The transformers target against the installed release (CI pins the newest installable one).

The patched-bug tests put a known losslessness bug into the installed library's candidate generation
and show that the matching end-to-end case fails while the unpatched library passes.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="the transformers target needs transformers installed")  # CI installs it

from specwatch.cases import select
from specwatch.protocol import Failure, Verdict
from specwatch.runner import SuiteConfig, run_suite
from specwatch.targets.loader import resolve
from specwatch.targets.transformers.adapter import TransformersAdapter


@pytest.fixture(scope="module")
def target():
    return resolve("transformers")


def test_the_adapter_detects_the_installed_release(target):
    import transformers

    assert target.library.version == transformers.__version__
    adapter = TransformersAdapter.load()
    assert adapter.features["speculative_sampling"]
    assert adapter.features["assistant_model"]
    assert adapter.features["prompt_lookup"]
    ids = {c.id for c in target.cases}
    assert {"e2e/control/plain", "e2e/assistant_model/processed", "e2e/greedy/assistant_model"} <= ids


def _run(target, patterns):
    """The default profile at TV 0.1: these tests pin verdicts, which do not depend on the design; the catalogue's own
    TV 0.03 takes 11 times the trials (its cost: bench/suite_sensitivity.py)."""
    config = SuiteConfig(seed=3, epsilon=0.1)
    return run_suite(select(patterns, target.cases), target.sampler, config, target=target.spec, library=target.library)


@pytest.mark.slow
def test_quick_direct_cases_and_greedy_equivalence_pass(target):
    run = _run(target, ["direct/transformers_target_distribution/*", "direct/far_apart/V8/g1", "e2e/greedy/*"])
    assert run.verdict == Verdict.PASS, [r.reason for r in run.results if r.verdict != Verdict.PASS]
    assert run.environment["library_name"] == "transformers"
    assert "tokenizers==" in run.environment["library_dependencies"]


@pytest.mark.slow
def test_end_to_end_assisted_sampling_passes_and_the_reference_law_is_right(target):
    run = _run(target, ["e2e/control/processed", "e2e/assistant_model/processed"])
    assert [r.verdict for r in run.results] == [Verdict.PASS, Verdict.PASS], [r.reason for r in run.results]


def _raw_logits_as_q(monkeypatch):
    """transformers #47932 class: the candidate generator samples from processed draft logits but
    reports the raw (unprocessed) logits as q."""
    from transformers.generation import candidate_generator

    original = candidate_generator.AssistedCandidateGenerator._generate_candidates

    def patched(self, generation_args):
        ids, logits = original(self, generation_args)
        if logits is None:
            return ids, logits
        with torch.no_grad():
            raw = self.assistant_model(ids).logits[:, -logits.shape[1] - 1 : -1]
        return ids, raw.to(logits.dtype)

    monkeypatch.setattr(candidate_generator.AssistedCandidateGenerator, "_generate_candidates", patched)


def _greedy_draft_soft_q(monkeypatch):
    """transformers #32867 class: the assistant drafts greedily while its softmax is used as q."""
    from transformers.generation import candidate_generator

    original = candidate_generator.AssistedCandidateGenerator._generate_candidates

    def patched(self, generation_args):
        config = generation_args["generation_config"]
        saved = config.do_sample
        config.do_sample = False
        try:
            return original(self, generation_args)
        finally:
            config.do_sample = saved

    monkeypatch.setattr(candidate_generator.AssistedCandidateGenerator, "_generate_candidates", patched)


@pytest.mark.slow
@pytest.mark.parametrize("patch", [_raw_logits_as_q, _greedy_draft_soft_q], ids=["raw_logits_as_q", "greedy_draft_soft_q"])
def test_a_bug_patched_into_candidate_generation_fails_the_matching_case(target, monkeypatch, patch):
    patch(monkeypatch)
    run = _run(target, ["e2e/assistant_model/processed"])
    result = run.results[0]
    assert result.verdict == Verdict.FAIL, result.reason
    assert result.lossless == Verdict.FAIL
    assert result.n_trials < result.trial_cap


def test_generate_raising_on_a_valid_input_is_a_finding_about_the_library(target, monkeypatch):
    """An exception inside the library's generate() (here: its candidate generation) fails the end-to-end cases
    with ``failure: raised`` and the exception as the reason, sampling and greedy alike; never a suite error."""
    from transformers.generation import candidate_generator

    def crash(self, input_ids):
        raise IndexError("candidate generation broke")

    monkeypatch.setattr(candidate_generator.AssistedCandidateGenerator, "get_candidates", crash)
    run = _run(target, ["e2e/assistant_model/plain", "e2e/greedy/assistant_model"])
    assert [(r.verdict, r.failure) for r in run.results] == [(Verdict.FAIL, Failure.RAISED)] * 2, [r.reason for r in run.results]
    assert all("IndexError: candidate generation broke" in r.reason for r in run.results)


# Finding, transformers 5.24.0 (docs/findings.md, "Universal assisted generation reports a permuted q"):
# with do_sample=True and an assistant vocabulary that is not a subset of the target's, the
# AssistantToTargetTranslator prunes the assistant's LM head to the shared tokens in get_vocab()
# order (a hash order for fast tokenizers) but get_target_logits writes the pruned logits back in
# assistant-id order. Drafts are mapped correctly, so the q reported to _speculative_sampling is a
# permutation of the q the drafts were sampled from: the output is not the target's law. The one-line
# fix below (index the target slots by the pruned rows) makes the same case pass.
def _fixed_get_target_logits(self, assistant_logits):
    target_logits = torch.full((*assistant_logits.shape[:-1], self.target_vocab_size), self.FILTER_VALUE, device=assistant_logits.device)
    if self.assistant_prune_lm_head:
        target_logits[..., self._assistant_to_target_input_ids[self.assistant_overlap_token_ids]] = assistant_logits  # the fix
        return target_logits
    mask = self._assistant_to_target_input_ids != self.SUPPRESS_TOKEN_ID
    valid = assistant_logits[..., : self._assistant_to_target_input_ids.shape[0]]
    target_logits[..., self._assistant_to_target_input_ids[mask]] = valid[..., mask]
    return target_logits


@pytest.mark.slow
def test_finding_universal_assisted_generation_reports_a_permuted_q(target, monkeypatch):
    if target.library.version != "5.24.0":
        pytest.skip("the finding is pinned to the release CI installs (5.24.0)")
    from transformers.generation import candidate_generator

    result = _run(target, ["e2e/different_tokenizers/plain"]).results[0]
    assert result.verdict == Verdict.FAIL, result.reason  # expected failure: a confirmed upstream bug
    assert result.lossless == Verdict.FAIL
    monkeypatch.setattr(candidate_generator.AssistantToTargetTranslator, "get_target_logits", _fixed_get_target_logits)
    fixed = _run(target, ["e2e/different_tokenizers/plain"]).results[0]
    assert fixed.verdict == Verdict.PASS, fixed.reason


@pytest.mark.slow
def test_source_checkout_is_tested_in_a_subprocess_and_its_commit_recorded(tmp_path):
    """`--source PATH` puts PATH/src first on PYTHONPATH in a subprocess; the result records the checkout's
    git commit. The checkout here is a git repository whose src/ links to the installed package."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import transformers

    checkout = tmp_path / "transformers"
    (checkout / "src").mkdir(parents=True)
    (checkout / "src" / "transformers").symlink_to(Path(transformers.__file__).parent)
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "src"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "checkout"], check=True)
    sha = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    out = tmp_path / "run.json"
    cmd = [sys.executable, "-m", "specwatch", "run", "--target", "transformers", "--source", str(checkout)]
    cmd += ["--cases", "direct/far_apart/V8/g1", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    environment = json.loads(out.read_text())["environment"]
    assert environment["library_path"].startswith(str(checkout / "src"))
    assert environment["library_git_sha"] == sha


def test_bad_source_and_pip_specs_are_usage_errors(tmp_path):
    from specwatch.__main__ import main

    assert main(["run", "--target", "transformers", "--source", str(tmp_path / "missing")]) == 2
    assert main(["run", "--target", "transformers", "--pip", "transformers; rm -rf /"]) == 2


def test_finding_speculative_sampling_accepts_a_p_zero_draft_when_the_uniform_is_zero(monkeypatch):
    """`_speculative_sampling` accepts when r <= p/q; torch.rand can return exactly 0.0 (probability 2**-24
    per float32 draw on CPU), and then a draft the target gives probability 0 is accepted (docs/findings.md).
    Deterministic: the uniform is fixed at 0.0 and at the next float32 value, 2**-24."""
    import transformers
    from transformers.generation.utils import _speculative_sampling

    if transformers.__version__ != "5.24.0":
        pytest.skip("the finding is pinned to the release CI installs (5.24.0)")
    q = torch.log(torch.tensor([[[0.5, 0.5, 0.0, 0.0]]]))  # the assistant drafts token 0 half the time ...
    p = torch.log(torch.tensor([[[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]]]))  # ... the target never emits it
    ids = torch.tensor([[7, 0]])  # prompt token 7, then the draft 0

    monkeypatch.setattr(torch, "rand_like", lambda t, **kw: torch.full_like(t, 2.0**-24))
    valid, n_matches = _speculative_sampling(ids, q, 1, p)
    assert int(n_matches) == 0
    assert valid.tolist() == [[2]]  # rejected; the residual (p - q)+ has all its mass on token 2

    monkeypatch.setattr(torch, "rand_like", lambda t, **kw: torch.zeros_like(t))
    valid, n_matches = _speculative_sampling(ids, q, 1, p)
    assert int(n_matches) == 1  # expected failure: 0.0 <= p/q = 0 accepts the impossible token
    assert valid.tolist()[0][0] == 0

    monkeypatch.undo()
    generator = torch.Generator().manual_seed(0)
    zeros = sum(int((torch.rand(1 << 24, generator=generator) == 0).sum()) for _ in range(8))
    assert zeros > 0  # torch.rand does return 0.0 (5 times in 2**27 draws with this seed)


def test_finding_edge_checks_on_the_installed_release(target):
    """The suite's edge checks on 5.24.0 (docs/findings.md): with every uniform at 0 the p = 0 drafts are
    accepted (expected failures, the `<=` comparison); with every uniform just below 1 the target-distribution
    fixture drafts a token with q ~ 2e-9 and p = 0, and `_speculative_sampling` raises (its residual (p - q)+
    is all zeros in float32): a failing case of its own kind (``raised``), a finding about the sampler, not an
    error of the run. Every other edge check passes."""
    if target.library.version != "5.24.0":
        pytest.skip("the finding is pinned to the release CI installs (5.24.0)")
    run = _run(target, ["edge/*"])
    verdicts = {r.case_id: r for r in run.results}
    failed = {case for case, r in verdicts.items() if r.verdict == Verdict.FAIL and r.failure == Failure.LOSSLESS}
    assert failed == {
        "edge/p_zero_draft/V4/g1/u_min",
        "edge/all_reject/V8/g3/u_min",
        "edge/p_zero_where_q/V64/g3/u_min",
        "edge/transformers_fixture/V10/g3/u_min",
    }
    assert all(verdicts[case].lossless == Verdict.FAIL for case in failed)
    crashed = verdicts["edge/transformers_fixture/V10/g3/u_max"]
    assert (crashed.verdict, crashed.failure) == (Verdict.FAIL, Failure.RAISED)
    assert run.verdict == Verdict.FAIL  # a finding about the sampler, not a broken run
    assert "probability tensor contains either `inf`, `nan` or element < 0" in crashed.reason
    assert {r.verdict for case, r in verdicts.items() if case not in failed | {crashed.case_id}} == {Verdict.PASS}


# Finding, transformers 4.40-5.13 ("Prompt-lookup generation returns more tokens than max_new_tokens"):
# PromptLookupCandidateGenerator caps the end of its candidates at max_length as an index into the prompt
# (`min(end_idx, input_length, self.max_length)`), not their number at the room left, so with 2 tokens to go
# it proposes 3; _assisted_decoding then appends every accepted token plus the target's own. 5.14 crops the
# accepted tokens to max_length in the loop (for MTP) and so hides it; the generator's cap is unchanged in
# 5.24.0. The patch caps the number of candidates at max_length - 1 - input_length.
_LOOKUP_CAP = "end_idx = min(end_idx, input_length, self.max_length)"
_LOOKUP_CAP_FIXED = "end_idx = min(end_idx, input_length, start_idx + self.max_length - 1 - input_length)"


def _prompt_lookup_generator(**kwargs):
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    return PromptLookupCandidateGenerator(eos_token_id=torch.tensor([99]), num_output_tokens=3, max_length=12, **kwargs)


def _capped_prompt_lookup_get_candidates():
    import inspect
    import textwrap

    from transformers.generation import candidate_generator

    source = textwrap.dedent(inspect.getsource(candidate_generator.PromptLookupCandidateGenerator.get_candidates))
    assert source.count(_LOOKUP_CAP) == 1
    namespace: dict[str, object] = {}
    exec(compile(source.replace(_LOOKUP_CAP, _LOOKUP_CAP_FIXED), "<one-line patch>", "exec"), vars(candidate_generator), namespace)
    return namespace["get_candidates"]


def _without_the_loop_length_crop(monkeypatch):
    """5.24.0 as 4.40-5.13 were: _assisted_decoding keeps every accepted token. Its crop (added in 5.14) reads
    generation_config.max_length, which is put out of reach once the candidate generator (it keeps its own
    max_length) and the stopping criteria are built."""
    from transformers.generation.utils import GenerationMixin

    build = GenerationMixin._get_candidate_generator

    def patched(self, *args, **kwargs):
        generator = build(self, *args, **kwargs)
        (kwargs["generation_config"] if "generation_config" in kwargs else args[0]).max_length = 1 << 20
        return generator

    monkeypatch.setattr(GenerationMixin, "_get_candidate_generator", patched)


def test_finding_prompt_lookup_proposes_more_candidates_than_max_length_leaves_room_for(monkeypatch):
    import transformers
    from transformers.generation import candidate_generator

    if transformers.__version__ != "5.24.0":
        pytest.skip("the finding is pinned to the release CI installs (5.24.0)")

    ids = torch.tensor([[0, 2, 3, 0, 4, 0, 4, 0, 4, 0]])  # 10 tokens of 12: room for 1 candidate and the target's token
    candidates, _ = _prompt_lookup_generator().get_candidates(ids)
    assert candidates[0, 10:].tolist() == [4, 0, 4]  # expected failure: 3 candidates, 13 tokens if all are accepted
    monkeypatch.setattr(candidate_generator.PromptLookupCandidateGenerator, "get_candidates", _capped_prompt_lookup_get_candidates())
    candidates, _ = _prompt_lookup_generator().get_candidates(ids)
    assert candidates[0, 10:].tolist() == [4]


@pytest.mark.slow
def test_finding_prompt_lookup_overshoots_max_new_tokens_without_the_loop_crop(target, monkeypatch):
    if target.library.version != "5.24.0":
        pytest.skip("the mutant is written against the release CI installs (5.24.0)")
    from transformers.generation import candidate_generator

    _without_the_loop_length_crop(monkeypatch)
    result = _run(target, ["e2e/greedy/prompt_lookup"]).results[0]
    assert result.verdict == Verdict.FAIL, result.reason  # as on 4.44.2-4.57.6, 5.5.4: one token too many
    assert "certain lossless violation" in (result.reason or "")
    monkeypatch.setattr(candidate_generator.PromptLookupCandidateGenerator, "get_candidates", _capped_prompt_lookup_get_candidates())
    fixed = _run(target, ["e2e/greedy/prompt_lookup"]).results[0]
    assert fixed.verdict == Verdict.PASS, fixed.reason


@pytest.mark.slow
def test_finding_prompt_lookup_overshoot_fails_the_sampling_case_too(target, monkeypatch):
    """``do_sample=True`` returns the extra token as well: the sampling case sees an output longer than its
    horizon as a certain violation (it used to crop it), and passes with the one-line patch."""
    if target.library.version != "5.24.0":
        pytest.skip("the mutant is written against the release CI installs (5.24.0)")
    from transformers.generation import candidate_generator

    _without_the_loop_length_crop(monkeypatch)
    result = _run(target, ["e2e/prompt_lookup/plain"]).results[0]
    assert result.verdict == Verdict.FAIL, result.reason
    assert "certain lossless violation: generate returned 11 tokens" in (result.reason or ""), result.reason
    monkeypatch.setattr(candidate_generator.PromptLookupCandidateGenerator, "get_candidates", _capped_prompt_lookup_get_candidates())
    fixed = _run(target, ["e2e/prompt_lookup/plain"]).results[0]
    assert fixed.verdict == Verdict.PASS, fixed.reason


def test_a_processed_fixture_where_top_p_removes_nothing_is_refused_when_built():
    """The earlier processing (T 0.7, top-k 3, top-p 0.9) never let top-p remove a token on the 6-token
    model: building a case with it fails, so the top-p path cannot go untested unnoticed."""
    from specwatch.sampling import Processing
    from specwatch.targets.base import AdapterError
    from specwatch.targets.transformers.adapter import PROCESSING_ON
    from specwatch.targets.transformers.experiments import GenerateExperiment

    adapter = TransformersAdapter.load()
    with pytest.raises(AdapterError, match="top-p removes only"):
        GenerateExperiment(adapter.module, Processing(temperature=0.7, top_k=3, top_p=0.9), {}, torch.device("cpu"))
    built = GenerateExperiment(adapter.module, PROCESSING_ON, {}, torch.device("cpu"))
    assert [c.name for c in built.checks] == ["lossless/first2", "lossless/pit_id", "lossless/pit_prob"]
    assert built.checks[1].designed
    assert not built.checks[0].designed


def test_every_speculative_e2e_case_is_designed_for_several_drafts_and_rounds(target):
    from specwatch.targets.transformers.experiments import E2E_COVERAGE, E2E_DRAFTS, E2E_HORIZON

    assert E2E_HORIZON >= 8
    assert E2E_COVERAGE.min_rounds - 1 + (E2E_COVERAGE.min_rounds - 1) * E2E_DRAFTS < E2E_HORIZON  # >= 3 rounds by construction
    built = {
        c.id: c.build(target.sampler, torch.device("cpu"))
        for c in select(["e2e/assistant_model/processed", "e2e/control/plain"], target.cases)
    }
    assert built["e2e/assistant_model/processed"].coverage_design == E2E_COVERAGE
    assert built["e2e/control/plain"].coverage_design is None  # plain sampling drafts nothing


@pytest.mark.parametrize("case_id", ["e2e/control/processed", "e2e/assistant_model/V256"])
def test_the_batched_conditional_laws_equal_one_forward_per_output(target, case_id):
    """The conditional check's laws come from one forward of many stacked outputs: each output's rows equal
    those of a forward of that output alone, and the rows kept are those its own margins keep."""
    import numpy as np

    from specwatch.conditional import FLOAT32_MARGIN, processing_margin

    experiment = next(c for c in target.cases if c.id == case_id).build(target.sampler, torch.device("cpu"))
    generator = torch.Generator().manual_seed(3)
    outputs = [torch.randint(0, experiment.vocab, (experiment.horizon,), generator=generator).tolist() for _ in range(70)]
    rows, keep = experiment._conditional_rows(outputs)
    assert rows.shape == (70, experiment.horizon, experiment.vocab)
    p = experiment.processing
    for i in (0, 33, 69):  # in the first and the second forward of 64
        alone = experiment._conditional_logits(experiment.prompt, [outputs[i]])[0]
        np.testing.assert_allclose(rows[i], p.probs(torch.from_numpy(alone)).numpy(), atol=1e-6)
        margins = [processing_margin(row, p.temperature, p.top_k, p.top_p) for row in alone]
        assert keep[i].tolist() == [m >= FLOAT32_MARGIN for m in margins]


def test_the_default_profile_designs_sampling_cases_at_tv_0_03_and_direct_cases_at_0_05(target):
    """Issue 31: every end-to-end sampling case at TV 0.03, the direct battery at 0.05 (0.1 for the 50,257-token
    vocabulary) in the default profile; ``--quick`` (issue 39) tests its end-to-end sampling cases at TV 0.05 and
    nothing below it."""
    sampling = [c for c in target.cases if c.family == "e2e" and not c.id.startswith("e2e/greedy/")]
    direct = [c for c in target.cases if c.family == "direct"]
    assert len(sampling) >= 18
    assert len(direct) >= 18
    assert {c.epsilon for c in sampling} == {0.03}
    assert {c.id: c.epsilon for c in direct if c.id.startswith("direct/large_vocab/")} == {"direct/large_vocab/V50257/g1": 0.1}
    assert {c.epsilon for c in direct if not c.id.startswith("direct/large_vocab/")} == {0.05}
    quick = SuiteConfig(quick=True)
    assert min(quick.epsilon_for(c) for c in target.cases if c.quick) == 0.05
    assert {quick.epsilon_for(c) for c in sampling if c.quick} == {0.05}


def test_plain_sampling_draws_its_trials_as_rows_of_batched_calls_and_tests_every_token(target, monkeypatch):
    """The control cases draw up to PLAIN_ROWS_PER_CALL trials per generate() call (independent rows of one batch);
    every row is a trial of the joint law and every token of it is tested by the conditional checks."""
    from specwatch.targets.transformers.experiments import PLAIN_ROWS_PER_CALL

    experiment = next(c for c in target.cases if c.id == "e2e/control/plain").build(target.sampler, torch.device("cpu"))
    assert experiment.rows_per_call == PLAIN_ROWS_PER_CALL > 1
    original = experiment.target.generate
    batches = []

    def counting(ids, **kwargs):
        batches.append(ids.shape[0])
        return original(ids, **kwargs)

    monkeypatch.setattr(experiment.target, "generate", counting)
    n = 2 * PLAIN_ROWS_PER_CALL + 5
    observation = experiment.run(n, torch.Generator().manual_seed(2))
    assert batches == [PLAIN_ROWS_PER_CALL, PLAIN_ROWS_PER_CALL, 5]
    assert observation.violations == ()
    assert int(observation.counts["lossless/first2"].sum()) == n
    assert int(observation.counts["lossless/pit_id"].sum()) == int(observation.counts["lossless/pit_prob"].sum()) == n * experiment.horizon
    assert (
        next(c for c in target.cases if c.id == "e2e/assistant_model/plain").build(target.sampler, torch.device("cpu")).rows_per_call == 1
    )


def test_a_token_of_conditional_probability_zero_names_its_output(target, monkeypatch):
    """The conditional check runs over all trials' positions at once; a kept token whose exact law gives it 0 is a
    certain violation naming the first output that has one."""
    experiment = next(c for c in target.cases if c.id == "e2e/control/plain").build(target.sampler, torch.device("cpu"))
    conditional_rows = experiment._conditional_rows
    seen = []

    def zero_for_the_fourth_output(outputs):
        rows, keep = conditional_rows(outputs)
        rows = rows.copy()
        rows[3, 5, outputs[3][5]] = 0.0
        seen.append(outputs[3])
        return rows, keep

    monkeypatch.setattr(experiment, "_conditional_rows", zero_for_the_fourth_output)
    observation = experiment.run(8, torch.Generator().manual_seed(2))
    (violation,) = observation.violations
    assert violation.message.startswith(f"output {seen[0]}: position 6: token {seen[0][5]} has conditional probability 0")
    assert int(observation.counts["lossless/pit_id"].sum()) == 8 * experiment.horizon - 1
