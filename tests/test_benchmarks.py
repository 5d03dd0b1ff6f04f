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
import gpu_zoo  # noqa: E402

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


def test_cpu_time_is_recorded_per_call_in_rotated_rounds():
    calls = []
    wall, cpu = _stats.time_rounds_with_cpu(
        {name: (lambda name=name: calls.append(name)) for name in "abc"}, 3, warmup=1)
    assert "".join(calls) == "abc" + "abc" + "bca" + "cab"
    assert all(len(wall[n]) == len(cpu[n]) == 3 for n in "abc")
    assert all(c >= 0 for n in "abc" for c in cpu[n])


def test_a_row_that_used_more_cores_or_more_flops_than_it_could_is_refused():
    row = _stats.checked_row("ours", 2, [0.2] * 5, [0.38] * 5, flops=20e9, peak_flops=177e9)
    assert row == {"cores_used": 1.9, "flops_per_second": pytest.approx(100e9)}
    # Labelled one thread, two cores busy: the 2026-11-28 serving rows' defect.
    with pytest.raises(ValueError, match=r"ours: labelled 1 thread\(s\) but kept 1.90 cores"):
        _stats.checked_row("ours", 1, [0.2] * 5, [0.38] * 5)
    # BERT-base at length 128 (22.4 GFLOP) in 73 ms on two threads: 307 GFLOP/s.
    with pytest.raises(ValueError, match=r"306.8 GFLOP/s is above the machine's peak at 2"):
        _stats.checked_row("ours", 2, [0.073] * 5, [0.14] * 5, flops=22.4e9, peak_flops=177e9)


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


def test_gpu_plan_times_every_pytorch_peer_eager_and_compiled():
    specs = gpu.plan(["bert128", "vit", "transformer_big", "conformer_large", "attention"])
    assert specs == [
        "bert128:keras_attn", "bert128:keras_attn_no_attention_dropout", "bert128:keras_hub",
        "bert128:transformers",
        "bert128:transformers+compile",
        "vit:keras_attn", "vit:keras_hub", "vit:timm", "vit:timm+compile",
        "transformer_big:keras_attn", "transformer_big:marian", "transformer_big:marian+compile",
        "conformer_large:keras_attn", "conformer_large:torchaudio",
        "conformer_large:torchaudio+compile",
        "attention:keras_attn",
    ]
    assert not [s for s in gpu.plan(gpu.CASES, torch_compile=False) if "+compile" in s]
    assert set(gpu.PLAN) == set(gpu.CASES)


def test_gpu_zoo_table_puts_each_run_beside_its_cpu_result_and_names_failures():
    records = [
        {"recipe": "vit_tiny_digits", "remat": False, "metric": "accuracy", "value": 0.95,
         "steps": 1260, "train_seconds": 41.25, "peak_bytes": 3 * 2**29,
         "device": "NVIDIA H200"},
        {"recipe": "conformer_tiny_digits", "remat": True,
         "error": "ValueError: The spoken digits made here | are not the ones"},
    ]
    rows = gpu_zoo.table(records).splitlines()[2:]
    cpu = gpu_zoo._cpu_result("vit_tiny_digits")  # models/results/vit_tiny_digits.json
    assert rows[0] == (f"| vit_tiny_digits | False | accuracy 0.9500 | {cpu['value']:.4f} "
                       f"({cpu['backend']}, {cpu['date']}) | 1260 | 41.2 | 1.50 | NVIDIA H200 |")
    # A failed run is a row saying why (a `|` in the message kept out of the cells).
    assert rows[1].startswith("| conformer_tiny_digits | True | not measured: ValueError: "
                              "The spoken digits made here / are not the ones |")


def test_gpu_zoo_run_cut_off_by_its_timeout_says_how_far_it_got(monkeypatch, tmp_path):
    # On the H200 (2026-11-28) transformer_numbers ran out of its time and the
    # record said only "timed out": the run's output was thrown away.
    def cut_off(command, **kwargs):
        raise gpu_zoo.subprocess.TimeoutExpired(
            command, kwargs["timeout"], output="RUN starts\nepoch 1/8 (38.0 s): loss 2.3\r"
            "epoch 2/8 (30.1 s): loss 0.9\n", stderr="a warning\n")

    monkeypatch.setattr(gpu_zoo.subprocess, "run", cut_off)
    log = tmp_path / "transformer_numbers.log"
    record = gpu_zoo.launch("transformer_numbers", "data", "float32", False, [], 5,
                            log_path=str(log))
    assert record["error"] == "timed out after 5 s (last: epoch 2/8 (30.1 s): loss 0.9)"
    assert "a warning" in log.read_text() and "epoch 1/8" in log.read_text()


