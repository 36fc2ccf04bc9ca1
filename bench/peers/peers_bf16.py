"""The bf16 peers: what a user writes with plain PyTorch.

Both dequantize the file's weights to bf16 once, at load (outside timing), and run the
whole layer from router_logits: routing, experts, weighted combine. The contract of a peer:
  can_implement(config) -> None, or the reason it cannot run this layer
  prepare(layer, ops)   -> load-time work (untimed)
  forward(inputs)       -> out [T, H] bf16 (timed)
"""
import torch

from layer_file import dequantize_all
from moe_math import activate, apply_placement, combine, plan_by_expert
from routing import routing_of

BF16 = torch.bfloat16


class TorchLoop:
    """Per-expert loop as HF transformers' MoE blocks do it: for each expert that got tokens,
    index its rows, matmul gate|up, activate, matmul down, weigh and index_add into the output.
    (HF accumulates in bf16; f32 here costs nothing measurable and keeps the check about the
    GEMMs.)"""
    name = "torch_loop"

    def can_implement(self, config):
        return None

    def prepare(self, layer, ops):
        c = layer.config
        self.config = c
        self.w13 = dequantize_all(layer.w13, layer.w13_scale, c.quant)  # [E, W, H]
        self.w2 = dequantize_all(layer.w2, layer.w2_scale, c.quant)     # [E, H, I]

    def forward(self, inputs):
        ids, weights = routing_of(self.config, inputs)       # [T, k]
        x, weights = apply_placement(self.config, inputs.hidden, weights)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in torch.unique(ids).tolist():                 # host sync, as HF's expert_hit
            token, slot = torch.where(ids == e)
            gate_up = x[token] @ self.w13[e].t()             # [M, W]
            act = activate(gate_up, self.config).to(BF16)    # [M, I]
            y = act @ self.w2[e].t()                         # [M, H]
            out.index_add_(0, token, y.float() * weights[token, slot, None])
        return out.to(BF16)


class GroupedMM:
    """torch._grouped_mm (bf16, CUTLASS grouped GEMM): pairs sorted by expert, one grouped GEMM
    per projection over 2-D rows x 3-D weights with int32 cumulative offsets."""
    name = "grouped_mm"

    def can_implement(self, config):
        if config.hidden_size % 8 or config.intermediate_size % 8:
            return "torch._grouped_mm needs 16-byte aligned rows (H and I multiples of 8)"
        return None

    def prepare(self, layer, ops):
        c = layer.config
        self.config, self.ops = c, ops
        self.w13 = dequantize_all(layer.w13, layer.w13_scale, c.quant)  # [E, W, H]
        self.w2 = dequantize_all(layer.w2, layer.w2_scale, c.quant)     # [E, H, I]

    def forward(self, inputs):
        ids, weights = routing_of(self.config, inputs)
        x, weights = apply_placement(self.config, inputs.hidden, weights)
        plan = plan_by_expert(ids, self.config.num_experts)
        gate_up = self.ops.grouped_mm(x[plan.tokens], self.w13, plan.offs)  # [T*k, W]
        act = activate(gate_up, self.config).to(BF16)                              # [T*k, I]
        y = self.ops.grouped_mm(act, self.w2, plan.offs)                           # [T*k, H]
        return combine(y, plan, weights)
