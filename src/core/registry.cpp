#include <cstdlib>
#include <sstream>

#include "core/stages.h"
#include "moekit/backend.h"

namespace moekit {
namespace core {

const std::vector<const BackendImpl*>& registered_backends() {
#ifdef MOEKIT_HAVE_CUDA
  static const std::vector<const BackendImpl*> list{&cuda_backend(), &cpu_backend()};
#else
  static const std::vector<const BackendImpl*> list{&cpu_backend()};
#endif
  return list;
}

}  // namespace core

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const auto* b : core::registered_backends()) names.emplace_back(b->name());
  return names;
}

std::string BackendSelection::to_string() const {
  std::ostringstream os;
  os << "backend requested: " << requested << "\n";
  for (const auto& d : decisions) {
    os << "  " << d.backend << ": ";
    if (!d.status) os << "no (" << d.status.reason() << ")";
    else if (d.backend == chosen) os << "yes (chosen)";
    else os << "yes (not needed: an earlier backend was chosen)";
    os << "\n";
  }
  if (chosen.empty()) os << "  no backend can run this problem\n";
  return os.str();
}

BackendSelection explain_backends(const MoEConfig& config, std::string_view requested) {
  BackendSelection s;
  s.requested = std::string(requested);
  if (s.requested == "auto") {
    if (const char* env = std::getenv("MOEKIT_BACKEND"); env && *env) s.requested = env;
  }
  bool known = s.requested == "auto";
  for (const auto* b : core::registered_backends()) {
    if (s.requested != "auto" && b->name() != s.requested) {
      s.decisions.push_back({std::string(b->name()), Status::no("not the requested backend")});
      continue;
    }
    known = true;
    Status status = b->can_implement(config);
    if (status && s.chosen.empty()) s.chosen = std::string(b->name());
    s.decisions.push_back({std::string(b->name()), std::move(status)});
  }
  if (!known) {
    std::string names;
    for (const auto& n : backend_names()) names += (names.empty() ? "" : "|") + n;
    s.decisions.push_back({s.requested, Status::no("not a backend of this build (auto|" + names + ")")});
  }
  return s;
}

BackendSelection select_backend(const MoEConfig& config, std::string_view requested) {
  validate(config);
  BackendSelection s = explain_backends(config, requested);
  if (s.chosen.empty()) {
    std::string reasons;
    for (const auto& d : s.decisions)
      if (s.requested == "auto" || d.backend == s.requested)
        reasons += "; " + d.backend + ": " + d.status.reason();
    throw Error("backend: '" + s.requested + "' cannot run " + config.to_string() + reasons);
  }
  return s;
}

}  // namespace moekit
