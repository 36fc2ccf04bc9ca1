// The CPU backend: the reference stages (plain loops, multithreaded), and its registration.
#include <algorithm>
#include <cstdlib>

#include "core/parallel.h"
#include "core/shared.h"
#include "core/stages.h"
#include "cpu/activation.h"
#include "cpu/ep_stages.h"
#include "cpu/finalize.h"
#include "cpu/gemm.h"
#include "cpu/permute.h"
#include "cpu/quant.h"
#include "cpu/routing.h"
#include "moekit/comm.h"
#include "moekit/quant.h"

namespace moekit::cpu {
namespace {

using core::Carver;
using core::StageProblem;
using core::Workspace;

// The CPU reads the caller's host tensors where they are: everything is borrowed.
struct HostWeights final : core::BackendWeights {
  Weights views;
  float w13_static_scale = 0.0f, w2_static_scale = 0.0f;  // fp8-tensor static scales; 0: dynamic
};

float scalar_or_zero(const TensorView& t, core::Preparation how) {
  return t.defined() && how == core::Preparation::memory ? t.ptr<float>()[0] : 0.0f;
}

// The fp8-tensor scale of x [n]: the static one, or under EP the group's (the amax of every
// rank's rows, as ep = 1 takes it over the whole batch); 0 leaves it to quantize_rows.
float tensor_scale(const StageProblem& p, float static_scale, const float* x, std::int64_t n, Stream stream) {
  if (p.config.quant.scheme != QuantScheme::fp8_tensor || static_scale > 0.0f || !p.group) return static_scale;
  float m = amax(x, n);
  p.group->all_reduce_max(&m, 1, stream);
  return fp8_scale(m, p.config.quant.scale_format);
}

class Router final : public core::RouterStage {
 public:
  Status can_implement(const StageProblem&) const override { return Status::ok(); }
  std::size_t workspace_size(const StageProblem&) const override { return 0; }
  void run(const StageProblem& p, const core::RouterArgs& args, Workspace, Stream) const override {
    route_tokens(p.config.routing, args.in, args.out);
  }
};

class Shared final : public core::SharedStage {
 public:
  Status can_implement(const StageProblem&) const override { return Status::ok(); }
  std::size_t workspace_size(const StageProblem&) const override { return 0; }
  void run(const StageProblem& p, const core::SharedArgs& args, Workspace, Stream) const override {
    core::append_shared(p.config, p.tokens, args.topk_ids.ptr<std::int32_t>(), args.topk_weights.ptr<float>(),
                        args.out_ids.ptr<std::int32_t>(), args.out_weights.ptr<float>());
  }
};

class Prepare final : public core::PrepareStage {
 public:
  explicit Prepare(float static_scale) : static_scale_(static_scale) {}
  Status can_implement(const StageProblem&) const override { return Status::ok(); }
  std::size_t workspace_size(const StageProblem& p) const override {
    return std::size_t(p.tokens * p.config.hidden_size) * sizeof(float);
  }
  void run(const StageProblem& p, const core::PrepareArgs& args, Workspace ws, Stream stream) const override {
    const std::int64_t t_count = p.tokens, h = p.config.hidden_size;
    float* x = reinterpret_cast<float*>(ws.data);
    const bf16* hidden = args.hidden.ptr<bf16>();
    const bool on_input = p.config.routing.effective_placement() == WeightPlacement::input;
    core::parallel_for(t_count, 16, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t t = b; t < e; ++t) {
        // Llama-4 scales the bf16 row by its router weight before quantizing (a bf16 multiply).
        const float w = on_input ? args.topk_weights.ptr<float>()[t] : 1.0f;
        for (std::int64_t i = 0; i < h; ++i) {
          const float v = bf16_to_float(hidden[t * h + i]);
          x[t * h + i] = on_input ? round_to_bf16(v * w) : v;
        }
      }
    });
    quantize_rows({p.config.quant, tensor_scale(p, static_scale_, x, t_count * h, stream)}, x, t_count, h, args.out);
  }

