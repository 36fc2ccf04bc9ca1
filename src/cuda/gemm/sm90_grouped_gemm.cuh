// CUTLASS 4.2 grouped GEMM kernels for sm_90a and the small kernel that fills their per-group
// arguments on the GPU. Included only by the instantiation files listed in
// sm90_grouped_gemm_instances.h; each of them compiles one (kind, tile) pair.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/detail/blockwise_scale_layout.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <cuda_runtime.h>

#include "cuda/gemm/grouped_gemm.h"

namespace moekit::cuda::sm90 {

using namespace cute;
using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per group

// ---- tiles ---------------------------------------------------------------------------------

template <GemmTile T, bool Fp8>
struct TileTraits;

template <bool Fp8>
struct TileTraits<GemmTile::m128_n128_cooperative, Fp8> {
  using Shape = cute::Shape<_128, _128, cute::conditional_t<Fp8, _128, _64>>;  // 128 bytes of K per row
  using Mainloop = cute::conditional_t<Fp8, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise,
                                       cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};

template <bool Fp8>
struct TileTraits<GemmTile::m64_n128_pingpong, Fp8> {
  using Shape = cute::Shape<_64, _128, cute::conditional_t<Fp8, _128, _64>>;
  using Mainloop = cute::conditional_t<Fp8, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise,
                                       cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong>;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};

// ---- kernels -------------------------------------------------------------------------------

// D (bf16, row-major) = A (row-major, [M, K]) x B, B given as W [N, K] ("column-major" K x N).
template <GemmKind Kind, GemmTile Tile>
struct Kernel {
  static constexpr bool kFp8 = Kind != GemmKind::bf16;
  using Element = cute::conditional_t<kFp8, cutlass::float_e4m3_t, cutlass::bfloat16_t>;
  static constexpr int kAlign = 16 / sizeof(Element);
  using Traits = TileTraits<Tile, kFp8>;
  using ClusterShape = Shape<_1, _1, _1>;

  // Scales (fp8): one per row of A for every 128 of K; W's per 128x128 block or per channel,
  // for every 128 of K. Both MN-major (rows/channels contiguous within a K block).
  static constexpr int kScaleN = Kind == GemmKind::fp8_block ? 128 : 1;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, kScaleN, 128, cute::GMMA::Major::MN,
                                                                 cute::GMMA::Major::MN>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Traits::Shape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor*, 8,
      cutlass::bfloat16_t, cutlass::layout::RowMajor*, 8, typename Traits::Epilogue,
      cutlass::epilogue::fusion::LinearCombination<cutlass::bfloat16_t, float, void, float>>::CollectiveOp;

  using OperandA = cute::conditional_t<kFp8, cute::tuple<cutlass::layout::RowMajor*, LayoutSFA*>,
                                       cutlass::layout::RowMajor*>;
  using OperandB = cute::conditional_t<kFp8, cute::tuple<cutlass::layout::ColumnMajor*, LayoutSFB*>,
                                       cutlass::layout::ColumnMajor*>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, OperandA, kAlign, Element, OperandB, kAlign,
      float, typename Traits::Shape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      typename Traits::Mainloop>::CollectiveOp;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using StrideA = typename Gemm::GemmKernel::InternalStrideA;
  using StrideB = typename Gemm::GemmKernel::InternalStrideB;
  using StrideD = typename Gemm::GemmKernel::InternalStrideD;
};

// ---- per-group arguments, on the device ------------------------------------------------------

// The arrays CUTLASS reads, one entry per group, carved from the workspace.
template <class K>
struct GroupArrays {
  typename ProblemShape::UnderlyingProblemShape* problems;
  const typename K::Element** a;
  const typename K::Element** b;
  typename K::Element** unused_c;
  cutlass::bfloat16_t** d;
  typename K::StrideA* stride_a;
  typename K::StrideB* stride_b;
  typename K::StrideD* stride_d;
  const float** sfa;
  const float** sfb;
  typename K::LayoutSFA* layout_sfa;
  typename K::LayoutSFB* layout_sfb;
};

template <class K>
struct FillParams {
  GroupArrays<K> arrays;
  GroupedGemmArgs args;
  int groups, n, k;
};

// One thread per group: its rows come from the device offsets, so nothing waits for the host.
template <class K>
__global__ void fill_group_arrays(FillParams<K> p) {
  const int e = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (e >= p.groups) return;
  const std::int64_t row0 = p.args.offsets[e];
  const int rows = int(p.args.offsets[e + 1] - row0);  // the group's block: the M extent of its scales
  const int n = p.n, k = p.k;
  const int k_blocks = (k + 127) / 128;
  auto& g = p.arrays;
  // bf16: only the rows that carry data are computed (a masked block's empty tail skipped). FP8:
  // every row of the block, as CUTLASS's blockwise mainloop lays the scales out by the problem's M.
  g.problems[e] = {!K::kFp8 && p.args.counts ? p.args.counts[e] : rows, n, k};
  g.a[e] = static_cast<const typename K::Element*>(p.args.a) + row0 * k;
  g.b[e] = static_cast<const typename K::Element*>(p.args.w) + std::int64_t(e) * n * k;
  g.d[e] = reinterpret_cast<cutlass::bfloat16_t*>(p.args.d) + row0 * n;
  g.stride_a[e] = cutlass::make_cute_packed_stride(typename K::StrideA{}, {rows, k, 1});
  g.stride_b[e] = cutlass::make_cute_packed_stride(typename K::StrideB{}, {n, k, 1});
  g.stride_d[e] = cutlass::make_cute_packed_stride(typename K::StrideD{}, {rows, n, 1});
  if constexpr (K::kFp8) {
    const int n_blocks = (n + K::kScaleN - 1) / K::kScaleN;
    g.sfa[e] = p.args.a_scales + row0 * k_blocks;
    g.sfb[e] = p.args.w_scales + std::int64_t(e) * k_blocks * n_blocks;
    g.layout_sfa[e] = K::ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(rows, n, k, 1));
    g.layout_sfb[e] = K::ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(rows, n, k, 1));
  }
}

