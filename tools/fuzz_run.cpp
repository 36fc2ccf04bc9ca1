#include "fuzz_run.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cpu/reference.h"
#include "fuzz_problem.h"
#include "moekit/device.h"
#include "moekit/routing.h"

namespace moekit::cli::fuzz {
namespace {

// References with device-like GEMM1 flips drawn for an FP8 case on a device past the sampled
// bounds (core/check.h): half of them also step the largest value under each scale.
constexpr std::uint64_t kSensitivityDraws = 4;

// NaN for every float dtype and -1 for ids: an element nothing wrote cannot pass.
Tensor poisoned(DType dtype, std::vector<std::int64_t> shape) {
  Tensor t(dtype, std::move(shape));
  std::memset(t.view().data, 0xff, t.nbytes());
  return t;
}

DeviceTensor on(Device device, const Tensor& host) {
  DeviceTensor t(host.dtype(), host.shape(), device);
  t.copy_from(host.view());
  return t;
}

Tensor to_host(const DeviceTensor& d) {
  Tensor t(d.view().dtype, d.view().shape_vector());
  d.copy_to(t.view());
  return t;
}

// Elements of b whose bits differ from a's first b.numel() (a's leading rows, when it is larger).
std::int64_t bit_differences(const Tensor& a, const Tensor& b) {
  const std::size_t size = dtype_size(a.dtype());
  const auto* pa = static_cast<const unsigned char*>(a.view().data);
  const auto* pb = static_cast<const unsigned char*>(b.view().data);
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) n += std::memcmp(pa + std::size_t(i) * size, pb + std::size_t(i) * size, size) != 0;
  return n;
}

// Representable floats between a and b (both finite).
std::int64_t ulp_distance(float a, float b) {
  auto key = [](float f) {
    std::int32_t i;
    std::memcpy(&i, &f, sizeof i);
    return i >= 0 ? std::int64_t(i) : -std::int64_t(i & 0x7fffffff);
  };
  return std::llabs(key(a) - key(b));
}

// NaN against a number, Inf against anything else, or numbers more than max_ulp apart.
bool weights_differ(float a, float b, std::int64_t max_ulp) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) != std::isnan(b);
  if (!std::isfinite(a) || !std::isfinite(b)) return a != b;
  return ulp_distance(a, b) > max_ulp;
}

std::string exact(float v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", double(v));
  return text;
}

LayerOptions options_for(const MoEConfig& m, const std::string& backend) {
  LayerOptions o;
  o.backend = backend;
  if (m.ep_size > 1) o.ep.scope = EpScope::this_rank;  // this rank's experts alone, no exchange
  return o;
}

struct Forward {
  Tensor out, ids, weights;  // [T, H] bf16, [T, k] i32, [T, k] f32: the routing the layer ran
};

// One call on the layer's device: inputs copied there, outputs poisoned, results copied back.
Forward forward(Layer& layer, const Case& c, const Inputs& in) {
  const Device d = layer.device();
  const std::int64_t t = in.hidden.size(0), k = c.config.top_k();
  DeviceTensor hidden = on(d, in.hidden), out = on(d, poisoned(DType::bf16, {t, c.config.hidden_size}));
  DeviceTensor ids = c.fused ? on(d, poisoned(DType::i32, {t, k})) : on(d, in.topk_ids);
  DeviceTensor weights = c.fused ? on(d, poisoned(DType::f32, {t, k})) : on(d, in.topk_weights);
  if (c.fused) {
    const DeviceTensor logits = on(d, in.logits);
    layer.forward(FusedArgs{hidden.view(), logits.view(), out.view(), ids.view(), weights.view()});
  } else {
    layer.forward(ExternalArgs{hidden.view(), ids.view(), weights.view(), out.view()});
  }
  synchronize(d);
  return {to_host(out), to_host(ids), to_host(weights)};
}

bool finite_logits(const Tensor& logits, std::int64_t token) {
  const std::int64_t e = logits.size(1);
  for (std::int64_t i = token * e; i < (token + 1) * e; ++i) {
    const float v = logits.dtype() == DType::f32 ? logits.ptr<float>()[i] : bf16_to_float(logits.ptr<bf16>()[i]);
    if (!std::isfinite(v)) return false;
  }
  return true;
}

