#pragma once
// The agent messages the tests feed the collector, built with the agent's
// own encoders (proto/agent_wire.h, proto/codec.h): what a test sends is
// what an agent sends. Tests of malformed or hostile input (codec, hostile
// input, adversary) build theirs field by field, on purpose.
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "proto/agent_wire.h"
#include "proto/codec.h"

namespace rankscope::testing {

// A traced process as its agent announces it.
inline proto::ProcessIdentity process(uint32_t pid, const std::string& job, const std::string& account = "",
                                      const std::string& user = "") {
  proto::ProcessIdentity p;
  p.pid = pid;
  p.job = job;
  p.account = account;
  p.user = user;
  return p;
}

// Process `pid` is rank `rank` of communicator `hash` of `nranks` ranks.
inline proto::CommJoined member(uint32_t pid, uint64_t hash, int32_t rank, int32_t nranks) {
  proto::CommJoined c;
  c.pid = pid;
  c.hash = hash;
  c.rank = rank;
  c.nranks = nranks;
  return c;
}

// An agent's record of AllReduce #seq of 1,024 floats, issued at `issue_ns`
// (its node's clock) and back 1 us later.
inline proto::CallRecord allreduce_call(uint64_t seq, uint64_t issue_ns) {
  proto::CallRecord r;
  r.seq = seq;
  r.issue_ns = issue_ns;
  r.return_ns = issue_ns + 1000;
  r.op = RS_OP_ALLREDUCE;
  r.datatype = 7;  // float32
  r.count = 1024;
  return r;
}

// A clock probe that puts the node's offset at 0 within 50 ns.
inline std::array<uint64_t, 4> tight_clock_sample() { return {1000, 1050, 1060, 1110}; }

// One batch of an agent instance.
struct AgentBatch {
  uint64_t instance = 1, seq = 1;
  uint64_t created_ns = 0;  // when the agent closed it (its clock); 0: not said
  std::vector<proto::ProcessIdentity> processes;
  std::vector<proto::CommJoined> comms;
  std::vector<std::array<uint64_t, 4>> clock_samples;
  std::vector<proto::ColumnBlock> calls;
  std::vector<proto::WaitBlock> waits;
  std::vector<proto::GpuBlock> gpu;  // from the profiler plugin's rings
  std::vector<std::pair<uint32_t, uint64_t>> comm_ends;  // (pid, comm): ncclCommDestroy
  bool compact = false;                                  // as to a collector that reads it so: a table, compressed

  std::string bytes() const {
    std::string packed = proto::encode_batch(instance, seq, created_ns, [&](proto::wire::Batch::Builder b) {
      std::vector<const proto::ProcessIdentity*> identities;
      for (const auto& p : processes) identities.push_back(&p);
      if (!identities.empty()) proto::write_processes(identities, b);
      if (!comms.empty()) proto::write_comms(comms, b);
      if (!clock_samples.empty()) proto::write_clock_samples(clock_samples, b);
      std::vector<const proto::ColumnBlock*> blocks;
      for (const auto& block : calls) blocks.push_back(&block);
      std::vector<const proto::GpuBlock*> gpu_blocks;
      for (const auto& block : gpu) gpu_blocks.push_back(&block);
      if (!blocks.empty() || !gpu_blocks.empty())
        proto::encode_collectives(blocks, b, gpu_blocks,
                                  compact ? proto::BlockLayout::table : proto::BlockLayout::columns);
      if (!waits.empty()) proto::encode_waits(waits, b);
      if (!comm_ends.empty()) {
        auto ends = b.initCommEnds(static_cast<unsigned>(comm_ends.size()));
        for (unsigned i = 0; i < comm_ends.size(); ++i) {
          ends[i].setPid(comm_ends[i].first);
          ends[i].setCommHash(comm_ends[i].second);
          ends[i].setKind(proto::wire::CommEndKind::DESTROY);
        }
      }
    });
    return compact ? proto::encode_compressed(packed) : packed;
  }
};

}  // namespace rankscope::testing
