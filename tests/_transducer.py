"""Our transducer networks with the weights of transformers' Parakeet
decoder and joint (a state dict: `embedding.weight`, `lstm.*`,
`decoder_projector.*`, `head.*`): the LSTM's gates
are in the same order (i, f, g, o), its two biases summed."""

import numpy as np

from keras_attn.layers.transducer import TransducerJoint
from keras_attn.layers.transducer import TransducerPredictor


def transducer_from_torch(state, vocabulary, hidden, layers, outputs):
    predictor = TransducerPredictor(vocabulary, hidden, num_layers=layers)
    joint = TransducerJoint(outputs)
    predictor(np.zeros((1, 1), "int32"))
    joint(np.zeros((1, 1, hidden), "float32"), np.zeros((1, 1, hidden), "float32"))
    state = {k: v.detach().numpy() for k, v in state.items()}
    predictor.embedding.embeddings.assign(state["embedding.weight"])
    for i, lstm in enumerate(predictor.lstm_layers):
        lstm.cell.kernel.assign(state[f"lstm.weight_ih_l{i}"].T)
        lstm.cell.recurrent_kernel.assign(state[f"lstm.weight_hh_l{i}"].T)
        lstm.cell.bias.assign(state[f"lstm.bias_ih_l{i}"] + state[f"lstm.bias_hh_l{i}"])
    predictor.projection.kernel.assign(state["decoder_projector.weight"].T)
    predictor.projection.bias.assign(state["decoder_projector.bias"])
    joint.head.kernel.assign(state["head.weight"].T)
    joint.head.bias.assign(state["head.bias"])
    return predictor, joint
