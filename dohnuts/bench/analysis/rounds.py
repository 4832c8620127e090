"""Two builds timed in interleaved rounds: is the candidate slower than the base, and by how much
could it be without this run seeing it?

    effects = [round_effect(pairs) for pairs in rounds]   # pairs: [(base_ms, candidate_ms), ...]
    row = judge_rounds("text · dohnuts", effects, confidence=0.95, min_effect=0.05)

The driver (dohnuts.bench.measure.interleave) runs the base and the candidate as two processes that take
turns call by call, a fresh pair of processes each round. The statistics follow that design:

- within a round, each pair of calls (one of each side, back to back, the order alternating) gives
  log(candidate / base); the round's effect is the median of its pairs' log ratios. Both calls of
  a pair meet the same machine (the same other processes, clocks, caches), so load that comes and
  goes — on the shared 2-core CI machine a call's time moves by 1.5–3× within seconds — cancels
  pair by pair, and a pair that straddles a change of load is one outlier the median ignores;
- across rounds, the effects differ by what one process pair does that another does not (memory
  layout, which core, a load that stayed for one round): the rounds are the independent samples.
  The estimate is their mean, exp(mean) the ratio; its interval is Student's t over the rounds,
  two-sided at `confidence`, mean ± t(n − 1) · s / √n (scipy.stats.ttest_1samp's): n rounds give
  n − 1 degrees of freedom;
- the verdict (alpha = 1 − confidence, m = min_effect):

      "slower"  when the whole interval lies above 1 + m
      "faster"  when the whole interval lies below 1 / (1 + m)
      "no detectable change" otherwise

  so a "slower" claims a slowdown of at least m at one-sided level alpha / 2;
- the smallest detectable effect: the slowdown this run would call "slower" with probability
  `power` (0.9) given the spread its rounds showed — under normal round effects the t statistic
  of a true log ratio log(1 + e) is noncentral t, so e solves
  P(T(n − 1, nc) > t_crit) = power with nc = (log(1 + e) − log(1 + m)) / (s / √n), s the rounds'
  standard deviation and t_crit the interval's quantile (scipy.stats.nct). A slowdown at least
  this large fails the gate at least 9 times in 10 on a machine as noisy as this run found it;
  a smaller one may pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dohnuts.bench.analysis.compare import FASTER, NO_CHANGE, SLOWER

MIN_ROUNDS = 3  # the fewest rounds with a spread to judge by (2 degrees of freedom)
DEFAULT_POWER = 0.9  # the smallest detectable effect is caught this often


@dataclass(frozen=True)
class RoundsVerdict:
    """One workload · target of an interleaved gate: candidate over base."""

    name: str
    rounds: int
    ratio: float                 # exp(mean of the rounds' effects): candidate / base
    ci_low: float
    ci_high: float
    spread: float                # standard deviation of the rounds' log ratios (≈ relative spread)
    smallest_detectable: float   # the slowdown caught with probability `power`, as a fraction
    round_ratios: tuple[float, ...]
    verdict: str


def round_effect(pairs) -> float:
    """One round's log(candidate / base): the median over its pairs of log(candidate_ms / base_ms)."""
    x = np.asarray(list(pairs), dtype=float)  # (pairs, 2): base, candidate
    if x.ndim != 2 or x.shape[1] != 2 or x.shape[0] == 0:
        raise ValueError(f"needs (base_ms, candidate_ms) pairs, got an array of shape {x.shape}")
    if not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise ValueError("every time must be a positive finite number")
    return float(np.median(np.log(x[:, 1] / x[:, 0])))


def _t_crit(confidence: float, rounds: int) -> float:
    # scipy.stats: a second's import, only where an interval or a test is computed
    from scipy import stats

    return float(stats.t.ppf(0.5 + confidence / 2, rounds - 1))


def smallest_detectable(spread: float, rounds: int, *, confidence: float, min_effect: float,
                        power: float = DEFAULT_POWER) -> float:
    """The slowdown (a fraction) whose rounds would give "slower" with probability `power`, for
    rounds whose log ratios have standard deviation `spread` (module docstring)."""
    # scipy.stats: a second's import, only where an interval or a test is computed
    from scipy import optimize, stats

    _check(confidence, min_effect, rounds)
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must be between 0 and 1, got {power!r}")
    if spread == 0.0:
        return min_effect  # no noise: anything beyond the threshold is seen
    df, t_crit = rounds - 1, _t_crit(confidence, rounds)
    # P(T' > t_crit) grows with the noncentrality; it is below `power` at nc = 0 and above it
    # once nc clears t_crit by the power's own (central) quantile plus a margin.
    upper = t_crit + 10.0 * float(stats.t.ppf(power, df)) + 10.0
    nc = optimize.brentq(lambda c: stats.nct.sf(t_crit, df, c) - power, 0.0, upper, xtol=1e-10)
    return math.exp(math.log1p(min_effect) + nc * spread / math.sqrt(rounds)) - 1.0


def judge_rounds(name: str, effects, *, confidence: float = 0.95, min_effect: float = 0.05,
                 power: float = DEFAULT_POWER) -> RoundsVerdict:
    """The verdict on one workload · target from its rounds' effects (round_effect, one a round)."""
    d = np.asarray(list(effects), dtype=float)
    _check(confidence, min_effect, d.size)
    if not np.all(np.isfinite(d)):
        raise ValueError("every round's effect must be finite")
    mean, spread = float(d.mean()), float(d.std(ddof=1))
    half = _t_crit(confidence, d.size) * spread / math.sqrt(d.size)  # scipy.stats.ttest_1samp's interval
    lo, hi = mean - half, mean + half
    if lo > math.log1p(min_effect):
        verdict = SLOWER
    elif hi < -math.log1p(min_effect):
        verdict = FASTER
    else:
        verdict = NO_CHANGE
    return RoundsVerdict(
        name=name, rounds=int(d.size), ratio=math.exp(mean), ci_low=math.exp(lo), ci_high=math.exp(hi),
        spread=spread, verdict=verdict, round_ratios=tuple(float(x) for x in np.exp(d)),
        smallest_detectable=smallest_detectable(spread, int(d.size), confidence=confidence, min_effect=min_effect,
                                                power=power))


def _check(confidence: float, min_effect: float, rounds: int) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1 (exclusive), got {confidence!r}")
    if not min_effect >= 0.0:
        raise ValueError(f"min_effect must be non-negative, got {min_effect!r}")
    if rounds < MIN_ROUNDS:
        raise ValueError(f"needs at least {MIN_ROUNDS} rounds, got {rounds}")
