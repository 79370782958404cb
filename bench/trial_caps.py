"""Trial caps of the reference battery's direct cases at one design TV: what ``runner.trial_cap`` plans per case.

Every direct case at TV ``--epsilon`` (not its own), the reference sampler, the threshold of an ``--tests``-check run
at alpha = 1e-4, the designed checks' supports. Run it on two trees to compare their sizing at equal (epsilon, beta):

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python bench/trial_caps.py --epsilon 0.05
"""

from __future__ import annotations

import argparse

import torch

from specwatch.cases import DIRECT_CASES
from specwatch.evidence import designed_checks
from specwatch.runner import SuiteConfig, trial_cap
from specwatch.sampling import reference_sampler
from specwatch.stats import rejection_threshold


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epsilon", type=float, default=0.05, help="design TV of every case")
    parser.add_argument("--tests", type=int, default=211, help="checks in the run (Bonferroni m; 211: the reference battery)")
    args = parser.parse_args(argv)
    config = SuiteConfig()
    threshold = rejection_threshold(config.alpha, args.tests)
    total = 0
    for case in DIRECT_CASES:
        if case.make_step is None:
            continue
        experiment = case.build(reference_sampler, torch.device("cpu"))
        cap = trial_cap(experiment, config, args.epsilon, threshold)
        supports = sorted({c.support for c in designed_checks(experiment, args.epsilon)})
        total += cap
        print(f"{case.id:48s} {cap:>10,d}  designed supports {supports}")
    print(f"{'total':48s} {total:>10,d}  (TV {args.epsilon:g}, threshold {threshold:.3g})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
