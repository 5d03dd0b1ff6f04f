"""One call for any Hugging Face directory keras_attn reads or writes.

    from keras_attn.convert import load_hf, save_hf
    model = load_hf("path/to/roberta-sst2")     # a BertSequenceClassifier
    save_hf(model, "path/to/out")               # RobertaForSequenceClassification again

`load_hf` reads `config.json` and hands the directory to the loader of the
architecture it names (`architectures`, else `model_type`); `save_hf`
hands the model to the writer of its family. The loaders and writers of
each family (`load_hf_bert_task`, `load_hf_vit`, `load_hf_marian`, ...)
stay, with the options this one call leaves at their defaults.
"""

import os

from keras_attn.convert._checkpoint import read_config

# `architectures` -> family, the names each family's loader takes.
_BERT = ("BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
         "BertForTokenClassification")
_ROBERTA = ("RobertaModel", "RobertaForMaskedLM", "RobertaForSequenceClassification",
            "RobertaForTokenClassification")
_FAMILIES = {
    **{name: "bert" for name in _BERT + _ROBERTA + tuple("XLM" + n for n in _ROBERTA)},
    "ViTModel": "vit",
    "ViTForImageClassification": "vit",
    "MarianMTModel": "marian",
    "ModernBertModel": "modernbert",
    "ModernBertForMaskedLM": "modernbert",
    "ModernBertForSequenceClassification": "modernbert",
    "Dinov2WithRegistersModel": "dinov2",
    "Dinov2WithRegistersForImageClassification": "dinov2",
    "ParakeetForCTC": "parakeet",
}
# `model_type` -> family, for a config.json without `architectures`.
_MODEL_TYPES = {"bert": "bert", "roberta": "bert", "xlm-roberta": "bert", "vit": "vit",
                "marian": "marian", "modernbert": "modernbert",
                "dinov2_with_registers": "dinov2", "parakeet_ctc": "parakeet"}


def load_hf(directory):
    """The keras_attn model, task head included, of a Hugging Face
    directory (`config.json` and `model.safetensors`, or the shards its
    `model.safetensors.index.json` names: what `save_pretrained` writes;
    with both, `model.safetensors` is read, as by `from_pretrained`).

    | `architectures` in config.json | keras_attn model (loader) |
    |---|---|
    | `BertModel`, `RobertaModel`, `XLMRobertaModel` | `BertBackbone` (`load_hf_bert_task`) |
    | `BertForSequenceClassification`, `RobertaFor...`, `XLMRobertaFor...` | `BertSequenceClassifier` |
    | `BertForTokenClassification`, `RobertaFor...`, `XLMRobertaFor...` | `BertTokenClassifier` |
    | `BertForPreTraining` | `BertPretrainer` |
    | `BertForMaskedLM`, `RobertaForMaskedLM`, `XLMRobertaForMaskedLM` | `BertPretrainer(next_sentence=False)` |
    | `ViTModel`, `ViTForImageClassification` | `ViT` (`load_hf_vit`) |
    | `MarianMTModel` | `Transformer` (`load_hf_marian`; its tokenizer: `MarianTokenizer(directory)`) |
    | `ModernBertModel`, `ModernBertForMaskedLM`, `ModernBertForSequenceClassification` | `ModernBertBackbone`, `ModernBertMaskedLM`, `ModernBertSequenceClassifier` (`load_hf_modernbert`) |
    | `Dinov2WithRegistersModel`, `Dinov2WithRegistersForImageClassification` | `ViT` with registers and LayerScale (`load_hf_dinov2`) |
    | `ParakeetForCTC` | `ConformerCTC` with `subsampling="fast"`: waveforms in with `preprocessor_config.json`, else log-mel features (`load_hf_parakeet`) |

    Without `architectures`, `model_type` picks the family's base model.
    A classifier's `class_names` are the names of `id2label` (None for
    transformers' defaults `LABEL_i`), which `save_hf` writes back.
    Tokenizers are not loaded here: `load_hf_bert_tokenizer(directory)`
    reads BERT's vocabulary, `load_hf_bpe_tokenizer(directory)` a byte-level
    BPE (ModernBERT's `tokenizer.json`, RoBERTa's `vocab.json` and
    `merges.txt`), `load_hf_xlm_roberta_tokenizer(directory)` XLM-R's
    SentencePiece model (`sentencepiece.bpe.model`, or `tokenizer.json`),
    `MarianTokenizer(directory)` Marian's.

    Raises:
        ValueError: an architecture or model type none of these is (named
            with the directory), or what the family's loader refuses (a
            tensor missing, of another shape or left over: nothing is
            assigned then).
    """
    directory = os.fspath(directory)
    config = read_config(directory)
    architectures = config.get("architectures")
    if isinstance(architectures, str):
        architectures = [architectures]
    if architectures:
        architecture = architectures[0]
        family = _FAMILIES.get(architecture)
        what = f"architecture {architecture!r}"
    else:
        family = _MODEL_TYPES.get(config.get("model_type"))
        what = f"model_type {config.get('model_type')!r} (and no 'architectures')"
    if family is None:
        raise ValueError(
            f"keras_attn cannot map the {what} of {os.path.join(directory, 'config.json')}: "
            f"load_hf reads the architectures {sorted(_FAMILIES)}. "
            f"Received: directory={directory!r}"
        )
    if family == "vit":
        from keras_attn.convert.vit import load_hf_vit

        return load_hf_vit(directory)
    if family == "dinov2":
        from keras_attn.convert.dinov2 import load_hf_dinov2

        return load_hf_dinov2(directory)
    if family == "modernbert":
        from keras_attn.convert.modernbert import load_hf_modernbert

        return load_hf_modernbert(directory)
    if family == "parakeet":
        from keras_attn.convert.parakeet import load_hf_parakeet

        return load_hf_parakeet(directory)
    if family == "marian":
        from keras_attn.convert.marian import load_hf_marian

        return load_hf_marian(directory, tokenizer=False)
    from keras_attn.convert.bert import load_hf_bert_task

    return load_hf_bert_task(directory)


