#pragma once
// The live detectors. They read the timeline as it is ingested (every
// collective record, on the cluster clock) and the collector's picture of
// nodes, communicators and processes, and keep the book of findings:
//   hang       some ranks reached sequence N of a communicator and others did
//              not, for longer than the hang timeout; or all reached it and
//              none progresses
//   mismatch   ranks issued different collectives at the same sequence number
//   straggler  a rank is owed a persistent, outsized share of the time its
//              communicator's other ranks spend waiting (beyond the clocks'
//              uncertainty): on the host side (it issues late), or, where
//              NCCL's profiler plugin reports GPU times, on the GPU side (it
//              issues on time and its kernels start late)
//   node_lost  an agent with live communicators stopped talking
// Methods, parameters and limits: docs/detection.md. One class, one file per
// pass: detector.cpp (events, evaluation, shared state), hang.cpp,
// mismatch.cpp, straggler.cpp, node_lost.cpp; text.* (what findings say).
#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "collector/detect/attribution.h"
#include "collector/detect/findings.h"
#include "collector/match/gpu_matcher.h"
#include "collector/match/matcher.h"
#include "collector/model/cluster.h"
#include "common/clock.h"

namespace rankscope::collector {

struct DetectOptions {
  uint64_t hang_timeout_ns = 30'000'000'000ull;
  uint64_t node_lost_timeout_ns = 15'000'000'000ull;
  // Stragglers: waiting attributed to the ranks that caused it, judged
  // over a window of time (collector/detect/attribution.h).
  AttributionOptions straggler;
  uint64_t settle_ns = 500'000'000;       // a completed collective is scored this long after its last
                                          // arrival, when the exchanges before it have arrived too
  int close_after = 5;                    // consecutive evaluations within the allowance to resolve
  uint64_t context_window_ns = 10'000'000'000ull;  // host context looked at for explanations
};

// Hears the matcher's events (subscribes in its constructor), the GPU
// matcher's (where subscribed) and reads the model of nodes, communicators
// and processes.
class Detector final : public MatchListener, public GpuListener, public RecordObserver {
 public:
  Detector(const ClusterModel& model, CollectiveMatcher& matcher, FindingBook& book, const Clock& clock,
           DetectOptions options);

  void on_complete(const CollectiveComplete& done) override;
  void on_mismatch(const CollectiveMismatch& mismatch) override;
  void on_pair(const PairComplete& pair) override;
  void on_issues(const CommState& comm, int32_t rank, uint32_t lane, std::span<const Issue> issues) override;
  // A host wait on the GPU that ended (cudaStreamSynchronize and friends),
  // as the ingest applies it (its observer): when the exchange it waited
  // for had its data (ProcHistory).
  void on_waits(const std::string& node, uint32_t pid, std::span<const HostWait> waits) override;
  void on_gpu_complete(const GpuComplete& done) override;
  // The GPU side of a member's call, as the ingest applies it: its kernel's end.
  void on_gpu(const CommState& comm, int32_t rank, uint8_t op, const proto::GpuRecord& record) override;
  // Runs the hang, straggler and node-lost detectors; `now_ns` is the cluster clock.
  void evaluate(uint64_t now_ns);
  // Between evaluations: the communicators' settled instances scored, at
  // most `members` members' worth, from where the last call stopped. At
  // FSDP's rates half a second's instances are hundreds of thousands of
  // members to score, and scored all at once by the evaluation they held
  // the loop, and every ack, for up to 0.19 s (docs/benchmarks.md); the
  // evaluation now scores what is left. Returns the members scored.
  size_t score_some(uint64_t now_ns, size_t members);
  // Lateness of the last rank to arrive, per complete collective since the last call (seconds).
  std::vector<double> take_lateness_samples();
  // What it keeps state for: communicators and processes (bounded by the live model's).
  size_t tracked_comms() const { return comms_.size(); }
  size_t tracked_processes() const { return procs_.size(); }
  // Complete instances scored without a member's node's batch that was
  // missing when they completed and did not come within kBatchGapWaitNs.
  uint64_t scored_incomplete() const { return incomplete_; }

