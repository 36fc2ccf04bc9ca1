// The CLI and the tuning cache (docs/TUNE.md): which cache explain and bench read and why, what explain
// says each GEMM computes, tune without a GPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_util.h"
#include "io/temp_dir.h"
#include "moekit/device.h"

namespace moekit::test {
namespace {

// Issue #29: explain says how many rows the staged GEMMs compute at T, padding included. Without the
// tuning cache: the heuristic's tiles at deepseek-v3 T=4096 (32768 rows over 256 experts, 128 each):
// CUTLASS's 128-row tiles for GEMM1 (no padding), the persistent 128-row tiles for GEMM2; at T=4000
// (125 each) both pad each expert to 128.
TEST(ToolsCli, ExplainSaysTheRowsEachGemmComputes) {
  const Result r = moekit("explain --preset deepseek-v3 --tokens 4096 --tuning-cache off");
  EXPECT_EQ(r.code, 0) << r.err;
#ifdef MOEKIT_HAVE_CUDA
  EXPECT_NE(r.out.find("rows computed at T=4096 under even routing (32768 rows over 256 experts): GEMM1 32768 (0 padding, "
                       "0.0%) GEMM2 32768 (0 padding, 0.0%)"),
            std::string::npos)
      << r.out;
  const Result ragged = moekit("explain --preset deepseek-v3 --tokens 4000 --tuning-cache off");
  EXPECT_NE(ragged.out.find("(32000 rows over 256 experts): GEMM1 32768 (768 padding, 2.3%) GEMM2 32768 (768 padding, 2.3%)"),
            std::string::npos)
      << ragged.out;
#endif
}

// docs/TUNE.md: explain says which cache it read, which entries it ignored and why, and per
// bucket whether the tactic is tuned or the heuristic's; a corrupted cache is rejected, not fatal.
TEST(ToolsCli, ExplainShowsTheTuningCacheAndWhyEntriesAreIgnored) {
  TempDir dir;
  const std::string corrupt = dir.file("corrupt.json"), other = dir.file("other.json");
  std::ofstream(corrupt) << "{\"format\": \"moekit-tuning\", \"version\": 1, \"entries\": [1]}";
  std::ofstream(other) << R"({"format": "moekit-tuning", "version": 1, "entries": [
    {"gpu": "Some GPU", "sms": 7, "cuda": "1.0", "moekit": "0.0.1",
     "problem": {"experts": 128, "hidden": 2048, "intermediate": 768, "top_k": 8, "ep_size": 1, "activation": "silu_and_mul",
                 "quant": "fp8-block", "scale_format": "f32", "fp8_accumulation": "fast", "batch_invariant": false},
     "step": "experts", "tokens": 64, "winner": {"tactic": "min-latency", "us": 10}}]})";
  const Result bad = moekit("explain --preset qwen3-30b-a3b --tuning-cache " + corrupt);
  EXPECT_EQ(bad.code, 0) << bad.err;
  const Result off = moekit("explain --preset qwen3-30b-a3b --tuning-cache off");
  EXPECT_EQ(off.code, 0) << off.err;
  const Result mismatch = moekit("explain --preset qwen3-30b-a3b --tuning-cache " + other);
  EXPECT_EQ(mismatch.code, 0) << mismatch.err;
  const Result by_env = moekit("explain --preset qwen3-30b-a3b", "MOEKIT_TUNING_CACHE=" + other);
  EXPECT_EQ(by_env.code, 0) << by_env.err;
#ifdef MOEKIT_HAVE_CUDA
  EXPECT_NE(bad.out.find("tuning cache: none (rejected: " + corrupt + ": entries[0]: expected an object"), std::string::npos)
      << bad.out;
  EXPECT_NE(off.out.find("tuning cache: none (off"), std::string::npos) << off.out;
  EXPECT_NE(mismatch.out.find("ignored 1 entry: GPU 'Some GPU' != '"), std::string::npos) << mismatch.out;
  EXPECT_NE(by_env.out.find(other + " (MOEKIT_TUNING_CACHE): 1 entries"), std::string::npos) << by_env.out;
  EXPECT_NE(mismatch.out.find("* T<=64     staged gemm1="), std::string::npos) << mismatch.out;
  EXPECT_NE(mismatch.out.find(": heuristic ("), std::string::npos) << mismatch.out;
#endif
}

