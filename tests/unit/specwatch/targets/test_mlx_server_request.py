"""The MLX target's HTTP requests (specwatch.targets.mlx.server.request_body): every setting of the law under the name
mlx_lm.server reads from a request body (0.32.2 ``APIHandler.do_POST``). No MLX needed."""

from __future__ import annotations

from specwatch.targets.mlx.law import MlxSampling
from specwatch.targets.mlx.server import request_body


def test_a_sampled_request_carries_the_seed_the_sampler_and_the_penalties_by_their_request_names() -> None:
    sampling = MlxSampling(temperature=0.8, top_p=0.9, min_p=0.1, top_k=3, repetition_penalty=1.5, frequency_penalty=0.7)
    body = request_body([0, 1, 2, 0, 1], sampling, 12, seed=7, num_draft_tokens=3)
    assert body["prompt"] == "abcab"
    assert (body["max_tokens"], body["seed"], body["num_draft_tokens"], body["logprobs"]) == (12, 7, 3, True)
    assert (body["temperature"], body["top_p"], body["min_p"], body["top_k"]) == (0.8, 0.9, 0.1, 3)
    assert (body["xtc_probability"], body["xtc_threshold"]) == (0.0, 0.1)
    assert (body["repetition_penalty"], body["frequency_penalty"]) == (1.5, 0.7)
    assert body["repetition_context_size"] == body["frequency_context_size"] == 20
    assert "presence_penalty" not in body  # off: left to the server's default (0.0)


def test_a_greedy_request_is_temperature_zero_without_penalties() -> None:
    body = request_body([3], None, 8, seed=0, num_draft_tokens=2)
    assert body["temperature"] == 0.0
    assert not any(key.endswith("_penalty") for key in body)
