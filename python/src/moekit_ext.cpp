// moekit._C: the thin binding under the Python package (python/moekit). Tensors become
// TensorViews without a copy (torch tensors read through their attributes, anything else through
// DLPack); configs arrive as dicts of the spellings moekit uses everywhere; moekit::Error becomes
// moekit.Error (a ValueError).
// The GIL is released while moekit works. Everything above this file is Python.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/tuning.h"
#include "io/checkpoint.h"
#include "io/layer_file.h"
#include "io/presets.h"
#include "moekit/moekit.h"

#ifdef MOEKIT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/layer/tactic.h"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace moekit::python {
namespace {

DType dtype_of(const nb::dlpack::dtype& d, const char* name) {
  using Code = nb::dlpack::dtype_code;
  const auto code = Code(d.code);
  if (d.lanes == 1) {
    if (code == Code::Float && d.bits == 32) return DType::f32;
    if (code == Code::Float && d.bits == 16) return DType::f16;
    if (code == Code::Bfloat && d.bits == 16) return DType::bf16;
    if (code == Code::Float8_E4M3FN && d.bits == 8) return DType::fp8_e4m3;
    if (code == Code::Int && d.bits == 32) return DType::i32;
    if (code == Code::Int && d.bits == 64) return DType::i64;
    if (code == Code::UInt && d.bits == 8) return DType::u8;
  }
  throw Error(std::string(name) + ": expected a float32|float16|bfloat16|float8_e4m3fn|int32|int64|uint8 tensor, given "
              "DLPack dtype code " + std::to_string(int(d.code)) + " with " + std::to_string(int(d.bits)) + " bits");
}

// The device a tensor lives on, -1 for the host.
int device_index(const nb::ndarray<>& a, const char* name) {
  if (a.device_type() == nb::device::cpu::value) return -1;
  if (a.device_type() == nb::device::cuda::value) return a.device_id();
  throw Error(std::string(name) + ": expected a cpu or cuda tensor, given DLPack device type " +
              std::to_string(a.device_type()));
}

TensorView view_of(const nb::ndarray<>& a, const char* name) {
  require(a.ndim() <= std::size_t(kMaxRank), std::string(name) + ": expected at most 4 dimensions, given " +
                                                   std::to_string(a.ndim()));
  TensorView v;
  v.data = a.data();
  v.dtype = dtype_of(a.dtype(), name);
  v.rank = int(a.ndim());
  for (int d = 0; d < v.rank; ++d) {
    v.shape[std::size_t(d)] = std::int64_t(a.shape(std::size_t(d)));
    v.strides[std::size_t(d)] = std::int64_t(a.stride(std::size_t(d)));
  }
  v.device = device_index(a, name) < 0 ? Device::cpu : Device::cuda;
  return v;
}

// torch tensors are read through their attributes (data_ptr, dtype, shape, stride, device): a
// DLPack export costs a few µs per tensor, which a T = 1 call would feel; anything else with
// __dlpack__ or the buffer protocol goes through DLPack. The attribute names are interned once: a
// call reads four or five tensors, seven attributes each.
struct TorchTypes {
  nb::handle tensor;  // torch.Tensor
  std::pair<nb::handle, DType> dtypes[7];
  nb::handle dtype, shape, stride, is_cuda, is_cpu, get_device, data_ptr;  // interned names
};

// torch's types, once torch is imported (this module never imports it itself).
const TorchTypes* torch_types() {
  static TorchTypes* types = nullptr;
  if (types) return types;
  nb::handle modules = PyImport_GetModuleDict();
  if (!PyDict_GetItemString(modules.ptr(), "torch")) return nullptr;
  nb::module_ torch = nb::module_::import_("torch");
  auto* t = new TorchTypes;  // kept for the process, as the types and names it holds
  t->tensor = torch.attr("Tensor").inc_ref();
  const std::pair<const char*, DType> names[7] = {{"float32", DType::f32}, {"float16", DType::f16},
                                                   {"bfloat16", DType::bf16}, {"float8_e4m3fn", DType::fp8_e4m3},
                                                   {"int32", DType::i32}, {"int64", DType::i64},
                                                   {"uint8", DType::u8}};
  for (int i = 0; i < 7; ++i) t->dtypes[i] = {torch.attr(names[i].first).inc_ref(), names[i].second};
  auto intern = [](const char* name) { return nb::handle(PyUnicode_InternFromString(name)); };
  t->dtype = intern("dtype");
  t->shape = intern("shape");
  t->stride = intern("stride");
  t->is_cuda = intern("is_cuda");
  t->is_cpu = intern("is_cpu");
  t->get_device = intern("get_device");
  t->data_ptr = intern("data_ptr");
  types = t;
  return types;
}

// obj.name, and obj.name() (without a bound method in between); Python's error becomes a C++ one.
nb::object attribute(nb::handle obj, nb::handle name) {
  PyObject* v = PyObject_GetAttr(obj.ptr(), name.ptr());
  if (!v) throw nb::python_error();
  return nb::steal(v);
}
nb::object call_method(nb::handle obj, nb::handle name) {
  PyObject* v = PyObject_CallMethodNoArgs(obj.ptr(), name.ptr());
  if (!v) throw nb::python_error();
  return nb::steal(v);
}

// The tensor `obj` (a torch tensor, or anything DLPack takes) as a view; *device: its CUDA
// device, -1 for the host.
TensorView view_of(nb::handle obj, const char* name, int* device = nullptr) {
  const TorchTypes* torch = torch_types();
  if (!torch || !PyObject_TypeCheck(obj.ptr(), reinterpret_cast<PyTypeObject*>(torch->tensor.ptr()))) {
    const auto a = nb::cast<nb::ndarray<>>(obj);
    if (device) *device = device_index(a, name);
    return view_of(a, name);
  }
  TensorView v;
  const nb::object dtype = attribute(obj, torch->dtype);
  bool known = false;
  for (const auto& [type, d] : torch->dtypes)
    if (dtype.is(type)) v.dtype = d, known = true;
  if (!known)
    throw Error(std::string(name) + ": expected a float32|float16|bfloat16|float8_e4m3fn|int32|int64|uint8 tensor, given " +
                nb::cast<std::string>(nb::str(dtype)));
  const nb::tuple shape = nb::borrow<nb::tuple>(attribute(obj, torch->shape));
  const nb::tuple strides = nb::cast<nb::tuple>(call_method(obj, torch->stride));
  require(shape.size() <= std::size_t(kMaxRank), [&] {
    return std::string(name) + ": expected at most 4 dimensions, given " + std::to_string(shape.size());
  });
  v.rank = int(shape.size());
  for (int d = 0; d < v.rank; ++d) {
    v.shape[std::size_t(d)] = nb::cast<std::int64_t>(shape[std::size_t(d)]);
    v.strides[std::size_t(d)] = nb::cast<std::int64_t>(strides[std::size_t(d)]);
  }
  const bool cuda = attribute(obj, torch->is_cuda).is(Py_True);
  if (!cuda && !attribute(obj, torch->is_cpu).is(Py_True))
    throw Error(std::string(name) + ": expected a cpu or cuda tensor, given one on " +
                nb::cast<std::string>(nb::str(obj.attr("device"))));
  v.device = cuda ? Device::cuda : Device::cpu;
  if (device) *device = cuda ? nb::cast<int>(call_method(obj, torch->get_device)) : -1;
  v.data = reinterpret_cast<void*>(nb::cast<std::uintptr_t>(call_method(obj, torch->data_ptr)));
  return v;
}

// An optional tensor argument: None is an undefined view.
TensorView optional_view(nb::handle obj, const char* name) { return obj.is_none() ? TensorView{} : view_of(obj, name); }

// Makes `device` current for the scope (CUDA tensors run where they live, as torch's ops do).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
#ifdef MOEKIT_HAVE_CUDA
    if (device < 0) return;
    if (cudaGetDevice(&previous_) != cudaSuccess || previous_ == device) return;
    if (cudaSetDevice(device) != cudaSuccess) throw Error("cuda: cannot make device " + std::to_string(device) + " current");
    restore_ = true;
#else
    require(device < 0, "tensors: cuda tensors given, and this build of moekit has no CUDA");
#endif
  }
  ~DeviceScope() {
#ifdef MOEKIT_HAVE_CUDA
    if (restore_) cudaSetDevice(previous_);
#endif
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

Stream as_stream(std::uintptr_t stream) { return reinterpret_cast<Stream>(stream); }

// ---- configs: dicts of moekit's spellings -------------------------------------------------

template <class T>
T get(const nb::dict& d, const char* key, T fallback) {
  return d.contains(key) ? nb::cast<T>(d[key]) : fallback;
}

// The routing keys of a config dict (moekit.route takes these alone).
RoutingConfig routing_from(const nb::dict& d) {
  RoutingConfig r;
  r.top_k = get<int>(d, "top_k", r.top_k);
  if (d.contains("routing")) r.method = parse_routing_method(nb::cast<std::string>(d["routing"]));
  r.n_group = get<int>(d, "n_group", r.n_group);
  r.topk_group = get<int>(d, "topk_group", r.topk_group);
  r.routed_scaling_factor = get<float>(d, "routed_scaling_factor", r.routed_scaling_factor);
  if (d.contains("weight_placement")) {
    const std::string p = nb::cast<std::string>(d["weight_placement"]);
    require(p == "output" || p == "input", "weight_placement: expected output|input, given '" + p + "'");
    r.weight_placement = p == "input" ? WeightPlacement::input : WeightPlacement::output;
  }
  return r;
}

MoEConfig config_from(const nb::dict& d) {
  static const char* known[] = {"num_experts", "hidden_size", "intermediate_size", "top_k", "routing", "n_group",
                                "topk_group", "routed_scaling_factor", "weight_placement", "activation", "quant",
                                "scale_format", "accumulation", "swiglu_alpha", "swiglu_limit", "batch_invariant",
                                "experts_path", "ep_size", "ep_rank", "shared_experts", "shared_expert_weight"};
  for (auto [key, value] : d) {
    const std::string k = nb::cast<std::string>(key);
    bool ok = false;
    for (const char* name : known) ok = ok || k == name;
    require(ok, "config: unknown key '" + k + "'");
  }
  MoEConfig c;
  c.num_experts = get<std::int64_t>(d, "num_experts", 0);
  c.hidden_size = get<std::int64_t>(d, "hidden_size", 0);
  c.intermediate_size = get<std::int64_t>(d, "intermediate_size", 0);
  c.routing = routing_from(d);
  if (d.contains("activation")) c.activation = parse_activation(nb::cast<std::string>(d["activation"]));
  if (d.contains("quant")) c.quant.scheme = parse_quant_scheme(nb::cast<std::string>(d["quant"]));
  if (d.contains("scale_format")) {
    const std::string f = nb::cast<std::string>(d["scale_format"]);
    require(f == "f32" || f == "ue8m0", "scale_format: expected f32|ue8m0, given '" + f + "'");
    c.quant.scale_format = f == "ue8m0" ? ScaleFormat::ue8m0 : ScaleFormat::f32;
  }
  if (d.contains("accumulation")) c.quant.accumulation = parse_fp8_accumulation(nb::cast<std::string>(d["accumulation"]));
  c.swiglu_alpha = get<float>(d, "swiglu_alpha", c.swiglu_alpha);
  c.swiglu_limit = get<float>(d, "swiglu_limit", c.swiglu_limit);
  c.batch_invariant = get<bool>(d, "batch_invariant", c.batch_invariant);
  if (d.contains("experts_path")) c.experts_path = parse_experts_path(nb::cast<std::string>(d["experts_path"]));
  c.ep_size = get<int>(d, "ep_size", c.ep_size);
  c.ep_rank = get<int>(d, "ep_rank", c.ep_rank);
  c.shared_experts = get<std::int64_t>(d, "shared_experts", c.shared_experts);
  c.shared_expert_weight = get<float>(d, "shared_expert_weight", c.shared_expert_weight);
  validate(c);
  return c;
}

nb::dict config_to(const MoEConfig& c) {
  nb::dict d;
  d["num_experts"] = c.num_experts;
  d["hidden_size"] = c.hidden_size;
  d["intermediate_size"] = c.intermediate_size;
  d["top_k"] = c.routing.top_k;
  d["routing"] = std::string(to_string(c.routing.method));
  d["n_group"] = c.routing.n_group;
  d["topk_group"] = c.routing.topk_group;
  d["routed_scaling_factor"] = c.routing.routed_scaling_factor;
  d["weight_placement"] = std::string(to_string(c.routing.weight_placement));
  d["activation"] = std::string(to_string(c.activation));
  d["quant"] = std::string(to_string(c.quant.scheme));
  d["scale_format"] = std::string(to_string(c.quant.scale_format));
  d["accumulation"] = std::string(to_string(c.quant.accumulation));
  d["swiglu_alpha"] = c.swiglu_alpha;
  d["swiglu_limit"] = c.swiglu_limit;
  d["batch_invariant"] = c.batch_invariant;
  d["experts_path"] = std::string(to_string(c.experts_path));
  d["ep_size"] = c.ep_size;
  d["ep_rank"] = c.ep_rank;
  d["shared_experts"] = c.shared_experts;
  d["shared_expert_weight"] = c.shared_expert_weight;
  return d;
}

// ---- the layer ---------------------------------------------------------------------------

Workspace aligned(nb::handle a) {
  const TensorView v = view_of(a, "workspace");
  const auto p = reinterpret_cast<std::uintptr_t>(v.data);
  const std::uintptr_t q = (p + 255) / 256 * 256;
  const std::size_t skip = q - p;
  return {reinterpret_cast<void*>(q), v.nbytes() > skip ? v.nbytes() - skip : 0};
}

class PyLayer {
 public:
  PyLayer(const nb::dict& config, const nb::dict& weights, const std::string& backend, std::int64_t max_tokens,
          std::uintptr_t stream) {
    static const char* names[] = {"w13", "w2", "w13_scale", "w2_scale", "e_score_correction_bias", "w13_input_scale",
                                  "w2_input_scale"};
    for (auto [key, value] : weights) {
      const std::string k = nb::cast<std::string>(key);
      bool ok = false;
      for (const char* name : names) ok = ok || k == name;
      require(ok, "weights: unknown tensor '" + k + "'");
    }
    auto tensor = [&](const char* name) {
      return weights.contains(name) ? optional_view(nb::object(weights[name]), name) : TensorView{};
    };
    Weights w{tensor("w13"), tensor("w2"), tensor("w13_scale"), tensor("w2_scale"), tensor("e_score_correction_bias"),
              tensor("w13_input_scale"), tensor("w2_input_scale")};
    if (weights.contains("w13")) view_of(nb::object(weights["w13"]), "w13", &device_);
    LayerOptions options;
    options.backend = backend;
    options.max_tokens = max_tokens;
    const MoEConfig c = config_from(config);
    nb::gil_scoped_release release;
    const DeviceScope scope(device_);
    prepared_ = std::make_unique<PreparedWeights>(c, w, options, as_stream(stream));
    layer_ = std::make_unique<Layer>(*prepared_, options);
  }

  std::size_t workspace_size(std::int64_t tokens) const { return layer_->workspace_size(tokens) + 256; }

  void fused(nb::handle hidden, nb::handle logits, nb::handle out, nb::handle ids, nb::handle weights,
             nb::handle workspace, std::uintptr_t stream) const {
    const FusedArgs args{view_of(hidden, "hidden"), view_of(logits, "router_logits"), view_of(out, "out"),
                         optional_view(ids, "topk_ids"), optional_view(weights, "topk_weights")};
    const Workspace ws = aligned(workspace);
    nb::gil_scoped_release release;
    const DeviceScope scope(device_);
    layer_->forward(args, ws, as_stream(stream));
  }

  void external(nb::handle hidden, nb::handle ids, nb::handle weights, nb::handle out, nb::handle workspace,
                std::uintptr_t stream) const {
    const ExternalArgs args{view_of(hidden, "hidden"), view_of(ids, "topk_ids"), view_of(weights, "topk_weights"),
                            view_of(out, "out")};
    const Workspace ws = aligned(workspace);
    nb::gil_scoped_release release;
    const DeviceScope scope(device_);
    layer_->forward(args, ws, as_stream(stream));
  }

  std::size_t masked_workspace_size(std::int64_t capacity) const { return layer_->masked_workspace_size(capacity) + 256; }

  void masked(nb::handle hidden, nb::handle hidden_scale, nb::handle counts, nb::handle out, std::int64_t expected_rows,
              nb::handle workspace, std::uintptr_t stream) const {
    MaskedArgs args{view_of(hidden, "hidden"), optional_view(hidden_scale, "hidden_scale"), view_of(counts, "counts"),
                    view_of(out, "out"), expected_rows};
    const Workspace ws = aligned(workspace);
    nb::gil_scoped_release release;
    const DeviceScope scope(device_);
    layer_->forward(args, ws, as_stream(stream));
  }

  const Layer& layer() const { return *layer_; }
  const PreparedWeights& prepared() const { return *prepared_; }

 private:
  int device_ = -1;
  std::unique_ptr<PreparedWeights> prepared_;
  std::unique_ptr<Layer> layer_;
};

// ---- host tensors handed to torch --------------------------------------------------------

// A moekit host tensor as a DLPack array that owns it (fp8 travels as uint8: the caller views it).
nb::object to_python(Tensor&& tensor) {
  if (!tensor.defined()) return nb::none();
  auto* owner = new Tensor(std::move(tensor));
  nb::capsule free_it(owner, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<std::size_t> shape(owner->shape().begin(), owner->shape().end());
  nb::dlpack::dtype dt;
  switch (owner->dtype()) {
    case DType::f32: dt = nb::dtype<float>(); break;
    case DType::i32: dt = nb::dtype<std::int32_t>(); break;
    case DType::i64: dt = nb::dtype<std::int64_t>(); break;
    case DType::bf16: dt = {std::uint8_t(nb::dlpack::dtype_code::Bfloat), 16, 1}; break;
    case DType::f16: dt = {std::uint8_t(nb::dlpack::dtype_code::Float), 16, 1}; break;
    case DType::fp8_e4m3:
    case DType::u8: dt = nb::dtype<std::uint8_t>(); break;
  }
  return nb::cast(nb::ndarray<nb::pytorch>(owner->view().data, shape.size(), shape.data(), free_it, nullptr, dt));
}

// The tuning cache a layer made now would read (docs/TUNE.md): the file and why, or why none. gpu, sms:
// look it up for that GPU instead of this process's (the CUDA runtime and version stay this build's).
std::string tuning_cache(const std::string& gpu, int sms) {
#ifdef MOEKIT_HAVE_CUDA
  io::TuningDevice here = cuda::this_device();
#else
  io::TuningDevice here{"none", 0, "none", std::string(version())};
#endif
  if (!gpu.empty()) {
    require(sms >= 1, "sms: expected the GPU's multiprocessor count (>= 1) with gpu, given " + std::to_string(sms));
    here.gpu = gpu;
    here.sms = sms;
  }
  return core::load_tuning({}, here).to_string();
}

nb::dict import_hf(const std::string& folder, int layer, int ep_size, int ep_rank, std::int64_t shared_experts) {
  io::CheckpointLayer l = [&] {
    nb::gil_scoped_release release;
    return io::import_hf_layer(folder, layer, {ep_size, ep_rank, shared_experts});
  }();
  nb::dict d;
  d["config"] = config_to(l.config);
  d["w13"] = to_python(std::move(l.w13));
  d["w2"] = to_python(std::move(l.w2));
  d["w13_scale"] = to_python(std::move(l.w13_scale));
  d["w2_scale"] = to_python(std::move(l.w2_scale));
  d["e_score_correction_bias"] = to_python(std::move(l.e_score_correction_bias));
  d["gate_weight"] = to_python(std::move(l.gate_weight));
  return d;
}

}  // namespace
}  // namespace moekit::python

