#include "node-agent/summarise.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "common/format.h"
#include "common/log.h"
#include "common/placement.h"
#include "proto/limits.h"

namespace rankscope::agent {

namespace {
wire::CommOrigin origin_of(uint8_t op) {
  switch (op) {
    case RS_OP_COMM_INIT_RANK: return wire::CommOrigin::INIT_RANK;
    case RS_OP_COMM_INIT_RANK_CONFIG: return wire::CommOrigin::INIT_RANK_CONFIG;
    case RS_OP_COMM_INIT_ALL: return wire::CommOrigin::INIT_ALL;
    case RS_OP_COMM_SPLIT: return wire::CommOrigin::SPLIT;
    default: return wire::CommOrigin::UNKNOWN;
  }
}

uint64_t mix_hash(std::initializer_list<uint64_t> parts) {
  uint8_t bytes[8 * 8];
  size_t n = 0;
  for (uint64_t part : parts) {
    std::memcpy(bytes + n, &part, sizeof(part));
    n += sizeof(part);
    if (n == sizeof(bytes)) break;
  }
  return proto::comm_hash_of_unique_id(bytes, n);
}
}  // namespace

Summariser::Summariser(std::string proc_root, std::string node, const OffsetClock& clock,
                       std::string container_state_root, std::string slurm_jobs_dir)
    : proc_root_(std::move(proc_root)),
      container_state_root_(std::move(container_state_root)),
      slurm_jobs_dir_(std::move(slurm_jobs_dir)),
      cgroup_mounts_(read_cgroup_mounts("/proc/self/mountinfo")),
      node_(std::move(node)),
      clock_(clock) {}

Summariser::ProcessEntry& Summariser::process(uint32_t pid) {
  auto it = processes_.find(pid);
  if (it != processes_.end()) return it->second;
  ProcessEntry entry;
  if (auto identity = read_identity(proc_root_, pid, container_state_root_, slurm_jobs_dir_)) {
    entry.identity = std::move(*identity);
  } else {
    entry.identity.pid = pid;  // it exited already: keep what the events say
  }
  apply_overrides(pid, entry.identity);
  return processes_.emplace(pid, std::move(entry)).first->second;
}

void Summariser::on_event(const Event& event) {
  std::visit(
      [this](const auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, rs_call_event>) on_call(e);
        else if constexpr (std::is_same_v<T, rs_comm_init_event>) on_comm_init(e);
        else if constexpr (std::is_same_v<T, rs_wait_event>) on_wait(e);
        else if constexpr (std::is_same_v<T, rs_exit_event>) on_exit(e);
        else if constexpr (std::is_same_v<T, rs_setenv_event>) on_setenv(e);
        else if constexpr (std::is_same_v<T, rs_set_device_event>) on_set_device(e);
        else if constexpr (std::is_same_v<T, rs_async_error_event>) on_async_error(e);
        else on_comm_end(e);
      },
      event);
}

void Summariser::on_comm_init(const rs_comm_init_event& e) {
  ProcessEntry& proc = process(e.hdr.pid);
  if (!proc.identity.cgroup_id) proc.identity.cgroup_id = e.hdr.cgroup_id;
  // A profiler plugin makes its ring at the process's first communicator,
  // before NCCL returns from creating it.
  if (e.result == 0 && e.comm != 0) proc.ring_wanted = true;
  if (e.result != 0 || e.comm == 0) {
    // NCCL_SPLIT_NOCOLOR: the rank took part in the split and got no child.
    // It still counts among the parent's splits, so that the next child is
    // named alike on every member (below), and it is announced, so that the
    // collector knows when every rank of the parent has said what it did
    // in this split (it sizes the children then: docs/architecture.md).
    if (e.op == RS_OP_COMM_SPLIT && e.result == 0)
      if (auto parent = comms_.find({e.hdr.pid, e.parent_comm}); parent != comms_.end()) {
        const auto index = static_cast<int32_t>(++parent->second.splits);
        const proto::CommJoined marker{e.hdr.pid,
                                       proto::comm_hash_of_split(parent->second.hash, index, e.color),
                                       0,
                                       parent->second.hash,
                                       shift(e.entry_ns),
                                       shift(e.hdr.ts_ns),
                                       parent->second.rank,
                                       -1,
                                       e.result,
                                       wire::CommOrigin::SPLIT,
                                       e.color,
                                       e.key,
                                       index};
        new_comms_.push_back(marker);
        keep_no_color(parent->first, marker);
      }
    RS_LOG(info, "process %u: %s returned %s; no communicator", e.hdr.pid, proto::op_name(e.op).c_str(),
           proto::result_name(e.result).c_str());
    return;
  }
  CommEntry comm;
  comm.origin = origin_of(e.op);
  comm.nranks = e.nranks;
  comm.rank = e.rank;
  uint64_t parent_hash = 0;
  int32_t split_index = 0;
  if (e.op == RS_OP_COMM_SPLIT) {
    // Every member splits the parent in the same order with the same color:
    // (parent, order, color) names the child the same way everywhere, as
    // NCCL names it (its commHash).
    auto parent = comms_.find({e.hdr.pid, e.parent_comm});
    if (parent != comms_.end()) {
      parent_hash = parent->second.hash;
      split_index = static_cast<int32_t>(++parent->second.splits);
      comm.hash = proto::comm_hash_of_split(parent_hash, split_index, e.color);
      // A member of a child is named by its rank in the parent: unique among
      // the members, the same on every node, and the rank users know (NCCL's
      // own child rank follows from the keys; the collector can derive it).
      comm.rank = parent->second.rank;
    } else {
      comm.hash = mix_hash({0xdeadull, e.hdr.pid, e.comm});
      comm.origin = wire::CommOrigin::UNKNOWN;
      comm.rank = proc.identity.rank;
    }
    comm.nranks = -1;  // the members of the same color: known once they all reported
  } else if (e.op == RS_OP_COMM_INIT_ALL) {
    // One call made every rank, in this process: the call (its entry time)
    // names the communicator; ranks are the positions in the array.
    comm.hash = mix_hash({0x696e6974616c6cull, e.hdr.pid, proc.identity.start_time, e.entry_ns});
  } else {
    comm.hash = proto::comm_hash_of_unique_id(e.unique_id, sizeof(e.unique_id));
  }
  comm.joined = proto::CommJoined{e.hdr.pid,  comm.hash,   e.comm,   parent_hash, shift(e.entry_ns), shift(e.hdr.ts_ns),
                                  comm.rank,  comm.nranks, e.result, comm.origin, e.color,           e.key,
                                  split_index};
  comm.order = ++comm_order_;
  // (A handle made again without its end seen: the old one's are gone.)
  forget_no_color({e.hdr.pid, e.comm});
  comms_[{e.hdr.pid, e.comm}] = comm;
  if (proc.identity.job.empty()) proc.identity.job = "nccl-" + hex64(comm.hash).substr(0, 12);
  new_comms_.push_back(comm.joined);
  RS_LOG(debug, "process %u: communicator %s rank %d/%d", e.hdr.pid, hex64(comm.hash).c_str(), comm.rank,
         comm.nranks);
}

