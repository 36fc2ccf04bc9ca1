// The moekit command line: dispatches to the subcommands.
#include <cstdio>

int main() {
  std::fprintf(stderr, "moekit: the command line is being assembled\n");
  return 2;
}
