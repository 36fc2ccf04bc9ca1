"""Shared pieces of the Python tests: the devices to run on (CUDA cases skip without a GPU and a
CUDA build), seeded random layers, and the reference beside this file."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import moekit  # noqa: E402

HAVE_CUDA = torch.cuda.is_available() and "cuda" in moekit.backend_names()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build"))]


@pytest.fixture
def rng():
    """MOEKIT_TEST_SEED when set (CI: scripts/test.sh), else a fresh seed; printed either way."""
    seed = int(os.environ.get("MOEKIT_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"seed {seed}")
    return torch.Generator().manual_seed(seed)


def random_layer(rng, experts=8, hidden=256, inter=128, quant="bf16", activation="silu_and_mul"):
    """f32 master weights, stored per quant by the reference: (w13, w2, w13_scale, w2_scale)."""
    from reference import quantize_weights
    width = inter if activation == "relu2" else 2 * inter
    # Rows of different magnitudes, so that row and block scales differ.
    w13 = torch.randn(experts, width, hidden, generator=rng) * hidden ** -0.5
    w13 *= torch.rand(experts, width, 1, generator=rng) + 0.5
    w2 = torch.randn(experts, hidden, inter, generator=rng) * inter ** -0.5
    w2 *= torch.rand(experts, hidden, 1, generator=rng) + 0.5
    (q13, s13), (q2, s2) = quantize_weights(w13, quant), quantize_weights(w2, quant)
    return q13, q2, s13, s2


def to(device, *tensors):
    return [t.to(device) if t is not None else None for t in tensors]
