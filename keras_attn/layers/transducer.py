"""The two networks a transducer adds to an encoder (Graves, 2012): the
prediction network, a language model over the labels emitted so far, and
the joint network that scores every (frame, label count) pair. Parakeet's
RNN-T and TDT design (transformers' `ParakeetRNNTDecoder` and
`ParakeetRNNTJointNetwork`): an embedding, LSTM layers and a projection;
`head(activation(encoder + prediction))`. The losses over the joint's
lattice: `keras_attn.training.rnnt_loss` and `tdt_loss`."""

import keras
from keras import ops

from keras_attn._checks import check_positive_int


@keras.saving.register_keras_serializable(package="keras_attn")
class TransducerPredictor(keras.layers.Layer):
    """The prediction network: token ids -> `(B, U, hidden_dim)`.

    Token ids are embedded, run through `num_layers` LSTM layers of
    `hidden_dim` units and projected (a Dense of `hidden_dim`). Training
    feeds the blank followed by the transcript (the start symbol is the
    blank, as in Parakeet): output u predicts from the first u labels, as
    the joint's lattice position u needs. Decoding feeds one token at a
    time with the states of the step before (`return_states=True`, as
    `keras.layers.LSTM(return_state=True)`).

    The LSTM is causal: a position's output depends on the ids before it
    only, so the padding after a transcript changes none of its outputs.
    Ids must be in `[0, vocabulary_size)`: the model that owns the layer
    checks them (an embedding lookup past its table is an error on one
    backend and a clamped row on another).

    Args:
        vocabulary_size: the ids, the blank among them.
        hidden_dim: the embedding, LSTM and output width.
        num_layers: LSTM layers.
        return_states: also return each layer's final `h` and `c`.
        **kwargs: base layer arguments.

    Call arguments:
        token_ids: `(B, U)` int ids.
        states: None (zeros: the start), or the states a call returned:
            `[h_0, c_0, h_1, c_1, ...]`, each `(B, hidden_dim)`.

    Returns:
        `(B, U, hidden_dim)`; with `return_states`, `[outputs, h_0, c_0,
        h_1, c_1, ...]`.

    Example:

    >>> import numpy as np
    >>> predictor = TransducerPredictor(vocabulary_size=8, hidden_dim=4, num_layers=2,
    ...                                 return_states=True)
    >>> outputs, *states = predictor(np.array([[7, 1, 2]]))
    >>> tuple(outputs.shape), len(states), tuple(states[0].shape)
    ((1, 3, 4), 4, (1, 4))
    """

    def __init__(self, vocabulary_size, hidden_dim, num_layers=1, return_states=False,
                 **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_size = check_positive_int("vocabulary_size", vocabulary_size)
        self.hidden_dim = check_positive_int("hidden_dim", hidden_dim)
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.return_states = bool(return_states)
        self.embedding = keras.layers.Embedding(vocabulary_size, hidden_dim, dtype=self.dtype_policy,
                                                name="embedding")
        self.lstm_layers = [keras.layers.LSTM(hidden_dim, return_sequences=True, return_state=True,
                                              dtype=self.dtype_policy, name=f"lstm_{i}")
                            for i in range(num_layers)]
        self.projection = keras.layers.Dense(hidden_dim, dtype=self.dtype_policy,
                                             name="projection")

    def build(self, token_ids_shape, states_shape=None):
        self.embedding.build(token_ids_shape)
        shape = tuple(token_ids_shape) + (self.hidden_dim,)
        for lstm in self.lstm_layers:
            lstm.build(shape)
        self.projection.build(shape)
        self.built = True

    def call(self, token_ids, states=None):
        x, new_states = self._run(token_ids, states)
        return [x, *new_states] if self.return_states else x

    def step(self, token_ids, states=None):
        """One token per row, for decoding: `(B,)` ids and the states of
        the step before (None: the start) -> `(outputs (B, hidden_dim),
        states)`, whatever `return_states` says."""
        token_ids = ops.convert_to_tensor(token_ids)
        if not self.built:
            self.build(tuple(token_ids.shape) + (1,))
        if states is not None and len(states) != 2 * self.num_layers:
            raise ValueError(
                f"Invalid value for argument `states`: [h, c] for each of the {self.num_layers} "
                f"LSTM layers, {2 * self.num_layers} tensors. Received: {len(states)} tensors")
        x = self.embedding(ops.cast(token_ids, "int32"))  # (B, hidden_dim)
        if states is None:  # the LSTM layers' own start: zeros
            zeros = ops.zeros_like(x)
            states = [zeros] * (2 * self.num_layers)
        # Each LSTM's cell on the one step, as the layer runs it at each
        # position: no loop over a sequence of one (on TensorFlow that loop
        # is a TensorList, which LiteRT's builtins cannot hold).
        new_states = []
        for i, lstm in enumerate(self.lstm_layers):
            x, (h, c) = lstm.cell(x, list(states[2 * i:2 * i + 2]))
            new_states += [h, c]
        return self.projection(x), new_states

    def _run(self, token_ids, states):
        if states is not None and len(states) != 2 * self.num_layers:
            raise ValueError(
                f"Invalid value for argument `states`: [h, c] for each of the {self.num_layers} "
                f"LSTM layers, {2 * self.num_layers} tensors. Received: {len(states)} tensors")
        x = self.embedding(ops.cast(token_ids, "int32"))
        new_states = []
        for i, lstm in enumerate(self.lstm_layers):
            x, h, c = lstm(x, initial_state=None if states is None else list(states[2 * i:2 * i + 2]))
            new_states += [h, c]
        return self.projection(x), new_states

    def compute_output_shape(self, token_ids_shape, states_shape=None):
        outputs = (token_ids_shape[0], token_ids_shape[1], self.hidden_dim)
        if not self.return_states:
            return outputs
        return [outputs] + [(token_ids_shape[0], self.hidden_dim)] * (2 * self.num_layers)

    def get_config(self):
        config = super().get_config()
        config.update(vocabulary_size=self.vocabulary_size, hidden_dim=self.hidden_dim,
                      num_layers=self.num_layers, return_states=self.return_states)
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
class TransducerJoint(keras.layers.Layer):
    """The joint network: encoder frames `(B, T, D)` and prediction
    outputs `(B, U, D)` -> logits `(B, T, U, outputs)`, each
    `head(activation(encoder[t] + prediction[u]))` (both already of the
    joint's width: project the encoder first).

    Args:
        outputs: the logits of each pair: the vocabulary (blank included),
            plus the number of durations for a TDT joint (its last
            `len(durations)` logits, as transformers' `ParakeetTDTJointNetwork`).
        activation: applied to the sum (Parakeet: "relu").
        **kwargs: base layer arguments.

    Example:

    >>> import numpy as np
    >>> joint = TransducerJoint(outputs=6)
    >>> tuple(joint(np.ones((2, 5, 4), "float32"), np.ones((2, 3, 4), "float32")).shape)
    (2, 5, 3, 6)
    """

    def __init__(self, outputs, activation="relu", **kwargs):
        super().__init__(**kwargs)
        self.outputs = check_positive_int("outputs", outputs)
        self.activation = keras.activations.get(activation)
        self.head = keras.layers.Dense(outputs, dtype=self.dtype_policy, name="head")

    def build(self, encoder_shape, prediction_shape):
        if encoder_shape[-1] != prediction_shape[-1]:
            raise ValueError(
                "The encoder frames and the prediction outputs must have the joint's width (project "
                f"the encoder first). Received: encoder.shape={tuple(encoder_shape)}, "
                f"prediction.shape={tuple(prediction_shape)}")
        self.head.build(tuple(encoder_shape[:-1]) + (encoder_shape[-1],))
        self.built = True

    def call(self, encoder, prediction):
        return self.head(self.activation(encoder[:, :, None, :] + prediction[:, None, :, :]))

    def compute_output_shape(self, encoder_shape, prediction_shape):
        return (encoder_shape[0], encoder_shape[1], prediction_shape[1], self.outputs)

    def get_config(self):
        config = super().get_config()
        config.update(outputs=self.outputs,
                      activation=keras.activations.serialize(self.activation))
        return config
