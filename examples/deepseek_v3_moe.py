"""A DeepSeek-V3-style MoE block in torch, twice: moekit inside, and plain torch.

The block: router (a linear layer to E logits), sigmoid scores plus the selection bias, 8 groups of
which the best 4 are kept, top-8 experts inside them, weights renormalized and scaled by 2.5; the
routed experts (SwiGLU, FP8 weights with 128x128 block scales); a shared expert (plain torch in
both). The moekit block routes and runs the experts in one op; the torch block does it by hand
(a loop over the experts, each dequantized when its turn comes: at full size all of them in f32 would
take 45 GB). Both are printed with their difference and time, and on CUDA the peak memory.

    PYTHONPATH=build/python python3 examples/deepseek_v3_moe.py            # small shapes, any device
    python3 examples/deepseek_v3_moe.py --full --device cuda              # deepseek-v3's own shapes
"""
import argparse
import time

import torch

import moekit


class Router(torch.nn.Module):
    def __init__(self, hidden, experts):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(experts, hidden) * hidden ** -0.5)
        self.e_score_correction_bias = torch.nn.Parameter(torch.rand(experts) * 0.05)

    def forward(self, x):
        return x.float() @ self.weight.t()


class SharedExpert(torch.nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_up = torch.nn.Linear(hidden, 2 * inter, bias=False, dtype=torch.bfloat16)
        self.down = torch.nn.Linear(inter, hidden, bias=False, dtype=torch.bfloat16)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(torch.nn.functional.silu(gate) * up)


class MoekitBlock(torch.nn.Module):
    """Router logits into moekit's layer (fused routing: sigmoid_bias_grouped inside)."""

    def __init__(self, router, shared, w13, w2, w13_scale, w2_scale, cfg):
        super().__init__()
        self.router, self.shared = router, shared
        self.experts = moekit.MoELayer(w13, w2, w13_scale=w13_scale, w2_scale=w2_scale,
                                       e_score_correction_bias=router.e_score_correction_bias.detach(), **cfg)

    def forward(self, x):
        return self.experts(x, router_logits=self.router(x)) + self.shared(x)


class TorchBlock(torch.nn.Module):
    """The same block by hand: grouped routing, then a loop over the experts with weights, each expert
    dequantized from the same FP8 weights as it runs (memory: the FP8 weights and one expert in f32)."""

    def __init__(self, router, shared, w13, w2, w13_scale, w2_scale, cfg):
        super().__init__()
        self.router, self.shared, self.cfg = router, shared, cfg
        self.w13, self.w2, self.w13_scale, self.w2_scale = w13, w2, w13_scale, w2_scale

    def route(self, logits):
        c = self.cfg
        scores = torch.sigmoid(logits)
        biased = scores + self.router.e_score_correction_bias.detach()
        t, e = logits.shape
        groups = biased.view(t, c["n_group"], -1).topk(2, dim=-1).values.sum(dim=-1)
        keep = torch.zeros_like(groups).scatter_(1, groups.topk(c["topk_group"], dim=1).indices, 1.0)
        masked = biased.masked_fill(keep.repeat_interleave(e // c["n_group"], dim=1) == 0, float("-inf"))
        ids = masked.topk(c["top_k"], dim=1).indices
        weights = scores.gather(1, ids)
        return ids, weights / weights.sum(dim=1, keepdim=True) * c["routed_scaling_factor"]

    def forward(self, x):
        ids, weights = self.route(self.router(x))
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in ids.unique().tolist():
            token, slot = torch.nonzero(ids == e, as_tuple=True)
            w13, w2 = dequantize(self.w13[e], self.w13_scale[e]), dequantize(self.w2[e], self.w2_scale[e])
            gate, up = (x[token].float() @ w13.t()).chunk(2, dim=-1)
            y = (torch.nn.functional.silu(gate) * up) @ w2.t()
            out.index_add_(0, token, y * weights[token, slot].unsqueeze(1))
        return out.bfloat16() + self.shared(x)


def dequantize(q, scale):
    """One expert's [N, K] FP8 weights times their [ceil(N/128), ceil(K/128)] block scales, in f32."""
    (n, k), (nb, kb) = q.shape, scale.shape
    w = torch.nn.functional.pad(q.float(), (0, kb * 128 - k, 0, nb * 128 - n))
    return (w.view(nb, 128, kb, 128) * scale[:, None, :, None]).view(nb * 128, kb * 128)[:n, :k]


def random_fp8_experts(experts, n, k, device, chunk=8):
    """Random [E, N, K] weights quantized to FP8 blocks chunk experts at a time: the f32 weights of every
    expert at once would take 4 bytes per weight on the device and on the host (deepseek-v3: 45 GB)."""
    parts = [moekit.quantize_fp8_block(torch.randn(min(chunk, experts - e), n, k, device=device) * k ** -0.5)
             for e in range(0, experts, chunk)]
    return torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts])


def timed(f, x, runs):
    f(x)
    if x.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(runs):
        f(x)
    if x.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / runs * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if moekit.cuda_available() else "cpu")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--full", action="store_true", help="deepseek-v3's shapes (256 experts, H 7168, I 2048)")
    args = p.parse_args()
    torch.manual_seed(0)
    cfg = moekit.preset_config("deepseek-v3")
    if not args.full:
        cfg.update(num_experts=32, hidden_size=512, intermediate_size=256)
    E, H, I = cfg["num_experts"], cfg["hidden_size"], cfg["intermediate_size"]
    dev = torch.device(args.device)

    router, shared = Router(H, E).to(dev), SharedExpert(H, I).to(dev)
    w13, w13_scale = random_fp8_experts(E, 2 * I, H, dev)
    w2, w2_scale = random_fp8_experts(E, H, I, dev)
    with torch.no_grad():
        ours = MoekitBlock(router, shared, w13, w2, w13_scale, w2_scale, cfg)
        plain = TorchBlock(router, shared, w13, w2, w13_scale, w2_scale, cfg)
        x = torch.randn(args.tokens, H, device=dev).bfloat16()
        a, b = ours(x), plain(x)
        err = ((a.float() - b.float()).norm() / b.float().norm()).item()
        print(f"{ours.experts} on {args.device}, T={args.tokens}")
        print(f"moekit block vs plain torch: rel_err {err:.2e} (moekit quantizes the activations to FP8; "
              f"the torch block keeps them in f32)")
        runs = 20 if dev.type == "cuda" else 3
        print(f"time per block: moekit {timed(ours, x, runs):.3f} ms, plain torch {timed(plain, x, runs):.3f} ms")
    if dev.type == "cuda":
        weights = sum(t.numel() * t.element_size() for t in (w13, w2, w13_scale, w2_scale))
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated(dev) / 2**30:.1f} GiB "
              f"(the FP8 experts: {weights / 2**30:.1f} GiB)")


if __name__ == "__main__":
    main()
