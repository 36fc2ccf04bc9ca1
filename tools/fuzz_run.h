// `moekit fuzz`: one case run on the target backend and judged.
//   valid:   the layer's output against the CPU pipeline reference and the ideal one under
//            DESIGN §8's rule (core/check.h), no NaN/Inf the reference lacks, the routing
//            (fused, f32 logits) equal to the CPU router's, a second call bit-identical, and on
//            the CPU backend the pipeline reference's bits;
//   invalid: refused with a moekit::Error whose message starts with the broken argument's name,
//            the same message on the CPU backend, and nothing written to the output.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/check.h"
#include "fuzz_case.h"

namespace moekit::cli::fuzz {

struct Outcome {
  std::vector<std::string> failed;  // the names of the failed checks: "global", "ids", "refusal", ...
  std::string details;              // the check's figures, or the refusal's message, and what failed
  std::optional<core::CheckResult> check;  // valid cases that got as far as the check

  bool pass() const { return failed.empty(); }
  void fail(const std::string& what, const std::string& why);
};

Outcome run_case(const Case& c, const Target& target);

}  // namespace moekit::cli::fuzz