 private:
  struct RankStats {
    int under = 0;                    // consecutive evaluations within its allowance
    int gpu_under = 0;                // ... on the GPU side (or with no GPU times)
    bool raised_slow = false;         // its open finding says it is a slow rank (minor)
  };
  // An exchange (a collective instance, a matched Send/Recv pair) as its
  // members' hosts saw it: its release (the last arrival) and when its data
  // had moved, as far as a host can tell: the earliest end of a host wait
  // on the GPU that covered it, by any member (began by its release, or
  // kWaitJoinNs and the clocks' margin after; ended after it:
  // collector/detect/host_wait.h). Every member's wait ends once its
  // stream has the exchange's data, and later by its host's own delay in
  // waking (a CPU-starved host's is long): the earliest is the closest to
  // the data's arrival and carries no other member's delay.
  struct ExchangeData {
    explicit ExchangeData(uint64_t at) : release(at) {}
    const uint64_t release;
    uint64_t data_ns = UINT64_MAX;  // none covered it yet
  };
  // When a process's host was last free to go on: per exchange it took part
  // in, its own arrival, whether its own host waited on the GPU for it, and
  // the exchange's release and data.
  struct ProcHistory {
    struct Exchange {
      uint64_t arrival;  // cluster clock
      // Its data's release, kept here too: base_before reads it for every
      // exchange it passes, and the shared row, made when the exchange
      // completed, is seldom in the cache by then.
      uint64_t release;
      uint32_t margin;  // the clocks' margin between its arrival and the release (waited_for; at most 1 s)
      bool waited = false;
      std::shared_ptr<ExchangeData> data;
      // Bounds over it and every exchange before it, for base_before to stop
      // early: the latest arrival, and the latest time it could have been
      // free (its release, or its data's time where its host waited; the
      // data's time only ever moves earlier, so a bound once set holds).
      uint64_t arrival_bound = 0, free_bound = 0;
      // The earliest arrival from it to the latest: exchanges complete
      // about in arrival order, so those arrived at or after a time are
      // found by a search (common/search.h), not passed over one by one.
      uint64_t arrival_after = 0;
      // The earliest release from the oldest kept to it: where it is after
      // the time asked about, none of them was free by then. A host that
      // queued a whole step ahead (FSDP's first step) would otherwise be
      // walked back through every call of it, for each call scored.
      uint64_t release_min = UINT64_MAX;
    };
    // The latest an exchange can be free, as far as is known now.
    static uint64_t free_bound_of(const Exchange& e);
    std::deque<Exchange> exchanges;
    std::deque<uint64_t> issues;  // its calls of exchanges, complete or not, in time order
    // Where base_before last found the time it was asked about in each, as
    // a count of entries ever kept (so that dropping the oldest does not
    // move it): its next question is about a time close by, and the
    // entries there are still in the cache, where a binary search over a
    // whole history missed it at every step.
    size_t exchanges_dropped = 0, issues_dropped = 0;
    mutable size_t exchanges_finger = 0, issues_finger = 0;
    // Its host's waits on the GPU (start, end), by end: blocked in
    // cudaStreamSynchronize until its stream's work was done.
    std::deque<std::pair<uint64_t, uint64_t>> waits;
    // `margin`: the clocks' margin between it and the others (waited_for).
    void add(uint64_t arrival, const std::shared_ptr<ExchangeData>& data, uint64_t margin);
    void add_issue(uint64_t issue);
    // The ends of its kernels of every communicator, in time order: a
    // kernel cannot start before the one queued ahead of it on its stream
    // ended, whichever communicator that one belongs to (a tensor-parallel
    // collective held up by a slow partner holds up the data-parallel one
    // behind it). The latest end at or before `start` (0: none kept).
    std::deque<uint64_t> gpu_ends;
    void add_gpu_end(uint64_t end);
    uint64_t gpu_end_before(uint64_t start) const;
    // The first communicator and rank it was seen as; a second rank of
    // that communicator: it drives several GPUs, and its ends are not used.
    uint64_t first_comm = 0;
    int32_t first_rank = -1;
    bool several_gpus = false;
    void add_wait(uint64_t start, uint64_t end);
    // Its latest calls of exchanges, oldest first (by issue time): the last
    // is where it is now, if that exchange has not completed; an earlier
    // one that has not holds its stream, whatever it called after.
    struct Call {
      uint64_t comm = 0;
      int32_t rank = -1;
      uint32_t lane = 0;
      uint64_t seq = 0;
      uint64_t issue_ns = 0;
    };
    static constexpr size_t kRecentCalls = 8;
    std::vector<Call> recent;
    void add_call(const Call& call);
    uint64_t last_issue_ns() const { return recent.empty() ? 0 : recent.back().issue_ns; }
    // When the process was last free to go on before `t`: the latest release
    // of an exchange it entered before `t`, or, where its host waited on the
    // GPU for that exchange, when the exchange's data had moved (a pipeline
    // stage waits for its partner's activations, which a slowed partner's
    // stream, or NCCL's proxy thread starved with its host, sends late; it
    // is not free before they come) (known); it issued `t` before its
    // latest exchange completed (ahead: the host ran ahead, so plain arrival
    // lateness applies, carried over from its previous instance); no
    // exchange before `t` is known (none: its first, or older than the
    // history; plain arrivals, nothing carried); or its latest call before
    // `t` belongs to an exchange not complete (its partner's records are
    // missing or late): unknown.
    enum class Release { known, ahead, none, unknown };
    std::pair<Release, uint64_t> base_before(uint64_t t) const;
  };
  struct Completed {
    std::vector<uint64_t> issue;  // by rank
    uint64_t last_ns = 0;         // the last arrival
    std::shared_ptr<const std::vector<uint64_t>> margin;  // the margins when it completed (null: none yet)
    // Its members' nodes that had a batch missing when it completed (the
    // node, and since when): a rank's earlier calls may be in that batch,
    // and without them its release is an older one and its own time a step
    // too long. Scored once those batches came, or kBatchGapWaitNs passed.
    std::vector<std::pair<const NodeState*, uint64_t>> gaps;
  };
  struct CommDetect {
    std::deque<Completed> done;              // complete, not yet scored (settling)
    std::vector<ProcHistory*> procs;         // by rank; null: member not known yet
    std::unique_ptr<WaitAttribution> waits;  // sized for the communicator
    // The GPU side: complete GPU instances (arrival: kernel start), and the
    // waiting of the ranks' kernels attributed alike; null until GPU times come.
    std::deque<Completed> gpu_done;
    std::unique_ptr<WaitAttribution> gpu_waits;
    // By rank: the clocks' uncertainty against the others, as of the last
    // evaluation. Records are put on the cluster clock as they arrive, with
    // the clocks as then known: an instance keeps the margins of when it
    // completed (a node's first seconds, before its probes, are 1 s uncertain).
    std::shared_ptr<const std::vector<uint64_t>> margin;
    std::vector<uint64_t> scratch;            // the margins an instance is scored with
    std::vector<uint64_t> released;           // ... and its members' releases
    std::vector<RankStats> ranks;
    std::set<std::string> all_inside;        // keys of open hangs where every rank is inside
    std::map<std::string, std::string> told;  // open hang key -> the culprits' process states it told
    // The stall held back because a node had not told what it captured
    // (reported_past): which (a kind's tag and its seq) and since when,
    // on the collector's clock.
    std::pair<int64_t, int64_t> held_stall{-1, -1};
    uint64_t held_since_ns = 0;
  };

