"""ModernBERT (Warner et al., 2024): config, presets, backbone, masked-LM
model and sequence classifier."""

from keras_attn.models.modernbert.modernbert_backbone import ModernBertBackbone
from keras_attn.models.modernbert.modernbert_backbone import build_modernbert
from keras_attn.models.modernbert.modernbert_config import MODERNBERT_PRESETS
from keras_attn.models.modernbert.modernbert_config import ModernBertConfig
from keras_attn.models.modernbert.modernbert_config import get_modernbert_config
from keras_attn.models.modernbert.modernbert_config import replace_modernbert_config
from keras_attn.models.modernbert.modernbert_tasks import ModernBertMaskedLM
from keras_attn.models.modernbert.modernbert_tasks import ModernBertMaskedLMHead
from keras_attn.models.modernbert.modernbert_tasks import ModernBertSequenceClassifier

__all__ = [
    "MODERNBERT_PRESETS",
    "ModernBertBackbone",
    "ModernBertConfig",
    "ModernBertMaskedLM",
    "ModernBertMaskedLMHead",
    "ModernBertSequenceClassifier",
    "build_modernbert",
    "get_modernbert_config",
    "replace_modernbert_config",
]
