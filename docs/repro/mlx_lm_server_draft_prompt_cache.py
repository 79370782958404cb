"""mlx-lm 0.32.2: with a draft model, the KV cache a generation leaves is shorter than the tokens it is stored under.

``speculative_generate_step`` (``mlx_lm/generate.py``) ends with the target's cache holding the prompt and the output
but its last token in most calls (the target's own token of the last round is emitted, never fed; the draft's cache
lags further), where ``generate_step`` leaves prompt + output. ``mlx_lm.server`` stores the cache under prompt +
output all the same (``_serve_single``: ``cache_key.append(gen.token)`` then ``insert_cache(..., cache_key, cache)``)
and a later request that shares a prefix with it trims it by the key's length (``LRUPromptCache.fetch_nearest_cache``,
``mlx_lm/models/cache.py``): the target (and draft) cache then holds one position (or more) fewer than the prefix it
is credited for, and the model reads the prompt with a token missing. With ``--draft-model`` a repeated prompt decodes
otherwise than greedy decoding at temperature 0 and sampling leaves the law; without a draft model it does not.

Part 1 (in-process): the cache offsets after ``stream_generate`` with and without the draft model, against the length
of prompt + output. Part 2 (over HTTP, ``--server``): ``mlx_lm.server`` with and without ``--draft-model`` on one
random tiny model pair saved as folders, the same prompt asked 3 times at temperature 0 between other prompts.

    PYTHONPATH=<cache>/pip/mlx-lm__0.32.2 python docs/repro/mlx_lm_server_draft_prompt_cache.py [--server]
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import mlx.core as mx
import mlx_lm
from mlx_lm.models import llama
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import save_config, save_model
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PIECES = "abcdefgh"
CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "vocab_size": len(PIECES),
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


def tiny(seed: int) -> llama.Model:
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs(**CONFIG))
    mx.eval(model.parameters())
    return model


def tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(PIECES)}, unk_token="a"))  # noqa: S106 - a token, not a password
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def offsets(target: llama.Model, draft: llama.Model) -> None:
    for use_draft in (True, False):
        for max_tokens in (5, 8, 12):
            cache = make_prompt_cache(target) + (make_prompt_cache(draft) if use_draft else [])
            kwargs = {"draft_model": draft, "num_draft_tokens": 3} if use_draft else {}
            out = [
                g.token
                for g in mlx_lm.stream_generate(
                    target,
                    TokenizerWrapper(tokenizer()),
                    [0, 1, 2, 3],
                    max_tokens=max_tokens,
                    sampler=make_sampler(temp=0.0),
                    prompt_cache=cache,
                    **kwargs,
                )
            ]
            lagging = f", draft cache {cache[len(target.layers)].offset}" if use_draft else ""
            print(f"{'draft' if use_draft else 'plain'}: prompt + output {4 + len(out)} tokens, target cache {cache[0].offset}{lagging}")  # noqa: T201


def served(folder: Path, use_draft: bool) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "mlx_lm.server", "--model", str(folder / "target"), "--port", str(port), "--log-level", "WARNING"]
    command += ["--draft-model", str(folder / "draft")] if use_draft else []
    server = subprocess.Popen(command, stderr=subprocess.DEVNULL)  # noqa: S603
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.2)
        for prompt in ("abcd", "d", "abcd", "bchfhdf", "abcd", "cc", "abcd"):
            body = {"prompt": prompt, "max_tokens": 8, "temperature": 0.0, "seed": 0, "logprobs": True}
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            answer = json.loads(urllib.request.urlopen(request).read())  # noqa: S310
            ids = [e["id"] for e in answer["choices"][0]["logprobs"]["content"]]
            cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            print(f"{'--draft-model' if use_draft else 'no draft'}: {prompt!r} -> {ids} (cached {cached})")  # noqa: T201
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    target, draft = tiny(1), tiny(2)
    offsets(target, draft)
    if "--server" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            for name, model in (("target", target), ("draft", draft)):
                save_model(folder / name, model)
                save_config(dict(CONFIG), folder / name / "config.json")
                tokenizer().save_pretrained(str(folder / name))
            served(folder, use_draft=True)
            served(folder, use_draft=False)


if __name__ == "__main__":
    main()