 private:
  float static_scale_;
};

class Experts final : public core::ExpertsStage {
 public:
  Experts(const Weights& w, float w2_static_scale) : weights_(w), w2_static_scale_(w2_static_scale) {}
  Status can_implement(const StageProblem&) const override { return Status::ok(); }
  bool applies_weights() const override { return false; }
  std::int64_t max_rows(const StageProblem& p) const override { return p.tokens * p.config.top_k(); }
  std::size_t workspace_size(const StageProblem& p) const override {
    Carver c(nullptr);
    carve(c, p.config, p.tokens * p.config.top_k());
    return c.used();
  }

  void run(const StageProblem& p, const core::ExpertsArgs& args, Workspace ws, Stream stream) const override {
    const MoEConfig& cfg = p.config;
    Carver c(ws.data);
    const Buffers b = carve(c, p.config, p.tokens * cfg.top_k());
    const QuantScheme scheme = cfg.quant.scheme;

    core::mark_step(p, "permute", stream);
    const PermutePlan plan{b.offsets, args.slot_rows.ptr<std::int32_t>(), b.row_token};
    const std::int64_t rows = plan_permutation(args.topk_ids.ptr<std::int32_t>(), p.tokens, cfg.top_k(),
                                               {cfg.first_local_expert(), cfg.local_experts()}, plan);
    const QuantizedRows a1 = prefix(b.a1, scheme, rows);
    gather_rows(scheme, args.in, b.row_token, rows, a1);
    experts(p, a1, rows, b, args.expert_out.ptr<bf16>(), stream);
  }