// Issue #31: with no setting at all, explain takes the cache shipped for the GPU (tuning/ beside this
// CLI), found by name and SM count; a GPU none was shipped for (a fake name) gets the heuristic.
TEST(ToolsCli, ExplainFindsTheCacheShippedForTheGpuByNameAndSmCount) {
  TempDir dir;
  const std::string env = "MOEKIT_TUNING_CACHE= XDG_CACHE_HOME=" + dir.file("xdg");
  const Result h200 = moekit("explain --preset deepseek-v3 --gpu 'NVIDIA H200:132'", env);
  const Result fake = moekit("explain --preset deepseek-v3 --gpu 'NVIDIA Fake GPU:132'", env);
  const Result off = moekit("explain --preset deepseek-v3 --gpu 'NVIDIA H200:132' --tuning-cache off", env);
  const Result bad = moekit("explain --preset deepseek-v3 --gpu 132", env);
  EXPECT_EQ(h200.code, 0) << h200.err;
  EXPECT_EQ(fake.code, 0) << fake.err;
  EXPECT_EQ(off.code, 0) << off.err;
  const std::string cli_dir = std::filesystem::path(MOEKIT_CLI_PATH).parent_path().string();
  EXPECT_NE(h200.out.find("tuning cache: " + cli_dir + "/tuning/h200.json (shipped with moekit for NVIDIA H200 with 132 "
                          "SMs; MOEKIT_TUNING_CACHE unset, no per-user cache at " + dir.file("xdg") + "/moekit/tuning.json)"),
            std::string::npos)
      << h200.out;
  EXPECT_NE(fake.out.find("tuning cache: none (no per-user cache at " + dir.file("xdg") + "/moekit/tuning.json; none "
                          "shipped for 'NVIDIA Fake GPU' with 132 SMs in " + cli_dir + "/tuning, "),
            std::string::npos)
      << fake.out;
  EXPECT_NE(fake.out.find(": heuristic ("), std::string::npos) << fake.out;
  EXPECT_EQ(fake.out.find("tuned ("), std::string::npos) << fake.out;
  EXPECT_NE(off.out.find("tuning cache: none (off (LayerOptions::tuning))"), std::string::npos) << off.out;
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--gpu: expected NAME:SMS, e.g. 'NVIDIA H200:132', given '132'"), std::string::npos) << bad.err;
}

TEST(ToolsCli, TuneWithoutAGpuFailsInOneLine) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is here: scripts/device-tune.sh tunes";
  TempDir dir;
  const Result r = moekit("tune --preset qwen3-30b-a3b --tokens 1 --out " + dir.file("t.json"));
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("moekit tune: error: tune: "), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("t.json")));
}

// --skew's list is checked before any GPU or weights: a bad spec, an empty item and a layer file
// (whose logits are its own) are usage errors naming --skew; nothing is written.
TEST(ToolsCli, TuneSkewListIsCheckedFirst) {
  TempDir dir;
  const std::string out = " --out " + dir.file("t.json");
  const Result bad = moekit("tune --preset qwen3-30b-a3b --tokens 1 --skew none,zipf:x" + out);
  const Result empty = moekit("tune --preset qwen3-30b-a3b --tokens 1 --skew none," + out);
  const Result file = moekit("tune --inputs " + dir.file("layer.safetensors") + " --tokens 1 --skew zipf:1.2" + out);
  for (const Result* r : {&bad, &empty, &file}) EXPECT_EQ(r->code, 2) << r->out << r->err;
  EXPECT_NE(bad.err.find("--skew: bad ALPHA"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("given 'zipf:x'"), std::string::npos) << bad.err;
  EXPECT_NE(empty.err.find("--skew: expected a comma-separated list without empty items"), std::string::npos) << empty.err;
  EXPECT_NE(file.err.find("--skew: biases generated router logits; a layer file's are its own"), std::string::npos) << file.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("t.json")));
}

TEST(ToolsCli, BenchTakesOnePassPerTuningCache) {
  const Result r = moekit("bench --backend cpu --preset qwen3-30b-a3b --tokens 2 --runs 1 --tuning-cache off,off");
  EXPECT_EQ(r.code, 0) << r.err;
  std::size_t passes = 0;
  for (std::size_t at = r.out.find("tuning cache: off"); at != std::string::npos; at = r.out.find("tuning cache: off", at + 1))
    ++passes;
  EXPECT_EQ(passes, 2u) << r.out;
}

}  // namespace
}  // namespace moekit::test
