"""The same MoE layer run by the alternatives a user would pick, on the same inputs as
`moekit bench`/`moekit run`, each checked against moekit's output (issue #5).

    moekit run --preset deepseek-v3 --tokens 4096 --save-layer /tmp/l.safetensors --dump /tmp/o.safetensors
    python3 bench/peers/moe_peers.py --layer /tmp/l.safetensors --moekit-out /tmp/o.safetensors \\
        --name deepseek-v3 --tokens 1,8,64,512,4096 --json peers-deepseek-v3.json

Peers (--peers, default all; each runs routing, experts and combine from router_logits):
  torch_loop         plain PyTorch bf16, per-expert loop (HF transformers style)
  grouped_mm         torch._grouped_mm bf16
  scaled_mm_loop     per-expert torch._scaled_mm, FP8 1x128 x 128x128 blockwise (fp8-block files)
  scaled_grouped_mm  torch._scaled_grouped_mm, FP8 rowwise (weights requantized per row at load)
Case T uses the first T rows of hidden/router_logits; its reference is the first T rows of
moekit's `out` (or the file's `expected_out` without --moekit-out). Time: CUDA events, 3
warm-ups, median of --runs; weight preparation is outside it, everything else inside.
A peer that fails reports 'unavailable: <error>' and the script goes on.
Expected rel_err against an fp8-block moekit: scaled_mm_loop ~5e-3 (same quantization points);
the bf16 peers and the rowwise peer differ by quantization, not by mistakes (~4e-2 and ~8e-2 on
random weights, measured on the H200 with torch 2.11).

    python3 bench/peers/moe_peers.py --self-test   # CPU check of routing and peer plumbing
"""
import argparse
import gc
import json
import statistics
import sys
import time

import torch

from gemm_ops import TorchOps
from layer_file import first_rows, read_layer_file
from peers_bf16 import GroupedMM, TorchLoop
from peers_fp8 import ScaledGroupedMM, ScaledMMLoop

PEERS = {p.name: p for p in (TorchLoop, GroupedMM, ScaledMMLoop, ScaledGroupedMM)}
WARMUP = 3


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layer", help="layer file (moekit run --save-layer)")
    p.add_argument("--moekit-out", help="moekit run --dump output (tensor 'out' [TMAX, H] bf16)")
    p.add_argument("--tokens", default="1,8,64,512,4096", help="comma list of T (each <= the file's rows)")
    p.add_argument("--name", default="", help="preset name for the report")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--peers", default=",".join(PEERS), help="comma list of " + "|".join(PEERS))
    p.add_argument("--json", help="write the results here")
    p.add_argument("--device", default="cuda")
    p.add_argument("--self-test", action="store_true", help="CPU self-test on the golden layer file")
    p.add_argument("--golden", default="/work/shared/golden", help="golden folder for --self-test")
    return p.parse_args(argv)


# ---- measurement ----------------------------------------------------------------------

def median_us(fn, runs, on_gpu):
    """Median of `runs` timed calls after WARMUP, in µs: CUDA events on a GPU, a host clock on the CPU."""
    for _ in range(WARMUP):
        fn()
    if not on_gpu:
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e6)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(times)


def rel_err(out, ref):
    """||out - ref|| / ||ref|| over all elements, in float64."""
    o, r = out.double(), ref.double()
    return ((o - r).norm() / r.norm()).item()


def unavailable(exc):
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"unavailable: {type(exc).__name__}: {message[:300]}"


# ---- one peer -------------------------------------------------------------------------

def run_case(peer, layer, reference, tokens, runs):
    """One (peer, T): the output checked, then timed. Returns the JSON case."""
    case = {"peer": peer.name, "tokens": tokens, "us": None, "rel_err_vs_moekit": None, "status": "ok"}
    inputs = first_rows(layer, tokens)
    try:
        out = peer.forward(inputs)
        if reference is not None:
            err = rel_err(out, reference[:tokens])
            case["nan"] = bool(torch.isnan(out).any().item())
            case["rel_err_vs_moekit"] = None if err != err else err  # JSON has no NaN
        del out
        case["us"] = median_us(lambda: peer.forward(inputs), runs, inputs.hidden.is_cuda)
    except Exception as exc:  # a peer's failure is a result, not a crash
        case["status"] = unavailable(exc)
    return case


def run_peer(name, layer, reference, token_list, args, ops):
    """Every T for one peer; its weights are freed before the next peer."""
    peer = PEERS[name]()
    reason = peer.can_implement(layer.config)
    try:
        if reason is None:
            peer.prepare(layer, ops)
    except Exception as exc:
        reason = unavailable(exc)[len("unavailable: "):]
    if reason is not None:
        cases = [{"peer": name, "tokens": t, "us": None, "rel_err_vs_moekit": None, "status": "unavailable: " + reason}
                 for t in token_list]
    else:
        cases = [run_case(peer, layer, reference, t, args.runs) for t in token_list]
    for case in cases:
        print_case(case)
    del peer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return cases


def print_case(case):
    us = f"{case['us']:10.1f} us" if case["us"] is not None else " " * 13
    err = case["rel_err_vs_moekit"]
    err_text = "NaN!" if case.get("nan") else (f"{err:.2e}" if err is not None else "-")
    print(f"{case['peer']:18s} T={case['tokens']:<6d} {us}  rel_err={err_text:9s} {case['status'][:140]}", flush=True)


# ---- inputs ---------------------------------------------------------------------------

def read_reference(args, layer, device):
    """moekit's out [TMAX, H] (or the file's expected_out), or None."""
    if args.moekit_out:
        from safetensors import safe_open
        with safe_open(args.moekit_out, framework="pt", device="cpu") as f:
            out = f.get_tensor("out")
    elif "expected_out" in layer.extra:
        out = layer.extra["expected_out"]
    else:
        return None
    if out.dim() != 2 or out.shape[1] != layer.config.hidden_size:
        raise ValueError(f"moekit out: expected [T, {layer.config.hidden_size}], given {list(out.shape)}")
    return out.to(device)


def token_counts(args, layer, reference):
    rows = layer.num_tokens if reference is None else min(layer.num_tokens, reference.shape[0])
    counts = [int(t) for t in args.tokens.split(",") if t.strip()]
    for t in counts:
        if not 1 <= t <= rows:
            print(f"moe_peers: T={t} skipped: the layer file (and moekit's out) have {rows} rows", file=sys.stderr)
    return [t for t in counts if 1 <= t <= rows]


def device_name(device):
    return torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"


def main(argv=None):
    args = parse_args(argv)
    if args.self_test:
        from self_test import self_test
        return self_test(args.golden)
    if not args.layer:
        print("moe_peers: give --layer FILE (or --self-test)", file=sys.stderr)
        return 2
    names = [n for n in args.peers.split(",") if n]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        print(f"moe_peers: --peers: unknown {unknown}; expected some of {'|'.join(PEERS)}", file=sys.stderr)
        return 2
    layer = read_layer_file(args.layer, args.device)
    reference = read_reference(args, layer, args.device)
    token_list = token_counts(args, layer, reference)
    c = layer.config
    print(f"# {args.name or args.layer}: {c.to_string()}  torch {torch.__version__} on {device_name(args.device)}")
    cases = []
    for name in names:
        cases += run_peer(name, layer, reference, token_list, args, TorchOps)
    result = {"preset": args.name, "quant": c.quant, "torch": torch.__version__, "gpu": device_name(args.device),
              "cases": cases}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
