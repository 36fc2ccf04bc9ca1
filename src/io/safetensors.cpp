#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string_view>
#include <utility>

#include "io/json.h"
#include "moekit/error.h"

namespace moekit::io {

// safetensors stores lengths and data little-endian; moekit hosts are x86-64 and aarch64.
static_assert(std::endian::native == std::endian::little, "moekit io assumes a little-endian host");

namespace {

struct DTypeSpelling {
  std::string_view name;
  std::uint64_t size;
  bool supported;  // one moekit reads; the others are only size-checked
  DType dtype;
};

constexpr std::array<DTypeSpelling, 15> kDTypes{{
    {"F32", 4, true, DType::f32},
    {"BF16", 2, true, DType::bf16},
    {"F16", 2, true, DType::f16},
    {"F8_E4M3", 1, true, DType::fp8_e4m3},
    {"I32", 4, true, DType::i32},
    {"I64", 8, true, DType::i64},
    {"U8", 1, true, DType::u8},
    {"F64", 8, false, DType::f32},
    {"I8", 1, false, DType::f32},
    {"I16", 2, false, DType::f32},
    {"U16", 2, false, DType::f32},
    {"U32", 4, false, DType::f32},
    {"U64", 8, false, DType::f32},
    {"BOOL", 1, false, DType::f32},
    {"F8_E5M2", 1, false, DType::f32},
}};

constexpr std::size_t kMaxHeaderRank = 16;
constexpr auto kInt64Max = std::numeric_limits<std::int64_t>::max();

std::string supported_dtype_list() {
  std::string s;
  for (const auto& d : kDTypes)
    if (d.supported) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Reads exactly `bytes` at `offset`, retrying short reads; false on end of file.
bool pread_exact(int fd, void* dst, std::size_t bytes, std::uint64_t offset, std::string& error) {
  auto* out = static_cast<char*>(dst);
  while (bytes > 0) {
    const std::size_t chunk = std::min<std::size_t>(bytes, std::size_t(1) << 30);
    const ssize_t got = ::pread(fd, out, chunk, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      error = std::strerror(errno);
      return false;
    }
    if (got == 0) {
      error = "unexpected end of file (truncated?)";
      return false;
    }
    out += got;
    bytes -= std::size_t(got);
    offset += std::uint64_t(got);
  }
  return true;
}

struct ParsedEntry {
  TensorInfo info;
  const DTypeSpelling* spelling = nullptr;
};

// One header member: {"dtype": ..., "shape": [...], "data_offsets": [begin, end]}.
ParsedEntry parse_entry(const std::string& where, const JsonValue& value, std::uint64_t data_size) {
  value.as_object(where);
  ParsedEntry entry;
  const JsonValue* dtype = value.get("dtype");
  require(dtype != nullptr, where + ": missing \"dtype\"");
  const std::string& dtype_name = dtype->as_string(where + ": dtype");
  for (const auto& d : kDTypes)
    if (d.name == dtype_name) entry.spelling = &d;
  require(entry.spelling != nullptr, where + ": unknown dtype '" + dtype_name + "'");
  entry.info.dtype = entry.spelling->dtype;

  const JsonValue* shape = value.get("shape");
  require(shape != nullptr, where + ": missing \"shape\"");
  const auto& dims = shape->as_array(where + ": shape");
  require(dims.size() <= kMaxHeaderRank, where + ": shape has " + std::to_string(dims.size()) +
                                             " dimensions, more than " + std::to_string(kMaxHeaderRank));
  for (std::size_t i = 0; i < dims.size(); ++i)
    entry.info.shape.push_back(dims[i].as_int(where + ": shape[" + std::to_string(i) + "]", 0, kInt64Max));
  const auto bytes = std::uint64_t(
      checked_mul(checked_numel(entry.info.shape, where), std::int64_t(entry.spelling->size), where + ": shape " +
                                                                     shape_string(entry.info.shape) + " " + dtype_name));

  const JsonValue* offsets = value.get("data_offsets");
  require(offsets != nullptr, where + ": missing \"data_offsets\"");
  const auto& pair = offsets->as_array(where + ": data_offsets");
  require(pair.size() == 2, where + ": data_offsets: expected [begin, end], given " +
                                std::to_string(pair.size()) + " values");
  entry.info.begin = std::uint64_t(pair[0].as_int(where + ": data_offsets[0]", 0, kInt64Max));
  entry.info.end = std::uint64_t(pair[1].as_int(where + ": data_offsets[1]", 0, kInt64Max));
  const std::string range = "[" + std::to_string(entry.info.begin) + ", " + std::to_string(entry.info.end) + "]";
  require(entry.info.end >= entry.info.begin, where + ": data_offsets " + range + " end before begin");
  require(entry.info.end <= data_size, where + ": data_offsets " + range +
                                           " extend past the data section (" + std::to_string(data_size) +
                                           " bytes; truncated file?)");
  require(entry.info.end - entry.info.begin == bytes,
          where + ": data_offsets " + range + " span " + std::to_string(entry.info.end - entry.info.begin) +
              " bytes, but shape " + shape_string(entry.info.shape) + " " + dtype_name + " needs " +
              std::to_string(bytes));
  return entry;
}

}  // namespace

std::string safetensors_dtype_name(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.supported && d.dtype == dtype) return std::string(d.name);
  throw Error("safetensors: no spelling for dtype " + std::string(to_string(dtype)));
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  require(fd_ >= 0, path + ": cannot open (" + std::strerror(errno) + ")");
  try {
    struct stat st {};
    require(::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode), path + ": not a regular file");
    const auto file_size = static_cast<std::uint64_t>(st.st_size);
    require(file_size >= 8, path + ": file is " + std::to_string(file_size) +
                                " bytes, too short for a safetensors file (8-byte header length first)");
    std::uint64_t header_size = 0;
    std::string error;
    require(pread_exact(fd_, &header_size, 8, 0, error), path + ": reading the header length: " + error);
    require(header_size <= kMaxSafetensorsHeader,
            path + ": header length " + std::to_string(header_size) + " exceeds the limit of " +
                std::to_string(kMaxSafetensorsHeader) + " bytes (corrupt file?)");
    require(header_size <= file_size - 8, path + ": header length " + std::to_string(header_size) +
                                              " exceeds the file size (" + std::to_string(file_size) +
                                              " bytes; truncated or not a safetensors file?)");
    std::string header(header_size, '\0');
    require(pread_exact(fd_, header.data(), header.size(), 8, error), path + ": reading the header: " + error);
    data_start_ = 8 + header_size;
    const std::uint64_t data_size = file_size - data_start_;

