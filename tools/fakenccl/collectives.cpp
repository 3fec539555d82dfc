#include "tools/fakenccl/collectives.h"

#include <algorithm>
#include <cstring>

namespace rankscope::fakenccl {
namespace {

// A run of elements: [begin, begin + size).
struct Block {
  size_t begin;
  size_t size;
};

// Block `index` of `count` elements cut into `blocks` blocks whose sizes
// differ by at most one.
Block blockOf(size_t count, int blocks, int index) {
  const size_t base = count / blocks;
  const size_t extra = count % blocks;
  const size_t i = static_cast<size_t>(index);
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

const std::byte* at(const void* base, size_t offset) {
  return static_cast<const std::byte*>(base) + offset;
}

std::byte* at(void* base, size_t offset) {
  return static_cast<std::byte*>(base) + offset;
}

// memmove that accepts the empty and in-place copies of in-place collectives.
void copyBytes(void* dst, const void* src, size_t bytes) {
  if (bytes != 0 && dst != src) std::memmove(dst, src, bytes);
}

SegmentHeader header(const CollectiveCall& call, OpKind kind, uint8_t phase, size_t bytes) {
  SegmentHeader h;
  h.kind = static_cast<uint8_t>(kind);
  h.datatype = static_cast<uint8_t>(call.datatype);
  h.phase = phase;
  h.seq = call.seq;
  h.count = call.count;
  h.bytes = bytes;
  return h;
}

// What every segment of a single-phase call looks like.
SegmentHeader header(const CollectiveCall& call, size_t bytes) {
  return header(call, call.kind, 0, bytes);
}

size_t elementSize(const CollectiveCall& call) {
  return datatypeSize(call.datatype);
}

// Reduces the blocks in `slots` (one per rank, `blockBytes` apart) into `dst`,
// after copying this rank's own block into its slot: the inputs of the
// reduction are then never the output, whatever the call's buffers alias.
std::function<void()> reduceSlots(const CollectiveCall& call, int rank, int nranks, std::byte* slots, size_t blockBytes,
                                  const void* own, void* dst, size_t count) {
  return [=] {
    copyBytes(slots + rank * blockBytes, own, blockBytes);
    std::vector<const void*> inputs(nranks);
    for (int r = 0; r < nranks; ++r) inputs[r] = slots + r * blockBytes;
    reduceInOrder(dst, inputs, count, call.datatype, call.reduction);
  };
}

// Reduce-scatter of the blocks, then all-gather of the reduced blocks: rank r
// reduces block r of everyone's input, then sends it to everyone.
void planAllReduce(const CollectiveCall& call, int rank, int nranks, CollectivePlan& plan) {
  const size_t size = elementSize(call);
  const Block mine = blockOf(call.count, nranks, rank);
  const size_t mineBytes = mine.size * size;
  std::byte* slots = plan.allocateScratch(mineBytes * nranks);

  Phase reduce;
  Phase spread;
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer == rank) continue;
    const Block theirs = blockOf(call.count, nranks, peer);
    const size_t theirBytes = theirs.size * size;
    reduce.sends.push_back({peer, header(call, call.kind, 0, theirBytes), at(call.sendbuff, theirs.begin * size)});
    reduce.recvs.push_back({peer, header(call, call.kind, 0, mineBytes), slots + peer * mineBytes});
    spread.sends.push_back({peer, header(call, call.kind, 1, mineBytes), at(call.recvbuff, mine.begin * size)});
    spread.recvs.push_back({peer, header(call, call.kind, 1, theirBytes), at(call.recvbuff, theirs.begin * size)});
  }
  reduce.finish = reduceSlots(call, rank, nranks, slots, mineBytes, at(call.sendbuff, mine.begin * size),
                              at(call.recvbuff, mine.begin * size), mine.size);
  plan.phases.push_back(std::move(reduce));
  plan.phases.push_back(std::move(spread));
}

void planBroadcast(const CollectiveCall& call, int rank, int nranks, Phase& phase) {
  const size_t bytes = call.count * elementSize(call);
  if (rank != call.root) {
    phase.recvs.push_back({call.root, header(call, bytes), call.recvbuff});
    return;
  }
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer != rank) phase.sends.push_back({peer, header(call, bytes), call.sendbuff});
  }
  phase.finish = [=] { copyBytes(call.recvbuff, call.sendbuff, bytes); };
}

void planReduce(const CollectiveCall& call, int rank, int nranks, CollectivePlan& plan, Phase& phase) {
  const size_t bytes = call.count * elementSize(call);
  if (rank != call.root) {
    phase.sends.push_back({call.root, header(call, bytes), call.sendbuff});
    return;
  }
  std::byte* slots = plan.allocateScratch(bytes * nranks);
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer != rank) phase.recvs.push_back({peer, header(call, bytes), slots + peer * bytes});
  }
  phase.finish = reduceSlots(call, rank, nranks, slots, bytes, call.sendbuff, call.recvbuff, call.count);
}

void planAllGather(const CollectiveCall& call, int rank, int nranks, Phase& phase) {
  const size_t bytes = call.count * elementSize(call);
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer == rank) continue;
    phase.sends.push_back({peer, header(call, bytes), call.sendbuff});
    phase.recvs.push_back({peer, header(call, bytes), at(call.recvbuff, peer * bytes)});
  }
  phase.finish = [=] { copyBytes(at(call.recvbuff, rank * bytes), call.sendbuff, bytes); };
}

