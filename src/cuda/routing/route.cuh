// Routing kernel: one warp per token.
//   1. load the token's logits as f32 (each lane holds the experts of its columns)
//   2. scores per method (softmax sums in expert order, as the CPU does: one lane-serial pass
//      over shared memory), written to shared memory as the weight source; exponentials in
//      double from a 2^(j/256) table each block stages in shared memory (with the bias)
//   3. selection keys: (score, expert) ordered high first, NaN below numbers, ties to the lower
//      expert; sigmoid_bias_grouped first keeps the best groups (and packs their keys into
//      fewer registers per lane where they fit)
//   4. k rounds of warp argmax: with four keys per lane, sorted once and one redux.sync plus a
//      ballot a round where experts go up with lanes; otherwise two redux.sync a round
//   5. weights from the selected scores (renormalized in slot order), times the scaling factor
// Every sum runs in the CPU's order; products feeding sums are rounded separately (no FMA).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/vec.cuh"
#include "cuda/routing/route_math.cuh"
#include "moekit/config.h"

namespace moekit::cuda::routing {

struct KernelParams {
  const void* logits;    // [T, E]
  const void* bias;      // [E] or null
  std::int32_t* ids;     // [T, k]
  float* weights;        // [T, k]
  int tokens;
  int experts;
  int top_k;
  int n_group;
  int group_size;        // experts / n_group (sigmoid_bias_grouped), made once on the host
  int topk_group;
  float scaling;         // routed_scaling_factor
  RoutingMethod method;
  bool bias_bf16;
  int warp_floats;       // shared floats per warp
  int bias_floats;       // shared floats for the bias (0 without one)
};

// What a kernel scores the logits with, fixed at compile time so that each kernel holds one
// method family's code (at decode sizes its time is fetching that code: docs/perf-log/decode.md,
// twenty-second session):
// softmax_topk[_renorm] | sigmoid_topk[_renorm], sigmoid_bias_renorm | sigmoid_bias_grouped |
// the logits themselves (topk_softmax, top1_sigmoid).
enum class Scoring { softmax, sigmoid, grouped, logits };

// ---- logits loads -----------------------------------------------------------------------

template <typename T, int W>
__device__ __forceinline__ void load_logits(const T* p, float (&out)[W]) {
  if constexpr (sizeof(T) == 4) {
    if constexpr (W == 4) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(p));
      out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
    } else if constexpr (W == 2) {
      const float2 v = __ldg(reinterpret_cast<const float2*>(p));
      out[0] = v.x, out[1] = v.y;
    } else {
      static_assert(W == 1, "f32 logits load 1, 2 or 4 at a time");
      out[0] = __ldg(reinterpret_cast<const float*>(p));
    }
  } else {
    if constexpr (W == 8) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
      float f[8];
      unpack_bf16x8(v, f);
#pragma unroll
      for (int i = 0; i < 8; ++i) out[i] = f[i];
    } else if constexpr (W == 4) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
      out[0] = __uint_as_float(v.x << 16), out[1] = __uint_as_float(v.x & 0xffff0000u);
      out[2] = __uint_as_float(v.y << 16), out[3] = __uint_as_float(v.y & 0xffff0000u);
    } else {
      static_assert(W == 1, "bf16 logits load 1, 4 or 8 at a time");
      out[0] = bf16_to_f32(__ldg(reinterpret_cast<const unsigned short*>(p)));
    }
  }
}

// ---- group scores held by lane segments ---------------------------------------------------
// A group scores the sum of its two best choice values: values, not experts, so the two best
// keys (a multiset: equal keys may both count) are all it needs.

__device__ __forceinline__ void offer(std::uint32_t& best, std::uint32_t& second, std::uint32_t x) {
  second = max(second, min(best, x));
  best = max(best, x);
}