class _FakeDevice:
    """A step whose memory is `fixed + per_example * B` bytes by XLA's
    analysis, `true_extra` more per example when it really runs, and a
    device of `limit` bytes."""

    def __init__(self, fixed, per_example, limit, analysis_extra=0, true_extra=0):
        self.fixed, self.per_example, self.limit = fixed, per_example, limit
        self.analysis_extra, self.true_extra = analysis_extra, true_extra
        self.compiled, self.ran = [], []

    def compile_at(self, batch):
        self.compiled.append(batch)
        # Past 100 examples the analysis grows faster than the line through
        # the two small batches predicts (a different fusion plan).
        extra = self.analysis_extra * max(0, batch - 100)
        return ("compiled", batch), self.fixed + self.per_example * batch + extra

    def run(self, compiled, batch):
        assert compiled == ("compiled", batch)  # the step compiled, not a new one
        self.ran.append(batch)
        used = self.fixed + (self.per_example + self.true_extra) * batch
        if used > self.limit:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")
        return 0.5


def test_largest_fitting_batch_compiles_three_times_when_the_line_holds():
    device = _FakeDevice(fixed=2000, per_example=100, limit=50_000)
    result = gpu.largest_fitting_batch(device.compile_at, device.run, device.limit, (16, 32),
                                       log=lambda line: None)
    # (0.97 * 50000 - 2000) / 100 = 465, down to a multiple of 8.
    assert result["predicted_batch"] == result["largest_batch"] == 464
    assert device.compiled == [16, 32, 464] and device.ran == [464]
    assert result["per_example_bytes"] == 100 and result["fixed_bytes"] == 2000
    assert set(result["compile_seconds"]) == {16, 32, 464}


def test_largest_fitting_batch_steps_down_by_analysis_before_running():
    device = _FakeDevice(fixed=2000, per_example=100, limit=50_000, analysis_extra=50)
    result = gpu.largest_fitting_batch(device.compile_at, device.run, device.limit, (16, 32),
                                       log=lambda line: None)
    # A batch whose own analysis does not fit is never run.
    for batch in device.ran:
        assert 2000 + 100 * batch + 50 * max(0, batch - 100) <= 0.97 * 50_000
    # 464 compiled to 66,600 bytes: the line through it gives 334, so 328
    # runs (the best multiple of 8 is 336); one compile more, no run more.
    assert device.compiled == [16, 32, 464, 328] and device.ran == [328]
    assert result["largest_batch"] == 328


def test_largest_fitting_batch_steps_down_after_a_real_out_of_memory():
    device = _FakeDevice(fixed=2000, per_example=100, limit=50_000, true_extra=10)
    result = gpu.largest_fitting_batch(device.compile_at, device.run, device.limit, (16, 32),
                                       log=lambda line: None)
    assert device.ran[0] == 464 and len(device.ran) == 2
    assert result["largest_batch"] == device.ran[-1] == 416  # 0.9 * 464, a multiple of 8


def test_largest_fitting_batch_stops_before_a_compile_past_the_deadline():
    device = _FakeDevice(fixed=2000, per_example=100, limit=50_000)
    result = gpu.largest_fitting_batch(device.compile_at, device.run, device.limit, (16, 32),
                                       deadline=0.0, log=lambda line: None)
    assert device.compiled == [16, 32] and device.ran == []
    assert result["largest_batch"] is None and "out of time" in result["stopped"]
    assert "out of time" in gpu.table({"memory:remat": result}, smoke=False)


def test_largest_fitting_batch_reraises_what_is_not_out_of_memory():
    device = _FakeDevice(fixed=2000, per_example=100, limit=50_000)

    def run(compiled, batch):
        raise ValueError("bad step")

    with pytest.raises(ValueError, match="bad step"):
        gpu.largest_fitting_batch(device.compile_at, run, device.limit, (16, 32),
                                  log=lambda line: None)


def test_fused_kernels_read_from_the_compiled_program():
    hlo = (
        '%a = custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmax"\n'
        '%b = custom-call(%x), custom_call_target="__cudnn$fmhaSoftmaxBackward"\n'
        '%c = custom-call(%y), custom_call_target="__cublas$gemm"\n'
    )
    assert gpu.fused_kernels(hlo) == ["__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"]
    assert gpu.fused_kernels('%c = custom-call(%y), custom_call_target="__cublas$gemm"') == []


