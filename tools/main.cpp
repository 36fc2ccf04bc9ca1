// The moekit command line: one line per error on stderr; exit 2 for usage, 1 for failures.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli_args.h"
#include "commands.h"
#include "moekit/moekit.h"

namespace {

const char* kUsage =
    "usage: moekit <command> [flags]\n"
    "  run       one forward pass of a preset, a layer file or a checkpoint layer\n"
    "  presets   the model presets\n"
    "  explain   the backend decisions for the problem run would run (same flags), with reasons\n"
    "  bench     time per case against the roofline (DESIGN §9)\n"
    "  tune      time the GPU's tactics per token bucket and write the tuning cache (docs/TUNE.md)\n"
    "  fuzz      random problems on a backend against the CPU references (DESIGN §8), refusals by name\n"
    "  version   the version\n"
    "moekit <command> -h (or --help): the flags of a command\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace moekit::cli;
  if (argc < 2) {
    std::fprintf(stderr, "usage: moekit <run|presets|explain|bench|tune|fuzz|version> [flags] (moekit --help)\n");
    return 2;
  }
  if (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "help") == 0) {
    std::printf("%s", kUsage);
    return 0;
  }
  const std::string command = argv[1];
  try {
    if (command == "run") return cmd_run(argc, argv);
    if (command == "presets") return cmd_presets(argc, argv);
    if (command == "explain") return cmd_explain(argc, argv);
    if (command == "bench") return cmd_bench(argc, argv);
    if (command == "tune") return cmd_tune(argc, argv);
    if (command == "fuzz") return cmd_fuzz(argc, argv);
    if (command == "version") return cmd_version(argc, argv);
    throw UsageError("unknown command '" + command + "' (run|presets|explain|bench|tune|fuzz|version)");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "moekit %s: %s\n", command.c_str(), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit %s: error: %s\n", command.c_str(), e.what());
    return 1;
  }
}
