#pragma once
// The live picture of the cluster that the ingest keeps and every later
// stage reads: nodes (clock, drops, health, stored-batch windows),
// communicators and their members, and who each traced process is. Plain
// data: no RocksDB, no Cap'n Proto (the ingest converts from the wire and
// to the store).
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "collector/model/clock.h"
#include "collector/model/health.h"
#include "common/drops.h"
#include "proto/records.h"

namespace rankscope::collector {

// How a communicator was made, as its members' agents saw it (the wire's
// CommOrigin, with the same values).
enum class CommOrigin : uint8_t { init_rank = 0, init_rank_config = 1, init_all = 2, split = 3, unknown = 4 };

// The batch numbers of one agent instance already stored: everything up to
// `through`, and a few above it (acks may come back out of order after a
// refused or re-sent batch). Bounded: past kMaxAbove the lowest are forgotten
// (a forgotten batch sent again is stored again: same keys, same values).
struct AckWindow {
  static constexpr size_t kMaxAbove = 4096;
  uint64_t through = 0;
  std::set<uint64_t> above;
  uint64_t last_used = 0;  // order of use, for keeping the newest instances
  bool contains(uint64_t seq) const { return (seq >= 1 && seq <= through) || above.count(seq) > 0; }
  void insert(uint64_t seq);
};

// One cgroup's use of a node (from the heartbeats' CgroupUsage).
struct CgroupSample {
  uint64_t ns = 0;  // node clock
  uint64_t cpu_ns = 0, involuntary_switches = 0, tcp_retransmits = 0;
};
class CgroupUsage {
 public:
  std::string path;
  void add(const CgroupSample& sample) {
    samples_.push_back(sample);
    if (samples_.size() > 64) samples_.pop_front();
  }
  uint64_t last_ns() const { return samples_.empty() ? 0 : samples_.back().ns; }
  // CPUs used on average and retransmits, over about the last window_ns (node clock, up to now_ns).
  struct Rate {
    double cpus = 0;
    uint64_t tcp_retransmits = 0;
    bool known = false;
  };
  Rate rate(uint64_t now_ns, uint64_t window_ns) const;