// Merges the two best of `width` consecutive lanes (a power of two); every lane gets them.
__device__ __forceinline__ void segment_top2(std::uint32_t& best, std::uint32_t& second, int width) {
  for (int offset = width / 2; offset > 0; offset /= 2) {
    const std::uint32_t b = __shfl_xor_sync(kFullMask, best, offset), s = __shfl_xor_sync(kFullMask, second, offset);
    offer(best, second, b);
    offer(best, second, s);
  }
}

// ---- where a lane's scores live -------------------------------------------------------

// Puts (key[j], expert[j]) after (key[i], expert[i]) unless it ranks higher: a larger key, or
// the same key and a lower expert.
__device__ __forceinline__ void order_pair(std::uint32_t (&key)[4], int (&expert)[4], int i, int j) {
  const bool swap = key[j] > key[i] || (key[j] == key[i] && expert[j] < expert[i]);
  const std::uint32_t ki = key[i];
  const int ei = expert[i];
  key[i] = swap ? key[j] : ki, key[j] = swap ? ki : key[j];
  expert[i] = swap ? expert[j] : ei, expert[j] = swap ? ei : expert[j];
}

// Whether a lane holds exactly four keys, known at compile time.
template <class Keys>
constexpr bool four_keys_per_lane() {
  if constexpr (Keys::kFixed) return Keys::count() == 4;
  return false;
}

// k rounds of warp argmax over `keys` (anything with count / k / expert / remove); slot j's
// expert goes to selected[j]. Four keys per lane are sorted once (a five-pair network), so a
// round reads each lane's head and only the winner moves its next key up; otherwise every
// round scans the lane's keys and the owner clears the winner's.

template <class Keys>
__device__ void select_experts(Keys& keys, int top_k, std::int32_t* selected, int lane) {
  if constexpr (four_keys_per_lane<Keys>()) {
    std::uint32_t key[4];
    int expert[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) key[i] = keys.k(i), expert[i] = keys.expert(i);
    order_pair(key, expert, 0, 1);
    order_pair(key, expert, 2, 3);
    order_pair(key, expert, 0, 2);
    order_pair(key, expert, 1, 3);
    order_pair(key, expert, 1, 2);
    for (int j = 0; j < top_k; ++j) {
      bool mine;
      if constexpr (Keys::kLaneMajor) {
        // Of the lanes whose head has the best key, the lowest holds the lowest expert: one
        // redux.sync and a ballot, no second reduction for the expert.
        const std::uint32_t best = __reduce_max_sync(kFullMask, key[0]);
        mine = lane == __ffs(__ballot_sync(kFullMask, key[0] == best)) - 1;
        if (mine) selected[j] = expert[0];
      } else {
        const int win = warp_argmax(key[0], expert[0]);
        mine = expert[0] == win;  // the winner's lane (or one whose keys are all spent: no harm)
        if (lane == 0) selected[j] = win;
      }
      if (mine) {
        key[0] = key[1], key[1] = key[2], key[2] = key[3], key[3] = 0;
        expert[0] = expert[1], expert[1] = expert[2], expert[2] = expert[3];
      }
    }
  } else {
    for (int j = 0; j < top_k; ++j) {
      std::uint32_t bk = 0;
      int be = 0;
#pragma unroll
      for (int i = 0; i < keys.count(); ++i)
        if (keys.k(i) > bk) bk = keys.k(i), be = keys.expert(i);
      const int win = warp_argmax(bk, be);
      keys.remove(win);  // the owner lane alone reads that key again
      if (lane == 0) selected[j] = win;
    }
  }
  __syncwarp();
}

// N keys per lane of consecutive experts first, first + 1, ...: the kept groups' candidates
// packed into fewer registers than the whole row's (sigmoid_bias_grouped).
template <int N>
struct PackedKeys {
  static constexpr bool kFixed = true;
  static constexpr bool kLaneMajor = true;  // every expert of lane l is below those of lane l + 1
  std::uint32_t key[N];
  int first;

  __device__ static constexpr int count() { return N; }
  __device__ int expert(int i) const { return first + i; }
  __device__ std::uint32_t& k(int i) { return key[i]; }
  __device__ void remove(int winner) {
    const int at = winner - first;
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (at == i) key[i] = 0;
  }
};

