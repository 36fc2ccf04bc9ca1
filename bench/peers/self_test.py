"""CPU self-test of the peer scripts (development only, not CI):

    python3 bench/peers/moe_peers.py --self-test [--golden /work/shared/golden]

1. routing.py against golden/routing.safetensors (ids exact, weights to 1e-5 relative);
2. every peer on golden/layer_fp8_block_small.safetensors against its expected_out, with the
   emulated GEMMs of gemm_ops (and torch's own _grouped_mm where torch runs it on the CPU);
3. every peer on small random layers (each quant scheme, activation and a few routing methods)
   against torch_loop, which checks the plumbing of the paths the golden file does not reach.
torch's FP8 GEMMs themselves only run on the GPU; this cannot test them.
"""
import json
import os

import torch
from safetensors import safe_open

from gemm_ops import EmulatedOps, TorchOps
from layer_file import BLOCK, LayerFile, MoEConfig, dequantize_expert, first_rows, read_layer_file
from moe_math import activate, plan_by_expert, quantize_rows, to_fp8
from moe_peers import PEERS, rel_err
from routing import route

# expected_out is moekit's fp8-block pipeline: only scaled_mm_loop quantizes at the same points.
# The bf16 peers differ by the activations' quantization error, the rowwise peer by another scheme.
GOLDEN_OUT_TOL = {"torch_loop": 8e-2, "grouped_mm": 8e-2, "scaled_mm_loop": 5e-3, "scaled_grouped_mm": 1e-1}
IDEAL_TOL = 1e-2  # torch_loop against the f64 per-token reference on the same (dequantized) weights


class Report:
    def __init__(self):
        self.failures = 0

    def check(self, ok, line):
        self.failures += not ok
        print(f"  {'ok  ' if ok else 'FAIL'} {line}")


# ---- 1. routing -----------------------------------------------------------------------

def test_routing(golden, report):
    print("routing vs golden/routing.safetensors")
    with safe_open(os.path.join(golden, "routing.safetensors"), framework="pt") as f:
        cases = json.loads(f.metadata()["cases"])
        t = {name: f.get_tensor(name) for name in f.keys()}
    for name, c in cases.items():
        method = name.split(".")[0]
        config = MoEConfig(num_experts=t[name + ".router_logits"].shape[1], top_k=c["top_k"], hidden_size=0,
                           intermediate_size=0, routing=method, activation="silu_and_mul", quant="bf16",
                           n_group=c["n_group"], topk_group=c["topk_group"],
                           routed_scaling_factor=c["routed_scaling_factor"])
        ids, w = route(config, t[name + ".router_logits"], t.get(name + ".e_score_correction_bias"))
        want_ids, want_w = t[name + ".topk_ids"].long(), t[name + ".topk_weights"]
        bad_rows = (ids != want_ids).any(dim=1).nonzero().flatten().tolist()
        w_err = ((w - want_w).abs() / want_w.abs().clamp(min=1e-30)).max().item()
        report.check(not bad_rows and w_err <= 1e-5,
                     f"{name:28s} rows with other ids: {bad_rows[:6]}  max weight rel err {w_err:.1e}")


# ---- the ideal reference --------------------------------------------------------------

def ideal_reference(layer):
    """out [T, H] f64 token by token, slot by slot, on the dequantized weights: another
    formulation than any peer's, so a permutation or indexing slip cannot hide in both."""
    c = layer.config
    ids, weights = route(c, layer.router_logits, layer.bias)
    out = torch.zeros(layer.num_tokens, c.hidden_size, dtype=torch.float64)
    for t in range(layer.num_tokens):
        for j in range(c.top_k):
            e, w = int(ids[t, j]), float(weights[t, j])
            x = layer.hidden[t].double() * (w if c.weights_on_input else 1.0)
            w13 = dequantize_expert(layer.w13, layer.w13_scale, c.quant, e).double()
            w2 = dequantize_expert(layer.w2, layer.w2_scale, c.quant, e).double()
            act = activate((w13 @ x).unsqueeze(0), c, dtype=torch.float64)[0]
            out[t] += (w2 @ act) * (1.0 if c.weights_on_input else w)
    return out


def check_ideal(layer, report, label):
    out, _ = run_peer("torch_loop", layer, EmulatedOps, layer.num_tokens)
    err = rel_err(out, ideal_reference(layer))
    report.check(err <= IDEAL_TOL, f"{label} torch_loop vs f64 per-token reference: rel_err {err:.2e}")


# ---- 2. golden layer ------------------------------------------------------------------

def run_peer(name, layer, ops, tokens):
    peer = PEERS[name]()
    reason = peer.can_implement(layer.config)
    if reason:
        return None, reason
    peer.prepare(layer, ops)
    return peer.forward(first_rows(layer, tokens)), None