  using ProcKey = std::pair<std::string, uint32_t>;  // (node, pid)
  // A collective some ranks wait in, found this evaluation. When a rank
  // stops, every communicator of its job stalls behind it: the stalls whose
  // missing ranks themselves wait in another stall are folded into the one
  // that names the rank holding everything up.
  struct Stall {
    const CommState* comm = nullptr;
    CommDetect* state = nullptr;
    Finding finding;           // kind, job, comm, seq, ranks (missing, or stuck inside), summary
    uint64_t since_ns = 0;     // waited on from here
    bool partial = false;      // some ranks never entered it (else every rank is inside)
    bool timed_out = false;    // waited on for the hang timeout
    std::vector<ProcKey> missing;  // the processes of the missing ranks (partial)
    std::vector<ProcKey> stuck;    // every rank inside: the ones stopped or exited (the job is held up here)
    std::vector<int32_t> also_missing;  // missing, alive, beside stopped or exited ones (which the finding names)
    const OpenCollective* instance = nullptr;  // partial: the open instance at or after the stalled one
    uint64_t instance_seq = 0;
    int others = 0;                             // partial: the ranks that entered it
    std::vector<size_t> folded;    // the stalls waiting on it, folded into its finding
    bool owned = false;            // folded into another stall's finding
    // Its collective is mismatched: the job is held there, and the mismatch
    // finding tells it; no hang is raised for it or the stalls behind it.
    bool mismatch = false;
  };