// V scores per lane in registers; element i of lane l is expert (i/W)*32W + l*W + i%W, so
// each load of W experts is one vector per lane. Experts past E are padding (key 0).
template <int V, int W>
struct RegisterScores {
  static_assert(V % W == 0, "whole vectors per lane");
  static constexpr int kWidth = W;  // consecutive experts per vector
  static constexpr bool kFixed = true;  // count() is known at compile time
  static constexpr bool kLaneMajor = V == W;  // one vector per lane: lane l holds experts lW .. lW + W - 1
  float value[V];
  std::uint32_t key[V];
  int lane;

  __device__ static constexpr int count() { return V; }
  __device__ int expert(int i) const { return (i / W) * 32 * W + lane * W + (i % W); }
  __device__ float& val(int i) { return value[i]; }
  __device__ std::uint32_t& k(int i) { return key[i]; }
  __device__ void remove(int winner) {
#pragma unroll
    for (int i = 0; i < V; ++i)
      if (expert(i) == winner) key[i] = 0;
  }

  // sigmoid_bias_grouped when every group is a run of whole vectors over lanes that form an
  // aligned power-of-two segment (DeepSeek-V3: 32 experts = 8 lanes x 4): group top-2 by
  // shuffles inside the segments, all groups at once, the topk_group best groups by warp
  // argmax, then the k rounds. The keys are the choice values' (sigmoid + bias). When the kept
  // groups fit in one vector per lane (DeepSeek-V3: 4 groups x 8 lanes), segment s takes the
  // s-th kept group's keys by shuffles and the rounds scan W keys instead of V; otherwise the
  // keys outside the kept groups are cleared. False (nothing selected) when the shape does not fit.
  __device__ bool select_in_best_groups(const KernelParams& p, std::int32_t* selected) {
    const int group_size = p.group_size;
    const int seg = group_size / W;  // lanes per group
    if (group_size % W != 0 || seg < 1 || seg > 32 || (seg & (seg - 1)) != 0 || p.n_group > 32) return false;
    const int seg_shift = __ffs(seg) - 1;  // lane / seg, without a division
    const int groups_per_chunk = 32 >> seg_shift;
    const int lane_group = lane >> seg_shift;
    std::uint32_t group_key[V / W];
#pragma unroll
    for (int c = 0; c < V / W; ++c) {
      std::uint32_t best = 0, second = 0;  // a group's entries are all experts (E = n_group x size)
#pragma unroll
      for (int j = 0; j < W; ++j) offer(best, second, key[c * W + j]);
      segment_top2(best, second, seg);
      float sum = __fadd_rn(0.0f, key_value(best));
      if (group_size >= 2) sum = __fadd_rn(sum, key_value(second));
      const int g = c * groups_per_chunk + lane_group;
      group_key[c] = (lane & (seg - 1)) == 0 && g < p.n_group ? rank_key(sum) : 0u;
    }
    // topk_group rounds: the best group score by one redux.sync; a ballot finds its lane (only
    // the segments' first lanes hold scores, one per chunk, and a lane's chunks go up in group
    // order). Equal best scores on several lanes take a second reduction for the lower group.
    std::uint32_t picked = 0;  // this lane's kept groups, as bits of the group mask
    for (int r = 0; r < p.topk_group; ++r) {
      std::uint32_t bk = 0;
      int bc = 0;
#pragma unroll
      for (int c = 0; c < V / W; ++c)
        if (group_key[c] > bk) bk = group_key[c], bc = c;
      const int bg = bc * groups_per_chunk + lane_group;
      const std::uint32_t best = __reduce_max_sync(kFullMask, bk);
      const unsigned tied = __ballot_sync(kFullMask, bk == best);
      bool mine = lane == __ffs(tied) - 1;
      if (__popc(tied) > 1) {  // warp-uniform: every lane takes part in the reduction
        const int win = warp_argmax(bk, bg);
        mine = bk == best && bg == win;
      }
      if (mine) {
        picked |= 1u << bg;
#pragma unroll
        for (int c = 0; c < V / W; ++c)
          if (c == bc) group_key[c] = 0;
      }
    }
    const std::uint32_t kept = __reduce_or_sync(kFullMask, picked);
    if (p.topk_group <= groups_per_chunk) {
      // The lane_group-th kept group (in group order): chunk g / groups_per_chunk of the lane at
      // the same place in segment g % groups_per_chunk.
      std::uint32_t rest = kept;
      for (int r = 0; r < lane_group; ++r) rest &= rest - 1;
      const bool live = lane_group < p.topk_group;
      const int g = live ? __ffs(rest) - 1 : 0;
      const int chunk = g >> (5 - seg_shift);
      const int source = ((g & (groups_per_chunk - 1)) << seg_shift) | (lane & (seg - 1));
      PackedKeys<W> packed;
#pragma unroll
      for (int j = 0; j < W; ++j) packed.key[j] = 0;
#pragma unroll
      for (int c = 0; c < V / W; ++c)
#pragma unroll
        for (int j = 0; j < W; ++j) {
          const std::uint32_t k = __shfl_sync(kFullMask, key[c * W + j], source);
          if (live && chunk == c) packed.key[j] = k;
        }
      packed.first = g * group_size + (lane & (seg - 1)) * W;
      select_experts(packed, p.top_k, selected, lane);
      return true;
    }
#pragma unroll
    for (int c = 0; c < V / W; ++c)
      if (!((kept >> (c * groups_per_chunk + lane_group)) & 1u))
#pragma unroll
        for (int j = 0; j < W; ++j) key[c * W + j] = 0;
    select_experts(*this, p.top_k, selected, lane);
    return true;
  }

