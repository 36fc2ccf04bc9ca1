"""The FP8 peers: torch's scaled GEMMs, quantizing activations dynamically in the timed region.
Same contract as peers_bf16 (can_implement, prepare, forward).
"""
import torch

from layer_file import BLOCK, dequantize_expert
from moe_math import (FP8, activate, apply_placement, combine, gather_rows, plan_by_expert, quantize_1x128,
                      quantize_rows)
from routing import routing_of

BF16 = torch.bfloat16
GROUP_ROW_ALIGN = 16  # rows per group of torch._scaled_grouped_mm: padded to a multiple (as torchao does)


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
        self.w13, self.w2 = layer.w13, layer.w2                      # [E, W, H], [E, H, I] fp8
        self.w13_scale = layer.w13_scale.float().contiguous()        # [E, W/128, H/128]
        self.w2_scale = layer.w2_scale.float().contiguous()          # [E, H/128, I/128]

    def forward(self, inputs):
        c = self.config
        ids, weights = routing_of(c, inputs)
        x, weights = apply_placement(c, inputs.hidden, weights)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in torch.unique(ids).tolist():
            token, slot = torch.where(ids == e)
            xq, xs = quantize_1x128(x[token], c.scale_format)                        # [M, H], [M, H/128]
            gate_up = self.ops.scaled_mm_block(xq, xs, self.w13[e], self.w13_scale[e])  # [M, W]
            aq, as_ = quantize_1x128(activate(gate_up, c), c.scale_format)           # [M, I], [M, I/128]
            y = self.ops.scaled_mm_block(aq, as_, self.w2[e], self.w2_scale[e])      # [M, H]
            out.index_add_(0, token, y.float() * weights[token, slot, None])
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
    load, activations quantized per token in the timed region; each expert's group of rows
    padded to a multiple of 16."""
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
        plan = plan_by_expert(ids, c.num_experts, align=GROUP_ROW_ALIGN)
        xq, xs = quantize_rows(gather_rows(x, plan))                                      # [R, H], [R]
        gate_up = self.ops.scaled_grouped_mm(xq, xs, self.w13, self.w13_scale, plan.offs)  # [R, W]
        aq, as_ = quantize_rows(activate(gate_up, c))                                     # [R, I], [R]
        y = self.ops.scaled_grouped_mm(aq, as_, self.w2, self.w2_scale, plan.offs)        # [R, H]
        return combine(y, plan, weights)
