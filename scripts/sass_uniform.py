#!/usr/bin/env python3
"""Checks that moekit's WGMMA kernels take their descriptors from uniform registers (a CTest in CUDA builds).

A WGMMA (QGMMA/HGMMA in the SASS) reads its shared-memory descriptors from uniform registers. Where
ptxas keeps the K loop's stage, descriptors or tile in per-lane registers instead, it moves each
descriptor over (R2UR) right before the WGMMA, and every barrier address with it: the persistent
block-scaled tiles ran 15-17% slower that way (docs/perf-log/grouped-gemm.md, 2026-12-05), and the
8- and 16-row decode kernels did so for months. The cause is always a branch or loop whose condition
ptxas cannot prove warp-uniform inside the tile loop (a warp index from threadIdx, a trip count per
lane): broadcast the value from lane 0 (warp_uniform) or give every lane the warp's trip count.

Counts, per moekit kernel, the WGMMAs whose descriptor register was written by an R2UR since the
previous WGMMA; a kernel with more than one (the K loop's first after the prologue may) fails.

    scripts/sass_uniform.py OBJECT...    (the moekit library's object files, also as one ;-separated
                                         argument; others are skipped)

Exit 0: every kernel passes; 1: one or more does not; 77: no cuobjdump or nvdisasm (CTest reports a
skip). Both are looked for on PATH, beside nvcc, and in PyPI's nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm wheels (scripts/bootstrap.sh installs them where the CUDA toolkit lacks them).
"""
import glob
import os
import re
import shutil
import subprocess
import sys

# The translation units of moekit's own WGMMA kernels (CUTLASS's instances are CUTLASS's).
OWN = re.compile(r"sm90_grouped_gemm_fp8_(block_(n128|n160|n192|k32|act|swap)|decode|decode_act|wgmma|wgmma_k128|f16)\.cu\.o$")
FUNCTION = re.compile(r"Function : (\S+)")
INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]+)\*/\s+(.*?);")
R2UR = re.compile(r"(?:@!?U?P\w+\s+)?R2UR\s+UR(\d+),")
GMMA = re.compile(r"[QH]GMMA\.\S+.*?gdesc\[UR(\d+)\]")


def find_tool(name):
    """name on PATH, beside nvcc, or in PyPI's nvidia-cuda-<name> wheel (nvidia/cu*/bin/<name>)."""
    found = shutil.which(name)
    if found:
        return found
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    beside = os.path.join(os.path.dirname(nvcc), name)
    if os.access(beside, os.X_OK):
        return beside
    try:
        import nvidia
        for root in nvidia.__path__:
            for path in sorted(glob.glob(os.path.join(root, "cu*", "bin", name))):
                if os.access(path, os.X_OK):
                    return path
    except ImportError:
        pass
    return None


def per_lane_descriptors(sass):
    """{kernel: (WGMMAs fed by an R2UR, WGMMAs)} for moekit's kernels in cuobjdump -sass output."""
    out, kernel, written = {}, None, set()
    for line in sass.splitlines():
        m = FUNCTION.search(line)
        if m:
            kernel = m.group(1) if m.group(1).startswith("_ZN6moekit") else None
            written = set()
            continue
        m = INSTRUCTION.match(line)
        if kernel is None or not m:
            continue
        text = m.group(2)
        r = R2UR.match(text)
        if r:
            written.add(int(r.group(1)))
        g = GMMA.search(text)
        if g:
            fed, total = out.get(kernel, (0, 0))
            base = int(g.group(1))  # a descriptor pair: 64-bit A and B, UR base .. base + 3
            out[kernel] = (fed + any(base + i in written for i in range(4)), total + 1)
            written = set()
    return out


def main(objects):
    tool, disasm = find_tool("cuobjdump"), find_tool("nvdisasm")  # cuobjdump -sass runs nvdisasm
    if tool is None or disasm is None:
        print("sass_uniform: no cuobjdump and nvdisasm (PATH, beside nvcc, or PyPI's nvidia-cuda-cuobjdump and "
              "nvidia-cuda-nvdisasm wheels): skipped")
        return 77
    env = dict(os.environ, PATH=os.path.dirname(disasm) + os.pathsep + os.environ.get("PATH", ""))
    checked, failed = 0, 0
    for obj in sorted(o for o in objects if OWN.search(o)):
        sass = subprocess.run([tool, "-sass", obj], check=True, capture_output=True, text=True, env=env).stdout
        for kernel, (fed, total) in sorted(per_lane_descriptors(sass).items()):
            checked += 1
            bad = fed > 1
            failed += bad
            print(f"{'FAIL' if bad else 'ok  '} {fed:3d} of {total:3d} WGMMAs take a descriptor moved from a per-lane "
                  f"register  {os.path.basename(obj)}  {kernel[:100]}")
    print(f"sass_uniform: {checked} kernels, {failed} with per-lane WGMMA descriptors")
    if checked == 0:
        print("sass_uniform: none of moekit's WGMMA objects among the arguments")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    # CTest passes $<TARGET_OBJECTS:moekit> as one ;-separated argument
    sys.exit(main([path for arg in sys.argv[1:] for path in arg.split(";") if path]))
