"""``python -m specwatch``: run the suite and print JSON (the protocol workers and the CLI read).

Exit status (:class:`specwatch.protocol.ExitStatus`): 0 every case passed, 1 a violation (some case failed,
including a target that raised on a valid input: that case fails as ``raised``), 2 a usage or target error
(a target that cannot be loaded, a case that cannot be set up or errors), 3 the ``--pip`` release could not be
installed (``could not install: REQUIREMENT (why)``; nothing was tested).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from specwatch.cases import select
from specwatch.mutants import MUTANTS
from specwatch.parallel import ProcessPool
from specwatch.protocol import CaseResult, ExitStatus, Verdict
from specwatch.runner import Progress, SuiteConfig, run_suite
from specwatch.targets import TargetError
from specwatch.targets.install import InstallError, pip_install, rerun_with, source_path
from specwatch.targets.loader import resolve
from specwatch.targets.registry import Distribution, hook, registry

#: Targets that test a built-in sampler: a release or a checkout beside them would go untested.
BUILT_IN = ("reference", "mutant:")


class UsageError(Exception):
    pass


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}, allow_nan=False), flush=True)


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specwatch", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run cases against a target")
    run.add_argument(
        "--target",
        default=None,
        help=(
            "reference | mutant:NAME | module:function | a registered library target (transformers, vllm, sglang, "
            "llamacpp, ...) (default: the library of --pip/--source, else reference)"
        ),
    )
    where = run.add_mutually_exclusive_group()
    where.add_argument(
        "--pip", default=None, metavar="REQ", help="test this release (e.g. transformers==4.46.3), installed in an isolated cache"
    )
    where.add_argument("--source", default=None, metavar="PATH", help="test a source checkout (its src/ first on PYTHONPATH)")
    run.add_argument("--cases", action="append", default=[], metavar="GLOB", help="case id glob (repeatable)")
    run.add_argument("--quick", action="store_true", help="test every case at TV >= 0.05 (fewer trials)")
    run.add_argument("--alpha", type=_positive_float, default=1e-4, help="family-wise false-alarm rate of the run")
    run.add_argument("--beta", type=_positive_float, default=1e-3, help="miss rate at the design TV distance")
    run.add_argument("--epsilon", type=_positive_float, default=None, help="TV distance to detect (overrides cases)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--attempt", type=int, default=0)
    run.add_argument(
        "--replay",
        action="append",
        default=[],
        metavar="CASE",
        help="run this case first with --replay-attempt's seeds (an earlier run's inputs), then with its own (repeatable)",
    )
    run.add_argument("--replay-attempt", type=int, default=0, help="the seed attempt whose inputs --replay replays (default 0)")
    run.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    run.add_argument("--max-trials", type=int, default=SuiteConfig.max_trials)
    run.add_argument(
        "--max-batch", type=int, default=None, help="most trials per sampler call (default: sized to memory from the case's V and gamma)"
    )
    run.add_argument("--time-budget", type=_positive_float, default=None, help="seconds per case")
    run.add_argument("--fail-fast", action="store_true", help="stop after the first failing case")
    run.add_argument("--no-early-pass", dest="early_pass", action="store_false", help="run every passing case to its cap (no early pass)")
    run.add_argument("--jobs", type=int, default=1, help="processes to run cases in (one thread each)")
    run.add_argument("--json", type=Path, default=None, help="also write the run result to this file")
    run.add_argument("--events", action="store_true", help="print JSON-lines progress events")
    lister = sub.add_parser("list", help="list cases as JSON")
    lister.add_argument("--cases", action="append", default=[], metavar="GLOB")
    lister.add_argument("--target", default="reference", help="whose cases: reference (the built-in catalogue) or a library target")
    sub.add_parser("mutants", help="list the mutant catalogue as JSON")
    return parser


def _config(args: argparse.Namespace) -> SuiteConfig:
    if not args.alpha < 1 or not args.beta < 1:
        raise UsageError("--alpha and --beta must be in (0, 1)")
    if args.max_trials < 1:
        raise UsageError("--max-trials must be >= 1")
    if args.max_batch is not None and args.max_batch < 1:
        raise UsageError("--max-batch must be >= 1")
    device = torch.device(args.device) if args.device.split(":")[0] in ("cpu", "cuda") else None
    if device is None:
        raise UsageError(f"unknown device {args.device!r}; use cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: CUDA is not available on this machine")
    return SuiteConfig(
        alpha=args.alpha,
        beta=args.beta,
        epsilon=args.epsilon,
        quick=args.quick,
        seed=args.seed,
        attempt=args.attempt,
        replay=frozenset(args.replay),
        replay_attempt=args.replay_attempt,
        device=args.device,
        max_trials=args.max_trials,
        sampler_max_batch=args.max_batch,
        time_budget_s=args.time_budget,
        fail_fast=args.fail_fast,
        early_pass=args.early_pass,
    )


def _without(argv: list[str], option: str) -> list[str]:
    """argv with ``option VALUE`` / ``option=VALUE`` removed."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(f"{option}="):
            out.append(arg)
    return out


