"""Bad arguments raise before anything is written: moekit.Error (a ValueError) with moekit's
message, which names the argument; TypeError for what is not a tensor or a bad call form."""
import pytest
import torch

import moekit
from conftest import random_layer


@pytest.fixture
def layer(rng):
    w13, w2, _, _ = random_layer(rng)
    return moekit.MoELayer(w13, w2, top_k=2)


def raises(match, f, kind=moekit.Error):
    with pytest.raises(kind, match=match):
        f()


def test_forward_arguments(layer):
    h = torch.randn(4, 256).bfloat16()
    logits = torch.randn(4, 8)
    ids = torch.zeros(4, 2, dtype=torch.int32)
    w = torch.ones(4, 2)
    raises("hidden: expected", lambda: layer(h.float(), router_logits=logits))
    raises("hidden: expected", lambda: layer(torch.randn(4, 128).bfloat16(), router_logits=logits))
    raises("router_logits: expected", lambda: layer(h, router_logits=torch.randn(4, 7)))
    raises("router_logits: expected", lambda: layer(h, router_logits=logits.to(torch.float64)))
    raises("topk_ids: expected ids in", lambda: layer(h, topk_ids=ids + 8, topk_weights=w))
    raises("topk_weights: expected", lambda: layer(h, topk_ids=ids, topk_weights=w.double()))
    raises("topk_ids: expected", lambda: layer(h, topk_ids=ids[:, :1], topk_weights=w))
    raises("out: expected", lambda: layer(h, topk_ids=ids, topk_weights=w, out=torch.empty(4, 256)))
    raises("router_logits, or topk_ids", lambda: layer(h), TypeError)
    raises("not both", lambda: layer(h, router_logits=logits, topk_ids=ids, topk_weights=w), TypeError)
    assert issubclass(moekit.Error, ValueError)


def test_out_is_not_written_on_error(layer):
    h = torch.randn(4, 256).bfloat16()
    out = torch.full((4, 256), 7.0, dtype=torch.bfloat16)
    with pytest.raises(moekit.Error):
        layer(h, topk_ids=torch.full((4, 2), 99, dtype=torch.int32), topk_weights=torch.ones(4, 2), out=out)
    assert bool((out == 7.0).all())


def test_layer_arguments(rng):
    w13, w2, s13, s2 = random_layer(rng, quant="fp8-block")
    raises("w13_scale: expected", lambda: moekit.MoELayer(w13, w2, w13_scale=s13[:, :1], w2_scale=s2, top_k=2))
    raises("w2: expected", lambda: moekit.MoELayer(w13, w2[:, :, :64], w13_scale=s13, w2_scale=s2, top_k=2,
                                                  intermediate_size=128))
    raises("top_k", lambda: moekit.MoELayer(w13, w2, w13_scale=s13, w2_scale=s2, top_k=9))
    raises("unknown key 'topk'", lambda: moekit.MoELayer(w13, w2, w13_scale=s13, w2_scale=s2, topk=2))
    raises("routing", lambda: moekit.MoELayer(w13, w2, w13_scale=s13, w2_scale=s2, top_k=2, routing="bogus"))
    raises("preset: expected one of", lambda: moekit.MoELayer(w13, w2, preset="bogus"))
    raises("w13_scale", lambda: moekit.MoELayer(w13, w2, top_k=2))
    raises("w13: expected a torch.Tensor", lambda: moekit.MoELayer([1], w2, top_k=2),
           TypeError)
    raises("e_score_correction_bias", lambda: moekit.MoELayer(w13, w2, w13_scale=s13, w2_scale=s2, top_k=2,
                                                               routing="sigmoid_bias_renorm"))
    raises("backend", lambda: moekit.MoELayer(w13, w2, w13_scale=s13, w2_scale=s2, top_k=2, backend="bogus"))


def test_route_and_weight_helpers():
    raises("top_k", lambda: moekit.route(torch.randn(3, 8), top_k=9))
    raises("method", lambda: moekit.route(torch.randn(3, 8), top_k=2, routing="external"))
    raises("bias: ", lambda: moekit.route(torch.randn(3, 8), top_k=2, routing="sigmoid_bias_renorm"))
    raises("quant: expected", lambda: moekit.quantize_weights(torch.randn(2, 8, 8), "fp4"))
    raises("w: expected", lambda: moekit.quantize_weights(torch.randn(8), "fp8-block"))
    raises("nonexistent: not a checkpoint folder", lambda: moekit.import_hf_layer("/nonexistent", 0))
