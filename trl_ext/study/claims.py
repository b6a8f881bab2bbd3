"""A study's claims: published statements about two arms, each judged from the seeds' paired differences.

    claims:
      - claim: "Dr.GRPO: GRPO's per-response normalisation lets incorrect responses grow"
        metric: heldout/incorrect_length      # one of the study's metrics
        arm: grpo                             # judged on arm - baseline, paired by seed
        baseline: drgrpo
        direction: greater                    # greater | less | equivalent
        margin: 0.02                          # equivalent: |arm - baseline| < margin; greater / less: the smallest
                                              #   effect that counts (default 0)
        value: last                           # last: the last validation; mean: the mean over the validations
                                              #   (the area under the held-out curve per step, a speed measure)

Verdict from the 95% Student-t interval of the paired differences (scipy):

- `greater` (`less` mirrored): **shown** when the interval lies above `margin`; **refuted** when it lies below it
  (so with `margin` 0: it excludes 0 in the claimed direction, or in the other one);
- `equivalent`: **shown** when the interval lies inside (-margin, margin); **refuted** when it lies wholly outside
  that band;
- else **cannot tell**, with the seeds a power calculation says a decision would take if the true difference were
  the measured mean and the seeds' spread the measured one: the smallest n at which a paired t-test at the
  interval's level decides with probability 0.8 (noncentral t, `scipy.stats.nct`); for `equivalent` inside the band,
  both one-sided tests of the band (TOST) at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DIRECTIONS = ("greater", "less", "equivalent")
VALUES = ("last", "mean")
CONFIDENCE = 0.95
POWER = 0.8
#: Power calculations stop here; a claim that would take more seeds is reported as "more than" this.
MAX_SEEDS = 1000
_KEYS = {"claim", "metric", "arm", "baseline", "direction", "margin", "value"}


@dataclass(frozen=True)
class Claim:
    """One claim: `direction` of `arm - baseline` on `metric` (`value`: the last validation or the curve's mean)."""

    claim: str
    metric: str
    arm: str
    baseline: str
    direction: str
    margin: float = 0.0
    value: str = "last"


def parse_claims(raw, where: str, arms: list[str], metrics: list[str]) -> tuple[Claim, ...]:
    """The study file's `claims:` list, checked against its arms and metrics.

    Raises:
        ValueError: naming the claim's index and field.
    """
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError(f"{where}: claims is a list of {{claim, metric, arm, baseline, direction, ...}}")
    out = []
    for i, entry in enumerate(raw):
        at = f"{where}: claims[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{at}: give a mapping {{claim, metric, arm, baseline, direction}}")
        unknown = sorted(set(entry) - _KEYS)
        if unknown:
            raise ValueError(f"{at}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(_KEYS))})")
        for name in ("claim", "metric", "arm", "baseline", "direction"):
            if not isinstance(entry.get(name), str) or not entry[name]:
                raise ValueError(f"{at}.{name}: required, a non-empty string")
        for name in ("arm", "baseline"):
            if entry[name] not in arms:
                raise ValueError(f"{at}.{name}: {entry[name]!r} is not an arm ({', '.join(arms)})")
        if entry["arm"] == entry["baseline"]:
            raise ValueError(f"{at}: arm and baseline are both {entry['arm']!r}; a claim compares two arms")
        if entry["metric"] not in metrics:
            raise ValueError(f"{at}.metric: {entry['metric']!r} is not one of the study's metrics ({metrics})")
        if entry["direction"] not in DIRECTIONS:
            raise ValueError(f"{at}.direction: {entry['direction']!r}; choose one of {', '.join(DIRECTIONS)}")
        margin = entry.get("margin", None)
        if entry["direction"] == "equivalent" and margin is None:
            raise ValueError(f"{at}.margin: an equivalent claim needs the band, |arm - baseline| < margin")
        margin = 0.0 if margin is None else margin
        if isinstance(margin, bool) or not isinstance(margin, int | float) or margin < 0:
            raise ValueError(f"{at}.margin: a number >= 0, got {margin!r}")
        if entry["direction"] == "equivalent" and margin == 0:
            raise ValueError(f"{at}.margin: an equivalent claim needs a band > 0")
        value = entry.get("value", "last")
        if value not in VALUES:
            raise ValueError(f"{at}.value: {value!r}; choose one of {', '.join(VALUES)}")
        out.append(Claim(entry["claim"], entry["metric"], entry["arm"], entry["baseline"], entry["direction"],
                         float(margin), value))  # fmt: skip
    return tuple(out)


