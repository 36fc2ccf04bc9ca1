// The Hugging Face importer (src/io/checkpoint.h, hf_config.h) on a folder made from the input:
// the bytes before the first NUL are config.json, the rest model.safetensors (no NUL: no
// weights file). Layers 0 and 1 are imported, whole and as EP rank 1 of 2. Only
// moekit::Error may come out, and nothing may be allocated beyond what the files hold.
#include <cstring>
#include <string>

#include "fuzz_util.h"
#include "io/checkpoint.h"
#include "moekit/error.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  moekit::fuzz::single_thread();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace moekit;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  fuzz::write_file("config.json", input.substr(0, nul));
  if (nul == std::string_view::npos) fuzz::remove_file("model.safetensors");
  else fuzz::write_file("model.safetensors", input.substr(nul + 1));
  for (const int layer : {0, 1})
    // The last with DeepSeek's shared experts, where config.json has n_shared_experts 1.
    for (const io::ImportOptions options : {io::ImportOptions{1, 0}, io::ImportOptions{2, 1}, io::ImportOptions{2, 1, 1}}) {
      try {
        const io::CheckpointLayer imported = io::import_hf_layer(fuzz::scratch_dir(), layer, options);
        // What was imported is what validation accepts.
        validate(imported.config);
        if (imported.w13.nbytes() + imported.w2.nbytes() > size) __builtin_trap();
      } catch (const Error&) {
      }
    }
  return 0;
}