void Summariser::on_call(const rs_call_event& e) {
  ProcessEntry& proc = process(e.hdr.pid);
  if (!proc.identity.cgroup_id) proc.identity.cgroup_id = e.hdr.cgroup_id;
  auto it = comms_.find({e.hdr.pid, e.comm});
  if (it == comms_.end()) {
    // Created before we attached: name it locally so its records are kept,
    // marked; it cannot be matched with the other ranks (docs/architecture.md).
    CommEntry comm;
    comm.hash = mix_hash({0x756e6b6e6f776eull, e.hdr.pid, proc.identity.start_time, e.comm});
    comm.rank = proc.identity.rank;
    comm.nranks = proc.identity.world_size;
    comm.joined = proto::CommJoined{
        e.hdr.pid, comm.hash, e.comm, 0, 0, 0, comm.rank, comm.nranks, 0, wire::CommOrigin::UNKNOWN, 0, 0};
    comm.order = ++comm_order_;
    it = comms_.emplace(CommKey{e.hdr.pid, e.comm}, comm).first;
    new_comms_.push_back(comm.joined);
    if (proc.identity.job.empty()) proc.identity.job = "nccl-unknown";
  }
  if (e.flags & RS_CALL_UNKNOWN_COMM) ++unknown_comm_;
  auto& block = blocks_[{e.hdr.pid, it->second.hash, it->second.rank, e.lane}];
  if (block.records.empty()) {
    block.pid = e.hdr.pid;
    block.comm_hash = it->second.hash;
    block.rank = it->second.rank;
    block.lane = e.lane;
  }
  proto::CallRecord record;
  record.seq = e.seq;
  record.issue_ns = shift(e.entry_ns);
  record.return_ns = shift(e.hdr.ts_ns);
  record.count = e.count;
  record.peer = e.peer;
  record.op = e.op;
  record.datatype = e.datatype;
  record.redop = e.redop;
  record.result = static_cast<uint8_t>(e.result);
  record.flags = e.flags;
  // Records of one lane come in call order from one thread; if two threads
  // share a communicator (NCCL forbids concurrent use), keep seq order.
  if (!block.records.empty() && block.records.back().seq > record.seq) {
    auto pos = std::upper_bound(block.records.begin(), block.records.end(), record,
                                [](const auto& a, const auto& b) { return a.seq < b.seq; });
    block.records.insert(pos, record);
  } else {
    block.records.push_back(record);
  }
  ++pending_records_;
}

void Summariser::on_comm_end(const rs_comm_end_event& e) {
  auto it = comms_.find({e.hdr.pid, e.comm});
  if (it == comms_.end()) return;
  ended_comms_.push_back(
      PendingEnd{e.hdr.pid, it->second.hash, shift(e.hdr.ts_ns), e.result, e.op == RS_OP_COMM_ABORT});
  forget_no_color(it->first);  // nothing of it is announced again
  comms_.erase(it);
}

