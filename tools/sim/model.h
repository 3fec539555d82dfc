#pragma once
// The simulated training fleet: jobs laid out over nodes (tensor parallel
// inside a node, pipeline and data parallel across nodes), a step model that
// produces every rank's NCCL records and host waits in true time, and the
// faults with their ground truth. Pure computation, no sockets: the same
// seed gives the same records (times relative to the run's start).
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "proto/records.h"

namespace rankscope::sim {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max() / 4;

enum class FaultKind { slowdown_rank, slowdown_node, hang_stop, hang_kill, mismatch, agent_death };
const char* fault_kind_name(FaultKind kind);
// The finding kind the collector should raise for it ("straggler", "hang", ...).
const char* expected_finding(FaultKind kind);

// The training loops the fleet's jobs run (--pattern), as fakenccl-train's:
//   ""         (default) tensor-parallel AllReduces inside a node, a
//              pipeline exchange, data-parallel buckets and a world
//              AllReduce, every collective blocking the host;
//   tp-dp      the same without the pipeline and the world AllReduce;
//   pipeline   Send/Recv between stages plus a data-parallel AllReduce;
//   ddp        --dp-buckets AllReduces over all ranks, queued while the
//              host computes, one host wait at the step's end;
//   sync-each  the same with a host wait after every collective;
//   fsdp       --layers AllGathers forward, then an AllGather and a
//              ReduceScatter per layer backward (>= 200 small collectives
//              a step at the default 70 layers), one host wait a step;
//   accum      ddp's buckets every --accum-steps-th micro-step only;
//   jitter     ddp with data-dependent step times (compute sigma 0.25).
struct FleetConfig {
  uint64_t seed = 1;
  std::string pattern;             // see above
  int layers = 70;                 // fsdp: layers (3 collectives each per step)
  int accum_steps = 4;             // accum: micro-steps per collective step
  std::string prefix = "sim";      // node and job names start with it
  int jobs = 4;
  int nodes_per_job = 4;
  int gpus = 8;                    // ranks per node (the tensor-parallel group)
  int pp = 2;                      // pipeline stages (across nodes)
  double step_ms = 50;             // mean step time of a healthy rank
  int tp_ops = 4;                  // tensor-parallel AllReduces per step
  int dp_buckets = 2;              // data-parallel gradient buckets per step
  bool world_op = true;            // one small AllReduce over all ranks per step (loss / grad norm)
  double jitter_sigma = 0.03;      // log-normal sigma of each compute segment
  double gc_rate = 0.002;          // GC-like pauses per rank per step
  double gc_min_ms = 5, gc_max_ms = 60;
  double last_stage_factor = 1.2;  // the last pipeline stage computes this much longer (benign)
  double exit_spread_us = 20;      // ranks leave a collective within this (half-normal)
  // Clocks: every node gets a boot-relative monotonic clock, a drift and a
  // wall-clock skew (its NTP error), and its probes see network jitter.
  double max_drift_ppm = 30;
  double min_skew_s = 1e-6, max_skew_s = 2;
  double probe_jitter_ms = 1;      // mean extra round trip of a clock probe (exponential, split over both legs)
  // Delivery.
  double batch_loss = 0;           // share of batch sends lost on the network (re-sent after the ack timeout)
  double batch_reorder = 0;        // share of batches held back and sent after the next one
  double record_loss = 0;          // share of records lost before the wire (ring buffer full: a sequence gap)
  // Faults: "healthy", "slowdown" (ranks), "node-slowdown", "hang" (a rank
  // stopped or killed: "hang-stop", "hang-kill"), "mismatch", "agent-death",
  // or "mixed": job i gets healthy, slowdown, node-slowdown, hang-stop,
  // hang-kill, mismatch, agent-death by i mod 7.
  std::string scenario = "healthy";
  double fault_after_s = 8;        // onsets are drawn in [fault_after_s, fault_after_s + fault_window_s]
  double fault_window_s = 4;
  double factor = 0;               // slowdown factor; 0: drawn log-uniformly in [min_factor, max_factor]
  double min_factor = 1.02, max_factor = 5;
  int culprits_per_job = 1;        // slowdowns: slowed ranks (or nodes) per job
  double fault_duration_s = 0;     // slowdowns end after this; 0: until the run ends
  // How a slowed rank's extra time comes: "even", every compute segment
  // takes `factor` times longer (a slower CPU); "stalls", it computes at
  // full speed and, once the extra time it owes reaches `stall_ms`, stops
  // for all of it (a cgroup CPU quota spent for its period, CPU hogs with
  // more weight taking their turn): on time at most steps, far behind at some.
  std::string slowdown_shape = "even";
  double stall_ms = 100;
};

// Sets the knobs `config.pattern` fixes ("" leaves them as given); false
// (with why) for an unknown pattern or a fleet it cannot have.
bool apply_pattern(FleetConfig& config, std::string* why);

struct CommDef {
  uint64_t hash = 0;
  std::string kind;          // tp | dp | pp | world
  std::vector<int> members;  // global ranks, by comm rank
};

struct RankDef {
  int node = 0;              // index into Fleet::nodes
  int local = 0, stage = 0, replica = 0;
  uint32_t pid = 0;
  int tp = -1, dp = -1, pp = -1;       // comm indices in JobDef::comms (-1: none)
  int tp_rank = 0, dp_rank = 0, pp_rank = 0;
};

struct JobDef {
  std::string name;
  std::vector<int> nodes;        // fleet node indices
  std::vector<RankDef> ranks;    // by global rank
  std::vector<CommDef> comms;
  int world = -1;
  bool has_tp = false;  // a tensor-parallel communicator per node
};

struct NodeDef {
  std::string name;
  int job = 0;
  std::vector<int> ranks;        // global ranks of its job on it, by local rank
  uint64_t boot_ns = 0;          // its monotonic clock at the run's start
  double drift = 0;              // (node clock rate - 1)
  int64_t wall_skew_ns = 0;      // its wall clock minus true time
  uint64_t instance = 0;
  // Node clock at true time `rel_ns` after the run's start.
  uint64_t clock_at(int64_t rel_ns) const {
    return boot_ns + static_cast<uint64_t>(static_cast<double>(rel_ns) * (1.0 + drift));
  }
};

struct FaultDef {
  int id = 0;
  int job = 0;
  FaultKind kind = FaultKind::slowdown_rank;
  int64_t onset_ns = 0, end_ns = kNever;  // relative to the run's start
  std::vector<int> ranks;                 // culprit global ranks
  std::vector<int> nodes;                 // culprit nodes
  double factor = 1;
};

// One NCCL call or host wait as the node's BPF side would see it, times true
// (relative to the run's start).
struct SimEvent {
  int64_t at_ns = 0;         // when the agent gets it (the call's return, the wait's end)
  bool wait = false;
  uint32_t pid = 0;
  uint64_t comm = 0;
  int32_t comm_rank = -1;
  uint32_t lane = 0;
  proto::CallRecord call;    // times true-relative
  int64_t wait_start = 0, wait_end = 0;
  bool operator>(const SimEvent& o) const { return at_ns > o.at_ns; }
};

// What a rank's process is doing, for the heartbeats.
struct RankState {
  bool stopped = false, killed = false;
  int64_t since_ns = 0;        // stopped/killed/blocked since
  int64_t blocked_at = kNever; // in a host wait that will not end, since
  double stall_owed_ns = 0;    // slowdown_shape "stalls": extra time owed, not yet stalled for
};

class Fleet {
 public:
  explicit Fleet(const FleetConfig& config);

