// `moekit presets` and `moekit explain`: what moekit knows and what it would choose.
#include <cstdio>

#include "commands.h"
#include "io/presets.h"
#include "run_setup.h"

#ifdef MOEKIT_HAVE_CUDA
#include "cuda/common/device.h"
#endif

namespace moekit::cli {

int cmd_presets(int argc, char** argv) {
  const Args args(argc, argv, 2, {});
  std::printf("%s", io::presets_table().c_str());
  return 0;
}

int cmd_explain(int argc, char** argv) {
  std::vector<Flag> flags = problem_flags();
  flags.push_back({"help", false, "this text"});
  const Args args(argc, argv, 2, flags);
  if (args.has("help")) {
    std::printf("%s", usage_of("explain", flags).c_str());
    return 0;
  }
  // Without a problem, explain the first preset: the decisions still show every backend.
  const MoEConfig config =
      args.has("preset") || args.has("inputs") ? config_from_args(args) : io::presets().front().config;
  const BackendSelection selection = explain_backends(config, args.get("backend", "auto"));
#ifdef MOEKIT_HAVE_CUDA
  std::printf("gpu: %s\n", cuda::device_info().to_string().c_str());
#else
  std::printf("gpu: not looked for (built without CUDA)\n");
#endif
  std::printf("problem: %s\n%s", config.to_string().c_str(), selection.to_string().c_str());
  return selection.chosen.empty() ? 1 : 0;
}

}  // namespace moekit::cli
