#include "moekit/tensor.h"

#include <cmath>
#include <new>
#include <sstream>

#include "moekit/error.h"

namespace moekit {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::fp8_e4m3: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::fp8_e4m3: return "fp8_e4m3";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "?";
}

std::string_view to_string(Device device) { return device == Device::cpu ? "cpu" : "cuda"; }

float f16_to_float(std::uint16_t bits) {
  const int sign = (bits >> 15) & 1;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  float value;
  if (exponent == 0) {
    value = std::ldexp(float(mantissa), -24);
  } else if (exponent == 31) {
    value = mantissa ? std::nanf("") : INFINITY;
  } else {
    value = std::ldexp(float(mantissa | 0x400), exponent - 25);
  }
  return sign ? -value : value;
}

namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what) {
  require(a >= 0 && b >= 0, [&] {
    return std::string(what) + ": a size is negative (" + std::to_string(a) + " x " + std::to_string(b) + ")";
  });
  std::int64_t product = 0;
  require(!__builtin_mul_overflow(a, b, &product), [&] {
    return std::string(what) + ": size " + std::to_string(a) + " x " + std::to_string(b) + " overflows int64";
  });
  return product;
}

namespace {

// checked_numel and checked_nbytes over dims[0, n): the layer carves its buffers through
// TensorView::contiguous at every call, so the messages are made only on failure.
std::int64_t numel_of(const std::int64_t* dims, std::size_t n, std::string_view what) {
  auto shape = [&] { return shape_text(std::vector<std::int64_t>(dims, dims + n)); };
  for (std::size_t i = 0; i < n; ++i)
    require(dims[i] >= 0, [&] { return std::string(what) + ": shape " + shape() + " has a negative dimension"; });
  // A zero dimension makes the tensor empty whatever the others are.
  for (std::size_t i = 0; i < n; ++i)
    if (dims[i] == 0) return 0;
  std::int64_t count = 1;
  for (std::size_t i = 0; i < n; ++i)
    require(!__builtin_mul_overflow(count, dims[i], &count),
            [&] { return std::string(what) + ": shape " + shape() + " has more elements than int64 holds"; });
  return count;
}

std::size_t nbytes_of(DType dtype, const std::int64_t* dims, std::size_t n, std::string_view what) {
  std::int64_t bytes = 0;
  require(!__builtin_mul_overflow(numel_of(dims, n, what), std::int64_t(dtype_size(dtype)), &bytes), [&] {
    return std::string(what) + ": shape " + shape_text(std::vector<std::int64_t>(dims, dims + n)) + " " +
           std::string(to_string(dtype)) + " has more bytes than int64 holds";
  });
  return std::size_t(bytes);
}

TensorView contiguous_of(void* data, DType dtype, const std::int64_t* dims, std::size_t n, Device device) {
  require(n <= std::size_t(kMaxRank), [&] {
    return "tensor rank: expected at most " + std::to_string(kMaxRank) + ", given " + std::to_string(n);
  });
  nbytes_of(dtype, dims, n, "tensor shape");  // every product below (strides, numel, nbytes) fits
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.rank = int(n);
  std::int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.shape[std::size_t(d)] = dims[d];
    v.strides[std::size_t(d)] = stride;
    stride *= dims[d];
  }
  return v;
}

}  // namespace

std::int64_t checked_numel(const std::vector<std::int64_t>& shape, std::string_view what) {
  return numel_of(shape.data(), shape.size(), what);
}

std::size_t checked_nbytes(DType dtype, const std::vector<std::int64_t>& shape, std::string_view what) {
  return nbytes_of(dtype, shape.data(), shape.size(), what);
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                                  Device device) {
  return contiguous_of(data, dtype, shape.begin(), shape.size(), device);
}

TensorView TensorView::contiguous(void* data, DType dtype, const std::vector<std::int64_t>& shape,
                                  Device device) {
  return contiguous_of(data, dtype, shape.data(), shape.size(), device);
}

std::int64_t TensorView::numel() const {
  if (rank < 0) return 0;
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[std::size_t(d)];
  return n;
}

bool TensorView::is_contiguous() const {
  std::int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[std::size_t(d)] != 1 && strides[std::size_t(d)] != stride) return false;
    stride *= shape[std::size_t(d)];
  }
  return true;
}

std::vector<std::int64_t> TensorView::shape_vector() const {
  std::vector<std::int64_t> s;
  for (int d = 0; d < rank; ++d) s.push_back(shape[std::size_t(d)]);
  return s;
}

std::string TensorView::to_string() const {
  if (!defined()) return "absent";
  std::ostringstream os;
  os << '[';
  for (int d = 0; d < rank; ++d) os << (d ? ", " : "") << shape[std::size_t(d)];
  os << "] " << moekit::to_string(dtype) << ' ' << moekit::to_string(device);
  return os.str();
}

Tensor::Tensor(DType dtype, std::vector<std::int64_t> shape, std::string_view name) : shape_(std::move(shape)) {
  const std::string what = name.empty() ? "tensor " + shape_text(shape_) : std::string(name);
  const std::size_t bytes = checked_nbytes(dtype, shape_, what);
  view_ = TensorView::contiguous(nullptr, dtype, shape_);
  // At least one byte so that data() is never null for an empty tensor. nothrow: a failure is
  // an Error naming the tensor (and ASan, told allocator_may_return_null, returns null here too).
  storage_.reset(new (std::nothrow) std::byte[bytes > 0 ? bytes : 1]);
  require(storage_ != nullptr, what + ": cannot allocate " + std::to_string(bytes) + " bytes (" + shape_text(shape_) +
                                   " " + std::string(to_string(dtype)) + ")");
  view_.data = storage_.get();
}

}  // namespace moekit
