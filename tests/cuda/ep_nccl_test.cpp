// The GPU path of expert parallelism: the NCCL communicator with one rank on one GPU, the
// CUDA EP stages against the CPU's byte for byte, and (once a CUDA backend is registered)
// an EP layer over NCCL against the same layer without EP. Skips without a GPU or NCCL.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/ep_plan.h"
#include "core/synthetic.h"
#include "cpu/ep_stages.h"
#include "cpu/quant.h"
#include "cuda/ep/ep_stages.h"
#include "moekit/moekit.h"
#include "test_util.h"

namespace moekit::test {
namespace {

bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_GPU_AND_NCCL()                                       \
  do {                                                                    \
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";                    \
    if (!nccl_available()) GTEST_SKIP() << "built without NCCL";          \
  } while (0)

// Device memory holding a copy of host bytes; copies back on request.
class Gpu {
 public:
  explicit Gpu(std::size_t bytes) : bytes_(bytes) { EXPECT_EQ(cudaMalloc(&p_, bytes ? bytes : 1), cudaSuccess); }
  template <class T>
  explicit Gpu(const std::vector<T>& host) : Gpu(host.size() * sizeof(T)) {
    cudaMemcpy(p_, host.data(), bytes_, cudaMemcpyHostToDevice);
  }
  ~Gpu() { cudaFree(p_); }
  Gpu(const Gpu&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  template <class T>
  std::vector<T> host() const {
    std::vector<T> v(bytes_ / sizeof(T));
    cudaMemcpy(v.data(), p_, bytes_, cudaMemcpyDeviceToHost);
    return v;
  }

 private:
  void* p_ = nullptr;
  std::size_t bytes_;
};

TEST(CudaEpNccl, CommunicatorOfOneRankOnAGpu) {
  SKIP_WITHOUT_GPU_AND_NCCL();
  const std::unique_ptr<Communicator> self = make_self_communicator();
  const std::unique_ptr<Communicator> nccl = make_nccl_communicator(*self, 0, {std::chrono::seconds(30)});
  EXPECT_EQ(nccl->size(), 1);
  EXPECT_EQ(nccl->device(), Device::cuda);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);

  Gpu values(std::vector<float>{1.0f, -2.0f, 3.0f});
  nccl->all_reduce_max(values.as<float>(), 3, stream);
  // 10 units of 3 bytes from offset 2 of send to offset 5 of recv.
  std::vector<std::uint8_t> bytes(40);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::uint8_t(i * 7 + 1);
  Gpu send(bytes), recv(std::vector<std::uint8_t>(60, 0));
  const std::vector<std::int64_t> count{10}, send_at{2}, recv_at{5};
  nccl->all_to_all_v({send.as<void>(), count, send_at, recv.as<void>(), count, recv_at, 3}, stream);
  Gpu gathered(std::vector<std::uint8_t>(40, 0));
  nccl->all_gather(send.as<void>(), gathered.as<void>(), 40, stream);
  nccl->broadcast(gathered.as<void>(), 40, 0, stream);
  nccl->synchronize(stream);
  nccl->barrier(stream);

  EXPECT_EQ(values.host<float>(), (std::vector<float>{1.0f, -2.0f, 3.0f}));
  const std::vector<std::uint8_t> got = recv.host<std::uint8_t>();
  for (int i = 0; i < 30; ++i) ASSERT_EQ(got[std::size_t(15 + i)], bytes[std::size_t(6 + i)]) << i;
  EXPECT_EQ(got[14], 0);
  EXPECT_EQ(got[45], 0);
  EXPECT_EQ(gathered.host<std::uint8_t>(), bytes);
  cudaStreamDestroy(stream);
}

// Prepared rows, a plan and the records both ways: the GPU must write the CPU's bytes.
class CudaEpStagesGrid : public ::testing::TestWithParam<QuantScheme> {};

TEST_P(CudaEpStagesGrid, MatchTheCpuByteForByte) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  MoEConfig c;
  c.num_experts = 12;
  c.hidden_size = 256;
  c.intermediate_size = 256;
  c.routing.top_k = 4;
  c.quant.scheme = GetParam();
  c.ep_size = 3;
  const std::int64_t tokens = 37, h = c.hidden_size, k = c.top_k();
  const core::EpRecordLayout layout = core::EpRecordLayout::of(c);

  // Prepared rows: the CPU's quantization of random values.
  std::vector<float> x(std::size_t(tokens * h));
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  Tensor q(activation_dtype(c.quant.scheme), {tokens, h}), s;
  QuantizedRows rows{q.view(), {}};
  if (c.quant.scheme != QuantScheme::bf16) {
    s = Tensor(DType::f32, scale_shape(c.quant.scheme, tokens, h));
    rows.scales = s.view();
  }
  cpu::quantize_rows({c.quant, 0.0f}, x.data(), tokens, h, rows);
  std::vector<std::int32_t> ids(std::size_t(tokens * k));
  std::vector<float> weights(ids.size());
  std::uniform_int_distribution<int> expert(-1, 11);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = expert(rng);
    weights[i] = 0.25f + float(i % 7);
  }
  core::EpSendPlan plan;
  plan_dispatch(ids.data(), weights.data(), tokens, c, tokens % 2 ? 0 : tokens, EpCombine::partial, plan);
  const std::int64_t records = plan.records();

