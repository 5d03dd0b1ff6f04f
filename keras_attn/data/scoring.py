"""Scores of decoded text, and WordPiece ids back to text, with no
TensorFlow: the translation task's BLEU where TensorFlow is not installed
(training from prepared data, `keras_attn.zoo.prepared`)."""

import numpy as np

from keras_attn.data._zoo_extra import import_zoo_package

# The translation data's special ids: its vocabularies start with
# keras_attn.data.translation.SPECIAL_TOKENS, "[PAD]", "[START]", "[END]".
PAD_ID, START_ID, END_ID = 0, 1, 2


def evaluate_translations(hypotheses, references, tokenize="13a"):
    """Corpus BLEU (sacrebleu's standard settings: 4-grams, brevity penalty,
    exponential smoothing; `tokenize` as sacrebleu's) and exact match.

    For Japanese use `tokenize="char"` (sacrebleu's own recommendation is
    "ja-mecab", which needs MeCab; numerals are single characters, so
    character n-grams are the natural unit here).

    Returns:
        `{"bleu": 0..100, "exact_match": 0..1}`.
    """
    sacrebleu = import_zoo_package("sacrebleu")

    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references) or not references:
        raise ValueError(
            "Need as many hypotheses as references, at least one. Received: "
            f"len(hypotheses)={len(hypotheses)}, len(references)={len(references)}"
        )
    bleu = sacrebleu.corpus_bleu(hypotheses, [references], tokenize=tokenize)
    exact = np.mean([h.strip() == r.strip() for h, r in zip(hypotheses, references)])
    return {"bleu": float(bleu.score), "exact_match": float(exact)}


def join_wordpieces(tokens, suffix_indicator="##"):
    """WordPiece tokens -> text as keras-hub's `WordPieceTokenizer.detokenize`
    joins them: a token starting with `suffix_indicator` (and longer than it)
    joins the word before it, other tokens are joined with spaces.

    Written here because keras-hub cannot be installed without TensorFlow
    (it requires tensorflow-text); tests/zoo/test_prepared.py checks it
    against keras-hub on the translation task's texts."""
    words = []
    for index, token in enumerate(tokens):
        if index and len(token) > len(suffix_indicator) and token.startswith(suffix_indicator):
            words[-1] += token[len(suffix_indicator):]
        else:
            words.append(token)
    return " ".join(words)


def detokenize_ids(ids, vocabulary, join_characters=False):
    """Token ids `(B, L)` -> strings, as `keras_attn.data.translation.detokenize`
    with the keras-hub tokenizer of `vocabulary`: cut at `[END]`, padding and
    `[START]` dropped; `join_characters` removes the spaces (Japanese)."""
    texts = []
    for row in np.asarray(ids):
        row = [int(t) for t in row]
        if END_ID in row:
            row = row[: row.index(END_ID)]
        text = join_wordpieces([vocabulary[t] for t in row if t not in (PAD_ID, START_ID)])
        texts.append(text.replace(" ", "") if join_characters else text)
    return texts


def edit_distance_rate(references, hypotheses, split=str.split):
    """Corpus error rate: the edits (insertions, deletions, substitutions)
    turning each hypothesis into its reference, summed, over the reference
    tokens summed; `split` makes the tokens (words: `str.split`; characters:
    `list`). keras-hub's `EditDistance` metric computes this (the WER of
    `keras_attn.data.speech`) but needs TensorFlow; tests/zoo/test_prepared.py
    checks the two agree."""
    if len(references) != len(hypotheses):
        raise ValueError(
            "Need one hypothesis per reference. Received: "
            f"{len(references)} references, {len(hypotheses)} hypotheses"
        )
    edits = tokens = 0
    for reference, hypothesis in zip(references, hypotheses):
        reference, hypothesis = split(reference), split(hypothesis)
        row = list(range(len(hypothesis) + 1))  # Levenshtein, one row at a time
        for i, wanted in enumerate(reference, 1):
            previous, row[0] = row[0], i
            for j, got in enumerate(hypothesis, 1):
                previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1,
                                               previous + (wanted != got))
        edits += row[-1]
        tokens += len(reference)
    # In float32, as keras-hub's metric divides: the two paths (tf.data and
    # prepared files) report the same number, not two roundings of it.
    return float(np.float32(edits) / np.float32(tokens)) if tokens else 0.0