    const JsonValue root = parse_json(header, path + ": header");
    // Every tensor's byte range, unsupported dtypes included (their bytes are still someone's).
    std::vector<std::pair<std::pair<std::uint64_t, std::uint64_t>, std::string>> ranges;
    for (const auto& [name, value] : root.as_object(path + ": header")) {
      if (name == "__metadata__") {
        for (const auto& [key, text] : value.as_object(path + ": __metadata__"))
          metadata_[key] = text.as_string(path + ": __metadata__ '" + key + "'");
        continue;
      }
      ParsedEntry entry = parse_entry(path + ": tensor '" + name + "'", value, data_size);
      entry.info.name = name;
      if (entry.info.end > entry.info.begin) ranges.push_back({{entry.info.begin, entry.info.end}, name});
      if (entry.spelling->supported) tensors_.emplace(name, std::move(entry.info));
      else unsupported_.emplace(name, std::string(entry.spelling->name));
    }
    // Sorted by begin, each non-empty range must start at or after the previous one's end.
    std::sort(ranges.begin(), ranges.end());
    for (std::size_t i = 1; i < ranges.size(); ++i) {
      require(ranges[i].first.first >= ranges[i - 1].first.second,
              path + ": tensors '" + ranges[i - 1].second + "' and '" + ranges[i].second +
                  "' overlap in the data section");
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      data_start_(other.data_start_),
      metadata_(std::move(other.metadata_)),
      tensors_(std::move(other.tensors_)),
      unsupported_(std::move(other.unsupported_)) {}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    data_start_ = other.data_start_;
    metadata_ = std::move(other.metadata_);
    tensors_ = std::move(other.tensors_);
    unsupported_ = std::move(other.unsupported_);
  }
  return *this;
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& entry : tensors_) out.push_back(entry.first);
  return out;
}

