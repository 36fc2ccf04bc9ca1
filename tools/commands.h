// The subcommands of the moekit command line. Each returns the process exit code.
#pragma once

namespace moekit::cli {

int cmd_run(int argc, char** argv);
class Args;
// The run with --ep N > 1, under mpirun (cmd_run_ep.cpp).
int cmd_run_ep(const Args& args);
int cmd_presets(int argc, char** argv);
int cmd_version(int argc, char** argv);
int cmd_explain(int argc, char** argv);
int cmd_bench(int argc, char** argv);
// The bench with --ep N > 1, under mpirun (cmd_bench_ep.cpp).
int cmd_bench_ep(const Args& args);
// Measured tactic choice with a persistent cache (cmd_tune.cpp, docs/TUNE.md).
int cmd_tune(int argc, char** argv);
// The differential campaign of issue #19 (cmd_fuzz.cpp, docs/FUZZ.md).
int cmd_fuzz(int argc, char** argv);

}  // namespace moekit::cli
