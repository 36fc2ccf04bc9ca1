// What the --ep commands (run, bench) share: the check that mpirun started them, and row slices.
#pragma once

#include <cstdint>
#include <string>

#include "moekit/tensor.h"

namespace moekit::cli {

// Throws UsageError unless this process is one of `ep` MPI ranks (and the build has MPI);
// the message shows the mpirun line for `command` ("run", "bench").
void require_mpi_launch(int ep, const std::string& command);

// Rows [first, first + rows) of a [N, C] tensor.
TensorView rows_of(const TensorView& t, std::int64_t first, std::int64_t rows);

}  // namespace moekit::cli