void Summariser::keep_no_color(const CommKey& parent, const proto::CommJoined& marker) {
  no_color_.emplace(++comm_order_, marker);
  auto& mine = no_color_of_[parent];
  if (!mine.empty()) no_color_holders_.erase({mine.size(), parent});
  mine.push_back(comm_order_);
  no_color_holders_.emplace(mine.size(), parent);
  if (no_color_.size() <= kMaxNoColorKept) return;
  // The oldest of the communicator holding the most: a process splitting
  // without a color in a loop drops its own first.
  auto top = std::prev(no_color_holders_.end());
  const CommKey most = top->second;
  no_color_holders_.erase(top);
  auto& theirs = no_color_of_[most];
  no_color_.erase(theirs.front());
  theirs.pop_front();
  if (theirs.empty())
    no_color_of_.erase(most);
  else
    no_color_holders_.emplace(theirs.size(), most);
}

void Summariser::forget_no_color(const CommKey& parent) {
  auto mine = no_color_of_.find(parent);
  if (mine == no_color_of_.end()) return;
  for (uint64_t order : mine->second) no_color_.erase(order);
  no_color_holders_.erase({mine->second.size(), parent});
  no_color_of_.erase(mine);
}

void Summariser::on_wait(const rs_wait_event& e) {
  process(e.hdr.pid);
  waits_.push_back(e);
}

void Summariser::on_exit(const rs_exit_event& e) {
  if (processes_.count(e.hdr.pid)) {
    exit_codes_[e.hdr.pid] = e.exit_code;
    final_host_[e.hdr.pid] = e.host;
  }
}

void Summariser::on_setenv(const rs_setenv_event& e) {
  std::string value(e.value, strnlen(e.value, sizeof(e.value)));
  auto it = processes_.find(e.hdr.pid);
  if (it != processes_.end()) {
    if (e.overwrite == 0 && !it->second.identity.visible_devices.empty()) return;
    if (it->second.identity.visible_devices != value) {
      it->second.identity.visible_devices = value;
      it->second.sent = false;  // send the changed identity again
    }
    return;
  }
  Override* entry = override_for(e.hdr.pid);
  if (entry && (e.overwrite != 0 || !entry->visible_devices)) entry->visible_devices = value;
}

Summariser::Override* Summariser::override_for(uint32_t pid) {
  auto start = read_start_time(proc_root_, pid);
  if (!start) return nullptr;
  auto [entry, fresh] = overrides_.try_emplace(pid);
  if (fresh) override_order_.push_back(pid);
  if (entry->second.start_time != *start) entry->second = Override{*start, {}, {}};
  while (override_order_.size() > kMaxOverrides) {
    overrides_.erase(override_order_.front());
    override_order_.pop_front();
  }
  return &entry->second;
}

void Summariser::on_set_device(const rs_set_device_event& e) {
  if (e.result != 0 || e.device < 0) return;
  auto add = [&](std::vector<int32_t>& devices) {
    // A stand-in libcudart may say yes to any ordinal: the first few are kept.
    if (devices.size() >= proto::kMaxCudaDevices ||
        std::find(devices.begin(), devices.end(), e.device) != devices.end())
      return false;
    devices.push_back(e.device);
    return true;
  };
  auto it = processes_.find(e.hdr.pid);
  if (it != processes_.end()) {
    if (add(it->second.identity.cuda_devices)) it->second.sent = false;
    return;
  }
  if (Override* entry = override_for(e.hdr.pid)) add(entry->cuda_devices);
}

void Summariser::apply_overrides(uint32_t pid, ProcessIdentity& identity) {
  auto it = overrides_.find(pid);
  if (it == overrides_.end()) return;
  if (it->second.start_time == identity.start_time) {
    if (it->second.visible_devices) identity.visible_devices = *it->second.visible_devices;
    identity.cuda_devices = it->second.cuda_devices;
  }
  overrides_.erase(it);
  override_order_.erase(std::find(override_order_.begin(), override_order_.end(), pid));
}

void Summariser::on_async_error(const rs_async_error_event& e) {
  auto it = comms_.find({e.hdr.pid, e.comm});
  uint64_t hash = it != comms_.end() ? it->second.hash : 0;
  // A broken communicator stays broken: the first error says it. A
  // watchdog (or a stand-in libnccl.so) asks again and again; of handles
  // never seen made, each process's first is logged.
  if (hash && it->second.broken) return;
  if (hash) {
    it->second.broken = true;
    it->second.error_ns = shift(e.hdr.ts_ns);
    it->second.error_result = e.result;
    it->second.error_async = e.async_error;
  }
  if (!hash) {
    if (unknown_async_told_.size() >= kMaxOverrides) unknown_async_told_.clear();
    if (!unknown_async_told_.insert(e.hdr.pid).second) return;
  }
  RS_LOG(warn, "process %u: communicator %s is broken: ncclCommGetAsyncError %s, error %s", e.hdr.pid,
         hash ? hex64(hash).c_str() : "(creation not seen)", proto::result_name(e.result).c_str(),
         proto::result_name(e.async_error).c_str());
  if (!hash) return;
  async_errors_.push_back(PendingAsyncError{e.hdr.pid, hash, shift(e.hdr.ts_ns), e.result, e.async_error});
}

void Summariser::add_clock_sample(uint64_t t1, uint64_t t2, uint64_t t3, uint64_t t4, const std::string& collector) {
  auto& samples = clock_samples_[collector];
  samples.push_back({t1, t2, t3, t4});
  if (samples.size() > proto::kMaxClockSamples) samples.pop_front();
}

