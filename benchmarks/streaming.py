"""Streaming speech recognition on this machine's CPU: the cost of one
streaming step against re-running the offline model on the growing prefix
(what a user without streaming does to show partial results), as the
utterance grows. Writes a JSON file and a plot (never run as a test).

Run:  python benchmarks/streaming.py [--seconds 30] [--chunk-sizes 4,8,16] [--rounds 10]
          [--formats litert,onnx] [--run RUN_DIR] [--emformer-wheel WHEEL] [--fast-conformer]
          [--transducer]
      python benchmarks/streaming.py --smoke      (tiny model, 3 s: checks the script)
      (TensorFlow backend: the LiteRT and ONNX exports need it)

Model: `conformer_tiny` (2 blocks, 64 wide) with the streaming recipe's
overrides (left context 32 frames, causal convolutions, decibels without
normalisation), the weights of `--run` (a trained run) or seeded random
ones (the cost does not depend on the values). Audio: embedded spoken-digit
utterances concatenated into one `--seconds` long stream. For each chunk
size C (encoder frames, 40 ms each):

- the trace: every step of `ConformerCTC.stream_step` over the whole stream
  (after a warm-up pass), its latency against the audio position;
- at positions L (5, 10, 20, 30 s), paired rounds (`_stats.time_pair`) of
  the step that ends at L (from the state held there: a step never changes
  its state) against the offline model (`conformer_tiny`, no chunking,
  `predict_on_batch`, compiled once per length before timing) on the first
  L seconds: the ratio prefix / step with its 95% interval, and each one's
  real-time factor (its time / the chunk's duration: the share of a core
  pair the stream needs; above 1 it falls behind);
- at the model's chunk size, the same step exported (`keras_attn.export.
  export_streaming`) and run in LiteRT and ONNX Runtime
  (`StreamingRecognizer`), checked to give the Keras step's tokens;
- torchaudio's `Emformer` (the encoder its `emformer_rnnt_base` streams) at
  the same width, depth, chunk and left context, its `infer` step on
  (1, C, 64) frames: the encoder alone, without our front end (log-mel and
  subsampling), so it is a floor for an encoder step rather than a like-for-
  like pipeline. torchaudio's PyPI wheel is a CUDA build whose extension
  does not load beside torch 2.13.0+cpu (and torch stays pinned);
  `emformer.py` imports torch only, so `--emformer-wheel` loads that file,
  unmodified, from a downloaded wheel (`pip download torchaudio --no-deps`).
  Without either the row says why it is missing.

With `--fast-conformer`, a FastConformer beside it (issue 59: the same
model with `subsampling="fast"`, 8x, 80 ms encoder frames, `scale_input`,
seeded weights) streams the same audio in chunks of the same duration (half
the encoder frames: chunk size C/2 beside the Conformer's C, for each even
C): its Keras `stream_step` trace and rows beside the Conformer's, and the
paired ratio of its step to the Conformer's at the end of the stream
(`fast_rows`).

With `--transducer`, a ConformerTransducer of the same encoder (RNN-T,
seeded weights) streams the same audio through its exported step (issue
71: the encoder chunk, then the greedy walk over its frames in the step),
its labels checked against its offline `decode`; rounds alternate its step
with the CTC model's exported step at the end of the stream, each call's
CPU time beside its wall time (`transducer_rows`: transducer / CTC, the
real-time factors and the cores used).

Before timing, the streamed tokens are checked against the streaming
model's offline call with its chunk mask (the contract of
docs/streaming.md), and each export's against the Keras step's.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import zipfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _stats import checked_row  # noqa: E402
from _stats import paired_ratio  # noqa: E402
from _stats import time_pair  # noqa: E402
from _stats import time_rounds_with_cpu  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STREAMING = dict(chunk_size=8, left_context=32, causal_conv=True, feature_normalization="none")
SMOKE_SIZES = dict(num_layers=1, hidden_dim=16, num_heads=2)


# === What is timed ===


def build_models(run, smoke):
    """`(streaming model, offline model)`: conformer_tiny with and without
    the streaming overrides (the offline one with seeded weights of its
    own: the cost does not depend on them)."""
    from keras_attn.models.conformer import build_conformer

    sizes = SMOKE_SIZES if smoke else {}
    if run:
        from keras_attn.zoo.transcribe import Transcriber

        model = Transcriber(run).model
    else:
        keras.utils.set_random_seed(0)
        model = build_conformer("conformer_tiny", vocabulary_size=10, **STREAMING, **sizes)
    config = model.conformer_config
    offline = build_conformer("conformer_tiny", vocabulary_size=10, num_layers=config.num_layers,
                              hidden_dim=config.hidden_dim, num_heads=config.num_heads)
    offline.compile(jit_compile=True)
    return model, offline


def stream_audio(seconds, rate, multiple):
    """Spoken digits concatenated to `seconds` (cut to a multiple of
    `multiple` samples, so that every chunk size ends on a whole chunk)."""
    from keras_attn.data.speech import load_spoken_digits

    waveforms, _ = load_spoken_digits(24, seed=0)
    audio = np.concatenate(waveforms)
    while len(audio) < seconds * rate:
        audio = np.concatenate([audio, audio])
    length = int(seconds * rate) // multiple * multiple
    return audio[:length].astype("float32")


def stream(model, audio, chunk_size, piece):
    """Streams `audio` through `model.stream_step` in `piece`-sample
    chunks: `(token ids, seconds per step, state before each step)`."""
    state = model.initial_state(1, chunk_size)
    ids, seconds, states = [], [], []
    for start in range(0, len(audio), piece):
        states.append(state)
        begin = time.perf_counter()
        outputs, state = model.stream_step(audio[None, start:start + piece], state,
                                           chunk_size=chunk_size)
        seconds.append(time.perf_counter() - begin)
        ids += [int(i) for i in np.asarray(outputs["token_ids"])[0] if i >= 0]
    outputs, _ = model.flush(state, chunk_size=chunk_size)
    ids += [int(i) for i in np.asarray(outputs["token_ids"])[0] if i >= 0]
    return ids, seconds, states


def chunk_masked_ids(model, audio, chunk_size):
    """Greedy ids of the whole-utterance call with the chunk mask: what a
    stream at `chunk_size` must give."""
    from keras_attn.models.conformer.conformer_model import ctc_greedy_ids

    outputs = model.streamer(chunk_size).full_forward_with_chunk_mask(
        audio[None], np.array([len(audio)], "int32"))
    ids = np.asarray(ctc_greedy_ids(outputs["logits"], outputs["logit_lengths"]))[0]
    return [int(i) for i in ids if i >= 0]


def prefix_runner(offline, audio, length):
    """The offline model on the first `length` samples (compiled first)."""
    inputs = {"waveform": audio[None, :length],
              "waveform_length": np.array([length], "int32")}
    offline.predict_on_batch(inputs)  # traces this length once, outside the timing
    return lambda: offline.predict_on_batch(inputs)


def export_steps(model, chunk_size, formats, tmp, threads):
    """`{format: StreamingRecognizer}` of the exported step."""
    from keras_attn.export.streaming import export_streaming
    from keras_attn.export.streaming_runtime import StreamingRecognizer

    recognizers = {}
    for format in formats:
        path = os.path.join(tmp, f"streaming_{format}")
        start = time.perf_counter()
        export_streaming(model, path, format, chunk_size=chunk_size)
        print(f"  exported {format} in {time.perf_counter() - start:.0f} s", flush=True)
        recognizers[format] = StreamingRecognizer(path, num_threads=threads)
    return recognizers


def stream_exported(recognizer, audio):
    """`(token ids, seconds per step, state before each step)` of `audio`
    (a whole number of chunks) through an exported step."""
    state, ids, seconds, states = recognizer.initial_state(), [], [], []
    piece = recognizer.chunk_samples
    for start in range(0, len(audio), piece):
        states.append(state)
        begin = time.perf_counter()
        outputs, state = recognizer.step(audio[None, start:start + piece], state)
        seconds.append(time.perf_counter() - begin)
        ids += [int(i) for i in np.asarray(outputs["token_ids"])[0] if i >= 0]
    outputs, _ = recognizer.finish(state)
    ids += [int(i) for i in np.asarray(outputs["token_ids"])[0] if i >= 0]
    return ids, seconds, states


def load_emformer(wheel):
    """torchaudio's `Emformer` class: from torchaudio, or from
    `torchaudio/models/emformer.py` inside the wheel `wheel`. Returns
    `(class, where from)` or `(None, why not)`."""
    try:
        from torchaudio.models import Emformer

        import torchaudio

        return Emformer, f"torchaudio {torchaudio.__version__}"
    except Exception as error:  # ImportError, or the OSError of a CUDA build's extension
        reason = f"torchaudio does not import here ({type(error).__name__}: {error})"
    if not wheel:
        return None, reason + "; --emformer-wheel loads its emformer.py from a wheel"
    import types

    with zipfile.ZipFile(wheel) as archive:
        source = archive.read("torchaudio/models/emformer.py").decode()
    module = types.ModuleType("torchaudio_emformer")
    exec(compile(source, f"{wheel}:torchaudio/models/emformer.py", "exec"), module.__dict__)
    return module.Emformer, f"{os.path.basename(wheel)}'s emformer.py (torch only)"


def emformer_step(emformer_class, config, chunk_size, steps):
    """A step of torchaudio's Emformer at our encoder's shapes: `(step
    function at the state after `steps` segments)`."""
    import torch

    torch.manual_seed(0)
    width = config.hidden_dim
    encoder = emformer_class(input_dim=width, num_heads=config.num_heads,
                             ffn_dim=config.intermediate_dim or 4 * width,
                             num_layers=config.num_layers, segment_length=chunk_size,
                             left_context_length=config.left_context,
                             right_context_length=0).eval()
    segment, length = torch.randn(1, chunk_size, width), torch.tensor([chunk_size])
    state = None
    with torch.inference_mode():
        for _ in range(steps):
            _, _, state = encoder.infer(segment, length, state)

    def step():
        with torch.inference_mode():
            return encoder.infer(segment, length, state)
    return step


def compare_emformer(args, results, config, last_steps, frame_ms, frames):
    """Each runtime's step at the end of the stream against torchaudio's
    Emformer step at the same chunk size and position (paired rounds)."""
    emformer_class, source = load_emformer(args.emformer_wheel)
    results["emformer"] = source
    if emformer_class is None:
        results["not_run"]["torchaudio Emformer"] = source
        return
    import torch

    torch.set_num_threads(args.torch_threads)
    results["versions"]["torch"] = torch.__version__
    steppers = {}
    for (name, size), ours in last_steps.items():
        steps = frames // size - 1  # the segments before the stream's last
        if size not in steppers:
            steppers[size] = emformer_step(emformer_class, config, size, steps)
        mine, theirs = time_pair(ours, steppers[size], args.rounds)
        ratio, lo, hi, verdict = paired_ratio(mine, theirs)
        row = {"runtime": name, "chunk_ms": size * frame_ms, "position_s": frames * frame_ms / 1e3,
               "step_ms": 1e3 * statistics.median(mine),
               "emformer_step_ms": 1e3 * statistics.median(theirs),
               "over_emformer": ratio, "interval": [lo, hi], "verdict": verdict}
        results["emformer_rows"].append(row)
        print(f"  {name} at {row['chunk_ms']:.0f} ms: {row['step_ms']:.1f} ms; Emformer encoder "
              f"step {row['emformer_step_ms']:.2f} ms; ratio {ratio:.1f} ({lo:.1f}-{hi:.1f})",
              flush=True)


# === Summaries (tested in tests/test_benchmarks.py) ===


def compare_fast_conformer(args, results, config, audio, step_samples, sizes, measure,
                           last_steps):
    """The FastConformer's Keras step at each even chunk size C of the
    Conformer's, at C/2 of its 80 ms frames (the same chunk duration): its
    trace and rows (`measure`), then paired rounds of its last step against
    the Conformer's (`fast_rows`: fast / Conformer)."""
    from keras_attn.models.conformer import build_conformer

    keras.utils.set_random_seed(1)
    fast = build_conformer(
        "conformer_tiny", vocabulary_size=10, num_layers=config.num_layers,
        hidden_dim=config.hidden_dim, num_heads=config.num_heads,
        subsampling="fast", scale_input=True, **STREAMING)
    results["model"]["fast_conformer_parameters"] = fast.count_params()
    rate = config.sampling_rate
    for size in sizes:
        if size % 2:
            continue
        fast_size, piece = size // 2, size * step_samples  # the same samples per chunk
        chunk_ms = piece * 1e3 / rate
        expected = chunk_masked_ids(fast, audio, fast_size)
        stream(fast, audio, fast_size, piece)  # warm-up: traces the chunk step
        ids, step_s, states = stream(fast, audio, fast_size, piece)
        if ids != expected:
            raise RuntimeError(f"the FastConformer's streamed tokens at chunk {fast_size} "
                               "differ from its chunk-masked offline call's")

        def fast_step_at(index, piece=piece, states=states, fast_size=fast_size):
            chunk = audio[None, index * piece:(index + 1) * piece]
            return lambda: fast.stream_step(chunk, states[index], chunk_size=fast_size)

        measure(f"FastConformer stream_step, {chunk_ms:.0f} ms", chunk_ms, fast_step_at,
                (ids, step_s))
        conformer = last_steps[("Keras stream_step", size)]
        ours, theirs = time_pair(fast_step_at(len(states) - 1), conformer, args.rounds)
        ratio, lo, hi, verdict = paired_ratio(ours, theirs)
        results["fast_rows"].append({
            "chunk_ms": chunk_ms, "fast_chunk_size": fast_size, "conformer_chunk_size": size,
            "fast_step_ms": 1e3 * statistics.median(ours),
            "conformer_step_ms": 1e3 * statistics.median(theirs),
            "fast_over_conformer": ratio, "interval": [lo, hi], "verdict": verdict})
        print(f"  FastConformer / Conformer step at {chunk_ms:.0f} ms: {ratio:.2f} "
              f"({lo:.2f}-{hi:.2f})", flush=True)


