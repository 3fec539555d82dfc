#include "proto/agent_wire.h"

#include <capnp/message.h>

#include "proto/codec.h"
#include "proto/compress.h"
#include "proto/limits.h"

namespace rankscope::proto {

std::string encode_hello(const Hello& h) {
  capnp::MallocMessageBuilder message;
  auto hello = message.initRoot<wire::AgentMessage>().initHello();
  hello.setProtocolVersion(wire::PROTOCOL_VERSION);
  hello.setNode(h.node);
  hello.setInstanceId(h.instance_id);
  hello.setBootId(h.boot_id);
  hello.setAgentVersion(h.agent_version);
  hello.setKernelRelease(h.kernel_release);
  hello.setMonotonicNs(h.monotonic_ns);
  hello.setRealtimeNs(h.realtime_ns);
  hello.setTakesDetail(true);  // this build's agent reads DetailRequest
  hello.setFollowsFleet(h.follows_fleet);
  return to_packed(message);
}

std::string encode_clock_probe(uint64_t t1) {
  capnp::MallocMessageBuilder message;
  message.initRoot<wire::AgentMessage>().initClockProbe().setT1(t1);
  return to_packed(message);
}

std::optional<uint64_t> read_clock_probe(std::string_view packed) {
  if (packed.size() > kMaxClockProbeBytes) return std::nullopt;
  std::optional<uint64_t> t1;
  auto read = read_packed<wire::AgentMessage>(packed, ReadLimits{}, [&](auto message) {
    if (message.which() == wire::AgentMessage::CLOCK_PROBE) t1 = message.getClockProbe().getT1();
  });
  return read ? t1 : std::nullopt;
}

std::string encode_clock_reply(uint64_t t1, uint64_t t2, uint64_t t3) {
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::CollectorMessage>().initClockReply();
  reply.setT1(t1);
  reply.setT2(t2);
  reply.setT3(t3);
  return to_packed(message);
}

std::optional<std::array<uint64_t, 3>> read_clock_reply(std::string_view packed) {
  std::optional<std::array<uint64_t, 3>> times;
  auto read = read_packed<wire::CollectorMessage>(packed, ReadLimits{}, [&](auto message) {
    if (message.which() != wire::CollectorMessage::CLOCK_REPLY) return;
    auto reply = message.getClockReply();
    times = std::array<uint64_t, 3>{reply.getT1(), reply.getT2(), reply.getT3()};
  });
  return read ? times : std::nullopt;
}

std::string clock_probe_endpoint(const std::string& connected_to, uint16_t port) {
  const size_t colon = connected_to.rfind(':');
  if (port == 0 || connected_to.rfind("tcp://", 0) != 0 || colon == std::string::npos || colon < 6) return "";
  return connected_to.substr(0, colon + 1) + std::to_string(port);
}

std::string encode_heartbeat(const HeartbeatHeader& header, const std::function<void(wire::Heartbeat::Builder)>& fill) {
  capnp::MallocMessageBuilder message;
  auto hb = message.initRoot<wire::AgentMessage>().initHeartbeat();
  hb.setInstanceId(header.instance_id);
  hb.setMonotonicNs(header.monotonic_ns);
  hb.setUnackedBatches(header.unacked_batches);
  fill(hb);
  return to_packed(message);
}

std::string encode_batch(uint64_t instance_id, uint64_t seq, uint64_t created_ns,
                         const std::function<void(wire::Batch::Builder)>& fill) {
  capnp::MallocMessageBuilder message;
  auto batch = message.initRoot<wire::AgentMessage>().initBatch();
  batch.setInstanceId(instance_id);
  batch.setSeq(seq);
  batch.setCreatedNs(created_ns);
  fill(batch);
  return to_packed(message);
}

namespace {
std::string as_compressed(const std::string& frame) {
  capnp::MallocMessageBuilder message;
  message.initRoot<wire::AgentMessage>().setCompressed(
      capnp::Data::Reader(reinterpret_cast<const kj::byte*>(frame.data()), frame.size()));
  return to_packed(message);
}
}  // namespace

std::string encode_compressed(std::string_view packed) {
  return as_compressed(compress(packed));
}

std::string encode_compact(std::string_view packed) {
  const std::string frame = compress(packed);
  const std::string compressed = as_compressed(frame);
  if (compressed.size() >= packed.size()) return std::string(packed);
  // Compressed only where the collector takes it so (proto/limits.h,
  // proto/compress.h): a batch of long, repetitive strings or of empty
  // columns can compress past those bounds, and would be refused for good.
  uint64_t records = 0, words = 0;
  auto read = read_packed<wire::AgentMessage>(packed, ReadLimits{}, [&](wire::AgentMessage::Reader message) {
    words = message.totalSize().wordCount;
    if (message.which() != wire::AgentMessage::BATCH) return;
    auto batch = message.getBatch();
    auto shape = block_shape(batch);
    records = shape ? shape->claimed : kMaxRecordsPerBatch;
  });
  const uint64_t wire = compressed.size();
  const bool takes = read && packed.size() <= kMaxInflation * frame.size() + kInflationFloor &&
                     records <= kRecordsFloor + kRecordsPerWireByte * wire &&
                     2 * words <= kWordsPerWireByte * wire + kWordsFloor;
  return takes ? compressed : std::string(packed);
}

namespace {
// Each string of an identity, with its name and bound.
template <typename Identity, typename Visit>
void for_each_text(Identity& id, Visit&& visit) {
  visit("exe", id.exe, kMaxIdentityPath);
  visit("cgroup path", id.cgroup_path, kMaxIdentityPath);
  visit("job", id.job, kMaxIdentityText);
  visit("user", id.user, kMaxIdentityText);
  visit("account", id.account, kMaxIdentityText);
  visit("visible devices", id.visible_devices, kMaxIdentityText);
  visit("Slurm step", id.slurm_step, kMaxIdentityText);
  visit("pod uid", id.pod_uid, kMaxIdentityText);
  visit("pod namespace", id.pod_namespace, kMaxIdentityText);
  visit("pod name", id.pod_name, kMaxIdentityText);
  visit("container id", id.container_id, kMaxIdentityText);
}
}  // namespace

std::vector<std::string> limit_identity(ProcessIdentity& identity) {
  std::vector<std::string> changed;
  for_each_text(identity, [&](const char* what, std::string& text, uint64_t limit) {
    if (text.size() <= limit) return;
    changed.push_back(std::string(what) + " of " + std::to_string(text.size()) + " bytes");
    text.clear();
  });
  if (identity.cuda_devices.size() > kMaxCudaDevices) {
    changed.push_back(std::to_string(identity.cuda_devices.size()) + " CUDA devices");
    identity.cuda_devices.resize(kMaxCudaDevices);
  }
  return changed;
}

uint64_t identity_wire_bytes(const ProcessIdentity& identity) {
  // A text is its bytes, a NUL and padding to a word, each word with a tag.
  uint64_t bytes = kWireProcessBytes + 9 * identity.cuda_devices.size() / 2 + 9;
  for_each_text(identity, [&](const char*, const std::string& text, uint64_t) { bytes += (text.size() / 8 + 1) * 9; });
  return bytes;
}

void write_processes(const std::vector<const ProcessIdentity*>& processes, wire::Batch::Builder batch) {
  auto procs = batch.initProcesses(static_cast<unsigned>(processes.size()));
  for (unsigned i = 0; i < processes.size(); ++i) {
    const ProcessIdentity& id = *processes[i];
    auto p = procs[i];
    p.setPid(id.pid);
    p.setStartTime(id.start_time);
    p.setExe(id.exe);
    p.setJob(id.job);
    p.setRank(id.rank);
    p.setLocalRank(id.local_rank);
    p.setWorldSize(id.world_size);
    p.setUid(id.uid);
    p.setUser(id.user);
    p.setAccount(id.account);
    p.setVisibleDevices(id.visible_devices);
    p.setCgroupPath(id.cgroup_path);
    p.setSlurmStep(id.slurm_step);
    p.setPodUid(id.pod_uid);
    p.setPodNamespace(id.pod_namespace);
    p.setPodName(id.pod_name);
    p.setContainerId(id.container_id);
    p.setCgroupId(id.cgroup_id);
    if (!id.cuda_devices.empty()) {
      auto devices = p.initCudaDevices(static_cast<unsigned>(id.cuda_devices.size()));
      for (unsigned d = 0; d < id.cuda_devices.size(); ++d) devices.set(d, id.cuda_devices[d]);
    }
  }
}

void write_comms(const std::vector<CommJoined>& comms, wire::Batch::Builder batch) {
  auto out = batch.initComms(static_cast<unsigned>(comms.size()));
  for (unsigned k = 0; k < comms.size(); ++k) {
    const CommJoined& c = comms[k];
    auto o = out[k];
    o.setPid(c.pid);
    o.setCommHash(c.hash);
    o.setHandle(c.handle);
    o.setRank(c.rank);
    o.setNranks(c.nranks);
    o.setOrigin(c.origin);
    o.setEntryNs(c.entry_ns);
    o.setReturnNs(c.return_ns);
    o.setResult(c.result);
    o.setParentHash(c.parent_hash);
    if (c.origin == wire::CommOrigin::SPLIT) {
      o.setSplitColor(c.color);
      o.setSplitKey(c.key);
      o.setSplitIndex(c.split_index);
    }
  }
}

void write_clock_samples(const std::vector<std::array<uint64_t, 4>>& samples, wire::Batch::Builder batch) {
  auto out = batch.initClockSamples(static_cast<unsigned>(samples.size()));
  for (unsigned k = 0; k < samples.size(); ++k) {
    out[k].setT1(samples[k][0]);
    out[k].setT2(samples[k][1]);
    out[k].setT3(samples[k][2]);
    out[k].setT4(samples[k][3]);
  }
}

}  // namespace rankscope::proto
