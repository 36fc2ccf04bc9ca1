// Routing kernel: one warp per token.
//   1. load the token's logits as f32 (each lane holds the experts of its columns)
//   2. scores per method (softmax sums in expert order, as the CPU does: one lane-serial pass
//      over shared memory), written to shared memory as the weight source
//   3. selection keys: (score, expert) ordered high first, NaN below numbers, ties to the lower
//      expert; sigmoid_bias_grouped first keeps the best groups
//   4. k rounds of warp argmax (two redux.sync per round)
//   5. weights from the selected scores (renormalized in slot order), times the scaling factor
// Every sum runs in the CPU's order; products feeding sums are rounded separately (no FMA).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/vec.cuh"
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

// ---- ordering and math shared by every path -------------------------------------------

// Selection key: larger means ranked higher. Numbers map monotonically to [0x007fffff,
// 0xff800000] (-0 and +0 tie: v + 0 is +0 for both), NaN to 1, and 0 means "not eligible".
__device__ __forceinline__ std::uint32_t rank_key(float v) {
  const std::uint32_t u = __float_as_uint(__fadd_rn(v, 0.0f));
  const std::uint32_t key = u ^ (std::uint32_t(std::int32_t(u) >> 31) | 0x80000000u);
  return isnan(v) ? 1u : key;
}

// The number behind a key of rank_key: the same value (+0 for either zero), NaN for key 1.
__device__ __forceinline__ float key_value(std::uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? key & 0x7fffffffu : ~key);
}

// 1/11!, 1/10!, ..., 1/2!, 1/1!, 1/0!: e^r's Taylor coefficients, highest first. In constant
// memory (not const, so they are not folded back), the DFMAs read them as operands; as
// immediates each took two UMOVs per use.
static __constant__ double kExpTaylor[12] = {2.505210838544172e-08, 2.755731922398589e-07, 2.7557319223985893e-06,
                                            2.48015873015873e-05,  1.984126984126984e-04, 1.388888888888889e-03,
                                            8.333333333333333e-03, 4.1666666666666664e-02, 1.6666666666666666e-01,
                                            0.5,                   1.0,                   1.0};

// e^x rounded once from a double evaluation good to about 2^-46: correctly rounded but for
// vanishingly rare arguments, so it agrees with a (nearly) correctly rounded host expf.
// x = n ln2 + r, |r| <= ln2/2; e^r by its Taylor series to degree 11 (remainder < 2^-47).
__device__ __forceinline__ float exp_ref(float x) {
  if (!(x > -110.0f)) return isnan(x) ? x : 0.0f;      // below half the smallest subnormal
  if (x > 100.0f) return __int_as_float(0x7f800000);  // above FLT_MAX (and +inf)
  const double xd = x;
  const double n = rint(xd * 1.4426950408889634);
  const double r = fma(-n, 0.6931471805599453, xd);
  double p = kExpTaylor[0];
#pragma unroll
  for (int i = 1; i < 12; ++i) p = fma(p, r, kExpTaylor[i]);
  const double scale = __hiloint2double((int(n) + 1023) << 20, 0);  // 2^n, n in [-159, 145]
  return __double2float_rn(p * scale);
}

// 1 / (1 + e^-x) with IEEE division: for x > -64 the denominator lies in [1, 2^93) and the
// quotient above 2^-93, where divide_steps gives __fdiv_rn's quotient without its range check.
__device__ __forceinline__ float sigmoid_ref(float x) {
  const float d = __fadd_rn(1.0f, exp_ref(-x));
  return x > -64.0f ? divide_steps(1.0f, d, refined_reciprocal(d)) : __fdiv_rn(1.0f, d);
}

// Index of the best (key, lower expert) over the warp; every lane gets it.
__device__ __forceinline__ int warp_argmax(std::uint32_t key, int expert) {
  const std::uint32_t best = __reduce_max_sync(kFullMask, key);
  const std::uint32_t lo = __reduce_max_sync(kFullMask, key == best ? ~std::uint32_t(expert) : 0u);
  return int(~lo);
}

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

// V scores per lane in registers; element i of lane l is expert (i/W)*32W + l*W + i%W, so
// each load of W experts is one vector per lane. Experts past E are padding (key 0).
template <int V, int W>
struct RegisterScores {
  static_assert(V % W == 0, "whole vectors per lane");
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

