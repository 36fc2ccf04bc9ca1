"""moekit.MoELayer and moekit.route."""
import weakref

import torch

from . import _C, ops

_WEIGHTS = ("w13", "w2", "w13_scale", "w2_scale", "e_score_correction_bias", "w13_input_scale", "w2_input_scale")
_EXPERT_WEIGHTS = ("w13", "w2", "w13_scale", "w2_scale")  # one entry per expert along dim 0


def presets():
    """{name: config dict} of moekit's model presets (DESIGN §9)."""
    return {name: config for name, config, _ in _C.presets()}


def preset_config(name):
    table = presets()
    if name not in table:
        raise _C.Error(f"preset: expected one of {'|'.join(table)}, given '{name}'")
    return dict(table[name])


def _with_shared(weights, shared):
    """The weights with the shared experts' appended after the routed ones (a copy), and their count."""
    if not isinstance(shared, dict):
        raise TypeError(f"shared_experts: expected an int or a dict of tensors, given {type(shared).__name__}")
    unknown = set(shared) - set(_EXPERT_WEIGHTS)
    if unknown:
        raise _C.Error(f"shared_experts: unknown tensor '{sorted(unknown)[0]}' (expected {', '.join(_EXPERT_WEIGHTS)})")
    if "w13" not in shared or not isinstance(shared["w13"], torch.Tensor) or shared["w13"].dim() != 3:
        raise _C.Error("shared_experts: expected w13 [S, 2I, H] (and w2 [S, H, I], scales as the routed ones')")
    for name in _EXPERT_WEIGHTS:
        if (name in weights) != (name in shared):
            raise _C.Error(f"shared_experts: '{name}' given for {'the routed' if name in weights else 'the shared'} "
                           f"experts only")
    out = dict(weights)
    for name in _EXPERT_WEIGHTS:
        if name in shared:
            routed, extra = weights[name], shared[name]
            if not isinstance(extra, torch.Tensor) or extra.dtype != routed.dtype or extra.device != routed.device \
                    or extra.shape[1:] != routed.shape[1:]:
                raise _C.Error(f"shared_experts: '{name}' expected [S, {', '.join(map(str, routed.shape[1:]))}] "
                               f"{routed.dtype} on {routed.device}, given {getattr(extra, 'shape', None)} "
                               f"{getattr(extra, 'dtype', None)}")
            out[name] = torch.cat([routed, extra]).contiguous()
    return out, shared["w13"].shape[0]


def _quant_of(w13, w13_scale):
    """The scheme the weights' dtypes and scale shapes say, for a config that names none."""
    if w13.dtype == torch.bfloat16:
        return "bf16"
    if w13.dtype != torch.float8_e4m3fn or w13_scale is None:
        raise _C.Error(f"w13: expected bfloat16, or float8_e4m3fn with w13_scale (or quant=...), given {w13.dtype}")
    return {1: "fp8-tensor", 2: "fp8-rowwise", 3: "fp8-block"}.get(w13_scale.dim(), "fp8-block")


