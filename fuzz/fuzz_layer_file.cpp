// The layer-file reader (src/io/layer_file.h) on arbitrary bytes. A file it accepts must be
// usable as it promises: a CPU Layer builds from it, and a small one runs a forward pass on
// the file's inputs (fused or external routing) without a crash. Only moekit::Error may come out.
#include <cstring>

#include "fuzz_util.h"
#include "io/layer_file.h"
#include "moekit/error.h"
#include "moekit/moekit.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  moekit::fuzz::single_thread();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace moekit;
  const std::string path = fuzz::write_file("input.safetensors", {reinterpret_cast<const char*>(data), size});
  try {
    const io::LayerFile f = io::read_layer_file(path);
    LayerOptions options;
    options.backend = "cpu";
    if (f.config.ep_size != 1) options.ep.scope = EpScope::this_rank;
    Layer layer(f.config, f.weights(), options);
    const std::int64_t tokens = f.hidden.size(0);
    // The forward pass costs T k (2 I H + I H): bounded so that runs stay fast.
    if (tokens * f.config.top_k() * f.config.intermediate_size * f.config.hidden_size > (std::int64_t(1) << 22)) return 0;
    Tensor out(DType::bf16, {tokens, f.config.hidden_size});
    Tensor ids(DType::i32, {tokens, f.config.top_k()}), weights(DType::f32, {tokens, f.config.top_k()});
    if (f.router_logits.defined() && f.config.routing.method != RoutingMethod::external)
      layer.forward(FusedArgs{f.hidden.view(), f.router_logits.view(), out.view(), ids.view(), weights.view()});
    if (f.topk_ids.defined())
      layer.forward(ExternalArgs{f.hidden.view(), f.topk_ids.view(), f.topk_weights.view(), out.view()});
  } catch (const Error&) {
  }
  return 0;
}