def test_gpu_table_has_the_translation_and_speech_peers_and_the_kernels():
    results = {
        "transformer_big:keras_attn": {"seconds_per_step": 0.09, "batch": 192, "length": 128,
                                       "parameters": 1000},
        "transformer_big:marian+compile": {"seconds_per_step": 0.108, "batch": 192,
                                           "length": 128, "parameters": 1000,
                                           "first_step_seconds": 61.2},
        "conformer_large:keras_attn": {"seconds_per_step": 0.1, "batch": 32, "length": 1600,
                                       "parameters": 10},
        "conformer_large:torchaudio": {"seconds_per_step": 0.125, "batch": 32, "length": 1600,
                                       "parameters": 9},
        "attention:keras_attn": {"rows": [
            {"length": 197, "batch": 83, "path": "fused (backend's choice)", "seconds": 1e-3,
             "tflops": 300.0, "kernel": "__cudnn$fmhaSoftmax"}]},
    }
    text = gpu.table(results, smoke=False)
    assert "| transformer_big | marian+compile | 227,556 target tokens/s | n/a | 0.83 |" in text
    assert "first step 61 s" in text
    assert "| conformer_large | torchaudio | 256 utterances/s | n/a | 0.80 |" in text
    assert "| 197 | 83 | fused (backend's choice) | 300 | __cudnn$fmhaSoftmax |" in text



def test_gpu_modernbert_rows_count_tokens_and_a_forward_pass_as_a_third_of_a_step():
    assert gpu.plan(["modernbert", "modernbert_inference"]) == [
        "modernbert:keras_attn", "modernbert:transformers", "modernbert:transformers+compile",
        "modernbert_inference:keras_attn", "modernbert_inference:transformers",
        "modernbert_inference:transformers+compile"]
    n, backbone = 149_655_232, 149_014_272
    results = {
        "modernbert:keras_attn": {"seconds_per_step": 0.1, "batch": 16, "length": 1024,
                                  "parameters": n, "device": "NVIDIA H200"},
        "modernbert:transformers+compile": {"seconds_per_step": 0.125, "batch": 16,
                                            "length": 1024, "parameters": n,
                                            "device": "NVIDIA H200", "first_step_seconds": 40},
        "modernbert_inference:keras_attn": {"seconds_per_step": 0.2, "batch": 4, "length": 8192,
                                            "parameters": backbone, "device": "NVIDIA H200"},
    }
    text = gpu.table(results, smoke=False)
    step = 16 * 1024 * (6 * n + 12 * 22 * 768 * 1024)
    assert f"| modernbert | keras_attn | 163,840 tokens/s | {step / 0.1 / 989.4e12:.1%} |" in text
    assert (f"| modernbert | transformers+compile | 131,072 tokens/s | "
            f"{step / 0.125 / 989.4e12:.1%} | 0.80 |") in text
    forward = 4 * 8192 * (6 * backbone + 12 * 22 * 768 * 8192) / 3
    assert (f"| modernbert_inference | keras_attn | 163,840 tokens/s | "
            f"{forward / 0.2 / 989.4e12:.1%} |") in text


# === benchmarks/streaming.py ===


def test_streaming_flatness_compares_the_streams_end_with_its_start():
    import statistics

    import streaming

    positions = [0.32 * (i + 1) for i in range(60)]  # 19.2 s
    assert streaming.flatness(positions, [0.05] * 60) == pytest.approx(1.0)
    # A cost growing with the position (a prefix re-run): last 5 s over the
    # 5 s after the first second.
    growing = [0.01 * p for p in positions]
    early = [0.01 * p for p in positions if 1.0 < p <= 6.0]
    late = [0.01 * p for p in positions if p > 19.2 - 5.0]
    ratio = streaming.flatness(positions, growing)
    assert ratio == pytest.approx(statistics.median(late) / statistics.median(early))
    assert ratio > 3
    with pytest.raises(ValueError, match="at least 11 s for windows of 5 s"):
        streaming.flatness([0.5, 1.0, 2.0, 10.5], [1.0, 1.0, 1.0, 1.0])


def test_streaming_row_is_paired_and_in_real_time_factors():
    import streaming

    row = streaming.paired_row([0.010] * 10, [0.050] * 10, chunk_ms=160.0)
    assert row["step_ms"] == pytest.approx(10.0) and row["prefix_ms"] == pytest.approx(50.0)
    assert row["step_rtf"] == pytest.approx(10.0 / 160) and row["prefix_rtf"] == pytest.approx(
        50.0 / 160)
    assert row["prefix_over_step"] == pytest.approx(5.0) and row["interval"] == [
        pytest.approx(5.0), pytest.approx(5.0)]


