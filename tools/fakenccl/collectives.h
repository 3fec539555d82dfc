// Each NCCL call as a plan of segment exchanges and local work.
//
// The algorithms are chosen for determinism, not speed: every reduced element
// is computed by exactly one rank, in rank order, and copied to the others,
// so all ranks end with the same bits.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "tools/fakenccl/mesh.h"
#include "tools/fakenccl/reduce.h"

namespace rankscope::fakenccl {

// Values travel in SegmentHeader::kind.
enum class OpKind : uint8_t {
  kAllReduce = 1,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAlltoAll,
  kGather,
  kScatter,
  kSend,
  kRecv,
  kCommSplit,  // the exchange of colors and keys inside ncclCommSplit
};

const char* opKindName(OpKind kind);  // "AllReduce", ...

// One validated call on a communicator. `count` is the count argument as the
// call takes it (AllGather's sendcount, ReduceScatter's recvcount, ...).
struct CollectiveCall {
  OpKind kind = OpKind::kAllReduce;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;
  ncclDataType_t datatype = ncclInt8;
  Reduction reduction;  // reducing collectives only
  int root = 0;         // the root rank; for Send/Recv, the peer
  cudaStream_t stream = nullptr;
  uint64_t issue = 0;  // this rank's order of calls on the communicator
  uint64_t seq = 0;    // SegmentHeader::seq, equal on the ranks that must match
  void* profilerEvent = nullptr;  // the profiler plugin's handle of it (profiler.h), if any
  int profilerMask = 0;           // the plugin's activation mask when it was enqueued
};

// A step of a call: segments that move together, then local work on what
// arrived (a reduction, a copy of this rank's own block).
struct Phase {
  std::vector<SendSegment> sends;
  std::vector<RecvSegment> recvs;
  // Transfers between this rank and itself (Send/Recv with peer == rank):
  // matched in order within one group and copied, never put on the wire.
  std::vector<SendSegment> selfSends;
  std::vector<RecvSegment> selfRecvs;
  std::function<void()> finish;  // may be empty
};

// How one call runs on one rank. Owns the scratch memory its phases point
// into, so it must outlive their execution.
struct CollectivePlan {
  std::vector<Phase> phases;
  std::vector<std::unique_ptr<std::byte[]>> scratch;

  std::byte* allocateScratch(size_t bytes);
};

// The plan of `call` for `rank` of `nranks`. The call's buffers are only
// touched when the phases run (by then the stream has reached the call).
std::unique_ptr<CollectivePlan> planCall(const CollectiveCall& call, int rank, int nranks);

}  // namespace rankscope::fakenccl
