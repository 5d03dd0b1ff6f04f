"""One call for any Hugging Face directory keras_attn reads or writes.

    from keras_attn.convert import load_hf, save_hf
    model = load_hf("path/to/roberta-sst2")     # a BertSequenceClassifier
    save_hf(model, "path/to/out")               # RobertaForSequenceClassification again

`load_hf` reads `config.json` and hands the directory to the loader of the
architecture it names (`architectures`, else `model_type`); `save_hf`
hands the model to the writer of its family. Both look the family up in
the converters' registry (`_registry.py`: each family file registers its
`Converter`), nowhere else. The loaders and writers of each family
(`load_hf_bert_task`, `load_hf_vit`, `load_hf_marian`, ...) stay, with the
options this one call leaves at their defaults.
"""

import os

from keras_attn.convert._checkpoint import read_config
from keras_attn.convert._registry import architectures
from keras_attn.convert._registry import classifier_arguments
from keras_attn.convert._registry import converter_for_config
from keras_attn.convert._registry import converter_for_model
from keras_attn.convert._registry import converters


def load_hf(directory, num_classes=None, class_names=None):
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

    With `num_classes` (or `class_names`, the name of each class in output
    order: their count is `num_classes`), the family's classifier with the
    checkpoint's encoder: `BertSequenceClassifier` (BERT, RoBERTa, XLM-R),
    `ModernBertSequenceClassifier`, a `ViT` with a head (ViT, DINOv2), from
    any of the family's directories (a base model, a masked LM, a
    classifier). A checkpoint classifier of `num_classes` outputs keeps its
    head and its `id2label` names; `class_names` holding those names in
    another order reorders the head's outputs to match (output i is
    `class_names[i]`), names none of them rename its outputs, and a mix is
    refused (a `ValueError`: a class would be answered under another's
    name); any
    other gets a new head, initialised at random, with a warning, as
    transformers' `from_pretrained(..., num_labels=N,
    ignore_mismatched_sizes=True)`.
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
    converter, what = converter_for_config(read_config(directory))
    if converter is None:
        raise ValueError(
            f"keras_attn cannot map the {what} of {os.path.join(directory, 'config.json')}: "
            f"load_hf reads the architectures {architectures()}. "
            f"Received: directory={directory!r}"
        )
    if num_classes is None and class_names is None:
        return converter.load(directory)
    num_classes, class_names = classifier_arguments(num_classes, class_names)
    if converter.classifier is None:
        takes = sorted(c.name for c in converters() if c.classifier is not None)
        raise ValueError(
            f"Invalid value for argument `num_classes`: the {converter.name} family of "
            f"{directory} has no classifier (load_hf gives one for the families {takes}). "
            f"Received: num_classes={num_classes!r}")
    return converter.classifier(directory, num_classes, class_names)


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
    converter = converter_for_model(model)
    if converter is None:
        models = [m for c in converters() if c.save is not None for m in c.models]
        raise ValueError(
            f"save_hf writes the models {', '.join(models)} (and their subclasses). "
            f"Received: model={type(model).__name__}"
        )
    return converter.save(model, directory, overwrite=overwrite, **kwargs)


__all__ = ["load_hf", "save_hf"]
