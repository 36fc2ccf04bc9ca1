"""MoELayer against the plain-torch reference (reference.py): every quant scheme and activation
with external routing, every routing method and logits dtype with fused routing, on the CPU
backend and (when there is one) the GPU."""
import pytest
import torch

import moekit
import reference as ref
from conftest import DEVICES, random_layer, to

# CPU: the same quantization points as the reference, only the f32 sums' order differs (a GEMM
# output a bf16 ulp apart can move an FP8 code one step). GPU: DESIGN §8's fast accumulation; a
# dynamic scale over the whole tensor or a row moves with its one largest value, and a bf16 ulp
# there moves a few % of the codes under it (core::kDynamicScaleTolerance, src/core/check.h).
TOLERANCE = {"cpu": {"bf16": 5e-3, "fp8": 1e-2}, "cuda": {"bf16": 5e-3, "fp8": 2e-2, "dynamic": 4e-2}}


def tolerance(device, quant):
    if quant == "bf16":
        return TOLERANCE[device]["bf16"]
    if device == "cuda" and quant in ("fp8-tensor", "fp8-rowwise"):
        return TOLERANCE[device]["dynamic"]
    return TOLERANCE[device]["fp8"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ref.ACTIVATIONS)
@pytest.mark.parametrize("quant", ref.QUANTS)
def test_external_routing_matches_the_reference(device, quant, activation, rng):
    w13, w2, s13, s2 = random_layer(rng, quant=quant, activation=activation)
    hidden = torch.randn(19, 256, generator=rng).bfloat16()
    ids, weights = ref.route(torch.randn(19, 8, generator=rng), "softmax_topk_renorm", 2)
    ids[3, 1] = -1  # a slot without an expert contributes nothing
    expected = ref.moe(hidden, ids, weights, w13, w2, s13, s2, quant, activation)

    layer = moekit.MoELayer(*to(device, w13, w2), w13_scale=to(device, s13)[0], w2_scale=to(device, s2)[0],
                            top_k=2, activation=activation, quant=quant)
    assert layer.backend == device
    out = layer(*to(device, hidden), topk_ids=ids.to(device), topk_weights=weights.to(device))
    assert out.dtype == torch.bfloat16 and out.shape == hidden.shape and out.device.type == device
    assert ref.rel_err(out, expected) <= tolerance(device, quant)
    # out= writes in place and gives the same bits.
    again = torch.full_like(out, float("nan"))
    layer(*to(device, hidden), topk_ids=ids.to(device), topk_weights=weights.to(device), out=again)
    assert torch.equal(again.view(torch.int16), out.view(torch.int16))