  template <typename T>
  __device__ void load(const T* row, int experts) {
#pragma unroll
    for (int c = 0; c < V / W; ++c) {
      float chunk[W];
      const int e0 = c * 32 * W + lane * W;
      if (e0 < experts) {
        load_logits<T, W>(row + e0, chunk);
      } else {
#pragma unroll
        for (int j = 0; j < W; ++j) chunk[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < W; ++j) value[c * W + j] = chunk[j];
    }
  }
};

// Scores and keys in shared memory (any E): element i of lane l is expert i*32 + l.
struct SharedScores {
  static constexpr int kWidth = 1;
  static constexpr bool kFixed = false;
  float* value;          // [E_pad] this warp's scores (aliases the weight source)
  std::uint32_t* key;    // [E_pad]
  int lane;
  int n;                 // E_pad / 32

  __device__ int count() const { return n; }
  __device__ int expert(int i) const { return i * 32 + lane; }
  __device__ float& val(int i) { return value[expert(i)]; }
  __device__ std::uint32_t& k(int i) { return key[expert(i)]; }
  __device__ void remove(int winner) {
    if ((winner & 31) == lane) key[winner] = 0;
  }
  __device__ bool select_in_best_groups(const KernelParams&, std::int32_t*) { return false; }

  template <typename T>
  __device__ void load(const T* row, int experts) {
    for (int i = 0; i < n; ++i) {
      const int e = expert(i);
      float x[1] = {0.0f};
      if (e < experts) load_logits<T, 1>(row + e, x);
      value[e] = x[0];
    }
  }
};

// ---- one token ------------------------------------------------------------------------

// N floats from or to shared memory, 16 bytes at a time where N allows (p aligned to N floats).
template <int N>
__device__ __forceinline__ void store_floats(float* p, const float (&v)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) *reinterpret_cast<float4*>(p + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = v[i];
  }
}
template <int N>
__device__ __forceinline__ void load_floats(const float* p, float (&v)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 q = *reinterpret_cast<const float4*>(p + i);
      v[i] = q.x, v[i + 1] = q.y, v[i + 2] = q.z, v[i + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = p[i];
  }
}

