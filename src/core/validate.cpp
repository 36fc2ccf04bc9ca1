#include "core/validate.h"

#include <string>

#include "core/rows.h"
#include "moekit/error.h"
#include "moekit/quant.h"

namespace moekit::core {
namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string dtypes_text(const std::vector<DType>& dtypes) {
  std::string s;
  for (DType d : dtypes) s += (s.empty() ? "" : "|") + std::string(to_string(d));
  return s;
}

void check_scales(std::string_view name, const TensorView& t, QuantScheme scheme, std::int64_t experts,
                  std::int64_t n, std::int64_t k, Device device) {
  switch (scheme) {
    case QuantScheme::bf16:
      require(!t.defined(), std::string(name) + ": expected absent for bf16, given " + t.to_string());
      return;
    case QuantScheme::fp8_tensor: check_tensor(name, t, {DType::f32}, {experts}, device); return;
    case QuantScheme::fp8_rowwise: check_tensor(name, t, {DType::f32}, {experts, n}, device); return;
    case QuantScheme::fp8_block:
      check_tensor(name, t, {DType::f32}, {experts, ceil_div(n, kBlock), ceil_div(k, kBlock)}, device);
      return;
  }
}

// A static scale on the host or with the other weights; its value is checked where it can be read.
void check_optional_scalar(std::string_view name, const TensorView& t, const MoEConfig& c, Device device) {
  if (!t.defined()) return;
  require(c.quant.scheme == QuantScheme::fp8_tensor,
          std::string(name) + ": a static activation scale needs fp8-tensor, given quant " +
              std::string(to_string(c.quant.scheme)));
  check_tensor(name, t, {DType::f32}, {1}, t.device == Device::cpu ? Device::cpu : device);
  if (t.device != Device::cpu) return;
  const float v = t.ptr<float>()[0];
  require(v > 0.0f, std::string(name) + ": expected a scale > 0, given " + std::to_string(v));
}

std::int64_t tokens_of(const TensorView& hidden, const MoEConfig& c, Device device) {
  require(hidden.defined() && hidden.rank == 2, [&] {
    return "hidden: expected [T, " + std::to_string(c.hidden_size) + "] bf16, given " + hidden.to_string();
  });
  const std::int64_t tokens = hidden.size(0);
  check_tensor("hidden", hidden, {DType::bf16}, {tokens, c.hidden_size}, device);
  return tokens;
}

}  // namespace

namespace {

template <class DTypes, class Shape>
void check_tensor_in(std::string_view name, const TensorView& t, const DTypes& dtypes, const Shape& shape, Device device) {
  // Every forward checks its tensors here: the messages are made only when a check fails.
  auto expected = [&] {
    return std::string(name) + ": expected " + shape_text({shape.begin(), shape.end()}) + " " +
           dtypes_text({dtypes.begin(), dtypes.end()}) + " " + std::string(to_string(device));
  };
  require(t.defined(), [&] { return expected() + ", given absent"; });
  bool dtype_ok = false;
  for (DType d : dtypes) dtype_ok = dtype_ok || d == t.dtype;
  bool shape_ok = t.rank == int(shape.size());
  std::size_t d = 0;
  for (auto it = shape.begin(); shape_ok && it != shape.end(); ++it, ++d) shape_ok = t.shape[d] == *it;
  require(dtype_ok && shape_ok && t.device == device, [&] { return expected() + ", given " + t.to_string(); });
  require(t.is_contiguous(), [&] { return std::string(name) + ": expected a contiguous row-major tensor"; });
  require(t.data != nullptr || t.numel() == 0, [&] { return std::string(name) + ": data pointer is null"; });
}

}  // namespace

void check_tensor(std::string_view name, const TensorView& t, const std::vector<DType>& dtypes,
                  const std::vector<std::int64_t>& shape, Device device) {
  check_tensor_in(name, t, dtypes, shape, device);
}

void check_tensor(std::string_view name, const TensorView& t, std::initializer_list<DType> dtypes,
                  std::initializer_list<std::int64_t> shape, Device device) {
  check_tensor_in(name, t, dtypes, shape, device);
}

void check_weights(const MoEConfig& c, const Weights& w, Device device) {
  const QuantScheme scheme = c.quant.scheme;
  const DType dtype = activation_dtype(scheme);
  const std::int64_t el = c.weight_experts(), width = c.gemm1_width();
  check_tensor("w13", w.w13, {dtype}, {el, width, c.hidden_size}, device);
  check_tensor("w2", w.w2, {dtype}, {el, c.hidden_size, c.intermediate_size}, device);
  check_scales("w13_scale", w.w13_scale, scheme, el, width, c.hidden_size, device);
  check_scales("w2_scale", w.w2_scale, scheme, el, c.hidden_size, c.intermediate_size, device);
  if (c.routing.uses_bias())
    check_tensor("e_score_correction_bias", w.e_score_correction_bias, {DType::f32, DType::bf16},
                 {c.num_experts}, device);
  check_optional_scalar("w13_input_scale", w.w13_input_scale, c, device);
  check_optional_scalar("w2_input_scale", w.w2_input_scale, c, device);
}

