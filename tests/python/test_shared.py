"""MoELayer with shared experts (DeepSeek-V3's: every token runs them besides its routed ones),
against the plain-torch reference of the same math: each token's routing with the shared experts
appended (weight 1, or the model's), over the routed and shared weights together."""
import pytest
import torch

import moekit
import reference as ref
from conftest import DEVICES, random_layer, to
from test_layer import tolerance


def shared_reference(hidden, ids, weights, routed, shared, quant, weight=1.0):
    """The layer's output by the reference: the shared experts as experts E.. of every token."""
    experts, count = routed[0].shape[0], shared[0].shape[0]
    tokens = hidden.shape[0]
    ids = torch.cat([ids, torch.arange(experts, experts + count, dtype=ids.dtype).expand(tokens, count)], dim=1)
    weights = torch.cat([weights, torch.full((tokens, count), weight)], dim=1)
    both = [None if r is None else torch.cat([r, s]) for r, s in zip(routed, shared)]
    return ref.moe(hidden, ids, weights, *both, quant)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("quant", ["bf16", "fp8-rowwise", "fp8-block"])
@pytest.mark.parametrize("count", [1, 2])
def test_shared_experts_match_the_reference(device, quant, count, rng):
    routed = random_layer(rng, experts=8, quant=quant)
    shared = random_layer(rng, experts=count, quant=quant)
    hidden = torch.randn(21, 256, generator=rng).bfloat16()
    logits = torch.randn(21, 8, generator=rng)
    bias = torch.rand(8, generator=rng) * 0.1
    routing = dict(routing="sigmoid_bias_grouped", top_k=2, n_group=4, topk_group=2, routed_scaling_factor=2.5)
    ids, weights = ref.route(logits, routing["routing"], 2, bias, 4, 2, 2.5)
    weight = 1.0 if count == 1 else 0.5
    expected = shared_reference(hidden, ids, weights, routed, shared, quant, weight)

    w13, w2, s13, s2 = to(device, *routed)
    extra = dict(zip(("w13", "w2", "w13_scale", "w2_scale"), to(device, *shared)))
    if quant == "bf16":
        extra = {k: v for k, v in extra.items() if v is not None}
    layer = moekit.MoELayer(w13, w2, w13_scale=s13, w2_scale=s2, e_score_correction_bias=bias.to(device),
                            shared_experts=extra, shared_expert_weight=weight, **routing)
    assert layer.config["shared_experts"] == count and layer.config["num_experts"] == 8
    out = layer(hidden.to(device), router_logits=logits.to(device))
    assert ref.rel_err(out, expected) <= tolerance(device, quant)
    external = layer(hidden.to(device), topk_ids=ids.to(device), topk_weights=weights.to(device))
    assert torch.equal(external.view(torch.int16), out.view(torch.int16))

    # w13/w2 that already hold the shared experts (an engine's layout): borrowed, the same bits.
    held = {k: torch.cat([v, extra[k]]) for k, v in (("w13", w13), ("w2", w2), ("w13_scale", s13), ("w2_scale", s2))
            if v is not None}
    same = moekit.MoELayer(held.pop("w13"), held.pop("w2"), **held, e_score_correction_bias=bias.to(device),
                           shared_experts=count, shared_expert_weight=weight, **routing)
    again = same(hidden.to(device), router_logits=logits.to(device))
    assert torch.equal(again.view(torch.int16), out.view(torch.int16))


def test_shared_experts_arguments_are_checked(rng):
    w13, w2, s13, s2 = random_layer(rng, experts=4, quant="fp8-block")
    sw13, sw2, ss13, ss2 = random_layer(rng, experts=1, quant="fp8-block")
    with pytest.raises(TypeError, match="shared_experts"):
        moekit.MoELayer(w13, w2, w13_scale=s13, w2_scale=s2, shared_experts=[sw13, sw2])
    with pytest.raises(moekit.Error, match="shared_experts: 'w13_scale' given for the routed experts only"):
        moekit.MoELayer(w13, w2, w13_scale=s13, w2_scale=s2, shared_experts={"w13": sw13, "w2": sw2})
    with pytest.raises(moekit.Error, match="shared_experts: 'w2' expected"):
        moekit.MoELayer(w13, w2, w13_scale=s13, w2_scale=s2,
                        shared_experts={"w13": sw13, "w2": sw2.float(), "w13_scale": ss13, "w2_scale": ss2})
    with pytest.raises(moekit.Error, match="shared_experts: unknown tensor 'bias'"):
        moekit.MoELayer(w13, w2, w13_scale=s13, w2_scale=s2, shared_experts={"w13": sw13, "bias": ss2})
    # Counted but not held: w13 has the routed experts alone.
    with pytest.raises(moekit.Error, match="w13: expected"):
        moekit.MoELayer(w13, w2, w13_scale=s13, w2_scale=s2, num_experts=4, shared_experts=1)