ROUTING_CASES = [
    dict(routing=m, top_k=1 if m == "top1_sigmoid" else 4, experts=16) for m in ref.ROUTINGS if m != "sigmoid_bias_grouped"
] + [dict(routing="sigmoid_bias_grouped", top_k=4, experts=16, n_group=4, topk_group=2, routed_scaling_factor=2.5)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", ROUTING_CASES, ids=lambda c: c["routing"])
def test_fused_routing_matches_the_reference(device, case, logits_dtype, rng):
    case = dict(case)
    experts = case.pop("experts")
    quant = "fp8-block"
    w13, w2, s13, s2 = random_layer(rng, experts=experts, quant=quant)
    hidden = torch.randn(23, 256, generator=rng).bfloat16()
    logits = torch.randn(23, experts, generator=rng).to(logits_dtype)
    bias = torch.rand(experts, generator=rng) * 0.1 if "bias" in case["routing"] else None
    ids, weights = ref.route(logits, case["routing"], case["top_k"], bias, case.get("n_group", 1),
                             case.get("topk_group", 1), case.get("routed_scaling_factor", 1.0))
    expected = ref.moe(hidden, ids, weights, w13, w2, s13, s2, quant, on_input=case["routing"] == "top1_sigmoid")

    got_ids, got_weights = moekit.route(logits.to(device), top_k=case["top_k"], routing=case["routing"],
                                        bias=None if bias is None else bias.to(device),
                                        n_group=case.get("n_group", 1), topk_group=case.get("topk_group", 1),
                                        routed_scaling_factor=case.get("routed_scaling_factor", 1.0))
    assert torch.equal(got_ids.cpu(), ids)
    torch.testing.assert_close(got_weights.cpu(), weights, rtol=1e-5, atol=1e-6)

    layer = moekit.MoELayer(*to(device, w13, w2), w13_scale=s13.to(device), w2_scale=s2.to(device),
                            e_score_correction_bias=None if bias is None else bias.to(device), **case)
    out = layer(hidden.to(device), router_logits=logits.to(device))
    assert ref.rel_err(out, expected) <= tolerance(device, quant)
    # Fused and external routing are the same layer.
    external = layer(hidden.to(device), topk_ids=got_ids, topk_weights=got_weights)
    assert torch.equal(external.view(torch.int16), out.view(torch.int16))


@pytest.mark.parametrize("device", DEVICES)
def test_zero_tokens_and_int64_ids(device, rng):
    w13, w2, _, _ = random_layer(rng)
    layer = moekit.MoELayer(*to(device, w13, w2), top_k=2)
    empty = layer(torch.empty(0, 256, dtype=torch.bfloat16, device=device),
                  router_logits=torch.empty(0, 8, device=device))
    assert empty.shape == (0, 256)
    hidden = torch.randn(4, 256, generator=rng).bfloat16().to(device)
    ids, weights = ref.route(torch.randn(4, 8, generator=rng), "softmax_topk_renorm", 2)
    a = layer(hidden, topk_ids=ids.to(device), topk_weights=weights.to(device))
    b = layer(hidden, topk_ids=ids.long().to(device), topk_weights=weights.to(device))
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_a_preset_and_keyword_overrides():
    cfg = moekit.preset_config("qwen3-30b-a3b")
    assert (cfg["hidden_size"], cfg["num_experts"], cfg["top_k"], cfg["routing"]) == (2048, 128, 8, "softmax_topk_renorm")
    assert set(moekit.presets()) >= {"deepseek-v3", "qwen3-30b-a3b", "mixtral-8x7b"}
    w13 = torch.zeros(128, 2 * 768, 2048, dtype=torch.bfloat16)
    w2 = torch.zeros(128, 2048, 768, dtype=torch.bfloat16)
    layer = moekit.MoELayer(w13, w2, preset="qwen3-30b-a3b", quant="bf16", top_k=4)
    assert layer.config["top_k"] == 4 and layer.config["quant"] == "bf16" and layer.owned_bytes == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["bf16", "fp8-block bf16 rows", "fp8-block fp8 rows", "fp8-block fp8 rows, C-major scales"])
def test_masked_format_matches_the_reference(device, form, rng):
    quant = "bf16" if form == "bf16" else "fp8-block"
    experts, capacity = 6, 16
    w13, w2, s13, s2 = random_layer(rng, experts=experts, quant=quant)
    hidden = torch.randn(experts, capacity, 256, generator=rng).bfloat16()
    counts = torch.tensor([0, 16, 1, 7, 20, -2], dtype=torch.int32)  # 20 and -2 are clamped
    layer = moekit.MoELayer(*to(device, w13, w2), w13_scale=to(device, s13)[0], w2_scale=to(device, s2)[0],
                            top_k=2, quant=quant)
    rows = hidden if "fp8 rows" not in form else None
    scales = None
    if rows is None:  # the codes and 1x128 scales of moekit's own quantization, as DeepEP sends them
        x = hidden.float().reshape(-1, 128)
        scale = ref.fp8_scale(x.abs().amax(dim=1, keepdim=True))
        rows = ref.to_fp8(x / scale).reshape(hidden.shape)
        scales = scale.reshape(experts, capacity, 2)
        if "C-major" in form:
            scales = scales.transpose(1, 2).contiguous().transpose(1, 2)
    out = layer.forward_masked(*to(device, rows), to(device, counts)[0],
                               hidden_scale=None if scales is None else to(device, scales)[0])
    assert out.shape == hidden.shape and out.dtype == torch.bfloat16
    for e in range(experts):
        n = max(0, min(int(counts[e]), capacity))
        if n == 0:
            continue
        ids = torch.full((n, 2), -1, dtype=torch.int32)
        ids[:, 0] = e
        weights = torch.zeros(n, 2)
        weights[:, 0] = 1.0
        expected = ref.moe(hidden[e, :n], ids, weights, w13, w2, s13, s2, quant)
        assert ref.rel_err(out[e, :n].cpu(), expected) <= tolerance(device, quant), f"expert {e}"
    with pytest.raises(moekit.Error, match="counts"):
        layer.forward_masked(*to(device, rows), to(device, counts[:3])[0],
                             hidden_scale=None if scales is None else to(device, scales)[0])