bool SafetensorsReader::contains(const std::string& name) const { return tensors_.count(name) != 0; }

const TensorInfo& SafetensorsReader::info(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it != tensors_.end()) return it->second;
  const auto unsupported = unsupported_.find(name);
  if (unsupported != unsupported_.end())
    throw Error(path_ + ": tensor '" + name + "' has dtype " + unsupported->second +
                ", which moekit does not read (supported: " + supported_dtype_list() + ")");
  throw Error(path_ + ": no tensor named '" + name + "'");
}

Tensor SafetensorsReader::read(const std::string& name) const {
  const TensorInfo& t = info(name);
  require(t.shape.size() <= std::size_t(kMaxRank),
          path_ + ": tensor '" + name + "' has rank " + std::to_string(t.shape.size()) +
              ", more than moekit tensors hold (" + std::to_string(kMaxRank) + ")");
  Tensor out(t.dtype, t.shape);
  read_into(name, out.view().data, out.nbytes());
  return out;
}

void SafetensorsReader::read_into(const std::string& name, void* dst, std::size_t bytes) const {
  const TensorInfo& t = info(name);
  const std::uint64_t size = t.end - t.begin;
  require(bytes == size, path_ + ": tensor '" + name + "': destination holds " + std::to_string(bytes) +
                             " bytes, the tensor has " + std::to_string(size));
  std::string error;
  require(pread_exact(fd_, dst, bytes, data_start_ + t.begin, error),
          path_ + ": reading tensor '" + name + "': " + error);
}

namespace {

using File = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

std::string header_json(const std::vector<NamedTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      json += (first ? "" : ",") + json_quote(key) + ":" + json_quote(value);
      first = false;
    }
    json += "}";
  }
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (json.size() > 1) json += ",";
    json += json_quote(t.name) + ":{\"dtype\":\"" + safetensors_dtype_name(t.view.dtype) + "\",\"shape\":" +
            shape_string(t.view.shape_vector()) + ",\"data_offsets\":[" + std::to_string(offset) + "," +
            std::to_string(offset + t.view.nbytes()) + "]}";
    offset += t.view.nbytes();
  }
  json += "}";
  // Pad with spaces so the data section starts 8-byte aligned (8 + header is a multiple of 8).
  json.append((8 - json.size() % 8) % 8, ' ');
  return json;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    const std::string where = path + ": tensor '" + t.name + "'";
    require(!t.name.empty(), path + ": a tensor has an empty name");
    require(t.name != "__metadata__", where + ": the name is reserved for the metadata");
    require(seen.insert(t.name).second, where + ": the name appears twice");
    require(t.view.defined(), where + ": the view is absent");
    require(t.view.device == Device::cpu, where + ": expected a host (cpu) tensor, given " + t.view.to_string());
    require(t.view.is_contiguous(), where + ": expected a contiguous view, given strides that are not row-major");
    require(t.view.data != nullptr || t.view.nbytes() == 0, where + ": the view has no data");
  }
  const std::string header = header_json(tensors, metadata);

  // Write beside the destination and rename, so a failure never leaves a partial `path`.
  const std::string tmp = path + ".tmp";
  File file(std::fopen(tmp.c_str(), "wb"), &std::fclose);
  require(file != nullptr, tmp + ": cannot create (" + std::strerror(errno) + ")");
  auto write = [&](const void* data, std::size_t bytes) {
    return bytes == 0 || std::fwrite(data, 1, bytes, file.get()) == bytes;
  };
  const std::uint64_t header_size = header.size();
  bool ok = write(&header_size, 8) && write(header.data(), header.size());
  for (std::size_t i = 0; ok && i < tensors.size(); ++i) ok = write(tensors[i].view.data, tensors[i].view.nbytes());
  ok = ok && std::fflush(file.get()) == 0;
  const int saved_errno = errno;
  ok = std::fclose(file.release()) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    throw Error(path + ": write failed (" + std::strerror(saved_errno) + ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rename_errno = errno;
    std::remove(tmp.c_str());
    throw Error(path + ": cannot rename " + tmp + " into place (" + std::strerror(rename_errno) + ")");
  }
}

}  // namespace moekit::io