// This warp's shared memory: weight source [E_pad] | keys [E_pad] (shared path) |
// selected ids [k] | selected weights [k] | group keys [n_group] | kept groups [n_group].
struct WarpScratch {
  const double* exp_table;  // kExp2Table, in the block's shared memory
  const float* bias;        // the bias as f32, in the block's shared memory (methods with one)
  float* source;
  std::uint32_t* keys;
  std::int32_t* selected;
  float* picked;
  std::uint32_t* group_key;
  std::uint32_t* kept;
};

// Sum of source[0..n) in index order, numbers only (a NaN is skipped); every lane gets it.
__device__ __forceinline__ float serial_sum(const float* source, int n) {
  float sum = 0.0f;
  int e = 0;
  for (; e + 4 <= n; e += 4) {
    const float4 v = *reinterpret_cast<const float4*>(source + e);
    if (!isnan(v.x)) sum = __fadd_rn(sum, v.x);
    if (!isnan(v.y)) sum = __fadd_rn(sum, v.y);
    if (!isnan(v.z)) sum = __fadd_rn(sum, v.z);
    if (!isnan(v.w)) sum = __fadd_rn(sum, v.w);
  }
  for (; e < n; ++e)
    if (!isnan(source[e])) sum = __fadd_rn(sum, source[e]);
  return sum;
}

// p = softmax(x) over the valid experts, as cpu::softmax: max and sum skip NaN logits. A
// number whose p is NaN (inf - inf) is added by the CPU, which makes its sum NaN.
template <class Scores>
__device__ void softmax_scores(Scores& sc, const KernelParams& p, float* source, const double* exp_table) {
  float m = __int_as_float(0x7fffffff);  // NaN: no number yet
#pragma unroll
  for (int i = 0; i < sc.count(); ++i)
    if (sc.expert(i) < p.experts) m = fmaxf(m, sc.val(i));
  m = group_max<32>(m);
  bool nan_sum = false;
  if constexpr (Scores::kFixed) {
    // Registers: the lane's exponentials, then its quotients, branch-free so that their chains interleave.
    float q[Scores::count()];
#pragma unroll
    for (int i = 0; i < sc.count(); ++i) q[i] = exp_ref(__fsub_rn(sc.val(i), m), exp_table);
#pragma unroll
    for (int i = 0; i < sc.count(); ++i) {
      const int e = sc.expert(i);
      if (e < p.experts) {
        nan_sum |= !isnan(sc.val(i)) && isnan(q[i]);
        source[e] = q[i];
      }
      sc.val(i) = q[i];
    }
  } else {
    for (int i = 0; i < sc.count(); ++i) {
      const int e = sc.expert(i);
      if (e >= p.experts) continue;
      const float x = sc.val(i);
      const float q = exp_ref(__fsub_rn(x, m), exp_table);
      nan_sum |= !isnan(x) && isnan(q);
      sc.val(i) = q;
      source[e] = q;
    }
  }
  nan_sum = __any_sync(kFullMask, nan_sum);
  __syncwarp();
  float sum = serial_sum(source, p.experts);
  if (nan_sum) sum = __int_as_float(0x7fffffff);
  __syncwarp();
  if constexpr (Scores::kFixed) {
#pragma unroll
    for (int i = 0; i < sc.count(); ++i) sc.val(i) = __fdiv_rn(sc.val(i), sum);
#pragma unroll
    for (int i = 0; i < sc.count(); ++i) if (sc.expert(i) < p.experts) source[sc.expert(i)] = sc.val(i);
  } else {
    for (int i = 0; i < sc.count(); ++i) {
      const int e = sc.expert(i);
      if (e >= p.experts) continue;
      const float q = __fdiv_rn(sc.val(i), sum);
      sc.val(i) = q;
      source[e] = q;
    }
  }
}

