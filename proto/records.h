#pragma once
// The plain C++ form of one NCCL call record, as the agent builds it and the
// collector stores it, and the names of NCCL's codes. The numeric codes are
// those of bpf/nccl_events.h (ops) and nccl.h (datatypes, reductions).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "bpf/nccl_events.h"

namespace rankscope::proto {

// The GPU side of one collective of one process (NCCL's profiler plugin),
// on the agent's clock (the collector's: on the cluster clock).
struct GpuRecord {
  uint64_t seq = 0;              // NCCL's seqNumber, per communicator and op
  uint64_t count = 0;            // elements
  uint64_t enqueued_ns = 0;      // NCCL enqueued it
  uint64_t kernel_start_ns = 0;  // its first channel's kernel started
  uint64_t kernel_end_ns = 0;    // its last channel's kernel stopped
  // Its send link that waited longest on the network (NCCL's proxy steps,
  // while the agent asks for them): the peer, and for how long its
  // transfers to that peer were posted and not yet done. -1 and 0: not seen.
  int32_t link_peer = -1;
  uint64_t link_wait_ns = 0;
  bool operator==(const GpuRecord&) const = default;
};

struct CallRecord {
  uint64_t seq = 0;
  uint64_t issue_ns = 0;   // entry of the API call: when the work was enqueued
  uint64_t return_ns = 0;  // return of the API call
  uint64_t count = 0;      // element count as passed
  int32_t peer = -1;       // root or peer, -1 when none
  uint8_t op = 0;          // enum rs_nccl_op
  uint8_t datatype = 0;    // ncclDataType_t
  uint8_t redop = 0;       // ncclRedOp_t
  uint8_t result = 0;      // ncclResult_t
  uint8_t flags = 0;       // enum rs_call_flag

  bool operator==(const CallRecord&) const = default;
};

// "AllReduce", "Send", ...; "op<N>" for a code this build does not know.
std::string op_name(uint8_t op);
// Parses op_name's output back; returns RS_OP_NONE if unknown.
uint8_t op_from_name(std::string_view name);
bool op_is_collective(uint8_t op);
// "float32", "bfloat16", ...; "type<N>" if unknown.
std::string datatype_name(uint8_t datatype);
// Size in bytes of one element (ncclDataType_t), 0 if unknown.
size_t datatype_size(uint8_t datatype);
// "sum", "prod", "max", "min", "avg", or "op<N>" (ncclRedOpCreate*'s ops).
std::string redop_name(uint8_t redop);
// count x element size: the bytes this rank passes to the call.
uint64_t record_bytes(const CallRecord& record);
// "ncclSuccess"-style names of ncclResult_t.
std::string result_name(int32_t result);

// A communicator's identity on every member: NCCL's own commHash (what its
// profiler plugin reports), the hash of the ncclUniqueId it was made from...
uint64_t comm_hash_of_unique_id(const uint8_t* id, size_t len);
// ...or, for a child of ncclCommSplit, of its parent's hash, how many splits
// of the parent there have been counting this one (NCCL_SPLIT_NOCOLOR ones
// too), and its color.
uint64_t comm_hash_of_split(uint64_t parent_hash, int32_t child_count, int32_t color);

}  // namespace rankscope::proto
