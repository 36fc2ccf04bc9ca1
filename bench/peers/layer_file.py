"""The layer file (DESIGN §2) as the peers see it: the config from `__metadata__`, the
tensors, and weight dequantization (DESIGN §4: real = q × scale).

Only what the peer scripts need; moekit's own reader (src/io/layer_file.cpp) is the one
that validates everything.
"""
from dataclasses import dataclass, field

import torch
from safetensors import safe_open

BLOCK = 128  # fp8-block: elements per scale along K, and the weight block edge
FP8_MAX = 448.0

QUANTS = ("bf16", "fp8-tensor", "fp8-rowwise", "fp8-block")
ACTIVATIONS = ("silu_and_mul", "gelu_and_mul", "swiglu_oai", "relu2")


@dataclass(frozen=True)
class MoEConfig:
    """The layer's config, spelled as in the CLI and the layer-file metadata."""
    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    routing: str
    activation: str
    quant: str
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    scale_format: str = "f32"         # or ue8m0: dynamic scales rounded up to a power of two
    weight_placement: str = "output"  # or input (Llama-4's apply_router_weight_on_input)
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    @property
    def gated(self):
        return self.activation != "relu2"

    @property
    def gemm1_width(self):
        """Rows of w13 per expert: gate and up (2I), or I for relu2."""
        return 2 * self.intermediate_size if self.gated else self.intermediate_size

    @property
    def weights_on_input(self):
        """top1_sigmoid always multiplies the hidden row; the others where the file says."""
        return self.routing == "top1_sigmoid" or self.weight_placement == "input"

    def to_string(self):
        return (f"E={self.num_experts} k={self.top_k} H={self.hidden_size} I={self.intermediate_size} "
                f"routing={self.routing} activation={self.activation} quant={self.quant}")


def parse_config(meta):
    """MoEConfig from the `__metadata__` strings; unknown keys are ignored, optional ones defaulted."""
    def get(key, cast, default=None):
        if key not in meta:
            if default is None:
                raise ValueError(f"layer file metadata: missing key '{key}'")
            return default
        return cast(meta[key])

    ep_size = get("ep_size", int, 1)
    if ep_size != 1:
        raise ValueError(f"layer file metadata: ep_size {ep_size}; the peers run the whole layer on one GPU (ep_size 1)")
    config = MoEConfig(
        num_experts=get("num_experts", int), top_k=get("top_k", int), hidden_size=get("hidden_size", int),
        intermediate_size=get("intermediate_size", int), routing=get("routing", str),
        activation=get("activation", str), quant=get("quant", str), n_group=get("n_group", int, 1),
        topk_group=get("topk_group", int, 1), routed_scaling_factor=get("routed_scaling_factor", float, 1.0),
        scale_format=get("scale_format", str, "f32"), weight_placement=get("weight_placement", str, "output"),
        swiglu_alpha=get("swiglu_alpha", float, 1.702), swiglu_limit=get("swiglu_limit", float, 7.0))
    if config.quant not in QUANTS:
        raise ValueError(f"layer file metadata 'quant': expected one of {'|'.join(QUANTS)}, given '{config.quant}'")
    if config.activation not in ACTIVATIONS:
        raise ValueError(f"layer file metadata 'activation': expected one of {'|'.join(ACTIVATIONS)}, "
                         f"given '{config.activation}'")
    return config


@dataclass
class LayerFile:
    config: MoEConfig
    hidden: torch.Tensor                 # [T, H] bf16
    w13: torch.Tensor                    # [E, W, H] bf16 | fp8, W = 2I (I for relu2), rows gate then up
    w2: torch.Tensor                     # [E, H, I]
    w13_scale: torch.Tensor = None       # DESIGN §4 layout of the quant scheme, f32
    w2_scale: torch.Tensor = None
    router_logits: torch.Tensor = None   # [T, E] f32 | bf16
    bias: torch.Tensor = None            # [E] e_score_correction_bias
    topk_ids: torch.Tensor = None        # [T, k] i32 (external routing)
    topk_weights: torch.Tensor = None    # [T, k] f32
    extra: dict = field(default_factory=dict)  # other tensors (expected_out, ...)

    @property
    def num_tokens(self):
        return self.hidden.shape[0]


_FIELDS = {"hidden", "w13", "w2", "w13_scale", "w2_scale", "router_logits", "topk_ids", "topk_weights"}