// DeepSeek-V3's group limit: a group scores the sum of its two best choice values
// (sigmoid + bias); the topk_group best groups stay eligible. Marks kept[g].
__device__ inline void keep_best_groups(const KernelParams& p, const float* source, const float* bias,
                                 const WarpScratch& w, int lane) {
  const int group_size = p.group_size;
  for (int g = 0; g < p.n_group; ++g) {
    std::uint32_t k1 = 0, k2 = 0;
    int e1 = 0, e2 = 0;
    float c1 = 0.0f, c2 = 0.0f;
    for (int m = lane; m < group_size; m += 32) {
      const int e = g * group_size + m;
      const float c = __fadd_rn(source[e], bias[e]);
      const std::uint32_t key = rank_key(c);
      if (key > k1) {
        k2 = k1, e2 = e1, c2 = c1;
        k1 = key, e1 = e, c1 = c;
      } else if (key > k2) {
        k2 = key, e2 = e, c2 = c;
      }
    }
    const int first = warp_argmax(k1, e1);
    const int first_lane = (first - g * group_size) & 31;
    const float best = __shfl_sync(kFullMask, c1, first_lane);
    float sum = __fadd_rn(0.0f, best);
    if (group_size >= 2) {
      const bool owner = lane == first_lane;
      const int second = warp_argmax(owner ? k2 : k1, owner ? e2 : e1);
      const float next = __shfl_sync(kFullMask, owner ? c2 : c1, (second - g * group_size) & 31);
      sum = __fadd_rn(sum, next);
    }
    if (lane == 0) {
      w.group_key[g] = rank_key(sum);
      w.kept[g] = 0;
    }
  }
  __syncwarp();
  for (int r = 0; r < p.topk_group; ++r) {
    std::uint32_t bk = 0;
    int bg = 0;
    for (int g = lane; g < p.n_group; g += 32)
      if (w.group_key[g] > bk) bk = w.group_key[g], bg = g;
    const int win = warp_argmax(bk, bg);
    __syncwarp();
    if (lane == 0) {
      w.group_key[win] = 0;
      w.kept[win] = 1;
    }
    __syncwarp();
  }
}

