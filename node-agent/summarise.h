#pragma once
// Turns decoded events into the next batch: communicator identities, one
// column block per (process, communicator, lane), process identities when
// first seen, communicator ends, and the agent's clock samples.
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/clock.h"
#include "node-agent/drain.h"
#include "node-agent/identify.h"
#include "node-agent/profiler_rings.h"
#include "proto/agent.capnp.h"
#include "proto/codec.h"
#include "proto/drops.h"

namespace rankscope::agent {

namespace wire = ::rankscope::proto::wire;

struct CommEntry {
  uint64_t hash = 0;
  int32_t rank = -1;
  int32_t nranks = -1;
  wire::CommOrigin origin = wire::CommOrigin::UNKNOWN;
  uint32_t splits = 0;  // children split off so far: the same count on every member
  proto::CommJoined joined;  // as announced (announced again to a job's new collector)
  uint64_t order = 0;        // of creation (a parent is announced before its children)
  bool broken = false;       // its async error was reported (once: a watchdog asks again and again)
  // That error (told again to a job's new collector, with the communicator).
  uint64_t error_ns = 0;
  int32_t error_result = 0, error_async = 0;
};

class Summariser {
 public:
  // clock: the node's clock; every BPF event time goes through its shift()
  // (tests play a node whose clock is off with an offset).
  // container_state_root: where the pods' names are read ("": not read);
  // slurm_jobs_dir: the Slurm Prolog's job records, for accounts ("": none).
  Summariser(std::string proc_root, std::string node, const OffsetClock& clock, std::string container_state_root = "",
             std::string slurm_jobs_dir = "");

  void on_event(const Event& event);
  void on_malformed() { ++malformed_; }
  // The GPU side of a collective, from the profiler plugin's ring (times on
  // the node's monotonic clock, like the BPF events').
  void on_gpu(const GpuCollective& collective);
  // A clock probe's four times, against the clock of `collector` (its id in
  // a fleet; "" alone). The newest kMaxClockSamples of each are kept.
  void add_clock_sample(uint64_t t1, uint64_t t2, uint64_t t3, uint64_t t4, const std::string& collector = "");

  // In a fleet of collectors every process is placed by its job
  // (key_of): each key's records travel in batches of their own, to the
  // key's owner. Alone, every key is "".
  void set_keyed(bool keyed) { keyed_ = keyed; }
  // How fill() writes the host blocks: one table where every collector the
  // batches may go to reads one (proto/codec.h).
  void set_layout(proto::BlockLayout layout) { layout_ = layout; }
  // "job:ID" (common/placement.h), "nojob" before a process has a job; "" when not keyed.
  std::string key_of(uint32_t pid) const;
  // The keys of the traced processes.
  std::set<std::string> keys() const;
  bool empty() const;
  // Whether a batch of `key` has something to carry: its processes' records,
  // identities, communicators... or clock samples against `clock_of`.
  bool pending(const std::string& key, const std::string& clock_of) const;
  size_t pending_records() const { return pending_records_; }
  // Moves what is pending into `batch`, up to what one batch may carry
  // (proto/limits.h); the rest stays for the next (empty() says whether any).
  // Keyed: only what belongs to `key`, with the clock samples taken against
  // `clock_of` (the collector the batch goes to).
  void fill(wire::Batch::Builder batch, const DropCounts& drops, const std::string& key = "",
            const std::string& clock_of = "");
  // The identities and communicators of `key`'s processes, announced again
  // (a job's new collector knows neither); nothing else is taken.
  void announce(wire::Batch::Builder batch, const DropCounts& drops, const std::string& key);
  // Frees entries of processes that exited (pid gone or reused); each is
  // reported once more by health() as not alive, with how it ended. One
  // seen gone before its exit event was read (the event may still be in
  // the ring buffer) is kept until the next call. Returns their pids.
  std::vector<uint32_t> forget_exited();
  // Processes that may have a profiler plugin's ring now, since the last
  // call: (pid, start time) of each newly traced one and of each that made
  // a communicator (the plugin makes its ring then). A flag per traced
  // process: nothing accumulates when no one takes them.
  std::vector<std::pair<uint32_t, uint64_t>> take_ring_candidates();
  // Sends every traced process's identity again with the next batch (a new
  // collector run knows the communicators from its database, not who the
  // processes are).
  void resend_identities();
  // The scheduling state of every traced process, for the heartbeat, with
  // its BPF host counters where `host` knows them.
  using HostLookup = std::function<std::optional<rs_host_stats>(uint32_t pid)>;
  // The exits it lists stay until exits_reported() says a collector took
  // them (each heartbeat lists them again until then).
  void health(wire::Heartbeat::Builder heartbeat, uint64_t now_ns, const HostLookup& host = {});
  void exits_reported();
  // A collector said hello anew (restarted): the exits taken in the last
  // 30 s (before `now_ns`) may have gone to the connection it dropped;
  // listed again, but those of a pid traced again (another process now).
  void relist_recent_exits(uint64_t now_ns);
  // Waits on the GPU still in progress, for the heartbeat.
  void open_waits(const std::vector<std::pair<uint64_t, rs_open_wait>>& waits, wire::Heartbeat::Builder heartbeat);
  // Collectives whose kernels have not all stopped, for the heartbeat.
  void gpu_open(const std::vector<GpuOpenCollective>& open, wire::Heartbeat::Builder heartbeat);

