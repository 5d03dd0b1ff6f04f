"""Importing public checkpoints (Hugging Face safetensors directories).

    from keras_attn.convert import load_hf_bert_backbone
    backbone = load_hf_bert_backbone("path/to/bert-base-uncased")
"""

from keras_attn.convert.bert import bert_config_from_hf
from keras_attn.convert.bert import load_hf_bert
from keras_attn.convert.bert import load_hf_bert_backbone
from keras_attn.convert.bert import load_hf_bert_tokenizer
from keras_attn.convert.vit import load_hf_vit
from keras_attn.convert.vit import vit_config_from_hf

__all__ = [
    "bert_config_from_hf",
    "load_hf_bert",
    "load_hf_bert_backbone",
    "load_hf_bert_tokenizer",
    "load_hf_vit",
    "vit_config_from_hf",
]