def test_streaming_table_has_each_row_each_trace_and_what_did_not_run():
    import streaming

    results = {
        "rows": [dict(streaming.paired_row([0.01] * 6, [0.2] * 6, 320.0), runtime="LiteRT step",
                      chunk_ms=320.0, position_s=30.0)],
        "traces": {"LiteRT step": {"rtf": 0.0312, "flatness": 1.04}},
        "not_run": {"onnx": "left out (--formats)"},
        "emformer_rows": [{"runtime": "LiteRT step", "chunk_ms": 320.0, "step_ms": 1.5,
                           "emformer_step_ms": 0.6, "over_emformer": 2.5,
                           "interval": [2.0, 3.25]}],
    }
    text = streaming.table(results)
    assert "| LiteRT step | 320 ms | 30.0 s | 10.0 | 0.031 | 200.0 | 0.62 | 20.0 (20.0-20.0) |" \
        in text
    assert "LiteRT step: whole-stream RTF 0.031, step cost last 5 s / first 5 s 1.04" in text
    assert "onnx: not run (left out (--formats))" in text
    assert "| LiteRT step | 320 ms | 1.50 | 0.60 | 2.50 (2.00-3.25) |" in text
    assert "Emformer" not in streaming.table(dict(results, emformer_rows=[]))


@pytest.mark.slow
def test_streaming_smoke_run_checks_its_tokens_and_writes_every_row(tmp_path):
    # --smoke: a tiny model on 3 s of audio. The script refuses to time a
    # stream whose tokens differ from the chunk-masked offline call's, so a
    # zero exit is that check passing; the timings are not looked at.
    import json
    import subprocess

    output, figure = tmp_path / "streaming.json", tmp_path / "streaming.png"
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    run = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "streaming.py"), "--smoke",
                          "--output", str(output), "--plot", str(figure)],
                         capture_output=True, text=True, timeout=1200, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(output.read_text())
    assert [(row["chunk_ms"], row["position_s"]) for row in results["rows"]] == [
        (chunk, position) for chunk in (160.0, 320.0) for position in (1.0, results["audio_s"])]
    for trace in results["traces"].values():
        assert trace["positions_s"][-1] == pytest.approx(results["audio_s"])
        assert len(trace["positions_s"]) == len(trace["step_s"])
    assert {"litert", "onnx"} <= set(results["not_run"])
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_packing_smoke_run_writes_every_row_and_packs_more_real_tokens(tmp_path, capsys):
    # --smoke: a one-layer 16-wide BERT at rows of 64 and a one-block 16-wide
    # Transformer at rows of 32, 1 round (each row builds and compiles three
    # models: one row a task checks every field and ratio a row holds). The
    # timings are not looked at; what the rows say about the batches is.
    # The script's main() runs in this (TensorFlow) test process: a
    # subprocess paid TensorFlow's and keras-hub's imports again (~5 s) for
    # the same code; a non-finite loss is its SystemExit, a failure here.
    import json

    import keras
    import packing

    assert keras.backend.backend() == "tensorflow"  # the CPU rows' backend
    output = tmp_path / "packing.json"
    packing.main(["--smoke", "--output", str(output)])
    stdout = capsys.readouterr().out
    results = json.loads(output.read_text())
    assert results["smoke"] and [row["length"] for row in results["rows"]] == [64]
    for row in results["rows"]:
        padding, real = row["padding"], row["real_tokens_per_batch"]
        # Packing fills rows with real tokens; padding to each batch's
        # longest example already drops some padding, padding to the row none.
        assert padding["packed"] < padding["padded_to_longest"] < padding["padded_to_length"]
        assert real["packed"] > real["padded"] > 0
        assert row["examples_per_batch"]["packed"] > row["examples_per_batch"]["padded"]
        assert set(row["median_step_seconds"]) == {"padded", "packed", "keras_hub"}
        # Each side's CPU time beside its wall time: the cores it kept busy,
        # never more than the process may use (the harness refuses a row).
        assert set(row["cores_used"]) == set(row["median_step_cpu_seconds"]) == {
            "padded", "packed", "keras_hub"}
        assert all(0 < cores <= row["threads"] + 0.25 for cores in row["cores_used"].values())
        for ratio in row["real_tokens_per_second_ratio"].values():
            assert ratio["low"] <= ratio["median"] <= ratio["high"]
        assert set(row["real_tokens_per_second_ratio"]) == {
            "packed_vs_padded", "padded_vs_keras_hub", "packed_vs_keras_hub"}
    assert "| 64 | 4 |" in stdout

    # Translation: source/target pairs packed in step, under its own key.
    translation = results["translation"]
    assert translation["smoke"] and translation["rounds"] == 1
    assert {"what", "preset", "overrides", "vocabulary", "distribution", "date", "machine",
            "versions", "command", "load_average"} <= set(translation)
    [row] = translation["rows"]
    assert set(row) == {
        "length", "target_length", "batch", "examples", "max_segments", "mean_lengths",
        "padding", "real_tokens_per_batch", "real_tokens_per_batch_by_side",
        "examples_per_batch", "last_loss", "parameters", "median_step_seconds",
        "median_step_cpu_seconds", "cores_used", "threads", "real_tokens_per_second_ratio"}
    # Every step trained on a valid batch: a bad packing would be a NaN loss.
    assert set(row["last_loss"]) == {"padded", "packed", "keras_hub"}
    assert all(0 < loss < 100 for loss in row["last_loss"].values())
    assert (row["length"], row["target_length"], row["batch"]) == (32, 32, 4)
    padding = row["padding"]
    for fractions in (padding, padding["source"], padding["target"]):
        assert 0 <= fractions["packed"] < fractions["padded_to_longest"] \
            < fractions["padded_to_length"] < 1
    # Both rows hold `batch` rows: packed ones hold more real tokens, on each side.
    real, by_side = row["real_tokens_per_batch"], row["real_tokens_per_batch_by_side"]
    assert real["packed"] > real["padded"] > 0
    for side in ("source", "target"):
        assert by_side[side]["packed"] > by_side[side]["padded"] > 0
    assert real == {key: by_side["source"][key] + by_side["target"][key]
                    for key in ("padded", "packed")}
    assert row["examples_per_batch"]["packed"] > row["examples_per_batch"]["padded"] == 4
    assert row["max_segments"] >= 2
    # keras-hub's peer has the same sizes: the same parameter count.
    assert row["parameters"]["keras_attn"] == row["parameters"]["keras_hub"] > 0
    assert set(row["median_step_seconds"]) == set(row["cores_used"]) == {
        "padded", "packed", "keras_hub"}
    assert results["translation"]["jit_compile"] is False  # --smoke steps without XLA
    assert set(row["real_tokens_per_second_ratio"]) == {
        "packed_vs_padded", "padded_vs_keras_hub", "packed_vs_keras_hub"}
    for ratio in row["real_tokens_per_second_ratio"].values():
        assert ratio["low"] <= ratio["median"] <= ratio["high"]
    assert "| 32 | 4 |" in stdout


