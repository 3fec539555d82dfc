#pragma once
// The second source of the node agent: the rings rankscope's NCCL profiler
// plugin writes in each traced process (nccl-profiler/ring.h,
// docs/gpu-timing.md), read here and turned into one GPU-side record per
// collective: when NCCL enqueued it, and when its kernel started and
// stopped on the GPU, on the node's monotonic clock.
//
// A ring is found among the process's descriptors and taken only if it is
// sealed against resizing, its header is the layout this build reads and it
// names the process it was found for (pid and start time); its writer is
// not trusted (nccl-profiler/ring.h). Attaching marks the ring read (the
// plugin writes only while someone reads). A process that exits is drained
// once more; its ring is then let go, and goes.
//
// GPU times (%globaltimer) are put on the host's monotonic clock per
// process: the plugin reports a kernel's start from a host thread after
// the kernel started, so host_ns - gpu_ns is never below the clocks' true
// offset; its smallest value over the process's kernels is taken.
#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "nccl-profiler/ring.h"

namespace rankscope::agent {

// One collective of one process, as the GPU ran it.
struct GpuCollective {
  uint32_t pid = 0;
  uint64_t comm_hash = 0;  // NCCL's commHash, as the agent names communicators
  int32_t rank = -1;
  uint8_t op = 0;              // enum rs_nccl_op
  uint64_t seq_number = 0;     // NCCL's, per communicator and op
  uint64_t count = 0;          // elements
  uint64_t enqueued_ns = 0;    // host monotonic: NCCL enqueued it (0: not seen)
  uint64_t kernel_start_ns = 0;  // host monotonic: its first channel's kernel started
  uint64_t kernel_end_ns = 0;    // ... and its last one stopped
  // NCCL's proxy steps (while the agent asks for them): the peer whose
  // transfers from this rank waited longest on the network, and for how
  // long (steps posted and not done, overlaps counted once). -1, 0: none seen.
  int32_t link_peer = -1;
  uint64_t link_wait_ns = 0;
};

// A collective NCCL enqueued whose kernels have not all stopped: the oldest
// of its process's communicator and op (where a GPU that stopped is stuck).
struct GpuOpenCollective {
  uint32_t pid = 0;
  uint64_t comm_hash = 0;
  int32_t rank = -1;
  uint8_t op = 0;
  uint64_t seq_number = 0;
  uint64_t enqueued_ns = 0;      // host monotonic
  uint64_t kernel_start_ns = 0;  // host monotonic; 0: no channel's kernel started
  // NCCL reports its proxy work: proxy events were asked for when NCCL
  // scheduled it (a rank whose peers are all on its node has none to report).
  bool detail = false;
  // Where they were: its send step handed to the network longest ago and
  // not done (a link that stopped moving).
  bool proxy_steps = false;   // proxy records of it were seen
  int32_t send_peer = -1;     // -1: no send step on the network
  uint64_t send_since_ns = 0;  // host monotonic: when that step was handed over
};

struct ProfilerRingCounts {
  uint64_t rings = 0;         // rings read now
  uint64_t refused = 0;       // rings found but not taken (another layout, another process)
  uint64_t records = 0;       // records read
  uint64_t plugin_dropped = 0;  // records the plugins could not write (nobody read yet, or a full ring)
  uint64_t unmatched = 0;     // kernel records whose collective (or Send or Recv) was not seen
};

class ProfilerRings {
 public:
  // A process's ring is the memfd among PROC/PID/fd (also inside a container).
  explicit ProfilerRings(std::string proc_root = "/proc");
  ~ProfilerRings();
  ProfilerRings(const ProfilerRings&) = delete;
  ProfilerRings& operator=(const ProfilerRings&) = delete;

  // Looks for process `pid`'s ring (started at `start_time`, /proc/PID/stat
  // field 22) if it has none yet; true when it is read now. A refused ring
  // is not looked at again while that process lives; one found while its
  // plugin was still making it (not yet sealed or initialised) is looked
  // at again at each drain, up to kUnfinishedTries times.
  bool attach(uint32_t pid, uint64_t start_time);
  // Reads every ring; each collective whose kernel has stopped on every
  // channel goes to `out`.
  void drain(const std::function<void(const GpuCollective&)>& out);
  // The process exited: its ring is drained a last time and removed.
  void detach(uint32_t pid, const std::function<void(const GpuCollective&)>& out);
  const ProfilerRingCounts& counts() const { return counts_; }
  // Per process, communicator and op, the oldest collective enqueued whose
  // kernels have not all stopped (as of the last drain).
  std::vector<GpuOpenCollective> open() const;
  // Asks the plugins for NCCL's proxy events too (or no longer): every
  // ring's when `all`, else those of processes in any of `comms` (NCCL's
  // commHash). NCCL reads the plugin's mask again at each collective.
  void set_detail(bool all, const std::vector<uint64_t>& comms = {});
  // Rings whose plugin is asked for proxy events now.
  size_t detailed() const;