  const FleetConfig& config() const { return config_; }
  const std::vector<JobDef>& jobs() const { return jobs_; }
  const std::vector<NodeDef>& nodes() const { return nodes_; }
  const std::vector<FaultDef>& faults() const { return faults_; }
  size_t total_ranks() const;

  // Generates the steps of every job that start before `horizon_ns`; new
  // events go to `out[node]` (unsorted). Returns the number of events.
  size_t advance(int64_t horizon_ns, std::vector<std::vector<SimEvent>>& out);
  // Steps begun so far per job.
  const std::vector<uint64_t>& steps() const { return steps_; }
  const RankState& rank_state(int job, int rank) const { return state_[job][rank]; }
  // Whether the agent of `node` is dead at `rel_ns`.
  bool agent_dead(int node, int64_t rel_ns) const;

  // Per (fault, comm, global rank): true lateness of the culprit against the
  // median of the others, at the collectives completed while the fault held.
  struct LatenessKey {
    int fault;
    uint64_t comm;
    int rank;
    bool operator<(const LatenessKey& o) const {
      return std::tie(fault, comm, rank) < std::tie(o.fault, o.comm, o.rank);
    }
  };
  const std::map<LatenessKey, std::vector<int64_t>>& lateness() const { return lateness_; }
  // The same instances' truth of the culprit's own time against the median
  // of the others': its compute since its previous call, what a slow rank's
  // finding states (its lag at each collective), where lateness() is what
  // its arrivals accumulate.
  const std::map<LatenessKey, std::vector<int64_t>>& own_lag() const { return own_lag_; }
  // True issue times of one sampled rank per node (local rank 0, its TP comm), for clock error.
  struct ClockSample {
    int node;
    uint64_t comm;
    int comm_rank;
    uint64_t seq;
    int64_t true_ns;
  };
  std::vector<ClockSample> take_clock_samples();

