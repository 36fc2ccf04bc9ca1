"""moekit.integrations.vllm.MoekitExperts with vLLM's conventions (w1 = [E, 2I, H] with block
weight_scale_inv, global topk_ids with an expert_map for EP), without vLLM installed."""
import types

import pytest
import torch

import reference as ref
from conftest import DEVICES, random_layer, to
from moekit.integrations.vllm import MoekitExperts


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("quant", ["bf16", "fp8-block"])
def test_apply_with_an_expert_map(device, quant, rng):
    E_global, E_local, rank = 16, 8, 1
    w1, w2, s1, s2 = random_layer(rng, experts=E_local, quant=quant)
    quant_config = types.SimpleNamespace(w1_scale=to(device, s1)[0], w2_scale=to(device, s2)[0], a1_scale=None,
                                         a2_scale=None, block_shape=[128, 128] if quant == "fp8-block" else None)
    experts = MoekitExperts(quant_config)
    assert experts.expects_unquantized_inputs and experts.supports_expert_map() and not experts.is_monolithic()
    M, K = 12, 256
    ws13, ws2, out_shape = experts.workspace_shapes(M, w1.shape[1], K, 4, E_global, E_local, None, "silu")
    assert out_shape == (M, K)
    hidden = torch.randn(M, K, generator=rng).bfloat16()
    ids, weights = ref.route(torch.randn(M, E_global, generator=rng), "softmax_topk_renorm", 4)
    expert_map = torch.full((E_global,), -1, dtype=torch.int32)
    expert_map[rank * E_local:(rank + 1) * E_local] = torch.arange(E_local, dtype=torch.int32)
    local = torch.where(ids >= 0, expert_map[ids.long()], ids)
    expected = ref.moe(hidden, local, weights, w1, w2, s1, s2, quant)

    output = torch.empty(out_shape, dtype=torch.bfloat16, device=device)
    w1_device, w2_device = to(device, w1, w2)  # vLLM hands the same weight tensors to every call
    for _ in range(2):  # the second call reuses the prepared layer
        experts.apply(output, hidden.to(device), w1_device, w2_device, weights.to(device), ids.long().to(device),
                      "silu", E_global, expert_map.to(device), None, None, torch.empty(ws13), torch.empty(ws2), None,
                      False)
    assert len(experts._layers) == 1
    assert ref.rel_err(output, expected) <= (5e-3 if quant == "bf16" else 2e-2 if device == "cuda" else 1e-2)
    reduce = experts.finalize_weight_and_reduce_impl()
    assert reduce.apply(output, output, weights, ids, False) is output


def test_refuses_quantized_activations(rng):
    w1, w2, _, _ = random_layer(rng)
    experts = MoekitExperts()
    hidden = torch.randn(2, 256).bfloat16()
    with pytest.raises(ValueError, match="hidden_states"):
        experts.apply(torch.empty(2, 256, dtype=torch.bfloat16), hidden, w1, w2, torch.ones(2, 2),
                      torch.zeros(2, 2, dtype=torch.int32), "silu", 8, None, torch.ones(1), None, None, None, None,
                      False)
    with pytest.raises(ValueError, match="activation"):
        experts.apply(torch.empty(2, 256, dtype=torch.bfloat16), hidden, w1, w2, torch.ones(2, 2),
                      torch.zeros(2, 2, dtype=torch.int32), "tanh", 8, None, None, None, None, None, None, False)
