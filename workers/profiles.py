"""Run profiles: what a run's ``profile`` means as suite arguments and a wall-clock limit.

The control plane queues runs with ``settings.run_profile`` (``default`` unless configured); an unknown
profile makes the run an error with the list of known ones.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    # Arguments of `python -m specwatch run` besides target, seed, device and output.
    suite_args: tuple[str, ...]
    # Wall-clock limit of the suite subprocess, seconds.
    timeout_s: float
    description: str


PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        Profile("default", (), 4 * 3600, "every case at its designed TV distance"),
        Profile("quick", ("--quick",), 3600, "every case at TV >= 0.1 (fewer trials)"),
        Profile(
            "smoke",
            ("--quick", "--cases", "direct/far_apart/V8/*"),
            600,
            "two small direct cases at TV >= 0.1: seconds; checks the pipeline, not the library",
        ),
    )
}


class UnknownProfileError(LookupError):
    pass


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UnknownProfileError(f"unknown run profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None
