#!/usr/bin/env python3
"""The straggler detector's chance test under no fault, simulated.

Ranks with normal noise, no straggler: at each collective a rank's lag is
how far it is behind the median rank (0 where ahead), summed per bucket of
m collectives and centred on the others' mean, as
collector/detect/attribution.cpp does. For each bucket size and
communicator size it prints:
  - sd / noise: the true standard deviation of a bucket's centred lag over
    the job's noise estimate (the median or the 75th percentile of the
    changes from one bucket to the next, each scaled as for normal
    changes); 1.00 is an unbiased estimate, above 1 one that is too small;
  - the CUSUM of the standardised lag (clipped to +-5, less 0.5): how many
    times per 800,000 rank-buckets it passed 8, 10, 12 and 14 on its way
    up (a finding needs 20);
  - P(z >= 5): how often a bucket is at the clip or beyond (the far-behind
    run needs 5 such buckets in a row).

  scripts/bench-chance.py [RANK_BUCKETS]   (default 800000: about half a
                                            minute in all on this machine)
Figures: docs/detection.md (Straggler), docs/benchmarks.md.
"""
import math
import random
import statistics
import sys
from statistics import NormalDist

CLIP, REFERENCE = 5.0, 0.5
LEVELS = (8, 10, 12, 14)


def buckets(m, n, count, rng):
    """Each bucket's centred lags of n ranks, m collectives a bucket."""
    for _ in range(count):
        lag = [0.0] * n
        for _ in range(m):
            v = [rng.gauss(0, 1) for _ in range(n)]
            s = sorted(v)
            mid = (s[n // 2 - 1] + s[n // 2]) / 2 if n % 2 == 0 else s[n // 2]
            for r in range(n):
                lag[r] += max(0.0, v[r] - mid)
        lag = [x / m for x in lag]
        total = sum(lag)
        yield [x - (total - x) / (n - 1) for x in lag]


def noise(changes, quantile):
    s = sorted(changes)
    at = s[int(quantile * (len(s) - 1))]
    return at / (NormalDist().inv_cdf(0.5 + quantile / 2) * math.sqrt(2))


def row(m, n, rank_buckets, seed):
    rng = random.Random(seed)
    history = list(buckets(m, n, rank_buckets // n, rng))
    changes = [abs(a - b) for prev, cur in zip(history, history[1:]) for a, b in zip(cur, prev)]
    sd = statistics.pstdev([x for c in history for x in c])
    out = [f"| {m} | {n}"]
    for quantile in (0.5, 0.75):
        scale = noise(changes, quantile)
        up = dict.fromkeys(LEVELS, 0)
        cusum = [0.0] * n
        far = 0
        for c in history:
            for r in range(n):
                z = c[r] / scale
                far += z >= CLIP
                old = cusum[r]
                cusum[r] = max(0.0, cusum[r] + max(-CLIP, min(CLIP, z)) - REFERENCE)
                for level in LEVELS:
                    up[level] += old < level <= cusum[r]
        scaled = {level: round(v * 800000 / (len(history) * n)) for level, v in up.items()}
        out.append(f"{sd / scale:.2f} | {', '.join(str(scaled[level]) for level in LEVELS)} | "
                   f"{far / (len(history) * n):.1e}")
    return " | ".join(out) + " |"


def main():
    rank_buckets = int(sys.argv[1]) if len(sys.argv) > 1 else 800000
    print(f"Chance test under no fault, normal noise, {rank_buckets} rank-buckets a row (scripts/bench-chance.py)")
    print()
    print("| collectives a bucket | ranks | median: sd / noise | median: CUSUM up past 8, 10, 12, 14 (per 800k) "
          "| median: P(z >= 5) | 75th pct: sd / noise | 75th pct: CUSUM up past 8, 10, 12, 14 | 75th pct: P(z >= 5) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in (8, 4, 32):
        for m in (1, 2, 4):
            print(row(m, n, rank_buckets, seed=1), flush=True)


if __name__ == "__main__":
    main()