# Not `exclusive`: the benchmark alternates its one-process and two-process
# rounds, so its processes wait on each other most of the time (measured:
# 22% of the machine busy over its 40 s when it ran alone); the smoke run's
# timings are not looked at.
@pytest.mark.slow
def test_multiprocess_smoke_run_joins_two_processes_and_writes_every_ratio(tmp_path):
    # --smoke: a one-block 16-wide ViT, one process beside a two-process JAX
    # job, 1 round of 2 steps (each round adds one value to every list and
    # ratio; the three processes' start and compile are the cost). Timings
    # are not looked at.
    import json
    import subprocess

    output = tmp_path / "multiprocess.json"
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3")
    run = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "multiprocess.py"),
                          "--smoke", "--timeout", "900", "--output", str(output)],
                         capture_output=True, text=True, timeout=2400, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(output.read_text())
    assert results["model"]["smoke"] and results["global_batch"] == 8
    assert results["model"]["parameters"] > 0
    assert results["gradient_bytes"] == 4 * results["model"]["parameters"]
    names = {"one_process", "step", "step_no_allreduce", "allreduce_alone",
             "allreduce_one_buffer"}
    assert set(results["seconds"]) == set(results["median_step_seconds"]) == names
    assert all(len(results["seconds"][name]) == results["rounds"] == 1 for name in names)
    assert set(results["ratios"]) == {"two_vs_one_process", "with_vs_without_allreduce"}
    for ratio in results["ratios"].values():
        assert ratio["low"] <= ratio["median"] <= ratio["high"]
        assert ratio["verdict"] in ("faster", "slower", "tie")
    assert set(results["allreduce_share"]) == {
        "allreduce_alone_over_step", "allreduce_one_buffer_over_step",
        "step_minus_no_allreduce_over_step"}
    # What the numbers are on a 2-core machine is said in the output and the file.
    assert "not a speed claim" in results["note"] and "not a speed claim" in run.stdout
    assert "| two_vs_one_process |" in run.stdout
