"""moekit's experts in the shape of vLLM's modular MoE kernel (FusedMoEExpertsModular).

    experts = MoekitExperts(quant_config)         # or MoekitExperts(w1_scale=..., w2_scale=...)
    experts.apply(output, hidden_states, w1, w2, topk_weights, topk_ids, activation,
                  global_num_experts, expert_map, a1q_scale, a2_scale, workspace13, workspace2,
                  expert_tokens_meta, apply_router_weight_on_input)

vLLM's conventions: w1 = w13_weight [E_local, 2I, H] (gate rows, then up rows), w2 [E_local, H,
I], bf16 or float8_e4m3fn with 128x128 block scales (weight_scale_inv, which multiply),
per-channel [E_local, N] or per-expert [E_local] scales; topk_ids are global expert ids and
expert_map [global E] maps them to this rank's experts (-1: another rank's). The experts take
bf16 activations (expects_unquantized_inputs: moekit quantizes them itself), apply the topk
weights and reduce over k: output is [M, H], and finalize has nothing left to do (NoOP). The
first apply on a set of weights prepares them (borrowed; only FP8 scales are copied), later calls
reuse that. workspace13 and workspace2 are not used (see workspace_shapes). Nothing here imports vLLM: the class is used, and tested, without it.
"""
import torch

from ..layer import MoELayer

_ACTIVATIONS = {"silu": "silu_and_mul", "gelu": "gelu_and_mul", "swigluoai": "swiglu_oai", "relu2_no_mul": "relu2",
                "relu2": "relu2"}


def _activation_name(activation):
    """moekit's spelling of vLLM's activation (a MoEActivation member or a string)."""
    name = str(getattr(activation, "value", getattr(activation, "name", activation))).lower()
    name = name.split(".")[-1]
    if name in _ACTIVATIONS.values():
        return name
    if name not in _ACTIVATIONS:
        raise ValueError(f"activation: moekit runs {'|'.join(_ACTIVATIONS)}, given {activation!r}")
    return _ACTIVATIONS[name]


def _quant_of(w1, w1_scale):
    if w1.dtype == torch.bfloat16:
        return "bf16"
    if w1_scale is None:
        raise ValueError("w1_scale: float8 weights need their scales (quant_config.w1_scale)")
    return {1: "fp8-tensor", 2: "fp8-rowwise", 3: "fp8-block"}[w1_scale.dim()]


class TopKWeightAndReduceNoOP:
    """What finalize does after these experts: nothing (they weight and reduce themselves)."""

    def apply(self, output, fused_expert_output, topk_weights, topk_ids, apply_router_weight_on_input):
        if output is None:
            return fused_expert_output
        if output.data_ptr() != fused_expert_output.data_ptr():
            output.copy_(fused_expert_output)
        return output


class MoekitExperts:
    """vLLM's FusedMoEExpertsModular interface on moekit (see the module docstring)."""

    def __init__(self, quant_config=None, *, w1_scale=None, w2_scale=None, max_num_tokens=0, **layer_options):
        self.quant_config = quant_config
        self.w1_scale = w1_scale if w1_scale is not None else getattr(quant_config, "w1_scale", None)
        self.w2_scale = w2_scale if w2_scale is not None else getattr(quant_config, "w2_scale", None)
        self.max_num_tokens = max_num_tokens
        self.layer_options = layer_options
        self._layers = {}

    # ---- what vLLM asks of an experts class --------------------------------------------
    @staticmethod
    def is_monolithic():
        return False

    @staticmethod
    def activation_format():
        return "standard"  # [M, H] rows in token order (FusedMoEActivationFormat.Standard)

    @property
    def expects_unquantized_inputs(self):
        return True

    def supports_chunking(self):
        return True

    def supports_expert_map(self):
        return True

    def finalize_weight_and_reduce_impl(self):
        return TopKWeightAndReduceNoOP()

    def workspace_dtype(self, act_dtype):
        return act_dtype  # vLLM carves the output from the same buffer: it must be the activations' dtype

    def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta, activation):
        """(workspace13, workspace2, output): moekit takes its workspace from torch's allocator (the
        caching allocator, a graph's pool under capture), so vLLM's two are empty; output [M, K]."""
        return (0,), (0,), (M, K)

    # ---- the call ------------------------------------------------------------------------
    def _layer_for(self, w1, w2, topk, activation, local_experts):
        key = (w1.data_ptr(), w2.data_ptr(), topk, activation)
        layer = self._layers.get(key)
        if layer is None:
            # The layer sees this rank's experts as all there are: ids are mapped to local ones.
            layer = MoELayer(w1, w2, w13_scale=self.w1_scale, w2_scale=self.w2_scale, top_k=topk,
                             routing="external", activation=activation, num_experts=local_experts,
                             quant=_quant_of(w1, self.w1_scale), max_tokens=self.max_num_tokens,
                             **self.layer_options)
            self._layers[key] = layer
        return layer

    def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
              expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
              apply_router_weight_on_input):
        if a1q_scale is not None or hidden_states.dtype != torch.bfloat16:
            raise ValueError("hidden_states: moekit takes bf16 activations and quantizes them itself "
                             f"(expects_unquantized_inputs), given {hidden_states.dtype} with a1q_scale "
                             f"{'set' if a1q_scale is not None else 'None'}")
        topk = topk_ids.shape[1]
        layer = self._layer_for(w1, w2, topk, _activation_name(activation), w1.shape[0])
        ids = topk_ids.to(torch.int32)
        if expert_map is not None:
            ids = torch.where(ids >= 0, expert_map.to(ids.device)[ids.clamp(min=0).long()].to(torch.int32), ids)
        elif global_num_experts not in (-1, w1.shape[0]):
            raise ValueError(f"expert_map: {global_num_experts} global experts and {w1.shape[0]} here need a map")
        weights = topk_weights.float()
        if apply_router_weight_on_input:  # prepare already scaled the rows
            weights = torch.ones_like(weights)
        layer(hidden_states, topk_ids=ids, topk_weights=weights, out=output)
