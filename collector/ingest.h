#pragma once
// Ingest: what the agents say, checked, put on the cluster clock, and
// written to the timeline store. Keeps the live picture of the cluster
// (nodes, communicators, their members) that queries and detectors read.
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "collector/clock.h"
#include "collector/commit.h"
#include "collector/health.h"
#include "collector/store/timeline_store.h"
#include "collector/validate.h"
#include "common/clock.h"
#include "proto/agent.capnp.h"
#include "proto/codec.h"
#include "proto/drops.h"

namespace rankscope::collector {

namespace wire = ::rankscope::proto::wire;

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
  int64_t wall_offset_ns = 0;    // the node's realtime minus its monotonic clock, from its Hello
  uint64_t clock_violations = 0; // its ranks seen leaving a collective before the last rank arrived
  uint64_t last_contact_ns = 0;  // collector clock
  std::string agent_version;
  std::string boot_id;
  uint64_t instance = 0;
  uint64_t batches = 0;
  uint64_t records = 0;
  uint32_t traced_processes = 0;
  uint32_t unacked_batches = 0;  // the agent's, at its last heartbeat
  uint64_t bad_messages = 0;     // messages, or parts of them, refused (collector/validate.h)
  uint64_t throttled_messages = 0;  // dropped over the per-key rate limit (collector/rate_limit.h)
  // Claims refused because they contradict what a communicator's first
  // announcement bound (its size, a rank's node and pid), or because the
  // node is not a member of what it tried to change (docs/operations.md,
  // "Threat model"). Well-formed, so not bad messages: an attack or a bug.
  uint64_t refused_claims = 0;
  // Its share of the live model (collector/validate.h): the sizes of the live
  // communicators it has members in, and those members.
  uint64_t rank_slots = 0;
  uint32_t memberships = 0;
  DropCounts drops;                     // the agent's, the largest seen of each
  std::map<uint64_t, AckWindow> acked;  // by agent instance: batches already stored (the newest few instances)
  std::map<uint32_t, ProcessHealth> health;  // by pid, from heartbeats
  std::map<uint64_t, CgroupUsage> cgroups;   // by cgroup id, from heartbeats
  uint64_t last_monotonic_ns = 0;            // node clock of the last heartbeat
};

// ncclCommGetAsyncError found the member's communicator broken.
struct CommError {
  uint64_t ns = 0;  // cluster clock
  int32_t result = 0, async_error = 0;
};

struct MemberState {
  int32_t rank = -1;
  std::string node;
  uint32_t pid = 0;
  uint64_t records = 0;
  int64_t last_seq = -1;          // lane 0
  uint64_t last_issue_ns = 0;     // cluster clock
  bool ended = false;             // its process destroyed or aborted the communicator
  std::optional<CommError> error;
};

struct CommState {
  uint64_t hash = 0;
  std::string job;
  int32_t nranks = -1;
  wire::CommOrigin origin = wire::CommOrigin::UNKNOWN;
  std::map<int32_t, MemberState> members;
  std::set<uint32_t> lanes;
  uint64_t first_ns = 0, last_ns = 0;
  bool ended = false;  // every member ended it
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

struct IngestCounters {
  uint64_t batches_stored = 0;
  uint64_t records_stored = 0;
  uint64_t duplicate_batches = 0;
  uint64_t bad_messages = 0;
  uint64_t throttled_messages = 0;
  uint64_t refused_claims = 0;  // NodeState::refused_claims, all nodes
  uint64_t held_batches = 0;    // not taken while the database could not be written (Commit::holding)
  uint64_t batch_bytes = 0;  // wire size of the batches stored
  uint64_t waits = 0;        // host waits on the GPU reported
  uint64_t retired_comms = 0;  // communicators that left the live model (Ingest::retire)
};

// Told about every collective record as it is ingested (the detectors).
class RecordObserver {
 public:
  virtual ~RecordObserver() = default;
  // `record` times are on the cluster clock.
  virtual void on_record(const CommState& comm, int32_t rank, uint32_t lane, const proto::CallRecord& record) = 0;
  // A host wait on the GPU that ended; times on the cluster clock.
  virtual void on_wait(const std::string& node, uint32_t pid, uint64_t start_ns, uint64_t end_ns) {}
};

// Replies to send: some at once, acks only once their batch is durable.
struct Outbox {
  std::vector<std::pair<std::string, std::string>> now;           // (routing id, bytes)
  std::vector<std::pair<std::string, std::string>> after_commit;
};

// Decodes agent messages, applies them to the cluster model, puts their
// records into the commit's WriteSet and acknowledges each batch once the
// commit that holds it is durable. Joins `commit` as its first participant.
class Ingest final : public CommitParticipant {
 public:
  Ingest(TimelineStore& store, Commit& commit, const Clock& clock);

