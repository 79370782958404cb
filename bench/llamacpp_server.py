"""Trials a second of the llama-server cases: requests alone, the path (with coverage reconstruction) and the whole
experiment batch (requests, reconstruction and the float64 conditional forward).

Builds ``--pip`` (default llama-cpp-python==0.3.36) into the suite's release cache if needed, then runs itself again
with that folder first on PYTHONPATH. Per server configuration (no drafting, draft model, n-gram) and chain
(processing off, on): one warm-up request (starts the server), then ``--trials`` requests of 32 tokens.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/llamacpp_server.py [--pip llama-cpp-python==0.3.36] [--trials 256]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def _child(trials: int) -> None:
    import torch

    from specwatch.targets.llamacpp.adapter import LlamaCppAdapter
    from specwatch.targets.llamacpp.build import tool_path
    from specwatch.targets.llamacpp.experiments import PROMPT, GenerateExperiment
    from specwatch.targets.llamacpp.server import ServerConfig, shared_server, stop_all
    from specwatch.targets.llamacpp.server_cases import GAMMA, NGRAM, SERVER_HORIZON, SERVER_PROCESSING, ServerGenerate, ignore_eos_chain

    adapter = LlamaCppAdapter.load()
    binary = tool_path(adapter.info, "llama-server")
    if binary is None:
        raise SystemExit("llama-server was not built with this release")
    print(f"{binary}: {trials} trials of {SERVER_HORIZON} tokens per row, torch threads {torch.get_num_threads()}")
    print(f"{'server':>7} {'chain':>10} {'requests/s':>11} {'path/s':>8} {'experiment/s':>13} {'drafts/request':>15}")
    try:
        for spec in ("none", "draft", "ngram"):
            config = ServerConfig(spec, GAMMA, NGRAM)
            for label, settings in (("plain", {}), ("processed", SERVER_PROCESSING)):
                chain = ignore_eos_chain(settings)
                server = shared_server(binary, config)
                server.complete(PROMPT, chain, SERVER_HORIZON, 0)
                started = time.perf_counter()
                drafted = sum(server.complete(PROMPT, chain, SERVER_HORIZON, seed).draft_n for seed in range(1, trials + 1))
                requests = trials / (time.perf_counter() - started)
                path = ServerGenerate(binary, config)
                started = time.perf_counter()
                path.run(PROMPT, chain, SERVER_HORIZON, range(trials))
                path_rate = trials / (time.perf_counter() - started)
                experiment = GenerateExperiment(path, chain, speculative=spec != "none", horizon=SERVER_HORIZON)
                started = time.perf_counter()
                experiment.run(trials, torch.Generator().manual_seed(1))
                whole = trials / (time.perf_counter() - started)
                row = f"{spec:>7} {label:>10} {requests:>11.1f} {path_rate:>8.1f} {whole:>13.1f} {drafted / trials:>15.2f}"
                print(row, flush=True)
    finally:
        stop_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pip", default="llama-cpp-python==0.3.36")
    parser.add_argument("--trials", type=int, default=256)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.trials)
        return 0
    from specwatch.targets.install import pip_install

    folder = pip_install(args.pip)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, __file__, "--child", "--trials", str(args.trials)]
    return subprocess.run(cmd, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
