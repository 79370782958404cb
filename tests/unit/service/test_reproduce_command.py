"""The command a check run prints to reproduce a run: the suite's arguments less a confirmation's own seeds and replays."""

from __future__ import annotations

from service.models import Run, Target
from service.notifications.check_runs import reproduce_command


def test_a_confirmations_attempt_and_replays_are_left_out() -> None:
    target = Target(name="lib", repo_url="https://github.com/acme/lib", adapter="toy_lib.sampler:speculative_sample", branches=["main"])
    args = [
        "--quick",
        "--attempt",
        "1",
        "--replay",
        "direct/far_apart/V8/g1",
        "--replay",
        "direct/far_apart/V8/g3",
        "--replay-attempt",
        "0",
    ]
    run = Run(seed=7, device="cpu", result_header={"suite_args": args})
    assert reproduce_command(target, run) == [
        "specwatch",
        "check",
        "--target",
        "toy_lib.sampler:speculative_sample",
        "--source",
        "checkout",
        "--seed",
        "7",
        "--quick",
    ]
