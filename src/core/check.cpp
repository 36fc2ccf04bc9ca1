#include "core/check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/validate.h"
#include "moekit/error.h"

namespace moekit::core {
namespace {

bool fast_fp8(const QuantConfig& q) { return q.scheme != QuantScheme::bf16 && q.accumulation == Fp8Accumulation::fast; }

// ‖diff‖ / ‖ref‖ from their squares; against a zero reference ‖diff‖ itself, so that an output
// that should be zero and is not still counts.
double relative(double diff2, double ref2) { return ref2 > 0.0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2); }

// rel / q. q = 0 (the reference is the ideal, e.g. an empty batch): out must be the ideal too.
double ratio(double rel, double q) {
  if (q > 0.0) return rel / q;
  return rel == 0.0 ? 1.0 : rel * INFINITY;  // NaN stays NaN
}

// NaN is worse than any number, and the first NaN row stays the worst.
bool worse(double err, double than) { return std::isnan(err) ? !std::isnan(than) : err > than; }

std::string printed(const char* format, double v) {
  char text[48];
  std::snprintf(text, sizeof text, format, v);
  return text;
}

void check_shapes(const CheckArgs& a) {
  require(a.out.defined() && a.out.rank == 2, "out: expected [T, H] bf16, given " + a.out.to_string());
  const std::int64_t tokens = a.out.size(0), hidden = a.out.size(1);
  check_tensor("out", a.out, {DType::bf16}, {tokens, hidden}, Device::cpu);
  check_tensor("reference", a.reference, {DType::bf16}, {tokens, hidden}, Device::cpu);
  require(a.ideal.empty() || std::int64_t(a.ideal.size()) == tokens * hidden,
          "ideal: expected T * H = " + std::to_string(tokens * hidden) + " values or none, given " +
              std::to_string(a.ideal.size()));
}

}  // namespace

std::string_view to_string(CheckRule rule) {
  switch (rule) {
    case CheckRule::finite: return "finite";
    case CheckRule::global: return "global";
    case CheckRule::ideal: return "ideal";
    case CheckRule::row: return "row";
  }
  return "?";
}

double global_tolerance(const QuantConfig& quant, std::optional<double> q) {
  if (!fast_fp8(quant)) return kCheckTolerance;
  return std::max(kFastToleranceFloor, kFastToleranceShare * q.value_or(0.0));
}

bool bounds_ideal_ratio(const QuantConfig& quant) { return quant.scheme != QuantScheme::bf16; }

std::string check_rule_text(const QuantConfig& quant) {
  std::string s = "|out-ref|/|ref| <= ";
  s += fast_fp8(quant) ? "max(" + printed("%g", kFastToleranceFloor) + ", " + printed("%g", kFastToleranceShare) + "*q)"
                       : printed("%g", kCheckTolerance);
  if (bounds_ideal_ratio(quant)) s += "; |out-ideal|/|ideal| <= " + printed("%g", kIdealRatio) + "*q";
  if (bounds_ideal_ratio(quant) || fast_fp8(quant)) s += " (q = |ref-ideal|/|ideal|, the quant scheme's own error)";
  s += "; every token row |out_t-ref_t|/|ref_t| <= " + printed("%g", kRowTolerance) + " (|ref_t| at least " +
       printed("%g", kRowNormFloor) + " of the mean row norm); no NaN/Inf where the reference has none; an element "
       "within 2^-133 (bf16's bottom unit) of the reference counts as equal to it";
  return s;
}

double flip_allowance(double bound, double codes, double step) {
  if (!(codes > 0) || !(bound > 0) || !(step > 0)) return 1.0;
  const double m = codes * (bound / step) * (bound / step), z = kFlipDeviations;
  return std::sqrt(1.0 + z / std::sqrt(m) + z * z / m);
}

bool CheckResult::passed(CheckRule rule) const { return std::find(failed.begin(), failed.end(), rule) == failed.end(); }

std::string CheckResult::verdict() const {
  if (pass()) return "PASS";
  std::string s = "FAIL [";
  for (std::size_t i = 0; i < failed.size(); ++i) s += (i ? ", " : "") + std::string(core::to_string(failed[i]));
  return s + "]";
}

std::string CheckResult::figures() const {
  std::string s = "rel_err=" + printed("%.3e", rel_err) + " tol=" + printed("%.1e", tolerance);
  if (!has_ideal) s += " ideal=skipped (no ideal reference)";
  else
    s += " q=" + printed("%.2e", q) + " ideal_ratio=" + printed("%.4f", ideal_ratio) +
         (bounds_ideal_ratio(quant) ? " (<=" + printed("%.4g", ideal_bound) + ")" : " (bf16: not bounded)");
  s += " worst_row=" + printed("%.2e", worst_row) + " (<=" + printed("%.3g", row_bound);
  if (worst_row_index >= 0) s += ", token " + std::to_string(worst_row_index);
  s += ") nan=" + std::to_string(nan) + " inf=" + std::to_string(inf);
  if (widened) s += " (bounds widened for the codes sampled)";
  if (reference_nonfinite > 0) s += " (" + std::to_string(reference_nonfinite) + " reference elements not finite, left out)";
  return s;
}

