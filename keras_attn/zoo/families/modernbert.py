"""ModernBERT (`keras_attn.models.modernbert`): no segment ids, `[CLS]`
pooling, no next-sentence prediction; its masked LM takes BERT's
pretraining batches as `(B, T)` targets weighted at the masked positions."""

from keras_attn.zoo.families import BERT_SPECIAL_TOKENS
from keras_attn.zoo.families import TextFamily
from keras_attn.zoo.families import vocabulary_pad_id


def modernbert_batch(x, y, sample_weight):
    """A BERT pretraining batch (`mask_positions`, `{"mlm", "nsp"}` targets)
    as `ModernBertMaskedLM` takes it, in a `tf.data` map: `{"token_ids",
    "padding_mask"[, "packed_segment_ids", "positions"]}`, the `(B, T)` ids
    at the masked positions and their weights (0 elsewhere)."""
    import tensorflow as tf

    length = tf.shape(x["token_ids"])[1]
    chosen = tf.one_hot(x["mask_positions"], length, dtype=tf.int32) * tf.cast(
        sample_weight["mlm"] > 0, tf.int32)[..., None]  # (B, P, T)
    targets = tf.reduce_sum(chosen * tf.cast(y["mlm"], tf.int32)[..., None], axis=1)
    weights = tf.cast(tf.reduce_max(chosen, axis=1), tf.float32)  # (B, T)
    inputs = {name: x[name] for name in ModernBert.inputs + ("packed_segment_ids", "positions")
              if name in x}
    return inputs, targets, weights


class ModernBert(TextFamily):
    name = "modernbert"
    title = "ModernBERT"
    recipe_family = "modernbert"
    model_type = "modernbert"
    tokenizer_kind = "byte_level_bpe"
    special_tokens = BERT_SPECIAL_TOKENS
    pad_id = 50283
    pooling = "cls"
    inputs = ("token_ids", "padding_mask")
    tasks = ("masked_lm", "text_classification")
    set_fields = ("vocabulary_size", "pad_id")

    def model_config(self, preset, overrides, vocabulary):
        """ModernBERT's config with the vocabulary's size and `[PAD]`."""
        from keras_attn.models.modernbert import get_modernbert_config

        return get_modernbert_config(preset, **dict(overrides, vocabulary_size=len(vocabulary)),
                                     pad_id=vocabulary_pad_id(vocabulary))

    def config_from_dict(self, fields):
        from keras_attn.models.modernbert import ModernBertConfig

        return ModernBertConfig(**fields)

    def backbone(self, preset, overrides, vocabulary):
        from keras_attn.models.modernbert import build_modernbert

        return build_modernbert(preset, vocabulary_size=len(vocabulary),
                                pad_id=vocabulary_pad_id(vocabulary), **overrides)

    def sequence_classifier(self, backbone, num_classes):
        from keras_attn.models.modernbert import ModernBertSequenceClassifier

        return ModernBertSequenceClassifier(backbone, num_classes=num_classes)

    def masked_lm(self, backbone, max_segments, next_sentence):
        from keras_attn.models.modernbert import ModernBertMaskedLM

        return ModernBertMaskedLM(backbone)

    def hf_config(self, path):
        from keras_attn.convert.modernbert import modernbert_config_from_hf

        return modernbert_config_from_hf(path)

    def hf_tokenizer(self, path):
        from keras_attn.convert.bpe import load_hf_bpe_tokenizer

        return load_hf_bpe_tokenizer(path)

    def config_pad_id(self, config):
        return config.pad_id

    def hf_backbone(self, path):
        """The backbone of a ModernBertModel, ...ForMaskedLM or
        ...ForSequenceClassification directory (its head left out)."""
        from keras_attn.convert.modernbert import load_hf_modernbert

        model = load_hf_modernbert(path)
        return getattr(model, "backbone", model)

    def masked_lm_batches(self, dataset):
        import tensorflow as tf

        from keras_attn._base.quiet_tensorflow import traced_as_written

        return dataset.map(traced_as_written(modernbert_batch),
                           num_parallel_calls=tf.data.AUTOTUNE)

    def masked_lm_outputs(self, outputs):
        return {"mlm": outputs}  # its logits

    def masked_lm_compile_arguments(self):
        import keras

        from keras_attn.training.metrics import Perplexity

        # BertPretrainer's masked-LM loss and metrics, over the (B, T)
        # weights: 1 at the masked positions (and none on a filler row).
        return {"loss": keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True, reduction="mean_with_sample_weight"),
                "metrics": None,
                "weighted_metrics": [keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
                                     Perplexity(name="perplexity")]}
