// EP combine on the CPU: the rows an exact combine returns, and the partial combine's sum.
#pragma once

#include "core/ep_stages.h"

namespace moekit::cpu {

// out[i] = expert_out[rows[i]], a row of zeros for -1.
void gather_expert_rows(const core::EpGatherArgs& args);

// out[t] = bf16(sum of token t's rows in rank order, -1 skipped), f32 sums: the partial sums
// of the ranks.
void sum_token_rows(const core::EpSumArgs& args);

}  // namespace moekit::cpu