// ---- the runner ----------------------------------------------------------------------------

template <class K>
struct Runner {
  static constexpr std::size_t kAlign = 256;
  static std::size_t round_up(std::size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

  // Carves the group arrays (and, after them, CUTLASS's own workspace) from base.
  static std::size_t carve(std::byte* base, int groups, GroupArrays<K>* out) {
    std::size_t used = 0;
    auto take = [&](auto*& p, std::size_t count) {
      using T = std::remove_reference_t<decltype(*p)>;
      p = base ? reinterpret_cast<T*>(base + used) : nullptr;
      used += round_up(sizeof(T) * count);
    };
    GroupArrays<K> g{};
    const std::size_t n = std::size_t(groups);
    take(g.problems, n);
    take(g.a, n);
    take(g.b, n);
    take(g.unused_c, n);
    take(g.d, n);
    take(g.stride_a, n);
    take(g.stride_b, n);
    take(g.stride_d, n);
    take(g.sfa, n);
    take(g.sfb, n);
    take(g.layout_sfa, n);
    take(g.layout_sfb, n);
    if (out) *out = g;
    return used;
  }

  static typename K::Gemm::Arguments arguments(const GroupArrays<K>& g, int groups) {
    cutlass::KernelHardwareInfo hw;
    cudaGetDevice(&hw.device_id);
    hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw.device_id);
    typename K::Gemm::Arguments args;
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = {groups, g.problems, nullptr};  // shapes live on the device only
    if constexpr (K::kFp8) {
      args.mainloop = {g.a, g.stride_a, g.b, g.stride_b, g.sfa, g.layout_sfa, g.sfb, g.layout_sfb};
    } else {
      args.mainloop = {g.a, g.stride_a, g.b, g.stride_b};
    }
    args.epilogue = {{}, nullptr, nullptr, g.d, g.stride_d};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.hw_info = hw;
    return args;
  }

  static std::size_t workspace_size(const GroupedGemmDesc& desc) {
    GroupArrays<K> g{};
    const std::size_t arrays = carve(nullptr, int(desc.groups), &g);
    return arrays + round_up(K::Gemm::get_workspace_size(arguments(g, int(desc.groups))));
  }

  static Status can_implement(const GroupedGemmDesc& desc) {
    GroupArrays<K> g{};
    carve(nullptr, int(desc.groups), &g);
    const cutlass::Status s = K::Gemm::can_implement(arguments(g, int(desc.groups)));
    if (s != cutlass::Status::kSuccess)
      return Status::no(std::string("CUTLASS: ") + cutlass::cutlassGetStatusString(s));
    return Status::ok();
  }

  static void run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, void* workspace, cudaStream_t stream) {
    GroupArrays<K> g{};
    auto* base = static_cast<std::byte*>(workspace);
    const std::size_t arrays = carve(base, int(desc.groups), &g);
    const int groups = int(desc.groups);
    fill_group_arrays<K><<<(groups + 127) / 128, 128, 0, stream>>>(FillParams<K>{g, args, groups, int(desc.n), int(desc.k)});
    require(cudaGetLastError() == cudaSuccess, "grouped GEMM: the argument kernel did not launch");
    typename K::Gemm gemm;
    const auto cutlass_args = arguments(g, groups);
    cutlass::Status s = gemm.initialize(cutlass_args, base + arrays, stream);
    require(s == cutlass::Status::kSuccess,
            [&] { return std::string("grouped GEMM: CUTLASS initialize failed: ") + cutlass::cutlassGetStatusString(s); });
    s = gemm.run(stream);
    require(s == cutlass::Status::kSuccess,
            [&] { return std::string("grouped GEMM: CUTLASS run failed: ") + cutlass::cutlassGetStatusString(s); });
  }
};

}  // namespace moekit::cuda::sm90

// One instantiation file per (kind, tile): defines the three entry points below for it.
#define MOEKIT_SM90_GROUPED_GEMM_INSTANCE(KIND, TILE, NAME)                                                       \
  namespace moekit::cuda::sm90 {                                                                                  \
  std::size_t NAME##_workspace_size(const GroupedGemmDesc& d) { return Runner<Kernel<KIND, TILE>>::workspace_size(d); } \
  Status NAME##_can_implement(const GroupedGemmDesc& d) { return Runner<Kernel<KIND, TILE>>::can_implement(d); }   \
  void NAME##_run(const GroupedGemmDesc& d, const GroupedGemmArgs& a, void* w, cudaStream_t s) {                  \
    Runner<Kernel<KIND, TILE>>::run(d, a, w, s);                                                                  \
  }                                                                                                               \
  }