CheckResult check_output(const CheckArgs& a) {
  check_shapes(a);
  const std::int64_t tokens = a.out.size(0), hidden = a.out.size(1);
  const bf16* out = a.out.ptr<bf16>();
  const bf16* ref = a.reference.ptr<bf16>();
  CheckResult r;
  r.quant = a.quant;
  r.has_ideal = !a.ideal.empty();
  // Sums of squares: out − ref, ref, out − ideal, ref − ideal, ideal; per row out − ref and ref.
  double out_ref2 = 0.0, ref2 = 0.0, out_ideal2 = 0.0, ref_ideal2 = 0.0, ideal2 = 0.0;
  std::vector<double> row_err2(std::size_t(tokens), 0.0), row_ref2(std::size_t(tokens), 0.0);
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t i = t * hidden; i < (t + 1) * hidden; ++i) {
      const double p = bf16_to_float(ref[i]), d = r.has_ideal ? a.ideal[std::size_t(i)] : 0.0;
      if (!std::isfinite(p) || !std::isfinite(d)) {
        ++r.reference_nonfinite;
        continue;
      }
      const double given = bf16_to_float(out[i]);
      const double o = std::fabs(given - p) <= kBottomUnit ? p : given;  // a bottom unit off: equal
      if (std::isnan(o)) ++r.nan;
      if (std::isinf(o)) ++r.inf;
      const double e = (o - p) * (o - p);
      row_err2[std::size_t(t)] += e;
      row_ref2[std::size_t(t)] += p * p;
      out_ideal2 += (o - d) * (o - d);
      ref_ideal2 += (p - d) * (p - d);
      ideal2 += d * d;
      if (worse(std::fabs(o - p), r.max_abs_err)) r.max_abs_err = std::fabs(o - p);
      r.max_abs_ref = std::max(r.max_abs_ref, std::fabs(p));
    }
  double mean_row_norm = 0.0;
  for (std::int64_t t = 0; t < tokens; ++t) {
    out_ref2 += row_err2[std::size_t(t)];
    ref2 += row_ref2[std::size_t(t)];
    mean_row_norm += std::sqrt(row_ref2[std::size_t(t)]) / double(tokens);
  }
  r.rel_err = relative(out_ref2, ref2);
  if (r.has_ideal) {
    r.q = relative(ref_ideal2, ideal2);
    r.rel_err_ideal = relative(out_ideal2, ideal2);
    r.ideal_ratio = ratio(r.rel_err_ideal, r.q);
  }
  r.tolerance = global_tolerance(a.quant, r.has_ideal ? std::optional<double>(r.q) : std::nullopt);
  const CheckSampling& sampled = a.sampling;
  if (a.quant.scheme != QuantScheme::bf16 && sampled.given()) {
    const double step = std::max(kFp8Step, 2.0 * (std::isfinite(r.q) ? r.q : 0.0));
    const double base = r.tolerance;
    r.tolerance = base * flip_allowance(base, sampled.codes, step);
    if (sampled.dynamic_scale) r.tolerance = std::max(r.tolerance, kDynamicScaleTolerance);
    r.tolerance = std::max(r.tolerance, kSensitivityFactor * sampled.sensitivity);
    r.row_bound = std::max(kRowTolerance * flip_allowance(kRowTolerance, sampled.row_codes, step),
                           kSensitivityFactor * sampled.row_sensitivity);
    // The flips are noise on top of the scheme's own error, uncorrelated with it: what the
    // global bound gained may add in quadrature to q.
    if (r.q > 0) r.ideal_bound = kIdealRatio * std::sqrt(1.0 + (r.tolerance * r.tolerance - base * base) / (r.q * r.q));
    if (sampled.ideal_sensitivity > 1.0)
      r.ideal_bound = std::max(r.ideal_bound, 1.0 + kSensitivityFactor * (sampled.ideal_sensitivity - 1.0));
    r.widened = r.tolerance > base || r.row_bound > kRowTolerance;
  }
  // A row whose reference is (nearly) zero is held to the floor in absolute terms.
  const double floor = kRowNormFloor * mean_row_norm;
  for (std::int64_t t = 0; t < tokens; ++t) {
    const double err = relative(row_err2[std::size_t(t)], std::max(row_ref2[std::size_t(t)], floor * floor));
    if (r.worst_row_index < 0 || worse(err, r.worst_row)) r.worst_row = err, r.worst_row_index = t;
  }

  if (r.nan > 0 || r.inf > 0) r.failed.push_back(CheckRule::finite);
  if (!(r.rel_err <= r.tolerance)) r.failed.push_back(CheckRule::global);
  if (r.has_ideal && bounds_ideal_ratio(a.quant) && !(r.ideal_ratio <= r.ideal_bound)) r.failed.push_back(CheckRule::ideal);
  if (!(r.worst_row <= r.row_bound)) r.failed.push_back(CheckRule::row);
  return r;
}

}  // namespace moekit::core
