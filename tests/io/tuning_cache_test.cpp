// The tuning cache's file format (io/tuning_cache.h): round trip, buckets, merging, and the
// rejection of corrupted and hostile files, each with the flaw named.
#include "io/tuning_cache.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "io/temp_dir.h"
#include "moekit/error.h"

namespace moekit::io {
namespace {

TuningEntry entry(std::int64_t tokens, const std::string& tactic, double us) {
  TuningEntry e;
  e.device = {"NVIDIA H200", 132, "13.0", "0.1.0"};
  e.problem.experts = 256;
  e.problem.hidden = 7168;
  e.problem.intermediate = 2048;
  e.problem.top_k = 8;
  e.problem.quant = QuantScheme::fp8_block;
  e.tokens = tokens;
  e.winner = {tactic, us};
  e.runners_up = {{"staged gemm1=m64_n128_pingpong gemm2=m64_n128_pingpong", us + 10.25}, {"min-latency", us + 20.5}};
  e.measured = "deepseek-v3, \"quoted\"\n";
  return e;
}

TuningCache two_entries() {
  TuningCache c;
  c.entries.push_back(entry(1, "min-latency", 141.7));
  c.entries.push_back(entry(4096, "staged gemm1=m128_n128_cooperative gemm2=m128_n128_cooperative", 4976.69));
  c.entries.back().problem.batch_invariant = false;
  c.entries.back().problem.ep_size = 2;
  c.entries.back().problem.scale_format = ScaleFormat::ue8m0;
  c.entries.back().problem.activation = Activation::relu2;
  c.entries.back().problem.accumulation = Fp8Accumulation::strict;
  return c;
}

void expect_same(const TuningEntry& a, const TuningEntry& b) {
  EXPECT_EQ(a.device.to_string(), b.device.to_string());
  EXPECT_EQ(a.problem.to_string(), b.problem.to_string());
  EXPECT_EQ(a.problem.difference(b.problem), "");
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.winner.tactic, b.winner.tactic);
  EXPECT_EQ(a.winner.us, b.winner.us);
  ASSERT_EQ(a.runners_up.size(), b.runners_up.size());
  for (std::size_t i = 0; i < a.runners_up.size(); ++i) {
    EXPECT_EQ(a.runners_up[i].tactic, b.runners_up[i].tactic);
    EXPECT_EQ(a.runners_up[i].us, b.runners_up[i].us);
  }
  EXPECT_EQ(a.measured, b.measured);
}

TEST(IoTuningCache, RoundTripKeepsEveryField) {
  const TuningCache c = two_entries();
  const std::string text = write_tuning_cache(c);
  const TuningCache back = parse_tuning_cache(text, "t.json");
  ASSERT_EQ(back.entries.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) expect_same(c.entries[i], back.entries[i]);
  EXPECT_EQ(write_tuning_cache(back), text);
  EXPECT_EQ(parse_tuning_cache(write_tuning_cache(TuningCache{}), "empty").entries.size(), 0u);
}

TEST(IoTuningCache, ReadsAFileAndNamesAMissingOne) {
  test::TempDir dir;
  const std::string path = dir.file("tuning.json");
  std::ofstream(path) << write_tuning_cache(two_entries());
  EXPECT_EQ(read_tuning_cache(path).entries.size(), 2u);
  try {
    read_tuning_cache(dir.file("none.json"));
    FAIL() << "read a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("none.json: cannot open"), std::string::npos) << e.what();
  }
}

TEST(IoTuningCache, BucketsArePowersOfTwo) {
  EXPECT_EQ(token_bucket(0), 0);
  EXPECT_EQ(token_bucket(1), 1);
  EXPECT_EQ(token_bucket(2), 2);
  EXPECT_EQ(token_bucket(3), 4);
  EXPECT_EQ(token_bucket(64), 64);
  EXPECT_EQ(token_bucket(65), 128);
  EXPECT_EQ(token_bucket(16385), 32768);
}

TEST(IoTuningCache, MergeReplacesTheSameSlotAndKeepsTheOthers) {
  TuningCache c = two_entries();
  TuningEntry newer = c.entries[0];
  newer.winner = {"staged gemm1=rows8_warp_mma gemm2=rows8_warp_mma", 99};
  TuningEntry other = c.entries[0];
  other.device.gpu = "NVIDIA H100 80GB HBM3";
  merge_tuning_entries(c, {newer, other});
  ASSERT_EQ(c.entries.size(), 3u);
  EXPECT_EQ(c.entries[0].winner.us, 99);
  EXPECT_EQ(c.entries[2].device.gpu, "NVIDIA H100 80GB HBM3");
}

TEST(IoTuningCache, DifferenceNamesTheFirstField) {
  TuningProblem a = entry(1, "x", 1).problem, b = a;
  EXPECT_EQ(a.difference(b), "");
  b.experts = 128;
  EXPECT_EQ(a.difference(b), "E 128 != 256");
  b = a;
  b.batch_invariant = true;
  EXPECT_EQ(a.difference(b), "batch_invariant true != false");
  b = a;
  b.accumulation = Fp8Accumulation::exact;
  EXPECT_EQ(a.difference(b), "fp8 accumulation exact != fast");
}

// A valid file with one substitution, and the words the error must contain.
struct Bad {
  const char* name;
  std::string from, to;
  const char* error;
};

class IoTuningCacheBad : public ::testing::TestWithParam<Bad> {};

TEST_P(IoTuningCacheBad, IsRejectedWithTheFlawNamed) {
  TuningCache one;
  one.entries.push_back(entry(64, "min-latency", 10));
  std::string text = write_tuning_cache(one);
  const Bad& b = GetParam();
  if (!b.from.empty()) {
    const std::size_t at = text.find(b.from);
    ASSERT_NE(at, std::string::npos) << b.from << " in " << text;
    text.replace(at, b.from.size(), b.to);
  } else {
    text = b.to;
  }
  try {
    parse_tuning_cache(text, "bad.json");
    FAIL() << "accepted: " << text;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(b.error), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
  }
}

std::string deep(int depth) { return std::string(std::size_t(depth), '[') + std::string(std::size_t(depth), ']'); }

INSTANTIATE_TEST_SUITE_P(
    Cases, IoTuningCacheBad,
    ::testing::Values(
        Bad{"empty", "", "", "bad.json"}, Bad{"not_json", "", "{\"format\": ", "bad.json"},
        Bad{"array_root", "", "[]", "expected an object"}, Bad{"too_deep", "", deep(100), "nesting deeper"},
        Bad{"truncated", "", "{\"format\": \"moekit-tuning\", \"version\": 1, \"entries\": [{\"gpu\": \"x\"", "bad.json"},
        Bad{"format", "moekit-tuning", "vllm-config", "format: expected \"moekit-tuning\""},
        Bad{"version", "\"version\": 1", "\"version\": 2", "version: expected 1"},
        Bad{"unknown_member", "\"step\":", "\"stepp\": 1, \"step\":", "unknown member \"stepp\""},
        Bad{"missing_member", "\"sms\": 132, ", "", "missing \"sms\""},
        Bad{"sms_kind", "\"sms\": 132", "\"sms\": \"132\"", "sms: expected an integer"},
        Bad{"sms_range", "\"sms\": 132", "\"sms\": -1", "sms: expected an integer in [1"},
        Bad{"experts_huge", "\"experts\": 256", "\"experts\": 1e300", "experts"},
        Bad{"quant_name", "\"fp8-block\"", "\"fp9\"", "quant: expected one of"},
        Bad{"scale_format", "\"scale_format\": \"f32\"", "\"scale_format\": \"e5m2\"", "scale_format: expected one of"},
        Bad{"bool_kind", "\"batch_invariant\": false", "\"batch_invariant\": 0", "batch_invariant: expected"},
        Bad{"step", "\"step\": \"experts\"", "\"step\": \"routing\"", "step: expected \"experts\""},
        Bad{"bucket", "\"tokens\": 64", "\"tokens\": 65", "expected a power of two"},
        Bad{"bucket_zero", "\"tokens\": 64", "\"tokens\": 0", "expected a power of two"},
        Bad{"bucket_huge", "\"tokens\": 64", "\"tokens\": 9223372036854775807", "tokens: expected an integer in"},
        Bad{"invariant_bucket", "\"batch_invariant\": false", "\"batch_invariant\": true", "one tactic for every T"},
        Bad{"time_negative", "\"us\": 10}", "\"us\": -10}", "expected a time"},
        Bad{"time_zero", "\"us\": 10}", "\"us\": 0}", "expected a time"},
        Bad{"time_string", "\"us\": 10}", "\"us\": \"fast\"}", "us: expected a number"},
        Bad{"tactic_empty", "\"tactic\": \"min-latency\"", "\"tactic\": \"\"", "expected a name"},
        Bad{"tactic_long", "\"tactic\": \"min-latency\"", "\"tactic\": \"" + std::string(300, 'x') + "\"",
            "at most 256 bytes"},
        Bad{"runners_kind", "\"runners_up\": [", "\"runners_up\": 5, \"x\": [", "runners_up: expected an array"},
        Bad{"duplicate_key", "\"step\":", "\"step\": \"experts\", \"step\":", "duplicate"}),
    [](const ::testing::TestParamInfo<Bad>& info) { return std::string(info.param.name); });

TEST(IoTuningCache, SecondEntryForTheSameSlotIsRejected) {
  TuningCache c;
  c.entries.push_back(entry(64, "min-latency", 10));
  c.entries.push_back(entry(64, "min-latency", 11));
  try {
    parse_tuning_cache(write_tuning_cache(c), "dup.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dup.json: entries[1]: a second entry for the same"), std::string::npos) << e.what();
  }
}

TEST(IoTuningCache, TooManyRunnersUpOrTooLargeAFileIsRejected) {
  TuningCache c;
  c.entries.push_back(entry(64, "min-latency", 10));
  c.entries[0].runners_up.assign(kTuningMaxRunnersUp + 1, {"min-latency", 1});
  EXPECT_THROW(parse_tuning_cache(write_tuning_cache(c), "many.json"), Error);
  EXPECT_THROW(parse_tuning_cache(std::string(kTuningCacheMaxBytes + 1, ' '), "big.json"), Error);
}

}  // namespace
}  // namespace moekit::io
