"""The zoo's optional packages (setup.cfg's `zoo` extra): where one is not
installed, the function that needs it says which package and which extra."""

import sys

import pytest

from keras_attn.data import scoring
from keras_attn.data import speech
from keras_attn.data import translation

pytestmark = pytest.mark.backend_independent


@pytest.mark.parametrize("module, call", [
    ("sacrebleu", lambda: scoring.evaluate_translations(["1"], ["1"])),
    ("num2words", lambda: translation.number_pairs([3])),
    ("espeakng_loader", lambda: speech._Espeak()),
])
def test_a_missing_zoo_package_names_the_extra(monkeypatch, module, call):
    monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    with pytest.raises(ImportError, match=r'pip install "keras-attn\[zoo\]"') as caught:
        call()
    assert caught.value.name == module
    assert module.replace("_", "-") in str(caught.value)


def test_the_zoo_packages_work_where_installed():
    assert translation.number_pairs([3]) == [("three", "三")]
    assert scoring.evaluate_translations(["1 2"], ["1 2"])["exact_match"] == 1.0
