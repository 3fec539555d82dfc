#include "tests/fuzz/samples.h"

#include <capnp/message.h>

#include "proto/agent_wire.h"
#include "proto/codec.h"

namespace rankscope::fuzz {

namespace wire = proto::wire;
namespace query = proto::query;

std::vector<std::string_view> split_messages(std::string_view input) {
  std::vector<std::string_view> messages;
  for (;;) {
    size_t at = input.find(kMessageSeparator);
    messages.push_back(input.substr(0, at));
    if (at == std::string_view::npos) break;
    input.remove_prefix(at + kMessageSeparator.size());
  }
  return messages;
}

std::string join_messages(const std::vector<std::string>& messages) {
  std::string joined;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i) joined += kMessageSeparator;
    joined += messages[i];
  }
  return joined;
}

std::string hello(const std::string& node, uint64_t instance) {
  return proto::encode_hello({.node = node,
                              .instance_id = instance,
                              .boot_id = "2f6a1c1e-8d2b-4c55-9a7e-0c3d1f5e9b21",
                              .agent_version = "0.1.0",
                              .kernel_release = "6.1.0-18-amd64",
                              .monotonic_ns = 1'000'000'000,
                              .realtime_ns = 1'800'000'000'000'000'000ull});
}

std::string routed(uint8_t route, const std::string& message) { return std::string(1, static_cast<char>(route)) + message; }

std::string comm_end(uint64_t seq, int32_t rank, uint64_t instance) {
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<wire::AgentMessage>().initBatch();
  b.setInstanceId(instance);
  b.setSeq(seq);
  auto ends = b.initCommEnds(1);
  ends[0].setPid(100 + static_cast<uint32_t>(rank));
  ends[0].setCommHash(kCommHash);
  return proto::to_packed(message);
}

namespace {
std::string batch_as(proto::BlockLayout layout, uint64_t seq, int32_t rank, uint64_t first_seq, size_t records,
                     uint64_t instance, int32_t nranks, uint64_t start_time);
}  // namespace

std::string batch(uint64_t seq, int32_t rank, uint64_t first_seq, size_t records, uint64_t instance, int32_t nranks,
                  uint64_t start_time) {
  return batch_as(proto::BlockLayout::columns, seq, rank, first_seq, records, instance, nranks, start_time);
}

std::string compact_batch(uint64_t seq, int32_t rank, uint64_t first_seq, size_t records) {
  return proto::encode_compressed(  // compressed whatever its size, to cover the path
      batch_as(proto::BlockLayout::table, seq, rank, first_seq, records, kInstance, 2, 4242));
}

