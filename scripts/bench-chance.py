#!/usr/bin/env python3
"""The straggler detector's chance test under no fault, simulated.

Ranks with normal noise (or log-normal), no straggler: at each collective
a rank's lag is how far it is behind the median rank (0 where ahead),
summed per bucket of m collectives and centred on the others' mean, as
collector/detect/attribution.cpp does. For each bucket size and
communicator size it prints:
  - sd / noise: the true standard deviation of a bucket's centred lag over
    the job's noise estimate (the median, the 75th or the 95th percentile
    of the changes from one bucket to the next, each scaled as for normal
    changes); 1.00 is an unbiased estimate, above 1 one that is too small;
  - the CUSUM of the standardised lag (clipped to +-CLIP, less 0.5): how many
    times per 800,000 rank-buckets it passed 8, 10, 12 and 14 on its way
    up (a finding needs 20);
  - P(z >= 5): how often a bucket is 5 sd behind or more (the far-behind
    run needs 5 such buckets in a row).

  scripts/bench-chance.py [RANK_BUCKETS [NOISE [CLIP]]]
      RANK_BUCKETS: default 800000 (about half a minute in all on this machine)
      NOISE: normal (default), or lognormal:SIGMA: each rank's time at each
             collective log-normal, as rankscope-sim's jitter (--pattern
             jitter: SIGMA 0.25), heavier-tailed than normal
      CLIP: the most one bucket adds, in sd: default 2.5, the detector's
            (AttributionOptions::lag_clip_sd), applied plainly: the
            detector's 5 after two buckets in a row at the clip is not
            modelled. CLIP 5 gives the figures measured before it was 2.5.
Figures: docs/detection.md (Straggler), docs/benchmarks.md.
"""
import math
import random
import statistics
import sys
from statistics import NormalDist

REFERENCE, FAR = 0.5, 5.0
QUANTILES = (0.5, 0.75, 0.95)
LEVELS = (8, 10, 12, 14)


def draw(shape):
    """One rank's time at one collective: a function of the generator."""
    if shape == "normal":
        return lambda rng: rng.gauss(0, 1)
    kind, _, sigma = shape.partition(":")
    if kind != "lognormal" or not sigma:
        sys.exit(f"bench-chance.py: noise '{shape}' is not normal or lognormal:SIGMA")
    s = float(sigma)
    return lambda rng: math.exp(rng.gauss(-s * s / 2, s))


def buckets(m, n, count, rng, sample):
    """Each bucket's centred lags of n ranks, m collectives a bucket."""
    for _ in range(count):
        lag = [0.0] * n
        for _ in range(m):
            v = [sample(rng) for _ in range(n)]
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


def row(m, n, rank_buckets, seed, sample, clip):
    rng = random.Random(seed)
    history = list(buckets(m, n, rank_buckets // n, rng, sample))
    changes = [abs(a - b) for prev, cur in zip(history, history[1:]) for a, b in zip(cur, prev)]
    sd = statistics.pstdev([x for c in history for x in c])
    out = [f"| {m} | {n}"]
    for quantile in QUANTILES:
        scale = noise(changes, quantile)
        up = dict.fromkeys(LEVELS, 0)
        cusum = [0.0] * n
        far = 0
        for c in history:
            for r in range(n):
                z = c[r] / scale
                far += z >= FAR
                old = cusum[r]
                cusum[r] = max(0.0, cusum[r] + max(-clip, min(clip, z)) - REFERENCE)
                for level in LEVELS:
                    up[level] += old < level <= cusum[r]
        scaled = {level: round(v * 800000 / (len(history) * n)) for level, v in up.items()}
        out.append(f"{sd / scale:.2f} | {', '.join(str(scaled[level]) for level in LEVELS)} | "
                   f"{far / (len(history) * n):.1e}")
    return " | ".join(out) + " |"


def main():
    rank_buckets = int(sys.argv[1]) if len(sys.argv) > 1 else 800000
    shape = sys.argv[2] if len(sys.argv) > 2 else "normal"
    sample = draw(shape)
    clip = float(sys.argv[3]) if len(sys.argv) > 3 else 2.5
    print(f"Chance test under no fault, {shape} noise, clip {clip:g} sd, {rank_buckets} rank-buckets a row "
          "(scripts/bench-chance.py)")
    print()
    head = ["collectives a bucket", "ranks"]
    for q in ("median", "75th pct", "95th pct"):
        head += [f"{q}: sd / noise", f"{q}: CUSUM up past 8, 10, 12, 14 (per 800k)", f"{q}: P(z >= 5)"]
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for n in (8, 4, 32, 64):
        for m in (1, 2, 4):
            print(row(m, n, rank_buckets, seed=1, sample=sample, clip=clip), flush=True)


if __name__ == "__main__":
    main()