def save_hf(model, directory, overwrite=False, **kwargs):
    """Writes a keras_attn model as the Hugging Face directory its class
    maps to (`save_hf_bert` for the BERT family, RoBERTa included;
    `save_hf_modernbert` for ModernBERT; `save_hf_vit` for a ViT,
    `save_hf_dinov2` for a ViT with DINOv2's registers, LayerScale, SwiGLU
    or head; `save_hf_parakeet` for a FastConformer `ConformerCTC`);
    transformers' `from_pretrained` loads it with the same outputs.

    Args:
        model: a `BertBackbone`, `BertSequenceClassifier`,
            `BertTokenClassifier`, `BertPretrainer`, `ModernBertBackbone`,
            `ModernBertMaskedLM`, `ModernBertSequenceClassifier`, `ViT` or a
            `ConformerCTC` that `save_hf_parakeet` writes.
        directory: where to write (atomically).
        overwrite: replace an earlier Hugging Face export there.
        **kwargs: the family writer's own options (`tokenizer=` for BERT;
            `class_names=` for a classifier: the names written as
            `id2label` and `label2id`, by default the model's own
            `class_names`, else `LABEL_i`).

    Returns:
        The absolute path of `directory`.

    Raises:
        ValueError: a model of another kind (a `Transformer`), or what the
            family's writer refuses (a `ConformerCTC` without Parakeet's
            subsampling and front end, ...).
    """
    kind = type(model).__name__
    if kind in ("BertBackbone", "BertSequenceClassifier", "BertTokenClassifier",
                "BertPretrainer"):
        from keras_attn.convert.bert import save_hf_bert

        return save_hf_bert(model, directory, overwrite=overwrite, **kwargs)
    if kind in ("ModernBertBackbone", "ModernBertMaskedLM", "ModernBertSequenceClassifier"):
        from keras_attn.convert.modernbert import save_hf_modernbert

        return save_hf_modernbert(model, directory, overwrite=overwrite, **kwargs)
    if getattr(model, "vit_config", None) is not None:
        from keras_attn.convert.dinov2 import is_dinov2
        from keras_attn.convert.dinov2 import save_hf_dinov2
        from keras_attn.convert.vit import save_hf_vit

        if is_dinov2(model.vit_config):
            return save_hf_dinov2(model, directory, overwrite=overwrite, **kwargs)
        return save_hf_vit(model, directory, overwrite=overwrite, **kwargs)
    if getattr(model, "conformer_config", None) is not None:
        from keras_attn.convert.parakeet import save_hf_parakeet

        return save_hf_parakeet(model, directory, overwrite=overwrite, **kwargs)
    raise ValueError(
        "save_hf writes the BERT family (BertBackbone, BertSequenceClassifier, "
        "BertTokenClassifier, BertPretrainer, RoBERTa included), ModernBERT "
        "(ModernBertBackbone, ModernBertMaskedLM, ModernBertSequenceClassifier), ViT "
        f"models and FastConformer ConformerCTC models. Received: model={kind}"
    )


__all__ = ["load_hf", "save_hf"]
