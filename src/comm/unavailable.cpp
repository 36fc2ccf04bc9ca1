// The transports this build lacks: each entry point says so with an Error.
#include <cstdlib>

#include "moekit/comm.h"

namespace moekit {

#ifndef MOEKIT_HAVE_MPI
bool mpi_available() { return false; }
std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions&) {
  throw Error("mpi communicator: this build has no MPI (configure with MOEKIT_WITH_MPI=ON and an MPI installed)");
}
MpiSession::MpiSession(int*, char***) {
  throw Error("MpiSession: this build has no MPI (configure with MOEKIT_WITH_MPI=ON and an MPI installed)");
}
MpiSession::~MpiSession() = default;
int MpiSession::world_rank() const { return 0; }
int MpiSession::world_size() const { return 1; }
int MpiSession::local_rank() const { return 0; }
void MpiSession::abort(int code) const { std::_Exit(code); }
#endif

#ifndef MOEKIT_HAVE_NCCL
bool nccl_available() { return false; }
std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, int, const CommOptions&) {
  throw Error("nccl communicator: this build has no NCCL (it needs CUDA and NCCL found at configure time)");
}
#endif

}  // namespace moekit