// Fused routing with f32 logits: the ids of the CPU router (DESIGN §3 defines them for NaN and
// ±Inf too), and its weights where the token's logits are finite (bit for bit on the CPU
// backend, within 4 ulp elsewhere, as the routing tests hold them).
void check_routing(const Case& c, const Problem& p, const Forward& f, const Target& target, Outcome& o) {
  if (!c.fused || c.logits_dtype != DType::f32) return;
  const std::int64_t tokens = c.tokens, k = c.config.top_k();
  const Tensor ids = poisoned(DType::i32, {tokens, k}), weights = poisoned(DType::f32, {tokens, k});
  const RoutingConfig& r = c.config.routing;
  route(r, {p.in.logits.view(), r.uses_bias() ? p.layer.e_score_correction_bias.view() : TensorView{}},
        {ids.view(), weights.view()});
  const std::int64_t max_ulp = target.backend == "cpu" ? 0 : 4;
  std::int64_t wrong_ids = 0, wrong_weights = 0;
  std::string first_id, first_weight;
  for (std::int64_t t = 0; t < tokens; ++t) {
    const bool finite = finite_logits(p.in.logits, t);
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t i = t * k + j;
      const std::int32_t got = f.ids.ptr<std::int32_t>()[i], want = ids.ptr<std::int32_t>()[i];
      if (got != want && wrong_ids++ == 0)
        first_id = "token " + std::to_string(t) + " slot " + std::to_string(j) + ": " + std::to_string(got) +
                   ", the CPU router " + std::to_string(want) + (finite ? "" : " (logits not all finite)");
      const float gw = f.weights.ptr<float>()[i], ww = weights.ptr<float>()[i];
      if (finite && got == want && weights_differ(gw, ww, max_ulp) && wrong_weights++ == 0)
        first_weight = "token " + std::to_string(t) + " slot " + std::to_string(j) + ": " + exact(gw) +
                       ", the CPU router " + exact(ww);
    }
  }
  if (wrong_ids) o.fail("ids", std::to_string(wrong_ids) + " ids differ from the CPU router's, first " + first_id);
  if (wrong_weights)
    o.fail("weights", std::to_string(wrong_weights) + " weights beyond " + std::to_string(max_ulp) + " ulp, first " + first_weight);
}

// A token's output bits do not depend on its batch: batch-invariant layers (DESIGN §8), and on the
// CPU (one token at a time) every layer but fp8-tensor with dynamic scales (the batch's amax).
bool batch_independent(const Case& c, const Target& target) {
  const bool batch_scale = c.config.quant.scheme == QuantScheme::fp8_tensor && !c.static_scales;
  return c.config.batch_invariant || (target.backend == "cpu" && !batch_scale);
}

void run_valid(const Case& c, const Target& target, Outcome& o) {
  const Problem p = make_problem(c);
  Layer layer(c.config, p.weights(), options_for(c.config, target.backend));
  std::optional<Forward> larger;
  if (c.larger_call_first) larger = forward(layer, c, larger_batch(c, p));
  const Forward f = forward(layer, c, p.in);
  check_routing(c, p, f, target, o);

  const cpu::ReferenceInputs in{c.config, p.weights(), p.in.hidden.view(), f.ids.view(), f.weights.view()};
  Tensor ref(DType::bf16, {c.tokens, c.config.hidden_size});
  cpu::pipeline_reference(in, ref.view());
  const std::vector<double> ideal = cpu::ideal_reference(in, ScaledMaster(c));
  // On a device, the bounds allow for the few FP8 codes a small problem requantizes and for
  // dynamic tensor and row scales (core/check.h, CheckSampling); the CPU must match bit for bit.
  core::CheckSampling sampling;
  if (target.backend != "cpu") {
    const MoEConfig& m = c.config;
    const std::int64_t first = m.first_local_expert(), local = m.local_experts();
    std::int64_t slots = 0;
    for (std::int64_t i = 0; i < f.ids.numel(); ++i) {
      const std::int64_t e = f.ids.ptr<std::int32_t>()[i];
      slots += e >= first && e < first + local;
    }
    sampling.codes = double(slots) * double(m.intermediate_size);
    sampling.row_codes = double(m.top_k()) * double(m.intermediate_size);
    sampling.dynamic_scale = (m.quant.scheme == QuantScheme::fp8_tensor && !c.static_scales) ||
                             m.quant.scheme == QuantScheme::fp8_rowwise;
  }
  core::CheckResult r = core::check_output({f.out.view(), ref.view(), ideal, c.config.quant, sampling});
  // Past those bounds, the problem's own sensitivity decides (it only widens them, so it is
  // measured only then): references with device-like GEMM1 flips, two at random and two that
  // move the largest value under each dynamic scale (core/check.h).
  if (!r.pass() && target.backend != "cpu" && c.config.quant.scheme != QuantScheme::bf16) {
    for (std::uint64_t draw = 1; draw <= kSensitivityDraws; ++draw) {
      cpu::ReferenceInputs moved = in;
      moved.gemm1_flips = core::kGemm1Flips;
      moved.gemm1_scale_steps = draw > kSensitivityDraws / 2;
      moved.flip_seed = c.seed + draw;
      Tensor shifted(DType::bf16, {c.tokens, c.config.hidden_size});
      cpu::pipeline_reference(moved, shifted.view());
      const core::CheckResult s = core::check_output({shifted.view(), ref.view(), ideal, c.config.quant});
      sampling.sensitivity = std::max(sampling.sensitivity, s.rel_err);
      sampling.row_sensitivity = std::max(sampling.row_sensitivity, s.worst_row);
      if (s.has_ideal) sampling.ideal_sensitivity = std::max(sampling.ideal_sensitivity, s.ideal_ratio);
    }
    r = core::check_output({f.out.view(), ref.view(), ideal, c.config.quant, sampling});
  }
  o.details = r.figures();
  if (sampling.sensitivity > 0) {
    char text[160];
    std::snprintf(text, sizeof text, " sensitivity: rel_err=%.2e worst_row=%.2e ideal_ratio=%.4f", sampling.sensitivity,
                  sampling.row_sensitivity, sampling.ideal_sensitivity);
    o.details += text;
  }
  o.check = r;
  for (const core::CheckRule rule : r.failed) o.failed.push_back(std::string(core::to_string(rule)));
  if (!r.pass()) o.details += "; check " + r.verdict();
  if (target.backend == "cpu")  // the same quantization points and arithmetic order
    if (const std::int64_t n = bit_differences(ref, f.out))
      o.fail("bits", std::to_string(n) + " elements differ from the pipeline reference's bits");
  if (larger && batch_independent(c, target))
    if (const std::int64_t n = bit_differences(larger->out, f.out))
      o.fail("batch", std::to_string(n) + " elements differ from the same tokens' in the larger batch before");
  if (const std::int64_t n = bit_differences(forward(layer, c, p.in).out, f.out))
    o.fail("repeat", std::to_string(n) + " elements differ in a second call (DESIGN §8: deterministic)");
}