  // The communicator's detection state, its per-rank statistics sized.
  // Drops the state of communicators no longer in the live model.
  void forget_retired(uint64_t now_ns);
  CommDetect& state_of(const CommState& comm);
  ProcHistory* proc_of(const CommState& comm, CommDetect& state, int32_t rank);
  // Own lateness of each settled complete instance into the ranks' windows.
  // Scores its settled instances, at most about `members` members' worth
  // (an instance is scored whole); returns the members scored.
  size_t score(CommDetect& state, uint64_t now_ns, size_t members = SIZE_MAX);
  void score_front(CommDetect& state);
  // Whether the front instance can be scored: its members' missing batches
  // came (score), are still awaited (wait), or were waited for long enough
  // (late: scored on what is known).
  enum class Ready { score, wait, late };
  Ready ready(const Completed& c, uint64_t now_ns) const;
  // The nodes of the communicator's members with a batch missing now.
  void note_gaps(const CommState& comm, Completed& c) const;
  // The GPU side: each rank's kernel start is its arrival, judged from
  // when its GPU was free to go on (its previous kernels' end).
  void score_gpu_front(CommDetect& state);
  // Nodes silent for long enough that their ranks are unseen, not hung.
  bool unseen(const std::string& node) const { return silent_.count(node) > 0; }
  // Nothing heard of `node` for `after_ns` (since this collector started, at
  // least), and everything it could have sent since has been read: a loop
  // held up (a long evaluation, a burst) would find nodes silent whose
  // heartbeats wait unread. A loop that has not read its socket empty for
  // two node-lost timeouts judges on what it read.
  bool silent_for(const NodeState& node, uint64_t now_ns, uint64_t after_ns) const;
  // Whether a hang naming `ranks` is explained by lost nodes (then, with `note`, noted for their finding).
  bool fold_into_lost_nodes(const CommState& comm, const std::vector<int32_t>& ranks, bool note);
  // Resolves the communicator's hangs that progressed, and notes its stall, if any.
  void evaluate_hang(const CommState& comm, CommDetect& state, uint64_t now_ns,
                     const std::vector<const Finding*>& open_of_comm);
  // Resolves the communicator's hangs whose ranks went on (a mismatch is
  // only told that the job went on past it: it stays open until acknowledged).
  void resolve_progressed(CommDetect& state, uint64_t now_ns, const std::vector<const Finding*>& open_of_comm,
                          int64_t min_last, int64_t max_last, uint64_t last_activity);
  // Some ranks reached collective min_last + 1 and the others never entered
  // it: the stall, unless the instance is not open or lost nodes explain it.
  bool note_partial_stall(Stall& stall, const std::vector<int64_t>& last, int64_t min_last, uint64_t now_ns);
  // Every rank issued the same last collective and nothing moved for the
  // hang timeout: the stall, unless lost nodes explain it or ranks are busy
  // on the CPU (working, not hung).
  bool note_inside_stall(Stall& stall, int64_t max_last, uint64_t last_activity, uint64_t now_ns);
  // Where the members' GPUs are in a communicator (their plugins' reports in
  // the heartbeats): whose oldest unfinished collective started its kernels,
  // and whose did not.
  struct GpuSplit {
    std::vector<int32_t> not_started;  // ranks whose GPU has not started it
    size_t started = 0;                // ranks whose kernels started
    uint64_t enqueued_ns = 0;          // the latest enqueue of the ones not started
    // Ranks whose open collective was enqueued with NCCL's proxy steps off,
    // and, of the others, those whose proxy steps never came (every peer on
    // their node, where no proxy step reports; or the plugin's label was
    // wrong: NCCL fixed the mask earlier, e.g. in a CUDA graph).
    std::vector<int32_t> without_detail, without_steps;
    // Of those, the send handed to the network longest ago and not done:
    // its sender, receiver and since when (-1: none).
    int32_t link_from = -1, link_to = -1;
    uint64_t link_since_ns = 0;
    // Some GPUs started and wait, others never started: those are stuck.
    bool named() const { return !not_started.empty() && started > 0; }
    bool all_started(int32_t n) const { return not_started.empty() && started == static_cast<size_t>(n); }
  };
  GpuSplit gpu_split(const CommState& comm) const;
  static std::string inside_cause(const GpuSplit& gpu, int32_t n);
  // Resolves the communicator's Send/Recv hangs that progressed, and notes
  // its halves waiting for their other half as a stall (unless `stalled`:
  // its collectives already stall).
  void evaluate_pairs(const CommState& comm, CommDetect& state, uint64_t now_ns,
                      const std::vector<const Finding*>& open_of_comm, bool stalled);
  static bool is_pair_hang(const Finding& f);
  // Whether `node` has told this collector what its agent captured until a
  // hang timeout after `since_ns` (NodeState::reported_ns; not known: taken
  // as told): a collector behind (its input queued, a restarted one reading
  // the agents' spools) judges a rank missing only on what that rank's node
  // sent after the timeout, not on what is still on its way.
  bool reported_past(const std::string& node, uint64_t since_ns) const;
  // Whether a stall of `state` (`which`: a kind's tag and its seq) waited on
  // since `since_ns` is judged now: every node in `nodes` told what it
  // captured past its timeout, or it was held back for one more hang
  // timeout of the collector's clock already (a node whose data stays
  // behind, its batches refused or held back, does not hide a hang for long).
  // A null node: one not known (a missing rank no agent reported, while
  // some node has told nothing yet), not told.
  bool judged_now(CommDetect& state, std::pair<int64_t, int64_t> which, const std::vector<const std::string*>& nodes,
                  uint64_t since_ns, uint64_t now_ns);
  // The nodes of a partial stall's missing ranks, for judged_now.
  std::vector<const std::string*> missing_nodes(const Stall& stall) const;
  // Folds the stalls that wait on another into it, and raises the rest that waited long enough.
  void raise_stalls(uint64_t now_ns);
  // The communicators held behind a mismatched collective raise no hang:
  // its job's open mismatch finding counts them, and says since when.
  void tell_held_behind_mismatch(uint64_t now_ns);
  // Where each stall's missing ranks lead, by stall index: the processes
  // that wait in no exchange (roots), the stalls every rank is inside that
  // they reach (insides), and whether the stall names a root itself (direct:
  // the job is held up there; the others stall behind it). Only the stalls
  // of the jobs that hung are followed (linked); the others are left as
  // they are.
  struct StallLinks {
    std::vector<std::vector<ProcKey>> roots;
    std::vector<std::set<size_t>> insides;
    std::vector<bool> direct;
    std::vector<char> linked;
  };
  StallLinks link_stalls();
  // Stalls that name the same held-up process become one (the one that
  // tells it best owns the others); a stall behind others joins the best of them.
  void fold_stalls(const StallLinks& links);
  // The other stalls whose stalled collective one of `members` (whose latest
  // call is in stall i) entered: i, issued after it, is behind them.
  std::set<size_t> entered_elsewhere(size_t i, const std::vector<ProcKey>& members) const;
  // Of two stalls, the one whose finding tells the story: a mismatched
  // collective's, else the one already open (`open`, by stall), else the one
  // waited on longest.
  bool tells_better(size_t a, size_t b, const std::vector<char>& open) const;
  void raise_stall(Stall& stall, uint64_t now_ns);
  // A partial stall's culprits and story, worked out when it is told.
  void describe_stall(Stall& stall) const;
  // Who waits on whom in this evaluation's stalls (collector/detect/hang.cpp):
  // each exchange followed once, whatever the number of stalls reaching it.
  class WaitGraph;
  void evaluate_stragglers(const CommState& comm, CommDetect& state, uint64_t now_ns,
                           const std::set<int32_t>* open_ranks);
  // A straggler finding for rank r: host side from `host`, GPU side from `gpu` (else null).
  Finding straggler_finding(const CommState& comm, const CommDetect& state, int32_t r, const Standing& host,
                            const Standing* gpu) const;
  // Each rank's clock margin for this evaluation: its node's uncertainty plus
  // the other nodes' largest, or, against the ranks of its own node, how far
  // its node's estimate moved lately (whichever is larger).
  void refresh_margins(const CommState& comm, CommDetect& state) const;
  const NodeState* node_named(const std::string& name) const;
  void evaluate_nodes(uint64_t now_ns);
  void resolve_comm(uint64_t comm, uint64_t now_ns);

