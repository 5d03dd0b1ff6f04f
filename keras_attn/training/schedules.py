"""The learning-rate schedule and optimizer of "Attention Is All You Need"."""

import keras
from keras import ops

from keras_attn._checks import check_positive_float
from keras_attn._checks import check_positive_int


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)`.

    Rises linearly for `warmup_steps` steps, peaks at
    `scale * (d_model * warmup_steps)^-0.5` at `step = warmup_steps`, then
    decays as `step^-0.5` (section 5.3 of the paper). Step 0 (the
    first update: Keras passes the number of updates already applied) would
    give a rate of 0, a wasted update; the step is clamped to at least 1.

    Args:
        hidden_dim: `d_model`.
        warmup_steps: 4000 in the paper.
        scale: a constant factor (1 in the paper).

    Example:

    >>> schedule = TransformerSchedule(hidden_dim=512, warmup_steps=4000)
    >>> round(float(schedule(4000)), 7)  # the peak, 512^-0.5 * 4000^-0.5
    0.0006988
    """

    def __init__(self, hidden_dim, warmup_steps=4000, scale=1.0):
        self.hidden_dim = check_positive_int("hidden_dim", hidden_dim)
        self.warmup_steps = check_positive_int("warmup_steps", warmup_steps)
        self.scale = check_positive_float("scale", scale)

    def __call__(self, step):
        step = ops.maximum(ops.cast(step, "float32"), 1.0)
        warmup = float(self.warmup_steps)
        rate = ops.minimum(ops.power(step, -0.5), step * warmup**-1.5)
        return self.scale * self.hidden_dim**-0.5 * rate

    def get_config(self):
        return {
            "hidden_dim": self.hidden_dim,
            "warmup_steps": self.warmup_steps,
            "scale": self.scale,
        }


def transformer_adam(hidden_dim, warmup_steps=4000, scale=1.0, **kwargs):
    """`keras.optimizers.Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9)` with
    the `TransformerSchedule` (section 5.3). `kwargs` go to Adam
    (`clipnorm`, ...)."""
    return keras.optimizers.Adam(
        learning_rate=TransformerSchedule(hidden_dim, warmup_steps, scale),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
        **kwargs,
    )


@keras.saving.register_keras_serializable(package="keras_attn")
class LinearWarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to `learning_rate` over `warmup_steps`, then a
    linear decay to 0 at `total_steps` (BERT's schedule; 0 after).

    Args:
        learning_rate: the peak rate.
        total_steps: where the rate reaches 0.
        warmup_steps: steps of warmup (0 for none), less than `total_steps`.

    Example:

    >>> schedule = LinearWarmupDecay(1e-3, total_steps=100, warmup_steps=10)
    >>> [round(float(schedule(s)), 6) for s in (0, 5, 10, 55, 100)]
    [0.0, 0.0005, 0.001, 0.0005, 0.0]
    """

    def __init__(self, learning_rate, total_steps, warmup_steps=0):
        self.learning_rate = check_positive_float("learning_rate", learning_rate)
        self.total_steps = check_positive_int("total_steps", total_steps)
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or not (
            0 <= warmup_steps < total_steps
        ):
            raise ValueError(
                "`warmup_steps` must be an integer in [0, total_steps). Received: "
                f"warmup_steps={warmup_steps!r}, total_steps={total_steps}"
            )
        self.warmup_steps = warmup_steps

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warmup = step / max(self.warmup_steps, 1)
        decay = (self.total_steps - step) / (self.total_steps - self.warmup_steps)
        rate = ops.where(step < self.warmup_steps, warmup, ops.maximum(decay, 0.0))
        return self.learning_rate * rate

    def get_config(self):
        return {
            "learning_rate": self.learning_rate,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
        }
