"""The text family objects (keras_attn.zoo.families): each recipe family's
object says what its recipes take and build, the text tasks' families are
those naming them, a Hugging Face model type finds its family, and a
Hugging Face directory that no family fine-tunes, of another recipe family,
for a task that does not read its tokenizer, or without its tokenizer files
is refused by the recipe key."""

import json

import pytest

from keras_attn.zoo import families
from keras_attn.zoo.tasks import TASKS


def test_the_recipe_families_own_their_inputs_fields_and_tasks():
    bert, modernbert = families.text_family("bert"), families.text_family("modernbert")
    assert bert.inputs == ("token_ids", "segment_ids", "padding_mask")
    assert bert.masked_lm_inputs()[-1] == "mask_positions"
    assert modernbert.inputs == modernbert.masked_lm_inputs() == ("token_ids", "padding_mask")
    assert (bert.next_sentence_prediction, modernbert.next_sentence_prediction) == (True, False)
    # The tasks' families (and the fields they set) are the families' own.
    assert TASKS["text_classification"].family_fields() == {
        "bert": ("vocabulary_size",), "modernbert": ("vocabulary_size", "pad_id")}
    assert TASKS["token_classification"].family_fields() == {"bert": ("vocabulary_size",)}
    assert set(families.recipe_families()) == {"bert", "modernbert"}


def test_a_hugging_face_model_type_finds_its_family():
    # The padding ids are transformers 5's configs' pad_token_id of those
    # model types (read by hand: importing transformers takes seconds).
    kinds = {model_type: (family.recipe_family, family.tokenizer_kind, family.pad_id)
             for model_type in ("bert", "roberta", "xlm-roberta", "modernbert")
             for family in [families.by_model_type(model_type)]}
    assert kinds == {"bert": ("bert", "wordpiece", 0),
                     "roberta": ("bert", "byte_level_bpe", 1),
                     "xlm-roberta": ("bert", "sentencepiece", 1),
                     "modernbert": ("modernbert", "byte_level_bpe", 50283)}
    assert families.by_model_type("gpt2") is None


@pytest.mark.parametrize("model_type, family, task, files, message", [
    ("gpt2", "bert", "text_classification", (),
     r"^Recipe key `training.pretrained` must be a Hugging Face directory of a text family "
     r".*model_type='gpt2'\. Received: training.pretrained="),
    ("roberta", "modernbert", "text_classification", ("tokenizer.json",),
     r"^Recipe key `family` must be 'bert' to fine-tune .*, a Hugging Face RoBERTa directory "
     r".*Received: family='modernbert'$"),
    ("roberta", "bert", "token_classification", ("tokenizer.json",),
     r"^Recipe key `training.pretrained` of a token_classification recipe .* RoBERTa "
     r"directory, whose BPE tokenizer the token_classification task does not read "
     r"\(text_classification does\)\. Received: training.pretrained="),
    ("modernbert", "modernbert", "text_classification", ("vocab.json",),
     r"^Recipe key `training.pretrained` must hold its tokenizer: .* ModernBERT directory "
     r"without tokenizer.json or vocab.json and merges.txt\. Received: training.pretrained="),
])
def test_a_hugging_face_directory_is_read_by_its_family_or_refused(tmp_path, model_type,
                                                                    family, task, files,
                                                                    message):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    for name in files:
        (tmp_path / name).write_text("{}")
    with pytest.raises(ValueError, match=message):
        families.hf_family(str(tmp_path), family, task)
    if model_type == "roberta":  # with a bert text_classification recipe: RoBERTa's
        assert families.hf_family(str(tmp_path), "bert", "text_classification") is \
            families.FAMILIES["roberta"]