  const std::unique_ptr<core::EpStages> cpu = cpu::make_ep_stages(), gpu = cuda::make_ep_stages();
  std::vector<std::uint8_t> cpu_records(std::size_t(records) * layout.bytes, 0xab);
  cpu->pack(layout, {rows, plan.token.data(), plan.ids.data(), plan.weights.data(), records,
                     reinterpret_cast<std::byte*>(cpu_records.data())},
            nullptr);
  const std::vector<std::uint8_t> q_host(static_cast<std::uint8_t*>(q.view().data),
                                         static_cast<std::uint8_t*>(q.view().data) + q.nbytes());
  const std::vector<float> s_host(s.defined() ? s.ptr<float>() : nullptr, s.defined() ? s.ptr<float>() + s.numel() : nullptr);
  Gpu q_gpu(q_host), s_gpu(s_host), token_gpu(plan.token), ids_gpu(plan.ids), weights_gpu(plan.weights);
  Gpu records_gpu(std::vector<std::uint8_t>(cpu_records.size(), 0xcd));
  QuantizedRows rows_gpu{TensorView::contiguous(q_gpu.as<void>(), q.dtype(), {tokens, h}, Device::cuda), {}};
  if (s.defined()) rows_gpu.scales = TensorView::contiguous(s_gpu.as<void>(), DType::f32, s.shape(), Device::cuda);
  gpu->pack(layout, {rows_gpu, token_gpu.as<std::int32_t>(), ids_gpu.as<std::int32_t>(), weights_gpu.as<float>(),
                     records, records_gpu.as<std::byte>()},
            nullptr);
  ASSERT_EQ(records_gpu.host<std::uint8_t>(), cpu_records) << "seed " << seed;

  // Unpack what was packed, on both.
  Tensor uq(q.dtype(), {records, h}), us, uids(DType::i32, {records, k}), uw(DType::f32, {records, k});
  QuantizedRows un{uq.view(), {}};
  const std::int64_t n_scales = layout.n_scales ? records * layout.n_scales : (s.defined() ? 1 : 0);
  if (n_scales) {
    us = Tensor(DType::f32, {n_scales});
    un.scales = us.view();
  }
  const float* tensor_scale = c.quant.scheme == QuantScheme::fp8_tensor ? s.ptr<float>() : nullptr;
  cpu->unpack(layout, {reinterpret_cast<std::byte*>(cpu_records.data()), records, un, uids.view(), uw.view(), tensor_scale},
              nullptr);
  Gpu gq(uq.nbytes()), gs(sizeof(float) * std::size_t(std::max<std::int64_t>(n_scales, 1))), gids(uids.nbytes()),
      gw(uw.nbytes());
  QuantizedRows gun{TensorView::contiguous(gq.as<void>(), q.dtype(), {records, h}, Device::cuda), {}};
  if (n_scales) gun.scales = TensorView::contiguous(gs.as<void>(), DType::f32, {n_scales}, Device::cuda);
  gpu->unpack(layout,
              {records_gpu.as<std::byte>(), records, gun,
               TensorView::contiguous(gids.as<void>(), DType::i32, {records, k}, Device::cuda),
               TensorView::contiguous(gw.as<void>(), DType::f32, {records, k}, Device::cuda),
               tensor_scale ? s_gpu.as<float>() : nullptr},
              nullptr);
  const auto gq_host = gq.host<std::uint8_t>();
  EXPECT_EQ(std::memcmp(gq_host.data(), uq.view().data, uq.nbytes()), 0);
  EXPECT_EQ(gids.host<std::int32_t>(), std::vector<std::int32_t>(uids.ptr<std::int32_t>(), uids.ptr<std::int32_t>() + uids.numel()));
  if (n_scales) {
    const auto gs_host = gs.host<float>();
    EXPECT_EQ(std::memcmp(gs_host.data(), us.view().data, us.nbytes()), 0);
  }

