#include "collector/ingest/validate.h"

#include "common/log.h"

namespace rankscope::collector {

namespace {
Result<void> check_length(const char* what, uint32_t size, uint32_t limit) {
  if (size <= limit) return {};
  return make_error(Errc::protocol, std::string(what) + " has " + std::to_string(size) + " entries (limit " +
                                        std::to_string(limit) + ")");
}

Result<void> check_rank(const char* what, int32_t value, int32_t below) {
  if (value == -1 || (value >= 0 && value < below)) return {};
  return make_error(Errc::protocol, std::string(what) + " " + std::to_string(value) + " is out of range");
}
}  // namespace

Result<void> check_batch(wire::Batch::Reader batch, size_t wire_bytes) {
  for (auto r : {check_length("batch: processes", batch.getProcesses().size(), kMaxListEntries),
                 check_length("batch: comms", batch.getComms().size(), kMaxListEntries),
                 check_length("batch: comm ends", batch.getCommEnds().size(), kMaxListEntries),
                 check_length("batch: comm table", batch.getCommTable().size(), kMaxListEntries),
                 check_length("batch: collective blocks", batch.getCollectives().size(), kMaxListEntries),
                 check_length("batch: wait blocks", batch.getWaits().size(), kMaxListEntries),
                 check_length("batch: GPU blocks", batch.getGpuCollectives().size(), kMaxListEntries),
                 check_length("batch: clock samples", batch.getClockSamples().size(), kMaxClockSamples)})
    if (!r) return r;
  auto shape = proto::block_shape(batch);
  if (!shape) return make_error(Errc::protocol, "batch: " + shape.error().message);
  if (shape->blocks > kMaxListEntries)
    return make_error(Errc::protocol, "batch: collective blocks and table rows number " +
                                          std::to_string(shape->blocks) + " (limit " + std::to_string(kMaxListEntries) +
                                          ")");
  const uint64_t records = shape->claimed;
  if (records > kMaxRecordsPerBatch)
    return make_error(Errc::protocol, "batch claims " + std::to_string(records) + " records and waits (limit " +
                                          std::to_string(kMaxRecordsPerBatch) + ")");
  uint64_t allowed = kRecordsFloor + kRecordsPerWireByte * static_cast<uint64_t>(wire_bytes);
  if (records > allowed)
    return make_error(Errc::protocol, "batch of " + std::to_string(wire_bytes) + " bytes claims " +
                                          std::to_string(records) + " records and waits (at most " +
                                          std::to_string(allowed) + " for its size)");
  return {};
}

Result<void> check_heartbeat(wire::Heartbeat::Reader heartbeat) {
  for (auto r : {check_length("heartbeat: processes", heartbeat.getProcesses().size(), kMaxListEntries),
                 check_length("heartbeat: open waits", heartbeat.getOpenWaits().size(), kMaxListEntries),
                 check_length("heartbeat: open GPU collectives", heartbeat.getGpuOpen().size(), kMaxListEntries)})
    if (!r) return r;
  return {};
}

Result<void> check_comm(wire::Comm::Reader comm) {
  // A split child's size is its color's members, which no one member knows
  // (the agent says -1); its members are named by their parent ranks.
  if (comm.getOrigin() == wire::CommOrigin::SPLIT && comm.getNranks() == -1) {
    if (comm.getRank() < 0 || comm.getRank() >= kMaxRanks)
      return make_error(Errc::protocol,
                        "split child member rank " + std::to_string(comm.getRank()) + " is out of range");
    return {};
  }
  if (comm.getNranks() < 1 || comm.getNranks() > kMaxRanks)
    return make_error(Errc::protocol, "communicator with " + std::to_string(comm.getNranks()) + " ranks (1 to " +
                                          std::to_string(kMaxRanks) + ")");
  if (comm.getRank() < 0 || comm.getRank() >= comm.getNranks())
    return make_error(Errc::protocol, "rank " + std::to_string(comm.getRank()) + " of a communicator of " +
                                          std::to_string(comm.getNranks()));
  return {};
}

Result<void> check_block(const proto::ColumnBlock& block) {
  return check_rank("collective block: rank", block.rank, kMaxRanks);
}

Result<void> check_process(wire::Process::Reader process) {
  for (auto r : {check_rank("process: rank", process.getRank(), kMaxRanks),
                 check_rank("process: local rank", process.getLocalRank(), kMaxRanks),
                 check_rank("process: world size", process.getWorldSize(), kMaxRanks + 1),
                 check_length("process: CUDA devices", process.getCudaDevices().size(), proto::kMaxCudaDevices)})
    if (!r) return r;
  const std::pair<const char*, capnp::Text::Reader> paths[] = {{"exe", process.getExe()},
                                                               {"cgroup path", process.getCgroupPath()}};
  const std::pair<const char*, capnp::Text::Reader> texts[] = {{"job", process.getJob()},
                                                               {"user", process.getUser()},
                                                               {"account", process.getAccount()},
                                                               {"visible devices", process.getVisibleDevices()},
                                                               {"Slurm step", process.getSlurmStep()},
                                                               {"pod uid", process.getPodUid()},
                                                               {"container id", process.getContainerId()},
                                                               {"pod namespace", process.getPodNamespace()},
                                                               {"pod name", process.getPodName()}};
  auto check_text = [](const char* what, capnp::Text::Reader text, uint64_t limit) -> Result<void> {
    if (text.size() <= limit) return {};
    return make_error(Errc::protocol, std::string("process: ") + what + " is " + std::to_string(text.size()) +
                                          " bytes (limit " + std::to_string(limit) + ")");
  };
  for (const auto& [what, text] : paths)
    if (auto r = check_text(what, text, proto::kMaxIdentityPath); !r) return r;
  for (const auto& [what, text] : texts)
    if (auto r = check_text(what, text, proto::kMaxIdentityText); !r) return r;
  return {};
}

Result<void> check_node_name(const std::string& name) {
  if (name.empty() || name.size() > kMaxNodeName) return make_error(Errc::protocol, "node name must be 1 to 255 bytes");
  for (char c : name)
    if (c <= ' ' || c > '~') return make_error(Errc::protocol, "node name must be printable ASCII without spaces");
  return {};
}

bool BadMessageLog::report(const std::string& peer, const std::string& what, uint64_t now_ns) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    if (peers_.size() >= kMaxPeers) peers_.clear();  // forgets who was quiet; logs a line more at worst
    it = peers_.emplace(peer, Peer{}).first;
  } else if (now_ns - it->second.logged_ns < kIntervalNs) {
    ++it->second.suppressed;
    return false;
  }
  if (it->second.suppressed)
    RS_LOG(warn, "bad message from %s: %s (and %llu more not logged in the last %llu s)", peer.c_str(), what.c_str(),
           static_cast<unsigned long long>(it->second.suppressed),
           static_cast<unsigned long long>(kIntervalNs / 1'000'000'000ull));
  else
    RS_LOG(warn, "bad message from %s: %s", peer.c_str(), what.c_str());
  it->second = Peer{now_ns, 0};
  return true;
}

}  // namespace rankscope::collector
