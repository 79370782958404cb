"""Trials a second of vLLM's model-runner-v2 rejection sampler under Triton's interpreter (a kernels-only install).

Installs ``--pip`` (default vllm==0.34.0) kernels-only into the suite's release cache (on a machine without CUDA),
then runs itself again with that folder first on PYTHONPATH and the interpreter's variables (``interpreter_env``),
and times the adapter's sampler (``rejection_sampler_v2``: drafts drawn here, one call of ``rejection_sample`` for
all of them) on far-apart fixtures at V = 8 and 64, gamma 1 to 5, with draft logits and with one-hot drafts (no
draft logits cache), token by token and with block verification. One warm-up call per configuration first.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/vllm_interpreter.py [--pip vllm==0.34.0] [--trials 256]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
import torch


def _child(trials: int) -> None:
    from specwatch.sampling import Processing, SpecStep
    from specwatch.targets.vllm import interpreter
    from specwatch.targets.vllm.bindings_v2 import RejectionSampleV2Api, rejection_sampler_v2

    kernels = interpreter.prepare()
    api = RejectionSampleV2Api.load()
    print(f"kernels: {kernels}; {trials} trials per configuration, torch threads {torch.get_num_threads()}")
    print(f"{'V':>4} {'gamma':>5} {'draft':>8} {'verification':>13} {'trials/s':>9}")
    rng = np.random.default_rng(0)
    for vocab in (8, 64):
        for gamma in range(1, 6):
            target = np.log(rng.dirichlet(np.full(vocab, 0.3), size=gamma + 1) + 1e-12)
            draft = np.log(rng.dirichlet(np.full(vocab, 0.3), size=gamma) + 1e-12)
            soft = SpecStep(torch.from_numpy(target), torch.from_numpy(draft), Processing(), Processing())
            one_hot = np.full_like(draft, -np.inf)
            one_hot[np.arange(gamma), draft.argmax(axis=1)] = 0.0
            greedy = SpecStep(torch.from_numpy(target), torch.from_numpy(one_hot), Processing(), Processing())
            for name, step in (("logits", soft), ("one-hot", greedy)):
                for block in (False, True):
                    sampler = rejection_sampler_v2(api, block=block)
                    sampler(step, 8, torch.Generator().manual_seed(1))
                    started = time.perf_counter()
                    sampler(step, trials, torch.Generator().manual_seed(2))
                    rate = trials / (time.perf_counter() - started)
                    print(f"{vocab:>4} {gamma:>5} {name:>8} {'block' if block else 'token':>13} {rate:>9.1f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pip", default="vllm==0.34.0")
    parser.add_argument("--trials", type=int, default=256)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.trials)
        return 0
    from specwatch.targets.install import interpreter_env, pip_install

    path = pip_install(args.pip)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(path), os.environ.get("PYTHONPATH", "")) if p))
    extra = interpreter_env(path)
    if not extra:
        print(f"{args.pip} is not a kernels-only install here (a machine with CUDA?): nothing to measure", file=sys.stderr)
        return 2
    env.update(extra)
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, __file__, "--child", "--trials", str(args.trials)]
    return subprocess.run(cmd, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