Weights weights_layout(const MoEConfig& c) {
  const QuantScheme scheme = c.quant.scheme;
  const DType dtype = activation_dtype(scheme);
  const std::int64_t el = c.weight_experts(), width = c.gemm1_width(), h = c.hidden_size, i = c.intermediate_size;
  auto view = [](DType d, const std::vector<std::int64_t>& shape) { return TensorView::contiguous(nullptr, d, shape); };
  auto scales = [&](std::int64_t n, std::int64_t k) -> TensorView {
    switch (scheme) {
      case QuantScheme::bf16: return {};
      case QuantScheme::fp8_tensor: return view(DType::f32, {el});
      case QuantScheme::fp8_rowwise: return view(DType::f32, {el, n});
      case QuantScheme::fp8_block: return view(DType::f32, {el, ceil_div(n, kBlock), ceil_div(k, kBlock)});
    }
    return {};
  };
  Weights w;
  w.w13 = view(dtype, {el, width, h});
  w.w2 = view(dtype, {el, h, i});
  w.w13_scale = scales(width, h);
  w.w2_scale = scales(h, i);
  if (c.routing.uses_bias()) w.e_score_correction_bias = view(DType::f32, {c.num_experts});
  return w;
}

std::int64_t check_args(const MoEConfig& c, const FusedArgs& a, Device device) {
  require(c.routing.method != RoutingMethod::external,
          "routing: method 'external' takes its routing from the caller; call forward(ExternalArgs)");
  const std::int64_t t = tokens_of(a.hidden, c, device);
  check_tensor("router_logits", a.router_logits, {DType::f32, DType::bf16}, {t, c.num_experts}, device);
  check_tensor("out", a.out, {DType::bf16}, {t, c.hidden_size}, device);
  require(a.topk_ids.defined() == a.topk_weights.defined(),
          "topk_ids/topk_weights: pass both routing outputs or neither");
  if (a.topk_ids.defined()) {
    check_tensor("topk_ids", a.topk_ids, {DType::i32}, {t, c.top_k()}, device);
    check_tensor("topk_weights", a.topk_weights, {DType::f32}, {t, c.top_k()}, device);
  }
  return t;
}

std::int64_t check_args(const MoEConfig& c, const ExternalArgs& a, Device device) {
  const std::int64_t t = tokens_of(a.hidden, c, device);
  check_tensor("topk_ids", a.topk_ids, {DType::i32}, {t, c.top_k()}, device);
  check_tensor("topk_weights", a.topk_weights, {DType::f32}, {t, c.top_k()}, device);
  check_tensor("out", a.out, {DType::bf16}, {t, c.hidden_size}, device);
  if (device == Device::cpu) check_topk_ids(a.topk_ids, c.num_experts);
  return t;
}

MaskedProblem check_args(const MoEConfig& c, const MaskedArgs& a, Device device) {
  const QuantScheme scheme = c.quant.scheme;
  require(scheme == QuantScheme::bf16 || scheme == QuantScheme::fp8_block, [&] {
    return "quant: the masked format takes bf16 and fp8-block layers, given " + std::string(to_string(scheme));
  });
  const std::int64_t el = c.local_experts(), h = c.hidden_size, kb = ceil_div(h, kBlock);
  const std::vector<DType> dtypes = scheme == QuantScheme::fp8_block ? std::vector<DType>{DType::bf16, DType::fp8_e4m3}
                                                                     : std::vector<DType>{DType::bf16};
  require(a.hidden.defined() && a.hidden.rank == 3 && a.hidden.size(1) >= 1, [&] {
    return "hidden: expected [E_local=" + std::to_string(el) + ", C >= 1, " + std::to_string(h) + "] " +
           dtypes_text(dtypes) + " (the masked format), given " + a.hidden.to_string();
  });
  MaskedProblem p;
  p.config = c;
  p.capacity = a.hidden.size(1);
  check_tensor("hidden", a.hidden, dtypes, {el, p.capacity, h}, device);
  p.fp8_input = a.hidden.dtype == DType::fp8_e4m3;
  if (p.fp8_input) {
    const TensorView& s = a.hidden_scale;
    const std::vector<std::int64_t> shape{el, p.capacity, kb};
    require(s.defined() && s.dtype == DType::f32 && s.shape_vector() == shape && s.device == device, [&] {
      return "hidden_scale: expected " + shape_text(shape) + " f32 " + std::string(to_string(device)) +
             " for fp8 hidden, given " + (s.defined() ? s.to_string() : std::string("absent"));
    });
    const bool row_major = s.is_contiguous();
    const bool mn_major = s.strides[0] == kb * p.capacity && (s.strides[1] == 1 || p.capacity == 1) &&
                          (s.strides[2] == p.capacity || kb == 1);
    require(row_major || mn_major, [&] {
      return "hidden_scale: expected row-major strides or C contiguous (strides [" + std::to_string(kb * p.capacity) +
             ", 1, " + std::to_string(p.capacity) + "])";
    });
    require(s.data != nullptr || s.numel() == 0, "hidden_scale: data pointer is null");
    p.scales_mn_major = !row_major;
  } else {
    require(!a.hidden_scale.defined(),
            [&] { return "hidden_scale: expected absent for bf16 hidden, given " + a.hidden_scale.to_string(); });
  }
  check_tensor("counts", a.counts, {DType::i32}, {el}, device);
  check_tensor("out", a.out, {DType::bf16}, {el, p.capacity, h}, device);
  require(a.expected_rows >= 0 && a.expected_rows <= p.capacity, [&] {
    return "expected_rows: expected in [0, C=" + std::to_string(p.capacity) + "], given " + std::to_string(a.expected_rows);
  });
  p.expected_rows = a.expected_rows > 0 ? a.expected_rows : p.capacity;
  return p;
}

void check_topk_ids(const TensorView& ids, std::int64_t num_experts) {
  const std::int32_t* p = ids.ptr<std::int32_t>();
  for (std::int64_t i = 0; i < ids.numel(); ++i) {
    require(p[i] >= -1 && p[i] < num_experts, [&] {
      return "topk_ids: expected ids in [-1, " + std::to_string(num_experts) + "), given " + std::to_string(p[i]) +
             " at flat index " + std::to_string(i);
    });
  }
}

}  // namespace moekit::core
