"""The oracle of the vLLM end-to-end cases (runs without vLLM: the tiny models are saved with transformers)."""

from __future__ import annotations

import importlib
import importlib.util
import re
import types

import numpy as np
import pytest
import torch

from specwatch.conditional import MIN_REMOVED
from specwatch.laws import sequence_law
from specwatch.sampling import Processing
from specwatch.targets.vllm.e2e import PROCESSING_ON, PROMPT, processed_law
from specwatch.targets.vllm.engines import EngineError, unavailable
from specwatch.targets.vllm.models import (
    E2E_VOCAB,
    EAGLE3_AUX_LAYERS,
    EAGLE3_DRAFT_TOKENS,
    conditional_logits,
    next_token_logits,
    save_tiny_eagle3,
    target_oracle,
    tiny_models,
)


def test_the_batched_conditional_rows_are_the_oracles_law_at_every_prefix() -> None:
    """Row t of one no-cache forward over prompt + output is p(. | prompt, output[:t]): the conditional check
    and the joint law use the same exact laws, with no off-by-one between them."""
    models = tiny_models()
    generator = torch.Generator().manual_seed(7)
    outputs = torch.randint(0, E2E_VOCAB, (3, 5), generator=generator).tolist()
    logits = conditional_logits(models, PROMPT, outputs)
    assert logits.shape == (3, 5, E2E_VOCAB)
    for processing in (Processing(), PROCESSING_ON):
        oracle = target_oracle(models, processing, PROMPT)
        for i, out in enumerate(outputs):
            for t in range(len(out)):
                row = processing.probs(torch.from_numpy(logits[i, t])).numpy()
                np.testing.assert_allclose(row, oracle(tuple(out[:t])), atol=1e-12)


def test_the_processed_fixture_cuts_real_mass_with_both_processors_on_every_reachable_row() -> None:
    """PROCESSING_ON is accepted when the case is built, and its law is the oracle's joint law."""
    law = processed_law(PROCESSING_ON, PROMPT, 3)
    np.testing.assert_allclose(law, sequence_law(target_oracle(tiny_models(), PROCESSING_ON, PROMPT), 3, E2E_VOCAB), atol=1e-15)
    by_k, by_p = PROCESSING_ON.removed_mass(next_token_logits(tiny_models(), PROMPT, ()))
    assert by_k >= MIN_REMOVED
    assert by_p >= MIN_REMOVED


@pytest.mark.parametrize(
    ("processing", "refusal"),
    [
        # At temperature 0.5 the smallest of 8 tokens carries 0.6 % of the mass on some row: top-k 7 barely cuts.
        (Processing(temperature=0.5, top_k=7), "top-k removes only 0.00582"),
        # Top-p 0.99 after top-k 6 keeps all six tokens on some reachable row: it cuts nothing there.
        (Processing(temperature=0.8, top_k=6, top_p=0.99), "top-p removes only 0 "),
        # Top-p 0.85 alone leaves a cut 1.8e-6 from a token's cumulative mass after prefix (2, 5).
        (Processing(temperature=0.8, top_p=0.85), "prefix (2, 5): the processing boundary"),
    ],
)
def test_a_processing_that_does_not_bite_on_a_reachable_row_is_refused_when_the_case_is_built(processing: Processing, refusal: str) -> None:
    with pytest.raises(EngineError, match=re.escape(refusal)):
        processed_law(processing, PROMPT, 3)


