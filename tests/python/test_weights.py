"""quantize_weights against the reference's plain-torch quantization, and import_hf_layer on a
small checkpoint folder written here (safetensors by hand)."""
import json
import struct

import pytest
import torch

import moekit
import reference as ref


@pytest.mark.parametrize("quant", ["fp8-tensor", "fp8-rowwise", "fp8-block"])
@pytest.mark.parametrize("shape", [(3, 256, 384), (2, 200, 130)], ids=["aligned", "partial_blocks"])
def test_quantize_weights_matches_plain_torch(quant, shape, rng):
    w = torch.randn(*shape, generator=rng) * (torch.rand(shape[0], shape[1], 1, generator=rng) + 0.5)
    q, s = moekit.quantize_weights(w, quant)
    q_ref, s_ref = ref.quantize_weights(w, quant)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    q2, s2 = moekit.quantize_fp8_block(w.bfloat16()[0])
    assert q2.shape == shape[1:] and s2.shape == (-(-shape[1] // 128), -(-shape[2] // 128))


_DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float8_e4m3fn: "F8_E4M3"}


def write_safetensors(path, tensors):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((-len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_import_hf_layer_deepseek_fp8(tmp_path, rng):
    E, H, I, layer = 4, 256, 128, 1
    config = {"model_type": "deepseek_v3", "hidden_size": H, "moe_intermediate_size": I, "intermediate_size": 999,
              "n_routed_experts": E, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
              "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
              "norm_topk_prob": True, "num_hidden_layers": 2, "hidden_act": "silu",
              "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    prefix = f"model.layers.{layer}.mlp."
    tensors, masters = {}, {}
    for e in range(E):
        for proj, (n, k) in {"gate_proj": (I, H), "up_proj": (I, H), "down_proj": (H, I)}.items():
            q, s = ref.quantize_weights(torch.randn(1, n, k, generator=rng), "fp8-block")
            tensors[f"{prefix}experts.{e}.{proj}.weight"] = q[0]
            tensors[f"{prefix}experts.{e}.{proj}.weight_scale_inv"] = s[0]
            masters[(e, proj)] = (q[0], s[0])
    tensors[prefix + "gate.weight"] = torch.randn(E, H, generator=rng).bfloat16()
    tensors[prefix + "gate.e_score_correction_bias"] = torch.rand(E, generator=rng)
    write_safetensors(tmp_path / "model.safetensors", tensors)

    d = moekit.import_hf_layer(tmp_path, layer)
    assert d["config"]["routing"] == "sigmoid_bias_grouped" and d["config"]["quant"] == "fp8-block"
    assert d["w13"].dtype == torch.float8_e4m3fn and d["w13"].shape == (E, 2 * I, H)
    gate, up = masters[(1, "gate_proj")], masters[(1, "up_proj")]
    assert torch.equal(d["w13"][1].view(torch.uint8), torch.cat([gate[0], up[0]]).view(torch.uint8))
    assert torch.equal(d["w13_scale"][1], torch.cat([gate[1], up[1]]))
    assert torch.equal(d["w2_scale"][2], masters[(2, "down_proj")][1])
    assert torch.equal(d["gate_weight"], tensors[prefix + "gate.weight"].float())

    layer_ = moekit.MoELayer.from_hf(tmp_path, layer)
    hidden = torch.randn(5, H, generator=rng).bfloat16()
    logits = hidden.float() @ layer_.gate_weight.t()
    assert layer_(hidden, router_logits=logits).shape == (5, H)