def test_golden_layer(golden, report):
    layer = read_layer_file(os.path.join(golden, "layer_fp8_block_small.safetensors"))
    expected = layer.extra["expected_out"]
    print(f"peers vs golden expected_out ({layer.config.to_string()}, T={layer.num_tokens})")
    ids, w = route(layer.config, layer.router_logits, layer.bias)
    report.check(torch.equal(ids, layer.extra["expected_topk_ids"].long()) and
                 torch.allclose(w, layer.extra["expected_topk_weights"], rtol=1e-5, atol=0),
                 "routing: expected_topk_ids / expected_topk_weights")
    check_ideal(layer, report, "golden layer")
    for ops in (EmulatedOps, TorchOps):
        for name in PEERS:
            try:
                out, reason = run_peer(name, layer, ops, layer.num_tokens)
            except Exception as exc:  # torch's ops mostly need a GPU
                first_line = (str(exc).strip().splitlines() or [""])[0]
                print(f"  skip {name:18s} ({ops.name} ops): {type(exc).__name__}: {first_line[:100]}")
                continue
            if out is None:
                print(f"  skip {name:18s} ({ops.name} ops): {reason}")
                continue
            err = rel_err(out, expected)
            report.check(err <= GOLDEN_OUT_TOL[name],
                         f"{name:18s} ({ops.name} ops) rel_err {err:.2e} (tolerance {GOLDEN_OUT_TOL[name]:.0e})")


# ---- 3. random layers -----------------------------------------------------------------

def quantize_weights(w, quant):
    """w [E, N, K] f32 -> (q, scale) in the file layout of `quant` (DESIGN §4)."""
    if quant == "bf16":
        return w.to(torch.bfloat16), None
    if quant == "fp8-tensor":
        s = w.abs().amax(dim=(1, 2)) / 448.0
        return to_fp8(w, s[:, None, None]), s
    if quant == "fp8-rowwise":
        q, s = zip(*(quantize_rows(w[e]) for e in range(w.shape[0])))
        return torch.stack(q), torch.stack(s)
    e, n, k = w.shape
    blocks = w.view(e, n // BLOCK, BLOCK, k // BLOCK, BLOCK)
    s = blocks.abs().amax(dim=(2, 4)) / 448.0                    # [E, N/128, K/128]
    return to_fp8(blocks, s[:, :, None, :, None]).view(e, n, k), s


def random_layer(config, tokens, seed):
    g = torch.Generator().manual_seed(seed)
    c = config
    w13 = torch.randn(c.num_experts, c.gemm1_width, c.hidden_size, generator=g) * c.hidden_size ** -0.5
    w2 = torch.randn(c.num_experts, c.hidden_size, c.intermediate_size, generator=g) * c.intermediate_size ** -0.5
    (w13q, w13s), (w2q, w2s) = quantize_weights(w13, c.quant), quantize_weights(w2, c.quant)
    return LayerFile(config=c, hidden=torch.randn(tokens, c.hidden_size, generator=g).to(torch.bfloat16),
                     w13=w13q, w2=w2q, w13_scale=w13s, w2_scale=w2s,
                     router_logits=torch.randn(tokens, c.num_experts, generator=g),
                     bias=torch.randn(c.num_experts, generator=g) * 0.1)


ROUTINGS = [("topk_softmax", 2, 1, 1, 1.0), ("sigmoid_bias_grouped", 2, 4, 2, 2.5), ("top1_sigmoid", 1, 1, 1, 1.0),
            ("softmax_topk_renorm", 2, 1, 1, 1.0), ("sigmoid_bias_renorm", 2, 1, 1, 1.0)]
QUANTS = ["bf16", "fp8-tensor", "fp8-rowwise", "fp8-block"]
ACTIVATIONS = ["silu_and_mul", "gelu_and_mul", "swiglu_oai", "relu2"]


def test_random_layers(report):
    print("peers vs torch_loop on random layers (E=8, H=256, I=128, T=40; emulated GEMMs)")
    case = 0
    for quant in QUANTS:
        for activation in ACTIVATIONS:
            routing, k, n_group, topk_group, factor = ROUTINGS[case % len(ROUTINGS)]
            case += 1
            config = MoEConfig(num_experts=8, top_k=k, hidden_size=256, intermediate_size=128, routing=routing,
                               activation=activation, quant=quant, n_group=n_group, topk_group=topk_group,
                               routed_scaling_factor=factor)
            layer = random_layer(config, tokens=40, seed=case)
            reference, _ = run_peer("torch_loop", layer, EmulatedOps, 40)
            check_ideal(layer, report, f"{quant:11s} {activation:12s} {routing:20s}")
            for name in PEERS:
                out, reason = run_peer(name, layer, EmulatedOps, 40)
                label = f"{quant:11s} {activation:12s} {routing:20s} {name:18s}"
                if out is None:
                    print(f"  skip {label} {reason}")
                    continue
                err = rel_err(out, reference)
                tol = 1e-2 if name == "grouped_mm" else 1.2e-1  # fp8: rowwise requantizes the file's fp8
                report.check(err <= tol and not torch.isnan(out).any(), f"{label} rel_err {err:.2e}")


def test_plan(report):
    ids = torch.tensor([[3, 0], [3, 1], [0, 3], [5, 3]])
    plan = plan_by_expert(ids, num_experts=7)
    ok = plan.offs.tolist() == [2, 3, 3, 7, 7, 8, 8] and plan.order.tolist() == [1, 4, 3, 0, 2, 5, 7, 6]
    report.check(ok, f"expert plan: offs {plan.offs.tolist()} order {plan.order.tolist()}")


def self_test(golden):
    torch.manual_seed(0)
    report = Report()
    test_routing(golden, report)
    test_plan(report)
    test_golden_layer(golden, report)
    test_random_layers(report)
    print(f"self-test: {'all passed' if report.failures == 0 else f'{report.failures} failed'}")
    return 1 if report.failures else 0
