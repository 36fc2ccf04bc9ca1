#include "ep_ranks.h"

#include <cstdlib>

#include "cli_args.h"
#include "moekit/comm.h"

namespace moekit::cli {

void require_mpi_launch(int ep, const std::string& command) {
  if (!mpi_available()) throw UsageError("--ep: this build has no MPI (configure with MOEKIT_WITH_MPI=ON)");
  const char* launched = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (!launched) launched = std::getenv("PMI_SIZE");
  if (!launched || std::atoi(launched) != ep)
    throw UsageError("--ep " + std::to_string(ep) + ": start " + std::to_string(ep) + " ranks: mpirun -np " +
                     std::to_string(ep) + " moekit " + command + " --ep " + std::to_string(ep) + " ... (this process is " +
                     (launched ? std::string("one of ") + launched + " ranks" : std::string("not under mpirun")) + ")");
}

TensorView rows_of(const TensorView& t, std::int64_t first, std::int64_t rows) {
  return TensorView::contiguous(static_cast<std::byte*>(t.data) + std::size_t(first * t.size(1)) * dtype_size(t.dtype),
                                t.dtype, {rows, t.size(1)}, t.device);
}

}  // namespace moekit::cli
