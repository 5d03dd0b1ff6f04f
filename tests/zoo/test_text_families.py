"""The text family objects (keras_attn.zoo.families): each recipe family's
object says what its recipes take and build, the text tasks' families are
those naming them, a Hugging Face model type finds its family, and a
family that does not read its Hugging Face directories refuses one by the
recipe key."""

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


@pytest.mark.parametrize("name, words", [("roberta", "RoBERTa directory has a BPE"),
                                         ("modernbert", "ModernBERT directory has a BPE")])
def test_a_family_that_does_not_read_its_directories_refuses_one(tmp_path, name, words):
    with pytest.raises(ValueError, match=rf"^Recipe key `training.pretrained` of a "
                                         rf"\w+ recipe must be a masked_lm run .*{words} "
                                         rf"tokenizer.*Received: training.pretrained="):
        families.FAMILIES[name].read_pretrained(str(tmp_path), "hf")
