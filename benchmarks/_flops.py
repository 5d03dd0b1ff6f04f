"""FLOP counts and device peaks for the GPU benchmark's utilisation figures."""

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from NVIDIA's data
# sheets: H100 SXM5 and H200 989.4, H100 PCIe 756.5, H100 NVL 835.5,
# A100 312. Matched against `device_kind` / `torch.cuda.get_device_name()`.
_BF16_PEAKS = (
    ("h100 pcie", 756.5e12),
    ("h100 nvl", 835.5e12),
    ("h100", 989.4e12),
    ("h200", 989.4e12),
    ("a100", 312e12),
)


def dense_bf16_peak(device_name):
    """The dense bf16 peak FLOP/s of a device named like "NVIDIA H100 80GB
    HBM3", or None where it is not known (a CPU, say).

    >>> dense_bf16_peak("NVIDIA H100 80GB HBM3") / 1e12
    989.4
    >>> dense_bf16_peak("cpu") is None
    True
    """
    name = str(device_name).lower()
    for key, peak in _BF16_PEAKS:
        if key in name:
            return peak
    return None


def transformer_flops_per_token(parameters, layers, width, length):
    """Training FLOPs per token, 6 N + 12 L d T: 6 N for the forward and
    backward matrix products of N parameters, plus 12 L d T for the
    attention scores and their weighted sum over T positions in L layers
    of width d (Chowdhery et al. 2022, "PaLM", appendix B).

    >>> transformer_flops_per_token(110_000_000, 12, 768, 128)
    674155776
    """
    for name, value in (("parameters", parameters), ("layers", layers),
                        ("width", width), ("length", length)):
        if value <= 0:
            raise ValueError(f"`{name}` must be positive. Received: {name}={value!r}")
    return 6 * parameters + 12 * layers * width * length


def attention_flops(batch, heads, length, head_dim, causal=False, backward=False):
    """FLOPs of one attention op over (batch, length, heads, head_dim)
    queries, keys and values: 4 B N T^2 H forward (Q K^T and P V), half of
    it when causal, and 2.5 times the forward for the backward pass, so
    3.5 times for both (the convention of the FlashAttention benchmarks).

    >>> attention_flops(2, 16, 8192, 64) == 4 * 2 * 16 * 8192**2 * 64
    True
    >>> attention_flops(1, 1, 4, 2, causal=True, backward=True)
    224.0
    """
    forward = 4 * batch * heads * length**2 * head_dim
    if causal:
        forward = forward / 2
    return forward * 3.5 if backward else forward


def cpu_matmul_peak(threads, size=2048, repeats=5):
    """The float32 FLOP/s a `size` x `size` matrix product reaches on this
    machine with `threads` BLAS threads (NumPy's BLAS, limited by
    threadpoolctl; the best of `repeats`): the ceiling a dense model's
    row can reach at that many threads (`_stats.checked_row`)."""
    import time

    import numpy as np
    from threadpoolctl import threadpool_limits

    a = np.random.default_rng(0).random((size, size), dtype="float32")
    with threadpool_limits(limits=threads, user_api="blas"):
        a @ a
        best = min(_timed(lambda: a @ a, time) for _ in range(repeats))
    return 2 * size**3 / best


def _timed(fn, time):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
