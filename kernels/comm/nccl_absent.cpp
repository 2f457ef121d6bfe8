// Without NCCL in the build, the NCCL group says so instead of failing to link.
#include "moeserve/kernels/comm/nccl_group.hpp"

#ifndef MOESERVE_HAVE_NCCL
namespace moeserve::kernels::comm {

bool NcclAvailable() { return false; }

CommResult<std::unique_ptr<Communicator>> JoinNcclGroup(Communicator&, int) {
  return CommFail("nccl: this build has no NCCL (the CUDA toolkit's libnccl was not found at configure time)");
}

}  // namespace moeserve::kernels::comm
#endif
