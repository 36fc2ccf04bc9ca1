"""Weight helpers: moekit's FP8 weight quantization and the Hugging Face layer import."""
import torch

from . import _C

_SCALE_SHAPES = {
    "fp8-tensor": lambda e, n, k: (e,),
    "fp8-rowwise": lambda e, n, k: (e, n),
    "fp8-block": lambda e, n, k: (e, -(-n // 128), -(-k // 128)),
}


def quantize_weights(w, quant="fp8-block", scale_format="f32"):
    """(q float8_e4m3fn, scales float32) of weights w [E, N, K] (or [N, K]) for an FP8 scheme, as
    DESIGN §4 stores them (scales multiply: a checkpoint's weight_scale_inv for fp8-block). Computed
    by moekit on the host; the results are on w's device."""
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"w: expected a torch.Tensor, given {type(w).__name__}")
    if quant not in _SCALE_SHAPES:
        raise _C.Error(f"quant: expected {'|'.join(_SCALE_SHAPES)}, given '{quant}'")
    squeeze = w.dim() == 2
    host = (w.unsqueeze(0) if squeeze else w).detach().to("cpu").contiguous()
    if host.dtype not in (torch.float32, torch.bfloat16):
        host = host.float()
    if host.dim() != 3:
        raise _C.Error(f"w: expected [E, N, K] or [N, K], given {list(w.shape)}")
    q = torch.empty(host.shape, dtype=torch.float8_e4m3fn)
    scales = torch.empty(_SCALE_SHAPES[quant](*host.shape), dtype=torch.float32)
    _C.quantize_weights(quant, scale_format, host, q, scales)
    if squeeze:
        q, scales = q[0], scales[0] if quant != "fp8-tensor" else scales
    return q.to(w.device), scales.to(w.device)


def quantize_fp8_block(w, scale_format="f32"):
    """quantize_weights(w, "fp8-block"): 128x128 blocks, scales [E, ceil(N/128), ceil(K/128)]."""
    return quantize_weights(w, "fp8-block", scale_format)


def import_hf_layer(folder, layer, *, ep_size=1, ep_rank=0, shared_experts=0, device="cpu"):
    """One MoE layer of a Hugging Face checkpoint folder (config.json + safetensors), read by moekit:
    {"config": dict, "w13", "w2" (bf16 or float8_e4m3fn), "w13_scale", "w2_scale" (fp8-block),
    "e_score_correction_bias", "gate_weight" (the router [E, H] float32)}; only this rank's experts.
    shared_experts: config.json's n_shared_experts to fuse DeepSeek's shared experts (after the routed
    ones in w13/w2 and their scales), or 0."""
    d = _C.import_hf_layer(str(folder), layer, ep_size, ep_rank, shared_experts)
    fp8 = d["config"]["quant"] != "bf16"
    for name in ("w13", "w2"):
        if fp8:
            d[name] = d[name].view(torch.float8_e4m3fn)
    for name, t in d.items():
        if isinstance(t, torch.Tensor):
            d[name] = t.to(device)
    return d