NB_MODULE(_C, m) {
  using namespace moekit;
  using namespace moekit::python;
  nb::exception<Error>(m, "Error", PyExc_ValueError);

  m.def("version", [] { return std::string(version()); });
  m.def("cuda_available", &cuda_available);
  m.def("backend_names", &backend_names);
  m.def("presets", [] {
    nb::list out;
    for (const io::Preset& p : io::presets()) out.append(nb::make_tuple(p.name, config_to(p.config), p.note));
    return out;
  });
  m.def("check_config", [](const nb::dict& d) { return config_to(config_from(d)); }, "config"_a,
        "The config with every field filled in, after moekit's validation.");

  nb::class_<PyLayer>(m, "Layer")
      .def(nb::init<const nb::dict&, const nb::dict&, const std::string&, std::int64_t, std::uintptr_t>(), "config"_a,
           "weights"_a, "backend"_a, "max_tokens"_a, "stream"_a)
      .def("workspace_size", &PyLayer::workspace_size, "tokens"_a,
           "Bytes of workspace a call of up to `tokens` tokens takes (with room to align it).")
      .def("fused", &PyLayer::fused, "hidden"_a, "router_logits"_a, "out"_a, "topk_ids"_a.none(),
           "topk_weights"_a.none(), "workspace"_a, "stream"_a)
      .def("external", &PyLayer::external, "hidden"_a, "topk_ids"_a, "topk_weights"_a, "out"_a, "workspace"_a,
           "stream"_a)
      .def("masked_workspace_size", &PyLayer::masked_workspace_size, "capacity"_a,
           "Bytes of workspace a masked call of capacity C takes (with room to align it).")
      .def("masked", &PyLayer::masked, "hidden"_a, "hidden_scale"_a.none(), "counts"_a, "out"_a, "expected_rows"_a,
           "workspace"_a, "stream"_a)
      .def_prop_ro("backend", [](const PyLayer& l) { return std::string(l.layer().backend_name()); })
      .def_prop_ro("config", [](const PyLayer& l) { return config_to(l.layer().config()); })
      .def_prop_ro("owned_bytes", [](const PyLayer& l) { return l.prepared().owned_bytes(); })
      .def_prop_ro("selection", [](const PyLayer& l) { return l.layer().selection().to_string(); });

  m.def(
      "route",
      [](const nb::dict& config, nb::handle logits, nb::handle bias, nb::handle ids, nb::handle weights,
         std::uintptr_t stream) {
        const RoutingConfig r = routing_from(config);
        int device = -1;
        const RoutingInputs in{view_of(logits, "router_logits", &device), optional_view(bias, "bias")};
        const RoutingOutputs out{view_of(ids, "topk_ids"), view_of(weights, "topk_weights")};
        nb::gil_scoped_release release;
        const DeviceScope scope(device);
        route(r, in, out, as_stream(stream));
      },
      "config"_a, "router_logits"_a, "bias"_a.none(), "topk_ids"_a, "topk_weights"_a, "stream"_a);
  m.def(
      "quantize_weights",
      [](const std::string& quant, const std::string& scale_format, nb::handle w, nb::handle q, nb::handle scales) {
        require(scale_format == "f32" || scale_format == "ue8m0",
                "scale_format: expected f32|ue8m0, given '" + scale_format + "'");
        const QuantScheme scheme = parse_quant_scheme(quant);
        const TensorView wv = view_of(w, "w"), qv = view_of(q, "q"), sv = view_of(scales, "scales");
        nb::gil_scoped_release release;
        quantize_weights(scheme, scale_format == "ue8m0" ? ScaleFormat::ue8m0 : ScaleFormat::f32, wv, qv, sv);
      },
      "quant"_a, "scale_format"_a, "w"_a, "q"_a, "scales"_a);
  m.def("tuning_cache", &tuning_cache, "gpu"_a = "", "sms"_a = 0,
        "The tuning cache a layer made now would read: the file and why (e.g. the one shipped with moekit for "
        "this GPU), or why none (the heuristic decides). gpu, sms: for that GPU instead of this one.");
  m.def("import_hf_layer", &import_hf, "folder"_a, "layer"_a, "ep_size"_a, "ep_rank"_a, "shared_experts"_a);
}