 private:
  struct JobRun {
    std::vector<int64_t> t;                      // per rank: ready for the next operation (kNever: blocked)
    std::vector<int64_t> own;                    // per rank: its compute since its previous call (its own time)
    std::vector<int64_t> stream;                 // per rank: its GPU stream is free from (queued patterns)
    std::vector<uint64_t> comm_seq;              // next lane-0 seq per comm
    std::map<std::tuple<int, int, uint32_t>, uint64_t> p2p_seq;  // (comm, rank, lane) -> next seq
    int64_t step_start = 0;                      // earliest ready time of the current step
    bool frozen = false;                         // no rank can make progress any more
    std::vector<int> mismatch_fault;             // per rank: mismatch fault id pending, -1 none
  };

  void build();
  // Job j's communicators: tensor-parallel inside a node, data-parallel per
  // stage and local GPU, pipeline per replica and local GPU, and the world.
  void wire_comms(int j, JobDef& jd);
  void draw_faults();
  void step(int j, std::vector<std::vector<SimEvent>>& out, size_t& made);
  void compute(int j, int r, double base_ns);
  // Every member of comm `c` that can (not stopped, not blocked) issues its
  // next collective at its ready time; a mismatch fault due at a
  // `mismatch_point` makes its rank call another count.
  struct Arrivals {
    std::vector<int64_t> at;   // by comm rank; kNever: did not arrive
    std::vector<int64_t> own;  // by comm rank: its compute since its previous call
    bool complete = true, mismatched = false;
  };
  Arrivals arrive(int j, int c, uint8_t op, uint8_t datatype, uint64_t count, bool mismatch_point,
                  std::vector<std::vector<SimEvent>>& out, size_t& made);
  // One collective on each comm of `comms`; records go out, ready times move on.
  void collective(int j, const std::vector<int>& comms, uint8_t op, uint8_t datatype, uint64_t count,
                  bool step_end, bool dp_bucket0, std::vector<std::vector<SimEvent>>& out, size_t& made);
  void p2p(int j, std::vector<std::vector<SimEvent>>& out, size_t& made);
  // One step of a data-parallel pattern (ddp, sync-each, fsdp, accum,
  // jitter) on the job's world communicator: collectives queued on each
  // rank's stream while its host computes on, host waits at sync points.
  void data_parallel_step(int j, std::vector<std::vector<SimEvent>>& out, size_t& made);
  // Keeps true issue times of some members, to score the stored ones against.
  void sample_clocks(const JobDef& job, const CommDef& comm, uint64_t seq, const std::vector<int64_t>& arrival);
  void queued_collective(int j, int c, uint8_t op, uint8_t datatype, uint64_t count, double xfer_ns, bool sync,
                         bool mismatch_point, std::vector<std::vector<SimEvent>>& out, size_t& made);
  // The host of each rank waits for its stream (a wait record each).
  void host_waits(int j, std::vector<std::vector<SimEvent>>& out);
  // The lateness truth of the active slowdowns at an instance of comm `c`.
  void note_lateness(int j, const CommDef& comm, const Arrivals& a, int64_t last);
  double slowdown(int j, int r, int64_t at) const;
  bool stops_at(int j, int r, int64_t at);
  uint64_t comm_hash(int j, const std::string& what) const;
  void emit(int j, int r, int comm, int32_t comm_rank, uint32_t lane, uint64_t seq, uint8_t op, uint8_t datatype,
            uint64_t count, int32_t peer, uint8_t flags, int64_t issue, std::vector<std::vector<SimEvent>>& out,
            size_t& made);

  FleetConfig config_;
  int segments_ = 1;  // compute segments of a step (GC-like pauses are drawn per step, spread over them)
  std::mt19937_64 rng_;
  std::vector<JobDef> jobs_;
  std::vector<NodeDef> nodes_;
  std::vector<FaultDef> faults_;
  std::vector<JobRun> runs_;
  std::vector<std::vector<RankState>> state_;
  std::vector<uint64_t> steps_;
  std::map<LatenessKey, std::vector<int64_t>> lateness_, own_lag_;
  std::vector<ClockSample> clock_samples_;
  std::map<uint64_t, int64_t> clock_sampled_ns_;  // comm hash -> when its last samples were taken
  std::vector<std::mt19937_64> job_rng_;  // one stream per job: the same records whatever the pacing
};

}  // namespace rankscope::sim