  // Reloads nodes and communicators written by an earlier run.
  Result<void> restore();
  // `key_node`: the node the connection's CurveZMQ key is bound to (collector/auth.h);
  // a Hello for another node is refused. Empty: no key (--insecure), any name.
  void on_agent_message(const std::string& routing_id, std::string_view bytes, Outbox& out,
                        const std::string& key_node = {});
  // A message of this connection dropped by the rate limit: counted for its
  // node (the key's, else the one its Hello named) and logged, rate-limited.
  void on_throttled(const std::string& routing_id, const std::string& key_node, const std::string& why);
  // The commit protocol (collector/commit.h). Staged: the communicators
  // whose members, lanes or size changed (whole, once each), the progress
  // of each member that moved (records, last sequence number: a small row
  // each), and the nodes; the records went in as they were applied. An
  // 8,192-rank communicator is touched by every batch: re-serialising it
  // whole at every commit was a tenth of the collector's time. After a
  // successful Commit::run the acks in out.after_commit may be sent; after
  // a failed one they are not (agents re-send, and a re-send of a batch in
  // the kept set is acknowledged by the commit that writes it).
  Result<void> stage(WriteSet& writes, uint64_t now_ns, bool final) override;
  void committed() override;
  // Takes out of the live model every communicator quiet for `quiet_ns` that
  // is over: every member ended it, or none of its processes is known alive
  // (they exited, or their agents never said). A hung job's processes are
  // alive: its communicators stay. The observers drop what they kept of a
  // communicator that is no longer in comms(). A retired communicator stays
  // in the database (its timeline, `rankscope timeline`), marked retired so
  // that a restart does not load it again. Returns how many were retired.
  size_t retire(uint64_t now_ns, uint64_t quiet_ns);
  // A retired communicator as stored, by hash prefix (lower-case hex), for
  // queries of finished jobs; not_found if none, an error if ambiguous.
  Result<CommState> retired_comm(const std::string& prefix) const;
  void add_observer(RecordObserver* observer) { observers_.push_back(observer); }
  NodeState* node(const std::string& name) {
    auto it = nodes_.find(name);
    return it == nodes_.end() ? nullptr : &it->second;
  }
  const NodeState* node(const std::string& name) const {
    auto it = nodes_.find(name);
    return it == nodes_.end() ? nullptr : &it->second;
  }

  const std::map<std::string, NodeState>& nodes() const { return nodes_; }
  const std::map<uint64_t, CommState>& comms() const { return comms_; }
  // The communicator is in the live model and not ended: what the observers
  // keep state for (they drop the state of the others).
  bool live(uint64_t hash) const {
    auto it = comms_.find(hash);
    return it != comms_.end() && !it->second.ended;
  }
  const IngestCounters& counters() const { return counters_; }
  const ProcessInfo* process(const std::string& node, uint32_t pid) const {
    auto it = processes_.find({node, pid});
    return it == processes_.end() ? nullptr : &it->second;
  }
  uint64_t started_ns() const { return started_ns_; }

 private:
  struct ProcessKey {
    std::string node;
    uint32_t pid;
    bool operator<(const ProcessKey& o) const { return node != o.node ? node < o.node : pid < o.pid; }
  };
  void on_hello(const std::string& routing_id, wire::Hello::Reader hello, Outbox& out, const std::string& key_node);
  void on_batch(NodeState& node, const std::string& routing_id, wire::Batch::Reader batch, size_t wire_bytes,
                Outbox& out);
  void on_heartbeat(NodeState& node, wire::Heartbeat::Reader heartbeat);
  // The communicator (made if new); `changed` is set when what restore
  // needs of it (members, lanes, job, size) changed.
  CommState& comm_for(uint64_t hash, const std::string& node, uint32_t pid, bool& changed);
  // The member `rank`, bound to node/pid by the first claim of it; `changed`
  // is set if that is news. Null (and the claim counted as refused) when the
  // rank is bound to another process, is outside the communicator's size, or
  // would give the node more members than one host has GPUs (kMaxMembersPerNode).
  MemberState* claim_member(NodeState& node, CommState& comm, int32_t rank, uint32_t pid, bool& changed,
                            const char* what);
  void refuse_claim(NodeState& node, const std::string& what);
  // A communicator a refused claim made, with no member: not kept.
  void drop_if_empty(uint64_t hash);
  // The process's agent said it is alive at its last heartbeat.
  bool known_alive(const std::string& node, uint32_t pid) const;
  // Adds (charge) or takes back a communicator's share of its members'
  // nodes: a membership per member, its size once per node (validate.h).
  void charge_nodes(const CommState& comm, bool charge);
  // Charges `node` for a communicator it joins (or whose size became known).
  static uint64_t slots_of(const CommState& comm) { return comm.nranks > 0 ? static_cast<uint64_t>(comm.nranks) : 1; }
  void persist_comm(const CommState& comm, bool retired = false);
  void persist_node(const NodeState& node);
  std::string error_reply(wire::ErrorCode code, const std::string& message) const;
  // Counts (in total and for `node`, null: not identified yet) and logs, rate-limited, one bad message.
  void bad_message(NodeState* node, const std::string& what);

  TimelineStore& store_;
  Commit& commit_;
  WriteSet& pending_;  // commit_'s
  const Clock& clock_;
  std::map<std::string, NodeState> nodes_;
  std::map<std::string, std::string> node_of_connection_;  // routing id -> node name
  std::map<uint64_t, CommState> comms_;
  std::map<ProcessKey, ProcessInfo> processes_;
  struct Uncommitted {
    std::string node;
    uint64_t instance, seq;
  };
  std::vector<Uncommitted> uncommitted_;  // batches marked acked, not yet durable (kept while commits fail)
  uint64_t ack_uses_ = 0;
  std::set<uint64_t> dirty_comms_;        // members, lanes or size changed since the last stage
  std::set<std::pair<uint64_t, int32_t>> dirty_members_;  // (comm, rank) whose progress moved since
  std::set<std::string> dirty_nodes_;
  IngestCounters counters_;
  BadMessageLog bad_log_;
  BadMessageLog throttle_log_;
  BadMessageLog refused_log_;
  uint64_t started_ns_;
  std::vector<RecordObserver*> observers_;
};

}  // namespace rankscope::collector