 private:
  std::deque<CgroupSample> samples_;
};

struct NodeState {
  std::string name;
  NodeClock clock;
  int64_t wall_offset_ns = 0;     // the node's realtime minus its monotonic clock, from its Hello
  uint64_t clock_violations = 0;  // its ranks seen leaving a collective before the last rank arrived
  uint64_t last_contact_ns = 0;   // collector clock
  std::string agent_version;
  std::string boot_id;
  uint64_t instance = 0;
  uint64_t batches = 0;
  uint64_t records = 0;
  uint32_t traced_processes = 0;
  uint32_t unacked_batches = 0;     // the agent's, at its last heartbeat
  uint64_t bad_messages = 0;        // messages, or parts of them, refused (collector/ingest/validate.h)
  uint64_t throttled_messages = 0;  // dropped over the per-key rate limit (collector/ingest/rate_limit.h)
  // Claims refused because they contradict what a communicator's first
  // announcement bound (its size, a rank's node and pid), or because the
  // node is not a member of what it tried to change (docs/operations.md,
  // "Threat model"). Well-formed, so not bad messages: an attack or a bug.
  uint64_t refused_claims = 0;
  // Its share of the live model (collector/ingest/validate.h): the sizes of the live
  // communicators it has members in, and those members.
  uint64_t rank_slots = 0;
  uint32_t memberships = 0;
  std::map<uint64_t, uint32_t> ranks_in;     // live communicator -> how many of its members are this node's
  DropCounts drops;                          // the agent's, the largest seen of each
  std::map<uint64_t, AckWindow> acked;       // by agent instance: batches already stored (the newest few instances)
  std::map<uint32_t, ProcessHealth> health;  // by pid, from heartbeats
  std::map<uint64_t, CgroupUsage> cgroups;   // by cgroup id, from heartbeats
  uint64_t last_monotonic_ns = 0;            // node clock of the last heartbeat
  // Cluster clock: what its agent captured up to then has been applied
  // here (the close of its latest batch applied with none missing before
  // it, or a heartbeat that said every batch of it was acknowledged); 0:
  // not known. A collector behind judges a hang only on what the missing
  // ranks' nodes have told it (collector/detect/hang.cpp).
  uint64_t reported_ns = 0;
  uint64_t closed_ns = 0;  // the close of its latest batch applied, a gap before it or not
  // A batch of its current agent instance missing while a later one is
  // stored (lost on the way and to be sent again, or re-ordered): until it
  // comes, its processes' histories lack what it holds (the detector waits
  // for it: Detector::Completed::gaps). The lowest missing batch number (0:
  // none), since when (collector clock), and the highest batch number stored.
  uint64_t gap_seq = 0;
  uint64_t gap_since_ns = 0;
  uint64_t top_seq = 0;
  // The communicators whose NCCL proxy steps its agent was last asked for
  // (collector/detect/detail.h); empty: none.
  std::vector<uint64_t> detail_asked;
  bool takes_detail = false;  // its agent said in its hello that it reads DetailRequest
  bool follows_fleet = false;  // ... that it reads FleetMap (sends each job's batches to its owner)
};

// How long a missing batch is waited for: an agent re-sends a batch not
// acknowledged within 2 s, and the round trip adds to it. Past it the
// collectives that waited are scored on what is known (a batch held back by
// the collector itself, or lost for good, must not blind the detector).
constexpr uint64_t kBatchGapWaitNs = 3'000'000'000ull;

// ncclCommGetAsyncError found the member's communicator broken.
struct CommError {
  uint64_t ns = 0;  // cluster clock
  int32_t result = 0, async_error = 0;
};

struct MemberState {
  int32_t rank = -1;
  // A split child's member: the rank its agent names it by (its rank in the
  // communicator the chain of splits began from: the agent cannot know its
  // rank in the child), its rank in the parent, and the key it gave
  // ncclCommSplit. -1: not a split child's member.
  int32_t announced_rank = -1;
  int32_t parent_rank = -1;
  int32_t split_key = 0;
  std::string node;
  uint32_t pid = 0;
  uint64_t records = 0;
  int64_t last_seq = -1;       // lane 0
  uint64_t last_issue_ns = 0;  // cluster clock
  bool ended = false;          // its process destroyed or aborted the communicator
  bool progress_dirty = false;  // records came since its progress row was staged (Ingest)
  std::optional<CommError> error;
};

// A child of ncclCommSplit. NCCL sizes it by the parent's ranks that gave
// its color and ranks them by (key, parent rank); no one agent knows either,
// so its members are announced by their parent ranks, and the collector
// derives both once every rank of the parent has said what it did in that
// split (collector/ingest/split.cpp). Until then (pending) its records wait
// with the agents; a child that cannot be sized (its parent unknown, a
// member never heard of) is abandoned: kept by parent ranks, never matched.
enum class SplitSizing : uint8_t { none = 0, pending = 1, derived = 2, abandoned = 3 };
// NCCL_SPLIT_NOCOLOR (nccl.h): a member of the split that gets no child.
constexpr int32_t kSplitNoColor = -1;
struct SplitOf {
  uint64_t parent = 0;
  int32_t index = 0;  // NCCL's childCount of the parent: 1 for its first split
  int32_t color = 0;  // kSplitNoColor: the members of the split that got no child
  SplitSizing sizing = SplitSizing::none;
  uint64_t since_ns = 0;  // collector realtime, when first heard of
};

struct CommState {
  uint64_t hash = 0;
  std::string job;
  int32_t nranks = -1;
  CommOrigin origin = CommOrigin::unknown;
  std::map<int32_t, MemberState> members;
  std::set<uint32_t> lanes;
  uint64_t first_ns = 0, last_ns = 0;
  bool ended = false;  // every member ended it
  SplitOf split;       // a child of ncclCommSplit
  std::map<int32_t, int32_t> rank_of_announced;  // a derived split child's ranks, by announced rank
};

// Who a traced process is, as its agent identified it.
struct ProcessInfo {
  std::string job;
  int32_t rank = -1;
  int32_t local_rank = -1;
  int32_t world_size = -1;
  std::string user;
  std::string account;
  std::string visible_devices;  // CUDA_VISIBLE_DEVICES
  std::string slurm_step;
  std::string pod_uid;
  std::string pod_namespace, pod_name;
  std::string container_id;
  std::vector<int32_t> cuda_devices;  // chosen with cudaSetDevice, in order
  uint64_t cgroup_id = 0;
  std::string cgroup_path;
  uint64_t start_time = 0;  // /proc/PID/stat field 22 (clock ticks since boot); 0 unknown
  // The GPU it most likely drives: its one visible device, or the one its
  // local rank selects among several (cudaSetDevice(local_rank) is the
  // convention of torchrun and Slurm launchers); "" when unknown.
  std::string gpu() const;
};

// The live model: what the ingest keeps and every later stage reads
// (through a const reference). Tests of the detectors build one by hand.
// What the clock refiner (model/clock_refine.h) found since its last
// update, for the model's owner to apply.
struct ClockAdjustments {
  std::map<std::string, int64_t> refinement_ns;  // node -> its new refinement (NodeClock::set_refinement)
  std::map<std::string, uint64_t> violations;    // node -> ranks seen leaving a collective before its last arrival
};

struct ClusterModel {
  struct ProcessKey {
    std::string node;
    uint32_t pid;
    bool operator<(const ProcessKey& o) const { return node != o.node ? node < o.node : pid < o.pid; }
  };
  std::map<std::string, NodeState> nodes;
  std::map<uint64_t, CommState> comms;
  std::map<ProcessKey, ProcessInfo> processes;
  // The children of each split not sized yet, by (parent, split index),
  // with the members that got no child (collector/ingest/split.cpp).
  std::map<std::pair<uint64_t, int32_t>, std::set<uint64_t>> pending_splits;
  uint64_t started_ns = 0;  // when this collector started (realtime): nodes unheard of since are not yet silent
  // When the collector last found the agents' socket empty (realtime; 0:
  // never told): what a node sent before then has been read. A node unheard
  // of since a time after it may have spoken, its words waiting unread
  // behind a busy loop.
  uint64_t drained_ns = 0;
  // The nodes with a batch missing (NodeState::gap_seq): name -> since (collector clock).
  std::map<std::string, uint64_t> gaps;

