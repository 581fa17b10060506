"""The keep rule alone, on synthetic pairs with a known true gain: how often a move is kept,
counted as a miss or reverted within the noise, and how many runs it costs, for the old rule
(max(2 %, 3 sqrt(s1^2 + s2^2)) on one run each) and the new one (P(faster) >= 0.9, racing up
to 3 pairs). Seeded and deterministic; nothing is measured. Run:

    .venv/bin/python benchmarks/bench_keep_rule.py [--trials 4000] [--seed 0]

A run's runtime is true * exp(sigma * z): each run sees the load of its own moment, and its
reported spread is sigma (the spread of its repeats)."""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass, replace

from hpc_ds1.runner.keep import DEFAULT_RULE, OLD_RULE, KeepRule, Sample, judge


@dataclass
class Tally:
    kept: int = 0
    miss: int = 0
    tie: int = 0
    runs: int = 0


def race(gain: float, sigma: float, rule: KeepRule, rng: random.Random) -> tuple[str, int]:
    """One move from an incumbent measured once; returns (keep|miss|tie, runs it cost)."""

    def run(true: float) -> Sample:
        return Sample(true * math.exp(rng.gauss(0.0, sigma)), sigma)

    inc, cand = [run(1.0)], [run(1.0 - gain)]
    runs, pairs = 1, 0
    while True:
        v = judge(inc, cand, pairs, rule)
        if v.outcome != "race":
            break
        inc.append(run(1.0))
        cand.append(run(1.0 - gain))
        runs, pairs = runs + 2, pairs + 1
    return ("keep" if v.kept else "miss" if v.miss else "tie"), runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--confidence", type=float, default=DEFAULT_RULE.confidence)
    parser.add_argument("--race-from", type=float, default=DEFAULT_RULE.race_from)
    parser.add_argument("--max-pairs", type=int, default=DEFAULT_RULE.max_pairs)
    args = parser.parse_args()
    new = replace(
        DEFAULT_RULE,
        confidence=args.confidence,
        race_from=args.race_from,
        max_pairs=args.max_pairs,
    )
    print(f"trials {args.trials} per cell · seed {args.seed} · new rule {new}")
    print(
        f"{'sigma':>6} {'gain':>6} | {'old: kept':>9} {'miss':>6} | "
        f"{'new: kept':>9} {'miss':>6} {'tie':>6} {'runs/move':>9}"
    )
    for sigma in (0.01, 0.02, 0.05, 0.10):
        for gain in (-0.05, 0.0, 0.03, 0.05, 0.08, 0.15):
            t = {"old": Tally(), "new": Tally()}
            for name, rule in (("old", OLD_RULE), ("new", new)):
                rng = random.Random(f"{args.seed}:{sigma}:{gain}")  # the same draws for both
                for _ in range(args.trials):
                    what, runs = race(gain, sigma, rule, rng)
                    tally = t[name]
                    tally.kept += what == "keep"
                    tally.miss += what == "miss"
                    tally.tie += what == "tie"
                    tally.runs += runs
            n = args.trials
            print(
                f"{sigma:>6.0%} {gain:>+6.0%} | {t['old'].kept / n:>9.1%} {t['old'].miss / n:>6.1%}"
                f" | {t['new'].kept / n:>9.1%} {t['new'].miss / n:>6.1%} {t['new'].tie / n:>6.1%}"
                f" {t['new'].runs / n:>9.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
