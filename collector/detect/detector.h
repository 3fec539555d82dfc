#pragma once
// The live detectors. They read the timeline as it is ingested (every
// collective record, on the cluster clock) and the collector's picture of
// nodes, communicators and processes, and keep the book of findings:
//   hang       some ranks reached sequence N of a communicator and others did
//              not, for longer than the hang timeout; or all reached it and
//              none progresses
//   mismatch   ranks issued different collectives at the same sequence number
//   straggler  a rank persistently arrives late at its communicator's
//              collectives, by more than the clock uncertainty
//   node_lost  an agent with live communicators stopped talking
// Methods, parameters and limits: docs/detection.md.
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "collector/detect/findings.h"
#include "collector/match/matcher.h"
#include "collector/ingest.h"

namespace rankscope::collector {

struct DetectOptions {
  uint64_t hang_timeout_ns = 30'000'000'000ull;
  uint64_t node_lost_timeout_ns = 15'000'000'000ull;
  uint64_t min_lateness_ns = 2'000'000;   // never call a rank late by less than this
  double relative_lateness = 0;           // ... nor by less than this share of the collective period
  double lateness_z = 6;                  // ... nor by less than this many standard errors of its median
  // The lateness statistics use the instances scored in the last
  // straggler_window_ns, at least straggler_window of them, at most
  // straggler_max_samples (memory: 16 bytes a sample and rank). A window of
  // time, not of a count: a job that completes hundreds of collectives
  // between two evaluations is judged on all of its recent ones (up to the
  // cap), not on the last 32 of them, which made every evaluation an
  // independent small sample and the hysteresis a coin toss.
  size_t straggler_window = 32;           // complete instances: the least the statistics use
  uint64_t straggler_window_ns = 5'000'000'000ull;
  size_t straggler_max_samples = 128;
  size_t straggler_min_samples = 16;
  size_t baseline_samples = 12;           // a rank's first instances: its structural lateness (baseline)
  uint64_t settle_ns = 500'000'000;       // a completed collective is scored this long after its last
                                          // arrival, when the exchanges before it have arrived too
  int open_after = 3;                     // consecutive evaluations over the threshold to open
  int close_after = 5;                    // ... under half of it to resolve
  uint64_t context_window_ns = 10'000'000'000ull;  // host context looked at for explanations
};

// Hears the matcher's events (subscribes in its constructor) and reads the
// model of nodes, communicators and processes.
class Detector final : public MatchListener {
 public:
  Detector(const Ingest& ingest, CollectiveMatcher& matcher, FindingBook& book, const Clock& clock,
           DetectOptions options);

  void on_complete(const CollectiveComplete& done) override;
  void on_mismatch(const CollectiveMismatch& mismatch) override;
  void on_pair(const PairComplete& pair) override;
  // Runs the hang, straggler and node-lost detectors; `now_ns` is the cluster clock.
  void evaluate(uint64_t now_ns);
  // Lateness of the last rank to arrive, per complete collective since the last call (seconds).
  std::vector<double> take_lateness_samples();