// ---- Invalid problems ----

// The message with the device's name replaced, so that the CPU's and a GPU's messages compare.
std::string without_device(std::string s, Device d) {
  const std::string name(to_string(d));
  for (std::size_t at = s.find(name); at != std::string::npos; at = s.find(name, at)) s.replace(at, name.size(), "<device>");
  return s;
}

struct Refusal {
  bool refused = false;
  std::string message;      // the Error's
  std::string compared;     // the same with the device's name replaced
  bool wrote_out = false;   // the output changed although the call was refused
};

MoEConfig broken_config(const Case& c) {
  MoEConfig m = c.config;
  RoutingConfig& r = m.routing;
  const auto e = int(m.num_experts);
  switch (c.breaks) {
    case Breaks::top_k: r.top_k = e + 1; break;
    case Breaks::n_group: r.n_group = e + 1; break;
    case Breaks::topk_group: r.topk_group = r.n_group + 1; break;
    case Breaks::block_intermediate:
      m.quant.scheme = QuantScheme::fp8_block;
      m.intermediate_size = m.intermediate_size % kBlock == 0 ? m.intermediate_size + 16 : m.intermediate_size;
      break;
    case Breaks::ep_size: m.ep_size = e + 1, m.ep_rank = 0; break;
    case Breaks::ep_rank: m.ep_rank = m.ep_size; break;
    case Breaks::bf16_scale_format: m.quant = {QuantScheme::bf16, ScaleFormat::ue8m0, QuantConfig{}.accumulation}; break;
    case Breaks::bf16_accumulation: m.quant = {QuantScheme::bf16, ScaleFormat::f32, Fp8Accumulation::exact}; break;
    case Breaks::invariant_fp8_tensor: m.quant.scheme = QuantScheme::fp8_tensor, m.batch_invariant = true; break;
    case Breaks::top1_k: r.method = RoutingMethod::top1_sigmoid, r.top_k = 2; break;
    case Breaks::scaling_factor: r.routed_scaling_factor = 0.0f; break;
    case Breaks::hidden_size: m.hidden_size = 0; break;
    case Breaks::external_fused: r.method = RoutingMethod::external; break;
    default: break;
  }
  return m;
}