def compare_transducer(args, results, config, audio, size, formats, tmp, last_steps):
    """A `ConformerTransducer` of the same encoder (RNN-T, a one-layer LSTM
    prediction network of the encoder's width, seeded weights) streamed
    through its exported step in each format: its labels checked against its
    chunk-masked offline `decode`, then rounds alternating its step at the
    end of the stream with the CTC model's exported step there
    (`transducer_rows`: transducer / CTC, each one's real-time factor and the
    cores each call kept busy), for a walk at its worst and a walk of
    mostly blanks."""
    from keras_attn.models.conformer import build_conformer_transducer

    keras.utils.set_random_seed(2)
    transducer = build_conformer_transducer(
        "conformer_tiny", vocabulary_size=10, num_layers=config.num_layers,
        hidden_dim=config.hidden_dim, num_heads=config.num_heads, **STREAMING)
    results["model"]["transducer_parameters"] = transducer.count_params()
    rate, frames = config.sampling_rate, len(audio) // (4 * config.frame_step)
    # Seeded weights emit a label at almost every step, max_symbols_per_step
    # (10) at each frame: the walk's worst case. A trained model's walk is
    # mostly one blank step a frame: the blank's bias raised stands for it.
    for walk, blank_bias in (("worst case", 0.0), ("one blank step a frame", 8.0)):
        bias = transducer.joint.head.bias
        bias.assign(np.asarray(bias) + np.eye(bias.shape[0])[0].astype("float32") * blank_bias)
        _time_transducer(args, results, transducer, audio, size, formats, tmp, last_steps,
                         walk, rate, frames)


