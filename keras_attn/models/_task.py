"""The base of the task models built on a backbone (BERT's and ModernBERT's
classifiers and masked-LM models)."""

import keras

from keras_attn import _keras_compat
from keras_attn.models._config import dtype_policy_with_quantization
from keras_attn.models._guarded import GuardedModel


class BackboneTask(GuardedModel, keras.Model):
    """What the task models share: the backbone's inputs and checks
    (`keras_attn.models._guarded.GuardedModel`), logits out (a loss that reads
    probabilities is refused), and a config of the backbone (a nested
    object) and the constructor's other arguments (`_task_args`)."""

    _task_args = ()

    def input_specs(self):
        return self.backbone.input_specs()

    def max_length(self):
        return self.backbone.max_length()

    def outputs_are_logits(self):
        return True  # every task head gives logits

    def get_config(self):
        backbone = keras.saving.serialize_keras_object(self.backbone)
        # The heads take the backbone's dtype policy: quantized heads go into
        # its map (see dtype_policy_with_quantization).
        backbone["config"]["dtype"] = keras.saving.serialize_keras_object(
            dtype_policy_with_quantization(self, self.backbone.dtype_policy))
        config = {"name": self.name, "trainable": self.trainable, "backbone": backbone}
        for arg in self._task_args:
            config[arg] = getattr(self, arg)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["backbone"] = keras.saving.deserialize_keras_object(config["backbone"])
        model = cls(**config)
        _keras_compat.resolve_policy_maps(model)  # the heads (see there)
        return model
