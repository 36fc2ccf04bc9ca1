// DESIGN §8's check of a result (a device's output) against the two references: the pipeline
// reference (the same quantization points) and the ideal one (f64, unquantized weights), with
// q = ‖ref − ideal‖ / ‖ideal‖ the error the quant scheme itself makes. `moekit run --check` and
// the GPU tests share it, so a bound is written down once.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/config.h"
#include "moekit/tensor.h"

namespace moekit::core {

// The bounds of DESIGN §8.
inline constexpr double kCheckTolerance = 5e-3;      // ‖out − ref‖ / ‖ref‖: bf16, FP8 exact and strict
inline constexpr double kFastToleranceFloor = 1e-2;  // FP8 fast: max(1e-2, 0.15 q)
inline constexpr double kFastToleranceShare = 0.15;
inline constexpr double kIdealRatio = 1.02;    // FP8: ‖out − ideal‖ / ‖ideal‖ <= 1.02 q
inline constexpr double kRowTolerance = 0.1;   // every token row against its reference row
inline constexpr double kRowNormFloor = 1e-3;  // of the mean row norm: the least denominator of a row
// bf16's smallest spacing: a subnormal's unit and the last place of the smallest normals. An output
// element within it of the reference counts as equal to it (docs/CHECK.md, "Below the normal
// range"): under 2^-126 a bf16 keeps as few as one significant bit, so sums that differ in their last
// bits (the CPU's f32 sum of f32-rounded products against a tensor core's exact sum of 16) round to
// neighbouring units, a relative difference of up to 100% that the rule's bounds, which count on
// bf16's 8 bits, would take for an error. From 2^-125 up the spacing is wider: no difference hides.
inline constexpr double kBottomUnit = 0x1p-133;

// DESIGN §8's bounds hold an output's norms, which average over the FP8 codes requantized between
// the GEMMs: a device's GEMM1 sums differ from the CPU's in their last bits, and a few of those
// codes then land one step (1/16 to 1/8 of the value) away from the reference's. Over a layer's
// hundreds of thousands of codes the flips average out; over a small problem's few hundred, or
// through one scale made from one largest value, a handful of flips makes the figure. `moekit
// fuzz` on a device (which draws problems down to 16 x 16 experts) gives the check what it needs
// to allow for that (CheckSampling); `moekit run --check` and the GPU tests apply the rule as
// written, the GPU tests with dynamic fp8-tensor's global figure held to kDynamicScaleTolerance.
//
// Dynamic activation scales over a whole tensor (fp8-tensor without static scales) or a row
// (fp8-rowwise): when the device's and the CPU's GEMM1 round the one largest value to different
// bf16 neighbours, every value under that scale is divided by a scale 2^-8 off and a few % of its
// codes move a step: up to 2.6e-2 in 1,500 H200 campaign cases against the pipeline reference. Such an
// output is as good a quantization as the reference's; its global figure is held to this bound.
inline constexpr double kDynamicScaleTolerance = 4e-2;
// The least relative step of an e4m3 code (3 mantissa bits); where the scheme itself errs much
// (q), codes are coarser: a step is taken as max(1/8, 2 q).
inline constexpr double kFp8Step = 0.125;
// Standard deviations of the number of flipped codes above its mean that a bound allows.
inline constexpr double kFlipDeviations = 8.0;

// The problem's own sensitivity, measured: the pipeline reference again with each GEMM1 output
// moved one bf16 step with this probability (cpu::ReferenceInputs::gemm1_flips). A device's FP8
// tensor-core sums lie ~2^-13 of the value from the CPU's f32 ones, and a bf16 output (steps of
// 2^-8) then rounds to the other neighbour about once in 2^5. The device may differ from the
// reference by kSensitivityFactor times what those flips alone move it.
inline constexpr double kGemm1Flips = 1.0 / 32.0;
inline constexpr double kSensitivityFactor = 3.0;

// What the output's figures average over (CheckArgs::sampling); zeros: DESIGN §8's rule as written.
struct CheckSampling {
  double codes = 0;      // FP8 values requantized between the GEMMs: computed slots x I
  double row_codes = 0;  // those one token's row depends on: k x I
  bool dynamic_scale = false;  // one amax scales a whole tensor or row (kDynamicScaleTolerance)
  // The largest ‖ref' − ref‖ / ‖ref‖, worst row and ideal ratio (‖ref' − ideal‖ / ‖ideal‖ / q) of a
  // few references ref' with kGemm1Flips.
  double sensitivity = 0, row_sensitivity = 0, ideal_sensitivity = 0;