 private:
  struct RankStats {
    std::deque<int64_t> lateness_ns;  // per complete instance: own lateness (below), against the median of the others
    std::deque<uint64_t> scored_ns;   // ... and when that instance completed (cluster clock)
    std::vector<int64_t> first_ns;    // the first baseline_samples own lateness values
    int64_t baseline_ns = 0;          // structural lateness learnt from them (0 until learnt)
    double baseline_se_ns = 0;        // its standard error
    std::deque<uint64_t> delay_ns;    // how much later the instance completed because of this rank
    int over = 0, under = 0;          // hysteresis counters
    bool open = false;                // a straggler finding is open for it (as of the last evaluation)
    // Statistics of the window, worked out again only after a new value
    // (an evaluation without one reads them: at 8,192 ranks, two medians
    // per rank and evaluation were most of the collector's time).
    bool fresh = false;
    int64_t median_ns = 0;            // median lateness over the baseline
    double se_ns = 0;                 // its standard error (baseline's included)
    std::vector<int64_t> sorted_ns;   // the window's lateness over the baseline, sorted
    double gpu_ns_lost = 0;           // since its straggler finding opened
    int64_t blamed_until = 0;         // delays are counted once: back-to-back collectives overlap
  };
  // When a process's host was last free to go on: per exchange it took part
  // in (a collective instance, a matched Send/Recv pair), its own arrival and
  // the exchange's release (the last arrival).
  struct ProcHistory {
    std::deque<std::pair<uint64_t, uint64_t>> exchanges;  // (arrival, release), cluster clock
    void add(uint64_t arrival, uint64_t release);
    // The latest point before `t` at which the process was free to go on:
    // the latest release of an exchange it entered before `t`. 0: unknown,
    // or it issued `t` before its latest exchange completed (the host ran
    // ahead, so plain arrival lateness applies).
    uint64_t base_before(uint64_t t) const;
  };
  struct Completed {
    std::vector<uint64_t> issue;  // by rank
    uint64_t last_ns = 0;         // the last arrival
  };
  struct CommDetect {
    std::deque<Completed> done;              // complete, not yet scored (settling)
    std::vector<ProcHistory*> procs;         // by rank; null: member not known yet
    std::deque<uint64_t> completed_ns;       // completion (last arrival) times, for the period
    std::vector<RankStats> ranks;
    std::set<std::string> all_inside;        // keys of open hangs where every rank is inside
    std::map<std::string, std::string> told;  // open hang key -> the culprits' process states it told
  };

  // The communicator's detection state, its per-rank statistics sized.
  CommDetect& state_of(const CommState& comm);
  ProcHistory* proc_of(const CommState& comm, CommDetect& state, int32_t rank);
  // Own lateness of each settled complete instance into the ranks' windows.
  void score(CommDetect& state, uint64_t now_ns);
  // Nodes silent for long enough that their ranks are unseen, not hung.
  bool unseen(const std::string& node) const { return silent_.count(node) > 0; }
  // Whether a hang naming `ranks` is explained by lost nodes (then noted for their finding).
  bool fold_into_lost_nodes(const CommState& comm, const std::vector<int32_t>& ranks);
  void evaluate_hang(const CommState& comm, CommDetect& state, uint64_t now_ns,
                     const std::vector<const Finding*>& open_of_comm);
  void evaluate_stragglers(const CommState& comm, CommDetect& state, uint64_t now_ns,
                           const std::set<int32_t>* open_ranks);
  void refresh_statistics(RankStats& stats) const;
  const NodeState* node_named(const std::string& name) const;
  void evaluate_nodes(uint64_t now_ns);
  void resolve_comm(uint64_t comm, uint64_t now_ns);

  const ProcessHealth* health_of(const MemberState& member) const;
  std::string describe_rank(const CommState& comm, int32_t rank, uint64_t now_ns) const;
  std::string host_context(const CommState& comm, int32_t rank) const;
  // Other cgroups that used the member's node's CPUs lately ("" if none).
  std::string busy_neighbours(const MemberState& member) const;
  uint64_t clock_uncertainty(const std::string& node) const;

  const Ingest& ingest_;
  CollectiveMatcher& matcher_;
  FindingBook& book_;
  const Clock& clock_;
  DetectOptions options_;
  std::map<uint64_t, CommDetect> comms_;
  std::map<std::pair<std::string, uint32_t>, ProcHistory> procs_;  // by (node, pid)
  std::set<std::string> silent_;                     // this evaluation's silent nodes
  std::map<std::string, std::set<uint64_t>> folded_;  // silent node -> comms whose hang it explains
  std::map<std::string, size_t> folded_told_;         // lost node -> comms its finding said it explains
  std::set<std::string> open_lost_;                   // nodes with an open node_lost finding, this evaluation
  struct PeerShares {
    bool known = false;
    double running = 0, waiting = 0, off_cpu = 0;
  };
  mutable std::map<uint64_t, PeerShares> peer_cache_;  // per communicator, this evaluation
  // The node looked up last: a communicator's members come node by node.
  mutable const NodeState* last_node_ = nullptr;
  std::vector<double> lateness_samples_;
};

}  // namespace rankscope::collector
