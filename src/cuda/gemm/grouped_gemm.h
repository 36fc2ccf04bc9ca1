// Grouped GEMMs of the experts on Hopper (CUTLASS, TMA warp-specialized; moekit's own kernels):
// the rows of group e are [offsets[e], offsets[e+1]) of A and D (the contiguous format), or the
// first counts[e] of them (counts given: padding or a masked block's empty tail skipped, see
// honours_counts); group e multiplies W[e].
//   D[rows, N] (bf16) = A[rows, K] x W[e][N, K]^T, f32 accumulation.
// Problem sizes and pointers are filled on the GPU from the device offsets: no host sync,
// so a call can be captured in a CUDA graph. Groups with no rows cost nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "moekit/config.h"
#include "moekit/error.h"
#include "moekit/tensor.h"

namespace moekit::cuda {

// The operand types and how scales enter the K loop.
enum class GemmKind : std::uint8_t {
  bf16,          // A, W bf16; no scales
  fp8_block,     // A 1x128 scales, W 128x128 block scales (DeepSeek)
  fp8_channel,   // A one scale per row, W one scale per output channel (rowwise; also per-tensor, broadcast)
};

// What a GEMM writes: D in bf16, or (GEMM1 of an fp8-block layer with a gated activation) the
// activated rows requantized to FP8 with their 1x128 scales (GroupedGemmArgs::activated), the
// activation stage fused into GEMM1's epilogue, or (GEMM2 at decode sizes) D and then each token's
// k rows of D summed into the layer's output (GroupedGemmArgs::combined), the finalize stage fused
// into GEMM2.
enum class GemmOutput : std::uint8_t { bf16, activated_fp8, combined };

enum class GemmTile : std::uint8_t {
  m128_n128_cooperative,  // 2 consumer warpgroups on one 128-row tile: large groups
  m64_n128_pingpong,      // 2 consumer warpgroups alternating 64-row tiles: small groups
  rows8_warp_mma,         // warps of mma.sync, 16 channels x 8 rows of a group: decode (fp8_block)
  m192_n128_wgmma,        // moekit's TMA + WGMMA kernel, f32 promotion every 32 of K (FP8), 3 warpgroups
  m128_n128_wgmma,        // the same, 128-row tiles, 2 warpgroups
  m64_n128_wgmma,         // the same with 64-row tiles: few rows per group
  m192_n128_wgmma_k128,   // the same kernel with f32 promotion every 128 of K (fp8_channel)
  m128_n128_f16,          // moekit's TMA + f16 WGMMA kernel on FP8 values, f32 every 128 of K, 2 warpgroups
  m64_n128_f16,           // the same with 64-row tiles
  tokens8_n128_wgmma,     // moekit's decode kernel (fp8_block): W as WGMMA's 64-row operand, a group's
  tokens16_n128_wgmma,    //   rows as its N of 8, 16 or 32; f32 every 128 K; persistent, 2 blocks/SM
  tokens32_n128_wgmma,
  m128_n128_persistent,   // moekit's persistent block-scaled kernel (fp8_block): 2 warpgroups of 64 rows,
  m128_n192_persistent,   //   f32 every 128 K, scales staged with the tiles; 192 columns straddle 2 W scales
  m128_n256_persistent_act,  // the same for GEMM1 + activation + requantization (GemmOutput::activated_fp8):
                             //   128 gate and the 128 up columns of the same channels
  tokens192_n128_persistent,  // the persistent kernel with W as WGMMA's 64-row operand (2 warpgroups, 128
                              //   W rows) and up to 192 rows of a group as its N, in steps of 32: ragged groups
  m128_n128_persistent_k32,   // the persistent 128 x 128 tiles with f32 every 32 K (exact)
  tokens8_n256_act,   // the decode kernel for GEMM1 + activation + requantization (GemmOutput::activated_fp8):
  tokens16_n256_act,  //   128 gate and the 128 up W rows of the same channels, 8, 16 or 32 rows of a group
  tokens32_n256_act,
  m128_n128_persistent_x2,      // the persistent tiles on clusters of two blocks at neighbouring row
  m128_n192_persistent_x2,      //   tiles of the same column tile, each loading half of the W tile into
  m128_n256_persistent_act_x2,  //   both (TMA multicast)
  tokens192_n128_persistent_x2,  // the swapped tiles on clusters of two blocks at neighbouring W tiles
  tokens8_n128_combine,   // the decode kernel for GEMM2 + the weighted combine (GemmOutput::combined):
  tokens16_n128_combine,  //   the block that stores a 128-column block's last tile sums that block's
                          //   columns of every token's k rows
  m128_n160_persistent,   // the persistent tiles 160 columns wide (straddling 2 W scales, as 192):
                          //   measured fastest at deepseek-v3's GEMM2 (N 7168, K 2048; H100, 2026-12-05)
  m128_n128_persistent_tma,  // the persistent 128 x 128 and 128 x 192 tiles writing their bf16 rows by
  m128_n192_persistent_tma,  //   TMA bulk stores (16 rows x 32 columns a store, two buffers a warp)
};

// What a tile writes: the activated FP8 rows (m128_n256_persistent_act, tokens*_n256_act), D and the
// combined tokens (tokens*_n128_combine), else bf16.
constexpr GemmOutput output_of(GemmTile tile) {
  if (tile == GemmTile::tokens8_n128_combine || tile == GemmTile::tokens16_n128_combine) return GemmOutput::combined;
  const bool activated = tile == GemmTile::m128_n256_persistent_act || tile == GemmTile::m128_n256_persistent_act_x2 ||
                         tile == GemmTile::tokens8_n256_act ||
                         tile == GemmTile::tokens16_n256_act || tile == GemmTile::tokens32_n256_act;
  return activated ? GemmOutput::activated_fp8 : GemmOutput::bf16;
}

// Every tile, in the order above.
inline constexpr GemmTile kAllGemmTiles[] = {
    GemmTile::m128_n128_cooperative, GemmTile::m64_n128_pingpong,  GemmTile::rows8_warp_mma,
    GemmTile::m192_n128_wgmma,       GemmTile::m128_n128_wgmma,    GemmTile::m64_n128_wgmma,
    GemmTile::m192_n128_wgmma_k128,  GemmTile::m128_n128_f16,      GemmTile::m64_n128_f16,
    GemmTile::tokens8_n128_wgmma,    GemmTile::tokens16_n128_wgmma, GemmTile::tokens32_n128_wgmma,
    GemmTile::m128_n128_persistent,  GemmTile::m128_n192_persistent,  GemmTile::m128_n256_persistent_act,
    GemmTile::tokens192_n128_persistent, GemmTile::m128_n128_persistent_k32, GemmTile::tokens8_n256_act,
    GemmTile::tokens16_n256_act,     GemmTile::tokens32_n256_act,  GemmTile::m128_n128_persistent_x2,
    GemmTile::m128_n192_persistent_x2, GemmTile::m128_n256_persistent_act_x2, GemmTile::tokens192_n128_persistent_x2,
    GemmTile::tokens8_n128_combine,  GemmTile::tokens16_n128_combine,
    GemmTile::m128_n160_persistent,  GemmTile::m128_n128_persistent_tma, GemmTile::m128_n192_persistent_tma};

std::string_view to_string(GemmKind kind);
std::string_view to_string(GemmTile tile);

// The problem, fixed for a layer: only the rows per group change from call to call.
struct GroupedGemmDesc {
  GemmKind kind = GemmKind::bf16;
  std::int64_t groups = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  std::int64_t max_rows = 0;  // upper bound of offsets[groups]
  std::int64_t data_rows = 0;  // upper bound of the rows that carry data (T k); 0: max_rows
  GemmOutput output = GemmOutput::bf16;
  // A's rows read by index (GroupedGemmArgs::a_rows; the decode tiles, reads_rows_by_index): no
  // gather pass before GEMM1.
  bool a_by_index = false;
  std::string to_string() const;
};

struct GroupedGemmConfig {
  GemmTile tile = GemmTile::m128_n128_cooperative;
  std::string to_string() const;
};

// Device memory, all of it on the GPU. Scales are MN-major, one set per 128 of K:
//   a_scales  group e's [ceil(K/128), M_e] block (M contiguous) at a_scales + offsets[e] * ceil(K/128);
//             fp8_channel repeats a row's one scale over the K blocks
//   w_scales  fp8_block:   [groups, ceil(K/128), ceil(N/128)] (the transpose of the public layout)
//             fp8_channel: [groups, ceil(K/128), N], a channel's one scale repeated over the K blocks
// (A zero stride over the K blocks would save the repeats, but CUTLASS 4.2's blockwise mainloop
// does not honour it: measured wrong on the H200.)
// GemmOutput::activated_fp8: N = 2I (gate rows, then up rows); the activated rows [rows, I] e4m3
// and their scales in GEMM2's A layout (group e's [I/128, M_e] at scales + offsets[e] * I/128).
struct ActivatedOut {
  void* q = nullptr;
  float* scales = nullptr;
  Activation act = Activation::silu_and_mul;  // gated: not relu2
  float alpha = 1.702f, limit = 7.0f;         // swiglu_oai
  bool ue8m0 = false;
};

// GemmOutput::combined (GEMM2 of the staged path): out[t] = bf16( sum_{j ascending} w[t, j] *
// D[slot_rows[t, j]] ), f32 sums in slot order, products rounded before the add (finalize's
// arithmetic, the same bits); a slot of row -1 adds nothing, no weights: w = 1. N a multiple of 8.
// The GEMM's workspace holds a count per 128-column block, which must be 0 when the kernel starts
// (the one-block permutation plan zeroes it: permute::PlanArgs::zeroed); the kernel leaves it 0.
struct CombinedOut {
  const std::int32_t* slot_rows = nullptr;  // [tokens, top_k]
  const float* weights = nullptr;           // [tokens, top_k], or null
  bf16* out = nullptr;                      // [tokens, N]
  std::int64_t tokens = 0;
  int top_k = 0;
};

struct GroupedGemmArgs {
  const void* a = nullptr;
  const float* a_scales = nullptr;
  const std::int32_t* offsets = nullptr;  // [groups + 1], as the permutation plan writes them
  const void* w = nullptr;
  const float* w_scales = nullptr;
  bf16* d = nullptr;
  // [groups] the rows of each group that carry data, its first counts[e] (the rest is padding, or
  // the empty tail of a masked block; 0 <= counts[e] <= offsets[e+1] - offsets[e]): optional;
  // every kernel but CUTLASS's FP8 ones (honours_counts) then computes and writes those rows alone.
  // null: every row of offsets
  const std::int32_t* counts = nullptr;
  ActivatedOut activated = {};  // GemmOutput::activated_fp8 only (d unused then)
  CombinedOut combined = {};    // GemmOutput::combined only (d written too: the rows' exchange)
  // GroupedGemmDesc::a_by_index only: [max_rows] the row of `a` ([*, K], FP8; its scales k-major
  // [*, ceil(K/128)] in a_scales) that each of the GEMM's rows reads, -1: zeros (padding).
  const std::int32_t* a_rows = nullptr;
};

// Whether the tile can read A's rows by index (GroupedGemmDesc::a_by_index): the decode tiles.
bool reads_rows_by_index(GemmTile tile);

// Whether the kernel of (kind, tile) computes and writes only the first counts[e] rows of a
// group (all but CUTLASS's FP8 tiles, which compute every row of offsets).
bool honours_counts(GemmKind kind, GemmTile tile);

// Rows the tile computes for a group of `rows` rows that carry data (the layer pads each group to 16
// rows; every tile computes whole row tiles of those, except that the persistent 128-row tiles skip a
// short last tile's idle 64 rows and the swapped tiles fit their N to the rows in steps of 32).
std::int64_t computed_rows(GemmTile tile, std::int64_t rows);

// The heuristic: one rule per line, with the reason in the returned string.
struct GemmChoice {
  GroupedGemmConfig config;
  std::string reason;
};
// How closely an FP8 GEMM's sums must follow the CPU's f32 ones. A GEMM whose bf16 output is
// quantized to FP8 next (GEMM1 of an FP8 layer) turns a last-bit difference into a whole FP8 step
// now and then:
//   tensor_core  128 of K in the FP8 tensor core per f32 promotion (CUTLASS; per-row scales: moekit's
//                m192_n128_wgmma_k128): GEMM2, and GEMM1 with fast accumulation (the default)
//   k32          at most 32 (moekit's FP8 WGMMA kernel): GEMM1 with exact accumulation
//   f32          f16 WGMMAs on the FP8 values, f32-like sums (moekit's f16 kernel): strict
enum class GemmSums : std::uint8_t { tensor_core, k32, f32 };
// batch_invariant: the same tile at every batch size (a large batch's), so that a row's sums never
// depend on how many rows came with it; otherwise by the expected rows per group.
GemmChoice choose_gemm_config(const GroupedGemmDesc& desc, double expected_rows_per_group, GemmSums sums,
                              bool batch_invariant);
// The masked format: groups of max_rows / groups rows of which the caller expects
// expected_rows_per_group to carry data; only tiles that honour counts (the rest of a block is
// neither computed nor written), the same tile for every count when batch_invariant.
GemmChoice choose_masked_gemm_config(const GroupedGemmDesc& desc, double expected_rows_per_group, GemmSums sums,
                                     bool batch_invariant);
// The sums a layer's GEMM1 (requantized) or GEMM2 needs under its FP8 accumulation mode.
GemmSums gemm_sums(GemmKind kind, Fp8Accumulation accumulation, bool requantized);

Status can_implement(const GroupedGemmDesc& desc, const GroupedGemmConfig& config);
std::size_t workspace_size(const GroupedGemmDesc& desc, const GroupedGemmConfig& config);
// Asynchronous on stream; workspace is device memory of workspace_size bytes.
void run_grouped_gemm(const GroupedGemmDesc& desc, const GroupedGemmConfig& config, const GroupedGemmArgs& args,
                      void* workspace, void* stream);

}  // namespace moekit::cuda