std::string Summariser::key_of(uint32_t pid) const {
  if (!keyed_) return {};
  auto it = processes_.find(pid);
  if (it == processes_.end() || it->second.identity.job.empty()) return "nojob";
  return fleet::placement_key(it->second.identity.job, 0);
}

Summariser::Mine Summariser::mine_for(const std::string& key, std::map<uint32_t, bool>& of_key) const {
  if (!keyed_) return [](uint32_t) { return true; };
  for (const auto& [pid, entry] : processes_) of_key[pid] = key_of(pid) == key;  // key_of once per process
  return [this, key, &of_key](uint32_t pid) {
    auto found = of_key.find(pid);
    return found != of_key.end() ? found->second : key == key_of(pid);  // a pid not traced (now): "nojob"
  };
}

bool Summariser::has_items(uint32_t pid) const {
  for (const auto& [k, block] : blocks_)
    if (block.pid == pid) return true;
  for (const auto& [k, block] : gpu_blocks_)
    if (block.pid == pid) return true;
  for (const auto& c : new_comms_)
    if (c.pid == pid) return true;
  for (const auto& c : ended_comms_)
    if (c.pid == pid) return true;
  for (const auto& w : waits_)
    if (w.hdr.pid == pid) return true;
  for (const auto& a : async_errors_)
    if (a.pid == pid) return true;
  return false;
}

std::set<std::string> Summariser::keys() const {
  std::set<std::string> keys;
  for (const auto& [pid, entry] : processes_) keys.insert(key_of(pid));
  // What a process forgotten already left behind ("nojob").
  for (const auto& [k, block] : blocks_) keys.insert(key_of(block.pid));
  for (const auto& [k, block] : gpu_blocks_) keys.insert(key_of(block.pid));
  for (const auto& w : waits_) keys.insert(key_of(w.hdr.pid));
  return keys;
}

bool Summariser::pending(const std::string& key, const std::string& clock_of) const {
  if (!keyed_) return !empty();
  if (auto samples = clock_samples_.find(clock_of); samples != clock_samples_.end() && !samples->second.empty())
    return true;
  std::map<uint32_t, bool> of_key;
  const Mine mine = mine_for(key, of_key);
  for (const auto& [pid, entry] : processes_)
    if (mine(pid) && unsent(entry, key)) return true;
  for (const auto& [k, block] : blocks_)
    if (mine(block.pid)) return true;
  for (const auto& [k, block] : gpu_blocks_)
    if (mine(block.pid)) return true;
  for (const auto& c : new_comms_)
    if (mine(c.pid)) return true;
  for (const auto& c : ended_comms_)
    if (mine(c.pid)) return true;
  for (const auto& w : waits_)
    if (mine(w.hdr.pid)) return true;
  for (const auto& a : async_errors_)
    if (mine(a.pid)) return true;
  return false;
}

void Summariser::resend_identities() {
  for (auto& [pid, entry] : processes_) entry.sent = false;
}

bool Summariser::empty() const {
  if (!blocks_.empty() || !gpu_blocks_.empty() || !new_comms_.empty() || !ended_comms_.empty() || !waits_.empty() ||
      !async_errors_.empty())
    return false;
  for (const auto& [collector, samples] : clock_samples_)
    if (!samples.empty()) return false;
  for (const auto& [pid, entry] : processes_)
    if (!entry.sent) return false;
  return true;
}

void Summariser::fill(wire::Batch::Builder batch, const DropCounts& drops, const std::string& key,
                      const std::string& clock_of) {
  // A batch carries at most what the collector accepts (proto/limits.h):
  // one process opening 100,000 communicators must not make every batch of
  // its node unacceptable, nor a storm of calls or long environment strings
  // one past the collector's frame size (room_). What does not fit stays for
  // the next batch, in order: a communicator's records and end go with or
  // after it.
  room_ = proto::kAgentBatchBytes - proto::kWireClockSamplesBytes;
  std::map<uint32_t, bool> of_key;
  const Mine mine = mine_for(key, of_key);
  fill_processes(batch, key, mine);
  fill_comms(batch, mine);
  // Communicators announced in a later batch: their records and ends wait for it.
  std::set<std::pair<uint32_t, uint64_t>> held;
  for (const auto& c : new_comms_) held.emplace(c.pid, c.hash);
  fill_ends(batch, held, mine);
  uint64_t records = fill_collectives(batch, held, mine);
  fill_clock_samples(batch, clock_of);
  fill_waits(batch, records, mine);
  fill_async_errors(batch, held, mine);
  proto::write_drops(drops, batch.initDrops());
}