  uint64_t unknown_comm_records() const { return unknown_comm_; }
  uint64_t malformed_records() const { return malformed_; }
  size_t traced_processes() const { return processes_.size(); }
  size_t known_comms() const { return comms_.size(); }

 private:
  struct ProcessEntry {
    ProcessIdentity identity;
    bool sent = false;
    std::string sent_key;     // the key it was sent under (a new key: sent again)
    bool ring_wanted = true;  // look for its profiler ring (take_ring_candidates)
    bool seen_gone = false;   // found gone at the last forget_exited()
  };
  using CommKey = std::pair<uint32_t, uint64_t>;                 // pid, ncclComm_t
  // pid, comm hash, rank (one process holds every rank after ncclCommInitAll), lane
  using BlockKey = std::tuple<uint32_t, uint64_t, int32_t, uint32_t>;

  ProcessEntry& process(uint32_t pid);
  void on_call(const rs_call_event& e);
  void on_comm_init(const rs_comm_init_event& e);
  void on_comm_end(const rs_comm_end_event& e);
  void on_wait(const rs_wait_event& e);
  void on_exit(const rs_exit_event& e);
  void on_setenv(const rs_setenv_event& e);
  void on_set_device(const rs_set_device_event& e);
  void on_async_error(const rs_async_error_event& e);
  // What a process did to its own identity before or after it was first
  // traced (setenv of CUDA_VISIBLE_DEVICES, cudaSetDevice), applied to it.
  void apply_overrides(uint32_t pid, ProcessIdentity& identity);
  // fill()'s parts, in its order. `held`: the (pid, communicator) pairs
  // announced in a later batch, whose records and ends wait for it;
  // `records`: the record budget already used by the collectives.
  // `mine`: whether a pid's items go in this batch (its key's).
  using Mine = std::function<bool(uint32_t pid)>;
  void fill_processes(wire::Batch::Builder batch, const std::string& key, const Mine& mine);
  void fill_comms(wire::Batch::Builder batch, const Mine& mine);
  void fill_ends(wire::Batch::Builder batch, const std::set<std::pair<uint32_t, uint64_t>>& held, const Mine& mine);
  uint64_t fill_collectives(wire::Batch::Builder batch, const std::set<std::pair<uint32_t, uint64_t>>& held,
                            const Mine& mine);
  void fill_clock_samples(wire::Batch::Builder batch, const std::string& clock_of);
  void fill_waits(wire::Batch::Builder batch, uint64_t records, const Mine& mine);
  void fill_async_errors(wire::Batch::Builder batch, const std::set<std::pair<uint32_t, uint64_t>>& held,
                         const Mine& mine);
  bool unsent(const ProcessEntry& entry, const std::string& key) const { return !entry.sent || entry.sent_key != key; }
  // Takes `bytes` of the batch's room (proto::kAgentBatchBytes, by worst-case
  // costs); false, taking nothing, when they do not fit.
  bool spend(uint64_t bytes) {
    if (bytes > room_) return false;
    room_ -= bytes;
    return true;
  }
  uint64_t room_ = 0;  // of the batch being filled
  // Whether a pid's items are `key`'s; `of_key` caches each traced process's answer (it must outlive the result).
  Mine mine_for(const std::string& key, std::map<uint32_t, bool>& of_key) const;
  // Whether anything of process `pid` waits to be sent.
  bool has_items(uint32_t pid) const;
  uint64_t shift(uint64_t ns) const { return clock_.shift(ns); }

