"""The einsums of keras_attn's layers and heads against the same product
written as `matmul` (with transposes), in one process: a compiled training
step (forward + backward + Adam) of a model that holds only that product,
timed in alternating pairs (see `_stats.py`). Prints the ratio einsum /
matmul (> 1.00: the matmul form is faster). Never run as a test.

Run:  python benchmarks/einsum_forms.py [--repeats 15] [--xla on|off|both]
      (TensorFlow backend by default; KERAS_BACKEND=jax works too)

A form is changed in the package only where its matmul measures faster,
and the two give the same values (checked here to 1e-5 before timing).
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _stats import paired_ratio  # noqa: E402
from _stats import time_pair  # noqa: E402


def _mlm_decoder(form, x, table):  # (B, P, D) x (V, D) -> (B, P, V)
    if form == "einsum":
        return ops.einsum("bpd,vd->bpv", x, table)
    return ops.matmul(x, ops.transpose(table))


def _attention_logits(form, q, k):  # (B, T, N, H) x (B, S, N, H) -> (B, N, T, S)
    if form == "einsum":
        return ops.einsum("btnh,bsnh->bnts", q, k)
    return ops.matmul(ops.transpose(q, (0, 2, 1, 3)), ops.transpose(k, (0, 2, 3, 1)))


def _attention_output(form, p, v):  # (B, N, T, S) x (B, S, N, H) -> (B, T, N, H)
    if form == "einsum":
        return ops.einsum("bnts,bsnh->btnh", p, v)
    return ops.transpose(ops.matmul(p, ops.transpose(v, (0, 2, 1, 3))), (0, 2, 1, 3))


def _relative_scores(form, q, r):  # (B, T, N, H) x (R, N, H) -> (B, N, T, R)
    if form == "einsum":
        return ops.einsum("btnh,rnh->bntr", q, r)
    return ops.matmul(ops.transpose(q, (0, 2, 1, 3)), ops.transpose(r, (1, 2, 0)))


# name: (product, first operand shape (an input through a trainable scale),
#        second operand shape (a weight), where it is used)
CASES = {
    "mlm_decoder": (
        _mlm_decoder, (16, 20, 256), (30522, 256),
        "bpd,vd->bpv; BertMaskedLMHead, bert_mini: B16, 20 masked of 128, V 30522"),
    "attention_logits": (
        _attention_logits, (16, 128, 4, 64), (16, 128, 4, 64),
        "btnh,bsnh->bnts; scaled_dot_product_attention, bert_mini: B16 T128 N4 H64"),
    "attention_output": (
        _attention_output, (16, 4, 128, 128), (16, 128, 4, 64),
        "bnts,bsnh->btnh; scaled_dot_product_attention, bert_mini: B16 T128 N4 H64"),
    "relative_scores": (
        _relative_scores, (32, 100, 4, 36), (199, 4, 36),
        "btnh,rnh->bntr; RelativeMultiHeadAttention, Conformer-S: B32 T100 N4 H36"),
}


class _Product(keras.layers.Layer):
    def __init__(self, product, form, first_shape, second_shape, **kwargs):
        super().__init__(**kwargs)
        self.product, self.form = product, form
        self.scale = self.add_weight(shape=first_shape[1:], initializer="ones")
        self.second = self.add_weight(shape=second_shape, initializer="glorot_uniform")

    def call(self, x):
        return self.product(self.form, x * self.scale, self.second)


def _models(name):
    product, first_shape, second_shape, _ = CASES[name]
    models = []
    for form in ("einsum", "matmul"):
        keras.utils.set_random_seed(0)
        inputs = keras.Input(first_shape[1:], batch_size=first_shape[0])
        models.append(keras.Model(inputs, _Product(product, form, first_shape, second_shape)(inputs)))
    x = np.random.default_rng(0).standard_normal(first_shape).astype("float32")
    return models, x


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--xla", default="on", choices=("on", "off", "both"))
    args = parser.parse_args(argv)
    xla_modes = {"on": [True], "off": [False], "both": [True, False]}[args.xla]
    print(f"keras {keras.__version__}, backend {keras.backend.backend()}, {os.cpu_count()} CPUs")
    table = []
    for name in args.cases.split(","):
        for jit in xla_modes:
            models, x = _models(name)
            outs = [np.asarray(m.predict_on_batch(x)) for m in models]
            np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)
            fns = []
            for model in models:
                model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse", jit_compile=jit)
                target = np.zeros(model.output.shape, "float32")
                fns.append(lambda m=model, t=target: m.train_on_batch(x, t))
            for fn in fns:
                fn()
            einsum_times, matmul_times = time_pair(fns[0], fns[1], args.repeats)
            ratio, lo, hi, _ = paired_ratio(einsum_times, matmul_times)
            verdict = "matmul faster" if lo > 1.0 else "einsum faster" if hi < 1.0 else "tie"
            table.append((name, CASES[name][3], jit, ratio, lo, hi, verdict))
            print(f"  {name}, XLA {'on' if jit else 'off'}: {ratio:.3f} ({lo:.3f}-{hi:.3f})", flush=True)
    print()
    print("| case | product, where | XLA | einsum / matmul | 95% interval | verdict |")
    print("|---|---|---|---|---|---|")
    for name, where, jit, ratio, lo, hi, verdict in table:
        print(f"| {name} | {where} | {'on' if jit else 'off'} | {ratio:.3f} | {lo:.3f}-{hi:.3f} | {verdict} |")


if __name__ == "__main__":
    main()
