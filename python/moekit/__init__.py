"""moekit for PyTorch: the Mixture-of-Experts layer of moekit's C++/CUDA library.

    layer = moekit.MoELayer(w13, w2, w13_scale=s13, w2_scale=s2, preset="qwen3-30b-a3b")
    out = layer(hidden, router_logits=logits)                    # fused routing
    out = layer(hidden, topk_ids=ids, topk_weights=weights)      # external routing

Tensors cross as they are (DLPack, no copy) and CUDA work runs on torch's current stream.
The calls are torch custom ops (torch.ops.moekit.*), so they trace under
torch.compile(fullgraph=True) and capture in torch.cuda.graph. Errors raise moekit.Error (a
ValueError) with moekit's message, which names the argument.
"""
from . import _C
from ._C import Error, backend_names, cuda_available, tuning_cache
from . import ops
from .layer import MoELayer, preset_config, presets, route
from .weights import import_hf_layer, quantize_fp8_block, quantize_weights

__version__ = _C.version()

__all__ = [
    "Error", "MoELayer", "backend_names", "cuda_available", "import_hf_layer", "ops", "preset_config", "presets",
    "quantize_fp8_block", "quantize_weights", "route", "tuning_cache",
]