namespace {
std::string batch_as(proto::BlockLayout layout, uint64_t seq, int32_t rank, uint64_t first_seq, size_t records,
                     uint64_t instance, int32_t nranks, uint64_t start_time) {
  const uint32_t pid = 100 + static_cast<uint32_t>(rank);
  const uint64_t t0 = 2'000'000'000 + first_seq * 1'000'000;
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<wire::AgentMessage>().initBatch();
  b.setInstanceId(instance);
  b.setSeq(seq);
  b.setCreatedNs(t0 + records * 1'000'000);
  auto procs = b.initProcesses(1);
  procs[0].setPid(pid);
  procs[0].setStartTime(start_time);
  procs[0].setExe("/usr/bin/python3");
  procs[0].setJob("job-7");
  procs[0].setRank(rank);
  procs[0].setLocalRank(rank);
  procs[0].setWorldSize(2);
  procs[0].setUser("alice");
  procs[0].setAccount("physics");
  procs[0].setVisibleDevices("0,1");
  procs[0].setSlurmStep("0");
  auto comms = b.initComms(1);
  comms[0].setPid(pid);
  comms[0].setCommHash(kCommHash);
  comms[0].setRank(rank);
  comms[0].setNranks(nranks);
  comms[0].setOrigin(wire::CommOrigin::INIT_RANK);
  auto samples = b.initClockSamples(1);
  samples[0].setT1(t0);
  samples[0].setT2(1'800'000'000'000'000'000ull + 10'000);
  samples[0].setT3(1'800'000'000'000'000'000ull + 12'000);
  samples[0].setT4(t0 + 30'000);
  b.initDrops().setRingbufFull(1);

  proto::ColumnBlock collectives;
  collectives.pid = pid;
  collectives.comm_hash = kCommHash;
  collectives.rank = rank;
  for (size_t i = 0; i < records; ++i) {
    proto::CallRecord r;
    r.seq = first_seq + i;
    r.issue_ns = t0 + i * 1'000'000 + static_cast<uint64_t>(rank) * 3'000;
    r.return_ns = r.issue_ns + 8'000;
    r.count = i % 3 == 2 ? 1024 : 1 << 20;
    r.op = i % 3 == 2 ? RS_OP_ALLGATHER : RS_OP_ALLREDUCE;
    r.datatype = 7;  // float32
    collectives.records.push_back(r);
  }
  proto::ColumnBlock p2p;  // lane 1 + 2*peer + isRecv: sends to the other rank
  p2p.pid = pid;
  p2p.comm_hash = kCommHash;
  p2p.rank = rank;
  p2p.lane = 1 + 2 * static_cast<uint32_t>(1 - rank);
  proto::CallRecord send;
  send.seq = first_seq;
  send.issue_ns = t0 + 500'000;
  send.return_ns = send.issue_ns + 2'000;
  send.count = 4096;
  send.op = RS_OP_SEND;
  send.datatype = 0;
  send.peer = 1 - rank;
  p2p.records.push_back(send);
  proto::encode_collectives({&collectives, &p2p}, b, {}, layout);

  proto::WaitBlock waits;
  waits.pid = pid;
  waits.tid = pid;
  waits.waits.push_back({1, 0x7f00, t0 + 100'000, t0 + 900'000, 0});
  waits.waits.push_back({2, 0, t0 + 1'100'000, t0 + 1'500'000, 0});
  proto::encode_waits({waits}, b);

  if (records == 0) {
    auto ends = b.initCommEnds(1);
    ends[0].setPid(pid);
    ends[0].setCommHash(kCommHash);
    ends[0].setKind(wire::CommEndKind::DESTROY);
    ends[0].setNs(t0);
  }
  return proto::to_packed(message);
}
}  // namespace

std::string heartbeat(uint32_t pid, bool alive, bool open_wait) {
  capnp::MallocMessageBuilder message;
  auto h = message.initRoot<wire::AgentMessage>().initHeartbeat();
  h.setInstanceId(kInstance);
  h.setMonotonicNs(3'000'000'000);
  h.setTracedProcesses(1);
  h.initDrops().setMapFull(2);
  auto procs = h.initProcesses(1);
  procs[0].setPid(pid);
  procs[0].setAlive(alive);
  procs[0].setState(alive ? 'S' : 'Z');
  procs[0].setCpuNs(5'000'000);
  procs[0].setRunqueueNs(1'000);
  procs[0].setSampleNs(3'000'000'000);
  if (!alive) procs[0].setExitSignal(9);
  if (open_wait) {
    auto waits = h.initOpenWaits(1);
    waits[0].setPid(pid);
    waits[0].setTid(pid);
    waits[0].setKind(wire::WaitKind::STREAM_SYNCHRONIZE);
    waits[0].setObject(0x7f00);
    waits[0].setStartNs(2'900'000'000);
  }
  return proto::to_packed(message);
}

std::string clock_probe(uint64_t t1) {
  capnp::MallocMessageBuilder message;
  message.initRoot<wire::AgentMessage>().initClockProbe().setT1(t1);
  return proto::to_packed(message);
}

namespace {
query::Request::Builder request(capnp::MallocMessageBuilder& message) {
  auto r = message.initRoot<query::Request>();
  r.setProtocolVersion(query::QUERY_PROTOCOL_VERSION);
  return r;
}
}  // namespace

std::string status_request() {
  capnp::MallocMessageBuilder message;
  request(message).setStatus();
  return proto::to_packed(message);
}

std::string jobs_request() {
  capnp::MallocMessageBuilder message;
  request(message).setJobs();
  return proto::to_packed(message);
}

std::string timeline_request(const std::string& comm_prefix, int32_t rank, uint32_t last) {
  capnp::MallocMessageBuilder message;
  auto t = request(message).initTimeline();
  t.setComm(comm_prefix);
  t.setRank(rank);
  t.setLast(last);
  return proto::to_packed(message);
}

std::string findings_request(bool open_only, const std::string& kind, uint32_t limit) {
  capnp::MallocMessageBuilder message;
  auto f = request(message).initFindings();
  f.setOpenOnly(open_only);
  f.setKind(kind);
  f.setLimit(limit);
  return proto::to_packed(message);
}

std::string future_request() {
  capnp::MallocMessageBuilder message;
  auto r = request(message);
  r.setProtocolVersion(query::QUERY_PROTOCOL_VERSION + 1);
  r.setStatus();
  return proto::to_packed(message);
}

}  // namespace rankscope::fuzz
