"""The torch op against `moekit bench` on the same problem (issue #18: the binding adds <= 3 µs at
T = 1 eager and nothing under a CUDA graph).

Timed as `moekit bench` times (tools/cmd_bench.cpp): per call, an event, the call, an event and a
wait; the median of --runs after 3 warm-ups; eager, and as a replayed CUDA graph. Also the host time
of one call (enqueue only, no wait). Needs a GPU and the CLI built with the extension:

    PYTHONPATH=BUILD/python python3 bench/python_op_bench.py --cli BUILD/moekit --preset qwen3-30b-a3b
"""
import argparse
import re
import statistics
import subprocess
import time

import torch

import moekit


def event_median(call, runs):
    stream = torch.cuda.current_stream()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for i in range(runs + 3):
        start.record(stream)
        call()
        stop.record(stream)
        stop.synchronize()
        if i >= 3:
            samples.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(samples)


def host_median(call, runs):
    samples = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def layer_for(preset, tokens):
    cfg = moekit.preset_config(preset)
    e, h, i = cfg["num_experts"], cfg["hidden_size"], cfg["intermediate_size"]
    g = torch.Generator(device="cuda").manual_seed(1)
    if cfg["quant"] == "fp8-block":
        w13 = (torch.randn(e, 2 * i, h, device="cuda", generator=g) * 16).to(torch.float8_e4m3fn)
        w2 = (torch.randn(e, h, i, device="cuda", generator=g) * 16).to(torch.float8_e4m3fn)
        s13 = torch.rand(e, -(-2 * i // 128), -(-h // 128), device="cuda", generator=g) * 1e-3 + 1e-3
        s2 = torch.rand(e, -(-h // 128), -(-i // 128), device="cuda", generator=g) * 1e-3 + 1e-3
    else:
        raise SystemExit(f"{preset}: this bench makes fp8-block layers, the preset's quant is {cfg['quant']}")
    bias = torch.rand(e, device="cuda", generator=g) * 0.1 if "bias" in cfg["routing"] else None
    layer = moekit.MoELayer(w13, w2, w13_scale=s13, w2_scale=s2, e_score_correction_bias=bias, preset=preset,
                            max_tokens=tokens)
    hidden = torch.randn(tokens, h, device="cuda", generator=g).bfloat16()
    logits = torch.randn(tokens, e, device="cuda", generator=g)
    return layer, hidden, logits


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="qwen3-30b-a3b")
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--cli", help="the moekit CLI of the same build, for its `bench` on the same problem")
    args = p.parse_args()
    layer, hidden, logits = layer_for(args.preset, args.tokens)
    op = lambda: layer(hidden, router_logits=logits)  # noqa: E731  (eager: the direct _C call)
    dispatched = lambda: torch.ops.moekit.fused(layer._handle, hidden, logits)  # noqa: E731  (what torch.compile runs)
    # The binding alone (no torch op dispatch): the C++ call through nanobind with a ready workspace.
    raw, out = layer._layer, torch.empty_like(hidden)
    ws = torch.empty(raw.workspace_size(args.tokens), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    direct = lambda: raw.fused(hidden, logits, out, None, None, ws, stream)  # noqa: E731

    graph_stream = torch.cuda.Stream()
    graph_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(graph_stream):
        op()
    torch.cuda.current_stream().wait_stream(graph_stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op()

    print(f"{layer} T={args.tokens}, median of {args.runs} (µs)")
    rows = [("MoELayer eager", op), ("torch.ops.moekit.fused eager", dispatched), ("_C call eager, ready workspace", direct)]
    for name, call in rows:
        print(f"  {name:32s} {event_median(call, args.runs):8.1f}   host per call {host_median(call, args.runs):6.1f}")
    print(f"  {'MoELayer in a CUDA graph':32s} {event_median(graph.replay, args.runs):8.1f}")
    # What MoELayer adds to the _C call, piece by piece (host only): its two allocations from torch's
    # caching allocator, the workspace size, the stream, and the check for tracing.
    pieces = [("out = torch.empty_like(hidden)", lambda: torch.empty_like(hidden)),
              ("workspace_size(T)", lambda: raw.workspace_size(args.tokens)),
              ("workspace = torch.empty(...)", lambda: hidden.new_empty(raw.workspace_size(args.tokens), dtype=torch.uint8)),
              ("current stream", lambda: moekit.ops._stream(hidden)),
              ("traced(hidden)", lambda: moekit.ops.traced(hidden))]
    print("  MoELayer's own host work, per piece:")
    for name, call in pieces:
        print(f"    {name:30s} host per call {host_median(call, args.runs):6.2f}")
    if args.cli:
        for mode in ("off", "on"):
            run = subprocess.run([args.cli, "bench", "--preset", args.preset, "--tokens", str(args.tokens),
                                  "--graph", mode, "--runs", str(args.runs)], capture_output=True, text=True)
            case = re.search(r"T=\d+\s+([\d.]+) us", run.stdout)
            host = re.search(r"host per eager call: ([\d.]+) us", run.stdout)
            if not case:
                print(f"  moekit bench --graph {mode}: no result\n{run.stdout}{run.stderr}")
                continue
            label = f"moekit bench (C++) {'in a CUDA graph' if mode == 'on' else 'eager'}"
            line = f"  {label:32s} {float(case.group(1)):8.1f}"
            if mode == "off" and host:
                line += f"   host per call {float(host.group(1)):6.1f}"
            print(line)


if __name__ == "__main__":
    main()
