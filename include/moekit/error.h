// Errors and capability answers.
#pragma once

#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace moekit {

// Thrown by every public entry point on invalid input. The message names the argument,
// what was expected and what was given. Nothing has been written when it is thrown.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// The answer of a capability check: yes, or no with the reason.
class Status {
 public:
  static Status ok() { return Status(); }
  static Status no(std::string reason) { return Status(std::move(reason)); }

  bool is_ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const std::string& reason() const { return reason_; }

 private:
  Status() = default;
  explicit Status(std::string reason) : ok_(false), reason_(std::move(reason)) {}
  bool ok_ = true;
  std::string reason_;
};

// Throws Error(message) unless condition holds.
inline void require(bool condition, const std::string& message) {
  if (!condition) throw Error(message);
}
// The same with a literal: no std::string is made unless the condition fails.
inline void require(bool condition, const char* message) {
  if (!condition) throw Error(message);
}
// The same with the message made by message() only when the condition fails: for the checks of every
// call, where making each message (a few allocations, numbers formatted) would cost more host time
// than the call's own work.
template <class Message, class = std::enable_if_t<std::is_invocable_r_v<std::string, Message&>>>
void require(bool condition, Message&& message) {
  if (!condition) throw Error(message());
}

}  // namespace moekit