class MoELayer:
    """One MoE layer (router + experts) over torch tensors, run by moekit.

    Weights are DESIGN §2's: w13 [E_local, 2I, H] (gate rows, then up rows; [E_local, I, H] for
    relu2) and w2 [E_local, H, I], bfloat16 or torch.float8_e4m3fn, with float32 scales that
    multiply (fp8-tensor [E_local], fp8-rowwise [E_local, N], fp8-block [E_local, ceil(N/128),
    ceil(K/128)]: a checkpoint's weight_scale_inv), e_score_correction_bias [E] for the *_bias_*
    routings, optional static input scales [1] for fp8-tensor. All on one device.

    CUDA tensors are borrowed, not copied: the layer keeps them alive, and they must not be changed
    in place afterwards (only the FP8 scales are copied, into the GEMMs' layout). CPU tensors run on
    moekit's CPU reference backend.

    The config: a preset's (preset="deepseek-v3"), overridden by keyword arguments in moekit's
    spellings (top_k, routing, n_group, topk_group, routed_scaling_factor, activation, quant,
    scale_format, accumulation, batch_invariant, experts_path, swiglu_alpha, swiglu_limit,
    weight_placement, ep_size, ep_rank, num_experts, hidden_size, intermediate_size). Sizes default
    to the weights' shapes and quant to what their dtypes say. max_tokens > 0 checks every stage for
    calls of up to that many tokens now (and refuses larger calls). backend: "auto" (the tensors'
    device: cuda, or cpu; MOEKIT_BACKEND may name one), "cpu" or "cuda".

    Shared experts (DeepSeek-V3's one, every token runs it besides its routed ones) are fused into the
    layer, SGLang's way: appended to every token's routing with weight 1 (shared_expert_weight=...).
    shared_experts: a dict {"w13": [S, 2I, H], "w2": [S, H, I], "w13_scale", "w2_scale"} in the routed
    experts' dtypes and layouts (appended to theirs: a copy of both), or an int S when w13/w2 (and the
    scales) already hold them after the routed ones: borrowed, nothing copied. Under expert parallelism
    every rank holds them. moekit.import_hf_layer(..., shared_experts=1) reads DeepSeek's.
    """

    def __init__(self, w13, w2, *, w13_scale=None, w2_scale=None, e_score_correction_bias=None,
                 w13_input_scale=None, w2_input_scale=None, shared_experts=0, preset=None, backend="auto",
                 max_tokens=0, **config):
        given = dict(w13=w13, w2=w2, w13_scale=w13_scale, w2_scale=w2_scale,
                     e_score_correction_bias=e_score_correction_bias, w13_input_scale=w13_input_scale,
                     w2_input_scale=w2_input_scale)
        for name, t in given.items():
            if t is not None and not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}: expected a torch.Tensor, given {type(t).__name__}")
        self.weights = {name: t for name, t in given.items() if t is not None}
        if isinstance(shared_experts, int) and not isinstance(shared_experts, bool):
            shared = shared_experts
        else:
            self.weights, shared = _with_shared(self.weights, shared_experts)
            w13 = self.weights["w13"]
        cfg = preset_config(preset) if preset else {}
        cfg.update(config)
        cfg["shared_experts"] = shared
        ep = cfg.get("ep_size", 1)
        cfg.setdefault("num_experts", (w13.shape[0] - shared) * ep if w13.dim() == 3 else 0)
        cfg.setdefault("hidden_size", w13.shape[-1])
        cfg.setdefault("intermediate_size", w2.shape[-1])
        cfg.setdefault("quant", _quant_of(w13, w13_scale))
        if backend == "auto" and not w13.is_cuda:
            backend = "cpu"
        stream = ops._stream(w13)
        # The native layer has one owner, ops' registry; this object holds its handle. The finalizer
        # releases it when this object dies, and at the latest at interpreter exit (before the modules
        # and the CUDA context go): torch.compile keeps the globals of the code it compiled, so a
        # MoELayer held there is never freed, and a native layer it owned would outlive the interpreter.
        self._handle = ops.register(_C.Layer(cfg, self.weights, backend, max_tokens, stream))
        weakref.finalize(self, ops.unregister, self._handle)  # kept alive by weakref itself
        self.config = self._layer.config

    @classmethod
    def from_hf(cls, folder, layer, *, device="cpu", ep_size=1, ep_rank=0, shared_experts=0, **options):
        """Layer `layer` of a Hugging Face checkpoint folder (moekit.import_hf_layer), on `device`;
        shared_experts=n_shared_experts fuses DeepSeek's shared experts."""
        from .weights import import_hf_layer
        imported = import_hf_layer(folder, layer, ep_size=ep_size, ep_rank=ep_rank, shared_experts=shared_experts,
                                   device=device)
        cfg = dict(imported["config"], **options)
        weights = {name: imported[name] for name in _WEIGHTS if imported.get(name) is not None}
        self = cls(**weights, **cfg)
        self.gate_weight = imported["gate_weight"]
        return self

    @property
    def _layer(self):
        """The native layer (moekit._C.Layer), looked up by handle: this object does not own it."""
        return ops.native(self._handle)

    @property
    def backend(self):
        return self._layer.backend

    @property
    def owned_bytes(self):
        """Bytes moekit allocated for this layer's weights (copies; 0 when all is borrowed)."""
        return self._layer.owned_bytes

    def forward(self, hidden, router_logits=None, *, topk_ids=None, topk_weights=None, out=None):
        """out [T, H] bf16 from hidden [T, H] bf16 and either router_logits [T, E] (float32 or
        bfloat16: fused routing) or topk_ids [T, k] (int32; int64 is converted) with topk_weights
        [T, k] float32 (external routing; -1 = no expert). out= (external routing) is written in place."""
        if router_logits is not None:
            if topk_ids is not None or topk_weights is not None or out is not None:
                raise TypeError("forward: give router_logits, or topk_ids and topk_weights (and out=), not both")
            if not ops.traced(hidden):
                return ops.fused_call(self._layer, hidden, router_logits)
            return torch.ops.moekit.fused(self._handle, hidden, router_logits)
        if topk_ids is None or topk_weights is None:
            raise TypeError("forward: expected router_logits, or topk_ids and topk_weights")
        if topk_ids.dtype == torch.int64:
            topk_ids = topk_ids.to(torch.int32)
        if not ops.traced(hidden):
            return ops.experts_call(self._layer, hidden, topk_ids, topk_weights, ops.out_like(hidden) if out is None else out)
        if out is None:
            return torch.ops.moekit.experts(self._handle, hidden, topk_ids, topk_weights)
        torch.ops.moekit.experts_out(self._handle, hidden, topk_ids, topk_weights, out)
        return out

    __call__ = forward

    def forward_masked(self, hidden, counts, *, hidden_scale=None, expected_rows=0):
        """The experts alone on tokens already grouped by local expert (the masked format of
        DeepEP's low-latency dispatch and DeepGEMM's masked GEMMs; E_local counts the layer's shared
        experts, the last blocks): hidden [E_local, C, H] bfloat16,
        or float8_e4m3fn with hidden_scale [E_local, C, ceil(H/128)] float32 (fp8-block layers;
        row-major or C-contiguous, as DeepEP gives them); counts [E_local] int32, the rows of each
        block that hold a token (clamped to [0, C]). Returns [E_local, C, H] bfloat16: each row below
        its count gets its expert's output, without routing weight; the rows past the counts are
        left uninitialized. expected_rows: rows per expert you expect (a tile hint; 0: C)."""
        if not ops.traced(hidden):
            return ops.masked_call(self._layer, hidden, hidden_scale, counts, expected_rows)
        return torch.ops.moekit.masked(self._handle, hidden, hidden_scale, counts, expected_rows)

    def __repr__(self):
        c = self.config
        return (f"MoELayer(E={c['num_experts']}, H={c['hidden_size']}, I={c['intermediate_size']}, "
                f"top_k={c['top_k']}, routing={c['routing']}, quant={c['quant']}, backend={self.backend})")


def route(router_logits, *, top_k, routing="softmax_topk_renorm", bias=None, n_group=1, topk_group=1,
          routed_scaling_factor=1.0):
    """(topk_ids [T, k] int32, topk_weights [T, k] float32) by DESIGN §3's method `routing`, on the
    device of router_logits [T, E] (float32 or bfloat16). bias: e_score_correction_bias [E]."""
    if not ops.traced(router_logits):
        return ops.route_call(router_logits, bias, top_k, routing, n_group, topk_group, routed_scaling_factor)
    return torch.ops.moekit.route(router_logits, bias, top_k, routing, n_group, topk_group, routed_scaling_factor)
