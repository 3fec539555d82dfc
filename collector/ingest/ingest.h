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

#include "collector/commit.h"
#include "collector/ingest/acks.h"
#include "collector/ingest/validate.h"
#include "collector/model/cluster.h"
#include "collector/store/timeline_store.h"
#include "common/clock.h"
#include "proto/agent.capnp.h"
#include "proto/codec.h"
#include "proto/drops.h"

namespace rankscope::collector {

namespace wire = ::rankscope::proto::wire;

// The model's CommOrigin is the wire's, value for value.
static_assert(static_cast<int>(wire::CommOrigin::UNKNOWN) == static_cast<int>(CommOrigin::unknown) &&
              static_cast<int>(wire::CommOrigin::INIT_RANK) == static_cast<int>(CommOrigin::init_rank) &&
              static_cast<int>(wire::CommOrigin::INIT_RANK_CONFIG) == static_cast<int>(CommOrigin::init_rank_config) &&
              static_cast<int>(wire::CommOrigin::INIT_ALL) == static_cast<int>(CommOrigin::init_all) &&
              static_cast<int>(wire::CommOrigin::SPLIT) == static_cast<int>(CommOrigin::split));
// A value past the ones known reads as unknown.
inline CommOrigin from_wire(wire::CommOrigin origin) {
  auto value = static_cast<uint16_t>(origin);
  return value <= static_cast<uint16_t>(CommOrigin::unknown) ? static_cast<CommOrigin>(value) : CommOrigin::unknown;
}
inline wire::CommOrigin to_wire(CommOrigin origin) {
  return static_cast<wire::CommOrigin>(origin);
}

struct IngestCounters {
  uint64_t batches_stored = 0;
  uint64_t records_stored = 0;
  uint64_t duplicate_batches = 0;
  uint64_t bad_messages = 0;
  uint64_t throttled_messages = 0;
  uint64_t clock_probes = 0;    // answered on the agents' socket (not by collector/clock_responder.h)
  uint64_t refused_claims = 0;  // NodeState::refused_claims, all nodes
  uint64_t held_batches = 0;    // not taken while the database could not be written (Commit::holding)
  uint64_t batch_bytes = 0;     // wire size of the batches stored
  uint64_t waits = 0;           // host waits on the GPU reported
  uint64_t gpu_records = 0;     // GPU-side records of collectives taken (NCCL's profiler plugin)
  uint64_t gpu_unmatched = 0;   // ... not taken: their communicator or member is not known (yet), or they were
                                // claimed for a member another node or process holds
  uint64_t retired_comms = 0;   // communicators that left the live model (Ingest::retire)
  uint64_t splits_sized = 0;    // children of ncclCommSplit whose size and ranks were derived (ingest/split.cpp)
  uint64_t splits_abandoned = 0;  // children that could not be: kept, never matched
  uint64_t split_waits = 0;     // batches sent back to wait for a split's sizing (not acknowledged)
};

// How long a split child's records wait for every rank of its parent to say
// what it did in the split; past it the child is abandoned (ingest/split.cpp).
constexpr uint64_t kSplitSizingGraceNs = 20'000'000'000ull;

// Replies to send: some at once, acks only once their batch is durable.
// A member of the fleet as agents are told of it (wire FleetMember).
struct FleetEntry {
  std::string id, agents, public_key;
  bool operator==(const FleetEntry& o) const { return id == o.id && agents == o.agents && public_key == o.public_key; }
};

struct Outbox {
  std::vector<std::pair<std::string, std::string>> now;  // (routing id, bytes)
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
  // A clock probe answered the moment it is read, ahead of the messages
  // read before it: true (the reply in out.now) when `bytes` is a probe on a
  // connection whose Hello was applied, under its own key; false for
  // anything else, to go through on_agent_message in its turn. Its `t2` is
  // stamped here, so a probe that waited behind other agents' batches does
  // not read as a long way in (the node's offset off by half the wait).
  bool answer_clock_probe(const std::string& routing_id, std::string_view bytes, Outbox& out,
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
  // What the clock refiner found (model/clock_refine.h), applied to the nodes' clocks.
  void adjust_clocks(const ClockAdjustments& adjustments, uint64_t now_ns) {
    model_.adjust_clocks(adjustments, now_ns);
  }
  NodeState* node(const std::string& name) {
    auto it = model_.nodes.find(name);
    return it == model_.nodes.end() ? nullptr : &it->second;
  }
  const NodeState* node(const std::string& name) const { return model_.node(name); }
  // What every later stage reads.
  const ClusterModel& model() const { return model_; }
  // The loop read the agents' socket empty at `realtime_ns` (ClusterModel::drained_ns).
  void note_drained(uint64_t realtime_ns) { model_.drained_ns = realtime_ns; }

  const std::map<std::string, NodeState>& nodes() const { return model_.nodes; }
  const std::map<uint64_t, CommState>& comms() const { return model_.comms; }
  bool live(uint64_t hash) const { return model_.live(hash); }
  const IngestCounters& counters() const { return counters_; }
  const ProcessInfo* process(const std::string& node, uint32_t pid) const { return model_.process(node, pid); }
  uint64_t started_ns() const { return model_.started_ns; }
  // Per node, the communicators whose NCCL proxy steps its agent is asked
  // for (collector/detect/detail.h), in the reply to each of its
  // heartbeats; a node asked before and no longer is told once.
  void set_detail_wanted(const std::map<std::string, std::vector<uint64_t>>& by_node) { detail_wanted_ = by_node; }
  // Whether HelloReplies say readsCompact (agents then send a table,
  // compressed); either way both are read.
  void set_reads_compact(bool reads) { reads_compact_ = reads; }
  // Where clock probes are answered apart (collector/clock_responder.h),
  // said in HelloReplies (0: none; probes come on the agents' socket).
  void set_clock_port(uint16_t port) { clock_port_ = port; }
  // In a fleet of collectors: this collector's id and the members as last
  // read from etcd. Agents that follow the fleet get them in their
  // HelloReply, and, when they changed, in a FleetMap (into `out.now`, to
  // every connection of such an agent). Its clock samples taken against
  // another collector are ignored (Batch.clockOf).
  void set_fleet(const std::string& self, const std::vector<FleetEntry>& members, Outbox& out);

 private:
  void on_hello(const std::string& routing_id, wire::Hello::Reader hello, Outbox& out, const std::string& key_node);
  void on_batch(NodeState& node, const std::string& routing_id, wire::Batch::Reader batch, size_t wire_bytes,
                Outbox& out);
  // The checks before a batch is applied: false (with the reply, if any,
  // in `out`) when it is refused, held while the database cannot be
  // written, or a re-send of one already stored.
  bool admit_batch(NodeState& node, const std::string& routing_id, wire::Batch::Reader batch, size_t wire_bytes,
                   std::string& ack_bytes, Outbox& out);
  // A batch numbered past the highest stored of its agent instance plus one:
  // the ones between are missing (NodeState::gap_seq), until update_gap,
  // after each batch stored, finds them all stored.
  void open_gap(NodeState& node, uint64_t instance, uint64_t seq);
  void update_gap(NodeState& node, uint64_t instance);
  void close_gap(NodeState& node);
  // A batch's parts applied to the model (ingest/apply.cpp); `changed`
  // gathers the communicators to write whole.
  void apply_processes(NodeState& node, wire::Batch::Reader batch);
  void apply_comms(NodeState& node, wire::Batch::Reader batch, std::set<uint64_t>& changed);
  // Children of ncclCommSplit (ingest/split.cpp): a member's announcement;
  // the split's children sized once every rank of the parent has said; a
  // split that cannot be; a batch that waits (true) for a split's sizing,
  // or behind another batch of its agent that does; the rank a record of
  // `comm` named `announced` by its agent has there (null: refused).
  void apply_split(NodeState& node, wire::Comm::Reader comm, std::set<uint64_t>& changed);
  // The announcing process's rank in the split's parent (-1, with `split`
  // marked abandoned, when the parent cannot be sized); nullopt when the
  // announcement is refused (counted).
  std::optional<int32_t> check_split(NodeState& node, wire::Comm::Reader comm, SplitOf& split);
  void size_split(uint64_t parent, int32_t index, std::set<uint64_t>& changed);
  // One split of size_split's list; the splits that waited for its children go on `then`.
  void size_one_split(uint64_t parent, int32_t index, std::set<uint64_t>& changed,
                      std::deque<std::pair<uint64_t, int32_t>>& then);
  void derive_child(CommState& child, std::set<uint64_t>& changed);
  void abandon_split(uint64_t parent, int32_t index, std::set<uint64_t>& changed, const std::string& why);
  bool held_for_split(NodeState& node, wire::Batch::Reader batch, std::set<uint64_t>& changed);
  std::optional<int32_t> rank_in(NodeState& node, const CommState& comm, int32_t announced);
  void apply_async_errors(NodeState& node, wire::Batch::Reader batch);
  void apply_comm_ends(NodeState& node, wire::Batch::Reader batch, std::set<uint64_t>& changed);
  // Returns the records taken.
  size_t apply_collectives(NodeState& node, wire::Batch::Reader batch, const proto::BatchFrame& frame,
                           std::set<uint64_t>& changed);
  void apply_waits(NodeState& node, wire::Batch::Reader batch, const proto::BatchFrame& frame);
  // GPU records are taken only for a member this node's process already holds.
  void apply_gpu(NodeState& node, wire::Batch::Reader batch, const proto::BatchFrame& frame);
  void on_heartbeat(NodeState& node, wire::Heartbeat::Reader heartbeat);
  // The reply to a heartbeat: the node's DetailRequest, if it has one to hear.
  void reply_detail(NodeState& node, const std::string& routing_id, Outbox& out);
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

  std::map<std::string, std::vector<uint64_t>> detail_wanted_;
  bool reads_compact_ = true;  // said in HelloReplies
  uint16_t clock_port_ = 0;    // said in HelloReplies
  TimelineStore& store_;
  Commit& commit_;
  WriteSet& pending_;  // commit_'s
  const Clock& clock_;
  ClusterModel model_;                                     // nodes, communicators, processes
  std::map<std::string, std::string> node_of_connection_;  // routing id -> node name
  AckBook acks_;  // which batches are stored, and when each may be acknowledged
  std::set<uint64_t> dirty_comms_;                        // members, lanes or size changed since the last stage
  std::vector<std::pair<uint64_t, int32_t>> dirty_members_;  // (comm, rank) whose progress moved since
  std::set<std::string> dirty_nodes_;
  // By node and agent instance (a stream, in a fleet): the first batch (its
  // seq) sent back to wait for a split's sizing; the later batches of the
  // same stream wait behind it. A node's entries go with a new agent instance.
  // Held longer than a split's grace (kSplitSizingGraceNs), an entry goes:
  // the batch was stored elsewhere (its job moved to another collector and
  // back) or will not come back.
  struct HeldBatch {
    uint64_t seq = 0;
    uint64_t since_ns = 0;
  };
  std::map<std::pair<std::string, uint64_t>, HeldBatch> held_batches_;
  // In a fleet: this collector's id and the members to tell agents that
  // follow it (set_fleet).
  std::string fleet_self_;
  std::vector<FleetEntry> fleet_;
  IngestCounters counters_;
  BadMessageLog bad_log_;
  BadMessageLog throttle_log_;
  BadMessageLog refused_log_;
  std::vector<RecordObserver*> observers_;
  // A block's records and waits as the observers are told them, reused.
  std::vector<proto::CallRecord> block_records_;
  std::vector<HostWait> block_waits_;
};

}  // namespace rankscope::collector