void Summariser::announce(wire::Batch::Builder batch, const DropCounts& drops, const std::string& key) {
  // The key's communicators, up to a batch's list (they fit:
  // proto/limits.h); identities up to their share of the batch, the others
  // as not yet sent (they go in the key's next batches; a communicator
  // takes its job when they come).
  uint64_t identity_room = proto::kAgentIdentityBytesPerBatch;
  std::vector<const ProcessIdentity*> identities;
  for (auto& [pid, entry] : processes_) {
    if (key_of(pid) != key) continue;
    const uint64_t bytes = proto::identity_wire_bytes(entry.identity);
    if (identities.size() == proto::kMaxListEntries || bytes > identity_room) {
      entry.sent = false;
      continue;
    }
    identity_room -= bytes;
    entry.identity.pid = pid;
    identities.push_back(&entry.identity);
  }
  // The communicators, and the splits in which a process got none (the
  // new collector sizes a split's children once every rank of the parent
  // said what it did in it).
  std::vector<std::pair<uint64_t, const proto::CommJoined*>> comms;
  std::set<std::pair<uint32_t, uint64_t>> queued, erring;
  for (const auto& c : new_comms_) queued.emplace(c.pid, c.hash);
  for (const auto& a : async_errors_) erring.emplace(a.pid, a.hash);
  for (const auto& [k, comm] : comms_) {
    if (comm.joined.hash == 0 || key_of(k.first) != key) continue;
    comms.emplace_back(comm.order, &comm.joined);
    // Its error too (the new collector names it in a hang), in the next
    // batches, unless it waits to go out anyway.
    if (comm.broken && !erring.count({k.first, comm.hash}))
      async_errors_.push_back(
          PendingAsyncError{k.first, comm.hash, comm.error_ns, comm.error_result, comm.error_async});
  }
  for (const auto& [order, marker] : no_color_)
    if (key_of(marker.pid) == key && !queued.count({marker.pid, marker.hash})) comms.emplace_back(order, &marker);
  // In the order they were made: a split's parent before its children. Past
  // what a batch carries, the newest go as new ones (their items wait).
  std::sort(comms.begin(), comms.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t k = proto::kMaxListEntries; k < comms.size(); ++k)
    if (queued.emplace(comms[k].second->pid, comms[k].second->hash).second) new_comms_.push_back(*comms[k].second);
  if (comms.size() > proto::kMaxListEntries) comms.resize(proto::kMaxListEntries);
  std::vector<proto::CommJoined> joined;
  for (const auto& [order, comm] : comms) joined.push_back(*comm);
  proto::write_processes(identities, batch);
  proto::write_comms(joined, batch);
  proto::write_drops(drops, batch.initDrops());
}

void Summariser::fill_processes(wire::Batch::Builder batch, const std::string& key, const Mine& mine) {
  unsigned waiting = 0;
  for (const auto& [pid, entry] : processes_) waiting += unsent(entry, key) && mine(pid) ? 1 : 0;
  // From where the last batch stopped: processes re-announced again and
  // again (a setenv loop) cannot keep the others' out.
  std::vector<const ProcessIdentity*> sent;
  uint64_t identity_room = proto::kAgentIdentityBytesPerBatch;
  auto next = processes_.lower_bound(identities_from_);
  for (size_t visited = 0; visited < processes_.size(); ++visited, ++next) {
    if (next == processes_.end()) next = processes_.begin();
    auto& [pid, entry] = *next;
    if (!unsent(entry, key) || !mine(pid)) continue;
    const uint64_t bytes = proto::identity_wire_bytes(entry.identity);
    if (sent.size() == std::min(waiting, proto::kMaxListEntries) || bytes > identity_room || !spend(bytes)) break;
    identity_room -= bytes;
    identities_from_ = pid + 1;
    entry.identity.pid = pid;
    sent.push_back(&entry.identity);
    entry.sent = true;
    entry.sent_key = key;
  }
  proto::write_processes(sent, batch);
}

void Summariser::fill_comms(wire::Batch::Builder batch, const Mine& mine) {
  // In one pass (the rest stay, in order): a re-announcement's overflow
  // may leave tens of thousands here.
  std::vector<proto::CommJoined> now, later;
  for (auto& c : new_comms_)
    (now.size() < proto::kMaxListEntries && mine(c.pid) && spend(proto::kWireCommBytes) ? now : later)
        .push_back(std::move(c));
  new_comms_ = std::move(later);
  proto::write_comms(now, batch);
}

void Summariser::fill_ends(wire::Batch::Builder batch, const std::set<std::pair<uint32_t, uint64_t>>& held,
                           const Mine& mine) {
  std::vector<PendingEnd> ends_now, ends_later;
  for (auto& c : ended_comms_)
    (!mine(c.pid) || held.count({c.pid, c.hash}) || ends_now.size() == proto::kMaxListEntries ||
             !spend(proto::kWireCommEndBytes)
         ? ends_later
         : ends_now)
        .push_back(c);
  ended_comms_ = std::move(ends_later);
  auto ends = batch.initCommEnds(static_cast<unsigned>(ends_now.size()));
  for (unsigned k = 0; k < ends_now.size(); ++k) {
    const auto& c = ends_now[k];
    ends[k].setPid(c.pid);
    ends[k].setCommHash(c.hash);
    ends[k].setKind(c.abort ? wire::CommEndKind::ABORT : wire::CommEndKind::DESTROY);
    ends[k].setNs(c.ns);
    ends[k].setResult(c.result);
  }
}

