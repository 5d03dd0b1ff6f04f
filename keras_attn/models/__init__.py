"""Model builders: the five families, each with the same template
(`XConfig`, `X_PRESETS`, `get_x_config`, `replace_x_config`, `build_x`; see
`keras_attn/models/_config.py`) and its task models.

    from keras_attn.models import build_bert
    model = build_bert("bert_base")

Importing this registers every model class for `keras.saving.load_model`.
The family subpackages (`keras_attn.models.bert`, ...) export the same names
and a few more specialised ones (decoding functions, ViT resizing).
"""

from keras_attn.models import bert
from keras_attn.models import conformer
from keras_attn.models import modernbert
from keras_attn.models import transformer
from keras_attn.models import vit
from keras_attn.models.bert import BERT_PRESETS
from keras_attn.models.bert import BertBackbone
from keras_attn.models.bert import BertConfig
from keras_attn.models.bert import BertMaskedLMHead
from keras_attn.models.bert import BertPretrainer
from keras_attn.models.bert import BertSequenceClassifier
from keras_attn.models.bert import BertTokenClassifier
from keras_attn.models.bert import build_bert
from keras_attn.models.bert import get_bert_config
from keras_attn.models.bert import replace_bert_config
from keras_attn.models.conformer import CONFORMER_PRESETS
from keras_attn.models.conformer import ConformerConfig
from keras_attn.models.conformer import ConformerCTC
from keras_attn.models.conformer import build_conformer
from keras_attn.models.conformer import get_conformer_config
from keras_attn.models.conformer import replace_conformer_config
from keras_attn.models.lora import enable_lora
from keras_attn.models.lora import load_lora_weights
from keras_attn.models.lora import lora_layers
from keras_attn.models.lora import merge_lora
from keras_attn.models.lora import save_lora_weights
from keras_attn.models.modernbert import MODERNBERT_PRESETS
from keras_attn.models.modernbert import ModernBertBackbone
from keras_attn.models.modernbert import ModernBertConfig
from keras_attn.models.modernbert import ModernBertMaskedLM
from keras_attn.models.modernbert import ModernBertMaskedLMHead
from keras_attn.models.modernbert import ModernBertSequenceClassifier
from keras_attn.models.modernbert import build_modernbert
from keras_attn.models.modernbert import get_modernbert_config
from keras_attn.models.modernbert import replace_modernbert_config
from keras_attn.models.parallel import layout_map
from keras_attn.models.transformer import TRANSFORMER_PRESETS
from keras_attn.models.transformer import Transformer
from keras_attn.models.transformer import TransformerConfig
from keras_attn.models.transformer import TransformerTranslator
from keras_attn.models.transformer import build_transformer
from keras_attn.models.transformer import get_transformer_config
from keras_attn.models.transformer import replace_transformer_config
from keras_attn.models.vit import VIT_PRESETS
from keras_attn.models.vit import ViT
from keras_attn.models.vit import ViTConfig
from keras_attn.models.vit import build_vit
from keras_attn.models.vit import get_vit_config
from keras_attn.models.vit import replace_vit_config

__all__ = [
    "BERT_PRESETS",
    "BertBackbone",
    "BertConfig",
    "BertMaskedLMHead",
    "BertPretrainer",
    "BertSequenceClassifier",
    "BertTokenClassifier",
    "CONFORMER_PRESETS",
    "ConformerCTC",
    "ConformerConfig",
    "MODERNBERT_PRESETS",
    "ModernBertBackbone",
    "ModernBertConfig",
    "ModernBertMaskedLM",
    "ModernBertMaskedLMHead",
    "ModernBertSequenceClassifier",
    "TRANSFORMER_PRESETS",
    "Transformer",
    "TransformerConfig",
    "TransformerTranslator",
    "VIT_PRESETS",
    "ViT",
    "ViTConfig",
    "bert",
    "build_bert",
    "build_conformer",
    "build_modernbert",
    "build_transformer",
    "build_vit",
    "conformer",
    "enable_lora",
    "get_bert_config",
    "get_conformer_config",
    "get_modernbert_config",
    "get_transformer_config",
    "get_vit_config",
    "layout_map",
    "load_lora_weights",
    "lora_layers",
    "merge_lora",
    "modernbert",
    "replace_bert_config",
    "replace_conformer_config",
    "replace_modernbert_config",
    "replace_transformer_config",
    "replace_vit_config",
    "save_lora_weights",
    "transformer",
    "vit",
]

# The other packages that register classes, once this one is whole.
from keras_attn._registration import register_all as _register_all  # noqa: E402

_register_all(__name__)
