"""Runs exported ONNX / LiteRT directories in their own runtimes, in a
fresh process that imports neither TensorFlow nor Keras nor keras_attn
(checked at the end): argv[1] is a JSON list of jobs
`{"path", "inputs": npz file, "outputs": npz file}`; the inputs are fed by
the names of `serving.json`, the outputs stored by its names; a runtime
error is written as `{"error": message}` in `<outputs>.json` instead."""

import json
import os
import sys

import numpy as np


def run(path, inputs):
    with open(os.path.join(path, "serving.json")) as stream:
        contract = json.load(stream)
    file = os.path.join(path, contract["file"])
    names = [output["name"] for output in contract["outputs"]]
    if contract["format"] == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(file, providers=["CPUExecutionProvider"])
        return dict(zip(names, session.run(names, inputs)))
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=file).get_signature_runner()
    outputs = runner(**inputs)
    return {name: outputs[name] for name in names}


def main(jobs):
    for job in jobs:
        with np.load(job["inputs"]) as stored:
            inputs = dict(stored)
        try:
            np.savez(job["outputs"], **run(job["path"], inputs))
        except Exception as error:  # the runtime's own error, reported to the test
            with open(job["outputs"] + ".json", "w") as stream:
                json.dump({"error": f"{type(error).__name__}: {error}"}, stream)

    imported = sorted(name for name in ("tensorflow", "keras", "keras_attn") if name in sys.modules)
    print("IMPORTED" + json.dumps(imported))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
