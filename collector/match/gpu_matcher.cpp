#include "collector/match/gpu_matcher.h"

#include <algorithm>

namespace rankscope::collector {

void GpuMatcher::on_gpu(const CommState& comm, int32_t rank, uint8_t op, const proto::GpuRecord& record) {
  // A Send's or Recv's kernel (its end is the detector's) is no instance of every rank.
  if (comm.nranks < 2 || rank < 0 || rank >= comm.nranks || !proto::op_is_collective(op)) return;
  Instances& open = comms_[comm.hash];
  auto [slot, made] = open.try_emplace(record.seq << 8 | op);
  Open& instance = slot->second;
  if (made) {
    budget_.opened(comm.hash, comm.nranks);
    instance.issue.assign(comm.nranks, 0);
    instance.enqueued.assign(comm.nranks, 0);
    instance.end.assign(comm.nranks, 0);
    instance.link_peer.assign(comm.nranks, -1);
    instance.link_wait.assign(comm.nranks, 0);
    instance.count = record.count;
  }
  if (instance.issue[rank] == 0) {  // a rank's record counts once
    instance.issue[rank] = std::max<uint64_t>(record.kernel_start_ns, 1);
    instance.enqueued[rank] = record.enqueued_ns;
    instance.end[rank] = record.kernel_end_ns;
    if (record.link_peer >= 0 && record.link_peer < comm.nranks && record.link_peer != rank) {
      instance.link_peer[rank] = record.link_peer;
      instance.link_wait[rank] = record.link_wait_ns;
    }
    instance.arrived += 1;
  }
  if (instance.arrived == comm.nranks) {
    ++completed_;
    GpuComplete done{comm,          op, record.seq, instance.issue, instance.enqueued, instance.end, instance.link_peer,
                     instance.link_wait, instance.count};
    for (GpuListener* listener : listeners_) listener->on_gpu_complete(done);
    budget_.close(comm.hash, open, slot);
  }
  budget_.enforce(comm.hash, comm.nranks, open, [&](uint64_t hash) {
    auto it = comms_.find(hash);
    return it == comms_.end() ? nullptr : &it->second;
  });
}

void GpuMatcher::sweep(const std::map<uint64_t, CommState>& comms) { sweep_open(comms_, comms, budget_); }

}  // namespace rankscope::collector
