"""torch.ops.moekit.*: opcheck (schema, fake tensors, AOT dispatch), torch.compile(fullgraph=True)
with the fake implementations, and on the GPU torch.cuda.graph capture, device weights borrowed,
and the bits of a layer made from host weights (the C++ Layer's own path)."""
import pytest
import torch

import moekit
import reference as ref
from conftest import DEVICES, HAVE_CUDA, random_layer, to


def make(device, rng, quant="fp8-block", tokens=6):
    w13, w2, s13, s2 = random_layer(rng, quant=quant)
    layer = moekit.MoELayer(*to(device, w13, w2), w13_scale=to(device, s13)[0], w2_scale=to(device, s2)[0], top_k=2)
    hidden = torch.randn(tokens, 256, generator=rng).bfloat16().to(device)
    logits = torch.randn(tokens, 8, generator=rng).to(device)
    return layer, hidden, logits


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device, rng):
    layer, hidden, logits = make(device, rng)
    ids, weights = moekit.route(logits, top_k=2)
    out = torch.empty_like(hidden)
    torch.library.opcheck(torch.ops.moekit.fused.default, (layer._handle, hidden, logits))
    torch.library.opcheck(torch.ops.moekit.experts.default, (layer._handle, hidden, ids, weights))
    torch.library.opcheck(torch.ops.moekit.experts_out.default, (layer._handle, hidden, ids, weights, out))
    torch.library.opcheck(torch.ops.moekit.route.default, (logits, None, 2, "softmax_topk_renorm", 1, 1, 1.0))


@pytest.mark.parametrize("device", DEVICES)
def test_eager_calls_match_the_ops(device, rng):
    """MoELayer and moekit.route call the layer directly when nothing traces them: the same bits as
    the ops torch.compile runs, for every entry point, with caller outputs poisoned first."""
    layer, hidden, logits = make(device, rng)
    ids, weights = moekit.route(logits, top_k=2)
    op_ids, op_weights = torch.ops.moekit.route(logits, None, 2, "softmax_topk_renorm", 1, 1, 1.0)
    assert torch.equal(ids, op_ids) and torch.equal(weights, op_weights)
    assert torch.equal(layer(hidden, router_logits=logits), torch.ops.moekit.fused(layer._handle, hidden, logits))
    expected = torch.ops.moekit.experts(layer._handle, hidden, ids, weights)
    assert torch.equal(layer(hidden, topk_ids=ids, topk_weights=weights), expected)
    out = torch.full_like(hidden, float("nan"))
    assert layer(hidden, topk_ids=ids, topk_weights=weights, out=out) is out
    assert torch.equal(out, expected)
    # A tensor of another library (numpy, through DLPack) is taken too where torch's are.
    if device == "cpu":
        np_out = torch.full_like(hidden, float("nan"))
        layer._layer.external(hidden, ids.numpy(), weights.numpy(), np_out,
                              torch.empty(layer._layer.workspace_size(hidden.shape[0]), dtype=torch.uint8), 0)
        assert torch.equal(np_out, expected)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device, backend, rng):
    layer, hidden, logits = make(device, rng)

    def block(h, lg):  # router, experts, and torch around them
        ids, weights = moekit.route(lg * 1.0, top_k=2)
        return layer(h, topk_ids=ids, topk_weights=weights) + layer(h, router_logits=lg)

    compiled = torch.compile(block, fullgraph=True, backend=backend)
    expected = block(hidden, logits)
    assert torch.equal(compiled(hidden, logits), expected)
    # Another T: the fake implementations' shapes follow it.
    more = torch.randn(9, 256, dtype=torch.bfloat16, device=device)
    more_logits = torch.randn(9, 8, device=device)
    assert torch.equal(compiled(more, more_logits), block(more, more_logits))


@pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device or build")
@pytest.mark.parametrize("quant", ["bf16", "fp8-block"])
def test_cuda_graph_capture_and_device_weights(quant, rng):
    w13, w2, s13, s2 = random_layer(rng, quant=quant)
    from_host = moekit.MoELayer(w13, w2, w13_scale=s13, w2_scale=s2, top_k=2, backend="cuda")
    device = moekit.MoELayer(*to("cuda", w13, w2, s13, s2)[:2], w13_scale=to("cuda", s13)[0],
                             w2_scale=to("cuda", s2)[0], top_k=2, max_tokens=64)
    assert device.backend == "cuda"
    scale_bytes = 0 if quant == "bf16" else 4 * 8 * (2 * 2 + 2 * 1)  # [E, KB, NB] for w13 and w2
    assert device.owned_bytes == scale_bytes  # the weights are borrowed: only scales are copied
    hidden = torch.randn(16, 256, generator=rng).bfloat16().cuda()
    logits = torch.randn(16, 8, generator=rng).cuda()
    eager = device(hidden, router_logits=logits)
    assert torch.equal(eager.view(torch.int16), from_host(hidden, router_logits=logits).view(torch.int16))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        device(hidden, router_logits=logits)  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = device(hidden, router_logits=logits)
    for _ in range(3):
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured.view(torch.int16), eager.view(torch.int16))
    hidden.copy_(torch.randn(16, 256, generator=rng).bfloat16())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.view(torch.int16), device(hidden, router_logits=logits).view(torch.int16))
    expected = ref.moe(hidden.cpu(), *ref.route(logits.cpu(), "softmax_topk_renorm", 2), w13, w2, s13, s2, quant)
    assert ref.rel_err(captured, expected) <= (5e-3 if quant == "bf16" else 2e-2)
