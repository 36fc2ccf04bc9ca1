#include <cstdlib>
#include <functional>
#include <sstream>

#include "core/shared.h"
#include "core/stages.h"
#include "moekit/backend.h"
#include "moekit/layer.h"

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

Status check_stages(const StageSet& stages, const StageProblem& p) {
  // A layer whose routing is external has no router to run.
  const bool routes = p.config.routing.method != RoutingMethod::external;
  const bool shares = p.config.shared_experts > 0;
  const Stage* const first[] = {routes ? stages.router.get() : nullptr, shares ? stages.shared.get() : nullptr};
  for (const Stage* s : first)
    if (Status status = s ? s->can_implement(p) : Status::ok(); !status) return status;
  StageProblem after = p;
  after.config = experts_config(p.config);
  const Stage* const rest[] = {stages.prepare.get(), stages.experts.get(), stages.finalize.get()};
  for (const Stage* s : rest)
    if (Status status = s->can_implement(after); !status) return status;
  return Status::ok();
}

Status can_run(const BackendImpl& backend, const MoEConfig& config, const Weights& weights, std::int64_t max_tokens) {
  if (Status s = backend.can_implement(config); !s) return s;
  const Device memory = weights.w13.defined() ? weights.w13.device : Device::cpu;
  if (memory != Device::cpu && memory != backend.device())
    return Status::no("the weights are in " + std::string(to_string(memory)) + " memory, which it does not read");
  const MoEConfig stages_config = experts_config(config);
  const StageSet stages = backend.make_stages(
      stages_config, backend.prepare(stages_config, weights, Preparation::layout_only, nullptr), nullptr);
  for (const std::int64_t tokens : {std::int64_t(1), max_tokens}) {
    if (tokens < 1) continue;
    const Status s = check_stages(stages, {config, tokens, nullptr, nullptr});
    if (!s) return Status::no(s.reason() + " (at T=" + std::to_string(tokens) + ")");
  }
  return Status::ok();
}

}  // namespace core

namespace {

// Walks the priority list; `check` answers for each backend that is not ruled out by name.
BackendSelection walk(std::string_view requested, const std::function<Status(const core::BackendImpl&)>& check) {
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
    Status status = check(*b);
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

BackendSelection chosen_or_error(BackendSelection s, const MoEConfig& config) {
  if (s.chosen.empty()) {
    std::string reasons;
    for (const auto& d : s.decisions)
      if (s.requested == "auto" || d.backend == s.requested) reasons += "; " + d.backend + ": " + d.status.reason();
    throw Error("backend: '" + s.requested + "' cannot run " + config.to_string() + reasons);
  }
  return s;
}

}  // namespace

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
  return walk(requested, [&](const core::BackendImpl& b) { return b.can_implement(config); });
}

BackendSelection explain_backends(const MoEConfig& config, const Weights& weights, std::int64_t max_tokens,
                                  std::string_view requested) {
  return walk(requested, [&](const core::BackendImpl& b) { return core::can_run(b, config, weights, max_tokens); });
}

BackendSelection select_backend(const MoEConfig& config, std::string_view requested) {
  validate(config);
  return chosen_or_error(explain_backends(config, requested), config);
}

BackendSelection select_backend(const MoEConfig& config, const Weights& weights, std::int64_t max_tokens,
                                std::string_view requested) {
  validate(config);
  return chosen_or_error(explain_backends(config, weights, max_tokens, requested), config);
}

}  // namespace moekit
