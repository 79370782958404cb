"""The llama.cpp target without llama.cpp: its sampler-chain law, the llama-speculative mechanism's law, the GGUF
writer, the build's identity and the parsing of what the paths report."""

from __future__ import annotations

import numpy as np
import pytest

from specwatch.targets.llamacpp.build import build_info, is_llamacpp, vendored_commit
from specwatch.targets.llamacpp.chain import ChainFixtureError, LlamaChain, speculative_example_law
from specwatch.targets.llamacpp.paths import PathError, _rounds, parse_tokens


def test_chain_without_cuts_is_the_tempered_softmax():
    logits = np.array([1.0, 0.2, -0.5, 2.0])
    expected = np.exp(logits / 0.7) / np.exp(logits / 0.7).sum()
    assert np.allclose(LlamaChain(temperature=0.7).probs(logits), expected)


def test_top_p_acts_on_the_untempered_law():
    # Untempered: p = [0.665, 0.245, 0.090]; top-p 0.85 keeps 2 tokens. Tempered first (Hugging Face's order, T = 3)
    # the law is flatter ([0.42, 0.32, 0.26]) and the same top-p keeps all 3: llama.cpp's order keeps 2.
    logits = np.array([2.0, 1.0, 0.0])
    probs = LlamaChain(temperature=3.0, top_p=0.85).probs(logits)
    assert probs[2] == 0.0
    assert np.isclose(probs[0] / probs[1], np.exp(1 / 3))


def test_top_p_keeps_the_shortest_prefix_reaching_p_and_min_p_the_ratio():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert (LlamaChain(top_p=0.79).probs(logits) > 0).tolist() == [True, True, False, False]
    assert (LlamaChain(top_p=0.81).probs(logits) > 0).tolist() == [True, True, True, False]
    assert (LlamaChain(min_p=0.29).probs(logits) > 0).tolist() == [True, True, True, False]
    assert (LlamaChain(top_k=1).probs(logits) > 0).tolist() == [True, False, False, False]
    assert LlamaChain(banned=(0,)).probs(logits)[0] == 0.0


def test_margin_flags_rows_at_a_boundary():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert LlamaChain(top_p=0.8).margin(logits) < 1e-9
    assert LlamaChain(top_p=0.7).margin(logits) > 0.05
    assert LlamaChain().margin(logits) == np.inf


def test_fixture_law_refuses_a_cut_that_removes_nothing():
    def flat(prefix: tuple[int, ...]) -> np.ndarray:
        return np.zeros(4)

    with pytest.raises(ChainFixtureError, match="min-p"):
        LlamaChain(min_p=0.5).fixture_law(flat, 1, 4)
    law = LlamaChain().fixture_law(flat, 2, 4)
    assert np.allclose(law, 1 / 16)


def test_fixture_law_asks_each_cut_for_mass_at_every_position_on_average_over_its_rows():
    """Top-k 3 over 4 tokens cuts 11 % of the first row; at the second position it cuts a row of the three reachable
    ones and nothing of the others: 3.6 % on average, enough. Where it cuts none of them the fixture is refused."""

    def rows(cut_after: tuple[int, ...]):
        def logits(prefix: tuple[int, ...]) -> np.ndarray:
            return np.array([1.0, 1.0, 1.0, 0.0]) if prefix == () or prefix in cut_after else np.array([2.0, 2.0, 2.0, -50.0])

        return logits

    law = LlamaChain(top_k=3).fixture_law(rows(((0,),)), 2, 4)
    assert law.reshape(4, 4)[3].sum() == 0.0
    with pytest.raises(ChainFixtureError, match="position 1"):
        LlamaChain(top_k=3).fixture_law(rows(()), 2, 4)


def test_speculative_example_law_is_lossless_only_for_a_one_hot_draft():
    p = np.array([0.5, 0.3, 0.2])
    assert np.allclose(speculative_example_law(p, np.array([0.0, 1.0, 0.0])), p)
    q = np.array([0.2, 0.6, 0.2])  # argmax 1, p/q = 0.5: accepted half the time, the residual never gives 1
    law = speculative_example_law(p, q)
    assert np.isclose(law.sum(), 1.0)
    assert np.isclose(law[1], 0.5)  # p(1) = 0.3
    assert 0.5 * np.abs(law - p).sum() > 0.15


