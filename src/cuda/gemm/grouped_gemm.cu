// Grouped GEMM op entry: picks the compiled instance for (kind, tile), and the heuristic.
#include <cuda_runtime.h>

#include <sstream>

#include "cuda/gemm/grouped_gemm.h"
#include "cuda/gemm/sm90_grouped_gemm_instances.h"

namespace moekit::cuda {
namespace {

struct Entry {
  GemmKind kind;
  GemmTile tile;
  std::size_t (*workspace_size)(const GroupedGemmDesc&);
  Status (*can_implement)(const GroupedGemmDesc&);
  void (*run)(const GroupedGemmDesc&, const GroupedGemmArgs&, void*, cudaStream_t);
};

#define MOEKIT_ENTRY(KIND, TILE, NAME) \
  Entry{KIND, TILE, &sm90::NAME##_workspace_size, &sm90::NAME##_can_implement, &sm90::NAME##_run},
constexpr Entry kEntries[] = {MOEKIT_SM90_GROUPED_GEMM_LIST(MOEKIT_ENTRY)};
#undef MOEKIT_ENTRY

const Entry* find(GemmKind kind, GemmTile tile) {
  for (const Entry& e : kEntries)
    if (e.kind == kind && e.tile == tile) return &e;
  return nullptr;
}

}  // namespace

std::string_view to_string(GemmKind kind) {
  switch (kind) {
    case GemmKind::bf16: return "bf16";
    case GemmKind::fp8_block: return "fp8-block";
    case GemmKind::fp8_channel: return "fp8-channel";
  }
  return "?";
}

std::string_view to_string(GemmTile tile) {
  switch (tile) {
    case GemmTile::m128_n128_cooperative: return "128x128 cooperative";
    case GemmTile::m64_n128_pingpong: return "64x128 ping-pong";
    case GemmTile::rows8_warp_mma: return "warp mma 16 channels x 8 rows";
    case GemmTile::m192_n128_wgmma: return "192x128 wgmma, f32 every 32 K";
    case GemmTile::m128_n128_wgmma: return "128x128 wgmma, f32 every 32 K";
    case GemmTile::m64_n128_wgmma: return "64x128 wgmma, f32 every 32 K";
    case GemmTile::m192_n128_wgmma_k128: return "192x128 wgmma, f32 every 128 K";
    case GemmTile::m128_n128_f16: return "128x128 f16 wgmma on fp8, f32 every 128 K";
    case GemmTile::m64_n128_f16: return "64x128 f16 wgmma on fp8, f32 every 128 K";
    case GemmTile::tokens8_n128_wgmma: return "8 rows x 128 wgmma (W as A), f32 every 128 K";
    case GemmTile::tokens16_n128_wgmma: return "16 rows x 128 wgmma (W as A), f32 every 128 K";
    case GemmTile::tokens32_n128_wgmma: return "32 rows x 128 wgmma (W as A), f32 every 128 K";
    case GemmTile::m128_n128_persistent: return "128x128 persistent wgmma, f32 every 128 K";
    case GemmTile::m128_n160_persistent: return "128x160 persistent wgmma, f32 every 128 K";
    case GemmTile::m128_n192_persistent: return "128x192 persistent wgmma, f32 every 128 K";
    case GemmTile::m128_n128_persistent_tma: return "128x128 persistent wgmma, TMA stores out, f32 every 128 K";
    case GemmTile::m128_n192_persistent_tma: return "128x192 persistent wgmma, TMA stores out, f32 every 128 K";
    case GemmTile::m128_n256_persistent_act: return "128x(128+128) persistent wgmma + activation, f32 every 128 K";
    case GemmTile::tokens192_n128_persistent: return "<=192 rows x 128 persistent wgmma (W as A), f32 every 128 K";
    case GemmTile::m128_n128_persistent_k32: return "128x128 persistent wgmma, f32 every 32 K";
    case GemmTile::tokens8_n256_act: return "8 rows x (128+128) wgmma (W as A) + activation, f32 every 128 K";
    case GemmTile::tokens16_n256_act: return "16 rows x (128+128) wgmma (W as A) + activation, f32 every 128 K";
    case GemmTile::tokens32_n256_act: return "32 rows x (128+128) wgmma (W as A) + activation, f32 every 128 K";
    case GemmTile::m128_n128_persistent_x2: return "128x128 persistent wgmma, 2-block clusters (W multicast), f32 every 128 K";
    case GemmTile::m128_n192_persistent_x2: return "128x192 persistent wgmma, 2-block clusters (W multicast), f32 every 128 K";
    case GemmTile::m128_n256_persistent_act_x2:
      return "128x(128+128) persistent wgmma + activation, 2-block clusters (W multicast), f32 every 128 K";
    case GemmTile::tokens192_n128_persistent_x2:
      return "<=192 rows x 128 persistent wgmma (W as A), 2-block clusters (rows multicast), f32 every 128 K";
    case GemmTile::tokens8_n128_combine: return "8 rows x 128 wgmma (W as A) + weighted combine, f32 every 128 K";
    case GemmTile::tokens16_n128_combine: return "16 rows x 128 wgmma (W as A) + weighted combine, f32 every 128 K";
  }
  return "?";
}

std::string GroupedGemmDesc::to_string() const {
  std::ostringstream os;
  os << cuda::to_string(kind) << " groups=" << groups << " N=" << n << " K=" << k << " max_rows=" << max_rows;
  if (output == GemmOutput::activated_fp8) os << " out=activated-fp8";
  if (a_by_index) os << " a=by-index";
  return os.str();
}

std::string GroupedGemmConfig::to_string() const { return std::string(cuda::to_string(tile)); }

GemmSums gemm_sums(GemmKind kind, Fp8Accumulation accumulation, bool requantized) {
  if (kind == GemmKind::bf16) return GemmSums::tensor_core;
  switch (accumulation) {
    case Fp8Accumulation::exact: return requantized ? GemmSums::k32 : GemmSums::tensor_core;
    case Fp8Accumulation::fast: return GemmSums::tensor_core;
    case Fp8Accumulation::strict: return GemmSums::f32;
  }
  return GemmSums::tensor_core;
}

GemmChoice choose_gemm_config(const GroupedGemmDesc& desc, double rows_per_group, GemmSums sums, bool batch_invariant) {
  // Batch invariance: one tile whatever the batch (never the decode kernel, whose sums differ).
  if (batch_invariant) {
    const GemmTile k32 = desc.kind == GemmKind::fp8_block ? GemmTile::m128_n128_persistent_k32 : GemmTile::m128_n128_wgmma;
    const GemmTile tile = sums == GemmSums::f32 ? GemmTile::m128_n128_f16
                          : sums == GemmSums::k32 ? k32
                                                  : GemmTile::m128_n128_cooperative;
    return {{tile}, "batch-invariant: the same tile at every batch size"};
  }
  const std::string rows = "~" + std::to_string(rows_per_group).substr(0, 4) + " rows per group";
  // Decode: most groups empty or a few rows; a 64-row tile would be padding. The decode WGMMA
  // kernel streams W at 3.5-4.3 TB/s where the others reach 1.5-4.2 (deepseek-v3 and qwen3-30b-a3b
  // shapes at 1-8 rows per group, docs/PERF.md); the warp-MMA kernel stays where its sums are
  // needed (f32-like: exact, strict) and at small K (qwen3-30b-a3b GEMM2, K=768: 12.0 against 13.3 us).
  const bool fast_sums = sums == GemmSums::tensor_core;
  if (desc.kind == GemmKind::fp8_block && rows_per_group <= 0.5 && (!fast_sums || desc.k < 1024) &&
      cuda::can_implement(desc, {GemmTile::rows8_warp_mma}))
    return {{GemmTile::rows8_warp_mma}, rows + " <= 0.5" + (fast_sums ? ", K < 1024" : ", f32-like sums") +
                                            ": warps stream W once per 8 rows, no tile padding"};
  if (desc.kind == GemmKind::fp8_block && fast_sums && rows_per_group <= 8 &&
      cuda::can_implement(desc, {GemmTile::tokens8_n128_wgmma}))
    return {{GemmTile::tokens8_n128_wgmma}, rows + " <= 8: W as WGMMA's 64-row operand, 8-row tiles of the group"};
  // Few rows per group (many experts): a 128-row tile would be mostly padding.
  const bool few = rows_per_group <= 64;
  const std::string tiles = few ? " <= 64: 64-row tiles waste less" : " > 64: 128-row tiles reuse W better";
  // f32-like sums: moekit's f16 WGMMA kernel on the FP8 values.
  if (sums == GemmSums::f32) {
    const GemmTile tile = few ? GemmTile::m64_n128_f16 : GemmTile::m128_n128_f16;
    if (cuda::can_implement(desc, {tile})) return {{tile}, rows + tiles + "; strict: f16 WGMMA, f32-like sums"};
  }
  // At most 32 of K per promotion (requantized output). Block scales from 16 rows per group:
  // moekit's persistent 128 x 128 tiles (scales staged with the tiles, the two part buffers taking
  // turns by WGMMA), measured faster than the FP8 WGMMA kernel's 64-, 128- and 192-row tiles on
  // every prefill case (deepseek-v3 GEMM1 T=4096 4457 against 4819 us, T=16384 12520 against 13608,
  // qwen3-30b-a3b T=4096 348 against 498; the layer at deepseek-v3 T=512 2154.5 against 2766.8;
  // docs/PERF.md, 2026-12-04).
  if (sums == GemmSums::k32 && desc.kind == GemmKind::fp8_block && rows_per_group >= 16 &&
      cuda::can_implement(desc, {GemmTile::m128_n128_persistent_k32}))
    return {{GemmTile::m128_n128_persistent_k32},
            rows + " >= 16; requantized next: moekit's persistent 128 x 128 tiles, f32 every 32 of K"};
  // Otherwise moekit's FP8 WGMMA kernel (block scales: its 64-row tiles alone). Its 192-row tiles
  // fit a group's rows to 64 (idle warpgroups leave); past a few hundred rows per group the 128-row
  // tiles, with two part buffers per warpgroup, are faster.
  if (sums == GemmSums::k32) {
    const bool narrow = few || desc.kind == GemmKind::fp8_block;
    const GemmTile tile = narrow                  ? GemmTile::m64_n128_wgmma
                          : rows_per_group <= 384 ? GemmTile::m192_n128_wgmma
                                                  : GemmTile::m128_n128_wgmma;
    const std::string why = few                     ? tiles
                            : narrow                ? " (block scales, the persistent tiles refused): 64-row tiles"
                            : rows_per_group <= 384 ? " in (64, 384]: 192-row tiles, fitted to 64 rows"
                                                    : " > 384: 128-row tiles, two part buffers";
    if (cuda::can_implement(desc, {tile})) return {{tile}, rows + why + "; requantized next: f32 every 32 of K"};
  }
  // 128 of K per promotion with per-row scales (rowwise, per-tensor): moekit's FP8 WGMMA kernel,
  // no scales in its K loop, measured faster than CUTLASS's (mixtral-8x7b T=4096 3566 against 4040
  // us, llama4-scout T=16384 4796 against 5605; docs/PERF.md). With block scales CUTLASS's tiles
  // stay faster in the layer (deepseek-v3 T=4096 GEMM1).
  if (sums == GemmSums::tensor_core && !few && desc.kind == GemmKind::fp8_channel &&
      cuda::can_implement(desc, {GemmTile::m192_n128_wgmma_k128}))
    return {{GemmTile::m192_n128_wgmma_k128}, rows + " > 64, per-row scales: 192-row tiles, f32 every 128 of K"};
  // 128 of K per promotion with block scales on small experts (N and K at most 2048: qwen3-30b-a3b's
  // 1536 x 2048 and 2048 x 768): moekit's persistent kernel's 128 x 192 tiles, measured faster than
  // CUTLASS's 128 x 128 at 256 and 1024 rows per group (T=4096: 272.7 against 366.6 us and 165.9
  // against 229.4; T=16384: 920.5 against 950.2 and 519.3 against 717.2; docs/PERF.md, 2026-12-04).
  // Wider N at K <= 2048 (deepseek-v3's GEMM2, 7168 x 2048): the persistent 128 x 160 tiles. The
  // 128 x 128 ones were faster than CUTLASS's in three runs on uniform, zipf and hot-expert groups
  // (H200, T=4096 uniform: 1546 against 1795 us, 1633 against 1766, 1641 against 2020; 2026-12-04);
  // the 160-wide ones beat both in three runs on an H100 (T=4096 uniform: 1778-1836 against
  // 2199-2216 and 1921-2137 us) and in the layer on the preset's file (GEMM2 1669-1698 against
  // 1827-1836 us; docs/PERF.md, 2026-12-05). At K = 7168 (deepseek-v3's GEMM1) CUTLASS's tiles stay
  // as fast or faster.
  if (sums == GemmSums::tensor_core && !few && desc.kind == GemmKind::fp8_block && desc.k <= 2048) {
    const GemmTile tile = desc.n <= 2048 ? GemmTile::m128_n192_persistent : GemmTile::m128_n160_persistent;
    if (cuda::can_implement(desc, {tile}))
      return {{tile}, rows + tiles + (desc.n <= 2048 ? "; N, K <= 2048: moekit's persistent 128 x 192 tiles"
                                                     : "; K <= 2048, N > 2048: moekit's persistent 128 x 160 tiles")};
  }
  return {{few ? GemmTile::m64_n128_pingpong : GemmTile::m128_n128_cooperative}, rows + tiles};
}

bool reads_rows_by_index(GemmTile tile) {
  switch (tile) {
    case GemmTile::tokens8_n128_wgmma:
    case GemmTile::tokens16_n128_wgmma:
    case GemmTile::tokens32_n128_wgmma:
    case GemmTile::tokens8_n256_act:
    case GemmTile::tokens16_n256_act:
    case GemmTile::tokens32_n256_act: return true;
    default: return false;
  }
}

bool honours_counts(GemmKind kind, GemmTile tile) {
  const bool cutlass = tile == GemmTile::m128_n128_cooperative || tile == GemmTile::m64_n128_pingpong;
  return !cutlass || kind == GemmKind::bf16;
}

std::int64_t computed_rows(GemmTile tile, std::int64_t rows) {
  auto up = [](std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; };
  switch (tile) {
    case GemmTile::m192_n128_wgmma:
    case GemmTile::m192_n128_wgmma_k128: return rows / 192 * 192 + up(rows % 192, 64);  // idle warpgroups leave
    case GemmTile::m128_n128_persistent:
    case GemmTile::m128_n160_persistent:
    case GemmTile::m128_n192_persistent:
    case GemmTile::m128_n128_persistent_tma:
    case GemmTile::m128_n192_persistent_tma:
    case GemmTile::m128_n256_persistent_act:
    case GemmTile::m128_n128_persistent_k32:
    case GemmTile::m128_n128_persistent_x2:
    case GemmTile::m128_n192_persistent_x2:
    case GemmTile::m128_n256_persistent_act_x2: return rows / 128 * 128 + up(rows % 128, 64);
    case GemmTile::tokens192_n128_persistent:
    case GemmTile::tokens192_n128_persistent_x2: return rows / 192 * 192 + up(rows % 192, 32);
    case GemmTile::m64_n128_pingpong:
    case GemmTile::m64_n128_wgmma:
    case GemmTile::m64_n128_f16: return up(rows, 64);
    case GemmTile::rows8_warp_mma:
    case GemmTile::tokens8_n128_wgmma:
    case GemmTile::tokens8_n256_act:
    case GemmTile::tokens8_n128_combine: return up(rows, 8);
    case GemmTile::tokens16_n128_wgmma:
    case GemmTile::tokens16_n256_act:
    case GemmTile::tokens16_n128_combine: return up(rows, 16);
    case GemmTile::tokens32_n128_wgmma:
    case GemmTile::tokens32_n256_act: return up(rows, 32);
    case GemmTile::m128_n128_cooperative:
    case GemmTile::m128_n128_wgmma:
    case GemmTile::m128_n128_f16: return up(rows, 128);
  }
  return up(rows, 128);
}

GemmChoice choose_masked_gemm_config(const GroupedGemmDesc& desc, double rows_per_group, GemmSums sums,
                                     bool batch_invariant) {
  const std::string rows = "~" + std::to_string(rows_per_group).substr(0, 4) + " rows expected per group";
  if (desc.kind == GemmKind::bf16) {
    if (batch_invariant) return {{GemmTile::m128_n128_cooperative}, "batch-invariant: the same tile for every count"};
    const bool few = rows_per_group <= 64;
    return {{few ? GemmTile::m64_n128_pingpong : GemmTile::m128_n128_cooperative},
            rows + (few ? " <= 64: 64-row tiles" : " > 64: 128-row tiles")};
  }
  // FP8: moekit's kernels, which skip a block's empty tail (CUTLASS's FP8 tiles compute all of it).
  if (sums == GemmSums::tensor_core && desc.kind == GemmKind::fp8_block &&
      cuda::can_implement(desc, {GemmTile::tokens32_n128_wgmma})) {  // whole 128-K blocks, at most 1024 groups
    // A row's sums do not depend on the tile's other rows: one 32-row tile serves every count.
    if (batch_invariant) return {{GemmTile::tokens32_n128_wgmma}, "batch-invariant: 32-row decode tiles for every count"};
    if (rows_per_group <= 8) return {{GemmTile::tokens8_n128_wgmma}, rows + " <= 8: 8-row decode tiles (W as WGMMA's A)"};
    if (rows_per_group <= 16) return {{GemmTile::tokens16_n128_wgmma}, rows + " <= 16: 16-row decode tiles"};
    if (rows_per_group <= 32) return {{GemmTile::tokens32_n128_wgmma}, rows + " <= 32: 32-row decode tiles"};
  }
  const bool few = rows_per_group <= 64 && !batch_invariant;
  if (sums == GemmSums::f32)
    return {{few ? GemmTile::m64_n128_f16 : GemmTile::m128_n128_f16}, rows + "; strict: f16 WGMMA, f32-like sums"};
  if (few) return {{GemmTile::m64_n128_wgmma}, rows + " <= 64: 64-row FP8 WGMMA tiles, f32 every 32 of K"};
  // Block scales: the persistent tiles with the FP8 WGMMA kernel's sums, bit for bit, and faster;
  // past their tile table's groups, that kernel's 64-row tiles.
  if (desc.kind == GemmKind::fp8_block) {
    if (cuda::can_implement(desc, {GemmTile::m128_n128_persistent_k32}))
      return {{GemmTile::m128_n128_persistent_k32}, rows + ": moekit's persistent 128 x 128 tiles, f32 every 32 of K"};
    return {{GemmTile::m64_n128_wgmma}, rows + ": 64-row FP8 WGMMA tiles (more groups than the persistent tiles take), f32 every 32 of K"};
  }
  return {{GemmTile::m128_n128_wgmma}, rows + ": 128-row FP8 WGMMA tiles, f32 every 32 of K"};
}

Status can_implement(const GroupedGemmDesc& desc, const GroupedGemmConfig& config) {
  if (desc.groups < 1) return Status::no("groups: expected >= 1, given " + std::to_string(desc.groups));
  if (desc.n < 16 || desc.n % 16 != 0) return Status::no("N: expected a multiple of 16, given " + std::to_string(desc.n));
  if (desc.k < 16 || desc.k % 16 != 0) return Status::no("K: expected a multiple of 16, given " + std::to_string(desc.k));
  // Rows are int32 (the plan's offsets, tile coordinates); element offsets are 64-bit everywhere
  // (a group's base row0 * K, rows past 2^31 / K), so only the row count is bounded here.
  if (desc.max_rows >= (std::int64_t(1) << 31))
    return Status::no("rows: expected below 2^31 (32-bit row offsets), given " + std::to_string(desc.max_rows));
  if (desc.output != output_of(config.tile)) {
    auto what = [](GemmOutput o) {
      return o == GemmOutput::bf16            ? "bf16"
             : o == GemmOutput::activated_fp8 ? "the activated FP8 rows"
                                              : "bf16 and the combined tokens";
    };
    return Status::no(config.to_string() + ": writes " + what(output_of(config.tile)) + ", not " + what(desc.output));
  }
  if (desc.a_by_index && !reads_rows_by_index(config.tile))
    return Status::no(config.to_string() + ": reads A as laid out, not its rows by index");
  const Entry* e = find(desc.kind, config.tile);
  if (!e) return Status::no("no grouped GEMM compiled for " + desc.to_string() + " with " + config.to_string());
  return e->can_implement(desc);
}

std::size_t workspace_size(const GroupedGemmDesc& desc, const GroupedGemmConfig& config) {
  const Entry* e = find(desc.kind, config.tile);
  require(e != nullptr, [&] { return "grouped GEMM: no kernel for " + desc.to_string() + " with " + config.to_string(); });
  return e->workspace_size(desc);
}

void run_grouped_gemm(const GroupedGemmDesc& desc, const GroupedGemmConfig& config, const GroupedGemmArgs& args,
                      void* workspace, void* stream) {
  const Entry* e = find(desc.kind, config.tile);
  require(e != nullptr, [&] { return "grouped GEMM: no kernel for " + desc.to_string() + " with " + config.to_string(); });
  e->run(desc, args, workspace, static_cast<cudaStream_t>(stream));
}

}  // namespace moekit::cuda