  const ProcessHealth* health_of(const MemberState& member) const;
  std::string describe_rank(const CommState& comm, int32_t rank, uint64_t now_ns) const;
  std::string host_context(const CommState& comm, int32_t rank) const;
  // Other cgroups that used the member's node's CPUs lately ("" if none).
  std::string busy_neighbours(const MemberState& member) const;

  const ClusterModel& model_;
  CollectiveMatcher& matcher_;
  FindingBook& book_;
  const Clock& clock_;
  DetectOptions options_;
  std::map<uint64_t, CommDetect> comms_;
  uint64_t score_from_ = 0;                                        // the communicator score_some goes on from
  std::map<std::pair<std::string, uint32_t>, ProcHistory> procs_;  // by (node, pid)
  std::set<std::string> silent_;                     // this evaluation's silent nodes
  // Some node heard from has told nothing of what it captured yet (no
  // batch of it applied, no heartbeat saying all is acknowledged): a rank
  // no agent reported may be one of its, its announcement still on the way.
  bool untold_nodes_ = false;
  std::vector<Stall> stalls_;                         // this evaluation's
  std::map<std::pair<uint64_t, uint64_t>, size_t> inside_stalls_;  // (comm, seq) -> stall every rank is inside
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
  uint64_t incomplete_ = 0;
};

}  // namespace rankscope::collector
