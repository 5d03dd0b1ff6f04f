"""transformers' Parakeet models for the tests that hold ours against
them: a tiny RNN-T / TDT, weights moved away from their initial values,
and our transducer networks with its decoder's and joint's weights."""

import numpy as np

from keras_attn.layers.transducer import TransducerJoint
from keras_attn.layers.transducer import TransducerPredictor


def hf_transducer(kind, vocabulary, hidden, encoder, max_symbols, durations=(0, 1, 2, 3)):
    """A `ParakeetForRNNT` ("rnnt") or `ParakeetForTDT` ("tdt") of two
    LSTM layers, the blank the last id."""
    import transformers

    common = dict(vocab_size=vocabulary, blank_token_id=vocabulary - 1, pad_token_id=0,
                  decoder_hidden_size=hidden, num_decoder_layers=2, encoder_config=encoder,
                  max_symbols_per_step=max_symbols)
    if kind == "tdt":
        return transformers.ParakeetForTDT(transformers.ParakeetTDTConfig(
            durations=list(durations), **common))
    return transformers.ParakeetForRNNT(transformers.ParakeetRNNTConfig(**common))


def perturb(model, seed, redraw=()):
    """Every tensor of a Parakeet moved off its initial value: BatchNorm
    variances positive (some near 0: the epsilon counts), norm scales near
    1, the tensors under the prefixes `redraw` drawn anew (N(0, 0.5)), the
    others shifted by 0.1 N(0, 1)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith("num_batches_tracked"):
                continue
            noise = torch.randn(tensor.shape, generator=generator)
            if name.endswith("running_var"):
                tensor.copy_(0.01 + noise.abs())
            elif "norm" in name and name.endswith("weight"):
                tensor.copy_(1.0 + 0.2 * noise)
            elif redraw and name.startswith(tuple(redraw)):
                tensor.copy_(0.5 * noise)
            else:
                tensor.add_(0.1 * noise)


def transducer_from_torch(state, vocabulary, hidden, layers, outputs):
    """Our predictor and joint with the weights of a Parakeet decoder and
    joint (a state dict: `embedding.weight`, `lstm.*`, `decoder_projector.*`,
    `head.*`): the LSTM's gates are in the same order (i, f, g, o), its two
    biases summed."""
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
