"""torch.ops.moekit.*: moekit's layer and router as torch custom ops.

A layer is a C++ object; the ops name it by an integer handle (MoELayer registers it), so that a
traced graph holds a constant, not an object. The registry owns the layers: MoELayer holds a handle
and unregisters it when it dies or when the interpreter exits. MoELayer calls the *_call functions below
directly when nothing traces it (eager, and under torch.cuda.graph capture), and these ops when
torch.compile does: the op dispatch costs tens of µs of host time per call, the layer at T = 1 a few
tens of µs of GPU time. Each op has a fake implementation (shapes and dtypes only) for
torch.compile. Both take their workspace from torch's allocator (the caching allocator on CUDA, a
graph's private pool under torch.cuda.graph) and run on torch's current stream.

    fused(layer, hidden [T, H] bf16, router_logits [T, E]) -> out [T, H] bf16
    experts(layer, hidden, topk_ids [T, k] i32, topk_weights [T, k] f32) -> out
    experts_out(layer, hidden, topk_ids, topk_weights, out)            writes out
    masked(layer, hidden [E_local, C, H] bf16 | fp8, hidden_scale, counts [E_local] i32, expected_rows)
        -> out [E_local, C, H] bf16 (rows past the counts uninitialized)
    route(router_logits, bias, top_k, method, n_group, topk_group, routed_scaling_factor)
        -> (topk_ids [T, k] i32, topk_weights [T, k] f32)
"""
import itertools

import torch

from . import _C

_layers = {}
_handles = itertools.count(1)


def register(layer):
    """Owns a _C.Layer for the ops; returns its handle."""
    handle = next(_handles)
    _layers[handle] = layer
    return handle


def unregister(handle):
    _layers.pop(handle, None)


def native(handle):
    """The _C.Layer of a handle."""
    try:
        return _layers[handle]
    except KeyError:
        raise _C.Error(f"layer: no moekit layer has handle {handle} (freed, or never made)") from None


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # torch's current stream, as an int


def _stream(t):
    if not t.is_cuda:
        return 0
    if _raw_stream is not None:
        return _raw_stream(t.get_device())
    return torch.cuda.current_stream(t.device).cuda_stream


def _workspace(layer, hidden):
    return hidden.new_empty(layer.workspace_size(hidden.shape[0]), dtype=torch.uint8)


def out_like(hidden):
    return hidden.new_empty(hidden.shape)


def traced(t):
    """Whether t is being traced (torch.compile, fake or functional tensors): then the ops run."""
    return type(t) is not torch.Tensor or torch.compiler.is_compiling()


def fused_call(m, hidden, router_logits):
    """The fused op's work on the _C.Layer m (eager, or under graph capture)."""
    out = out_like(hidden)
    m.fused(hidden, router_logits, out, None, None, _workspace(m, hidden), _stream(hidden))
    return out


def experts_call(m, hidden, topk_ids, topk_weights, out):
    m.external(hidden, topk_ids, topk_weights, out, _workspace(m, hidden), _stream(hidden))
    return out


def masked_call(m, hidden, hidden_scale, counts, expected_rows):
    out = _masked_out(hidden)
    workspace = hidden.new_empty(m.masked_workspace_size(hidden.shape[1]), dtype=torch.uint8)
    m.masked(hidden, hidden_scale, counts, out, expected_rows, workspace, _stream(hidden))
    return out


@torch.library.custom_op("moekit::fused", mutates_args=())
def fused(layer: int, hidden: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
    return fused_call(native(layer), hidden, router_logits)


@fused.register_fake
def _(layer, hidden, router_logits):
    return out_like(hidden)


@torch.library.custom_op("moekit::experts_out", mutates_args=("out",))
def experts_out(layer: int, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                out: torch.Tensor) -> None:
    experts_call(native(layer), hidden, topk_ids, topk_weights, out)


@experts_out.register_fake
def _(layer, hidden, topk_ids, topk_weights, out):
    return None


@torch.library.custom_op("moekit::experts", mutates_args=())
def experts(layer: int, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    return experts_call(native(layer), hidden, topk_ids, topk_weights, out_like(hidden))


@experts.register_fake
def _(layer, hidden, topk_ids, topk_weights):
    return out_like(hidden)


def _masked_out(hidden):
    return hidden.new_empty(hidden.shape, dtype=torch.bfloat16)


@torch.library.custom_op("moekit::masked", mutates_args=())
def masked(layer: int, hidden: torch.Tensor, hidden_scale: torch.Tensor | None, counts: torch.Tensor,
           expected_rows: int) -> torch.Tensor:
    return masked_call(native(layer), hidden, hidden_scale, counts, expected_rows)


@masked.register_fake
def _(layer, hidden, hidden_scale, counts, expected_rows):
    return _masked_out(hidden)


@torch.library.custom_op("moekit::route", mutates_args=())
def route(router_logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, method: str, n_group: int,
          topk_group: int, routed_scaling_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    return route_call(router_logits, bias, top_k, method, n_group, topk_group, routed_scaling_factor)


def route_call(router_logits, bias, top_k, method, n_group, topk_group, routed_scaling_factor):
    ids, weights = _route_outputs(router_logits, top_k)
    config = {"top_k": top_k, "routing": method, "n_group": n_group, "topk_group": topk_group,
              "routed_scaling_factor": routed_scaling_factor}
    _C.route(config, router_logits, bias, ids, weights, _stream(router_logits))
    return ids, weights


def _route_outputs(router_logits, top_k):
    t = router_logits.shape[0] if router_logits.dim() > 0 else 0
    k = max(top_k, 0)
    return (router_logits.new_empty((t, k), dtype=torch.int32), router_logits.new_empty((t, k), dtype=torch.float32))


@route.register_fake
def _(router_logits, bias, top_k, method, n_group, topk_group, routed_scaling_factor):
    return _route_outputs(router_logits, top_k)
