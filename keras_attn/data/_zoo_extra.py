"""The packages only the zoo's embedded data sets and BLEU need (synthetic
speech, the numbers translation task, its score): the `zoo` extra of
setup.cfg, imported where they are used, so that `pip install keras-attn`
and every other recipe (`vit_tiny_digits`, the text tasks) go without them.
"""

import importlib

# module name -> (the package that installs it, what needs it)
ZOO_PACKAGES = {
    "espeakng_loader": ("espeakng-loader", "The embedded speech data set (eSpeak NG voices)"),
    "num2words": ("num2words", "The embedded numbers translation task"),
    "sacrebleu": ("sacrebleu", "The BLEU score of a translation"),
}


def import_zoo_package(module):
    """`module` (a key of `ZOO_PACKAGES`) imported, or an ImportError that
    names what needs it and the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        package, needed_by = ZOO_PACKAGES[module]
        raise ImportError(
            f"{needed_by} needs the `{package}` package, which is not installed: "
            f'`pip install "keras-attn[zoo]"` (or `pip install {package}`).',
            name=module,
        ) from error