  std::string proc_root_;
  std::string container_state_root_;
  std::string slurm_jobs_dir_;
  CgroupMounts cgroup_mounts_;  // the agent's own view, where processes' cpu cgroups are read
  std::string node_;
  const OffsetClock& clock_;
  std::map<uint32_t, ProcessEntry> processes_;
  // To report as gone, with how each ended (its exit event's, taken when
  // it was forgotten: a pid reused meanwhile is another process).
  struct Exited {
    uint32_t pid = 0;
    std::optional<int32_t> code;  // the task's exit_code
    std::optional<rs_host_stats> host;
  };
  std::deque<Exited> exited_;
  std::deque<std::pair<uint64_t, Exited>> recent_exits_;  // taken, with when (health()'s now_ns)
  uint64_t health_ns_ = 0;                                // of the last health()
  size_t exits_listed_ = 0;                         // of them, listed by the last heartbeat (health())
  static constexpr size_t kMaxExitsKept = 1 << 16;  // while no collector takes a heartbeat
  static constexpr uint64_t kRecentExitsNs = 30'000'000'000ull;
  uint32_t health_from_ = 0;      // the heartbeat's first live process (when they do not all fit)
  uint32_t identities_from_ = 0;  // the first process whose identity a batch may carry (likewise)
  std::map<uint32_t, int32_t> exit_codes_;  // task exit_code of processes seen exiting
  std::map<uint32_t, rs_host_stats> final_host_;  // host counters at exit
  // setenv/cudaSetDevice seen for processes not (yet) traced: by pid, with the
  // process start time (a reused pid is another process); bounded.
  struct Override {
    uint64_t start_time = 0;
    std::optional<std::string> visible_devices;
    std::vector<int32_t> cuda_devices;
  };
  // The entry of a live process (created, or reset for a reused pid); nullptr if it is gone.
  Override* override_for(uint32_t pid);
  std::map<uint32_t, Override> overrides_;
  std::deque<uint32_t> override_order_;
  static constexpr size_t kMaxOverrides = 4096;
  struct PendingAsyncError {
    uint32_t pid;
    uint64_t hash, ns;
    int32_t result, async_error;
  };
  std::vector<PendingAsyncError> async_errors_;
  std::set<uint32_t> unknown_async_told_;  // processes whose error on an unknown handle was logged (bounded)
  std::map<CommKey, CommEntry> comms_;
  std::map<BlockKey, proto::ColumnBlock> blocks_;
  using GpuKey = std::tuple<uint32_t, uint64_t, int32_t, uint8_t>;  // pid, comm hash, rank, op
  std::map<GpuKey, proto::GpuBlock> gpu_blocks_;
  struct PendingEnd {
    uint32_t pid;
    uint64_t hash, ns;
    int32_t result;
    bool abort;
  };
  std::vector<proto::CommJoined> new_comms_;
  // The splits in which a process got no child (NCCL_SPLIT_NOCOLOR), by
  // order of creation, while their parent lives: a job's new collector
  // sizes a split's children once every rank of the parent said what it
  // did in it, so they are announced again with the communicators. At most
  // kMaxNoColorKept (a user may split without a color in a loop): past it
  // the oldest of the communicator that holds the most goes.
  std::map<uint64_t, proto::CommJoined> no_color_;
  std::map<std::pair<uint32_t, uint64_t>, std::deque<uint64_t>> no_color_of_;    // by parent: its keys in no_color_
  std::set<std::pair<size_t, std::pair<uint32_t, uint64_t>>> no_color_holders_;  // (how many, parent)
  static constexpr size_t kMaxNoColorKept = 1 << 16;
  void keep_no_color(const std::pair<uint32_t, uint64_t>& parent, const proto::CommJoined& marker);
  void forget_no_color(const std::pair<uint32_t, uint64_t>& parent);
  std::vector<PendingEnd> ended_comms_;
  std::map<std::string, std::deque<std::array<uint64_t, 4>>> clock_samples_;  // by collector
  bool keyed_ = false;
  proto::BlockLayout layout_ = proto::BlockLayout::columns;
  uint64_t comm_order_ = 0;
  std::vector<rs_wait_event> waits_;
  size_t pending_records_ = 0;
  uint64_t unknown_comm_ = 0;
  uint64_t malformed_ = 0;
};

}  // namespace rankscope::agent
