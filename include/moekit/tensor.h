// Non-owning tensor views, an owning host tensor, and the scalar types moekit uses.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moekit {

enum class DType : std::uint8_t { f32, f16, bf16, fp8_e4m3, i32, i64, u8 };
enum class Device : std::uint8_t { cpu, cuda };

std::size_t dtype_size(DType dtype);
std::string_view to_string(DType dtype);
std::string_view to_string(Device device);

// bf16 as raw bits; conversions round to nearest even and keep NaN a NaN.
struct bf16 {
  std::uint16_t bits;
};

inline float bf16_to_float(bf16 v) {
  std::uint32_t u = std::uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline bf16 float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{std::uint16_t((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{std::uint16_t(u >> 16)};
}

// Rounds a float to the nearest bf16 value, returned as a float.
inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// f16 bits to float (used when reading checkpoints that store F16).
float f16_to_float(std::uint16_t bits);

inline constexpr int kMaxRank = 4;

// Sizes that come from files, flags or callers are multiplied only through these: a product
// that does not fit in int64 (bytes: in int64 too) is an Error naming `what`, never a wrapped
// size. Every factor must be >= 0; a zero anywhere makes the product 0.
std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what);
std::int64_t checked_numel(const std::vector<std::int64_t>& shape, std::string_view what);
std::size_t checked_nbytes(DType dtype, const std::vector<std::int64_t>& shape, std::string_view what);

// A view of memory someone else owns: dtype, shape, strides (in elements), device.
// A default-constructed view is "absent" (defined() is false).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int rank = -1;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> strides{};
  Device device = Device::cpu;

  // A row-major contiguous view.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               Device device = Device::cpu);
  static TensorView contiguous(void* data, DType dtype, const std::vector<std::int64_t>& shape,
                               Device device = Device::cpu);

  bool defined() const { return rank >= 0; }
  std::int64_t size(int dim) const { return shape[static_cast<std::size_t>(dim)]; }
  std::int64_t numel() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;
  std::vector<std::int64_t> shape_vector() const;
  // "[4, 128] bf16 cpu"
  std::string to_string() const;

  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

// An owning, contiguous, host tensor. Memory is left uninitialized on creation.
class Tensor {
 public:
  Tensor() = default;
  // Error (naming `name`, else the shape) when the size overflows or the memory is not there.
  Tensor(DType dtype, std::vector<std::int64_t> shape, std::string_view name = {});

  bool defined() const { return view_.defined(); }
  const TensorView& view() const { return view_; }
  DType dtype() const { return view_.dtype; }
  std::int64_t numel() const { return view_.numel(); }
  std::size_t nbytes() const { return view_.nbytes(); }
  std::int64_t size(int dim) const { return view_.size(dim); }
  const std::vector<std::int64_t>& shape() const { return shape_; }

  template <class T>
  T* ptr() const {
    return static_cast<T*>(view_.data);
  }

 private:
  std::unique_ptr<std::byte[]> storage_;
  std::vector<std::int64_t> shape_;
  TensorView view_;
};

}  // namespace moekit
