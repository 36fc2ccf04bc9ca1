"""Peer for the FP8-block grouped GEMM: a per-expert loop of torch._scaled_mm with blockwise
scales (1x128 activations, 128x128 weights; cuBLASLt underneath), on random data.

    python3 bench/peers/scaled_mm_block_loop.py [--groups 8 --rows 4096 --n 4096 --k 7168]

Prints one line: peer, shape, median µs of 20 runs after warm-up, TFLOP/s.
"""
import argparse

import torch

from moe_peers import median_us


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=7168)
    a = p.parse_args()
    g, m, n, k = a.groups, a.rows, a.n, a.k
    dev = "cuda"
    x = (torch.randn(g, m, k, device=dev) * 2).to(torch.float8_e4m3fn)
    w = (torch.randn(g, n, k, device=dev) * 2).to(torch.float8_e4m3fn)
    # Scales in the layouts cuBLASLt's blockwise mode takes: outer-dim-major activation scales.
    sx = (torch.rand(g, k // 128, m, device=dev) * 0.01 + 0.001).transpose(1, 2)  # [g, m, k/128], m contiguous
    sw = torch.rand(g, n // 128, k // 128, device=dev) * 0.01 + 0.001              # [g, n/128, k/128]
    out = torch.empty(g, m, n, device=dev, dtype=torch.bfloat16)

    def loop():
        for e in range(g):
            out[e] = torch._scaled_mm(x[e], w[e].t(), scale_a=sx[e], scale_b=sw[e].t(), out_dtype=torch.bfloat16)

    flops = 2.0 * g * m * n * k
    try:
        ms = median_us(loop, 20, on_gpu=True) / 1e3
        # Spot check one expert against a dequantized matmul.
        e = g - 1
        ref = (x[e].float() * sx[e].repeat_interleave(128, dim=1)) @ (
            w[e].float() * sw[e].repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)).t()
        err = ((out[e].float() - ref).norm() / ref.norm()).item()
        print(f"torch._scaled_mm blockwise loop  groups={g} rows={m} N={n} K={k}  {ms * 1e3:9.1f} us "
              f"{flops / ms / 1e9:8.1f} TFLOP/s  rel_err={err:.2e}")
    except Exception as exc:  # the peer is reported, not assumed
        print(f"torch._scaled_mm blockwise loop: not available here: {type(exc).__name__}: {str(exc)[:300]}")


if __name__ == "__main__":
    main()