// The case's call with its broken argument, on `backend`.
Refusal try_broken(const Case& c, const Problem& p, const std::string& backend) {
  MoEConfig m = broken_config(c);
  // The CPU, asked for a GPU case's message, takes the staged path: a forced min-latency one it
  // would refuse first.
  if (backend == "cpu" && m.experts_path == ExpertsPath::min_latency) m.experts_path = ExpertsPath::automatic;
  Weights w = p.weights();
  Tensor wrong_w13, input_scale;
  if (c.breaks == Breaks::w13_shape) {
    wrong_w13 = Tensor(w.w13.dtype, {w.w13.size(0), w.w13.size(1), w.w13.size(2) + 16});
    std::memset(wrong_w13.view().data, 0, wrong_w13.nbytes());
    w.w13 = wrong_w13.view();
  }
  if (c.breaks == Breaks::w2_scale) w.w2_scale = {};
  if (c.breaks == Breaks::bias) w.e_score_correction_bias = {};
  if (c.breaks == Breaks::input_scale) {  // fp8-tensor: a scale of 0; other schemes: any scale
    input_scale = Tensor(DType::f32, {1});
    input_scale.ptr<float>()[0] = m.quant.scheme == QuantScheme::fp8_tensor ? 0.0f : 1.0f;
    w.w13_input_scale = input_scale.view();
  }
  Refusal r;
  std::optional<Device> device;
  try {
    Layer layer(m, w, options_for(m, backend));
    device = layer.device();
    const std::int64_t t = c.tokens, h = c.config.hidden_size, k = c.config.top_k(), e = c.config.num_experts;
    auto zeros = [](DType dtype, std::vector<std::int64_t> shape) {
      Tensor z(dtype, std::move(shape));
      std::memset(z.view().data, 0, z.nbytes());
      return z;
    };
    const DeviceTensor hidden = on(*device, c.breaks == Breaks::hidden_dtype ? zeros(DType::f32, {t, h})
                                           : zeros(DType::bf16, {t, c.breaks == Breaks::hidden_shape ? h + 1 : h}));
    const Tensor out_before = poisoned(DType::bf16, {c.breaks == Breaks::out_shape ? t + 1 : t, h});
    const DeviceTensor out = on(*device, out_before);
    const DeviceTensor ids = on(*device, zeros(DType::i32, {t, c.breaks == Breaks::ids_shape ? k + 1 : k}));
    const DeviceTensor weights = on(*device, zeros(c.breaks == Breaks::weights_dtype ? DType::bf16 : DType::f32, {t, k}));
    const DeviceTensor logits = on(*device, zeros(DType::f32, {t, c.breaks == Breaks::logits_shape ? e + 1 : e}));
    try {
      if (c.fused || c.breaks == Breaks::external_fused)
        layer.forward(FusedArgs{hidden.view(), logits.view(), out.view(), ids.view(),
                                c.breaks == Breaks::one_routing_output ? TensorView{} : weights.view()});
      else
        layer.forward(ExternalArgs{hidden.view(), ids.view(), weights.view(), out.view()});
      synchronize(*device);
    } catch (const Error&) {
      r.wrote_out = bit_differences(to_host(out), out_before) != 0;
      throw;
    }
  } catch (const Error& e) {
    r.refused = true;
    r.message = e.what();
    r.compared = device ? without_device(r.message, *device) : r.message;
  }
  return r;
}

void run_invalid(const Case& c, const Target& target, Outcome& o) {
  const Problem p = make_problem(c);
  const Refusal got = try_broken(c, p, target.backend);
  o.details = got.refused ? "refused: " + got.message : "accepted";
  if (!got.refused) {
    o.fail("refusal", "the " + target.backend + " backend ran it");
    return;
  }
  const std::string argument(argument_of(c.breaks));
  if (got.message.rfind(argument + ":", 0) != 0) o.fail("refusal", "the message does not begin with '" + argument + ":'");
  if (got.wrote_out) o.fail("refusal", "the output was written before the refusal");
  if (target.backend == "cpu") return;
  const Refusal cpu = try_broken(c, p, "cpu");
  if (!cpu.refused) o.fail("refusal", "the cpu backend ran it");
  else if (cpu.compared != got.compared) o.fail("refusal", "the cpu backend says: " + cpu.message);
}

}  // namespace

void Outcome::fail(const std::string& what, const std::string& why) {
  if (std::find(failed.begin(), failed.end(), what) == failed.end()) failed.push_back(what);
  details += (details.empty() ? "" : "; ") + why;
}

Outcome run_case(const Case& c, const Target& target) {
  Outcome o;
  try {
    if (c.valid()) run_valid(c, target, o);
    else run_invalid(c, target, o);
  } catch (const Error& e) {
    o.fail("error", std::string("moekit::Error: ") + e.what());
  } catch (const std::exception& e) {
    o.fail("error", std::string("not a moekit::Error: ") + e.what());
  }
  return o;
}

}  // namespace moekit::cli::fuzz
