"""The SGLang target's end-to-end cases where no GPU is lent: each is present, skipped with the reason (never
passed), and built with the engine arguments a GPU worker would use (runs without SGLang installed)."""

from __future__ import annotations

import types

import pytest

from specwatch.sampling import Processing
from specwatch.targets.sglang.e2e import ENGINES, GAMMA, NO_CUDA, e2e_cases, engine_kwargs, sampling_params
from specwatch.targets.vllm.e2e import PROCESSING_ON

pytestmark = pytest.mark.unit
INSTALLED = types.SimpleNamespace(version="0.5.23")


def test_without_cuda_every_engine_case_is_skipped_with_the_reason() -> None:
    cases = e2e_cases(INSTALLED, cuda=False)
    ids = {c.id for c in cases}
    for name in ENGINES:
        assert {f"e2e/{name}/plain", f"e2e/{name}/processed"} <= ids
        if name != "plain":
            assert f"e2e/{name}/greedy_equivalence" in ids
    assert all(c.skip_reason == NO_CUDA and c.make_experiment is None for c in cases)
    assert NO_CUDA.startswith("not reachable")


def test_with_cuda_the_cases_build_engine_experiments() -> None:
    cases = e2e_cases(INSTALLED, cuda=True)
    assert all(c.skip_reason is None and c.make_experiment is not None for c in cases)
    assert {c.id for c in cases if c.quick} == {"e2e/plain/processed", "e2e/eagle/processed", "e2e/eagle/greedy_equivalence"}


def test_engine_arguments_name_each_method_and_its_draft() -> None:
    models = types.SimpleNamespace(target="/m/target", draft="/m/draft", eagle="/m/eagle")
    plain = engine_kwargs("plain", models)  # type: ignore[arg-type]
    assert "speculative_algorithm" not in plain
    assert plain["dtype"] == "float32"
    assert plain["disable_cuda_graph"]
    standalone = engine_kwargs("standalone", models)  # type: ignore[arg-type]
    assert standalone["speculative_algorithm"] == "STANDALONE"
    assert standalone["speculative_draft_model_path"] == "/m/draft"
    assert standalone["speculative_num_steps"] == GAMMA
    assert standalone["speculative_num_draft_tokens"] == GAMMA + 1
    eagle_tree = engine_kwargs("eagle_tree", models)  # type: ignore[arg-type]
    assert eagle_tree["speculative_eagle_topk"] == 2
    assert eagle_tree["speculative_draft_model_path"] == "/m/eagle"
    assert engine_kwargs("eagle_rejection", models)["speculative_use_rejection_sampling"] is True  # type: ignore[arg-type]
    assert "speculative_draft_model_path" not in engine_kwargs("ngram", models)  # type: ignore[arg-type]


def test_sampling_parameters_carry_the_processing_and_the_seed() -> None:
    assert sampling_params(PROCESSING_ON, 12, 7) == {
        "temperature": 0.8,
        "top_k": 6,
        "top_p": 0.85,
        "max_new_tokens": 12,
        "ignore_eos": True,
        "sampling_seed": 7,
    }
    assert sampling_params(Processing(), 3, 1)["top_k"] == -1
