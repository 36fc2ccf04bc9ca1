#include "core/ep_plan.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "core/rows.h"
#include "core/validate.h"
#include "moekit/error.h"
#include "moekit/quant.h"

namespace moekit::core {
namespace {

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

}  // namespace

EpRecordLayout EpRecordLayout::of(const MoEConfig& c) {
  EpRecordLayout l;
  l.top_k = c.top_k();
  const QuantScheme scheme = c.quant.scheme;
  l.n_scales = scheme == QuantScheme::fp8_rowwise ? 1
               : scheme == QuantScheme::fp8_block ? ceil_div(c.hidden_size, kBlock)
                                                  : 0;
  l.value_bytes = std::size_t(c.hidden_size) * dtype_size(activation_dtype(scheme));
  l.weights = 0;
  l.ids = l.weights + sizeof(float) * std::size_t(l.top_k);
  l.scales = l.ids + sizeof(std::int32_t) * std::size_t(l.top_k);
  l.values = l.scales + sizeof(float) * std::size_t(l.n_scales);
  l.bytes = round_up(l.values + l.value_bytes, 16);
  return l;
}

std::int64_t EpSendPlan::rows_back_total() const {
  return std::accumulate(rows_back.begin(), rows_back.end(), std::int64_t(0));
}

std::vector<std::int64_t> exclusive_sum(std::span<const std::int64_t> counts) {
  std::vector<std::int64_t> offsets(counts.size());
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    offsets[i] = sum;
    sum += counts[i];
  }
  return offsets;
}

void plan_dispatch(const std::int32_t* ids, const float* weights, std::int64_t tokens, const MoEConfig& c,
                   std::int64_t capacity, EpCombine combine, EpSendPlan& plan) {
  const int ranks = c.ep_size, k = c.top_k();
  const auto ep = std::size_t(ranks);
  const bool fixed = capacity > 0;
  require(!fixed || tokens <= capacity, "tokens: expected at most the EP capacity " + std::to_string(capacity) +
                                            " per rank, given " + std::to_string(tokens));
  // The ids index the host arrays below (owner_of): on a GPU rank they come from the caller's
  // device memory unchecked until here (issue #19).
  check_topk_ids(TensorView::contiguous(const_cast<std::int32_t*>(ids), DType::i32, {tokens, std::int64_t(k)}),
                 c.num_experts);

  // The ranks each token goes to, once per rank, ascending.
  std::vector<std::uint8_t> goes(std::size_t(tokens) * ep, 0);
  plan.counts.assign(ep, 0);
  for (std::int64_t t = 0; t < tokens; ++t)
    for (int j = 0; j < k; ++j) {
      const std::int32_t e = ids[t * k + j];
      if (e < 0) continue;
      std::uint8_t& g = goes[std::size_t(t) * ep + std::size_t(owner_of(e, c))];
      if (!g) ++plan.counts[std::size_t(owner_of(e, c))];
      g = 1;
    }
  if (fixed) plan.counts.assign(ep, capacity);
  plan.capacity = capacity;
  plan.offsets = exclusive_sum(plan.counts);
  const std::int64_t records = std::accumulate(plan.counts.begin(), plan.counts.end(), std::int64_t(0));
  plan.token.assign(std::size_t(records), -1);
  plan.ids.assign(std::size_t(records * k), -1);
  plan.weights.assign(std::size_t(records * k), 0.0f);

  // position[t, d]: the record of token t in rank d's block (-1 when it does not go there).
  std::vector<std::int32_t> position(std::size_t(tokens) * ep, -1);
  std::vector<std::int64_t> cursor = plan.offsets;
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::size_t d = 0; d < ep; ++d) {
      if (!goes[std::size_t(t) * ep + d]) continue;
      const std::int64_t r = cursor[d]++;
      position[std::size_t(t) * ep + d] = std::int32_t(r);
      plan.token[std::size_t(r)] = std::int32_t(t);
      for (int j = 0; j < k; ++j) {
        const std::int32_t e = ids[t * k + j];
        if (e < 0 || std::size_t(owner_of(e, c)) != d) continue;
        plan.ids[std::size_t(r * k + j)] = e;
        plan.weights[std::size_t(r * k + j)] = weights[t * k + j];
      }
    }

  // Where the rows come back.
  plan.slot_rows.clear();
  plan.token_rows.clear();
  if (combine == EpCombine::exact) {
    // From rank d: its records in order, each record's owned slots ascending (fixed: every slot).
    plan.rows_back.assign(ep, 0);
    if (fixed) plan.rows_back.assign(ep, capacity * k);
    else
      for (std::int64_t s = 0; s < records * k; ++s)
        if (plan.ids[std::size_t(s)] >= 0) ++plan.rows_back[std::size_t(owner_of(plan.ids[std::size_t(s)], c))];
    plan.rows_back_offsets = exclusive_sum(plan.rows_back);
    plan.slot_rows.assign(std::size_t(tokens * k), -1);
    std::int64_t row = 0;
    for (std::size_t d = 0; d < ep; ++d) {
      if (fixed) row = plan.rows_back_offsets[d];
      for (std::int64_t r = plan.offsets[d]; r < plan.offsets[d] + plan.counts[d]; ++r) {
        const std::int32_t t = plan.token[std::size_t(r)];
        for (int j = 0; j < k; ++j) {
          const bool owned = plan.ids[std::size_t(r * k + j)] >= 0;
          if (owned) plan.slot_rows[std::size_t(t * k + j)] = std::int32_t(row);
          if (owned || fixed) ++row;
        }
      }
    }
  } else {
    // One row per record: from rank d, its block of records in order.
    plan.rows_back = plan.counts;
    plan.rows_back_offsets = plan.offsets;
    plan.token_rows = std::move(position);
  }
}

void plan_fixed_on_host(const EpPlanArgs& a) {
  MoEConfig c;
  c.num_experts = a.local_experts * a.ranks;
  c.routing.top_k = a.top_k;
  c.ep_size = a.ranks;
  EpSendPlan plan;
  plan_dispatch(a.topk_ids, a.topk_weights, a.tokens, c, a.capacity,
                a.slot_rows ? EpCombine::exact : EpCombine::partial, plan);
  std::copy(plan.token.begin(), plan.token.end(), a.token);
  std::copy(plan.ids.begin(), plan.ids.end(), a.ids);
  std::copy(plan.weights.begin(), plan.weights.end(), a.weights);
  if (a.slot_rows) std::copy(plan.slot_rows.begin(), plan.slot_rows.end(), a.slot_rows);
  if (a.token_rows) std::copy(plan.token_rows.begin(), plan.token_rows.end(), a.token_rows);
}

void plan_return(std::span<const std::int64_t> recv_counts, std::span<const std::int64_t> recv_offsets,
                 const std::int32_t* slot_rows, int k, bool fixed, EpReturnPlan& plan) {
  const std::size_t ep = recv_counts.size();
  plan.counts.assign(ep, 0);
  plan.rows.clear();
  for (std::size_t s = 0; s < ep; ++s) {
    for (std::int64_t i = recv_offsets[s]; i < recv_offsets[s] + recv_counts[s]; ++i)
      for (int j = 0; j < k; ++j) {
        const std::int32_t row = slot_rows[i * k + j];
        if (row < 0 && !fixed) continue;
        plan.rows.push_back(row);
        ++plan.counts[s];
      }
  }
  plan.offsets = exclusive_sum(plan.counts);
}

}  // namespace moekit::core