  // sigmoid_bias_grouped's group limit when every group is a run of whole vectors over lanes
  // that form an aligned power-of-two segment (DeepSeek-V3: 32 experts = 8 lanes x 4): group
  // top-2 by shuffles inside the segments, all groups at once, then the topk_group best groups
  // by warp argmax. The keys are the choice values' (sigmoid + bias). Clears the keys outside
  // the kept groups; false when the shape does not fit.
  __device__ bool keep_best_groups_in_segments(const KernelParams& p) {
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
    std::uint32_t kept = 0;
    for (int r = 0; r < p.topk_group; ++r) {
      std::uint32_t bk = 0;
      int bg = 0;
#pragma unroll
      for (int c = 0; c < V / W; ++c)
        if (group_key[c] > bk) bk = group_key[c], bg = c * groups_per_chunk + lane_group;
      const int win = warp_argmax(bk, bg);
      kept |= 1u << win;
#pragma unroll
      for (int c = 0; c < V / W; ++c)
        if (c * groups_per_chunk + lane_group == win) group_key[c] = 0;
    }
#pragma unroll
    for (int c = 0; c < V / W; ++c)
      if (!((kept >> (c * groups_per_chunk + lane_group)) & 1u))
#pragma unroll
        for (int j = 0; j < W; ++j) key[c * W + j] = 0;
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
  __device__ bool keep_best_groups_in_segments(const KernelParams&) { return false; }

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

// This warp's shared memory: weight source [E_pad] | keys [E_pad] (shared path) |
// selected ids [k] | selected weights [k] | group keys [n_group] | kept groups [n_group].
struct WarpScratch {
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
__device__ void softmax_scores(Scores& sc, const KernelParams& p, float* source) {
  float m = __int_as_float(0x7fffffff);  // NaN: no number yet
#pragma unroll
  for (int i = 0; i < sc.count(); ++i)
    if (sc.expert(i) < p.experts) m = fmaxf(m, sc.val(i));
  m = group_max<32>(m);
  bool nan_sum = false;
#pragma unroll
  for (int i = 0; i < sc.count(); ++i) {
    const int e = sc.expert(i);
    if (e >= p.experts) continue;
    const float x = sc.val(i);
    const float q = exp_ref(__fsub_rn(x, m));
    nan_sum |= !isnan(x) && isnan(q);
    sc.val(i) = q;
    source[e] = q;
  }
  nan_sum = __any_sync(kFullMask, nan_sum);
  __syncwarp();
  float sum = serial_sum(source, p.experts);
  if (nan_sum) sum = __int_as_float(0x7fffffff);
  __syncwarp();
#pragma unroll
  for (int i = 0; i < sc.count(); ++i) {
    const int e = sc.expert(i);
    if (e >= p.experts) continue;
    const float q = __fdiv_rn(sc.val(i), sum);
    sc.val(i) = q;
    source[e] = q;
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

// Routes one token whose logits `sc` holds.
template <class Scores>
__device__ void route_token(Scores& sc, const KernelParams& p, const float* bias, const WarpScratch& w,
                            int token) {
  const int lane = sc.lane;
  const RoutingMethod method = p.method;

  // Scores and selection keys.
  switch (method) {
    case RoutingMethod::softmax_topk:
    case RoutingMethod::softmax_topk_renorm:
      softmax_scores(sc, p, w.source);
#pragma unroll
      for (int i = 0; i < sc.count(); ++i) sc.k(i) = sc.expert(i) < p.experts ? rank_key(sc.val(i)) : 0u;
      break;
    case RoutingMethod::sigmoid_topk:
    case RoutingMethod::sigmoid_topk_renorm:
    case RoutingMethod::sigmoid_bias_grouped:
    case RoutingMethod::sigmoid_bias_renorm: {
      const bool biased = method == RoutingMethod::sigmoid_bias_grouped || method == RoutingMethod::sigmoid_bias_renorm;
#pragma unroll
      for (int i = 0; i < sc.count(); ++i) {
        const int e = sc.expert(i);
        if (e >= p.experts) {
          sc.k(i) = 0;
          continue;
        }
        const float s = sigmoid_ref(sc.val(i));
        sc.val(i) = s;
        w.source[e] = s;
        sc.k(i) = rank_key(biased ? __fadd_rn(s, bias[e]) : s);
      }
      break;
    }
    default:  // topk_softmax, top1_sigmoid: select on the logits themselves
#pragma unroll
      for (int i = 0; i < sc.count(); ++i) {
        const int e = sc.expert(i);
        if (e < p.experts) w.source[e] = sc.val(i);
        sc.k(i) = e < p.experts ? rank_key(sc.val(i)) : 0u;
      }
      break;
  }
  __syncwarp();

  if (method == RoutingMethod::sigmoid_bias_grouped) {
    if (!sc.keep_best_groups_in_segments(p)) {
      keep_best_groups(p, w.source, bias, w, lane);
      const int group_size = p.group_size;
#pragma unroll
      for (int i = 0; i < sc.count(); ++i) {
        const int e = sc.expert(i);
        if (e < p.experts && !w.kept[e / group_size]) sc.k(i) = 0;
      }
    }
  }

  // Selection: k rounds of warp argmax.
  for (int j = 0; j < p.top_k; ++j) {
    std::uint32_t bk = 0;
    int be = 0;
#pragma unroll
    for (int i = 0; i < sc.count(); ++i)
      if (sc.k(i) > bk) bk = sc.k(i), be = sc.expert(i);
    const int win = warp_argmax(bk, be);
    sc.remove(win);  // the owner lane alone reads that key again
    if (lane == 0) w.selected[j] = win;
  }
  __syncwarp();

  // Weights, in slot order.
  for (int j = lane; j < p.top_k; j += 32) {
    const float v = w.source[w.selected[j]];
    w.picked[j] = method == RoutingMethod::top1_sigmoid ? sigmoid_ref(v) : v;
  }
  __syncwarp();
  float divisor = 1.0f;  // 1: nothing to divide
  float shift = 0.0f;
  bool softmax_k = method == RoutingMethod::topk_softmax;
  if (softmax_k) {
    float m = __int_as_float(0x7fffffff);
    for (int j = 0; j < p.top_k; ++j) m = fmaxf(m, w.picked[j]);
    float sum = 0.0f;  // adds exp(x - m) of every number x, NaN (inf - inf) included, as the CPU
    for (int j = 0; j < p.top_k; ++j) {
      const float x = w.picked[j];
      if (!isnan(x)) sum = __fadd_rn(sum, exp_ref(__fsub_rn(x, m)));
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
    if (softmax_k) v = __fdiv_rn(exp_ref(__fsub_rn(v, shift)), divisor);
    else if (divisor != 1.0f && divisor != 0.0f) v = __fdiv_rn(v, divisor);
    const std::int64_t out = std::int64_t(token) * p.top_k + j;
    p.ids[out] = w.selected[j];
    p.weights[out] = __fmul_rn(v, p.scaling);
  }
  __syncwarp();
}

// ---- kernels --------------------------------------------------------------------------

__device__ __forceinline__ WarpScratch warp_scratch(float* base, const KernelParams& p, int experts_pad,
                                                    bool shared_keys) {
  WarpScratch w;
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

__device__ __forceinline__ float* stage_bias(const KernelParams& p, float* shared) {
  if (p.bias_floats == 0) return shared;
  for (int e = threadIdx.x; e < p.experts; e += blockDim.x)
    shared[e] = p.bias_bf16 ? bf16_to_f32(static_cast<const std::uint16_t*>(p.bias)[e])
                            : static_cast<const float*>(p.bias)[e];
  __syncthreads();
  return shared;
}

// E <= 32V: V scores per lane in registers, loaded W at a time.
template <typename T, int V, int W>
__global__ void __launch_bounds__(256) route_registers(KernelParams p) {
  extern __shared__ float4 shared4[];
  float* shared = reinterpret_cast<float*>(shared4);
  const float* bias = stage_bias(p, shared);
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const WarpScratch w = warp_scratch(shared + p.bias_floats + warp * p.warp_floats, p, (p.experts + 31) / 32 * 32, false);
  RegisterScores<V, W> sc;
  sc.lane = threadIdx.x & 31;
  for (int t = blockIdx.x * warps + warp; t < p.tokens; t += gridDim.x * warps) {
    sc.load(static_cast<const T*>(p.logits) + std::int64_t(t) * p.experts, p.experts);
    route_token(sc, p, bias, w, t);
  }
}

// Any E: scores and keys in shared memory.
template <typename T>
__global__ void __launch_bounds__(256) route_shared(KernelParams p) {
  extern __shared__ float4 shared4[];
  float* shared = reinterpret_cast<float*>(shared4);
  const float* bias = stage_bias(p, shared);
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int experts_pad = (p.experts + 31) / 32 * 32;
  const WarpScratch w = warp_scratch(shared + p.bias_floats + warp * p.warp_floats, p, experts_pad, true);
  SharedScores sc{w.source, w.keys, int(threadIdx.x & 31), experts_pad / 32};
  for (int t = blockIdx.x * warps + warp; t < p.tokens; t += gridDim.x * warps) {
    sc.load(static_cast<const T*>(p.logits) + std::int64_t(t) * p.experts, p.experts);
    route_token(sc, p, bias, w, t);
  }
}

}  // namespace moekit::cuda::routing
