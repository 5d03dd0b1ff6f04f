"""The arithmetic behind the benchmark tables: paired ratios and their
intervals, FLOP counts, MFU. No timing is asserted here (benchmarks/ does
the measuring); these check that the figures printed from the timings are
the right ones."""

import os
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCHMARKS)

import _flops  # noqa: E402
import _stats  # noqa: E402
import gpu  # noqa: E402

pytestmark = pytest.mark.backend_independent


@pytest.mark.parametrize(
    "n, ranks",
    # 95% distribution-free intervals for a median, from the sign-test
    # tables (e.g. Conover, "Practical Nonparametric Statistics", table A3):
    # the interval is (x_(r), x_(n+1-r)).
    [(6, (1, 6)), (10, (2, 9)), (15, (4, 12)), (20, (6, 15)), (30, (10, 21))],
)
def test_median_interval_uses_the_sign_test_ranks(n, ranks):
    values = [float(i) for i in range(1, n + 1)]
    median, lo, hi = _stats.median_interval(values[::-1])  # order does not matter
    assert (lo, hi) == ranks
    assert median == (n + 1) / 2


def test_median_interval_rejects_bad_input():
    with pytest.raises(ValueError, match="values"):
        _stats.median_interval([])
    with pytest.raises(ValueError, match="confidence=1.5"):
        _stats.median_interval([1.0, 2.0], confidence=1.5)


def test_paired_ratio_verdicts():
    peer = [1.0] * 10
    faster = _stats.paired_ratio([0.9, 0.92, 0.91, 0.95, 0.9, 0.93, 0.9, 0.94, 0.96, 0.9], peer)
    assert faster[3] == "faster" and faster[2] < 1.0
    slower = _stats.paired_ratio([1.1] * 10, peer)
    assert slower == (pytest.approx(1.1), pytest.approx(1.1), pytest.approx(1.1), "slower")
    # Ratios on both sides of 1: a tie, whatever the median says.
    tie = _stats.paired_ratio([0.95, 1.05] * 5, peer)
    assert tie[3] == "tie" and tie[1] < 1.0 < tie[2]
    with pytest.raises(ValueError, match="paired"):
        _stats.paired_ratio([1.0] * 3, [1.0] * 4)


def test_ratios_are_paired_by_round_not_by_rank():
    # Round by round ours is 10% faster, while the machine's load changes a
    # lot between rounds: the paired ratio sees the 0.9, sorted medians of
    # the two lists alone would not tell a consistent story.
    peer = [1.0, 3.0, 1.5, 2.5, 2.0, 1.2, 2.8, 1.7, 2.2, 1.9]
    ours = [0.9 * t for t in peer]
    ratio, lo, hi, verdict = _stats.paired_ratio(ours, peer)
    assert ratio == pytest.approx(0.9) and hi == pytest.approx(0.9)
    assert verdict == "faster"


def test_time_pair_alternates_which_side_goes_first():
    calls = []
    a, b = _stats.time_pair(lambda: calls.append("a"), lambda: calls.append("b"), 4, warmup=1)
    assert len(a) == len(b) == 4
    assert "".join(calls) == "ab" + "ab" + "ba" + "ab" + "ba"


def test_training_flops_per_token():
    # BERT-base: 110M parameters, 12 layers, width 768, length 128.
    assert _flops.transformer_flops_per_token(110_000_000, 12, 768, 128) == (
        660_000_000 + 12 * 12 * 768 * 128
    )
    with pytest.raises(ValueError, match="length=0"):
        _flops.transformer_flops_per_token(1, 1, 1, 0)


def test_attention_flops_convention():
    forward = 4 * 2 * 16 * 4096**2 * 64
    assert _flops.attention_flops(2, 16, 4096, 64) == forward
    assert _flops.attention_flops(2, 16, 4096, 64, backward=True) == 3.5 * forward
    assert _flops.attention_flops(2, 16, 4096, 64, causal=True) == forward / 2


def test_device_peaks():
    assert _flops.dense_bf16_peak("NVIDIA H100 80GB HBM3") == 989.4e12
    assert _flops.dense_bf16_peak("NVIDIA H100 PCIe") == 756.5e12
    assert _flops.dense_bf16_peak("NVIDIA H200") == 989.4e12
    assert _flops.dense_bf16_peak("TFRT_CPU_0") is None


def test_gpu_table_reports_throughput_mfu_and_ratio():
    # BERT-base at length 128 on an H100: 0.05 s per step of 256 sequences.
    n = 110_106_428
    results = {
        "bert128:keras_attn": {"seconds_per_step": 0.05, "batch": 256, "length": 128,
                               "parameters": n, "device": "NVIDIA H100 80GB HBM3",
                               "peak_bytes": 20 * 2**30},
        "bert128:transformers": {"seconds_per_step": 0.06, "batch": 256, "length": 128,
                                 "parameters": 109_514_298, "device": "NVIDIA H100 80GB HBM3"},
        "vit:timm": {"error": "ModuleNotFoundError: No module named 'timm'"},
    }
    text = gpu.table(results, smoke=False)
    rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| bert128")}
    flops = 256 * 128 * (6 * n + 12 * 12 * 768 * 128)
    mfu = flops / 0.05 / 989.4e12
    assert f"| 5,120 sequences/s | {mfu:.1%} |" in rows["keras_attn"]
    assert "| 20.0 |" in rows["keras_attn"]
    # The peer's MFU counts keras_attn's model FLOPs, so MFU ratios are
    # throughput ratios; its time ratio is ours / its.
    assert f"| {flops / 0.06 / 989.4e12:.1%} | 0.83 |" in rows["transformers"]
    assert "| vit | timm | not measured | | | | ModuleNotFoundError" in text
