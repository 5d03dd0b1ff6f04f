"""BERT (Devlin et al., 2019): config, presets, backbone and task models."""

from keras_attn.models.bert.bert_backbone import BertBackbone
from keras_attn.models.bert.bert_backbone import build_bert
from keras_attn.models.bert.bert_backbone import check_token_ids
from keras_attn.models.bert.bert_config import BERT_PRESETS
from keras_attn.models.bert.bert_heads import BertMaskedLMHead
from keras_attn.models.bert.bert_tasks import BertPretrainer
from keras_attn.models.bert.bert_tasks import BertSequenceClassifier
from keras_attn.models.bert.bert_tasks import BertTokenClassifier
from keras_attn.models.bert.bert_config import BertConfig
from keras_attn.models.bert.bert_config import get_bert_config
from keras_attn.models.bert.bert_config import replace_bert_config

__all__ = [
    "BERT_PRESETS",
    "BertBackbone",
    "BertConfig",
    "BertMaskedLMHead",
    "BertPretrainer",
    "BertSequenceClassifier",
    "BertTokenClassifier",
    "build_bert",
    "check_token_ids",
    "get_bert_config",
    "replace_bert_config",
]
