// The ingest's persistence: the model restored from the database at start,
// the communicators and nodes written into the commit's WriteSet, and a
// retired communicator read back for queries.
#include <capnp/message.h>

#include <algorithm>
#include <charconv>

#include "collector/ingest/ingest.h"
#include "common/format.h"
#include "common/log.h"
#include "proto/store.capnp.h"

namespace rankscope::collector {

namespace {
// A communicator as stored (its members' counters as of its last full write).
CommState comm_from(proto::store::StoredComm::Reader stored) {
  CommState comm;
  comm.hash = stored.getCommHash();
  comm.job = stored.getJob();
  comm.nranks = stored.getNranks();
  comm.origin = from_wire(stored.getOrigin());
  comm.first_ns = stored.getFirstNs();
  comm.last_ns = stored.getLastNs();
  comm.ended = stored.getEnded();
  for (auto lane : stored.getLanes()) comm.lanes.insert(lane);
  comm.split.parent = stored.getParentHash();
  comm.split.index = stored.getSplitIndex();
  comm.split.color = stored.getSplitColor();
  comm.split.sizing = stored.getSplitSizing() <= static_cast<uint8_t>(SplitSizing::abandoned)
                          ? static_cast<SplitSizing>(stored.getSplitSizing())
                          : SplitSizing::abandoned;
  comm.split.since_ns = stored.getSplitSinceNs();
  for (auto m : stored.getMembers()) {
    MemberState member;
    member.rank = m.getRank();
    member.announced_rank = m.getAnnouncedRank();
    member.parent_rank = m.getParentRank();
    member.split_key = m.getSplitKey();
    if (comm.split.sizing == SplitSizing::derived) comm.rank_of_announced[member.announced_rank] = member.rank;
    member.node = m.getNode();
    member.pid = m.getPid();
    member.records = m.getRecords();
    member.last_seq = m.getLastSeq();
    member.last_issue_ns = m.getLastIssueNs();
    member.ended = m.getEnded();
    comm.members[member.rank] = member;
  }
  return comm;
}

// A member's counters from its progress row (newer than its StoredComm's).
Result<void> apply_progress(MemberState& member, const std::string& row, uint64_t* comm_last_ns) {
  auto read = proto::read_packed<proto::store::StoredProgress>(row, proto::ReadLimits{}, [&](auto stored) {
    member.records = stored.getRecords();
    member.last_seq = stored.getLastSeq();
    member.last_issue_ns = stored.getLastIssueNs();
    if (comm_last_ns) *comm_last_ns = std::max(*comm_last_ns, stored.getCommLastNs());
  });
  if (!read) return make_error(Errc::storage, "a member's stored progress is unreadable: " + read.error().message);
  return {};
}
}  // namespace

Result<void> Ingest::restore() {
  auto comms = store_.all_comms();
  if (!comms) return comms.error();
  size_t retired = 0;
  for (const auto& bytes : *comms) {
    auto read = proto::read_packed<proto::store::StoredComm>(bytes, proto::ReadLimits{}, [&](auto stored) {
      if (stored.getRetired()) {
        ++retired;
        return;
      }
      CommState comm = comm_from(stored);
      if (comm.split.sizing == SplitSizing::pending)
        model_.pending_splits[{comm.split.parent, comm.split.index}].insert(comm.hash);
      model_.comms[comm.hash] = std::move(comm);
    });
    if (!read) return make_error(Errc::storage, "a stored communicator is unreadable: " + read.error().message);
  }
  auto progress = store_.all_progress();
  if (!progress) return progress.error();
  for (const auto& row : *progress) {
    auto comm = model_.comms.find(row.comm);
    if (comm == model_.comms.end()) continue;
    auto member = comm->second.members.find(row.rank);
    if (member == comm->second.members.end()) continue;
    if (auto applied = apply_progress(member->second, row.value, &comm->second.last_ns); !applied)
      return applied.error();
  }
  auto nodes = store_.all_nodes();
  if (!nodes) return nodes.error();
  for (const auto& bytes : *nodes) {
    auto read = proto::read_packed<proto::store::StoredNode>(bytes, proto::ReadLimits{}, [&](auto stored) {
      NodeState node;
      node.name = stored.getNode();
      node.last_contact_ns = stored.getLastContactNs();
      node.agent_version = stored.getAgentVersion();
      node.instance = stored.getInstanceId();
      node.boot_id = stored.getBootId();
      node.batches = stored.getBatches();
      node.records = stored.getRecords();
      node.drops = proto::read_drops(stored.getDrops());
      for (auto a : stored.getAckedBatches()) {
        AckWindow& window = node.acked[a.getInstanceId()];
        window.through = a.getThrough();
        for (uint64_t seq : a.getAbove()) window.above.insert(seq);
        acks_.restored(window);
      }
      // Until new probes come in, times keep the estimate of the last run
      // (the Hello's seed is only as good as the node's wall clock).
      if (stored.getClockUncertaintyNs() != 0 && stored.getClockUncertaintyNs() != UINT64_MAX)
        node.clock.restore(stored.getClockOffsetNs(), stored.getClockRefinementNs(), stored.getClockDriftPpb(),
                           stored.getClockReferenceNs(), stored.getClockUncertaintyNs());
      model_.nodes[node.name] = std::move(node);
    });
    if (!read) return make_error(Errc::storage, "a stored node is unreadable: " + read.error().message);
  }
  // Each node's share of the live model, as claim_member and retire keep it.
  for (const auto& [hash, comm] : model_.comms) charge_nodes(comm, true);
  if (!model_.comms.empty() || !model_.nodes.empty())
    RS_LOG(info, "restored %zu node(s) and %zu communicator(s) from the database (%zu retired ones left there)",
           model_.nodes.size(), model_.comms.size(), retired);
  return {};
}

Result<CommState> Ingest::retired_comm(const std::string& prefix) const {
  // The hashes a hex prefix stands for are one range of keys.
  uint64_t first = 0, last = 0;
  const std::string low = prefix + std::string(16 - std::min<size_t>(16, prefix.size()), '0');
  const std::string high = prefix + std::string(16 - std::min<size_t>(16, prefix.size()), 'f');
  if (prefix.empty() || prefix.size() > 16 ||
      std::from_chars(low.data(), low.data() + low.size(), first, 16).ptr != low.data() + low.size() ||
      std::from_chars(high.data(), high.data() + high.size(), last, 16).ptr != high.data() + high.size())
    return make_error(Errc::invalid_argument, "a communicator is named by its hash in lower-case hex, not " + prefix);
  auto comms = store_.comms_between(first, last);
  if (!comms) return comms.error();
  std::optional<CommState> found;
  bool ambiguous = false;
  for (const auto& bytes : *comms) {
    auto read = proto::read_packed<proto::store::StoredComm>(bytes, proto::ReadLimits{}, [&](auto stored) {
      if (!stored.getRetired()) return;
      if (found) ambiguous = true;
      found = comm_from(stored);
    });
    if (!read) return make_error(Errc::storage, "a stored communicator is unreadable: " + read.error().message);
  }
  if (ambiguous)
    return make_error(Errc::invalid_argument, "communicator prefix " + prefix + " is ambiguous; give more digits");
  if (!found) return make_error(Errc::not_found, "no communicator " + prefix + " (see `rankscope jobs`)");
  // Its members' last counters are in their progress rows.
  auto progress = store_.progress_of(found->hash);
  if (!progress) return progress.error();
  for (const auto& row : *progress) {
    auto member = found->members.find(row.rank);
    if (member == found->members.end()) continue;
    if (auto applied = apply_progress(member->second, row.value, nullptr); !applied) return applied.error();
  }
  return std::move(*found);
}

void Ingest::persist_comm(const CommState& comm, bool retired) {
  capnp::MallocMessageBuilder builder;
  auto stored = builder.initRoot<proto::store::StoredComm>();
  stored.setCommHash(comm.hash);
  stored.setJob(comm.job);
  stored.setNranks(comm.nranks);
  stored.setOrigin(to_wire(comm.origin));
  stored.setFirstNs(comm.first_ns);
  stored.setLastNs(comm.last_ns);
  stored.setEnded(comm.ended);
  stored.setRetired(retired);
  if (comm.split.sizing != SplitSizing::none) {
    stored.setParentHash(comm.split.parent);
    stored.setSplitIndex(comm.split.index);
    stored.setSplitColor(comm.split.color);
    stored.setSplitSizing(static_cast<uint8_t>(comm.split.sizing));
    stored.setSplitSinceNs(comm.split.since_ns);
  }
  auto lanes = stored.initLanes(static_cast<unsigned>(comm.lanes.size()));
  unsigned i = 0;
  for (uint32_t lane : comm.lanes) lanes.set(i++, lane);
  auto members = stored.initMembers(static_cast<unsigned>(comm.members.size()));
  i = 0;
  for (const auto& [rank, m] : comm.members) {
    auto out = members[i++];
    out.setRank(m.rank);
    out.setNode(m.node);
    out.setPid(m.pid);
    out.setRecords(m.records);
    out.setLastSeq(m.last_seq);
    out.setLastIssueNs(m.last_issue_ns);
    out.setEnded(m.ended);
    out.setAnnouncedRank(m.announced_rank);
    out.setParentRank(m.parent_rank);
    out.setSplitKey(m.split_key);
  }
  pending_.put_comm(comm.hash, proto::to_packed(builder));
}

void Ingest::persist_node(const NodeState& node) {
  capnp::MallocMessageBuilder builder;
  auto stored = builder.initRoot<proto::store::StoredNode>();
  stored.setNode(node.name);
  stored.setLastContactNs(node.last_contact_ns);
  stored.setAgentVersion(node.agent_version);
  stored.setInstanceId(node.instance);
  stored.setBootId(node.boot_id);
  stored.setBatches(node.batches);
  stored.setRecords(node.records);
  proto::write_drops(node.drops, stored.initDrops());
  stored.setClockOffsetNs(node.clock.offset_ns());
  stored.setClockUncertaintyNs(node.clock.probe_uncertainty_ns());
  stored.setClockDriftPpb(node.clock.drift_ppb());
  stored.setClockRefinementNs(node.clock.refinement_ns());
  stored.setClockReferenceNs(node.clock.reference_ns());
  // Least recently used first: read back in this order, they keep it (AckBook::restored).
  std::vector<std::pair<uint64_t, const AckWindow*>> by_use;
  for (const auto& [instance, window] : node.acked) by_use.emplace_back(instance, &window);
  std::sort(by_use.begin(), by_use.end(),
            [](const auto& a, const auto& b) { return a.second->last_used < b.second->last_used; });
  auto windows = stored.initAckedBatches(static_cast<unsigned>(by_use.size()));
  unsigned w = 0;
  for (const auto& [instance, window_ptr] : by_use) {
    const AckWindow& window = *window_ptr;
    auto out = windows[w++];
    out.setInstanceId(instance);
    out.setThrough(window.through);
    auto above = out.initAbove(static_cast<unsigned>(window.above.size()));
    unsigned i = 0;
    for (uint64_t seq : window.above) above.set(i++, seq);
  }
  pending_.put_node(node.name, proto::to_packed(builder));
}

Result<void> Ingest::stage(WriteSet&, uint64_t, bool) {
  // The batches applied so far are in this commit (their records are in the set already).
  acks_.staging();
  for (uint64_t hash : dirty_comms_) {
    auto it = model_.comms.find(hash);
    if (it != model_.comms.end()) persist_comm(it->second);
  }
  // Members whose records moved, each named once while its flag is set (a
  // communicator retired since is gone, one made again under its hash
  // names its member anew): written in key order.
  std::sort(dirty_members_.begin(), dirty_members_.end());
  for (const auto& [hash, rank] : dirty_members_) {
    auto comm = model_.comms.find(hash);
    if (comm == model_.comms.end()) continue;
    auto member = comm->second.members.find(rank);
    if (member == comm->second.members.end() || !member->second.progress_dirty) continue;
    member->second.progress_dirty = false;
    capnp::MallocMessageBuilder builder;
    auto progress = builder.initRoot<proto::store::StoredProgress>();
    progress.setRecords(member->second.records);
    progress.setLastSeq(member->second.last_seq);
    progress.setLastIssueNs(member->second.last_issue_ns);
    progress.setCommLastNs(comm->second.last_ns);
    pending_.put_progress(hash, rank, proto::to_packed(builder));
  }
  for (const auto& name : dirty_nodes_) {
    auto it = model_.nodes.find(name);
    if (it != model_.nodes.end()) persist_node(it->second);
  }
  // Staged: a failed commit keeps them in the set and writes them again.
  dirty_comms_.clear();
  dirty_members_.clear();
  dirty_nodes_.clear();
  return {};
}

void Ingest::committed() {
  acks_.committed();
}

}  // namespace rankscope::collector