def test_the_eagle3_head_is_saved_in_the_checkpoint_layout_vllms_eagle3_llama_loads() -> None:
    """What ``Eagle3LlamaForCausalLM`` (vllm/model_executor/models/llama_eagle3.py, 0.32.0) reads: ``midlayer.*``
    (renamed ``layers.0.``) whose q/k/v take [embedding, fused hidden state], ``fc`` over one target hidden state per
    aux layer id of ``eagle_config``, ``norm``, an ``lm_head`` of ``draft_vocab_size`` rows, ``d2t`` as offsets
    (target id = draft id + d2t) and ``t2d`` as a mask; no ``embed_tokens`` (the target's is shared). The config
    names the architecture vLLM registers for EAGLE-3 Llama heads."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig

    models = tiny_models()
    target = LlamaConfig.from_pretrained(models.target)
    config = LlamaConfig.from_pretrained(models.eagle3)
    hidden = target.hidden_size
    assert config.architectures == ["LlamaForCausalLMEagle3"]
    assert (config.num_hidden_layers, config.vocab_size, config.hidden_size) == (1, target.vocab_size, hidden)
    assert config.target_hidden_size == hidden
    assert config.draft_vocab_size == len(EAGLE3_DRAFT_TOKENS) < target.vocab_size
    aux = config.eagle_config["eagle_aux_hidden_state_layer_ids"]
    assert config.eagle_aux_hidden_state_layer_ids == aux  # the model runners read it here, the head in eagle_config
    assert config.eagle_config["use_aux_hidden_state"] is True
    # vLLM's Llama can hand out the embedding (0) and the residual stream after each layer (1..layers), one each.
    assert list(aux) == list(EAGLE3_AUX_LAYERS)
    assert len(set(aux)) == len(aux) == 3
    assert set(aux) <= set(range(target.num_hidden_layers + 1))

    weights = load_file(str(models.eagle3 / "model.safetensors"))
    layer = {
        "self_attn.q_proj": (hidden, 2 * hidden),
        "self_attn.k_proj": (hidden, 2 * hidden),
        "self_attn.v_proj": (hidden, 2 * hidden),
        "self_attn.o_proj": (hidden, hidden),
        "mlp.gate_proj": (target.intermediate_size, hidden),
        "mlp.up_proj": (target.intermediate_size, hidden),
        "mlp.down_proj": (hidden, target.intermediate_size),
        "input_layernorm": (hidden,),
        "hidden_norm": (hidden,),
        "post_attention_layernorm": (hidden,),
    }
    expected = {f"midlayer.{name}.weight": shape for name, shape in layer.items()} | {
        "fc.weight": (hidden, len(aux) * hidden),
        "norm.weight": (hidden,),
        "lm_head.weight": (len(EAGLE3_DRAFT_TOKENS), hidden),
        "d2t": (len(EAGLE3_DRAFT_TOKENS),),
        "t2d": (target.vocab_size,),
    }
    assert {name: tuple(t.shape) for name, t in weights.items()} == expected
    assert weights["d2t"].dtype == torch.int64
    assert (torch.arange(len(EAGLE3_DRAFT_TOKENS)) + weights["d2t"]).tolist() == list(EAGLE3_DRAFT_TOKENS)
    assert weights["t2d"].dtype == torch.bool
    assert weights["t2d"].nonzero().flatten().tolist() == sorted(EAGLE3_DRAFT_TOKENS)
    target_head = load_file(str(models.target / "model.safetensors"))["lm_head.weight"]
    torch.testing.assert_close(weights["lm_head.weight"], target_head[list(EAGLE3_DRAFT_TOKENS)], rtol=0, atol=0)


@pytest.mark.parametrize(
    ("arguments", "refusal"),
    [
        ({"draft_tokens": (1, 1, 2)}, "are not distinct target tokens"),
        ({"draft_tokens": (1, E2E_VOCAB)}, "are not distinct target tokens"),
        ({"aux_layers": (0, 2, 2)}, "repeat"),
    ],
)
def test_an_eagle3_head_that_vllm_would_misread_is_refused(tmp_path, arguments: dict[str, tuple[int, ...]], refusal: str) -> None:
    with pytest.raises(ValueError, match=refusal):
        save_tiny_eagle3(tmp_path / "eagle3", target=tiny_models().target, seed=0, **arguments)


def test_eagle3_is_unavailable_with_the_reason_where_the_release_cannot_run_the_tiny_head(monkeypatch) -> None:
    """Feature detection, not version tables: without ``llama_eagle3`` the engine is missing for that reason; with it
    but a Llama target that is not ``SupportsEagle3`` (no aux hidden states to read), for that one; with both but a
    model runner that ignores the head's aux layers (the 2-layer target cannot give vLLM's default three), for that."""
    vllm = types.SimpleNamespace(__version__="0.0.test")
    real_find_spec, real_import = importlib.util.find_spec, importlib.import_module
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith("vllm.") else real_find_spec(name, *a))
    assert unavailable(vllm)["eagle3"] == "vllm 0.0.test has no EAGLE-3 Llama head (vllm.model_executor.models.llama_eagle3)"

    fakes: dict[str, object] = {
        "vllm.model_executor.models.interfaces": types.SimpleNamespace(supports_eagle3=lambda model: False),
        "vllm.model_executor.models.llama": types.SimpleNamespace(LlamaForCausalLM=object),
    }
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name.startswith("vllm.") else real_find_spec(name, *a))

    def fake_import(name: str, *args: str) -> object:
        if name not in fakes:
            return real_import(name, *args)
        if fakes[name] is None:
            raise ImportError(f"No module named {name!r}")
        return fakes[name]

    monkeypatch.setattr(importlib, "import_module", fake_import)
    assert unavailable(vllm)["eagle3"] == "vllm 0.0.test has no EAGLE-3 support in its Llama target (SupportsEagle3)"
    fakes["vllm.model_executor.models.interfaces"] = types.SimpleNamespace(supports_eagle3=lambda model: True)
    fakes["vllm.v1.worker.gpu_model_runner"] = types.SimpleNamespace(GPUModelRunner=type("GPUModelRunner", (), {}))
    fakes["vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils"] = types.SimpleNamespace()
    assert "not from the head's eagle_aux_hidden_state_layer_ids" in unavailable(vllm)["eagle3"]
    runner = type("GPUModelRunner", (), {"_get_eagle3_aux_layers_from_config": lambda self: None})
    fakes["vllm.v1.worker.gpu_model_runner"] = types.SimpleNamespace(GPUModelRunner=runner)
    assert "eagle3" not in unavailable(vllm)
    fakes["vllm.v1.worker.gpu_model_runner"] = None  # model runner v2 only
    fakes["vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils"] = types.SimpleNamespace(get_eagle3_aux_layers_from_config=None)
    assert "eagle3" not in unavailable(vllm)