 private:
  struct Pending {
    GpuCollective c;
    uint64_t gpu_start = UINT64_MAX, gpu_end = 0;
    uint32_t channels = 0;  // NCCL's nChannels, from the enqueue record (0: not seen)
    uint32_t channels_started = 0, channels_stopped = 0;
    uint64_t order = 0;     // arrival, to drop the oldest first
    uint32_t proxy_open = 0;  // its proxy operations started and not stopped: it is sent once they are
    bool proxy_seen = false;  // a proxy record of it came
    bool detail = false;      // NCCL reports its proxy work (its enqueue record says)
    bool p2p = false;         // a Send or Recv (numbered by the plugin: NCCL gives them no seqNumber)
    // This rank's sends, by peer and channel: a channel's steps are posted
    // and done in order, so overlapping ones are merged as they come. A
    // link's wait is its channel that waited longest (channels move their
    // data side by side).
    struct Link {
      int32_t peer;
      uint8_t channel;
      uint64_t start, end;  // the run of overlapping network waits being added to
      uint64_t total;       // ... and the runs before it
    };
    std::vector<Link> links;
    bool kernels_done() const;
    void add_link_wait(int32_t peer, uint8_t channel, uint64_t start, uint64_t end);
  };
  static constexpr size_t kLinksPerCollective = 256;  // (peer, channel) pairs kept; a ring's writer is not trusted
  static constexpr uint32_t kProxyOpsPerCollective = 1u << 16;
  // A send step of NCCL's proxy, until it stops.
  struct Step {
    uint64_t seq = 0;
    uint8_t op = 0;
    uint8_t channel = 0;
    int32_t peer = -1;
    uint64_t posted_ns = 0;  // it entered SendWait: handed to the network (0: not yet)
  };
  static constexpr size_t kStepsPerRing = 1u << 14;
  static constexpr size_t kPendingPerRing = 4096;  // collectives whose kernels have not all stopped
  using Key = std::tuple<uint64_t, uint8_t, uint64_t>;  // (comm hash, op, seqNumber): one collective of a process
  struct Ring {
    uint32_t pid = 0;
    profiler::RingView view;
    uint64_t dropped_seen = 0;
    int64_t gpu_to_host = INT64_MAX;  // smallest host_ns - gpu_ns seen
    std::map<Key, Pending> pending;
    std::map<uint64_t, Key> by_order;  // pending, oldest first
    uint64_t next_order = 0;
    using StepKey = std::tuple<uint64_t, int32_t, uint32_t>;  // (comm hash, rank, event)
    std::map<StepKey, Step> steps;                             // send steps in flight
    std::deque<StepKey> step_order;                            // ... as they started, to drop the oldest
    // Its communicators (collectives seen) and the order of the last
    // enqueue of each; kCommsPerRing at most, the least recent going first
    // (a job that makes a communicator per step).
    std::map<uint64_t, uint64_t> comms;
    uint64_t comm_notes = 0;  // enqueues noted: the order comms holds
    bool detail = false;       // its plugin is asked for proxy events
  };
  static constexpr size_t kCommsPerRing = 1024;
  bool wants_detail(const Ring& ring, bool all, const std::vector<uint64_t>& comms) const;
  // Notes an enqueue of `comm` in the ring's process; whether it is new.
  static bool note_comm(Ring& ring, uint64_t comm);
  void read(Ring& ring, const std::function<void(const GpuCollective&)>& out);
  void take(Ring& ring, const profiler::Record& r, const std::function<void(const GpuCollective&)>& out);
  void take_proxy(Ring& ring, const profiler::Record& r, const std::function<void(const GpuCollective&)>& out);
  // Sends pending collective `it` if its kernels and proxy work are done
  // (and those of its communicator and op before it, done or lost).
  void finish_if_done(Ring& ring, std::map<Key, Pending>::iterator it,
                      const std::function<void(const GpuCollective&)>& out);
  // Sends `p` (its kernels stopped): its times on the host clock, its link.
  void send(const Ring& ring, Pending& p, const std::function<void(const GpuCollective&)>& out);
  // Drops the oldest pending collective, sent first if its kernels stopped.
  void evict_oldest(Ring& ring, const std::function<void(const GpuCollective&)>& out);

  std::string proc_root_;
  std::map<uint32_t, std::unique_ptr<Ring>> rings_;  // by pid
  std::map<uint32_t, uint64_t> refused_;             // pid -> start time of a process whose ring was refused
  struct Unfinished {
    uint64_t start_time = 0;
    uint32_t tries = 0;
  };
  static constexpr uint32_t kUnfinishedTries = 40;  // ~1 s of the agent's ticks
  std::map<uint32_t, Unfinished> unfinished_;       // pid -> a ring being made when last looked at
  ProfilerRingCounts counts_;
  bool detail_all_ = false;             // the last set_detail's
  std::vector<uint64_t> detail_comms_;  // ... sorted
};

}  // namespace rankscope::agent
