// GEMM2's weighted combine (GemmOutput::combined), the part shared by the kernels that do it after
// their tiles: the decode kernel (a column block's last tile sums every token) and the persistent
// block-scaled kernel (a token's last row sums that token). Both sum a token's k rows of D in slot
// order with finalize's arithmetic (f32, each product rounded before the add, bf16 at the end), so
// the output has finalize's bits whichever block sums it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/vec.cuh"
#include "cuda/gemm/grouped_gemm.h"

namespace moekit::cuda::combine {

// The kernels' view of GroupedGemmArgs::combined.
struct CombineOut {
  const std::int32_t* slot_rows;  // [tokens, top_k]
  const float* weights;           // [tokens, top_k] or null (every weight 1)
  const std::int32_t* row_token;  // [rows] each row's token (the persistent kernel's)
  std::uint16_t* out;             // [tokens, N] bf16
  std::int32_t* done;             // the kernel's counts, in its workspace
  int tokens, top_k;
};

// out[token, col .. col + 8) = sum over the token's slots j in order of w[token, j] * D[slot_rows[token,
// j], col .. col + 8). D's rows are other blocks' stores, read from L2 (the caller synchronized with
// them); the slots come 8 at a time, their loads in flight together. `out` need only be 2-byte aligned.
__device__ __forceinline__ void sum_token_columns(const CombineOut& cb, const std::uint16_t* d, int n, int token, int col) {
  constexpr int kBatch = 8;
  float acc[8] = {};
  for (int j0 = 0; j0 < cb.top_k; j0 += kBatch) {
    int row[kBatch];
    float w[kBatch];
    uint4 raw[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const std::size_t slot = std::size_t(token) * cb.top_k + j0 + b;
      row[b] = j0 + b < cb.top_k ? __ldg(cb.slot_rows + slot) : -1;
      w[b] = cb.weights && j0 + b < cb.top_k ? __ldg(cb.weights + slot) : 1.0f;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      raw[b] = row[b] >= 0 ? __ldcg(reinterpret_cast<const uint4*>(d + std::size_t(row[b]) * n + col)) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (row[b] < 0) continue;
      float x[8];
      unpack_bf16x8(raw[b], x);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], cb.weights ? __fmul_rn(w[b], x[i]) : x[i]);
    }
  }
  std::uint16_t* to = cb.out + std::size_t(token) * n + col;
  if (reinterpret_cast<std::uintptr_t>(cb.out) % 16 == 0) {
    *reinterpret_cast<uint4*>(to) = pack_bf16x8(acc);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) to[i] = f32_to_bf16(acc[i]);
  }
}

// The persistent tiles' combine, host side (combine_rows.cu). Its workspace: a count per token and
// column tile of `cols` columns, for as many tokens as GEMM2 has rows of data (T k >= T). Before
// the kernel, start_persistent checks the arguments and sets done[t, c] = -(token t's slots with a
// row), so that the arrival of its last row for column tile c brings it back to 0; a token with no
// row gets no arrival, so its output is set to 0 there.
std::size_t persistent_workspace_size(const GroupedGemmDesc& desc, int cols);
// Where no row has data (no tile at all): every token's sum is 0.
void zero_output(const CombinedOut& combined, std::int64_t n, cudaStream_t stream);
CombineOut start_persistent(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, void* workspace, int cols,
                            cudaStream_t stream);

// A warpgroup's part of the persistent kernel's combine, after its rows [first, first + 64) of the
// tile at rows [row0 + m0, ...) of the group (rows of data below `rows`) and columns [n0, n0 + cols)
// are stored: each row counts one arrival for its token and column tile; the arrival that completes a
// token (done back to 0) sums that token's rows over the tile's columns. `completed` is 64 ints of
// shared memory, `barrier` a named barrier of the warpgroup's 128 threads.
struct TileRows {
  int row0, m0, rows, n0;
};
__device__ __forceinline__ void combine_tile_rows(const CombineOut& cb, const std::uint16_t* d, int n, const TileRows& t,
                                                  int first, int cols, int* completed, int barrier) {
  const int i = int(threadIdx.x % 128);
  __threadfence();  // this thread's D stores, device-wide, before the counts
  asm volatile("bar.sync %0, 128;\n" ::"r"(barrier) : "memory");
  if (i < 64) {
    const int r = t.m0 + first + i;
    int token = -1;
    if (r < t.rows) {
      token = __ldg(cb.row_token + t.row0 + r);
      const int col_tiles = (n + cols - 1) / cols;
      if (atomicAdd(cb.done + std::size_t(token) * col_tiles + t.n0 / cols, 1) != -1) token = -1;  // not the last
    }
    completed[i] = token;
  }
  asm volatile("bar.sync %0, 128;\n" ::"r"(barrier) : "memory");
  __threadfence();  // the other rows' stores, counted before the last arrival
  const int vectors = min(cols, n - t.n0) / 8;
  for (int item = i; item < 64 * vectors; item += 128) {
    const int token = completed[item / vectors];
    if (token >= 0) sum_token_columns(cb, d, n, token, t.n0 + 8 * (item % vectors));
  }
  asm volatile("bar.sync %0, 128;\n" ::"r"(barrier) : "memory");  // `completed` is rewritten at the next tile
}

}  // namespace moekit::cuda::combine