def _time_transducer(args, results, transducer, audio, size, formats, tmp, last_steps, walk,
                     rate, frames):
    from keras_attn.export.streaming import export_streaming
    from keras_attn.export.streaming_runtime import StreamingRecognizer

    decoded = transducer.decode({"waveform": audio[None],
                                 "waveform_length": np.array([len(audio)], "int32")})
    expected = [int(i) for i in decoded[0] if i > 0]
    for format in formats:
        name = {"litert": "LiteRT", "onnx": "ONNX Runtime"}[format]
        path = os.path.join(tmp, f"transducer_{format}_{len(results['transducer_rows'])}")
        export_streaming(transducer, path, format, chunk_size=size)
        recognizer = StreamingRecognizer(path, num_threads=args.threads)
        ids, step_s, states = stream_exported(recognizer, audio)
        if ids != expected:
            raise RuntimeError(f"the transducer's {name} labels differ from its offline decode")
        chunk = audio[None, (len(states) - 1) * recognizer.chunk_samples:]
        calls = {"transducer": lambda: recognizer.step(chunk, states[-1]),
                 "ctc": last_steps[(name, size)]}
        wall, cpu = time_rounds_with_cpu(calls, args.rounds)
        ratio, lo, hi, verdict = paired_ratio(wall["transducer"], wall["ctc"])
        chunk_ms = recognizer.chunk_samples * 1e3 / rate
        row = {"runtime": name, "walk": walk, "chunk_ms": chunk_ms,
               "labels_per_frame": len(ids) / frames,
               "transducer_over_ctc": ratio, "interval": [lo, hi], "verdict": verdict}
        for side in calls:
            step_ms = 1e3 * statistics.median(wall[side])
            row[f"{side}_step_ms"], row[f"{side}_rtf"] = step_ms, step_ms / chunk_ms
            row[f"{side}_cores_used"] = checked_row(f"{name} {side} step", args.threads,
                                                    wall[side], cpu[side])["cores_used"]
        results["transducer_rows"].append(row)
        print(f"  transducer ({walk}) / CTC {name} step at {chunk_ms:.0f} ms: {ratio:.2f} "
              f"({lo:.2f}-{hi:.2f}), RTF {row['transducer_rtf']:.3f}", flush=True)


