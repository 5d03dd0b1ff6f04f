"""Weights in and out: Hugging Face safetensors directories and keras-hub
models, both ways.

    from keras_attn.convert import load_hf, save_hf
    model = load_hf("path/to/any-supported-directory")  # reads config.json
    save_hf(model, "path/to/out")

    from keras_attn.convert import load_hf_bert_backbone, save_hf_bert
    backbone = load_hf_bert_backbone("path/to/bert-base-uncased")
    save_hf_bert(classifier, "path/to/out", tokenizer=tokenizer)  # BertForSequenceClassification

    from keras_attn.convert import load_hf_tokenizer
    tokenizer = load_hf_tokenizer("path/to/any-text-directory")  # WordPiece, BPE, SentencePiece
"""

from keras_attn.convert._checkpoint import hf_directory_kind  # noqa: F401  (for the zoo's export check)
from keras_attn.convert.bert import bert_config_from_hf
from keras_attn.convert.bert import load_hf_bert
from keras_attn.convert.bert import load_hf_bert_backbone
from keras_attn.convert.bert import load_hf_bert_task
from keras_attn.convert.bert import load_hf_bert_tokenizer
from keras_attn.convert.bert import load_hf_roberta
from keras_attn.convert.bert import load_hf_roberta_tokenizer
from keras_attn.convert.bert import load_hf_xlm_roberta_tokenizer
from keras_attn.convert.bert import save_hf_bert
from keras_attn.convert.bpe import load_hf_bpe_tokenizer
from keras_attn.convert.dinov2 import dinov2_config_from_hf
from keras_attn.convert.dinov2 import load_hf_dinov2
from keras_attn.convert.dinov2 import save_hf_dinov2
from keras_attn.convert.hf import load_hf
from keras_attn.convert.hf import save_hf
from keras_attn.convert.hub import from_keras_hub
from keras_attn.convert.hub import to_keras_hub
from keras_attn.convert.marian import MarianTokenizer
from keras_attn.convert.marian import load_hf_marian
from keras_attn.convert.marian import transformer_config_from_marian
from keras_attn.convert.modernbert import load_hf_modernbert
from keras_attn.convert.modernbert import modernbert_config_from_hf
from keras_attn.convert.modernbert import save_hf_modernbert
from keras_attn.convert.parakeet import load_hf_parakeet
from keras_attn.convert.parakeet import parakeet_config_from_hf
from keras_attn.convert.parakeet import save_hf_parakeet
from keras_attn.convert.tokenizers import load_hf_tokenizer
from keras_attn.convert.vit import load_hf_vit
from keras_attn.convert.vit import save_hf_vit
from keras_attn.convert.vit import vit_config_from_hf

__all__ = [
    "MarianTokenizer",
    "bert_config_from_hf",
    "dinov2_config_from_hf",
    "from_keras_hub",
    "load_hf",
    "load_hf_bert",
    "load_hf_bert_backbone",
    "load_hf_bert_task",
    "load_hf_bert_tokenizer",
    "load_hf_bpe_tokenizer",
    "load_hf_dinov2",
    "load_hf_marian",
    "load_hf_modernbert",
    "load_hf_parakeet",
    "load_hf_roberta",
    "load_hf_roberta_tokenizer",
    "load_hf_tokenizer",
    "load_hf_vit",
    "load_hf_xlm_roberta_tokenizer",
    "save_hf",
    "save_hf_bert",
    "save_hf_dinov2",
    "save_hf_modernbert",
    "save_hf_parakeet",
    "save_hf_vit",
    "modernbert_config_from_hf",
    "parakeet_config_from_hf",
    "to_keras_hub",
    "transformer_config_from_marian",
    "vit_config_from_hf",
]