  bool given() const {
    return codes > 0 || row_codes > 0 || dynamic_scale || sensitivity > 0 || row_sensitivity > 0 || ideal_sensitivity > 0;
  }
};

// How much a bound B on a relative error over `codes` values widens when that many codes, each
// flipped by a step `step` with a Poisson count, may lie kFlipDeviations above the m = codes (B /
// step)^2 flips that B stands for: sqrt(1 + z / sqrt(m) + z^2 / m). 1 for a layer's sizes.
double flip_allowance(double bound, double codes, double step);

// The rules, in the order the check line names them.
enum class CheckRule : std::uint8_t { finite, global, ideal, row };
std::string_view to_string(CheckRule rule);

// The global bound under `quant`. Without the ideal reference (q nullopt) fast is held to the
// floor of its bound, which is never looser than the bound itself.
double global_tolerance(const QuantConfig& quant, std::optional<double> q);
// Whether ‖out − ideal‖ / ‖ideal‖ <= 1.02 q applies: FP8 layers, whatever their accumulation.
bool bounds_ideal_ratio(const QuantConfig& quant);
// The rule for `quant` in words, for `moekit explain`.
std::string check_rule_text(const QuantConfig& quant);

struct CheckArgs {
  TensorView out;                 // [T, H] bf16, host: the result checked
  TensorView reference;           // [T, H] bf16, host: the pipeline reference
  std::span<const double> ideal;  // [T * H]: the ideal reference; empty: its rule is skipped
  QuantConfig quant;              // picks the bounds
  CheckSampling sampling = {};    // FP8: widens the bounds for small problems and dynamic scales
};

struct CheckResult {
  QuantConfig quant;
  // Against the pipeline reference, over the whole output.
  double rel_err = 0.0;    // ‖out − ref‖ / ‖ref‖
  double tolerance = 0.0;  // its bound
  double ideal_bound = kIdealRatio, row_bound = kRowTolerance;  // the other rules' bounds
  bool widened = false;    // CheckSampling widened a bound
  double max_abs_err = 0.0, max_abs_ref = 0.0;
  // Against the ideal reference, when given.
  bool has_ideal = false;
  double q = 0.0;              // ‖ref − ideal‖ / ‖ideal‖
  double rel_err_ideal = 0.0;  // ‖out − ideal‖ / ‖ideal‖
  double ideal_ratio = 0.0;    // rel_err_ideal / q
  // The worst token row: ‖out_t − ref_t‖ / max(‖ref_t‖, 1e-3 · mean row norm).
  double worst_row = 0.0;
  std::int64_t worst_row_index = -1;  // -1: no rows
  // Elements of out that are NaN, and that are ±Inf, where the reference is finite (they stay in
  // the norms, which become NaN or Inf). Elements where a reference is not finite are left out
  // of the norms and counted apart.
  std::int64_t nan = 0, inf = 0;
  std::int64_t reference_nonfinite = 0;
  std::vector<CheckRule> failed;  // empty: passed

  bool pass() const { return failed.empty(); }
  bool passed(CheckRule rule) const;
  // "PASS" or "FAIL [global, row]".
  std::string verdict() const;
  // "rel_err=4.9e-03 tol=1.0e-02 q=4.3e-02 ideal_ratio=1.0002 (<=1.02) worst_row=3.1e-02 (<=0.1) nan=0 inf=0"
  std::string figures() const;
  std::string to_string() const { return verdict() + " " + figures(); }
};

// Throws Error naming out, reference or ideal when they are not [T, H] bf16 on the host (ideal:
// T * H values).
CheckResult check_output(const CheckArgs& args);

}  // namespace moekit::core