// Routes one token whose logits `sc` holds; p.method is of family S.
template <Scoring S, class Scores>
__device__ void route_token(Scores& sc, const KernelParams& p, const WarpScratch& w,
                            std::int64_t token) {
  const int lane = sc.lane;
  const RoutingMethod method = p.method;

  // Scores and selection keys.
  if constexpr (S == Scoring::softmax) {
    softmax_scores(sc, p, w.source, w.exp_table);
#pragma unroll
    for (int i = 0; i < sc.count(); ++i) sc.k(i) = sc.expert(i) < p.experts ? rank_key(sc.val(i)) : 0u;
  } else if constexpr (S == Scoring::sigmoid || S == Scoring::grouped) {
    const bool biased = S == Scoring::grouped || method == RoutingMethod::sigmoid_bias_renorm;
    constexpr int kW = Scores::kWidth;  // a vector of experts: all of them exist or none
    if constexpr (Scores::kFixed) {
      // Every score of the lane with no branch between them, so the exponentials' dependent
      // double chains interleave: d = 1 + e^-x, then 1/d by reciprocal_steps, for x in
      // (-64, 100); where some x is outside (or NaN), sigmoid_ref for all of them: the same
      // values.
      constexpr int kCount = Scores::count();
      float s[kCount];
      bool steps = true;
#pragma unroll
      for (int i = 0; i < kCount; ++i) {
        s[i] = __fadd_rn(1.0f, exp_in_range(-sc.val(i), w.exp_table));
        steps &= sc.val(i) > -64.0f && sc.val(i) < 100.0f;
      }
      if (steps) {
#pragma unroll
        for (int i = 0; i < kCount; ++i) s[i] = reciprocal_steps(s[i]);
      } else {
#pragma unroll
        for (int i = 0; i < kCount; ++i) s[i] = sigmoid_ref(sc.val(i), w.exp_table);
      }
#pragma unroll
      for (int c = 0; c < kCount / kW; ++c) {
        const int e0 = sc.expert(c * kW);
        float v[kW], b[kW] = {};
#pragma unroll
        for (int j = 0; j < kW; ++j) v[j] = s[c * kW + j];
        if (e0 < p.experts) {
          store_floats(w.source + e0, v);
          if (biased) load_floats(w.bias + e0, b);
        }
#pragma unroll
        for (int j = 0; j < kW; ++j) {
          sc.val(c * kW + j) = v[j];
          sc.k(c * kW + j) = e0 >= p.experts ? 0u : rank_key(biased ? __fadd_rn(v[j], b[j]) : v[j]);
        }
      }
    } else {
      for (int i = 0; i < sc.count(); ++i) {
        const int e = sc.expert(i);
        if (e >= p.experts) {
          sc.k(i) = 0;
          continue;
        }
        const float v = sigmoid_ref(sc.val(i), w.exp_table);
        sc.val(i) = v;  // the weight source itself
        sc.k(i) = rank_key(biased ? __fadd_rn(v, w.bias[e]) : v);
      }
    }
  } else {  // topk_softmax, top1_sigmoid: select on the logits themselves
#pragma unroll
    for (int i = 0; i < sc.count(); ++i) {
      const int e = sc.expert(i);
      if (e < p.experts) w.source[e] = sc.val(i);
      sc.k(i) = e < p.experts ? rank_key(sc.val(i)) : 0u;
    }
  }
  __syncwarp();

  // Selection: the group limit first where the method has one, then k rounds of warp argmax.
  if (S != Scoring::grouped || !sc.select_in_best_groups(p, w.selected)) {
    if constexpr (S == Scoring::grouped) {
      keep_best_groups(p, w.source, w.bias, w, lane);
      const int group_size = p.group_size;
#pragma unroll
      for (int i = 0; i < sc.count(); ++i) {
        const int e = sc.expert(i);
        if (e < p.experts && !w.kept[e / group_size]) sc.k(i) = 0;
      }
    }
    select_experts(sc, p.top_k, w.selected, lane);
  }

  // Weights, in slot order.
  for (int j = lane; j < p.top_k; j += 32) {
    const float v = w.source[w.selected[j]];
    w.picked[j] = S == Scoring::logits && method == RoutingMethod::top1_sigmoid ? sigmoid_ref(v, w.exp_table) : v;
  }
  __syncwarp();
  float divisor = 1.0f;  // 1: nothing to divide
  float shift = 0.0f;
  const bool softmax_k = S == Scoring::logits && method == RoutingMethod::topk_softmax;
  if (softmax_k) {
    float m = __int_as_float(0x7fffffff);
    for (int j = 0; j < p.top_k; ++j) m = fmaxf(m, w.picked[j]);
    float sum = 0.0f;  // adds exp(x - m) of every number x, NaN (inf - inf) included, as the CPU
    for (int j = 0; j < p.top_k; ++j) {
      const float x = w.picked[j];
      if (!isnan(x)) sum = __fadd_rn(sum, exp_ref(__fsub_rn(x, m), w.exp_table));
    }
    divisor = sum;
    shift = m;
  } else if (method != RoutingMethod::softmax_topk && method != RoutingMethod::sigmoid_topk &&
             method != RoutingMethod::top1_sigmoid) {
    float sum = 0.0f;
    for (int j = 0; j < p.top_k; ++j) sum = __fadd_rn(sum, w.picked[j]);
    divisor = sum;  // a zero sum leaves the weights as they are (cpu renormalize)
  }
  for (int j = lane; j < p.top_k; j += 32) {
    float v = w.picked[j];
    if (softmax_k) v = __fdiv_rn(exp_ref(__fsub_rn(v, shift), w.exp_table), divisor);
    else if (divisor != 1.0f && divisor != 0.0f) v = __fdiv_rn(v, divisor);
    const std::int64_t out = token * p.top_k + j;
    p.ids[out] = w.selected[j];
    p.weights[out] = __fmul_rn(v, p.scaling);
  }
  __syncwarp();
}