  // Gather rows (with -1) and sum rows, on bf16 rows.
  std::vector<std::uint16_t> expert_out(std::size_t(records * h));
  for (std::size_t i = 0; i < expert_out.size(); ++i) expert_out[i] = float_to_bf16(normal(rng)).bits;
  std::vector<std::int32_t> pick(static_cast<std::size_t>(records));
  std::uniform_int_distribution<int> row(-1, int(records) - 1);
  for (auto& p : pick) p = row(rng);
  std::vector<std::uint16_t> cpu_out(pick.size() * std::size_t(h));
  cpu->gather_rows({reinterpret_cast<const bf16*>(expert_out.data()), pick.data(), records, h,
                    reinterpret_cast<bf16*>(cpu_out.data())},
                   nullptr);
  Gpu eo(expert_out), pk(pick), go(cpu_out.size() * 2);
  gpu->gather_rows({eo.as<bf16>(), pk.as<std::int32_t>(), records, h, go.as<bf16>()}, nullptr);
  EXPECT_EQ(go.host<std::uint16_t>(), cpu_out);
  std::vector<std::uint16_t> cpu_sum(std::size_t(tokens * h));
  cpu->sum_rows({reinterpret_cast<const bf16*>(expert_out.data()), plan.token_rows.data(), c.ep_size, tokens, h,
                 reinterpret_cast<bf16*>(cpu_sum.data())},
                nullptr);
  Gpu tr(plan.token_rows), gsum(cpu_sum.size() * 2);
  gpu->sum_rows({eo.as<bf16>(), tr.as<std::int32_t>(), c.ep_size, tokens, h, gsum.as<bf16>()}, nullptr);
  EXPECT_EQ(gsum.host<std::uint16_t>(), cpu_sum) << "seed " << seed;
}

INSTANTIATE_TEST_SUITE_P(EveryScheme, CudaEpStagesGrid,
                         ::testing::Values(QuantScheme::bf16, QuantScheme::fp8_tensor, QuantScheme::fp8_rowwise,
                                           QuantScheme::fp8_block),
                         [](const ::testing::TestParamInfo<QuantScheme>& info) {
                           std::string name(to_string(info.param));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// The fixed-capacity plan on the GPU (EpStages::plan_fixed) against the host's, array for array
// on poisoned buffers: random routings with -1 ids, every token on one rank's experts, no
// tokens, T below and at the capacity, up to 8 ranks and 1,500 tokens (several chunks of the
// kernel's scan); ids out of range count as -1 on the GPU.
TEST(CudaEpPlan, FixedPlanMatchesTheHostPlan) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::unique_ptr<core::EpStages> gpu = cuda::make_ep_stages();
  struct Shape {
    int ranks;
    std::int64_t local_experts;
    int k;
    std::int64_t tokens, capacity;
  };
  const Shape shapes[] = {{1, 8, 2, 5, 5},       {2, 4, 4, 0, 3},      {3, 4, 6, 37, 40},
                          {4, 2, 8, 1000, 1000}, {8, 32, 8, 1500, 2048}, {8, 1, 1, 513, 513}};
  for (const Shape& shape : shapes)
    for (const std::string_view kind : {"random", "one_rank", "bad_ids"})
      for (const EpCombine combine : {EpCombine::exact, EpCombine::partial}) {
        SCOPED_TRACE("ranks " + std::to_string(shape.ranks) + " T " + std::to_string(shape.tokens) + " capacity " +
                     std::to_string(shape.capacity) + " k " + std::to_string(shape.k) + " " + std::string(kind) + " " +
                     std::string(to_string(combine)));
        const std::int64_t experts = shape.local_experts * shape.ranks, slots = shape.tokens * shape.k;
        const std::int64_t records = shape.ranks * shape.capacity;
        std::vector<std::int32_t> ids(static_cast<std::size_t>(slots)), host_ids(ids.size());
        std::vector<float> weights(ids.size());
        std::uniform_int_distribution<std::int32_t> any(-1, std::int32_t(experts - 1));
        std::uniform_int_distribution<std::int32_t> last(std::int32_t(experts - shape.local_experts),
                                                         std::int32_t(experts - 1));
        const std::int32_t bad[] = {std::int32_t(experts), std::int32_t(experts + 7), -2, 2147483647, -2147483647 - 1};
        std::uniform_real_distribution<float> weight(0.0f, 1.0f);
        for (std::size_t i = 0; i < ids.size(); ++i) {
          ids[i] = kind == "one_rank" ? (rng() % 8 == 0 ? -1 : last(rng)) : any(rng);
          host_ids[i] = ids[i];
          if (kind == "bad_ids" && rng() % 10 == 0) {
            ids[i] = bad[rng() % 5];
            host_ids[i] = -1;
          }
          weights[i] = weight(rng);
        }
        const bool exact = combine == EpCombine::exact;
        std::vector<std::int32_t> token(static_cast<std::size_t>(records)),
            plan_ids(static_cast<std::size_t>(records * shape.k));
        std::vector<float> plan_weights(plan_ids.size());
        std::vector<std::int32_t> slot_rows(exact ? std::size_t(slots) : 0),
            token_rows(exact ? 0 : std::size_t(shape.tokens * shape.ranks));
        core::plan_fixed_on_host({host_ids.data(), weights.data(), shape.tokens, shape.capacity, shape.k, shape.ranks,
                                  shape.local_experts, token.data(), plan_ids.data(), plan_weights.data(),
                                  exact ? slot_rows.data() : nullptr, exact ? nullptr : token_rows.data()});

        constexpr std::int32_t kPoison = 0x7f7f7f7f;
        Gpu g_ids(ids), g_weights(weights), g_token(std::vector<std::int32_t>(token.size(), kPoison)),
            g_plan_ids(std::vector<std::int32_t>(plan_ids.size(), kPoison)),
            g_plan_weights(std::vector<std::int32_t>(plan_weights.size(), kPoison)),
            g_slot_rows(std::vector<std::int32_t>(slot_rows.size(), kPoison)),
            g_token_rows(std::vector<std::int32_t>(token_rows.size(), kPoison));
        gpu->plan_fixed({g_ids.as<std::int32_t>(), g_weights.as<float>(), shape.tokens, shape.capacity, shape.k,
                         shape.ranks, shape.local_experts, g_token.as<std::int32_t>(), g_plan_ids.as<std::int32_t>(),
                         g_plan_weights.as<float>(), exact ? g_slot_rows.as<std::int32_t>() : nullptr,
                         exact ? nullptr : g_token_rows.as<std::int32_t>()},
                        nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(g_token.host<std::int32_t>(), token);
        EXPECT_EQ(g_plan_ids.host<std::int32_t>(), plan_ids);
        EXPECT_EQ(g_plan_weights.host<float>(), plan_weights);
        if (exact) EXPECT_EQ(g_slot_rows.host<std::int32_t>(), slot_rows);
        else EXPECT_EQ(g_token_rows.host<std::int32_t>(), token_rows);
      }
}

// An EP layer of one rank over NCCL against the same layer without EP, on the GPU backend; with a
// shared expert too (every rank runs it for its own tokens: here the record to itself).
TEST(CudaEpNccl, OneRankEpLayerMatchesTheLocalLayer) {
  SKIP_WITHOUT_GPU_AND_NCCL();
  const std::vector<std::string> names = backend_names();
  if (std::find(names.begin(), names.end(), "cuda") == names.end())
    GTEST_SKIP() << "no cuda backend in this build: the NCCL layer path waits for it";
  for (const std::int64_t shared : {0, 1}) {
    MoEConfig c;
    c.num_experts = 12;
    c.hidden_size = 256;
    c.intermediate_size = 256;
    c.routing.top_k = 4;
    c.quant.scheme = QuantScheme::fp8_block;
    c.shared_experts = shared;
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + ", shared experts " + std::to_string(shared));
    const core::SyntheticLayer weights = core::make_synthetic_layer(c, seed);
    const std::unique_ptr<Communicator> self = make_self_communicator();
    const std::unique_ptr<Communicator> nccl = make_nccl_communicator(*self, 0);
    LayerOptions local_options;
    local_options.backend = "cuda";
    Layer local(c, weights.weights(), local_options);
    const std::int64_t tokens = 33;
    const Tensor hidden = core::make_hidden(tokens, c.hidden_size, seed);
    const Tensor logits = core::make_router_logits(tokens, c.num_experts, DType::f32, seed);
    const std::vector<std::uint8_t> hidden_bytes(static_cast<std::uint8_t*>(hidden.view().data),
                                                 static_cast<std::uint8_t*>(hidden.view().data) + hidden.nbytes());
    const std::vector<std::uint8_t> logits_bytes(static_cast<std::uint8_t*>(logits.view().data),
                                                 static_cast<std::uint8_t*>(logits.view().data) + logits.nbytes());
    Gpu h(hidden_bytes), l(logits_bytes), out_local(hidden.nbytes()), out_ep(hidden.nbytes());
    auto view = [&](const Gpu& g, DType d, std::int64_t cols) {
      return TensorView::contiguous(g.as<void>(), d, {tokens, cols}, Device::cuda);
    };
    for (EpCombine combine : {EpCombine::exact, EpCombine::partial}) {
      LayerOptions ep_options = local_options;
      ep_options.comm = nccl.get();
      ep_options.ep.combine = combine;  // one rank: one partial sum per token, the local result too
      Layer ep(c, weights.weights(), ep_options);
      local.forward(FusedArgs{view(h, DType::bf16, c.hidden_size), view(l, DType::f32, c.num_experts),
                              view(out_local, DType::bf16, c.hidden_size), {}, {}});
      ep.forward(FusedArgs{view(h, DType::bf16, c.hidden_size), view(l, DType::f32, c.num_experts),
                           view(out_ep, DType::bf16, c.hidden_size), {}, {}});
      cudaDeviceSynchronize();
      EXPECT_EQ(out_local.host<std::uint16_t>(), out_ep.host<std::uint16_t>())
          << to_string(combine) << ", seed " << seed;
    }
  }
}

// Fixed capacity leaves the host out of the EP forward: over NCCL on one GPU, a CUDA graph
// captures it, and replays on new tokens give the bits of the layer without EP (exact and
// partial combine: one rank sums one partial row per token), for fp8-block, fp8-tensor (its
// dynamic amax through the communicator, in the quantize and the activation) and bf16. The
// variable mode refuses to be captured, naming ep.capacity.
TEST(CudaEpNccl, FixedCapacityLayerIsCapturedInAGraph) {
  SKIP_WITHOUT_GPU_AND_NCCL();
  const std::vector<std::string> names = backend_names();
  if (std::find(names.begin(), names.end(), "cuda") == names.end()) GTEST_SKIP() << "no cuda backend in this build";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::unique_ptr<Communicator> self = make_self_communicator();
  const std::unique_ptr<Communicator> nccl = make_nccl_communicator(*self, 0, {std::chrono::seconds(60)});
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  // Capacity T: the experts then see the T of the layer without EP, so that its tactic is the
  // same (padding records are in the CPU ranks' tests and the plan's above).
  const std::int64_t tokens = 33, capacity = tokens;
  for (const QuantScheme scheme : {QuantScheme::fp8_block, QuantScheme::fp8_tensor, QuantScheme::bf16}) {
    MoEConfig c;
    c.num_experts = 12;
    c.hidden_size = 256;
    c.intermediate_size = 256;
    c.routing.top_k = 4;
    c.quant.scheme = scheme;
    const core::SyntheticLayer weights = core::make_synthetic_layer(c, seed);
    LayerOptions local_options;
    local_options.backend = "cuda";
    Layer local(c, weights.weights(), local_options);
    Gpu h(std::size_t(tokens * c.hidden_size) * 2), l(std::size_t(tokens * c.num_experts) * 4),
        out_local(std::size_t(tokens * c.hidden_size) * 2), out_ep(std::size_t(tokens * c.hidden_size) * 2);
    const FusedArgs args{TensorView::contiguous(h.as<void>(), DType::bf16, {tokens, c.hidden_size}, Device::cuda),
                         TensorView::contiguous(l.as<void>(), DType::f32, {tokens, c.num_experts}, Device::cuda),
                         TensorView::contiguous(out_ep.as<void>(), DType::bf16, {tokens, c.hidden_size}, Device::cuda),
                         {},
                         {}};
    FusedArgs local_args = args;
    local_args.out = TensorView::contiguous(out_local.as<void>(), DType::bf16, {tokens, c.hidden_size}, Device::cuda);
    // New tokens in the buffers the graph reads.
    auto fill = [&](std::uint64_t s) {
      const Tensor hidden = core::make_hidden(tokens, c.hidden_size, s);
      const Tensor logits = core::make_router_logits(tokens, c.num_experts, DType::f32, s);
      ASSERT_EQ(cudaMemcpy(h.as<void>(), hidden.view().data, hidden.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(l.as<void>(), logits.view().data, logits.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemset(out_ep.as<void>(), 0xff, std::size_t(tokens * c.hidden_size) * 2), cudaSuccess);
      // The copies ran on the legacy stream, which a non-blocking stream does not wait for.
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    };
    for (const EpCombine combine : {EpCombine::exact, EpCombine::partial}) {
      SCOPED_TRACE(std::string(to_string(scheme)) + " " + std::string(to_string(combine)));
      LayerOptions ep_options = local_options;
      ep_options.comm = nccl.get();
      ep_options.ep.combine = combine;
      ep_options.ep.capacity = capacity;
      Layer ep(c, weights.weights(), ep_options);
      fill(seed);
      ep.forward(args, stream);  // eager, which also sizes the routing buffers before the capture
      nccl->synchronize(stream);
      local.forward(local_args, stream);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      EXPECT_EQ(out_ep.host<std::uint16_t>(), out_local.host<std::uint16_t>()) << "eager";

      cudaGraph_t graph = nullptr;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      ep.forward(args, stream);
      ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
      cudaGraphExec_t exec = nullptr;
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      for (std::uint64_t round = 1; round <= 3; ++round) {
        fill(seed + round);
        ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
        nccl->synchronize(stream);
        local.forward(local_args, stream);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        EXPECT_EQ(out_ep.host<std::uint16_t>(), out_local.host<std::uint16_t>()) << "replay " << round;
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
    // The variable mode learns its counts on the host: an Error before its exchange.
    LayerOptions variable_options = local_options;
    variable_options.comm = nccl.get();
    Layer variable(c, weights.weights(), variable_options);
    variable.forward(args, stream);
    nccl->synchronize(stream);
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    try {
      variable.forward(args, stream);
      ADD_FAILURE() << "the variable mode was captured";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ep.capacity"), std::string::npos) << e.what();
    }
    cudaGraph_t partial_graph = nullptr;
    cudaStreamEndCapture(stream, &partial_graph);
    if (partial_graph) cudaGraphDestroy(partial_graph);
    cudaGetLastError();
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace moekit::test