def _one_sided_power(effect: float, n):
    """Probability that the interval's bound on the effect's side clears 0, for standardised `effect` >= 0 (`n`: an
    array of seed counts)."""
    import numpy as np
    from scipy import stats

    df = n - 1
    critical = stats.t.ppf(1 - (1 - CONFIDENCE) / 2, df)
    return stats.nct.sf(critical, df, effect * np.sqrt(n))


def _equivalence_power(mean: float, sd: float, margin: float, n):
    """Probability that the interval lies inside (-margin, margin): both one-sided tests at once, the usual lower
    bound P(upper) + P(lower) - 1 (exact enough where it reaches `POWER`)."""
    import numpy as np
    from scipy import stats

    df = n - 1
    critical = stats.t.ppf(1 - (1 - CONFIDENCE) / 2, df)
    upper = stats.nct.cdf(-critical, df, (mean - margin) * np.sqrt(n) / sd)  # D + t s / sqrt(n) < margin
    lower = stats.nct.sf(critical, df, (mean + margin) * np.sqrt(n) / sd)  # D - t s / sqrt(n) > -margin
    return upper + lower - 1


def seeds_to_decide(claim: Claim, mean: float, sd: float) -> int | None:
    """The fewest seeds (>= 2) at which the claim would be decided (shown or refuted) with probability `POWER`, if
    the true paired difference were `mean` with seed-to-seed spread `sd`; None when that takes more than
    `MAX_SEEDS` (or `sd` is 0 and the mean sits on a decision boundary)."""
    import numpy as np

    n = np.arange(2, MAX_SEEDS + 1)
    if not sd > 0:
        return None
    if claim.direction == "equivalent" and abs(mean) < claim.margin:
        power = _equivalence_power(mean, sd, claim.margin, n)
    else:  # decided when the interval leaves 0 (directional, margin m: leaves m) on the side the mean lies
        boundary = claim.margin if claim.direction == "greater" else -claim.margin
        if claim.direction == "equivalent":
            boundary = math.copysign(claim.margin, mean)
        if mean == boundary:
            return None
        power = _one_sided_power(abs(mean - boundary) / sd, n)
    hits = np.nonzero(power >= POWER)[0]
    return int(n[hits[0]]) if hits.size else None


def judge(claim: Claim, diffs: list[float]) -> dict:
    """The claim's verdict from the paired differences `arm - baseline` (one per seed both arms finished).

    Returns:
        `{"n", "mean", "sd", "low", "high", "verdict", "seeds_to_decide"}`; verdict `shown`, `refuted`,
        `cannot tell`, or `no data` (fewer than two pairs: no interval).
    """
    import numpy as np
    from scipy import stats

    values = np.asarray(diffs, dtype=float)
    out = {"n": int(values.size), "mean": None, "sd": None, "low": None, "high": None, "verdict": "no data"}
    out["seeds_to_decide"] = None
    if values.size < 2:
        if values.size:
            out["mean"] = float(values[0])
        return out
    mean, sd = float(values.mean()), float(values.std(ddof=1))
    if sd > 0:
        low, high = stats.t.interval(CONFIDENCE, values.size - 1, loc=mean, scale=sd / math.sqrt(values.size))
    else:
        low = high = mean
    out.update(mean=mean, sd=sd, low=float(low), high=float(high))
    m = claim.margin
    if claim.direction == "greater":
        verdict = "shown" if low > m else "refuted" if high < m else "cannot tell"
    elif claim.direction == "less":
        verdict = "shown" if high < -m else "refuted" if low > -m else "cannot tell"
    else:
        verdict = "shown" if -m < low and high < m else "refuted" if low > m or high < -m else "cannot tell"
    out["verdict"] = verdict
    if verdict == "cannot tell":
        out["seeds_to_decide"] = seeds_to_decide(claim, mean, sd)
    return out
