"""Small, dependency-free helpers shared by the benchmark scripts.

Timing ratios: each round times keras_attn and its peer back to back, in
alternating order (ours first on even rounds, the peer first on odd ones,
so neither side always runs on a warmer or cooler machine), and the round's
ratio is ours / peer. The reported ratio is the median of those paired
ratios, with a distribution-free confidence interval for that median (from
the binomial distribution of order statistics), so a 2% difference can be
told apart from the machine's noise: the verdict is "faster" or "slower"
only when the whole interval is on one side of 1.00.
"""

import math
import statistics
import time


def time_pair(fn_a, fn_b, rounds, warmup=2):
    """Times `fn_a` and `fn_b` in `rounds` alternating pairs after `warmup`
    calls of each. Returns two lists of seconds, index-aligned by round."""
    for _ in range(warmup):
        fn_a()
        fn_b()
    times_a, times_b = [], []
    for r in range(rounds):
        order = ((fn_a, times_a), (fn_b, times_b))
        for fn, times in order if r % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return times_a, times_b


def time_rounds(fns, rounds, warmup=1):
    """`{name: [seconds per round]}`: every fn once per round, the order
    rotated by one each round (each runtime is first as often as any)."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return times


def median_interval(values, confidence=0.95):
    """The median of `values` and a distribution-free interval `(lo, hi)`
    that covers the population median with at least `confidence`.

    The interval is `(x_(k), x_(n+1-k))` of the sorted values, with the
    largest `k` for which `P(k <= Binomial(n, 1/2) <= n - k) >= confidence`.
    With 6 values or fewer the interval is the whole range (for 5 or fewer
    even that covers less than 95%: use more rounds).

    >>> median_interval([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    (5.5, 2.0, 9.0)
    """
    if not values:
        raise ValueError(f"`values` must not be empty. Received: values={values!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(
            f"`confidence` must be in (0, 1). Received: confidence={confidence!r}"
        )
    xs = sorted(values)
    n = len(xs)

    def coverage(k):  # P(k <= X <= n - k), X ~ Binomial(n, 1/2)
        return sum(math.comb(n, i) for i in range(k, n - k + 1)) / 2**n

    k = 0
    while k + 1 <= n // 2 and coverage(k + 1) >= confidence:
        k += 1
    lo, hi = (xs[0], xs[-1]) if k == 0 else (xs[k - 1], xs[n - k])
    return statistics.median(xs), lo, hi


def paired_ratio(times_ours, times_peer, confidence=0.95):
    """Median of the per-round ratios ours / peer and its interval, and a
    verdict: "faster" (interval below 1), "slower" (above 1), else "tie"."""
    if len(times_ours) != len(times_peer):
        raise ValueError(
            "`times_ours` and `times_peer` must be paired round by round. "
            f"Received: {len(times_ours)} and {len(times_peer)} times"
        )
    ratio, lo, hi = median_interval(
        [a / b for a, b in zip(times_ours, times_peer)], confidence
    )
    verdict = "faster" if hi < 1.0 else "slower" if lo > 1.0 else "tie"
    return ratio, lo, hi, verdict


# === CPU time beside wall time: what a row really used ===


def time_rounds_with_cpu(fns, rounds, warmup=1):
    """`time_rounds` that also records each call's process CPU time
    (`time.process_time`: every thread of this process, the runtimes'
    worker threads included). Returns `(wall, cpu)`, each `{name: [seconds
    per round]}`; `cpu[name][r] / wall[name][r]` is the cores that call kept
    busy."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    wall = {name: [] for name in names}
    cpu = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            start, start_cpu = time.perf_counter(), time.process_time()
            fns[name]()
            cpu[name].append(time.process_time() - start_cpu)
            wall[name].append(time.perf_counter() - start)
    return wall, cpu


def checked_row(name, threads, wall, cpu, flops=None, peak_flops=None, slack=0.25):
    """`{"cores_used", "flops_per_second"}` of a row timed at `threads`
    threads (`wall` and `cpu`: its seconds per round; `flops`: the work of
    one call, if known; `peak_flops`: the machine's peak at `threads`).

    A row is refused (`ValueError`) rather than written when its median
    cores used exceed its threads (by more than `slack`: the Python side's
    own work), or when its rate exceeds the peak: either says the row did
    not measure what its label says.

    >>> checked_row("ours", 1, [1.0, 1.0, 1.0], [0.9, 1.0, 1.1])["cores_used"]
    1.0
    >>> checked_row("ours", 1, [1.0] * 3, [1.9] * 3)
    Traceback (most recent call last):
    ...
    ValueError: ours: labelled 1 thread(s) but kept 1.90 cores busy (CPU s / wall s, median of 3 calls): pin its threads
    >>> checked_row("ours", 2, [0.1] * 3, [0.2] * 3, flops=30e9, peak_flops=177e9)
    Traceback (most recent call last):
    ...
    ValueError: ours: 300.0 GFLOP/s is above the machine's peak at 2 thread(s) (177.0 GFLOP/s): the timing is wrong
    """
    cores = statistics.median(c / w for c, w in zip(cpu, wall))
    if cores > threads + slack:
        raise ValueError(f"{name}: labelled {threads} thread(s) but kept {cores:.2f} cores busy "
                         f"(CPU s / wall s, median of {len(wall)} calls): pin its threads")
    rate = None if flops is None else flops / statistics.median(wall)
    if rate is not None and peak_flops is not None and rate > peak_flops:
        raise ValueError(f"{name}: {rate / 1e9:.1f} GFLOP/s is above the machine's peak at "
                         f"{threads} thread(s) ({peak_flops / 1e9:.1f} GFLOP/s): the timing is "
                         "wrong")
    return {"cores_used": round(cores, 2), "flops_per_second": rate}
