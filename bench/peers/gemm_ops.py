"""The GEMM calls the peers make, in one place: torch's own ops on the GPU, and plain f32
emulations with the same arguments for the CPU self-test (which checks the peers' plumbing:
permutation, offsets, padding, scale shapes; not torch's kernels).

Arguments, for every backend (weights in the file's nn.Linear layout [.., N, K]):
  grouped_mm(a [M, K] bf16, w [G, N, K] bf16, offs [G] i32)                       -> [M, N] bf16
  scaled_grouped_mm(a [M, K] fp8, sa [M] f32, w [G, N, K] fp8, sw [G, N] f32, offs) -> [M, N] bf16
  scaled_mm_block(a [M, K] fp8, sa [M, K/128] f32, w [N, K] fp8, sw [N/128, K/128] f32) -> [M, N] bf16
where group g owns rows [offs[g-1], offs[g]) of a, and real = q × scale throughout.
"""
import torch

from layer_file import BLOCK

BF16 = torch.bfloat16


class TorchOps:
    """torch's grouped and scaled GEMMs (CUTLASS / cuBLASLt underneath)."""
    name = "torch"

    @staticmethod
    def grouped_mm(a, w, offs):
        # mat_b [G, K, N] as a transposed view of the [G, N, K] weights ("column-major" per group).
        return torch._grouped_mm(a, w.transpose(-2, -1), offs=offs, out_dtype=BF16)

    @staticmethod
    def scaled_grouped_mm(a, sa, w, sw, offs):
        # Rowwise FP8: mat_a row-major, mat_b column-major [G, K, N]; scale_a [M], scale_b [G, N].
        return torch._scaled_grouped_mm(a, w.transpose(-2, -1), sa, sw, offs=offs, out_dtype=BF16)

    @staticmethod
    def scaled_mm_block(a, sa, w, sw):
        # cuBLASLt blockwise: 1x128 activation scales M-major ([M, K/128] with stride (1, M)),
        # 128x128 weight scales passed as the transposed view of [N/128, K/128].
        return torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sw.t(), out_dtype=BF16)


def _expand_blocks(s, n, k):
    """Per-element scale [n, k] of a block scale [ceil(n/128), ceil(k/128)]."""
    return s.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)[:n, :k]


def _groups(offs):
    begin = 0
    for g, end in enumerate(offs.tolist()):
        yield g, begin, end
        begin = end


class EmulatedOps:
    """f32 emulations: dequantize, matmul, round to bf16. Rows past offs[-1] stay 0."""
    name = "emulated"

    @staticmethod
    def grouped_mm(a, w, offs):
        out = torch.zeros(a.shape[0], w.shape[1], dtype=BF16, device=a.device)
        for g, begin, end in _groups(offs):
            out[begin:end] = (a[begin:end].float() @ w[g].float().t()).to(BF16)
        return out

    @staticmethod
    def scaled_grouped_mm(a, sa, w, sw, offs):
        assert sa.dim() == 1 and sw.dim() == 2 and sw.shape == w.shape[:2], "rowwise scale shapes"
        out = torch.zeros(a.shape[0], w.shape[1], dtype=BF16, device=a.device)
        for g, begin, end in _groups(offs):
            rows = a[begin:end].float() * sa[begin:end, None]
            weight = w[g].float() * sw[g][:, None]
            out[begin:end] = (rows @ weight.t()).to(BF16)
        return out

    @staticmethod
    def scaled_mm_block(a, sa, w, sw):
        (m, k), n = a.shape, w.shape[0]
        assert sa.shape == (m, -(-k // BLOCK)) and sa.t().is_contiguous(), "scale_a: [M, K/128], M-major"
        rows = a.float() * sa.repeat_interleave(BLOCK, dim=1)[:, :k]
        weight = w.float() * _expand_blocks(sw, n, k)
        return (rows @ weight.t()).to(BF16)
