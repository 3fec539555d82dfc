#pragma once
// A cluster model built by hand, as the ingest would leave it: for the unit
// tests that feed the detectors and the ledger from the matcher alone.
#include <string>

#include "collector/model/cluster.h"
#include "proto/records.h"

namespace rankscope::testing {

// Communicator `hash` of `nranks` ranks of `job`, two per node ("node-0",
// "node-1", ...), each node's clock exact to 100 ns, rank r as pid 100 + r.
inline collector::CommState& add_comm(collector::ClusterModel& model, uint64_t hash, int32_t nranks,
                                      const std::string& job) {
  collector::CommState& comm = model.comms[hash];
  comm.hash = hash;
  comm.job = job;
  comm.nranks = nranks;
  comm.lanes.insert(0);
  for (int32_t r = 0; r < nranks; ++r) {
    std::string node = "node-" + std::to_string(r / 2);
    collector::NodeState& n = model.nodes[node];
    n.name = node;
    if (n.clock.samples() == 0) n.clock.add({1000, 1050, 1060, 1110});
    collector::MemberState& m = comm.members[r];
    m.rank = r;
    m.node = node;
    m.pid = 100 + static_cast<uint32_t>(r);
    collector::ProcessInfo& p = model.processes[{node, m.pid}];
    p.job = job;
    p.rank = r;
  }
  return comm;
}

// AllReduce #seq of 1,024 floats by `member`, issued at `issue_ns` (cluster
// clock) and back 10 us later; the member's progress moved as the ingest moves it.
inline proto::CallRecord allreduce(collector::MemberState& member, uint64_t seq, uint64_t issue_ns) {
  proto::CallRecord call;
  call.seq = seq;
  call.issue_ns = issue_ns;
  call.return_ns = issue_ns + 10'000;
  call.op = RS_OP_ALLREDUCE;
  call.datatype = 7;  // float32
  call.count = 1024;
  member.last_seq = static_cast<int64_t>(seq);
  member.last_issue_ns = issue_ns;
  ++member.records;
  return call;
}

}  // namespace rankscope::testing