def flatness(positions, seconds, window=5.0):
    """Median step time over the last `window` seconds of the stream / over
    the first `window` seconds after the first second (which holds the
    warm-up of the state): 1 for a cost flat in the utterance's length."""
    positions, seconds = np.asarray(positions), np.asarray(seconds)
    end = positions.max()
    if end < 1.0 + 2 * window - 1e-9:  # the two windows would overlap
        raise ValueError(f"Invalid value for argument `positions`: a stream of at least "
                         f"{1 + 2 * window:g} s for windows of {window:g} s. Received: a "
                         f"stream of {end:g} s")
    early = seconds[(positions > 1.0) & (positions <= 1.0 + window)]
    late = seconds[positions > end - window]
    return float(np.median(late) / np.median(early))


def paired_row(step_seconds, prefix_seconds, chunk_ms):
    """One (chunk, position) row: median step and prefix-re-run times in
    ms, each one's real-time factor, and the paired ratio prefix / step."""
    ratio, lo, hi, _ = paired_ratio(prefix_seconds, step_seconds)
    step_ms = 1e3 * statistics.median(step_seconds)
    prefix_ms = 1e3 * statistics.median(prefix_seconds)
    return {"step_ms": step_ms, "prefix_ms": prefix_ms, "step_rtf": step_ms / chunk_ms,
            "prefix_rtf": prefix_ms / chunk_ms, "prefix_over_step": ratio,
            "interval": [lo, hi]}