uint64_t Summariser::fill_collectives(wire::Batch::Builder batch, const std::set<std::pair<uint32_t, uint64_t>>& held,
                                      const Mine& mine) {
  // Blocks in key order until the batch is full; a block larger than what
  // is left is split (its first records now, the rest next time). The GPU
  // blocks share the budget, after the host's.
  uint64_t records = 0;
  auto take = [&](auto& from, auto& parts, uint64_t record_bytes) {
    for (auto it = from.begin(); it != from.end();) {
      auto& block = it->second;
      if (held.count({block.pid, block.comm_hash}) || !mine(block.pid)) {
        ++it;
        continue;
      }
      if (parts.size() == proto::kMaxListEntries || records == proto::kMaxRecordsPerBatch ||
          room_ < proto::kWireBlockBytes + record_bytes)
        break;
      const uint64_t room =
          std::min(proto::kMaxRecordsPerBatch - records, (room_ - proto::kWireBlockBytes) / record_bytes);
      room_ -= proto::kWireBlockBytes + std::min<uint64_t>(room, block.records.size()) * record_bytes;
      if (block.records.size() <= room) {
        records += block.records.size();
        parts.push_back(std::move(block));
        it = from.erase(it);
      } else {
        auto part = block;
        part.records.assign(block.records.begin(), block.records.begin() + static_cast<std::ptrdiff_t>(room));
        block.records.erase(block.records.begin(), block.records.begin() + static_cast<std::ptrdiff_t>(room));
        records += room;
        parts.push_back(std::move(part));
        break;
      }
    }
  };
  std::vector<proto::ColumnBlock> parts;
  std::vector<proto::GpuBlock> gpu_parts;
  take(blocks_, parts, proto::kWireRecordBytes);
  take(gpu_blocks_, gpu_parts, proto::kWireGpuRecordBytes);
  std::vector<const proto::ColumnBlock*> blocks;
  for (const auto& part : parts) blocks.push_back(&part);
  std::vector<const proto::GpuBlock*> gpu;
  for (auto& part : gpu_parts) {
    std::stable_sort(part.records.begin(), part.records.end(),
                     [](const proto::GpuRecord& a, const proto::GpuRecord& b) { return a.seq < b.seq; });
    gpu.push_back(&part);
  }
  proto::encode_collectives(blocks, batch, gpu, layout_);
  pending_records_ = 0;
  for (const auto& [key, block] : blocks_) pending_records_ += block.records.size();
  for (const auto& [key, block] : gpu_blocks_) pending_records_ += block.records.size();
  return records;
}

void Summariser::on_gpu(const GpuCollective& c) {
  auto& block = gpu_blocks_[GpuKey{c.pid, c.comm_hash, c.rank, c.op}];
  block.pid = c.pid;
  block.comm_hash = c.comm_hash;
  block.rank = c.rank;
  block.op = c.op;
  block.records.push_back(proto::GpuRecord{c.seq_number, c.count, shift(c.enqueued_ns), shift(c.kernel_start_ns),
                                           shift(c.kernel_end_ns), c.link_peer, c.link_wait_ns});
  ++pending_records_;
}

void Summariser::fill_clock_samples(wire::Batch::Builder batch, const std::string& clock_of) {
  auto found = clock_samples_.find(clock_of);
  if (found == clock_samples_.end()) return;
  auto& samples = found->second;  // at most kMaxClockSamples (add_clock_sample)
  proto::write_clock_samples(std::vector<std::array<uint64_t, 4>>(samples.begin(), samples.end()), batch);
  clock_samples_.erase(found);
}

void Summariser::fill_waits(wire::Batch::Builder batch, uint64_t records, const Mine& mine) {
  // Waits share the record budget with the collectives. Another key's stay, in order.
  std::map<std::pair<uint32_t, uint32_t>, proto::WaitBlock> wait_blocks;
  std::vector<rs_wait_event> others;
  size_t taken = 0;
  for (; taken < waits_.size() && records < proto::kMaxRecordsPerBatch; ++taken) {
    const rs_wait_event& w = waits_[taken];
    if (!mine(w.hdr.pid)) {
      others.push_back(w);
      continue;
    }
    auto key = std::make_pair(w.hdr.pid, w.hdr.tid);
    const bool new_block = !wait_blocks.count(key);
    if (new_block && wait_blocks.size() == proto::kMaxListEntries) break;
    if (!spend(proto::kWireWaitBytes + (new_block ? proto::kWireBlockBytes : 0))) break;
    auto& block = wait_blocks[key];
    block.pid = w.hdr.pid;
    block.tid = w.hdr.tid;
    block.waits.push_back(proto::WaitRecord{static_cast<uint8_t>(w.kind <= 3 ? w.kind : 0), w.object,
                                            shift(w.entry_ns), shift(w.hdr.ts_ns), w.result});
    ++records;
  }
  waits_.erase(waits_.begin(), waits_.begin() + static_cast<std::ptrdiff_t>(taken));
  waits_.insert(waits_.begin(), others.begin(), others.end());
  std::vector<proto::WaitBlock> wait_list;
  for (auto& [key, block] : wait_blocks) wait_list.push_back(std::move(block));
  proto::encode_waits(wait_list, batch);
}

