// Shared experts fused as routed ones (MoEConfig::shared_experts; SGLang's form). After routing,
// each token's routing gets the S shared experts appended, slots k..k+S-1 with the weight
// shared_expert_weight, and the stages after routing (Prepare, Experts, Finalize, the EP
// pipeline) run the plain problem experts_config() describes, knowing nothing of shared experts:
//   - every rank holds E_local + S experts (its routed ones, then the shared ones: the weights'
//     layout), so their expert space has ep_size (E_local + S) ids, rank r owning
//     [r (E_local + S), (r + 1)(E_local + S));
//   - a routed id g, owned by rank g / E_local, becomes g + (g / E_local) S; rank r's shared expert
//     s is r (E_local + S) + E_local + s: the EP dispatch keeps it on the token's own rank, where
//     the replicated weights are (it is never sent);
//   - an id outside [-1, E) becomes -1, "no expert" (what the GPU stages make of it anyway; the
//     CPU backend refuses it before, naming topk_ids).
// With ep_size 1 the routed ids keep their values and shared expert s is E + s.
#pragma once

#include <cstdint>

#include "moekit/config.h"
#include "moekit/layer.h"

namespace moekit::core {

// The problem of the stages after routing: num_experts ep_size (E_local + S), top_k k + S, no
// shared experts, routing external (done). The config itself when it has no shared experts.
MoEConfig experts_config(const MoEConfig& config);

// The global expert whose weights local slot x (of weight_experts()) holds: a routed one,
// first_local_expert() + x, or shared expert s as E + s (what synthetic weights are drawn from).
std::int64_t weight_owner(const MoEConfig& config, std::int64_t x);

// The appended routing on the host (the CPU backend's stage): out [T, k + S] from [T, k].
void append_shared(const MoEConfig& config, std::int64_t tokens, const std::int32_t* topk_ids,
                   const float* topk_weights, std::int32_t* out_ids, float* out_weights);

// A shared-expert layer as the two plain layers it fuses, views of its weights (nothing copied):
// the routed experts (config without shared experts) and the shared ones alone (S experts, k = S,
// external routing: every token to all of them, with shared_expert_weight). For timing the two
// apart (moekit bench) and for the tests' reference.
struct SharedParts {
  MoEConfig routed, shared;
  Weights routed_weights, shared_weights;
};
SharedParts split_shared(const MoEConfig& config, const Weights& weights);

}  // namespace moekit::core
