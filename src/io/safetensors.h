// safetensors files: an 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the data section. The reader validates the
// whole header up front and then reads only the tensors asked for (checkpoint shards are
// many GB), so a malformed file fails with an Error and never with a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "moekit/tensor.h"

namespace moekit::io {

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets within the data section
};

// The largest header the reader accepts; real headers are at most a few MB.
inline constexpr std::uint64_t kMaxSafetensorsHeader = 100u << 20;

class SafetensorsReader {
 public:
  // Parses and validates the header; throws moekit::Error naming the file and the problem.
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&& other) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& other) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }  // __metadata__
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // Error naming the tensor if absent
  Tensor read(const std::string& name) const;              // the whole tensor into host memory
  // bytes must equal the tensor's size. Safe to call from several threads at once.
  void read_into(const std::string& name, void* dst, std::size_t bytes) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t data_start_ = 0;  // file offset of the data section
  std::map<std::string, std::string> metadata_;
  std::map<std::string, TensorInfo> tensors_;
  // Tensors whose dtype is valid safetensors but not one moekit reads (F64, BOOL, ...):
  // name -> dtype, so info() can say why instead of "absent".
  std::map<std::string, std::string> unsupported_;
};

struct NamedTensor {
  std::string name;
  TensorView view;
};

// Writes tensors (contiguous host views) in the given order. The file appears under `path`
// only when complete: it is written to path + ".tmp" and renamed.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

// The safetensors spelling of a dtype ("F32", "BF16", "F8_E4M3", ...).
std::string safetensors_dtype_name(DType dtype);

}  // namespace moekit::io
