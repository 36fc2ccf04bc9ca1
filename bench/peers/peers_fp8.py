"""The FP8 peers: torch's scaled GEMMs, quantizing activations dynamically in the timed region.
Same contract as peers_bf16 (can_implement, prepare, forward).

What torch 2.11 + cuBLASLt on the H200 needs (measured, see the report of issue #5):
- torch._scaled_mm blockwise (1x128 x 128x128): M a multiple of 8 (else CUBLAS_STATUS_NOT_SUPPORTED),
  and K/128 a multiple of 4: with K = 768 it returns wrong numbers without an error. So rows are
  padded to a multiple of 16, and K (weights at load, activations per call) to a multiple of 512.
- torch._scaled_grouped_mm rowwise: no alignment of the groups (empty and odd-sized groups,
  rows past offs[-1] are all fine), so no padding.
"""
import torch
import torch.nn.functional as F

from layer_file import BLOCK, dequantize_expert
from moe_math import FP8, activate, apply_placement, combine, plan_by_expert, quantize_1x128, quantize_rows
from routing import routing_of

BF16 = torch.bfloat16
ROW_MULTIPLE = 16     # cuBLASLt blockwise: M % 8 == 0
K_MULTIPLE = 4 * BLOCK  # cuBLASLt blockwise: (K / 128) % 4 == 0


def _round_up(n, multiple):
    return (n + multiple - 1) // multiple * multiple


def _pad_to(x, rows, cols):
    """x [M, K] zero-padded to [rows, cols] (x itself when no padding is needed)."""
    return F.pad(x, (0, cols - x.shape[1], 0, rows - x.shape[0])) if x.shape != (rows, cols) else x


def _pad_k(w, scale):
    """Block weights [E, N, K] and scales [E, N/128, K/128] zero-padded along K to K_MULTIPLE
    (padding scales 1: zero weights contribute nothing)."""
    k = w.shape[2]
    k_padded = _round_up(k, K_MULTIPLE)
    if k_padded == k:
        return w, scale.float().contiguous()
    w_padded = torch.zeros(*w.shape[:2], k_padded, dtype=w.dtype, device=w.device)
    w_padded[:, :, :k] = w
    s_padded = torch.ones(*scale.shape[:2], k_padded // BLOCK, dtype=torch.float32, device=w.device)
    s_padded[:, :, :scale.shape[2]] = scale
    return w_padded, s_padded


class ScaledMMLoop:
    """FP8 block (DeepSeek-V3 style): a per-expert loop of torch._scaled_mm in cuBLASLt's
    blockwise mode, the file's 128x128 weight blocks as they are, the activations quantized
    per 1x128 group before each GEMM (GEMM1's activated output requantized before GEMM2)."""
    name = "scaled_mm_loop"

    def can_implement(self, config):
        if config.quant != "fp8-block":
            return f"needs an fp8-block layer file, given {config.quant}"
        if config.hidden_size % BLOCK or config.intermediate_size % BLOCK:
            return "cuBLASLt blockwise needs H and I multiples of 128"
        return None

    def prepare(self, layer, ops):
        self.config, self.ops = layer.config, ops
        self.w13, self.w13_scale = _pad_k(layer.w13, layer.w13_scale)  # [E, W, H'] fp8, [E, W/128, H'/128]
        self.w2, self.w2_scale = _pad_k(layer.w2, layer.w2_scale)      # [E, H, I'], [E, H/128, I'/128]

    def forward(self, inputs):
        c = self.config
        ids, weights = routing_of(c, inputs)
        x, weights = apply_placement(c, inputs.hidden, weights)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        h_padded, i_padded = self.w13.shape[2], self.w2.shape[2]
        for e in torch.unique(ids).tolist():
            token, slot = torch.where(ids == e)
            rows = _round_up(token.numel(), ROW_MULTIPLE)
            xq, xs = quantize_1x128(_pad_to(x[token], rows, h_padded), c.scale_format)     # [R, H'], [R, H'/128]
            gate_up = self.ops.scaled_mm_block(xq, xs, self.w13[e], self.w13_scale[e])    # [R, W]
            act = _pad_to(activate(gate_up, c), rows, i_padded)                          # [R, I']
            aq, as_ = quantize_1x128(act, c.scale_format)
            y = self.ops.scaled_mm_block(aq, as_, self.w2[e], self.w2_scale[e])          # [R, H]
            out.index_add_(0, token, y[:token.numel()].float() * weights[token, slot, None])
        return out.to(BF16)


def _rowwise_weights(q, scale, quant):
    """The file's weights [E, N, K] requantized with one scale per output row: fp8 [E, N, K], f32 [E, N]."""
    wq = torch.empty(q.shape, dtype=FP8, device=q.device)
    ws = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    for e in range(q.shape[0]):
        wq[e], ws[e] = quantize_rows(dequantize_expert(q, scale, quant, e))
    return wq, ws


class ScaledGroupedMM:
    """FP8 rowwise via torch._scaled_grouped_mm (CUTLASS): weights requantized per output row at
    load, activations quantized per token in the timed region."""
    name = "scaled_grouped_mm"

    def can_implement(self, config):
        if config.hidden_size % 16 or config.intermediate_size % 16:
            return "FP8 grouped GEMM needs 16-byte aligned rows (H and I multiples of 16)"
        return None

    def prepare(self, layer, ops):
        c = layer.config
        self.config, self.ops = c, ops
        self.w13, self.w13_scale = _rowwise_weights(layer.w13, layer.w13_scale, c.quant)  # [E, W, H], [E, W]
        self.w2, self.w2_scale = _rowwise_weights(layer.w2, layer.w2_scale, c.quant)      # [E, H, I], [E, H]

    def forward(self, inputs):
        c = self.config
        ids, weights = routing_of(c, inputs)
        x, weights = apply_placement(c, inputs.hidden, weights)
        plan = plan_by_expert(ids, c.num_experts)
        xq, xs = quantize_rows(x[plan.tokens])                                            # [T*k, H], [T*k]
        gate_up = self.ops.scaled_grouped_mm(xq, xs, self.w13, self.w13_scale, plan.offs)  # [T*k, W]
        aq, as_ = quantize_rows(activate(gate_up, c))                                     # [T*k, I], [T*k]
        y = self.ops.scaled_grouped_mm(aq, as_, self.w2, self.w2_scale, plan.offs)        # [T*k, H]
        return combine(y, plan, weights)
