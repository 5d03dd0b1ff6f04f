"""BERT, and RoBERTa and XLM-R: BERT's encoder with one segment and the
positions counted past the padding id (`BertConfig.padding_id`), built by
the bert recipe family (`keras_attn.models.bert`)."""

from keras_attn.zoo.families import BERT_SPECIAL_TOKENS
from keras_attn.zoo.families import TextFamily
from keras_attn.zoo.families import vocabulary_pad_id


class Bert(TextFamily):
    name = "bert"
    title = "BERT"
    recipe_family = "bert"
    model_type = "bert"
    tokenizer_kind = "wordpiece"
    special_tokens = BERT_SPECIAL_TOKENS
    pad_id = 0
    pooling = "pooler"
    inputs = ("token_ids", "segment_ids", "padding_mask")
    tasks = ("masked_lm", "text_classification", "token_classification")
    next_sentence_prediction = True

    def model_config(self, preset, overrides, vocabulary):
        """BERT's config with the vocabulary's size; one with RoBERTa's
        positions (`padding_id`) must count them past the vocabulary's
        `[PAD]`: a `ValueError` naming the key otherwise."""
        from keras_attn.models.bert import get_bert_config

        config = get_bert_config(preset, **dict(overrides, vocabulary_size=len(vocabulary)))
        pad_id = None if config.padding_id is None else vocabulary_pad_id(vocabulary)
        if config.padding_id is not None and config.padding_id != pad_id:
            raise ValueError(
                f"Recipe key `model.overrides.padding_id` must be the learned vocabulary's [PAD] "
                f"id, {pad_id} (RoBERTa's positions are counted past it; preset {preset!r} has "
                f"its own vocabulary's). Received: padding_id={config.padding_id}")
        return config

    def config_from_dict(self, fields):
        from keras_attn.models.bert import BertConfig

        return BertConfig(**fields)

    def backbone(self, preset, overrides, vocabulary):
        from keras_attn.models.bert import build_bert

        return build_bert(preset, vocabulary_size=len(vocabulary), **overrides)

    def sequence_classifier(self, backbone, num_classes):
        from keras_attn.models.bert import BertSequenceClassifier

        return BertSequenceClassifier(backbone, num_classes=num_classes)

    def token_classifier(self, backbone, num_classes):
        from keras_attn.models.bert import BertTokenClassifier

        model = BertTokenClassifier(backbone, num_classes=num_classes)
        # The tags come from the sequence output: the pooler gets no gradient
        # (frozen, so that Keras does not warn about it at every step).
        model.backbone.get_layer("pooled_dense").trainable = False
        return model

    def masked_lm(self, backbone, max_segments, next_sentence):
        from keras_attn.models.bert import BertPretrainer

        return BertPretrainer(backbone, max_segments=max_segments, next_sentence=next_sentence)

    def masked_lm_inputs(self):
        return self.inputs + ("mask_positions",)

    hf_tokenizer_files = (("tokenizer.json",), ("vocab.txt",))
    hf_tasks = ("text_classification", "token_classification")

    def hf_config(self, path):
        from keras_attn.convert.bert import bert_config_from_hf

        return bert_config_from_hf(path)

    def hf_tokenizer(self, path):
        from keras_attn.convert.bert import load_hf_bert_tokenizer

        return load_hf_bert_tokenizer(path)

    def hf_vocabulary(self, tokenizer):
        return list(tokenizer.get_vocabulary())

    def hf_backbone(self, path):
        from keras_attn.convert.bert import load_hf_bert_backbone

        return load_hf_bert_backbone(path)


class Roberta(Bert):
    """RoBERTa's own vocabulary: byte-level BPE (`vocab.json`, `merges.txt`),
    padding id 1."""

    name = "roberta"
    title = "RoBERTa"
    model_type = "roberta"
    tokenizer_kind = "byte_level_bpe"
    special_tokens = {"cls": "<s>", "sep": "</s>", "pad": "<pad>", "mask": "<mask>",
                      "unk": "<unk>"}
    pad_id = 1
    hf_tokenizer_files = TextFamily.hf_tokenizer_files
    hf_tasks = TextFamily.hf_tasks
    hf_vocabulary = TextFamily.hf_vocabulary

    def hf_tokenizer(self, path):
        from keras_attn.convert.bpe import load_hf_bpe_tokenizer

        return load_hf_bpe_tokenizer(path)

    def config_pad_id(self, config):
        return config.padding_id  # its positions are counted past it


class XlmRoberta(Roberta):
    """XLM-R: RoBERTa's layout with a SentencePiece vocabulary."""

    name = "xlm_roberta"
    title = "XLM-R"
    model_type = "xlm-roberta"
    tokenizer_kind = "sentencepiece"
    hf_tokenizer_files = (("tokenizer.json",), ("sentencepiece.bpe.model",))

    def hf_tokenizer(self, path):
        from keras_attn.convert.bert import load_hf_xlm_roberta_tokenizer

        return load_hf_xlm_roberta_tokenizer(path)