def table(results):
    """The markdown table of a results dict."""
    lines = ["| runtime | chunk | position | step ms | RTF | prefix re-run ms | RTF | "
             "re-run / step (95% interval) |", "|---|---|---|---|---|---|---|---|"]
    for row in results["rows"]:
        lo, hi = row["interval"]
        lines.append(
            f"| {row['runtime']} | {row['chunk_ms']:.0f} ms | {row['position_s']:.1f} s "
            f"| {row['step_ms']:.1f} | {row['step_rtf']:.3f} | {row['prefix_ms']:.1f} "
            f"| {row['prefix_rtf']:.2f} | {row['prefix_over_step']:.1f} ({lo:.1f}-{hi:.1f}) |")
    lines.append("")
    for name, trace in results["traces"].items():
        lines.append(f"{name}: whole-stream RTF {trace['rtf']:.3f}, step cost last 5 s / "
                     f"first 5 s {trace['flatness']:.2f}")
    for name, note in results["not_run"].items():
        lines.append(f"{name}: not run ({note})")
    if results.get("emformer_rows"):
        lines += ["", "| runtime | chunk | step ms | torchaudio Emformer encoder step ms | "
                      "ratio (95% interval) |", "|---|---|---|---|---|"]
        for row in results["emformer_rows"]:
            lo, hi = row["interval"]
            lines.append(f"| {row['runtime']} | {row['chunk_ms']:.0f} ms | {row['step_ms']:.2f} "
                         f"| {row['emformer_step_ms']:.2f} | {row['over_emformer']:.2f} "
                         f"({lo:.2f}-{hi:.2f}) |")
    if results.get("fast_rows"):
        lines += ["", "| chunk | FastConformer step ms | Conformer step ms | "
                      "fast / Conformer (95% interval) |", "|---|---|---|---|"]
        for row in results["fast_rows"]:
            lo, hi = row["interval"]
            lines.append(f"| {row['chunk_ms']:.0f} ms | {row['fast_step_ms']:.2f} "
                         f"| {row['conformer_step_ms']:.2f} | {row['fast_over_conformer']:.2f} "
                         f"({lo:.2f}-{hi:.2f}) |")
    if results.get("transducer_rows"):
        lines += ["", "| runtime | walk (labels / frame) | chunk | transducer step ms (RTF, "
                      "cores) | CTC step ms (RTF, cores) | transducer / CTC (95% interval) |",
                  "|---|---|---|---|---|---|"]
        for row in results["transducer_rows"]:
            lo, hi = row["interval"]
            lines.append(
                f"| {row['runtime']} | {row['walk']} ({row['labels_per_frame']:.2f}) | "
                f"{row['chunk_ms']:.0f} ms | {row['transducer_step_ms']:.2f} "
                f"({row['transducer_rtf']:.3f}, {row['transducer_cores_used']:.2f}) | "
                f"{row['ctc_step_ms']:.2f} ({row['ctc_rtf']:.3f}, {row['ctc_cores_used']:.2f}) "
                f"| {row['transducer_over_ctc']:.2f} ({lo:.2f}-{hi:.2f}) |")
    return "\n".join(lines)


