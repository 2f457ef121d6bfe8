// An expert-parallel group over NCCL (built when the CUDA toolkit ships NCCL:
// MOESERVE_HAVE_NCCL). The NCCL unique id travels over an already formed
// bootstrap group (Gloo), and so do the row counts; all-to-all-v is
// ncclSend/ncclRecv pairs inside one ncclGroupStart/End. Host buffers are
// staged through device memory, so the same DispatchRows/CombineRows
// (exchange.hpp) drive it from a CPU-side engine.
#pragma once

#include <memory>

#include "moeserve/kernels/comm/communicator.hpp"

namespace moeserve::kernels::comm {

// True when the build has NCCL and a CUDA device is present.
bool NcclAvailable();

// bootstrap: the same ranks, already connected (its rank and size are used).
// cuda_device: the local GPU this rank drives.
CommResult<std::unique_ptr<Communicator>> JoinNcclGroup(Communicator& bootstrap, int cuda_device);

}  // namespace moeserve::kernels::comm
