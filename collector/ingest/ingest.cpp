#include "collector/ingest/ingest.h"

#include <capnp/message.h>

#include <algorithm>
#include <set>

#include "common/format.h"
#include "common/log.h"
#include "common/version.h"
#include "proto/agent_wire.h"
#include "proto/compress.h"
#include "proto/limits.h"
#include "proto/store.capnp.h"

namespace rankscope::collector {

namespace {
constexpr size_t kHealthEntriesPerNode = 4096;  // processes whose health is kept per node
constexpr size_t kCgroupsPerNode = 512;         // cgroups whose CPU use is kept per node

std::string wait_call_name(wire::WaitKind kind) {
  switch (kind) {
    case wire::WaitKind::STREAM_SYNCHRONIZE:
      return "cudaStreamSynchronize";
    case wire::WaitKind::DEVICE_SYNCHRONIZE:
      return "cudaDeviceSynchronize";
    case wire::WaitKind::EVENT_SYNCHRONIZE:
      return "cudaEventSynchronize";
    default:
      return "a CUDA wait";
  }
}

}  // namespace

Ingest::Ingest(TimelineStore& store, Commit& commit, const Clock& clock)
    : store_(store), commit_(commit), pending_(commit.writes()), clock_(clock) {
  model_.started_ns = clock.realtime_ns();
  commit.join(*this);
}

bool Ingest::known_alive(const std::string& node_name, uint32_t pid) const {
  const NodeState* node = this->node(node_name);
  if (!node) return false;
  auto health = node->health.find(pid);
  return health != node->health.end() && health->second.known() && health->second.alive();
}

void Ingest::charge_nodes(const CommState& comm, bool charge) {
  std::set<std::string> joined;
  for (const auto& [rank, m] : comm.members) {
    NodeState& node = model_.nodes[m.node];
    if (node.name.empty()) node.name = m.node;
    const bool first = joined.insert(m.node).second;
    if (charge) {
      ++node.memberships;
      ++node.ranks_in[comm.hash];
      if (first) node.rank_slots += slots_of(comm);
    } else {
      node.memberships -= std::min<uint32_t>(node.memberships, 1);
      if (auto held = node.ranks_in.find(comm.hash); held != node.ranks_in.end() && --held->second == 0)
        node.ranks_in.erase(held);
      if (first) node.rank_slots -= std::min(node.rank_slots, slots_of(comm));
    }
  }
}

size_t Ingest::retire(uint64_t now_ns, uint64_t quiet_ns) {
  std::vector<uint64_t> over;
  for (const auto& [hash, comm] : model_.comms) {
    if (now_ns < comm.last_ns || now_ns - comm.last_ns < quiet_ns) continue;
    bool alive = !comm.ended && std::any_of(comm.members.begin(), comm.members.end(),
                                            [&](const auto& m) { return known_alive(m.second.node, m.second.pid); });
    // The members of a split that got no child (ended at once) stay while
    // the parent does: the agents announce them again to a job's new
    // collector, and one known sized is not a split waiting anew.
    if (comm.split.color == kSplitNoColor && comm.origin == CommOrigin::split)
      if (auto parent = model_.comms.find(comm.split.parent); parent != model_.comms.end() && !parent->second.ended)
        alive = true;
    if (!alive) over.push_back(hash);
  }
  if (over.empty()) return 0;
  for (uint64_t hash : over) {
    auto it = model_.comms.find(hash);
    const CommState& comm = it->second;
    charge_nodes(comm, false);
    if (comm.split.sizing == SplitSizing::pending)
      if (auto group = model_.pending_splits.find({comm.split.parent, comm.split.index});
          group != model_.pending_splits.end())
        group->second.erase(hash);
    persist_comm(comm, true);
    dirty_comms_.erase(hash);
    model_.comms.erase(it);
  }
  counters_.retired_comms += over.size();
  // Processes no live communicator has as a member, and not known alive: who
  // they were is no longer needed.
  std::set<ClusterModel::ProcessKey> members;
  for (const auto& [hash, comm] : model_.comms)
    for (const auto& [rank, m] : comm.members) members.insert({m.node, m.pid});
  for (auto it = model_.processes.begin(); it != model_.processes.end();)
    it = members.count(it->first) || known_alive(it->first.node, it->first.pid) ? std::next(it)
                                                                                : model_.processes.erase(it);
  RS_LOG(info, "retired %zu communicator(s): over and quiet for %s; %zu live", over.size(),
         format_duration_ns(quiet_ns).c_str(), model_.comms.size());
  return over.size();
}

void Ingest::drop_if_empty(uint64_t hash) {
  auto it = model_.comms.find(hash);
  if (it == model_.comms.end() || !it->second.members.empty()) return;
  model_.comms.erase(it);
  dirty_comms_.erase(hash);
}

std::string Ingest::error_reply(wire::ErrorCode code, const std::string& message) const {
  capnp::MallocMessageBuilder builder;
  auto error = builder.initRoot<wire::CollectorMessage>().initError();
  error.setCode(code);
  error.setMessage(message);
  return proto::to_packed(builder);
}

bool Ingest::answer_clock_probe(const std::string& routing_id, std::string_view bytes, Outbox& out,
                                const std::string& key_node) {
  if (bytes.size() > proto::kMaxClockProbeBytes) return false;
  uint64_t received_ns = clock_.realtime_ns();
  auto known = node_of_connection_.find(routing_id);
  if (known == node_of_connection_.end() || (!key_node.empty() && key_node != known->second)) return false;
  std::optional<uint64_t> t1 = proto::read_clock_probe(bytes);
  if (!t1) return false;
  model_.nodes[known->second].last_contact_ns = received_ns;
  ++counters_.clock_probes;
  out.now.emplace_back(routing_id, proto::encode_clock_reply(*t1, received_ns, clock_.realtime_ns()));
  return true;
}

void Ingest::on_agent_message(const std::string& routing_id, std::string_view bytes, Outbox& out,
                              const std::string& key_node) {
  uint64_t received_ns = clock_.realtime_ns();
  auto result = proto::read_packed<wire::AgentMessage>(bytes, proto::ReadLimits{}, [&](auto message) {
    if (message.which() == wire::AgentMessage::HELLO) {
      on_hello(routing_id, message.getHello(), out, key_node);
      return;
    }
    auto known = node_of_connection_.find(routing_id);
    if (known == node_of_connection_.end()) {
      out.now.emplace_back(routing_id, error_reply(wire::ErrorCode::NEED_HELLO, "say hello first"));
      return;
    }
    NodeState& node = model_.nodes[known->second];
    if (!key_node.empty() && key_node != node.name) {
      // A connection's messages are its key's: the routing id only says
      // which Hello they follow (a peer that reuses another's routing id
      // is still bound by its own key).
      std::string what = "a message of node " + key_node + "'s key on the connection of node " + node.name;
      if (NodeState* keyed = this->node(key_node))
        refuse_claim(*keyed, what);
      else
        bad_message(nullptr, what);
      out.now.emplace_back(routing_id, error_reply(wire::ErrorCode::NEED_HELLO, "say hello first"));
      return;
    }
    node.last_contact_ns = received_ns;
    switch (message.which()) {
      case wire::AgentMessage::BATCH:
        on_batch(node, routing_id, message.getBatch(), bytes.size(), out);
        counters_.batch_bytes += bytes.size();
        break;
      case wire::AgentMessage::COMPRESSED: {
        // A batch, whole once decompressed. Its records are bounded by the
        // bytes that came (check_batch), as a packed batch's: work per byte
        // received stays what it was.
        auto data = message.getCompressed();
        proto::ReadLimits limits;
        limits.traversal_words =
            std::min<uint64_t>(limits.traversal_words, proto::kWordsPerWireByte * bytes.size() + proto::kWordsFloor);
        auto inner = proto::decompress(std::string_view(reinterpret_cast<const char*>(data.begin()), data.size()),
                                       limits.max_bytes);
        auto take = [&](wire::AgentMessage::Reader batch) {
          if (batch.which() != wire::AgentMessage::BATCH) {
            bad_message(&node, "a compressed message that is not a batch; ignored");
            return;
          }
          on_batch(node, routing_id, batch.getBatch(), bytes.size(), out);
          counters_.batch_bytes += bytes.size();
        };
        Result<void> read =
            inner ? proto::read_packed<wire::AgentMessage>(*inner, limits, take) : Result<void>(inner.error());
        if (!read) {
          bad_message(&node, read.error().message);
          out.now.emplace_back(routing_id, error_reply(wire::ErrorCode::BAD_MESSAGE, read.error().message));
        }
        break;
      }
      case wire::AgentMessage::HEARTBEAT:
        on_heartbeat(node, message.getHeartbeat());
        reply_detail(node, routing_id, out);
        break;
      case wire::AgentMessage::CLOCK_PROBE:
        ++counters_.clock_probes;
        out.now.emplace_back(
            routing_id, proto::encode_clock_reply(message.getClockProbe().getT1(), received_ns, clock_.realtime_ns()));
        break;
      default:
        bad_message(&node, "a message kind this collector does not know; ignored");
    }
  });
  if (!result) {
    auto known = node_of_connection_.find(routing_id);
    bad_message(known == node_of_connection_.end() ? nullptr : &model_.nodes[known->second], result.error().message);
    out.now.emplace_back(routing_id, error_reply(wire::ErrorCode::BAD_MESSAGE, result.error().message));
  }
}

void Ingest::reply_detail(NodeState& node, const std::string& routing_id, Outbox& out) {
  if (!node.takes_detail) return;  // an older agent: it would not know the message
  auto wanted = detail_wanted_.find(node.name);
  if (wanted == detail_wanted_.end() && node.detail_asked.empty()) return;
  static const std::vector<uint64_t> kNone;
  const std::vector<uint64_t>& comms = wanted == detail_wanted_.end() ? kNone : wanted->second;
  capnp::MallocMessageBuilder builder;
  auto list = builder.initRoot<wire::CollectorMessage>().initDetail().initComms(
      static_cast<unsigned>(std::min<size_t>(comms.size(), proto::kMaxListEntries)));
  for (unsigned i = 0; i < list.size(); ++i) list.set(i, comms[i]);
  out.now.emplace_back(routing_id, proto::to_packed(builder));
  node.detail_asked = comms;
}

void Ingest::bad_message(NodeState* node, const std::string& what) {
  ++counters_.bad_messages;
  if (node) ++node->bad_messages;
  bad_log_.report(node ? "node " + node->name : "an unidentified agent", what, clock_.realtime_ns());
}

void Ingest::refuse_claim(NodeState& node, const std::string& what) {
  ++counters_.refused_claims;
  ++node.refused_claims;
  refused_log_.report("node " + node.name, "refused: " + what, clock_.realtime_ns());
}

void Ingest::on_throttled(const std::string& routing_id, const std::string& key_node, const std::string& why) {
  ++counters_.throttled_messages;
  NodeState* node = nullptr;
  if (!key_node.empty()) {
    node = this->node(key_node);
  } else if (auto known = node_of_connection_.find(routing_id); known != node_of_connection_.end()) {
    node = this->node(known->second);
  }
  if (node) ++node->throttled_messages;
  std::string peer = node ? "node " + node->name : !key_node.empty() ? "node " + key_node : "an unidentified agent";
  throttle_log_.report(peer, "over the rate limit, dropped: " + why, clock_.realtime_ns());
}

namespace {
void write_fleet(const std::vector<FleetEntry>& members, wire::FleetMap::Builder map) {
  auto list = map.initMembers(static_cast<unsigned>(members.size()));
  for (unsigned i = 0; i < members.size(); ++i) {
    list[i].setId(members[i].id);
    list[i].setAgents(members[i].agents);
    list[i].setPublicKey(members[i].public_key);
  }
}
}  // namespace

void Ingest::set_fleet(const std::string& self, const std::vector<FleetEntry>& members, Outbox& out) {
  if (self == fleet_self_ && members == fleet_) return;
  fleet_self_ = self;
  fleet_ = members;
  if (members.empty()) return;  // etcd never read yet: agents keep what they knew
  capnp::MallocMessageBuilder builder;
  write_fleet(members, builder.initRoot<wire::CollectorMessage>().initFleet());
  const std::string bytes = proto::to_packed(builder);
  for (const auto& [routing_id, name] : node_of_connection_)
    if (const NodeState* node = this->node(name); node && node->follows_fleet) out.now.emplace_back(routing_id, bytes);
}

void Ingest::on_hello(const std::string& routing_id, wire::Hello::Reader hello, Outbox& out,
                      const std::string& key_node) {
  capnp::MallocMessageBuilder builder;
  auto reply = builder.initRoot<wire::CollectorMessage>().initHelloReply();
  reply.setProtocolVersion(wire::PROTOCOL_VERSION);
  reply.setCollectorVersion(kVersion);
  reply.setReadsCompact(reads_compact_);
  reply.setClockPort(clock_port_);
  std::string name = hello.getNode();
  uint32_t version = hello.getProtocolVersion();
  if (version == 0 || version > wire::PROTOCOL_VERSION) {
    reply.setAccepted(false);
    reply.setReason("agent protocol version " + std::to_string(version) + " is not supported; this collector reads " +
                    "version " + std::to_string(wire::PROTOCOL_VERSION) + ": upgrade the collector first");
    RS_LOG(warn, "refused node %s: protocol version %u", name.c_str(), version);
  } else if (auto valid = check_node_name(name); !valid) {
    reply.setAccepted(false);
    reply.setReason(valid.error().message);
    bad_message(nullptr, "hello refused: " + valid.error().message);
  } else if (!key_node.empty() && key_node != name) {
    // The key proves who is speaking; the name in the Hello is only a claim.
    reply.setAccepted(false);
    reply.setReason("this agent's key is bound to node " + key_node + ", not " + name +
                    ": give each node its own key (rankscope keygen --role agent --name " + name + ")");
    bad_message(node(key_node), "hello refused: the key of node " + key_node + " used to speak for node " + name);
  } else {
    reply.setAccepted(true);
    NodeState& node = model_.nodes[name];
    bool new_instance = node.instance != hello.getInstanceId();
    // A reboot restarts the node's monotonic clock: a fit restored from an earlier run no longer holds.
    if (!node.boot_id.empty() && node.boot_id != std::string(hello.getBootId().cStr())) node.clock = NodeClock{};
    node.name = name;
    node.agent_version = hello.getAgentVersion();
    node.takes_detail = hello.getTakesDetail();
    node.follows_fleet = hello.getFollowsFleet();
    if (!fleet_self_.empty()) reply.setCollectorId(fleet_self_);
    if (node.follows_fleet && !fleet_.empty()) write_fleet(fleet_, reply.initFleet());
    node.boot_id = hello.getBootId();
    node.last_contact_ns = clock_.realtime_ns();
    if (new_instance) {
      node.instance = hello.getInstanceId();
      acks_.new_instance(node);
      close_gap(node);  // a new instance numbers its batches afresh
      node.top_seq = 0;
      for (auto it = held_batches_.lower_bound({name, 0}); it != held_batches_.end() && it->first.first == name;)
        it = held_batches_.erase(it);
    }
    node.clock.seed(hello.getMonotonicNs(), hello.getRealtimeNs());
    node.wall_offset_ns = static_cast<int64_t>(hello.getRealtimeNs() - hello.getMonotonicNs());
    for (auto it = node_of_connection_.begin(); it != node_of_connection_.end();)
      it = it->second == name ? node_of_connection_.erase(it) : std::next(it);
    node_of_connection_[routing_id] = name;
    dirty_nodes_.insert(name);
    RS_LOG(info, "node %s connected (agent %s, instance %s)", name.c_str(), node.agent_version.c_str(),
           hex64(node.instance).c_str());
  }
  out.now.emplace_back(routing_id, proto::to_packed(builder));
}

CommState& Ingest::comm_for(uint64_t hash, const std::string& node, uint32_t pid, bool& changed) {
  CommState& comm = model_.comms[hash];
  if (comm.hash == 0) {
    comm.hash = hash;
    comm.first_ns = clock_.realtime_ns();
    changed = true;
  }
  if (comm.job.empty()) {
    auto proc = model_.processes.find({node, pid});
    if (proc != model_.processes.end() && !proc->second.job.empty()) {
      comm.job = proc->second.job;
      changed = true;
    }
  }
  comm.last_ns = clock_.realtime_ns();
  return comm;
}

MemberState* Ingest::claim_member(NodeState& node, CommState& comm, int32_t rank, uint32_t pid, bool& changed,
                                  const char* what) {
  auto it = comm.members.find(rank);
  if (it != comm.members.end()) {
    MemberState& member = it->second;
    if (member.pid == pid && member.node == node.name) return &member;
    // NCCL ranks are not handed over: a rank of a live communicator is one
    // process for its whole life. Another claim is a forgery (or a bug).
    refuse_claim(node, std::string(what) + " as rank " + std::to_string(rank) + " of comm " + hex64(comm.hash) +
                           " (pid " + std::to_string(pid) + "), a rank bound to node " + member.node + " pid " +
                           std::to_string(member.pid));
    return nullptr;
  }
  if (comm.nranks > 0 && rank >= comm.nranks) {
    refuse_claim(node, std::string(what) + " as rank " + std::to_string(rank) + " of comm " + hex64(comm.hash) +
                           ", which has " + std::to_string(comm.nranks) + " ranks");
    return nullptr;
  }
  const auto held = node.ranks_in.find(comm.hash);
  const size_t on_node = held == node.ranks_in.end() ? 0 : held->second;
  if (on_node >= kMaxMembersPerNode) {
    refuse_claim(node, std::string(what) + ": node already has " + std::to_string(on_node) + " ranks of comm " +
                           hex64(comm.hash) + " (at most " + std::to_string(kMaxMembersPerNode) + " per node)");
    return nullptr;
  }
  if (node.memberships >= kMaxMembershipsPerNode) {
    refuse_claim(node, std::string(what) + " as rank " + std::to_string(rank) + " of comm " + hex64(comm.hash) +
                           ": the node's processes already hold " + std::to_string(node.memberships) +
                           " ranks of live communicators (at most " + std::to_string(kMaxMembershipsPerNode) + ")");
    return nullptr;
  }
  if (on_node == 0 && node.rank_slots + slots_of(comm) > kMaxRankSlotsPerNode) {
    refuse_claim(node, std::string(what) + " as rank " + std::to_string(rank) + " of comm " + hex64(comm.hash) + " (" +
                           std::to_string(slots_of(comm)) + " ranks): the node is already in live communicators of " +
                           std::to_string(node.rank_slots) + " ranks in all (at most " +
                           std::to_string(kMaxRankSlotsPerNode) + ")");
    return nullptr;
  }
  ++node.memberships;
  ++node.ranks_in[comm.hash];
  if (on_node == 0) node.rank_slots += slots_of(comm);
  MemberState& member = comm.members[rank];
  member.rank = rank;
  member.node = node.name;
  member.pid = pid;
  changed = true;
  return &member;
}

void Ingest::on_batch(NodeState& node, const std::string& routing_id, wire::Batch::Reader batch, size_t wire_bytes,
                      Outbox& out) {
  capnp::MallocMessageBuilder ack_builder;
  auto ack = ack_builder.initRoot<wire::CollectorMessage>().initAck();
  ack.setInstanceId(batch.getInstanceId());
  ack.setSeq(batch.getSeq());
  std::string ack_bytes = proto::to_packed(ack_builder);
  if (!admit_batch(node, routing_id, batch, wire_bytes, ack_bytes, out)) return;

  // Clock first, so that this batch's records use the newest estimate. In a
  // fleet, samples taken against another collector's clock (a batch re-sent
  // here after a job moved) say nothing of this one's.
  const bool my_clock = batch.getClockOf().size() == 0 || std::string(batch.getClockOf().cStr()) == fleet_self_;
  if (my_clock)
    for (auto s : batch.getClockSamples()) node.clock.add({s.getT1(), s.getT2(), s.getT3(), s.getT4()});
  // Cumulative counters of the agent; batches can arrive out of order (a
  // re-send after a later heartbeat): keep the larger.
  keep_larger(node.drops, proto::read_drops(batch.getDrops()));
  apply_processes(node, batch);
  std::set<uint64_t> changed;  // what restore needs of these changed: written whole
  apply_comms(node, batch, changed);
  if (held_for_split(node, batch, changed)) {
    // Not acknowledged: its agent sends it again, and what it announced is
    // applied again, alike.
    dirty_comms_.insert(changed.begin(), changed.end());
    return;
  }
  // Before its records reach the observers: a batch after a missing one
  // completes collectives whose ranks' earlier calls are in that one.
  open_gap(node, batch.getInstanceId(), batch.getSeq());
  apply_async_errors(node, batch);
  apply_comm_ends(node, batch, changed);
  const proto::BatchFrame frame(batch);
  size_t records = apply_collectives(node, batch, frame, changed);
  dirty_comms_.insert(changed.begin(), changed.end());
  // After the collectives: a wait follows the collectives issued before it.
  apply_waits(node, batch, frame);
  apply_gpu(node, batch, frame);

  acks_.mark_stored(node, batch.getInstanceId(), batch.getSeq());
  update_gap(node, batch.getInstanceId());
  if (batch.getCreatedNs() != 0) node.closed_ns = std::max(node.closed_ns, node.clock.to_cluster(batch.getCreatedNs()));
  // A batch missing before it (lost on the way, or held back) holds what it
  // captured earlier: told only once that one comes.
  if (node.gap_seq == 0) node.reported_ns = std::max(node.reported_ns, node.closed_ns);
  node.batches += 1;
  node.records += records;
  counters_.batches_stored += 1;
  counters_.records_stored += records;
  dirty_nodes_.insert(node.name);
  out.after_commit.emplace_back(routing_id, std::move(ack_bytes));
}

void Ingest::open_gap(NodeState& node, uint64_t instance, uint64_t seq) {
  if (instance != node.instance) return;  // an earlier instance's spool, replayed
  const uint64_t now = clock_.realtime_ns();
  // Waited for long enough: taken as lost.
  if (node.gap_seq != 0 && now >= node.gap_since_ns + kBatchGapWaitNs) close_gap(node);
  // After a restart of the collector, the window read back says how far the instance got.
  if (node.top_seq == 0)
    if (auto window = node.acked.find(instance); window != node.acked.end()) node.top_seq = window->second.through;
  if (seq > node.top_seq + 1 && node.gap_seq == 0) {
    node.gap_seq = node.top_seq + 1;
    node.gap_since_ns = now;
    model_.gaps[node.name] = now;
  }
  node.top_seq = std::max(node.top_seq, seq);
}

void Ingest::update_gap(NodeState& node, uint64_t instance) {
  if (instance != node.instance || node.gap_seq == 0) return;
  auto window = node.acked.find(instance);
  if (window == node.acked.end()) return;
  uint64_t missing = std::max(node.gap_seq, window->second.through + 1);
  while (missing <= node.top_seq && window->second.above.count(missing)) ++missing;
  if (missing > node.top_seq)
    close_gap(node);
  else
    node.gap_seq = missing;
}

void Ingest::close_gap(NodeState& node) {
  node.gap_seq = 0;
  node.gap_since_ns = 0;
  model_.gaps.erase(node.name);
}

bool Ingest::admit_batch(NodeState& node, const std::string& routing_id, wire::Batch::Reader batch, size_t wire_bytes,
                         std::string& ack_bytes, Outbox& out) {
  if (auto valid = check_batch(batch, wire_bytes); !valid) {
    // Refused whole and not acknowledged: no agent sends this.
    bad_message(&node, "batch " + std::to_string(batch.getSeq()) + " refused: " + valid.error().message);
    out.now.emplace_back(routing_id, error_reply(wire::ErrorCode::BAD_MESSAGE, valid.error().message));
    return false;
  }
  if (commit_.holding()) {
    // The database cannot be written and the backlog is full: not applied,
    // not acknowledged; the agent keeps the batch and sends it again.
    ++counters_.held_batches;
    return false;
  }
  if (AckBook::Seen seen = acks_.seen(node, batch.getInstanceId(), batch.getSeq()); seen != AckBook::Seen::new_batch) {
    // Re-sent (our ack was lost or late): say so again once it is durable.
    // Its first copy may be in this very commit round, not yet written: then
    // the ack waits for the commit like the first one's (on failure both are dropped).
    ++counters_.duplicate_batches;
    (seen == AckBook::Seen::pending ? out.after_commit : out.now).emplace_back(routing_id, std::move(ack_bytes));
    return false;
  }
  return true;
}

void Ingest::on_heartbeat(NodeState& node, wire::Heartbeat::Reader heartbeat) {
  if (auto valid = check_heartbeat(heartbeat); !valid) {
    bad_message(&node, "heartbeat refused: " + valid.error().message);
    return;
  }
  node.traced_processes = heartbeat.getTracedProcesses();
  node.unacked_batches = heartbeat.getUnackedBatches();
  node.last_monotonic_ns = heartbeat.getMonotonicNs();
  // Every batch it made is stored: what it captured until (about) now is here.
  if (heartbeat.getUnackedBatches() == 0 && heartbeat.getMonotonicNs() != 0)
    node.reported_ns = std::max(node.reported_ns, node.clock.to_cluster(heartbeat.getMonotonicNs()));
  // A heartbeat carries what the agent knows now; keep the larger counters.
  keep_larger(node.drops, proto::read_drops(heartbeat.getDrops()));
  for (auto p : heartbeat.getProcesses()) {
    HealthSample sample;
    sample.sample_ns = p.getSampleNs();
    sample.alive = p.getAlive();
    sample.state = static_cast<char>(p.getState());
    sample.cpu_ns = p.getCpuNs();
    sample.runqueue_ns = p.getRunqueueNs();
    sample.stat_cpu_ns = p.getProcessCpuNs();
    sample.exit_status = p.getExitStatus();
    sample.exit_signal = p.getExitSignal();
    sample.cpu_periods = p.getCpuPeriods();
    sample.cpu_throttled_periods = p.getCpuThrottledPeriods();
    sample.cpu_throttled_ns = p.getCpuThrottledNs();
    sample.cpu_quota_millicpus = p.getCpuQuotaMillicpus();
    if (p.hasHost()) {
      auto h = p.getHost();
      sample.host_known = true;
      sample.process_cpu_ns = h.getCpuNs();
      sample.on_cpu_ns = h.getOnCpuNs();
      sample.off_cpu_ns = h.getOffCpuNs();
      sample.host_runqueue_ns = h.getRunqueueNs();
      sample.iowait_ns = h.getIowaitNs();
      sample.involuntary_switches = h.getInvoluntarySwitches();
      sample.major_faults = h.getMajorFaults();
      sample.threads = h.getThreads();
    }
    node.health[p.getPid()].add(sample);
  }
  // Dead processes are kept to explain findings, but not without bound;
  // not those this heartbeat reported: the usage ledger has yet to bill
  // their last interval (it reads the table at its next tick).
  if (node.health.size() > kHealthEntriesPerNode) {
    std::set<uint32_t> reported;
    for (auto p : heartbeat.getProcesses()) reported.insert(p.getPid());
    for (auto it = node.health.begin(); it != node.health.end();)
      it = it->second.alive() || reported.count(it->first) ? std::next(it) : node.health.erase(it);
  }
  // Who used the host's CPUs: cumulative per cgroup; a rate needs two reports.
  for (auto c : heartbeat.getCgroups()) {
    CgroupUsage& usage = node.cgroups[c.getCgroupId()];
    if (c.getPath().size() > proto::kMaxIdentityPath)
      bad_message(&node, "heartbeat: cgroup path of " + std::to_string(c.getPath().size()) + " bytes (limit " +
                             std::to_string(proto::kMaxIdentityPath) + "); path not kept");
    else if (c.getPath().size() > 0)
      usage.path = c.getPath();
    usage.add(
        CgroupSample{heartbeat.getMonotonicNs(), c.getCpuNs(), c.getInvoluntarySwitches(), c.getTcpRetransmits()});
  }
  if (node.cgroups.size() > kCgroupsPerNode) {
    // Forget the ones quiet longest.
    std::vector<std::pair<uint64_t, uint64_t>> by_age;
    for (const auto& [id, usage] : node.cgroups) by_age.emplace_back(usage.last_ns(), id);
    std::sort(by_age.begin(), by_age.end());
    for (size_t i = 0; i < node.cgroups.size() - kCgroupsPerNode; ++i) node.cgroups.erase(by_age[i].second);
  }
  // A wait missing from this heartbeat has ended.
  std::map<uint32_t, std::vector<OpenWait>> waits;
  for (auto w : heartbeat.getOpenWaits())
    waits[w.getPid()].push_back(OpenWait{wait_call_name(w.getKind()), node.clock.to_cluster(w.getStartNs())});
  std::map<uint32_t, std::vector<GpuOpen>> gpu;
  for (auto g : heartbeat.getGpuOpen()) {
    const uint64_t start = g.getKernelStartNs();
    const uint64_t since = g.getSendSinceNs();
    gpu[g.getPid()].push_back(GpuOpen{g.getCommHash(), g.getRank(), g.getOp(), g.getSeq(),
                                      node.clock.to_cluster(g.getEnqueuedNs()),
                                      start ? node.clock.to_cluster(start) : 0, g.getProxySteps(),
                                      since ? g.getSendPeer() : -1, since ? node.clock.to_cluster(since) : 0,
                                      g.getDetail()});
  }
  for (auto& [pid, health] : node.health) {
    auto it = waits.find(pid);
    health.set_open_waits(it == waits.end() ? std::vector<OpenWait>{} : std::move(it->second));
    auto open = gpu.find(pid);
    health.set_gpu_open(open == gpu.end() ? std::vector<GpuOpen>{} : std::move(open->second));
  }
}

}  // namespace rankscope::collector