def _swap_gate_up(w, rows_per_half):
    """TensorRT-LLM's up|gate order to gate|up, along dim 1 (weights [E, 2I, H], block scales too)."""
    return torch.cat([w[:, rows_per_half:], w[:, :rows_per_half]], dim=1).contiguous()


def read_layer_file(path, device="cpu"):
    """Every tensor of the file on `device`, and its config."""
    with safe_open(path, framework="pt", device="cpu") as f:
        meta = f.metadata() or {}
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    config = parse_config(meta)
    for name in ("hidden", "w13", "w2"):
        if name not in tensors:
            raise ValueError(f"layer file {path}: tensor '{name}' absent")
    if meta.get("w13_order", "gate_up") == "up_gate":
        tensors["w13"] = _swap_gate_up(tensors["w13"], config.intermediate_size)
        if config.quant == "fp8-rowwise":
            tensors["w13_scale"] = _swap_gate_up(tensors["w13_scale"], config.intermediate_size)
        elif config.quant == "fp8-block":
            tensors["w13_scale"] = _swap_gate_up(tensors["w13_scale"], config.intermediate_size // BLOCK)
    moved = {name: t.to(device) for name, t in tensors.items()}
    layer = LayerFile(config=config, hidden=moved["hidden"], w13=moved["w13"], w2=moved["w2"],
                      w13_scale=moved.get("w13_scale"), w2_scale=moved.get("w2_scale"),
                      router_logits=moved.get("router_logits"), bias=moved.get("e_score_correction_bias"),
                      topk_ids=moved.get("topk_ids"), topk_weights=moved.get("topk_weights"),
                      extra={n: t for n, t in moved.items() if n not in _FIELDS | {"e_score_correction_bias"}})
    _check_shapes(layer)
    return layer


@dataclass
class Inputs:
    """One case's inputs: the first T rows of the layer file's per-token tensors."""
    hidden: torch.Tensor                # [T, H] bf16
    router_logits: torch.Tensor = None  # [T, E]
    bias: torch.Tensor = None           # [E]
    topk_ids: torch.Tensor = None       # [T, k]
    topk_weights: torch.Tensor = None   # [T, k]


def first_rows(layer, tokens):
    """Inputs of the first `tokens` rows."""
    def head(t):
        return None if t is None else t[:tokens]
    return Inputs(hidden=layer.hidden[:tokens], router_logits=head(layer.router_logits), bias=layer.bias,
                  topk_ids=head(layer.topk_ids), topk_weights=head(layer.topk_weights))


def _check_shapes(layer):
    c = layer.config
    e, h, i, w = c.num_experts, c.hidden_size, c.intermediate_size, c.gemm1_width
    want = {"hidden": (layer.num_tokens, h), "w13": (e, w, h), "w2": (e, h, i)}
    for name, shape in want.items():
        got = tuple(getattr(layer, name).shape)
        if got != shape:
            raise ValueError(f"layer file: {name} expected {list(shape)}, given {list(got)}")
    if layer.router_logits is None and layer.topk_ids is None:
        raise ValueError("layer file: router_logits absent, and no topk_ids/topk_weights either")
    if c.quant != "bf16" and (layer.w13_scale is None or layer.w2_scale is None):
        raise ValueError(f"layer file: quant {c.quant} needs w13_scale and w2_scale")


def dequantize_expert(q, scale, quant, expert):
    """Expert `expert` of q [E, N, K] as f32 [N, K], real = q × scale (DESIGN §4)."""
    w = q[expert].float()
    if quant == "bf16":
        return w
    s = scale[expert].float()
    if quant == "fp8-tensor":
        return w * s.reshape(-1)[0]
    if quant == "fp8-rowwise":
        return w * s.reshape(-1, 1)
    if quant == "fp8-block":
        n, k = w.shape
        full = s.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)
        return w * full[:n, :k]
    raise ValueError(f"quant: expected one of {'|'.join(QUANTS)}, given '{quant}'")


def dequantize_all(q, scale, quant, dtype=torch.bfloat16):
    """Every expert of q [E, N, K] dequantized to `dtype`, one expert at a time (bounded f32 scratch)."""
    out = torch.empty(q.shape, dtype=dtype, device=q.device)
    for e in range(q.shape[0]):
        out[e] = dequantize_expert(q, scale, quant, e).to(dtype)
    return out