def plot(results, path):
    """Step latency against the audio position: each streaming trace, and
    the prefix re-run at the measured positions (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.8), dpi=110)
    for name, trace in results["traces"].items():
        # A running median of 5 steps: one step in a few waits on the
        # machine's other jobs, which hides the level the eye should compare.
        step_ms = np.asarray(trace["step_s"]) * 1e3
        smooth = [np.median(step_ms[max(0, i - 2):i + 3]) for i in range(len(step_ms))]
        axes.plot(trace["positions_s"], smooth, lw=1.5, label=f"{name} step (median of 5)")
    prefix = {}  # position -> the re-run's times, measured beside each runtime
    for row in results["rows"]:
        prefix.setdefault(row["position_s"], []).append(row["prefix_ms"])
    positions = sorted(prefix)
    axes.plot(positions, [statistics.median(prefix[p]) for p in positions], "k-o", lw=2,
              label="offline model re-run on the prefix (each chunk)")
    axes.set_yscale("log")
    axes.set_xlabel("audio position (s)")
    axes.set_ylabel("time per chunk (ms, log scale)")
    axes.set_title(f"conformer_tiny: a streaming step against a prefix re-run\n"
                   f"{results['machine']}, {results['date']}", fontsize=10)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


# === Main ===


def cpu_name():
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv=None):
    if keras.backend.backend() != "tensorflow":
        raise SystemExit("The exports need the TensorFlow backend (KERAS_BACKEND=tensorflow).")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny model, 3 s, 2 rounds, no exports (checks the script)")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--positions", default="5,10,20,30", help="seconds")
    parser.add_argument("--chunk-sizes", default="4,8,16", help="encoder frames (40 ms each)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--formats", default="litert,onnx", help="exports of the step ('' none)")
    parser.add_argument("--run", help="a trained streaming run (default: seeded random weights)")
    parser.add_argument("--emformer-wheel", help="a torchaudio wheel to load emformer.py from")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="the Emformer's (its 2-thread pool stalled 160-700 ms in a third "
                             "of the steps on this loaded machine; one thread: 0.6 ms)")
    parser.add_argument("--fast-conformer", action="store_true",
                        help="also stream a FastConformer (subsampling='fast') at the same "
                             "chunk durations")
    parser.add_argument("--transducer", action="store_true",
                        help="also stream a ConformerTransducer of the same encoder through "
                             "its exported step, paired with the CTC step (transducer_rows)")
    parser.add_argument("--output", default=os.path.join(HERE, "results", "streaming.json"))
    parser.add_argument("--plot", default=os.path.join(ROOT, "docs", "streaming_speed.png"))
    args = parser.parse_args(argv)
    import tensorflow as tf

    if args.smoke:
        args.seconds, args.positions, args.chunk_sizes, args.rounds = 3.0, "1,3", "4,8", 2
        args.formats = ""
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    sizes = [int(c) for c in args.chunk_sizes.split(",")]
    formats = [f for f in args.formats.split(",") if f]
    model, offline = build_models(args.run, args.smoke)
    config = model.conformer_config
    rate, step_samples = config.sampling_rate, 4 * config.frame_step
    audio = stream_audio(args.seconds, rate, step_samples * max(sizes))
    seconds_total = len(audio) / rate
    positions = [min(float(p), seconds_total) for p in args.positions.split(",")]
    machine = f"{os.cpu_count()} CPU cores ({cpu_name()})"
    results = {
        "date": datetime.date.today().isoformat(), "machine": machine,
        "versions": {"keras": keras.__version__, "tensorflow": tf.__version__,
                     "python": platform.python_version()},
        "model": {"preset": "conformer_tiny", "parameters": model.count_params(),
                  "weights": args.run or "seeded random", "left_context": config.left_context,
                  "smoke": args.smoke},
        "audio_s": seconds_total, "rounds": args.rounds, "threads": args.threads,
        "rows": [], "traces": {}, "not_run": {}, "emformer_rows": [], "fast_rows": [],
        "transducer_rows": [],
        "torch_threads": args.torch_threads, "command": " ".join(sys.argv),
    }
    print(f"keras {keras.__version__}, tensorflow {tf.__version__}, {machine}, "
          f"{model.count_params():,} parameters, {seconds_total:.1f} s of audio", flush=True)
    prefixes = {p: prefix_runner(offline, audio, int(p * rate)) for p in positions}

    window = min(5.0, (seconds_total - 1.0) / 2)  # the smoke run's 3 s: two of 0.94 s

    def measure(name, chunk_ms, step_at, trace):
        """The trace and the paired rows of one runtime at one chunk size."""
        step_s = trace[1]
        where = (np.arange(len(step_s)) + 1) * chunk_ms / 1e3
        results["traces"][name] = {"positions_s": where.tolist(), "step_s": step_s,
                                   "rtf": sum(step_s) / seconds_total,
                                   "flatness": flatness(where, step_s, window)}
        for position in positions:
            index = int(round(position * 1e3 / chunk_ms)) - 1
            steps, prefix = time_pair(step_at(index), prefixes[position], args.rounds)
            row = paired_row(steps, prefix, chunk_ms)
            row.update(runtime=name, chunk_ms=chunk_ms, position_s=position)
            results["rows"].append(row)
            print(f"  {name} at {position:g} s: step {row['step_ms']:.1f} ms, prefix re-run "
                  f"{row['prefix_ms']:.1f} ms ({row['prefix_over_step']:.1f}x)", flush=True)

    keras_ids, keras_states = {}, {}
    last_steps = {}  # (runtime, chunk size) -> its step at the end of the stream
    for size in sizes:
        piece, chunk_ms = size * step_samples, size * step_samples * 1e3 / rate
        expected = chunk_masked_ids(model, audio, size)
        stream(model, audio, size, piece)  # warm-up: traces the chunk step
        ids, step_s, states = stream(model, audio, size, piece)
        if ids != expected:
            raise RuntimeError(f"streamed tokens at chunk {size} differ from the chunk-masked "
                               "offline call's")
        keras_ids[size], keras_states[size] = ids, states

        def keras_step_at(index, piece=piece, states=states, size=size):
            chunk = audio[None, index * piece:(index + 1) * piece]
            return lambda: model.stream_step(chunk, states[index], chunk_size=size)

        measure(f"Keras stream_step, {chunk_ms:.0f} ms", chunk_ms, keras_step_at,
                (ids, step_s))
        last_steps[("Keras stream_step", size)] = keras_step_at(len(states) - 1)

    if args.fast_conformer:
        compare_fast_conformer(args, results, config, audio, step_samples, sizes, measure,
                               last_steps)

    with tempfile.TemporaryDirectory() as tmp:
        size = config.chunk_size if config.chunk_size in sizes else sizes[0]
        chunk_ms = size * step_samples * 1e3 / rate
        for format, recognizer in export_steps(model, size, formats, tmp, args.threads).items():
            name = {"litert": "LiteRT", "onnx": "ONNX Runtime"}[format]
            stream_exported(recognizer, audio)  # warm-up
            ids, step_s, states = stream_exported(recognizer, audio)
            if ids != keras_ids[size]:
                raise RuntimeError(f"{name}'s streamed tokens differ from the Keras step's")

            def exported_step_at(index, recognizer=recognizer, states=states):
                piece = recognizer.chunk_samples
                chunk = audio[None, index * piece:(index + 1) * piece]
                return lambda: recognizer.step(chunk, states[index])

            measure(f"{name} step, {chunk_ms:.0f} ms", chunk_ms, exported_step_at, (ids, step_s))
            last_steps[(name, size)] = exported_step_at(len(states) - 1)
        for format in {"litert", "onnx"} - set(formats):
            results["not_run"][format] = "left out (--formats)"
        if args.transducer:
            compare_transducer(args, results, config, audio, size, formats, tmp, last_steps)
        compare_emformer(args, results, config, last_steps, step_samples / rate * 1e3,
                         len(audio) // step_samples)

    print()
    print(table(results))
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as handle:
        json.dump(results, handle, indent=1)
    if args.plot:
        plot(results, args.plot)
    print(f"results: {args.output}" + (f"; plot: {args.plot}" if args.plot else ""))
    return results


if __name__ == "__main__":
    main()