void Summariser::fill_async_errors(wire::Batch::Builder batch, const std::set<std::pair<uint32_t, uint64_t>>& held,
                                   const Mine& mine) {
  // As a communicator's end: never before its announcement (the collector
  // would not know it, and the agent tells a broken communicator once); at
  // most what the collector applies of one batch.
  std::vector<PendingAsyncError> now, later;
  for (const auto& a : async_errors_)
    (mine(a.pid) && !held.count({a.pid, a.hash}) && now.size() < proto::kMaxAsyncErrorsPerBatch &&
             spend(proto::kWireCommEndBytes)
         ? now
         : later)
        .push_back(a);
  async_errors_ = std::move(later);
  auto errors = batch.initAsyncErrors(static_cast<unsigned>(now.size()));
  for (unsigned k = 0; k < now.size(); ++k) {
    const auto& a = now[k];
    errors[k].setPid(a.pid);
    errors[k].setCommHash(a.hash);
    errors[k].setNs(a.ns);
    errors[k].setResult(a.result);
    errors[k].setAsyncError(a.async_error);
  }
}

std::vector<uint32_t> Summariser::forget_exited() {
  std::vector<uint32_t> forgotten;
  for (auto it = processes_.begin(); it != processes_.end();) {
    auto start = read_start_time(proc_root_, it->first);
    // Its pid reused: its exit event, written before it was reaped, was read
    // with the ring buffer before this scan; the new process's are not its.
    const bool reused = start && it->second.identity.start_time != 0 && *start != it->second.identity.start_time;
    bool gone = !start || reused;
    if (!gone) {  // a zombie has exited too: only its parent has not reaped it yet
      auto sample = read_sample(proc_root_, it->first);
      gone = !sample || sample->state == 'Z' || sample->state == 'X';
    }
    // Keep an exited process until its records went out, and for one more
    // call until its exit event (how it ended: a signal, a status) is read.
    const bool await_exit = gone && !reused && !exit_codes_.count(it->first) && !it->second.seen_gone;
    it->second.seen_gone = gone;
    // In a fleet its last records go by its key, which is forgotten with it.
    const bool unsent_items = keyed_ && has_items(it->first);
    if (gone && it->second.sent && (await_exit || unsent_items)) {
      ++it;
    } else if (gone && it->second.sent) {
      uint32_t pid = it->first;
      for (auto c = comms_.begin(); c != comms_.end();) {
        if (c->first.first != pid) {
          ++c;
          continue;
        }
        forget_no_color(c->first);
        c = comms_.erase(c);
      }
      Exited gone_one{pid, {}, {}};
      if (auto code = exit_codes_.find(pid); code != exit_codes_.end()) {
        gone_one.code = code->second;
        exit_codes_.erase(code);
      }
      if (auto host = final_host_.find(pid); host != final_host_.end()) {
        gone_one.host = host->second;
        final_host_.erase(host);
      }
      exited_.push_back(gone_one);
      if (exited_.size() > kMaxExitsKept) {  // no collector took them for that long: the oldest go
        exited_.pop_front();
        exits_listed_ -= std::min<size_t>(exits_listed_, 1);
      }
      forgotten.push_back(pid);
      it = processes_.erase(it);
    } else {
      ++it;
    }
  }
  return forgotten;
}

std::vector<std::pair<uint32_t, uint64_t>> Summariser::take_ring_candidates() {
  std::vector<std::pair<uint32_t, uint64_t>> out;
  for (auto& [pid, entry] : processes_)
    if (entry.ring_wanted) {
      entry.ring_wanted = false;
      out.emplace_back(pid, entry.identity.start_time);
    }
  return out;
}

}  // namespace rankscope::agent

