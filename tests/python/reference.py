"""A plain-torch MoE written for the tests: DESIGN §3 routing, §4 quantization, §5 activations,
with moekit's quantization points (hidden and activations quantized per scheme, GEMM outputs
rounded to bf16, the weighted sum in f32). Slow and obvious on purpose."""
import torch

FP8_MAX = torch.tensor(448.0)
ROUTINGS = ["softmax_topk", "topk_softmax", "softmax_topk_renorm", "sigmoid_topk", "sigmoid_topk_renorm",
            "sigmoid_bias_grouped", "sigmoid_bias_renorm", "top1_sigmoid"]
QUANTS = ["bf16", "fp8-tensor", "fp8-rowwise", "fp8-block"]
ACTIVATIONS = ["silu_and_mul", "gelu_and_mul", "swiglu_oai", "relu2"]


def fp8_scale(amax):
    return torch.clamp(amax.float(), min=1e-10) / FP8_MAX  # IEEE division (DESIGN §4)


def to_fp8(x):
    return torch.clamp(x, -448.0, 448.0).to(torch.float8_e4m3fn)


def group_amax(x, quant):
    """The amax of each scale group of x [M, K], broadcastable to x."""
    a = x.abs()
    if quant == "fp8-tensor":
        return a.max().reshape(1, 1) if a.numel() else torch.zeros(1, 1)
    if quant == "fp8-rowwise":
        return a.amax(dim=1, keepdim=True)
    m, k = x.shape
    pad = (-k) % 128
    blocks = torch.nn.functional.pad(a, (0, pad)).reshape(m, -1, 128).amax(dim=2)
    return blocks.repeat_interleave(128, dim=1)[:, :k]


def quantize_dequantize(x, quant):
    """x [M, K] f32 through the activation quantization of `quant`, back to f32."""
    if quant == "bf16":
        return x.bfloat16().float()
    scale = fp8_scale(group_amax(x, quant))
    return to_fp8(x / scale).float() * scale


def dequantize_weights(w, scale, quant):
    """[E, N, K] real values from the stored weights and their multiplying scales."""
    if quant == "bf16":
        return w.float()
    q = w.float()
    if quant == "fp8-tensor":
        return q * scale.reshape(-1, 1, 1)
    if quant == "fp8-rowwise":
        return q * scale.unsqueeze(2)
    n, k = w.shape[1:]
    return q * scale.repeat_interleave(128, 1)[:, :n].repeat_interleave(128, 2)[:, :, :k]


def quantize_weights(w, quant):
    """(stored weights, scales) of f32 weights [E, N, K], by plain torch."""
    if quant == "bf16":
        return w.bfloat16(), None
    e, n, k = w.shape
    if quant == "fp8-tensor":
        scale = fp8_scale(w.abs().reshape(e, -1).amax(dim=1))
        return to_fp8(w / scale.reshape(-1, 1, 1)), scale
    if quant == "fp8-rowwise":
        scale = fp8_scale(w.abs().amax(dim=2))
        return to_fp8(w / scale.unsqueeze(2)), scale
    pn, pk = (-n) % 128, (-k) % 128
    blocks = torch.nn.functional.pad(w.abs(), (0, pk, 0, pn)).reshape(e, (n + pn) // 128, 128, (k + pk) // 128, 128)
    scale = fp8_scale(blocks.amax(dim=(2, 4)))
    full = scale.repeat_interleave(128, 1)[:, :n].repeat_interleave(128, 2)[:, :, :k]
    return to_fp8(w / full), scale


def top(x, k):
    """(values, indices) of the k largest along dim 1, ties to the lower index (DESIGN §3)."""
    values, indices = torch.sort(x, dim=1, descending=True, stable=True)
    return values[:, :k], indices[:, :k]


def route(logits, method, top_k, bias=None, n_group=1, topk_group=1, factor=1.0):
    """(ids [T, k] int32, weights [T, k] f32) by DESIGN §3."""
    x = logits.float()
    if method in ("softmax_topk", "softmax_topk_renorm"):
        p = torch.softmax(x, dim=1)
        w, ids = top(p, top_k)
        if method.endswith("renorm"):
            w = w / w.sum(dim=1, keepdim=True)
    elif method == "topk_softmax":
        v, ids = top(x, top_k)
        w = torch.softmax(v, dim=1)
    elif method in ("sigmoid_topk", "sigmoid_topk_renorm"):
        s = torch.sigmoid(x)
        w, ids = top(s, top_k)
        if method.endswith("renorm"):
            w = w / w.sum(dim=1, keepdim=True)
    elif method == "sigmoid_bias_grouped":
        s = torch.sigmoid(x)
        biased = s + bias.float()
        t, e = x.shape
        groups = biased.reshape(t, n_group, e // n_group).topk(2, dim=2).values.sum(dim=2)
        keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, top(groups, topk_group)[1], True)
        masked = biased.masked_fill(~keep.repeat_interleave(e // n_group, dim=1), float("-inf"))
        ids = top(masked, top_k)[1]
        w = s.gather(1, ids)
        w = w / w.sum(dim=1, keepdim=True) * factor
    elif method == "sigmoid_bias_renorm":
        s = torch.sigmoid(x)
        ids = top(s + bias.float(), top_k)[1]
        w = s.gather(1, ids)
        w = w / w.sum(dim=1, keepdim=True) * factor
    elif method == "top1_sigmoid":
        v, ids = top(x, 1)
        w = torch.sigmoid(v)
    else:
        raise ValueError(method)
    if method not in ("sigmoid_bias_grouped", "sigmoid_bias_renorm"):  # moekit scales every method's weights
        w = w * factor
    return ids.to(torch.int32), w.float()


def activate(h, activation, alpha=1.702, limit=7.0):
    if activation == "relu2":
        return torch.relu(h) ** 2
    gate, up = h.chunk(2, dim=-1)
    if activation == "silu_and_mul":
        return torch.nn.functional.silu(gate) * up
    if activation == "gelu_and_mul":
        return torch.nn.functional.gelu(gate) * up
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return gate * torch.sigmoid(alpha * gate) * (up + 1)


def moe(hidden, ids, weights, w13, w2, w13_scale, w2_scale, quant, activation="silu_and_mul", on_input=False):
    """out [T, H] bf16 of the experts for routing (ids, weights), everything on the CPU in f32."""
    x = hidden.float()
    if on_input:  # Llama-4: the bf16 row times its weight, before quantization
        x = (x * weights[:, :1]).bfloat16().float()
        weights = torch.ones_like(weights)
    xq = quantize_dequantize(x, quant)
    wd13, wd2 = dequantize_weights(w13, w13_scale, quant), dequantize_weights(w2, w2_scale, quant)
    tokens, slots = torch.nonzero(ids >= 0, as_tuple=True)
    experts = ids[tokens, slots].long()
    h1 = torch.einsum("sk,snk->sn", xq[tokens], wd13[experts]).bfloat16().float()
    a = quantize_dequantize(activate(h1, activation), quant)
    y = torch.einsum("sk,snk->sn", a, wd2[experts]).bfloat16().float()
    out = torch.zeros_like(x)
    for s in range(ids.shape[1]):  # the slots in order, as moekit's finalize adds them
        chosen = slots == s
        out.index_add_(0, tokens[chosen], y[chosen] * weights[tokens[chosen], s].unsqueeze(1))
    return out.bfloat16()


def rel_err(out, ref):
    out, ref = out.float().cpu(), ref.float().cpu()
    return ((out - ref).norm() / ref.norm().clamp(min=1e-30)).item()
