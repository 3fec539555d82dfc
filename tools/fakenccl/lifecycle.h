// Making communicators: from a unique id (ncclCommInitRank*), all ranks in
// one process (ncclCommInitAll), and from a parent (ncclCommSplit).
#pragma once

#include <nccl.h>

#include <memory>

#include "tools/fakenccl/comm.h"

namespace rankscope::fakenccl {

// Rank `rank` of `nranks` of the communicator `id` names, on CUDA `device`.
// Blocks until all ranks have arrived. `api` names the caller in messages.
ncclResult_t initRank(const char* api, ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank, int device);

// ncclCommInitAll: comms[i] is rank i, on devices[i] (or device i).
ncclResult_t initAll(ncclComm_t* comms, int ndev, const int* devices);

// ncclCommSplit: the ranks of `parent` that pass the same color form a new
// communicator, ordered by key then parent rank; NCCL_SPLIT_NOCOLOR joins
// none and gets NULL. Every rank of the parent must call it.
ncclResult_t splitCommunicator(const std::shared_ptr<Communicator>& parent, int color, int key, ncclComm_t* child);

}  // namespace rankscope::fakenccl
