"""Serving an exported text classifier without TensorFlow or Keras: the
ONNX or LiteRT directory that `export_text_classifier` (or `keras-attn
export RUN_DIR --format onnx`) wrote, run by its runtime
(`portable.Artifact`), its texts tokenized by the `tokenizers` package from
the `tokenizer.json` the export carries and packed as `serving.json` says.
NumPy, onnxruntime (or ai_edge_litert) and tokenizers are all it imports.

    classifier = TextClassifierArtifact("exported/reviews_onnx")
    answer = classifier(["a great film", "dull and far too long"])
    answer["probabilities"]      # (2, K) float32, the Keras model's
    answer["label"]              # ["positive", "negative"] (with class names)
"""

import os

import numpy as np

from keras_attn.export import portable


class TextClassifierArtifact:
    """An exported text classifier, raw strings in (the module docstring).

    Args:
        path: the export directory (ONNX or LiteRT); its files are checked
            against the sha256 in `serving.json` when it loads.
        num_threads: the runtime's intra-op threads (None: its default).

    Attributes:
        labels: the class name of each probability (None if the export has
            none).
        sequence_length: the length every text is packed to (the export's).
    """

    def __init__(self, path, num_threads=None):
        self.artifact = portable.Artifact(path, num_threads=num_threads)
        pre = self.artifact.contract.get("preprocessing") or {}
        file = pre.get("tokenizer_file")
        if not file or not {"start_id", "end_id", "pad_id", "sequence_length"} <= set(pre):
            raise ValueError(
                "Invalid value for argument `path`: a text classifier exported with its "
                "tokenizer.json by export_text_classifier (or `keras-attn export`), whose "
                "serving.json names `tokenizer_file` and the packing ids; an export written "
                "before keras_attn carried tokenizer.json has neither: export the model again "
                f"with this version. Received: path={os.fspath(path)!r}")
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(os.path.join(os.fspath(path), file))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self.sequence_length = int(pre["sequence_length"])
        self._ids = int(pre["start_id"]), int(pre["end_id"]), int(pre["pad_id"])
        self.labels = self.artifact.labels

    def pack(self, texts):
        """The model's inputs for `texts` (a list of strings): `{name: (B,
        sequence_length) int32}`, the ids of the export's own packing
        (start, the text's first `sequence_length - 2` tokens, end, padding)."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts) or not texts:
            raise ValueError("Invalid value for argument `texts`: a non-empty list of strings. "
                             f"Received: texts={texts!r}"[:300])
        start, end, pad = self._ids
        length = self.sequence_length
        token_ids = np.full((len(texts), length), pad, "int32")
        padding_mask = np.zeros((len(texts), length), "int32")
        for row, encoding in enumerate(
                self._tokenizer.encode_batch(list(texts), add_special_tokens=False)):
            ids = [start, *encoding.ids[: length - 2], end]
            token_ids[row, : len(ids)] = ids
            padding_mask[row, : len(ids)] = 1
        inputs = {"token_ids": token_ids, "padding_mask": padding_mask,
                  "segment_ids": np.zeros_like(token_ids)}
        return {name: inputs[name] for name in self.artifact.input_names}

    def __call__(self, texts):
        """`{"probabilities": (B, K) float32, "label": [name, ...]}` for the
        list of strings `texts` ("label" with class names only; "" for a row
        whose probabilities are not finite)."""
        outputs = self.artifact(**self.pack(texts))
        probabilities = np.asarray(outputs["probabilities"])
        answer = {"probabilities": probabilities}
        if self.labels:
            finite = np.isfinite(probabilities).all(axis=-1)
            answer["label"] = [self.labels[int(i)] if ok else ""
                               for i, ok in zip(probabilities.argmax(-1), finite)]
        return answer


# The CJK blocks keras-hub (and BERT's original tokenizer) split on.
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def wordpiece_tokenizer_json(vocabulary, lowercase, strip_accents, suffix_indicator, oov_token):
    """The `tokenizer.json` (text) of a `tokenizers` pipeline that gives
    keras-hub's `WordPieceTokenizer` ids for these settings, step by step
    as keras-hub's `pretokenize` goes: control and format characters are
    delimiters; accents stripped after NFD (where it strips them); full
    Unicode case folding between two NFKC passes (where it lowercases:
    `tf_text.case_fold_utf8`'s NFKC_Casefold; `tokenizers` has no case
    fold, so each character whose fold is not its lowercase is replaced by
    its fold first); split on whitespace, punctuation and CJK characters;
    WordPiece. `export_text_classifier` checks the two agree on its probe
    texts before it writes this (keras-hub counts a word's 100 characters
    in bytes, `tokenizers` in characters: a longer word can differ)."""
    import re
    import sys
    import unicodedata

    from tokenizers import Regex
    from tokenizers import Tokenizer
    from tokenizers import models
    from tokenizers import normalizers
    from tokenizers import pre_tokenizers

    tokenizer = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocabulary)},
                                           unk_token=oov_token,
                                           continuing_subword_prefix=suffix_indicator,
                                           max_input_chars_per_word=100))
    steps = [normalizers.Replace(Regex(r"[\p{Cc}\p{Cf}]"), " ")]
    if strip_accents:
        steps += [normalizers.NFD(), normalizers.StripAccents()]
    if lowercase:
        chars = list(map(chr, range(sys.maxunicode + 1)))
        folds = [char for char in chars if char.casefold() != char.lower()]
        # keras-hub folds each word after the split: a no-break space that
        # NFKC makes a space stays inside its word (which no piece then
        # matches). A private-use character keeps it there here too.
        spaced = "".join(char for char in chars if char not in " \t\n\r\f" and any(
            c in " \t\n\r\f" for c in unicodedata.normalize("NFKC", char)))
        steps += [normalizers.Replace(Regex("[" + re.escape(spaced) + "]"), "\ue000"),
                  normalizers.NFKC(),
                  *(normalizers.Replace(char, char.casefold()) for char in folds),
                  normalizers.Lowercase(), normalizers.NFKC()]
    tokenizer.normalizer = normalizers.Sequence(steps)
    # keras-hub's delimiters: ASCII whitespace only (a no-break space stays
    # inside its word, where `tokenizers`' BertPreTokenizer would split).
    cjk = "".join(f"\\x{{{low:X}}}-\\x{{{high:X}}}" for low, high in _CJK)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[ \t\n\r\f]+"), "removed"),
        pre_tokenizers.Split(Regex(r"[!-/:-@\[-`{-~]|\p{P}|[" + cjk + "]"), "isolated"),
    ])
    return tokenizer.to_str(pretty=True)


__all__ = ["TextClassifierArtifact"]