// ---- kernels --------------------------------------------------------------------------

__device__ __forceinline__ WarpScratch warp_scratch(const double* exp_table, const float* bias, float* base,
                                                    const KernelParams& p, int experts_pad, bool shared_keys) {
  WarpScratch w;
  w.exp_table = exp_table;
  w.bias = bias;
  w.source = base;
  float* next = base + experts_pad;
  w.keys = reinterpret_cast<std::uint32_t*>(next);
  if (shared_keys) next += experts_pad;
  w.selected = reinterpret_cast<std::int32_t*>(next);
  next += p.top_k;
  w.picked = next;
  next += p.top_k;
  w.group_key = reinterpret_cast<std::uint32_t*>(next);
  next += p.n_group;
  w.kept = reinterpret_cast<std::uint32_t*>(next);
  return w;
}

// The block's shared memory: kExp2Table (kExpTableFloats floats) | the bias as f32 (bias_floats)
// | each warp's scratch (warp_floats each). Returns this warp's scratch.
__device__ __forceinline__ WarpScratch stage_block(const KernelParams& p, float* shared, bool shared_keys) {
  double* table = reinterpret_cast<double*>(shared);
  for (int j = threadIdx.x; j < kExpTableFloats / 2; j += blockDim.x) table[j] = kExp2Table[j];
  float* bias = shared + kExpTableFloats;
  for (int e = threadIdx.x; e < p.bias_floats && e < p.experts; e += blockDim.x)
    bias[e] = p.bias_bf16 ? bf16_to_f32(__ldg(static_cast<const std::uint16_t*>(p.bias) + e))
                          : __ldg(static_cast<const float*>(p.bias) + e);
  __syncthreads();
  const int warp = threadIdx.x / 32;
  return warp_scratch(table, bias, bias + p.bias_floats + warp * p.warp_floats, p, (p.experts + 31) / 32 * 32, shared_keys);
}

// E <= 32V: V scores per lane in registers, loaded W at a time. The warp's first logits are loaded
// before the block stages its tables, so that the two loads' latencies overlap (at decode sizes the
// kernel is one warp's chain of dependent steps).
template <typename T, int V, int W, Scoring S>
__global__ void __launch_bounds__(256) route_registers(KernelParams p) {
  extern __shared__ float4 shared4[];
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  RegisterScores<V, W> sc;
  sc.lane = threadIdx.x & 31;
  // 64-bit: t + the stride must not wrap for T just below 2^31
  const std::int64_t stride = std::int64_t(gridDim.x) * warps;
  std::int64_t t = std::int64_t(blockIdx.x) * warps + warp;
  if (t < p.tokens) sc.load(static_cast<const T*>(p.logits) + t * p.experts, p.experts);
  const WarpScratch w = stage_block(p, reinterpret_cast<float*>(shared4), false);
  for (; t < p.tokens; t += stride) {
    route_token<S>(sc, p, w, t);
    if (t + stride < p.tokens) sc.load(static_cast<const T*>(p.logits) + (t + stride) * p.experts, p.experts);
  }
}

// Any E: scores and keys in shared memory.
template <typename T, Scoring S>
__global__ void __launch_bounds__(256) route_shared(KernelParams p) {
  extern __shared__ float4 shared4[];
  const WarpScratch w = stage_block(p, reinterpret_cast<float*>(shared4), true);
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  SharedScores sc{w.source, w.keys, int(threadIdx.x & 31), (p.experts + 31) / 32};
  // 64-bit: t + the stride must not wrap for T just below 2^31
  for (std::int64_t t = std::int64_t(blockIdx.x) * warps + warp; t < p.tokens; t += std::int64_t(gridDim.x) * warps) {
    sc.load(static_cast<const T*>(p.logits) + t * p.experts, p.experts);
    route_token<S>(sc, p, w, t);
  }
}

}  // namespace moekit::cuda::routing