def test_speculative_example_law_matches_a_simulation_of_the_mechanism():
    rng = np.random.default_rng(0)
    p, q = np.array([0.1, 0.5, 0.4]), np.array([0.2, 0.3, 0.5])
    d = int(np.argmax(q))
    n = 200_000
    accept = rng.random(n) <= p[d] / q[d]
    residual = np.clip(p - q, 0, None) / np.clip(p - q, 0, None).sum()
    drawn = rng.choice(3, size=n, p=residual)
    emitted = np.where(accept, d, drawn)
    freq = np.bincount(emitted, minlength=3) / n
    assert np.abs(freq - speculative_example_law(p, q)).max() < 0.005


def test_requirement_and_vendored_commit(tmp_path):
    assert is_llamacpp("llama-cpp-python==0.3.36")
    assert is_llamacpp("llama_cpp_python==0.3.1")
    assert not is_llamacpp("transformers==4.46.3")
    (tmp_path / "CHANGELOG.md").write_text(
        "# Changelog\n\n## [0.3.36]\n\n- feat: update llama.cpp to ggml-org/llama.cpp@0c1e57098\n\n"
        "## [0.3.35]\n\n- feat: update llama.cpp to ggml-org/llama.cpp@4df29be4f\n"
    )
    assert vendored_commit(tmp_path, "0.3.36") == "0c1e57098"
    assert vendored_commit(tmp_path, "0.3.35") == "4df29be4f"
    assert vendored_commit(tmp_path, "0.3.1") is None
    (tmp_path / "specwatch-llamacpp-build.json").write_text('{"version": "0.3.36", "lib": "/x"}')
    assert build_info([str(tmp_path)]) == {"version": "0.3.36", "lib": "/x"}
    assert build_info([str(tmp_path / "nothing")]) is None


def test_prompt_lookup_rounds_count_the_common_prefix():
    # Prompt of 4; drafts [1, 2, 3] proposed after 5 tokens of context (output index 1): output continues 1, 2, 0.
    assert _rounds(4, [0, 1, 2, 0, 5, 6], [(5, [1, 2, 3]), (8, [])]) == [(3, 2)]
    # A round the horizon cuts short is left out.
    assert _rounds(4, [0, 1], [(5, [1, 2, 3])]) == []


def test_tool_output_parsing():
    assert parse_tokens("bcahh", 4) == [1, 2, 0, 7]
    with pytest.raises(PathError):
        parse_tokens("b c", 3)
    with pytest.raises(PathError):
        parse_tokens("bc", 3)


def test_the_gguf_file_holds_the_weights_and_the_vocabulary(tmp_path):
    import gguf

    from specwatch.targets.llamacpp.models import EOS, PIECES, _permute, tiny_llama, tokenizer, write_gguf

    model = tiny_llama(seed=1, layers=1)
    write_gguf(model, tmp_path / "m.gguf", name="tiny")
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert len(tensors) == 12  # embeddings, 9 of the layer, output norm and head
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    assert np.array_equal(tensors["output.weight"], state["lm_head.weight"])
    assert np.array_equal(tensors["blk.0.attn_q.weight"], _permute(state["model.layers.0.self_attn.q_proj.weight"], 2))
    assert not np.array_equal(tensors["blk.0.attn_q.weight"], state["model.layers.0.self_attn.q_proj.weight"])
    field = reader.fields["tokenizer.ggml.tokens"]
    assert [bytes(field.parts[i]).decode() for i in field.data] == list(PIECES)
    assert int(reader.fields["tokenizer.ggml.eos_token_id"].parts[-1][0]) == EOS
    assert tokenizer().encode("abcab").ids == [0, 1, 2, 0, 1]


def test_the_processed_fixture_of_the_end_to_end_cases_is_valid():
    """The cases' processed chain builds its joint law on the tiny target, with EOS banned (the tools) and not (the
    Python paths): each cut removes mass at every position and no row lies at a boundary (else the cases error)."""
    from specwatch.targets.llamacpp.e2e import PROCESSING_DESCRIPTION, PROCESSING_ON
    from specwatch.targets.llamacpp.experiments import LENGTH, PROMPT
    from specwatch.targets.llamacpp.models import VOCAB, next_token_logits
    from specwatch.targets.llamacpp.paths import IGNORE_EOS

    for banned in ((), IGNORE_EOS):
        law = LlamaChain(**PROCESSING_ON, banned=banned).fixture_law(lambda prefix: next_token_logits(PROMPT, prefix), LENGTH, VOCAB)  # type: ignore[arg-type]
        assert (law > 0).sum() >= 10
    k, p, m = PROCESSING_ON["top_k"], PROCESSING_ON["top_p"], PROCESSING_ON["min_p"]
    assert f"T {PROCESSING_ON['temperature']:g}, top-k {k:g}, top-p {p:g}, min-p {m:g}" == PROCESSING_DESCRIPTION
