// The safetensors reader (src/io/safetensors.h) on arbitrary bytes: the header is validated
// up front; every tensor it accepts is then read whole. Only moekit::Error may come out.
#include <cstring>

#include "fuzz_util.h"
#include "io/safetensors.h"
#include "moekit/error.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  moekit::fuzz::single_thread();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace moekit;
  const std::string path = fuzz::write_file("input.safetensors", {reinterpret_cast<const char*>(data), size});
  try {
    const io::SafetensorsReader reader(path);
    for (const std::string& name : reader.names()) {
      const io::TensorInfo& info = reader.info(name);
      // The reader's promise: a tensor it lists lies inside the file.
      if (info.end < info.begin || info.end > size) __builtin_trap();
      try {
        const Tensor t = reader.read(name);  // rank > 4 is an Error
        if (t.nbytes() != info.end - info.begin) __builtin_trap();
      } catch (const Error&) {
      }
    }
    for (const auto& [key, value] : reader.metadata()) (void)key.size(), (void)value.size();
  } catch (const Error&) {
  }
  return 0;
}
