"""Whether a tuning session keeps a tried move: a test on log runtimes, with racing.

The old rule kept a move only when it was faster by max(2 %, 3 * sqrt(s1^2 + s2^2)): an 8.5 %
gain at a median spread of 2 %, so real 3-8 % gains counted as misses, and two misses ended
the session. Here a run is a sample of its configuration's log runtime, and the question is
P(candidate faster than incumbent):

- each configuration's log runtime is normal with unknown mean and sigma; sigma is pooled from
  the runs' own spreads (a prior worth PRIOR_DF degrees of freedom, at least SIGMA_FLOOR) and,
  from two runs on, the spread between its runs (which sees the load changes between them);
- with a flat prior on the means, the difference of the two mean log runtimes is normal, and
  P(faster) = Phi(d / sqrt(sigma_i^2 / n_i + sigma_c^2 / n_c)), d = mean log incumbent - mean
  log candidate;
- keep at P >= CONFIDENCE; slower beyond the noise (a miss) at P <= 1 - CONFIDENCE;
- in between it is ambiguous: while the candidate looks at least as fast (P >= RACE_FROM) and
  fewer than MAX_PAIRS pairs were raced, run incumbent and candidate again, interleaved (racing,
  as in F-Race / irace); otherwise revert, within the noise, which is not a miss. A rule with
  a session budget (`session_pairs`) races no more pairs than that over the whole session: on a
  noisy machine most moves are ambiguous, and racing each of them costs runs per session.

Pure functions; the coordinator's session fold and the evaluation's replay both call `judge`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from .noise import is_faster

CONFIDENCE = 0.9
MAX_PAIRS = 3
RACE_FROM = 0.5
SIGMA_FLOOR = 0.01
PRIOR_DF = 2.0

Outcome = Literal["keep", "revert", "race"]


@dataclass(frozen=True)
class Sample:
    """One run of a configuration: its runtime (a median of its repeats) and relative spread."""

    runtime_s: float
    spread: float | None = None


@dataclass(frozen=True)
class KeepRule:
    """`kind="threshold"`: the old rule (runner.noise.is_faster on the first run of each, every
    revert a miss), kept to replay and compare against; never raced."""

    kind: Literal["test", "threshold"] = "test"
    confidence: float = CONFIDENCE
    max_pairs: int = MAX_PAIRS
    race_from: float = RACE_FROM
    session_pairs: int | None = None  # pairs raced over a whole session; None: no budget
    sigma_floor: float = SIGMA_FLOOR
    prior_df: float = PRIOR_DF

    def __post_init__(self) -> None:
        if not 0.5 < self.confidence < 1.0:
            raise ValueError(f"confidence {self.confidence}: accepted is 0.5 < confidence < 1")
        if self.max_pairs < 0:
            raise ValueError(f"max_pairs {self.max_pairs}: accepted is 0 or more")
        if self.session_pairs is not None and self.session_pairs < 0:
            raise ValueError(
                f"session_pairs {self.session_pairs}: accepted is 0 or more, or None (no budget)"
            )
        if self.sigma_floor <= 0 or self.prior_df <= 0:
            raise ValueError("sigma_floor and prior_df must be > 0")


DEFAULT_RULE = KeepRule()
OLD_RULE = KeepRule(kind="threshold", max_pairs=0)


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    p_faster: float
    within_noise: bool  # reverted without being slower beyond the noise: not a miss

    @property
    def kept(self) -> bool:
        return self.outcome == "keep"

    @property
    def miss(self) -> bool:
        return self.outcome == "revert" and not self.within_noise


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _check(samples: Sequence[Sample], who: str) -> list[float]:
    if not samples:
        raise ValueError(f"no {who} runs: at least one run of each configuration is needed")
    bad = [s.runtime_s for s in samples if not (s.runtime_s > 0 and math.isfinite(s.runtime_s))]
    if bad:
        raise ValueError(f"{who} runtimes must be finite and > 0, got {bad[0]!r}")
    return [math.log(s.runtime_s) for s in samples]


def sigma(samples: Sequence[Sample], rule: KeepRule = DEFAULT_RULE) -> float:
    """Relative sigma of one run of this configuration (sigma of its log runtime)."""
    logs = _check(samples, "the configuration's")
    spreads = [max(s.spread or 0.0, rule.sigma_floor) for s in samples]
    prior = sum(x * x for x in spreads) / len(spreads)
    n = len(logs)
    if n < 2:
        return math.sqrt(prior)
    mean = sum(logs) / n
    between = sum((x - mean) ** 2 for x in logs) / (n - 1)
    pooled = (rule.prior_df * prior + (n - 1) * between) / (rule.prior_df + n - 1)
    return math.sqrt(max(pooled, rule.sigma_floor**2))


def p_faster(
    incumbent: Sequence[Sample], candidate: Sequence[Sample], rule: KeepRule = DEFAULT_RULE
) -> float:
    """P(the candidate's true runtime is below the incumbent's), from every run of each."""
    li, lc = _check(incumbent, "incumbent"), _check(candidate, "candidate")
    d = sum(li) / len(li) - sum(lc) / len(lc)
    se = math.sqrt(sigma(incumbent, rule) ** 2 / len(li) + sigma(candidate, rule) ** 2 / len(lc))
    return _phi(d / se)


def judge(
    incumbent: Sequence[Sample],
    candidate: Sequence[Sample],
    pairs_raced: int,
    rule: KeepRule = DEFAULT_RULE,
    session_pairs_raced: int = 0,
) -> Verdict:
    """Keep, revert, or race one more pair (incumbent then candidate). `pairs_raced`: this
    move's pairs so far; `session_pairs_raced`: the session's, this move's included."""
    p = p_faster(incumbent, candidate, rule)
    if rule.kind == "threshold":
        i, c = incumbent[0], candidate[0]
        faster = is_faster(c.runtime_s, c.spread, i.runtime_s, i.spread)
        return Verdict("keep" if faster else "revert", p, False)
    if p >= rule.confidence:
        return Verdict("keep", p, False)
    if p <= 1.0 - rule.confidence:
        return Verdict("revert", p, False)
    budget_left = rule.session_pairs is None or session_pairs_raced < rule.session_pairs
    if pairs_raced < rule.max_pairs and budget_left and p >= rule.race_from:
        return Verdict("race", p, True)
    return Verdict("revert", p, True)


def geometric_mean(samples: Sequence[Sample]) -> float:
    logs = _check(samples, "the configuration's")
    return math.exp(sum(logs) / len(logs))