  // The masked format: each block's first counts[e] rows, packed expert by expert, through the
  // same steps; then back to their rows of out.
  Status can_implement_masked(const core::MaskedProblem&) const override { return Status::ok(); }
  std::size_t masked_workspace_size(const core::MaskedProblem& p) const override {
    Carver c(nullptr);
    carve_masked(c, p);
    return c.used();
  }
  void run_masked(const core::MaskedProblem& p, const core::MaskedExpertsArgs& args, Workspace ws,
                  Stream stream) const override {
    const MoEConfig& cfg = p.config;
    const std::int64_t el = cfg.local_experts(), cap = p.capacity, h = cfg.hidden_size, kb = ceil_div(h, kBlock);
    Carver c(ws.data);
    const MaskedBuffers m = carve_masked(c, p);
    const Buffers& b = m.experts;
    const StageProblem sp{cfg, el * cap, nullptr, p.observer};
    core::mark_step(sp, "permute", stream);
    b.offsets[0] = 0;
    for (std::int64_t e = 0; e < el; ++e) {
      const std::int64_t n = std::clamp<std::int64_t>(args.counts.ptr<std::int32_t>()[e], 0, cap);
      for (std::int64_t j = 0; j < n; ++j) m.source[b.offsets[e] + j] = std::int32_t(e * cap + j);
      b.offsets[e + 1] = b.offsets[e] + n;
    }
    const std::int64_t rows = b.offsets[el];
    const QuantScheme scheme = cfg.quant.scheme;
    const QuantizedRows a1 = prefix(b.a1, scheme, rows);
    core::parallel_for(rows, 16, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t r = begin; r < end; ++r) {
        const std::int64_t src = m.source[r];
        if (!p.fp8_input) {
          const bf16* row = args.hidden.ptr<bf16>() + src * h;
          if (scheme == QuantScheme::bf16) std::copy(row, row + h, a1.q.ptr<bf16>() + r * h);
          else for (std::int64_t i = 0; i < h; ++i) m.x[r * h + i] = bf16_to_float(row[i]);
          continue;
        }
        const std::uint8_t* row = args.hidden.ptr<std::uint8_t>() + src * h;
        std::copy(row, row + h, a1.q.ptr<std::uint8_t>() + r * h);
        const std::int64_t e = src / cap, j = src % cap;
        const TensorView& sv = args.hidden_scale;
        for (std::int64_t g = 0; g < kb; ++g)
          a1.scales.ptr<float>()[r * kb + g] = sv.ptr<float>()[e * sv.strides[0] + j * sv.strides[1] + g * sv.strides[2]];
      }
    });
    if (!p.fp8_input && scheme != QuantScheme::bf16) {
      core::mark_step(sp, "quantize", stream);
      quantize_rows({cfg.quant, 0.0f}, m.x, rows, h, a1);
    }
    experts(sp, a1, rows, b, m.out, stream);
    core::parallel_for(rows, 16, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t r = begin; r < end; ++r)
        std::copy(m.out + r * h, m.out + (r + 1) * h, args.out.ptr<bf16>() + std::int64_t(m.source[r]) * h);
    });
  }

 private:
  struct Buffers {
    std::int64_t* offsets;
    std::int32_t* row_token;
    QuantizedRows a1;      // [rows, H] permuted GEMM1 input
    TensorView gemm1_out;  // [rows, W] bf16
    TensorView act;        // [rows, I] f32
    QuantizedRows a2;      // [rows, I] GEMM2 input
  };

  struct MaskedBuffers {
    Buffers experts;
    std::int32_t* source;  // [E_local C] the masked row of each packed row
    float* x;              // [E_local C, H] bf16 input in f32, to be quantized
    bf16* out;             // [E_local C, H] packed outputs
  };

  // GEMM1 -> activation + requantization -> GEMM2 on the first `rows` rows of a1 (in expert
  // order, b.offsets), into out [rows, H].
  void experts(const StageProblem& p, const QuantizedRows& a1, std::int64_t rows, const Buffers& b, bf16* out,
               Stream stream) const {
    const MoEConfig& cfg = p.config;
    const QuantScheme scheme = cfg.quant.scheme;
    core::mark_step(p, "gemm1", stream);
    bf16* h1 = b.gemm1_out.ptr<bf16>();
    grouped_gemm({scheme, a1, b.offsets, weights_.w13, weights_.w13_scale, h1});

    core::mark_step(p, "activation", stream);
    const ActivationParams act = ActivationParams::of(cfg);
    const std::int64_t width = cfg.gemm1_width(), inter = cfg.intermediate_size;
    float* x2 = b.act.ptr<float>();
    core::parallel_for(rows, 8, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t r = begin; r < end; ++r) activate_row(act, h1 + r * width, x2 + r * inter);
    });
    const QuantizedRows a2 = prefix(b.a2, scheme, rows);
    quantize_rows({cfg.quant, tensor_scale(p, w2_static_scale_, x2, rows * inter, stream)}, x2, rows, inter, a2);

    core::mark_step(p, "gemm2", stream);
    grouped_gemm({scheme, a2, b.offsets, weights_.w2, weights_.w2_scale, out});
  }

  static QuantizedRows carve_rows(Carver& c, QuantScheme scheme, std::int64_t rows, std::int64_t cols) {
    QuantizedRows r;
    r.q = c.tensor(activation_dtype(scheme), {rows, cols}, Device::cpu);
    if (scheme != QuantScheme::bf16) r.scales = c.tensor(DType::f32, scale_shape(scheme, rows, cols), Device::cpu);
    return r;
  }

  // The first `rows` rows of a [max_rows, K] buffer, with their scales.
  static QuantizedRows prefix(QuantizedRows r, QuantScheme scheme, std::int64_t rows) {
    r.q.shape[0] = rows;
    if (scheme == QuantScheme::fp8_rowwise || scheme == QuantScheme::fp8_block) r.scales.shape[0] = rows;
    return r;
  }

  // Buffers for up to `slots` rows.
  static Buffers carve(Carver& c, const MoEConfig& cfg, std::int64_t slots) {
    const QuantScheme scheme = cfg.quant.scheme;
    Buffers b;
    b.offsets = reinterpret_cast<std::int64_t*>(c.take(sizeof(std::int64_t) * std::size_t(cfg.local_experts() + 1)));
    b.row_token = reinterpret_cast<std::int32_t*>(c.take(sizeof(std::int32_t) * std::size_t(slots)));
    b.a1 = carve_rows(c, scheme, slots, cfg.hidden_size);
    b.gemm1_out = c.tensor(DType::bf16, {slots, cfg.gemm1_width()}, Device::cpu);
    b.act = c.tensor(DType::f32, {slots, cfg.intermediate_size}, Device::cpu);
    b.a2 = carve_rows(c, scheme, slots, cfg.intermediate_size);
    return b;
  }

  static MaskedBuffers carve_masked(Carver& c, const core::MaskedProblem& p) {
    const std::int64_t rows = p.config.local_experts() * p.capacity, h = p.config.hidden_size;
    MaskedBuffers m;
    m.experts = carve(c, p.config, rows);
    m.source = reinterpret_cast<std::int32_t*>(c.take(sizeof(std::int32_t) * std::size_t(rows)));
    m.x = reinterpret_cast<float*>(c.take(sizeof(float) * std::size_t(rows * h)));
    m.out = reinterpret_cast<bf16*>(c.take(sizeof(bf16) * std::size_t(rows * h)));
    return m;
  }

  Weights weights_;
  float w2_static_scale_;
};