namespace rankscope::agent {

namespace {
void set_host(wire::HostCounters::Builder out, const rs_host_stats& h) {
  out.setCpuNs(h.cpu_ns);
  out.setOnCpuNs(h.on_cpu_ns);
  out.setOffCpuNs(h.off_cpu_ns);
  out.setRunqueueNs(h.runqueue_ns);
  out.setIowaitNs(h.iowait_ns);
  out.setVoluntarySwitches(h.voluntary_switches);
  out.setInvoluntarySwitches(h.involuntary_switches);
  out.setMajorFaults(h.major_faults);
  out.setThreads(h.threads);
}
}  // namespace

void Summariser::health(wire::Heartbeat::Builder heartbeat, uint64_t now_ns, const HostLookup& host) {
  // One found gone and kept for its exit event is reported once, with it,
  // when forget_exited() lets it go (not as "exited" and how a moment later).
  // A user may start as many processes as it likes: at most 16,384 entries
  // (under 5 MB at the widest, within the collector's frame and list
  // bounds), the exited ones first (the exits tell of hangs), the live ones
  // from where the last heartbeat stopped (each is reported in turn).
  constexpr size_t kMaxEntries = 1 << 14;
  size_t kept = 0;
  for (const auto& [pid, entry] : processes_) kept += entry.seen_gone ? 1 : 0;
  const size_t gone = std::min<size_t>(exited_.size(), kMaxEntries);
  const size_t live = std::min<size_t>(processes_.size() - kept, kMaxEntries - gone);
  auto list = heartbeat.initProcesses(static_cast<unsigned>(live + gone));
  unsigned i = 0;
  auto next = processes_.lower_bound(health_from_);
  for (size_t visited = 0; visited < processes_.size() && i < live; ++visited, ++next) {
    if (next == processes_.end()) next = processes_.begin();
    const auto& [pid, entry] = *next;
    if (entry.seen_gone) continue;
    health_from_ = pid + 1;
    auto out = list[i++];
    out.setPid(pid);
    out.setSampleNs(now_ns);
    auto sample = read_sample(proc_root_, pid);
    out.setAlive(sample.has_value());
    if (!sample) {
      // Gone before forget_exited() found it: its counters at exit, when
      // its exit event came, or the collector's ledger, which takes a
      // process's first "dead" as its last word, would not bill the CPU
      // of its last interval (they are sent again with its exit).
      if (auto final_host = final_host_.find(pid); final_host != final_host_.end())
        set_host(out.initHost(), final_host->second);
      continue;
    }
    out.setState(static_cast<uint8_t>(sample->state));
    out.setCpuNs(sample->cpu_ns);
    out.setRunqueueNs(sample->runqueue_ns);
    out.setProcessCpuNs(sample->process_cpu_ns);
    if (auto cpu = read_cpu_throttling(proc_root_, pid, cgroup_mounts_)) {
      out.setCpuPeriods(cpu->periods);
      out.setCpuThrottledPeriods(cpu->throttled_periods);
      out.setCpuThrottledNs(cpu->throttled_ns);
      out.setCpuQuotaMillicpus(cpu->quota_millicpus);
    }
    if (host)
      if (auto counters = host(pid)) set_host(out.initHost(), *counters);
  }
  for (size_t k = 0; k < gone; ++k) {
    const Exited& gone_one = exited_[k];
    auto out = list[i++];
    out.setPid(gone_one.pid);
    out.setSampleNs(now_ns);
    out.setAlive(false);
    // The kernel's exit_code: the signal in the low 7 bits, else status << 8 (wait(2)).
    if (gone_one.code) {
      if (*gone_one.code & 0x7f)
        out.setExitSignal(*gone_one.code & 0x7f);
      else
        out.setExitStatus((*gone_one.code >> 8) & 0xff);
    }
    if (gone_one.host) set_host(out.initHost(), *gone_one.host);
  }
  exits_listed_ = gone;  // the rest next time
  health_ns_ = now_ns;
}

void Summariser::relist_recent_exits(uint64_t now_ns) {
  // (Listed with a live process of the same pid, the exit could be taken
  // as that process's last word.)
  for (auto it = recent_exits_.rbegin(); it != recent_exits_.rend(); ++it)
    if (now_ns - std::min(now_ns, it->first) <= kRecentExitsNs && !processes_.count(it->second.pid))
      exited_.push_front(it->second);
  exits_listed_ = 0;  // (a heartbeat built before this one lists them anew)
  recent_exits_.clear();
  while (exited_.size() > kMaxExitsKept) exited_.pop_front();
}

void Summariser::exits_reported() {
  const size_t n = std::min(exits_listed_, exited_.size());
  for (size_t k = 0; k < n; ++k) recent_exits_.emplace_back(health_ns_, exited_[k]);
  while (!recent_exits_.empty() && (recent_exits_.size() > kMaxExitsKept ||
                                    health_ns_ - std::min(health_ns_, recent_exits_.front().first) > kRecentExitsNs))
    recent_exits_.pop_front();
  exited_.erase(exited_.begin(), exited_.begin() + static_cast<std::ptrdiff_t>(n));
  exits_listed_ = 0;
}

}  // namespace rankscope::agent

namespace rankscope::agent {

void Summariser::open_waits(const std::vector<std::pair<uint64_t, rs_open_wait>>& open,
                            wire::Heartbeat::Builder heartbeat) {
  const size_t n = std::min<size_t>(open.size(), proto::kMaxListEntries);
  auto list = heartbeat.initOpenWaits(static_cast<unsigned>(n));
  for (unsigned i = 0; i < n; ++i) {
    const auto& [pid_tgid, w] = open[i];
    list[i].setPid(static_cast<uint32_t>(pid_tgid >> 32));
    list[i].setTid(static_cast<uint32_t>(pid_tgid));
    list[i].setKind(static_cast<wire::WaitKind>(w.kind <= 3 ? w.kind : 0));
    list[i].setObject(w.object);
    list[i].setStartNs(shift(w.entry_ns));
  }
}

void Summariser::gpu_open(const std::vector<GpuOpenCollective>& open, wire::Heartbeat::Builder heartbeat) {
  const size_t n = std::min<size_t>(open.size(), proto::kMaxListEntries);
  auto list = heartbeat.initGpuOpen(static_cast<unsigned>(n));
  for (unsigned i = 0; i < n; ++i) {
    list[i].setPid(open[i].pid);
    list[i].setCommHash(open[i].comm_hash);
    list[i].setRank(open[i].rank);
    list[i].setOp(open[i].op);
    list[i].setSeq(open[i].seq_number);
    list[i].setEnqueuedNs(shift(open[i].enqueued_ns));
    list[i].setKernelStartNs(open[i].kernel_start_ns ? shift(open[i].kernel_start_ns) : 0);
    list[i].setProxySteps(open[i].proxy_steps);
    list[i].setDetail(open[i].detail);
    list[i].setSendPeer(open[i].send_peer);
    list[i].setSendSinceNs(open[i].send_since_ns ? shift(open[i].send_since_ns) : 0);
  }
}

}  // namespace rankscope::agent