void planReduceScatter(const CollectiveCall& call, int rank, int nranks, CollectivePlan& plan, Phase& phase) {
  const size_t bytes = call.count * elementSize(call);
  std::byte* slots = plan.allocateScratch(bytes * nranks);
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer == rank) continue;
    phase.sends.push_back({peer, header(call, bytes), at(call.sendbuff, peer * bytes)});
    phase.recvs.push_back({peer, header(call, bytes), slots + peer * bytes});
  }
  phase.finish =
      reduceSlots(call, rank, nranks, slots, bytes, at(call.sendbuff, rank * bytes), call.recvbuff, call.count);
}

void planAlltoAll(const CollectiveCall& call, int rank, int nranks, Phase& phase) {
  const size_t bytes = call.count * elementSize(call);
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer == rank) continue;
    phase.sends.push_back({peer, header(call, bytes), at(call.sendbuff, peer * bytes)});
    phase.recvs.push_back({peer, header(call, bytes), at(call.recvbuff, peer * bytes)});
  }
  phase.finish = [=] { copyBytes(at(call.recvbuff, rank * bytes), at(call.sendbuff, rank * bytes), bytes); };
}

void planGather(const CollectiveCall& call, int rank, int nranks, Phase& phase) {
  const size_t bytes = call.count * elementSize(call);
  if (rank != call.root) {
    phase.sends.push_back({call.root, header(call, bytes), call.sendbuff});
    return;
  }
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer != rank) {
      phase.recvs.push_back({peer, header(call, bytes), at(call.recvbuff, peer * bytes)});
    }
  }
  phase.finish = [=] { copyBytes(at(call.recvbuff, rank * bytes), call.sendbuff, bytes); };
}

void planScatter(const CollectiveCall& call, int rank, int nranks, Phase& phase) {
  const size_t bytes = call.count * elementSize(call);
  if (rank != call.root) {
    phase.recvs.push_back({call.root, header(call, bytes), call.recvbuff});
    return;
  }
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer != rank) {
      phase.sends.push_back({peer, header(call, bytes), at(call.sendbuff, peer * bytes)});
    }
  }
  phase.finish = [=] { copyBytes(call.recvbuff, at(call.sendbuff, rank * bytes), bytes); };
}

// A Recv expects the segment its peer's Send produces.
void planSendRecv(const CollectiveCall& call, int rank, Phase& phase) {
  const size_t bytes = call.count * elementSize(call);
  const SegmentHeader wire = header(call, OpKind::kSend, 0, bytes);
  const bool self = call.root == rank;
  if (call.kind == OpKind::kSend) {
    (self ? phase.selfSends : phase.sends).push_back({call.root, wire, call.sendbuff});
  } else {
    (self ? phase.selfRecvs : phase.recvs).push_back({call.root, wire, call.recvbuff});
  }
}

}  // namespace

const char* opKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllReduce:
      return "AllReduce";
    case OpKind::kBroadcast:
      return "Broadcast";
    case OpKind::kReduce:
      return "Reduce";
    case OpKind::kAllGather:
      return "AllGather";
    case OpKind::kReduceScatter:
      return "ReduceScatter";
    case OpKind::kAlltoAll:
      return "AlltoAll";
    case OpKind::kGather:
      return "Gather";
    case OpKind::kScatter:
      return "Scatter";
    case OpKind::kSend:
      return "Send";
    case OpKind::kRecv:
      return "Recv";
    case OpKind::kCommSplit:
      return "CommSplit";
  }
  return "unknown";
}

std::byte* CollectivePlan::allocateScratch(size_t bytes) {
  scratch.push_back(std::make_unique<std::byte[]>(std::max<size_t>(bytes, 1)));
  return scratch.back().get();
}

std::unique_ptr<CollectivePlan> planCall(const CollectiveCall& call, int rank, int nranks) {
  auto plan = std::make_unique<CollectivePlan>();
  if (call.kind == OpKind::kAllReduce) {
    planAllReduce(call, rank, nranks, *plan);
    return plan;
  }
  Phase phase;
  switch (call.kind) {
    case OpKind::kBroadcast:
      planBroadcast(call, rank, nranks, phase);
      break;
    case OpKind::kReduce:
      planReduce(call, rank, nranks, *plan, phase);
      break;
    case OpKind::kAllGather:
    case OpKind::kCommSplit:
      planAllGather(call, rank, nranks, phase);
      break;
    case OpKind::kReduceScatter:
      planReduceScatter(call, rank, nranks, *plan, phase);
      break;
    case OpKind::kAlltoAll:
      planAlltoAll(call, rank, nranks, phase);
      break;
    case OpKind::kGather:
      planGather(call, rank, nranks, phase);
      break;
    case OpKind::kScatter:
      planScatter(call, rank, nranks, phase);
      break;
    case OpKind::kSend:
    case OpKind::kRecv:
      planSendRecv(call, rank, phase);
      break;
    case OpKind::kAllReduce:
      break;  // planned above
  }
  plan->phases.push_back(std::move(phase));
  return plan;
}

}  // namespace rankscope::fakenccl
