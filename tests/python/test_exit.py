"""A process that used moekit.MoELayer exits cleanly: nothing on stderr (nanobind reports native objects
still alive when the interpreter has gone, e.g. a layer kept by torch.compile's caches)."""
import gc
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import moekit
from conftest import DEVICES

# The layer stays a global to the end, as in a script: torch.compile keeps the globals it traced.
SCRIPT = textwrap.dedent("""
    import sys, torch, moekit
    device = sys.argv[1]
    E, H, I, k = 8, 128, 128, 2
    w13 = (torch.randn(E, 2 * I, H) * 0.05).bfloat16().to(device)
    w2 = (torch.randn(E, H, I) * 0.05).bfloat16().to(device)
    layer = moekit.MoELayer(w13, w2, top_k=k, routing="softmax_topk_renorm")
    x = torch.randn(4, H, device=device).bfloat16()
    logits = torch.randn(4, E, device=device)
    fused = layer(x, router_logits=logits)
    ids, weights = moekit.route(logits, top_k=k)
    external = layer(x, topk_ids=ids, topk_weights=weights)
    assert torch.equal(fused, external)
    if hasattr(torch, "compile"):
        compiled = torch.compile(lambda a, b: layer(a, router_logits=b), fullgraph=True)
        assert torch.equal(compiled(x, logits), fused)
    print("used", layer.backend)
""")


@pytest.mark.parametrize("device", DEVICES)
def test_exit_prints_nothing_on_stderr(device):
    run = subprocess.run([sys.executable, "-c", SCRIPT, device], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("used "), run.stdout
    assert run.stderr == "", run.stderr


def test_a_dropped_layer_releases_its_native_layer():
    layer = moekit.MoELayer(torch.zeros(8, 256, 128).bfloat16(), torch.zeros(8, 128, 128).bfloat16(), top_k=2)
    handle = layer._handle
    assert moekit.ops.native(handle) is not None
    del layer
    gc.collect()
    with pytest.raises(moekit.Error, match=f"layer: no moekit layer has handle {handle}"):
        moekit.ops.native(handle)