def _library_of(args: argparse.Namespace) -> str:
    """The distribution name that ``--pip`` or ``--source`` names (lower case, ``-`` for ``_``)."""
    if args.pip:
        return re.split(r"[=<>~!\[;\s]", args.pip.strip(), maxsplit=1)[0].lower().replace("_", "-")
    root = Path(args.source).expanduser()
    if not root.is_dir():
        raise UsageError(f"--source {args.source}: no such directory")
    for info in registry().runnable().values():
        if info.checkout is not None and hook(info.checkout.recognise)(root):
            return info.checkout.distribution
    packages = root / "src" if (root / "src").is_dir() else root
    for dist in _distributions():
        if (packages / dist.package / "__init__.py").is_file():
            return dist.name
    return root.resolve().name.lower().replace("_", "-")


def _distributions() -> list[Distribution]:
    return [dist for info in registry().runnable().values() for dist in info.distributions]


def library_targets() -> dict[str, str]:
    """The target that tests each library a ``--pip`` requirement or a ``--source`` checkout can name (its
    distributions and the kind of checkout it builds: :mod:`specwatch.targets.registry`)."""
    found: dict[str, str] = {}
    for name, info in registry().runnable().items():
        found.update({dist.name: name for dist in info.distributions})
        if info.checkout is not None:
            found[info.checkout.distribution] = name
    return found


def _target_of(args: argparse.Namespace) -> str:
    """The target to run: ``--target``, or with ``--pip``/``--source`` the library's own target.

    A release or checkout given beside a built-in target (the reference, a mutant) is refused: that run
    would test the built-in sampler and say nothing about the library the user named.
    """
    if not (args.pip or args.source):
        return str(args.target or "reference")
    given = "--pip " + args.pip if args.pip else f"--source {args.source}"
    if args.target is not None and args.target.startswith(BUILT_IN):
        raise UsageError(f"--target {args.target} tests a built-in sampler, not {given}; leave --target out to test the library")
    if args.target is not None:
        return str(args.target)
    library = _library_of(args)
    targets = library_targets()
    if library not in targets:
        known = ", ".join(sorted(targets))
        raise UsageError(f"{given}: no target tests {library!r} (known: {known}); name one with --target module:function")
    return targets[library]


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    args.target = _target_of(args)
    if args.pip or args.source:
        _config(args)  # usage errors first, before any install
        path = pip_install(args.pip) if args.pip else source_path(args.source)
        rest = _without(_without(argv, "--pip" if args.pip else "--source"), "--target")
        return rerun_with(path, [*rest, "--target", args.target])
    config = _config(args)
    target = resolve(args.target)
    matched = select(args.cases, target.cases)
    cases = tuple(c for c in matched if c.quick or not args.quick)
    if not cases:
        outside = " (all outside the --quick profile: leave --quick out)" if matched else ""
        raise UsageError(f"no case matches {' '.join(args.cases)!r}{outside}; see `python -m specwatch list`")
    # Cases a --cases glob named that the --quick profile leaves out: said, never dropped silently.
    running = {c.id for c in cases}
    left_out = [c.id for c in matched if c.id not in running] if args.cases else []
    torch.set_num_threads(1)
    if args.events:
        _emit("start", target=target.spec, cases=[c.id for c in cases], left_out=left_out)
    elif left_out:
        print(f"--quick: {len(left_out)} of {len(matched)} matching case(s) are outside the quick profile, not run", file=sys.stderr)

    def progress(p: Progress) -> None:
        fields = asdict(p)
        fields["log_e"] = p.log_e if math.isfinite(p.log_e) else None  # None: refuted with certainty
        _emit("progress", **fields)

    def on_result(r: CaseResult) -> None:
        _emit("case", result=r.to_dict())

    if args.jobs < 1:
        raise UsageError("--jobs must be >= 1")
    pool = ProcessPool(target.spec, args.jobs) if args.jobs > 1 else None
    try:
        result = run_suite(
            cases,
            target.sampler,
            config,
            target=target.spec,
            library=target.library,
            progress=progress if args.events else None,
            on_result=on_result if args.events else None,
            pool=pool,
        )
    finally:
        if pool is not None:
            pool.close()
    payload = result.to_dict()
    if args.json is not None:
        args.json.write_text(json.dumps(payload, indent=2, allow_nan=False) + "\n")
    if args.events:
        _emit("run", result=payload)
    else:
        print(json.dumps(payload, indent=2, allow_nan=False))
    return {Verdict.PASS: ExitStatus.OK, Verdict.FAIL: ExitStatus.VIOLATION}.get(result.verdict, ExitStatus.USAGE)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    try:
        if args.command == "list":
            listed = select(args.cases, resolve(args.target).cases)
            print(
                json.dumps(
                    [
                        {
                            "id": c.id,
                            "family": c.family,
                            "epsilon": c.epsilon,
                            "quick": c.quick,
                            "description": c.description,
                            "skip_reason": c.skip_reason,
                        }
                        for c in listed
                    ],
                    indent=2,
                )
            )
            return ExitStatus.OK
        if args.command == "mutants":
            print(json.dumps([{"name": m.name, "lossless": m.lossless, "description": m.description} for m in MUTANTS.values()], indent=2))
            return ExitStatus.OK
        return _run(args, argv)
    except (UsageError, TargetError, OSError) as exc:
        message = str(exc)
        install = exc if isinstance(exc, InstallError) else None
        if getattr(args, "events", False):
            detail = {"install": {"requirement": install.requirement, "cause": install.cause}} if install is not None else {}
            _emit("error", message=message, **detail)
        print(f"error: {message}", file=sys.stderr)
        return ExitStatus.INSTALL if install is not None else ExitStatus.USAGE


if __name__ == "__main__":
    sys.exit(main())
