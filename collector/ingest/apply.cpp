// The ingest's application of one batch to the model, part by part, in
// the order Ingest::on_batch calls them (collector/ingest/ingest.h).
#include <algorithm>

#include "collector/ingest/ingest.h"
#include "common/format.h"
#include "common/log.h"
#include "proto/limits.h"

namespace rankscope::collector {

void Ingest::apply_processes(NodeState& node, wire::Batch::Reader batch) {
  for (auto p : batch.getProcesses()) {
    if (auto valid = check_process(p); !valid) {
      bad_message(&node,
                  "batch " + std::to_string(batch.getSeq()) + ": " + valid.error().message + "; process skipped");
      continue;
    }
    ProcessInfo& info = model_.processes[{node.name, p.getPid()}];
    info.job = p.getJob();
    info.rank = p.getRank();
    info.local_rank = p.getLocalRank();
    info.world_size = p.getWorldSize();
    info.user = p.getUser();
    info.account = p.getAccount();
    info.visible_devices = p.getVisibleDevices();
    info.slurm_step = p.getSlurmStep();
    info.pod_uid = p.getPodUid();
    info.pod_namespace = p.getPodNamespace();
    info.pod_name = p.getPodName();
    info.container_id = p.getContainerId();
    info.cgroup_id = p.getCgroupId();
    info.cgroup_path = p.getCgroupPath();
    info.start_time = p.getStartTime();
    info.cuda_devices.clear();
    for (int32_t d : p.getCudaDevices()) info.cuda_devices.push_back(d);
  }
}

void Ingest::apply_comms(NodeState& node, wire::Batch::Reader batch, std::set<uint64_t>& changed) {
  for (auto c : batch.getComms()) {
    if (auto valid = check_comm(c); !valid) {
      bad_message(&node, "batch " + std::to_string(batch.getSeq()) + ": " + valid.error().message + "; skipped");
      continue;
    }
    if (c.getOrigin() == wire::CommOrigin::SPLIT && c.getNranks() == -1) {
      apply_split(node, c, changed);
      continue;
    }
    bool news = false;
    if (auto known = model_.comms.find(c.getCommHash()); known != model_.comms.end() && c.getNranks() > 0 &&
                                                         known->second.nranks > 0 &&
                                                         known->second.nranks != c.getNranks()) {
      // The first announcement binds the size: every vector sized by it
      // (detectors, ledger) stays right, and no member can grow or shrink it.
      refuse_claim(node, "comm " + hex64(c.getCommHash()) + " announced with " + std::to_string(c.getNranks()) +
                             " ranks; it was announced with " + std::to_string(known->second.nranks));
      continue;
    }
    CommState& comm = comm_for(c.getCommHash(), node.name, c.getPid(), news);
    if (c.getNranks() > 0 && comm.nranks <= 0) {
      bool fits = true;
      for (const auto& [r, m] : comm.members) fits &= r < c.getNranks();
      if (!fits) {
        refuse_claim(node, "comm " + hex64(comm.hash) + " announced with " + std::to_string(c.getNranks()) +
                               " ranks, fewer than the ranks it already has");
        continue;
      }
      // Its nodes were charged one slot each while its size was unknown.
      const uint64_t extra = static_cast<uint64_t>(c.getNranks()) - 1;
      std::set<std::string> joined;
      for (const auto& [r, m] : comm.members) joined.insert(m.node);
      if (joined.count(node.name) && node.rank_slots + extra > kMaxRankSlotsPerNode) {
        refuse_claim(node, "comm " + hex64(comm.hash) + " announced with " + std::to_string(c.getNranks()) +
                               " ranks: the node is already in live communicators of " +
                               std::to_string(node.rank_slots) + " ranks in all (at most " +
                               std::to_string(kMaxRankSlotsPerNode) + ")");
        drop_if_empty(comm.hash);
        continue;
      }
      for (const std::string& name : joined)
        if (NodeState* member_node = this->node(name)) member_node->rank_slots += extra;
      comm.nranks = c.getNranks();
      news = true;
    }
    if (comm.origin == CommOrigin::unknown && from_wire(c.getOrigin()) != comm.origin) {
      comm.origin = from_wire(c.getOrigin());
      news = true;
    }
    MemberState* member = claim_member(node, comm, c.getRank(), c.getPid(), news, "an announcement");
    if (!member && comm.members.empty()) {
      drop_if_empty(comm.hash);
      continue;
    }
    if (member && member->ended) {
      // The same process announcing it again (a collector welcoming a restarted agent... ):
      // it holds the communicator.
      member->ended = false;
      news = true;
    }
    if (member && comm.ended) {
      comm.ended = false;
      news = true;
    }
    if (news) changed.insert(comm.hash);
  }
}

void Ingest::apply_async_errors(NodeState& node, wire::Batch::Reader batch) {
  // A member's first error is the one kept: an agent reports it once, and
  // the same (communicator, process) again in a batch costs nothing more.
  // Each costs a walk of its communicator's members: at most
  // proto::kMaxAsyncErrorsPerBatch a batch (an agent tells each broken
  // communicator once, that many a batch), the rest skipped.
  std::set<std::pair<uint64_t, uint32_t>> seen;
  for (auto a : batch.getAsyncErrors()) {
    if (seen.size() == proto::kMaxAsyncErrorsPerBatch && !seen.count({a.getCommHash(), a.getPid()})) {
      bad_message(&node, "batch " + std::to_string(batch.getSeq()) + ": more than " +
                             std::to_string(proto::kMaxAsyncErrorsPerBatch) +
                             " broken communicators; the rest skipped");
      break;
    }
    if (!seen.emplace(a.getCommHash(), a.getPid()).second) continue;
    auto it = model_.comms.find(a.getCommHash());
    if (it == model_.comms.end()) continue;
    for (auto& [rank, member] : it->second.members) {
      if (member.node != node.name || member.pid != a.getPid() || member.error) continue;
      member.error = CommError{node.clock.to_cluster(a.getNs()), a.getResult(), a.getAsyncError()};
      RS_LOG(warn, "node %s rank %d of %s: communicator broken (%s)", node.name.c_str(), rank, hex64(it->first).c_str(),
             proto::result_name(a.getAsyncError() ? a.getAsyncError() : a.getResult()).c_str());
    }
  }
}

void Ingest::apply_comm_ends(NodeState& node, wire::Batch::Reader batch, std::set<uint64_t>& changed) {
  for (auto e : batch.getCommEnds()) {
    auto it = model_.comms.find(e.getCommHash());
    if (it == model_.comms.end()) continue;
    CommState& comm = it->second;
    // A process ends its own membership; the communicator is over once every
    // member has ended it (a member that dies without ending it is the hang
    // detector's, which sees the process gone).
    bool mine = false;
    for (auto& [rank, member] : comm.members) {
      if (member.node != node.name || member.pid != e.getPid()) continue;
      mine = true;
      if (!member.ended) changed.insert(comm.hash);
      member.ended = true;
    }
    if (!mine) {
      refuse_claim(node, "an end of comm " + hex64(comm.hash) + " by pid " + std::to_string(e.getPid()) +
                             ", not a member of it on this node");
      continue;
    }
    bool all = std::all_of(comm.members.begin(), comm.members.end(), [](const auto& m) { return m.second.ended; });
    if (all && !comm.ended) {
      comm.ended = true;
      changed.insert(comm.hash);
    }
  }
}

size_t Ingest::apply_collectives(NodeState& node, wire::Batch::Reader batch, const proto::BatchFrame& frame,
                                 std::set<uint64_t>& changed) {
  size_t records = 0;
  proto::for_each_block(batch, frame, [&](Result<proto::ColumnBlock> block) {
    auto valid = block ? check_block(*block) : Result<void>(block.error());
    if (!valid) {
      bad_message(&node, "batch " + std::to_string(batch.getSeq()) + ": " + valid.error().message + "; block skipped");
      return;
    }
    bool news = false;
    CommState& comm = comm_for(block->comm_hash, node.name, block->pid, news);
    // A split child's member is named by its agent with the rank it had
    // before the split; stored and matched by its rank in the child.
    const std::optional<int32_t> rank = rank_in(node, comm, block->rank);
    MemberState* claimed = rank ? claim_member(node, comm, *rank, block->pid, news, "collectives") : nullptr;
    if (!claimed) {
      if (comm.members.empty()) {
        changed.erase(comm.hash);
        drop_if_empty(comm.hash);
      } else if (news) {
        changed.insert(comm.hash);
      }
      return;
    }
    MemberState& member = *claimed;
    news |= comm.lanes.insert(block->lane).second;
    if (news) changed.insert(comm.hash);
    uint64_t latest_ns = clock_.realtime_ns() + kMaxFutureNs;
    size_t taken = 0, future = 0;
    block_records_.clear();
    for (const auto& call : block->records) {
      StoredRecord record;
      record.key = RecordKey{block->comm_hash, block->lane, *rank, call.seq};
      record.call = call;
      record.call.issue_ns = node.clock.to_cluster(call.issue_ns);
      record.call.return_ns = node.clock.to_cluster(call.return_ns);
      if (record.call.issue_ns > latest_ns || record.call.return_ns > latest_ns) {
        ++future;
        continue;
      }
      ++taken;
      record.pid = block->pid;
      pending_.put_record(record);
      if (block->lane == 0 && static_cast<int64_t>(call.seq) > member.last_seq) {
        member.last_seq = static_cast<int64_t>(call.seq);
        member.last_issue_ns = record.call.issue_ns;
      }
      block_records_.push_back(record.call);
    }
    if (!block_records_.empty())
      for (RecordObserver* observer : observers_) observer->on_records(comm, *rank, block->lane, block_records_);
    if (future)
      bad_message(&node, "batch " + std::to_string(batch.getSeq()) + ": " + std::to_string(future) +
                             " record(s) of comm " + hex64(comm.hash) +
                             " stamped more than an hour past the collector's clock; skipped");
    member.records += taken;
    records += taken;
    if (!member.progress_dirty) {
      member.progress_dirty = true;
      dirty_members_.emplace_back(comm.hash, *rank);
    }
  });
  return records;
}

void Ingest::apply_waits(NodeState& node, wire::Batch::Reader batch, const proto::BatchFrame& frame) {
  for (auto columns : batch.getWaits()) {
    auto block = proto::decode_waits(columns, frame);
    if (!block) {
      bad_message(&node, "batch " + std::to_string(batch.getSeq()) + ": " + block.error().message + "; waits skipped");
      continue;
    }
    counters_.waits += block->waits.size();
    uint64_t latest_ns = clock_.realtime_ns() + kMaxFutureNs;
    size_t future = 0;
    block_waits_.clear();
    for (const auto& w : block->waits) {
      if (w.result != 0) continue;
      const HostWait wait{node.clock.to_cluster(w.start_ns), node.clock.to_cluster(w.end_ns)};
      if (wait.end_ns > latest_ns) {
        ++future;
        continue;
      }
      block_waits_.push_back(wait);
    }
    if (!block_waits_.empty())
      for (RecordObserver* observer : observers_) observer->on_waits(node.name, block->pid, block_waits_);
    if (future)
      bad_message(&node, "batch " + std::to_string(batch.getSeq()) + ": " + std::to_string(future) +
                             " wait(s) ending more than an hour past the collector's clock; skipped");
  }
}

void Ingest::apply_gpu(NodeState& node, wire::Batch::Reader batch, const proto::BatchFrame& frame) {
  for (auto columns : batch.getGpuCollectives()) {
    auto block = proto::decode_gpu(columns, frame);
    if (!block) {
      bad_message(&node, "batch " + std::to_string(batch.getSeq()) + ": " + block.error().message +
                              "; GPU records skipped");
      continue;
    }
    // The plugin names the member by its rank in the communicator (also in
    // a split child), which its host records claimed first. A block for a
    // member held by another node or process is a forged claim.
    auto it = model_.comms.find(block->comm_hash);
    const CommState* comm = it == model_.comms.end() ? nullptr : &it->second;
    auto m = comm ? comm->members.find(block->rank) : std::map<int32_t, MemberState>::const_iterator();
    if (!comm || m == comm->members.end()) {
      counters_.gpu_unmatched += block->records.size();
      continue;
    }
    if (m->second.node != node.name || m->second.pid != block->pid) {
      counters_.gpu_unmatched += block->records.size();
      refuse_claim(node, "GPU records of comm " + hex64(comm->hash) + " rank " + std::to_string(block->rank) +
                             " by pid " + std::to_string(block->pid) + ", a member held by another process");
      continue;
    }
    const uint64_t latest_ns = clock_.realtime_ns() + kMaxFutureNs;
    size_t future = 0;
    for (const auto& r : block->records) {
      proto::GpuRecord g = r;
      g.enqueued_ns = node.clock.to_cluster(r.enqueued_ns);
      g.kernel_start_ns = node.clock.to_cluster(r.kernel_start_ns);
      g.kernel_end_ns = node.clock.to_cluster(r.kernel_end_ns);
      if (g.kernel_end_ns > latest_ns || g.enqueued_ns > latest_ns) {
        ++future;
        continue;
      }
      ++counters_.gpu_records;
      for (RecordObserver* observer : observers_) observer->on_gpu(*comm, block->rank, block->op, g);
    }
    if (future)
      bad_message(&node, "batch " + std::to_string(batch.getSeq()) + ": " + std::to_string(future) +
                             " GPU record(s) stamped more than an hour past the collector's clock; skipped");
  }
}

}  // namespace rankscope::collector
