// Putting calls on streams, and nccl.h's group semantics: inside
// ncclGroupStart/ncclGroupEnd calls are only collected; the outermost
// ncclGroupEnd launches them ("Nothing will be started on the CUDA stream
// until ncclGroupEnd").
#pragma once

#include <nccl.h>

#include <functional>
#include <memory>

#include "tools/fakenccl/collectives.h"
#include "tools/fakenccl/comm.h"

namespace rankscope::fakenccl {

// Numbers a validated call and queues it on its stream, or, inside a group,
// keeps it for the outermost ncclGroupEnd. Returns once queued, never after
// the data has moved: collectives "return when operations have been
// enqueued on the CUDA stream" (nccl.h).
ncclResult_t submit(const std::shared_ptr<Communicator>& comm, CollectiveCall call);

// A communicator initialisation: now, or inside a group at the outermost
// ncclGroupEnd, which runs all of them concurrently (how one thread creates
// several ranks, nccl.h on ncclCommInitRank).
ncclResult_t submitInit(std::function<ncclResult_t()> init);

bool inGroup();
void groupStart();
ncclResult_t groupEnd();

}  // namespace rankscope::fakenccl
