#pragma once
// What the collector accepts from an agent, beyond what Cap'n Proto's own
// limits (size, traversal, nesting: proto::ReadLimits) already refuse.
//
// Packed Cap'n Proto turns runs of zero words into a couple of bytes, so a
// frame of a few kilobytes can name lists of millions of empty entries; each
// would then cost the collector real work (a clock fit, a RocksDB write, a
// detector slot). The bounds below are far above what an agent sends in one
// message and far below what would stall the collector loop. A message
// past one of them is refused whole; an entry whose fields are out of range
// (a rank outside its communicator...) is skipped. Either way it is counted
// as a bad message of that peer (BadMessageLog).
#include <cstdint>
#include <map>
#include <string>

#include "common/result.h"
#include "proto/agent.capnp.h"
#include "proto/codec.h"
#include "proto/limits.h"

namespace rankscope::collector {

namespace wire = ::rankscope::proto::wire;

using proto::kMaxClockSamples;  // proto/limits.h: the agent keeps within them too
using proto::kMaxListEntries;
using proto::kMaxRecordsPerBatch;
inline constexpr int32_t kMaxRanks = 1 << 16;  // ranks of one communicator (a rank is below it)
// Ranks of one communicator on one node: one per GPU, and a host has at most
// a few dozen (an NVL72 tray has 4; the largest HGX boards 8 to 16). Without
// it one node could claim every rank of a 65,536-rank communicator.
inline constexpr size_t kMaxMembersPerNode = 256;
// What one node's processes may make the collector keep, whoever runs them.
// Every observer keeps per-rank state for a communicator it tracks (sized by
// its announced rank count), so a node is charged, per live communicator it
// has members in, that communicator's size: its rank slots. A 65,536-rank
// job's node has one such communicator and a few small ones; a user's stand-in
// libnccl.so announcing communicators of 65,536 ranks in a loop reaches the
// cap after 16, and its further claims are refused (counted). Communicators
// leave the live model when retired (Ingest::retire), and give their slots back.
inline constexpr uint64_t kMaxRankSlotsPerNode = uint64_t{1} << 20;
// ... and members: one per (communicator, rank) claimed by the node's processes.
inline constexpr uint32_t kMaxMembershipsPerNode = 1 << 16;
using proto::kRecordsFloor;
using proto::kRecordsPerWireByte;
// A record stamped this far past the collector's clock (after the node's
// clock correction) is refused: it would stand for the newest data and move
// the disk-cap retention's cut-off past everything real.
inline constexpr uint64_t kMaxFutureNs = 3600'000'000'000ull;
inline constexpr size_t kMaxNodeName = 255;

// The list lengths and record counts of a batch (against its size on the
// wire, `wire_bytes`: kRecordsPerWireByte); nothing else is read.
Result<void> check_batch(wire::Batch::Reader batch, size_t wire_bytes);
Result<void> check_heartbeat(wire::Heartbeat::Reader heartbeat);
// A communicator as a member created it: 1 <= nranks <= kMaxRanks, 0 <= rank < nranks.
Result<void> check_comm(wire::Comm::Reader comm);
// A decoded block of collectives: its rank -1 (unknown) or below kMaxRanks.
Result<void> check_block(const proto::ColumnBlock& block);
// A process's identity: ranks and world size -1 (unknown) or in range.
Result<void> check_process(wire::Process::Reader process);
// 1 to 255 printable ASCII characters, no space (it becomes a key, a log
// word and a metric label).
Result<void> check_node_name(const std::string& name);

// Logs bad messages per peer, at most once per interval each, with the
// number not logged since; counts them per peer.
class BadMessageLog {
 public:
  static constexpr uint64_t kIntervalNs = 10'000'000'000ull;
  // `peer`: a node name, or a description of an unidentified connection.
  // Returns whether a line was logged.
  bool report(const std::string& peer, const std::string& what, uint64_t now_ns);

 private:
  struct Peer {
    uint64_t logged_ns = 0;
    uint64_t suppressed = 0;
  };
  static constexpr size_t kMaxPeers = 4096;  // peers remembered for rate limiting
  std::map<std::string, Peer> peers_;
};

}  // namespace rankscope::collector
