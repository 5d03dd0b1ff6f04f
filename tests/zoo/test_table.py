"""models/README.md is generated from the recipes and the results files, and
the parameter counts it shows are the models' own."""

import importlib.util
import json
import os

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "models")


def _make_table():
    spec = importlib.util.spec_from_file_location(
        "make_table", os.path.join(MODELS, "make_table.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_table_is_up_to_date():
    make_table = _make_table()
    with open(os.path.join(MODELS, "README.md")) as handle:
        assert handle.read() == make_table.render(), (
            "models/README.md is stale: run python models/make_table.py"
        )


def test_every_recipe_has_a_row_and_a_parameter_count():
    make_table = _make_table()
    text = make_table.render()
    with open(os.path.join(MODELS, "parameters.json")) as handle:
        counts = json.load(handle)
    for recipe in make_table.load_recipes():
        name = recipe["name"]
        assert f"[{name}]({recipe['family']}/{name}.json)" in text
        if recipe["data"]["dataset"] == "embedded":
            # Counted by its run: the vocabulary is learned from the data.
            result = os.path.join(MODELS, "results", name + ".json")
            if os.path.exists(result):
                with open(result) as handle:
                    assert json.load(handle)["parameters"] > 0
        else:
            assert counts.get(name, 0) > 0, f"{name} has no count: make_table.py --count"


def test_render_uses_the_results_files(tmp_path):
    make_table = _make_table()
    family = tmp_path / "vit"
    family.mkdir()
    recipe = {
        "name": "vit_example", "family": "vit", "task": "image_classification",
        "data": {"dataset": "embedded"},
        "paper": {"parameters": 5_000_000, "result": "top-1 72.2", "source": "X et al., Table 1"},
    }
    (family / "vit_example.json").write_text(json.dumps(recipe))
    (tmp_path / "parameters.json").write_text("{}")
    text = make_table.render(str(tmp_path))
    assert "| not run here |" in text and "| 5M |" in text
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "vit_example.json").write_text(json.dumps({
        "name": "vit_example", "metric": "accuracy", "value": 0.9861,
        "train_seconds": 86.0, "hardware": "2 CPU cores", "parameters": 204_810,
    }))
    row = [line for line in make_table.render(str(tmp_path)).splitlines() if "vit_example" in line]
    assert row == [
        "| [vit_example](vit/vit_example.json) | 204,810 | 5M | embedded: scikit-learn digits "
        "| accuracy 0.9861 | 86 s | 2 CPU cores | top-1 72.2 (X et al., Table 1) "
        "| `keras-attn train vit_example` |"
    ]


    # A served-metrics file adds the recipe's row to the "Exported" table.
    assert "## Exported" not in make_table.render(str(tmp_path))
    exports = {f"{f}_{p}": {"value": v, "megabytes": mb} for f, p, v, mb in [
        ("saved_model", "float32", 0.9861, 0.9), ("onnx", "float32", 0.9861, 0.55),
        ("litert", "float32", 0.9861, 0.56), ("litert", "float16", 0.9833, 0.3)]}
    (tmp_path / "results" / "vit_example.served.json").write_text(json.dumps(
        {"name": "vit_example", "metric": "accuracy", "keras": 0.9861, "exports": exports}))
    text = make_table.render(str(tmp_path))
    assert text.count("| vit_example |") == 1
    assert ("| vit_example | accuracy | 0.9861 | 0.9861 (0.90 MB) | 0.9861 (0.55 MB) | - "
            "| 0.9861 (0.56 MB) | 0.9833 (0.30 MB) | - |") in text

    # An example's served.json (no recipe of that name) is recorded as it is
    # and gets its row after the recipes'; a file that is not one is refused.
    report = tmp_path / "served.json"
    report.write_text(json.dumps({
        "name": "bert_finetune", "metric": "accuracy", "keras": 0.8, "source": "examples/x.py",
        "exports": {"onnx_float16": {"value": 0.79, "megabytes": 1.5}}}))
    make_table.record_served(str(report), root=str(tmp_path))
    rows = [line for line in make_table.render(str(tmp_path)).splitlines()
            if line.startswith(("| vit_example | accuracy", "| bert_finetune"))]
    assert rows[1] == ("| bert_finetune (examples/x.py) | accuracy | 0.8000 | - | - "
                       "| 0.7900 (1.50 MB) | - | - | - |")
    report.write_text(json.dumps({"name": "x"}))
    with pytest.raises(SystemExit, match="lacks"):
        make_table.record_served(str(report), root=str(tmp_path))


@pytest.mark.parametrize("name", ["vit_tiny_16", "bert_tiny", "conformer_small", "transformer_b_key16"])
def test_recorded_counts_are_the_models(name):
    make_table = _make_table()
    from keras_attn.zoo.recipe import load_recipe

    family = name.split("_")[0]
    recipe = load_recipe(os.path.join(MODELS, family, name + ".json"))
    model = make_table._nominal_task(recipe).make_model(
        recipe["model"]["preset"], dict(recipe["model"]["overrides"])
    )
    with open(os.path.join(MODELS, "parameters.json")) as handle:
        assert json.load(handle)[name] == model.count_params()


def _streaming_section(text):
    """The rows of models/README.md's streaming table, split into cells."""
    lines = text.split("## Streaming speech recognition", 1)[1].splitlines()
    return [[cell.strip() for cell in line.strip("|").split("|")]
            for line in lines if line.startswith("| [")]


# The streaming recipes, each with its offline counterpart and the latency
# of a chunk of `size` encoder frames in ms: the chunk plus the front end's
# look-ahead. The Conformer (40 ms frames) reads 2 feature frames (10 ms
# each) past the chunk; the FastConformer (80 ms frames) stops one feature
# frame short of its chunk's end; both add half a 512-sample FFT (16 ms).
STREAMING_RECIPES = {
    "conformer_tiny_digits_streaming": ("conformer_tiny_digits", lambda size: 40 * size + 20 + 16),
    "fastconformer_tiny_digits_streaming": ("fastconformer_tiny_digits",
                                            lambda size: 80 * size - 10 + 16),
}


@pytest.mark.parametrize("name", sorted(STREAMING_RECIPES))
def test_streaming_rows_are_the_recorded_runs_results(name):
    # Every streamed chunk size of the recipe has its row, whose WER and
    # latency are the recorded run's (models/results/), and the offline row
    # the run's metric with the configured chunk mask.
    make_table = _make_table()
    offline_name, latency_ms = STREAMING_RECIPES[name]
    with open(os.path.join(MODELS, "conformer", name + ".json")) as handle:
        recipe = json.load(handle)
    with open(os.path.join(MODELS, "results", name + ".json")) as handle:
        metrics = json.load(handle)["metrics"]
    with open(os.path.join(MODELS, "results", offline_name + ".json")) as handle:
        offline_wer = json.load(handle)["metrics"]["wer"]
    rows = [row for row in _streaming_section(make_table.render())
            if row[0].startswith(f"[{name}]")]
    sizes = recipe["evaluation"]["streaming_chunk_sizes"]
    assert len(rows) == 1 + len(sizes)
    chunk_size = recipe["model"]["overrides"]["chunk_size"]
    assert rows[0][1:4] == [f"offline, chunk mask of {chunk_size} frames", "-",
                            f"WER {metrics['wer']:.4f}"]
    for row, size in zip(rows[1:], sizes):
        assert row[1:4] == [f"streamed, chunks of {size} frames",
                            f"{metrics[f'latency_ms_chunk_{size}']:.0f} ms",
                            f"WER {metrics[f'wer_chunk_{size}']:.4f}"]
        assert metrics[f"latency_ms_chunk_{size}"] == latency_ms(size)
    assert {row[4] for row in rows} == {
        f"WER {offline_wer:.4f} ([{offline_name}](conformer/{offline_name}.json))"}


@pytest.mark.parametrize("subsampling,frame_ms,look_ahead_ms", [("conv", 40, 36),
                                                                ("fast", 80, 6)])
def test_streaming_latency_follows_the_subsampling(subsampling, frame_ms, look_ahead_ms):
    # The latency recorded for each streamed chunk size: the chunk's encoder
    # frames (80 ms each for the FastConformer's 8x subsampling, not the
    # Conformer's 40 ms) plus the front end's look-ahead (docs/streaming.md).
    from keras_attn.models.conformer import get_conformer_config
    from keras_attn.zoo.tasks.speech_ctc import streaming_latency_ms

    config = get_conformer_config("conformer_tiny", subsampling=subsampling)
    for size in (1, 2, 4, 8, 16):
        assert streaming_latency_ms(config, size) == frame_ms * size + look_ahead_ms


def test_streaming_rows_read_each_chunk_size_from_the_results_file(tmp_path):
    # Distinct values per chunk size, so that a row showing another size's
    # numbers (or the recipe's instead of the run's) fails.
    make_table = _make_table()
    (tmp_path / "conformer").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "parameters.json").write_text("{}")
    recipe = {"name": "asr_streaming", "family": "conformer", "task": "speech_ctc",
              "data": {"dataset": "embedded"}, "paper": None,
              "model": {"preset": "conformer_tiny", "overrides": {"chunk_size": 8}},
              "evaluation": {"metric": "wer", "streaming_chunk_sizes": [4, 16, 2]}}
    (tmp_path / "conformer" / "asr_streaming.json").write_text(json.dumps(recipe))
    text = make_table.render(str(tmp_path))
    assert _streaming_section(text) == [
        ["[asr_streaming](conformer/asr_streaming.json)", decoding, "-", "not run here", "-"]
        for decoding in ["offline, chunk mask of 8 frames", "streamed, chunks of 4 frames",
                         "streamed, chunks of 16 frames", "streamed, chunks of 2 frames"]]
    (tmp_path / "results" / "asr_streaming.json").write_text(json.dumps({
        "name": "asr_streaming", "metric": "wer", "value": 0.125, "metrics": {
            "wer": 0.125, "wer_chunk_4": 0.25, "latency_ms_chunk_4": 196.0,
            "wer_chunk_16": 0.0625, "latency_ms_chunk_16": 676.4}}))
    (tmp_path / "results" / "asr.json").write_text(json.dumps(
        {"name": "asr", "metric": "wer", "value": 0.03, "metrics": {"wer": 0.03}}))
    reference = "WER 0.0300 ([asr](conformer/asr.json))"
    assert [row[1:] for row in _streaming_section(make_table.render(str(tmp_path)))] == [
        ["offline, chunk mask of 8 frames", "-", "WER 0.1250", reference],
        ["streamed, chunks of 4 frames", "196 ms", "WER 0.2500", reference],
        ["streamed, chunks of 16 frames", "676 ms", "WER 0.0625", reference],
        ["streamed, chunks of 2 frames", "-", "not run here", reference],
    ]