  const NodeState* node(const std::string& name) const {
    auto it = nodes.find(name);
    return it == nodes.end() ? nullptr : &it->second;
  }
  const ProcessInfo* process(const std::string& node, uint32_t pid) const {
    auto it = processes.find({node, pid});
    return it == processes.end() ? nullptr : &it->second;
  }
  // The communicator is in the live model and not ended: what the observers
  // keep state for (they drop the state of the others).
  bool live(uint64_t hash) const {
    auto it = comms.find(hash);
    return it != comms.end() && !it->second.ended;
  }
  // Applies what the clock refiner found (nodes not in the model are
  // skipped), from now_ns on (the collector's clock).
  void adjust_clocks(const ClockAdjustments& adjustments, uint64_t now_ns) {
    for (const auto& [name, refinement] : adjustments.refinement_ns)
      if (auto it = nodes.find(name); it != nodes.end()) it->second.clock.set_refinement(refinement, now_ns);
    for (const auto& [name, count] : adjustments.violations)
      if (auto it = nodes.find(name); it != nodes.end()) it->second.clock_violations += count;
  }
};

// A host wait on the GPU that ended (cudaStreamSynchronize...), on the cluster clock.
struct HostWait {
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
};

// Told about every collective record as the ingest applies it to the model
// (the matcher, the clock refiner, the usage ledger), a block at a time: an
// observer looks its communicator, member and process up once per block,
// not per record.
class RecordObserver {
 public:
  virtual ~RecordObserver() = default;
  // One member's records of one lane, in the order its agent sent them;
  // times on the cluster clock.
  virtual void on_records(const CommState& comm, int32_t rank, uint32_t lane,
                          std::span<const proto::CallRecord> records) {}
  // One thread's host waits that ended, in start order.
  virtual void on_waits(const std::string& node, uint32_t pid, std::span<const HostWait> waits) {}
  // A block of one.
  void on_record(const CommState& comm, int32_t rank, uint32_t lane, const proto::CallRecord& record) {
    on_records(comm, rank, lane, std::span<const proto::CallRecord>(&record, 1));
  }
  void on_wait(const std::string& node, uint32_t pid, uint64_t start_ns, uint64_t end_ns) {
    const HostWait wait{start_ns, end_ns};
    on_waits(node, pid, std::span<const HostWait>(&wait, 1));
  }
  // The GPU side of a member's collective (op, NCCL's seqNumber per
  // communicator and op), from NCCL's profiler plugin; times on the cluster clock.
  virtual void on_gpu(const CommState& comm, int32_t rank, uint8_t op, const proto::GpuRecord& record) {}
};

}  // namespace rankscope::collector
