"""The pieces every peer shares: gated activations (DESIGN §5), dynamic FP8 quantization
(DESIGN §4), the token -> expert plan of the grouped peers, and the weighted combine.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from layer_file import BLOCK, FP8_MAX

FP8 = torch.float8_e4m3fn
MIN_AMAX = 1e-10


# ---- activation -----------------------------------------------------------------------

def activate(gu, config, dtype=torch.float32):
    """GEMM1's output [M, W] -> [M, I] in `dtype`: act(gate) · up, or relu(x)² for relu2."""
    g = gu.to(dtype)
    if config.activation == "relu2":
        return torch.relu(g).square()
    i = config.intermediate_size
    gate, up = g[:, :i], g[:, i:]
    if config.activation == "silu_and_mul":
        return F.silu(gate) * up
    if config.activation == "gelu_and_mul":
        return F.gelu(gate) * up  # erf form, as DESIGN §5
    if config.activation == "swiglu_oai":
        limit = config.swiglu_limit
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return gate * torch.sigmoid(config.swiglu_alpha * gate) * (up + 1.0)
    raise ValueError(f"activation: '{config.activation}' unknown")


def apply_placement(config, hidden, weights):
    """(rows the experts read, weights of the combine). With weights on the input (Llama-4)
    the hidden row is scaled and rounded to bf16 first, and the combine weighs 1."""
    if not config.weights_on_input:
        return hidden, weights
    scaled = (hidden.float() * weights[:, :1]).to(torch.bfloat16)
    return scaled, torch.ones_like(weights)


# ---- dynamic FP8 quantization ---------------------------------------------------------

def dynamic_scale(amax, scale_format):
    """max(amax, 1e-10) / 448, rounded up to a power of two for ue8m0."""
    s = amax.clamp(min=MIN_AMAX) / FP8_MAX
    if scale_format == "ue8m0":
        s = torch.exp2(torch.ceil(torch.log2(s)))
    return s


def to_fp8(x, scale):
    """x / scale, saturated to ±448, rounded to nearest even e4m3fn."""
    return (x / scale).clamp(min=-FP8_MAX, max=FP8_MAX).to(FP8)


def quantize_1x128(x, scale_format="f32"):
    """x [M, K] -> q fp8 [M, K], s f32 [M, ceil(K/128)] with M contiguous (s.t() is contiguous:
    the outer-dim-major layout cuBLASLt's blockwise mode takes for the activation scales)."""
    m, k = x.shape
    kb = math.ceil(k / BLOCK)
    groups = F.pad(x.float(), (0, kb * BLOCK - k)).view(m, kb, BLOCK)
    s = dynamic_scale(groups.abs().amax(dim=-1), scale_format)  # [M, kb]
    q = to_fp8(groups, s.unsqueeze(-1)).view(m, kb * BLOCK)[:, :k]
    return q.contiguous(), s.t().contiguous().t()


def quantize_rows(x, scale_format="f32"):
    """x [M, K] -> q fp8 [M, K], s f32 [M]: one dynamic scale per row (per token, or per output
    channel of a weight)."""
    xf = x.float()
    s = dynamic_scale(xf.abs().amax(dim=-1), scale_format)
    return to_fp8(xf, s.unsqueeze(-1)), s


# ---- token -> expert plan and combine -------------------------------------------------

@dataclass
class ExpertPlan:
    """The (token, slot) pairs in expert order, for a grouped GEMM over 2-D rows x 3-D weights:
    row i of the grouped activations is pair order[i] (flat index token * k + slot), and group e
    owns rows [offs[e-1], offs[e])."""
    order: torch.Tensor   # [T*k] int64
    tokens: torch.Tensor  # [T*k] int64, the token of each row
    offs: torch.Tensor    # [E] int32, cumulative group ends


def plan_by_expert(ids, num_experts):
    """ExpertPlan of topk_ids [T, k], without a host sync (searchsorted, not bincount)."""
    sorted_ids, order = torch.sort(ids.reshape(-1), stable=True)
    experts = torch.arange(num_experts, device=ids.device)
    offs = torch.searchsorted(sorted_ids, experts, right=True).to(torch.int32)
    return ExpertPlan(order, order // ids.shape[1], offs)


def combine(y, plan, weights):
    """out [T, H] bf16 = Σ_slot weight · y(row of (token, slot)), summed in f32 in slot order."""
    t, k = weights.shape
    pair_rows = torch.empty(t * k, y.shape[1], dtype=y.dtype, device=y.device)
    pair_rows[plan.order] = y
    return (pair_rows.view(t, k, -1).float() * weights.unsqueeze(-1)).sum(dim=1).to(torch.bfloat16)