class Finalize final : public core::FinalizeStage {
 public:
  Status can_implement(const StageProblem&) const override { return Status::ok(); }
  std::size_t workspace_size(const StageProblem&) const override { return 0; }
  void run(const StageProblem& p, const core::FinalizeArgs& args, Workspace, Stream) const override {
    finalize({args.expert_out.ptr<bf16>(), args.slot_rows.ptr<std::int32_t>(),
              args.topk_weights.defined() ? args.topk_weights.ptr<float>() : nullptr, p.tokens,
              p.config.top_k(), p.config.hidden_size, args.out.ptr<bf16>()});
  }
};

class CpuBackend final : public core::BackendImpl {
 public:
  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::cpu; }
  Status can_implement(const MoEConfig& c) const override {
    if (c.experts_path == ExpertsPath::min_latency)
      return Status::no("the CPU backend has the staged path only, given --path min-latency");
    return Status::ok();
  }
  std::shared_ptr<const core::BackendWeights> prepare(const MoEConfig&, const Weights& w, core::Preparation how,
                                                      Stream) const override {
    auto h = std::make_shared<HostWeights>();
    h->views = w;
    h->bias = w.e_score_correction_bias;
    h->w13_static_scale = scalar_or_zero(w.w13_input_scale, how);
    h->w2_static_scale = scalar_or_zero(w.w2_input_scale, how);
    return h;
  }
  core::StageSet make_stages(const MoEConfig&, std::shared_ptr<const core::BackendWeights> prepared,
                             const TuningOptions*) const override {
    const auto& w = static_cast<const HostWeights&>(*prepared);
    core::StageSet s;
    s.router = std::make_unique<Router>();
    s.shared = std::make_unique<Shared>();
    s.prepare = std::make_unique<Prepare>(w.w13_static_scale);
    s.experts = std::make_unique<Experts>(w.views, w.w2_static_scale);
    s.finalize = std::make_unique<Finalize>();
    s.keep_alive = std::move(prepared);
    return s;
  }
  std::unique_ptr<core::EpStages> make_ep_stages() const override { return cpu::make_ep_stages(); }
  core::DeviceBuffer allocate(std::size_t bytes) const override {
    return core::DeviceBuffer(static_cast<std::byte*>(std::malloc(bytes ? bytes : 1)),
                              [](std::byte* p) { std::free(p); });
  }
};

}  // namespace
}  // namespace moekit::cpu

namespace moekit::core {
const BackendImpl& cpu_backend() {
  static const cpu::CpuBackend backend;
  return backend;
}
}  // namespace moekit::core
