#pragma once
// Waiting attributed to the ranks that caused it, per communicator: the
// straggler detector's evidence, and the source of a straggler finding's
// lateness, wait share and GPU-hours (so that cost and detection agree).
//
// At each complete exchange every member waits from its own arrival to the
// last one. Between two consecutive arrivals the ranks already there wait,
// and that waiting is owed in equal parts to the ranks not there yet. A rank
// that arrives last alone by g is owed about g (normalised per waiting
// rank: the job's time it cost); two ranks late together share it. Less
// each rank's clock margin (what the clocks cannot tell apart between it and
// the others: Detector::refresh_margins),
// and counted once over back-to-back exchanges that wait for the same
// stretch (buckets issued before the previous one completed).
//
// A rank's share is what it was owed over the window divided by the
// window's wall time: the share of the job's time the others spent waiting
// for it. It is a straggler when, with its structure learnt,
//   - a CUSUM of (owed - allowance x wall time) over closed buckets of the
//     window reaches `evidence_ns`: persistent, not one pause; the allowance
//     is `allowance` over the larger of its structural share and a typical
//     rank's share;
//   - its share in the window is over its allowance and `outsized` times a
//     typical rank's (the median share of the others);
//   - it is not chance: in a job whose step times vary by data (another
//     sequence length per rank and step), some rank arrives last at every
//     step, and one is owed a large share for a while by luck alone. Each
//     rank's lag at an instance is how far its value is behind the median
//     rank's (0 where it is ahead: early arrivals buy nothing back); a
//     bucket's mean lag, less the others' mean, is measured against the
//     job's own noise: the spread of that centred lag from one bucket to
//     the next, pooled over the ranks and their last changes (the 75th
//     percentile of the absolute changes / (1.1503 sqrt 2): the median's
//     estimate falls short of the heavier-than-normal tail of step times
//     that vary by data). A CUSUM of that
//     standardised lag, clipped to `lag_clip_sd` (one bucket, one pause,
//     is not persistence; after two buckets in a row at that clip, to a
//     quarter of `lag_evidence_sd`), less `lag_reference_sd`
//     must reach `lag_evidence_sd`; the bucket being filled counts in
//     proportion to how full it is. The CUSUM's buckets are the window's,
//     of 4 instances at least: the mean lag of fewer is skewed, and chance
//     passes the CUSUM far more often. At a slow step such a bucket spans
//     two steps, and a rank slowed 5x, far behind at every step, would
//     need 12 of them. So a rank also passes when it is far behind: a
//     quarter of `lag_evidence_sd` or more in each of its last buckets of a
//     fifth of the window (closed by time alone, an instance at least;
//     standardised by their own noise), each adding that less the reference,
//     until the run reaches `lag_evidence_sd` (5 in a row; the bucket
//     being filled counts in part while it is far behind so far, and ends
//     the run only once closed). Their noise
//     is read as the CUSUM's: lags counted only where behind pull the
//     median low where one collective makes a bucket (a rank ahead of the
//     median in two buckets in a row changes by almost nothing), another
//     reason for the 75th percentile. Chance puts a rank that far
//     behind about once in 1,000 such buckets of one collective, under
//     normal noise.
//     And a rank passes when the same CUSUM passes over longer buckets, of
//     4 and of 16 of the window's each (kCoarse), each standardised by its
//     own noise (measured as the window's is, and never under the
//     window's noise / sqrt of the buckets summed): a rank whose lag in a
//     bucket is under the reference value, a rank 5% slower in a job whose
//     steps vary by 25%, never gathers evidence there, and over 16 buckets
//     its lag is 4 times as many of their standard deviations.
//     A structurally late rank (the last pipeline stage) passes
//     this test always, and is judged by the rules above.
// A rank that passes the chance test but costs its job less than the
// allowance (a rank 5% slower among 64 whose own variation is 3%: last at
// a quarter of the steps, and then by little) is a slow rank, the minor
// straggler: its lag behind the median rank, beyond its structure, is over
// the allowance of the window's time. Its lag is counted as waiting is:
// from the median's arrival, beyond the clocks' margin and from
// `min_lateness_ns`, and where a host ran ahead only what it added since
// its previous instance or its release (less where it caught up); less the
// others' mean lag. As for
// waiting owed, a CUSUM of (lag - allowance x wall time, beyond its
// structure) over closed buckets, each adding at most a quarter of it,
// must reach `evidence_ns`: a rank late by
// structure passes the chance test always, and one window of its noise,
// or one pause, is not a slowdown.
// Methods and defaults: docs/detection.md, Straggler.
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace rankscope::collector {

struct AttributionOptions {
  uint64_t window_ns = 5'000'000'000ull;  // shares are judged over at least this much time (5 buckets),
                                          // longer where 4 buckets would hold fewer than min_instances
  uint64_t min_lateness_ns = 2'000'000;   // late by less than this at one exchange is scheduling noise: not counted
  size_t min_instances = 16;              // ... and only with this many instances in it
  size_t baseline_instances = 12;         // a window this full teaches the structural share
  double allowance = 0.02;                // share a rank may be owed over its structure or the typical rank's
  double outsized = 3;                    // times a typical rank's share, to be this rank's and not noise
  uint64_t evidence_ns = 250'000'000;     // owed waiting beyond the allowance that opens a finding
  // The chance test's CUSUM (Page): reference value and decision interval
  // in standard deviations of a bucket's mean lag. With 0.5 and 20, normal
  // noise alone reaches it once in about 3e9 buckets of one rank (Siegmund's
  // approximation, exp(2k(h + 1.166)) / 2k^2): at 1 s buckets, once in 4
  // days of an 8,192-rank job, before the other rules apply.
  double lag_reference_sd = 0.5;
  double lag_evidence_sd = 20;
  // A bucket adds at most this many standard deviations (a Huber clip),
  // and a quarter of `lag_evidence_sd` only after two in a row at it: the
  // standardised lag of a job whose steps vary by data has a heavy right
  // tail (a half-rectified log-normal: 5 sd or more in about one bucket of
  // 800 at 25% variation, against one of 3.5 million were it normal). Where
  // any bucket could add 5 sd, a few such buckets passed the CUSUM by luck
  // alone, once in 17 job-hours of 64 ranks (40% variation: once in 5.5);
  // clipped at 3 sd, once in 120; at 2.5, then 5 after two, never in 1,200
  // (rankscope-bench-chance-steps, docs/benchmarks.md). The price: a rank
  // slowed a little beyond the job's noise needs a few buckets more.
  double lag_clip_sd = 2.5;
  // Told of each closed bucket of the chance test's statistic: `timed`, a
  // far-behind run's bucket of 1 s or more (else the window's); every
  // rank's centred lag, whether or not the test reads it yet (a rank still
  // learning its baseline is reported too), and the job's noise it is
  // measured against (0: not yet known). For benchmarks of its distribution
  // (rankscope-bench-chance-steps --tail); unset, nothing is kept or told.
  std::function<void(bool timed, std::span<const double> centred, double noise)> on_bucket;
};

// A rank's standing: its window, its evidence and what they mean.
struct Standing {
  double share = 0;          // of the window's wall time, the others waited for this rank
  double typical = 0;        // the others' median share
  double baseline = 0;       // its structural share (the least share of a full window seen)
  double allowance = 0;      // the share it may have before evidence grows
  double evidence_ns = 0;    // CUSUM of owed waiting beyond the allowance
  double noise_ns = 0;       // the job's noise: the standard deviation of a bucket's mean lag
  double lag_evidence = 0;   // the chance test's evidence, in those standard deviations
  uint32_t chance_scale = 1;  // ... over buckets of this many of the window's buckets
  uint32_t far_buckets = 0;  // ... from this many buckets of 1 s or more, each far behind (0: from the CUSUM)
  uint64_t owed_ns = 0;      // owed in the window
  double lateness_ns = 0;    // its lateness: owed per instance it held up, less its structure
  uint32_t held = 0;         // instances in the window at which it held the others up (owed from min_lateness_ns)
  size_t instances = 0;      // instances in the window
  uint64_t window_ns = 0;    // the window's wall time
  bool learnt = false;       // its structural share is known
  bool over = false;         // a straggler by the rules above
  bool under = false;        // within its allowance
  double gpu_ns = 0;         // owed x (members - 1) while evidence or a finding was open
  // The slow-rank rule (above).
  double lag_share = 0;         // its lag behind the median rank over the window's wall time, less the others' mean
  double lag_baseline = 0;      // its structural lag share (the least of a full window seen)
  double lag_ns = 0;            // its lag per instance at which it lagged
  uint32_t lagged = 0;          // instances in the window at which it lagged the median (from min_lateness_ns)
  double slow_evidence_ns = 0;  // CUSUM of its lag beyond the allowance and its structure
  bool lags = false;            // lags beyond its structure by the allowance (host-side findings stay open meanwhile)
  bool slow = false;            // `lags`, passes the chance test and the slow-rank CUSUM; not `over`
};

class WaitAttribution {
 public:
  WaitAttribution(int32_t nranks, AttributionOptions options);

  int32_t nranks() const { return nranks_; }
  // One complete instance. value[r]: what blame is judged on (the rank's own
  // duration from its release, or its arrival); arrival[r]: its issue time on
  // the cluster clock; margin[r]: the clocks' uncertainty between it and the
  // others; completion_ns: the last arrival. `carried`: the values are
  // plain arrivals of hosts that ran ahead (issued this before their
  // previous exchange completed), so a rank's lateness at its previous
  // instance is carried into this one and only what it added is owed: a
  // host that paused once, 60 ms, before 200 queued collectives (FSDP's
  // layers) is owed 60 ms, not the 400 ms those collectives span.
  // `released` (where carried): by rank, when it was free to go on (0: not
  // known, or it ran ahead); it is owed only what it added since.
  void add(const std::vector<int64_t>& value, const std::vector<uint64_t>& arrival,
           const std::vector<uint64_t>& margin, uint64_t completion_ns, bool carried,
           const std::vector<uint64_t>* released = nullptr);
  // Every rank's standing as of the instances added (the current bucket
  // included); none added yet: nranks() standings of nothing.
  std::vector<Standing> standings() const;
  // Whether an instance was added: the per-rank rows are made then, so
  // that a communicator announced with many ranks whose collectives never
  // complete (a stand-in libnccl's) holds none, and costs no standings.
  bool started() const { return !ranks_.empty(); }
  // GPU time lost is counted for a rank while its evidence grows or while its finding is open.
  void set_open(int32_t rank, bool open);

 private:
  struct Rank {
    std::vector<uint64_t> owed;   // by bucket slot
    std::vector<uint32_t> held;   // by bucket slot
    std::vector<double> late;     // by bucket slot: its lateness at the instances it held up
    std::vector<double> lag;      // by bucket slot: its lag behind the median rank (as the slow-rank rule counts it)
    std::vector<uint32_t> lagged;  // by bucket slot: instances at which it lagged
    double lag_carry = 0;          // its lag in arrival at its last instance
    double lag_baseline = 0;       // its structural lag share
    double slow_evidence_ns = 0;   // CUSUM of its lag beyond the allowance and its structure
    double carry = 0;             // its lateness in arrival (fair share of the stretch) at its last instance
    double evidence_ns = 0;
    double lag_evidence = 0;   // the chance test's CUSUM (window buckets)
    std::array<double, 2> coarse_evidence{};  // ... and over longer buckets (kCoarse)
    uint32_t far_run = 0;      // ... and its run of far-behind buckets of 1 s or more
    // How many of its last closed buckets of each scale (the window's, then
    // kCoarse's) in a row were at lag_clip_sd or beyond (kPersisting: the
    // next may add more).
    std::array<uint32_t, 3> lag_persisting{};
    double baseline = 0;       // its structural share
    double late_baseline = 0;  // ... and lateness as measured per unit of wall time, learnt alike
    bool learnt = false;
    bool open = false;
    int64_t blamed_until = 0;
    double gpu_ns = 0;
  };
  // The chance test's statistic over one series of buckets: each rank's
  // lags behind the median rank in the bucket being filled, its centred
  // lag's last changes from one closed bucket to the next, and the job's
  // noise measured on them.
  class LagSeries {
   public:
    LagSeries(size_t nranks, size_t memory, size_t closed_kept);
    // Its per-rank rows, made at the first instance: a communicator whose
    // instances never complete (announced with many ranks, few of them
    // seen) keeps none.
    void start();
    void add(size_t rank, double lag) { sum_[rank] += lag; }
    void count() { count_ += 1; }
    // Each rank's mean lag in the bucket being filled less the others' mean.
    void centred(std::vector<double>& out) const;
    // Closes the bucket being filled: its centred lags (out), their changes kept.
    void close(std::vector<double>& out);
    // The standard deviation of a bucket's centred lag (0: not yet known),
    // as of the last close.
    double noise() const { return noise_; }
    // How full the bucket being filled is, against the closed ones.
    double fill() const;

   private:
    size_t nranks_;
    std::vector<double> sum_;      // by rank
    std::vector<double> last_;     // by rank: its centred lag in the last closed bucket
    std::vector<double> changes_;  // by rank, memory_ each: the last changes (a ring)
    size_t memory_, next_ = 0, kept_ = 0;  // memory_: changes kept per rank
    bool has_last_ = false;
    uint32_t count_ = 0;
    std::vector<uint32_t> closed_counts_;  // the instances of the last closed buckets (a ring)
    size_t closed_ = 0;
    double noise_ = 0;
    std::vector<double> scratch_;
    double measure_noise();
  };
  size_t slot(int64_t bucket) const { return static_cast<size_t>(bucket) % buckets_; }
  // The window's totals (slots of the last `buckets_` buckets) and each rank's share.
  uint64_t window_wall() const;
  size_t window_instances() const;
  std::vector<double> shares() const;
  // Each rank's lag share, less the others' mean (the slow-rank rule).
  std::vector<double> lag_shares() const;
  // What the slow-rank CUSUM adds for a rank's bucket in `slot`; `sum`: every rank's lag there (lag_sum()).
  double slow_step(const Rank& rank, size_t slot, double sum) const;
  double lag_sum(size_t slot) const;
  // What a bucket's x adds to the slow-rank CUSUM: at most a quarter of the opening level.
  double evidence_step(double x) const;
  // The median share of the ranks other than r (of all ranks past 8).
  static double typical(const std::vector<double>& shares, const std::vector<double>& sorted, int32_t r);
  void close_bucket();
  void close_timed_bucket();
  // The ranks by arrival (by_arrival_) and each position's lateness in
  // arrival (fair_at_); and the lateness a rank not there by t has at t.
  void rank_arrivals(const std::vector<uint64_t>& arrival);
  double fair_until(const std::vector<uint64_t>& arrival, uint64_t t) const;
  // The chance test: changes of each rank's centred lag kept for its noise.
  static constexpr size_t kNoiseBuckets = 20;
  static constexpr size_t kNoiseChanges = 400;
  static size_t noise_memory(int32_t nranks);
  // The noise of the longer buckets of kCoarse[i] (0: not yet known).
  double coarse_noise(size_t i) const;
  // The most the longer buckets' CUSUM holds.
  double coarse_cap() const;
  // What a bucket adds to the chance test's CUSUM; `persisting`: how many
  // buckets before it in a row were at the clip (at_clip).
  double lag_step(double centred_lag, double noise, uint32_t persisting) const;
  bool at_clip(double centred_lag, double noise) const;
  // A far-behind bucket (a quarter of the level behind) adds to the run a
  // quarter of the level less the reference; any other ends it.
  bool far_behind(double centred_lag, double noise) const;
  double far_evidence(uint32_t run) const;
  void start();
  // Each rank's structural share, lateness and lag from the window as it stands.
  void learn(const std::vector<double>& share);
  // Each rank's lag behind the median at one instance, as the slow-rank rule counts it.
  void add_lags(const std::vector<int64_t>& value, const std::vector<uint64_t>& arrival,
                const std::vector<uint64_t>& margin, double middle, bool carried, const std::vector<uint64_t>* released,
                size_t slot);

  int32_t nranks_;
  AttributionOptions options_;
  size_t buckets_ = 5;
  uint64_t bucket_ns_;                 // a bucket lasts at least this long ...
  size_t per_bucket_;                  // ... and holds at least this many instances
  int64_t current_ = -1;               // the bucket being filled (counted from 0)
  uint64_t bucket_start_ = 0;          // the completion that opened it
  std::vector<uint64_t> wall_;         // by slot
  std::vector<uint32_t> count_;        // by slot
  LagSeries lags_;                     // the window's buckets
  LagSeries timed_lags_;               // buckets of bucket_ns_ closed by time alone ...
  // The chance test over longer buckets: kCoarse[i] of the window's each.
  static constexpr std::array<size_t, 2> kCoarse = {4, 16};
  static_assert(kCoarse.size() == std::tuple_size_v<decltype(Rank::coarse_evidence)>);
  std::vector<LagSeries> coarse_lags_;  // by kCoarse
  size_t closed_buckets_ = 0;           // the window's buckets closed so far
  uint64_t timed_start_ = 0;           // ... the completion that opened the one being filled
  uint64_t last_completion_ = 0;
  std::vector<Rank> ranks_;
  std::vector<int32_t> order_;         // scratch: ranks by value
  std::vector<int32_t> by_arrival_;    // scratch: ranks by arrival
  std::vector<double> fair_at_;        // scratch: lateness in arrival by position
};

}  // namespace rankscope::collector
