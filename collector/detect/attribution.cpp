#include "collector/detect/attribution.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/stats.h"

namespace rankscope::collector {

namespace {
// Evidence is capped at this many times the opening level, so that a rank
// that recovers after a long slowdown does not carry it for minutes.
constexpr double kEvidenceCap = 4;
// The wall time one instance adds is at most this: a job that pauses (a
// checkpoint, an evaluation pass) is not waiting for anyone meanwhile.
constexpr uint64_t kMaxIntervalNs = 30'000'000'000ull;
// One bucket adds at most this part of the opening level to the slow-rank
// CUSUM (a Huber clip): a rank late by structure passes the chance test
// always, and one pause of a rank behind the median but not last (a GC-like
// 300 ms) would otherwise pass the rest in one bucket. (The costly
// straggler's evidence is not clipped: its far-behind run passes in 5
// buckets of 1 s, where the 6 or more of the chance test's CUSUM, of 4
// collectives each, can span 12 steps.)
constexpr double kEvidenceClip = 0.25;
// After this many buckets in a row at the chance test's clip, the next may
// add up to a quarter of its level (WaitAttribution::lag_step).
constexpr uint32_t kPersisting = 2;

// A rank's value less the mean of the n - 1 others' (`sum`: all n ranks').
double less_others_mean(double value, double sum, size_t n) {
  return value - (sum - value) / static_cast<double>(n - 1);
}
}  // namespace

size_t WaitAttribution::noise_memory(int32_t nranks) {
  // The changes of n ranks' centred lags in one bucket sum to about 0: n - 1
  // of them tell something. At least kNoiseChanges of those in all, and
  // kNoiseBuckets of each rank.
  const size_t others = nranks > 1 ? static_cast<size_t>(nranks) - 1 : 1;
  return std::max(kNoiseBuckets, (kNoiseChanges + others - 1) / others);
}

WaitAttribution::WaitAttribution(int32_t nranks, AttributionOptions options)
    : nranks_(nranks),
      options_(options),
      bucket_ns_(std::max<uint64_t>(1, options.window_ns / 5)),
      per_bucket_(std::max<size_t>(1, (options.min_instances + buckets_ - 2) / (buckets_ - 1))),
      lags_(static_cast<size_t>(std::max(0, nranks)), noise_memory(nranks), buckets_ - 1),
      timed_lags_(static_cast<size_t>(std::max(0, nranks)), noise_memory(nranks), buckets_ - 1) {
  for (size_t i = 0; i < kCoarse.size(); ++i)
    coarse_lags_.emplace_back(static_cast<size_t>(std::max(0, nranks)), noise_memory(nranks), buckets_ - 1);
  wall_.assign(buckets_, 0);
  count_.assign(buckets_, 0);
}

void WaitAttribution::start() {
  if (started() || nranks_ <= 0) return;
  ranks_.resize(static_cast<size_t>(nranks_));
  for (Rank& r : ranks_) {
    r.owed.assign(buckets_, 0);
    r.held.assign(buckets_, 0);
    r.late.assign(buckets_, 0);
    r.lag.assign(buckets_, 0);
    r.lagged.assign(buckets_, 0);
  }
}

WaitAttribution::LagSeries::LagSeries(size_t nranks, size_t memory, size_t closed_kept)
    : nranks_(nranks), memory_(memory), closed_counts_(closed_kept, 0) {}

void WaitAttribution::LagSeries::start() {
  if (!sum_.empty() || nranks_ == 0) return;
  sum_.assign(nranks_, 0);
  last_.assign(nranks_, 0);
  changes_.assign(nranks_ * memory_, 0);
}

void WaitAttribution::LagSeries::centred(std::vector<double>& out) const {
  // Each rank's mean lag less the mean of the others': lags are counted
  // only where a rank is behind, so they are skewed, and the median of the
  // ranks would sit below their mean: every rank would seem behind it by
  // chance. The others' mean, not one that includes the rank, behind which
  // a straggler would hide.
  const size_t n = nranks_;
  out.assign(n, 0);
  if (count_ == 0 || n < 2 || sum_.empty()) return;
  double sum = 0;
  for (size_t r = 0; r < n; ++r) sum += out[r] = sum_[r] / count_;
  for (double& lag : out) lag = less_others_mean(lag, sum, n);
}

void WaitAttribution::LagSeries::close(std::vector<double>& out) {
  start();
  centred(out);
  const size_t n = nranks_;
  if (has_last_) {
    for (size_t r = 0; r < n; ++r) changes_[r * memory_ + next_] = std::abs(out[r] - last_[r]);
    next_ = (next_ + 1) % memory_;
    kept_ = std::min(kept_ + 1, memory_);
  }
  last_ = out;
  has_last_ = n > 0;
  std::fill(sum_.begin(), sum_.end(), 0.0);
  closed_counts_[closed_ % closed_counts_.size()] = count_;
  closed_ += 1;
  count_ = 0;
  noise_ = measure_noise();
}

double WaitAttribution::LagSeries::measure_noise() {
  // Changes of each rank's centred lag from one bucket to the next, the
  // last `memory_` of each: under no fault, a difference of two values of
  // the same noise. The centred lag itself, not the rank's raw mean: that
  // is what is tested, and a rank never behind the median (its raw mean
  // always 0) would otherwise drag the estimate down. Over many changes: a
  // quantile of a few is now and then far too small, and every step it
  // scales is then taken for evidence. Scaled as for normal changes (of
  // sd sqrt 2 x sigma): their 75th percentile / (1.1503 sqrt 2). Not their
  // median, for two reasons (scripts/bench-chance.py). Where a bucket may
  // hold one collective (the far-behind run's), the median is pulled low
  // by the many changes between two buckets in which a rank was ahead (lag
  // 0 in both): under normal noise the true spread is 1.26-1.43 times the
  // median's estimate, 1.05-1.09 times the 75th percentile's. And the
  // test's evidence is its tail, which in a job whose step times vary by
  // data (log-normal, as sequence lengths make them) is heavier than
  // normal: with the median's estimate the CUSUM rose past 14 several
  // times as often as under normal noise; with the 75th percentile's about
  // as often as with the median's under normal noise. A rank that slows
  // down changes once, at its onset, and moves neither.
  if (kept_ == 0) return 0;
  scratch_.clear();
  for (size_t r = 0; r < sum_.size(); ++r)
    scratch_.insert(scratch_.end(), changes_.begin() + static_cast<std::ptrdiff_t>(r * memory_),
                    changes_.begin() + static_cast<std::ptrdiff_t>(r * memory_ + kept_));
  if (scratch_.size() < 3) return 0;
  auto at = scratch_.begin() + static_cast<std::ptrdiff_t>(3 * (scratch_.size() - 1) / 4);
  std::nth_element(scratch_.begin(), at, scratch_.end());
  const double sd = *at / (1.1503 * std::sqrt(2.0));
  // Noise of exactly equal values (a replayed or synthetic job): a
  // microsecond, far under any lateness that counts.
  return std::max(1000.0, sd);
}

double WaitAttribution::LagSeries::fill() const {
  const size_t closed = std::min(closed_, closed_counts_.size());
  if (closed == 0) return count_ > 0 ? 1.0 : 0.0;
  const double expected =
      static_cast<double>(
          std::accumulate(closed_counts_.begin(), closed_counts_.begin() + static_cast<std::ptrdiff_t>(closed), 0u)) /
      static_cast<double>(closed);
  return std::min(1.0, static_cast<double>(count_) / expected);
}

uint64_t WaitAttribution::window_wall() const { return std::accumulate(wall_.begin(), wall_.end(), uint64_t{0}); }

size_t WaitAttribution::window_instances() const {
  return std::accumulate(count_.begin(), count_.end(), size_t{0});
}

std::vector<double> WaitAttribution::shares() const {
  double wall = static_cast<double>(window_wall());
  std::vector<double> out(ranks_.size(), 0.0);
  if (wall <= 0) return out;
  for (size_t r = 0; r < ranks_.size(); ++r)
    out[r] = static_cast<double>(std::accumulate(ranks_[r].owed.begin(), ranks_[r].owed.end(), uint64_t{0})) / wall;
  return out;
}

double WaitAttribution::evidence_step(double x) const {
  return std::min(x, kEvidenceClip * static_cast<double>(options_.evidence_ns));
}

double WaitAttribution::lag_sum(size_t s) const {
  double sum = 0;
  for (const Rank& o : ranks_) sum += o.lag[s];
  return sum;
}

double WaitAttribution::slow_step(const Rank& rank, size_t s, double sum) const {
  // Its lag in the bucket less the others' mean, beyond the allowance and
  // its structure.
  const size_t n = ranks_.size();
  if (n < 2) return 0;
  return less_others_mean(rank.lag[s], sum, n) -
         (options_.allowance + std::max(0.0, rank.lag_baseline)) * static_cast<double>(wall_[s]);
}

std::vector<double> WaitAttribution::lag_shares() const {
  const double wall = static_cast<double>(window_wall());
  const size_t n = ranks_.size();
  std::vector<double> out(n, 0.0);
  if (wall <= 0 || n < 2) return out;
  double sum = 0;
  for (size_t r = 0; r < n; ++r) sum += out[r] = std::accumulate(ranks_[r].lag.begin(), ranks_[r].lag.end(), 0.0);
  // Less the others' mean, as the chance test's lags: a job whose every
  // rank lags the median now and then (its own variation) has no slow rank.
  for (double& lag : out) lag = less_others_mean(lag, sum, n) / wall;
  return out;
}

double WaitAttribution::typical(const std::vector<double>& shares, const std::vector<double>& sorted, int32_t r) {
  // Past 8 ranks one rank moves the median of all by at most a neighbour.
  if (shares.size() >= 8) return median_of_sorted(sorted);
  std::vector<double> others;
  for (size_t o = 0; o < shares.size(); ++o)
    if (static_cast<int32_t>(o) != r) others.push_back(shares[o]);
  std::sort(others.begin(), others.end());
  return median_of_sorted(others);
}

double WaitAttribution::lag_step(double centred_lag, double noise, uint32_t persisting) const {
  if (noise <= 0) return 0;
  // One bucket gives at most `lag_clip_sd` (a Huber clip of the
  // standardised lag): persistence is what the test is for, one pause of a
  // node (hundreds of milliseconds in one collective of a quiet job) would
  // otherwise pass it in one step, and a few buckets of a heavy tail by
  // chance in a few more. A bucket that follows kPersisting in a row at
  // the clip gives up to a quarter of the level: a rank far behind bucket
  // after bucket passes almost as fast as without the lower clip, where the
  // heavy tail's chance buckets come one at a time (their lags hardly
  // correlate from one bucket to the next).
  const double clip =
      persisting >= kPersisting ? std::max(options_.lag_clip_sd, options_.lag_evidence_sd / 4) : options_.lag_clip_sd;
  return std::clamp(centred_lag / noise, -clip, clip) - options_.lag_reference_sd;
}

bool WaitAttribution::at_clip(double centred_lag, double noise) const {
  return noise > 0 && centred_lag >= options_.lag_clip_sd * noise;
}

double WaitAttribution::coarse_cap() const {
  // The level needed and a quarter more, where the window's
  // CUSUM holds 4 times the level: the longer buckets are 4-16 times as
  // long, and a rank that has recovered falls below the level in about as
  // much time as from the window's cap (10 longer buckets against 120).
  return options_.lag_evidence_sd * 1.25;
}

double WaitAttribution::coarse_noise(size_t i) const {
  // As measured on the longer buckets' own changes, and never under what
  // the window's buckets' noise would be over kCoarse[i] of them were they
  // independent: few longer buckets are closed yet (the first are minutes
  // apart), and a 75th percentile of few changes is now and then far too
  // small. A job whose lags drift from one bucket to the next (the same
  // rank behind for a while, by chance) measures more than that, and is
  // judged on what it measures.
  const double measured = coarse_lags_[i].noise();
  const double fine = lags_.noise();
  if (measured <= 0 || fine <= 0) return 0;
  return std::max(measured, fine / std::sqrt(static_cast<double>(kCoarse[i])));
}

bool WaitAttribution::far_behind(double centred_lag, double noise) const {
  // A quarter of the level behind (5 sd). Under normal noise a bucket of one
  // collective is that far behind by chance about once in 1,000
  // (scripts/bench-chance.py).
  return noise > 0 && centred_lag >= options_.lag_evidence_sd / 4 * noise;
}

double WaitAttribution::far_evidence(uint32_t run) const {
  // A quarter of the level a bucket, less the reference: 5 in a row pass.
  const double per_bucket = std::max(0.0, options_.lag_evidence_sd / 4 - options_.lag_reference_sd);
  return std::min(static_cast<double>(run) * per_bucket, kEvidenceCap * options_.lag_evidence_sd);
}

void WaitAttribution::learn(const std::vector<double>& share) {
  // Each rank's structure: the least share of a full window seen (it only falls).
  const double wall = static_cast<double>(window_wall());
  const std::vector<double> lag = lag_shares();
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Rank& rank = ranks_[r];
    double late = wall > 0 ? std::accumulate(rank.late.begin(), rank.late.end(), 0.0) / wall : 0;
    rank.baseline = rank.learnt ? std::min(rank.baseline, share[r]) : share[r];
    rank.late_baseline = rank.learnt ? std::min(rank.late_baseline, late) : late;
    rank.lag_baseline = rank.learnt ? std::min(rank.lag_baseline, lag[r]) : lag[r];
    rank.learnt = true;
  }
}

void WaitAttribution::close_timed_bucket() {
  std::vector<double> centred;
  timed_lags_.close(centred);
  const double job_noise = timed_lags_.noise();
  if (options_.on_bucket) options_.on_bucket(true, centred, job_noise);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Rank& rank = ranks_[r];
    rank.far_run = rank.learnt && far_behind(centred[r], job_noise) ? rank.far_run + 1 : 0;
  }
}

void WaitAttribution::close_bucket() {
  // The bucket just filled is evidence; the window as it stands teaches
  // each rank's structure.
  const size_t s = slot(current_);
  std::vector<double> share = shares();
  std::vector<double> sorted = share;
  std::sort(sorted.begin(), sorted.end());
  const double cap = kEvidenceCap * static_cast<double>(options_.evidence_ns);
  const double lag_cap = kEvidenceCap * options_.lag_evidence_sd;
  // Each rank's centred lag in this bucket (its change from the last kept).
  std::vector<double> centred;
  lags_.close(centred);
  const double job_noise = lags_.noise();
  if (options_.on_bucket) options_.on_bucket(false, centred, job_noise);
  const double bucket_lag = lag_sum(s);
  closed_buckets_ += 1;
  for (size_t i = 0; i < kCoarse.size(); ++i) {
    if (closed_buckets_ % kCoarse[i] != 0) continue;
    std::vector<double> coarse;
    coarse_lags_[i].close(coarse);
    const double noise = coarse_noise(i);
    for (size_t r = 0; r < ranks_.size(); ++r) {
      Rank& rank = ranks_[r];
      if (!rank.learnt) continue;
      uint32_t& persisting = rank.lag_persisting[i + 1];
      rank.coarse_evidence[i] =
          std::clamp(rank.coarse_evidence[i] + lag_step(coarse[r], noise, persisting), 0.0, coarse_cap());
      persisting = at_clip(coarse[r], noise) ? persisting + 1 : 0;
    }
  }
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Rank& rank = ranks_[r];
    if (!rank.learnt) continue;
    double allowance = options_.allowance + std::max(rank.baseline, typical(share, sorted, static_cast<int32_t>(r)));
    double x = static_cast<double>(rank.owed[s]) - allowance * static_cast<double>(wall_[s]);
    rank.evidence_ns = std::clamp(rank.evidence_ns + x, 0.0, cap);
    rank.slow_evidence_ns = std::clamp(rank.slow_evidence_ns + evidence_step(slow_step(rank, s, bucket_lag)), 0.0, cap);
    rank.lag_evidence =
        std::clamp(rank.lag_evidence + lag_step(centred[r], job_noise, rank.lag_persisting[0]), 0.0, lag_cap);
    rank.lag_persisting[0] = at_clip(centred[r], job_noise) ? rank.lag_persisting[0] + 1 : 0;
    if (rank.evidence_ns == 0 && !rank.open) rank.gpu_ns = 0;
  }
  if (window_instances() >= options_.baseline_instances) learn(share);
}

void WaitAttribution::rank_arrivals(const std::vector<uint64_t>& arrival) {
  // Each position's fair share of the stretches before it, as add() counts it on values.
  const size_t n = ranks_.size();
  by_arrival_.resize(n);
  std::iota(by_arrival_.begin(), by_arrival_.end(), 0);
  std::sort(by_arrival_.begin(), by_arrival_.end(), [&](int32_t a, int32_t b) { return arrival[a] < arrival[b]; });
  fair_at_.assign(n, 0);
  for (size_t j = 1; j < n; ++j) {
    const double stretch = static_cast<double>(arrival[by_arrival_[j]] - arrival[by_arrival_[j - 1]]);
    fair_at_[j] = fair_at_[j - 1] + static_cast<double>(j) * stretch / static_cast<double>(n - j) /
                                        static_cast<double>(n - 1);
  }
}

double WaitAttribution::fair_until(const std::vector<uint64_t>& arrival, uint64_t t) const {
  // The ranks arrived by t (k of them) waited from the k-th arrival to t for
  // the n - k not there, this rank among them.
  const size_t n = ranks_.size();
  auto after = std::upper_bound(by_arrival_.begin(), by_arrival_.end(), t,
                                [&](uint64_t at, int32_t r) { return at < arrival[r]; });
  const size_t k = static_cast<size_t>(after - by_arrival_.begin());
  if (k == 0) return 0;
  if (k >= n) return fair_at_[n - 1];
  const double stretch = static_cast<double>(t - arrival[by_arrival_[k - 1]]);
  return fair_at_[k - 1] + static_cast<double>(k) * stretch / static_cast<double>(n - k) / static_cast<double>(n - 1);
}

void WaitAttribution::add(const std::vector<int64_t>& value, const std::vector<uint64_t>& arrival,
                          const std::vector<uint64_t>& margin, uint64_t completion_ns, bool carried,
                          const std::vector<uint64_t>* released) {
  const size_t n = static_cast<size_t>(std::max(0, nranks_));
  if (value.size() != n || arrival.size() != n || margin.size() != n || n < 2) return;
  start();
  // A bucket lasts at least bucket_ns and holds at least per_bucket_
  // instances: a job of slow steps (one collective every 10 s) is judged
  // over as many instances as a fast one, over a longer window. The
  // far-behind run's buckets close by time alone.
  if (current_ < 0) {
    current_ = 0;
    bucket_start_ = timed_start_ = completion_ns;
  } else {
    if (completion_ns >= timed_start_ + bucket_ns_) {
      close_timed_bucket();
      timed_start_ = completion_ns;
    }
    if (completion_ns >= bucket_start_ + bucket_ns_ && count_[slot(current_)] >= per_bucket_) {
      close_bucket();
      current_ += 1;
      const size_t next = slot(current_);
      wall_[next] = 0;
      count_[next] = 0;
      for (Rank& r : ranks_) r.owed[next] = 0, r.held[next] = 0, r.late[next] = 0, r.lag[next] = 0, r.lagged[next] = 0;
      bucket_start_ = completion_ns;
    }
  }
  const size_t s = slot(current_);
  if (last_completion_ > 0 && completion_ns > last_completion_)
    wall_[s] += std::min(completion_ns - last_completion_, kMaxIntervalNs);
  last_completion_ = std::max(last_completion_, completion_ns);
  count_[s] += 1;
  lags_.start(), lags_.count();
  timed_lags_.start(), timed_lags_.count();
  for (LagSeries& coarse : coarse_lags_) coarse.start(), coarse.count();

  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0);
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) { return value[a] < value[b]; });
  // Each rank's lag behind the median rank, for the chance test: only
  // where it was behind. A rank ahead at most collectives (a core to itself
  // where the others share theirs) and far behind at some (its CPU share
  // spent) holds the job up at those; being early elsewhere buys nothing back.
  const double middle = n % 2 ? static_cast<double>(value[order_[n / 2]])
                              : (static_cast<double>(value[order_[n / 2 - 1]]) + static_cast<double>(value[order_[n / 2]])) / 2;
  for (size_t r = 0; r < n; ++r) {
    const double lag = std::max(0.0, static_cast<double>(value[r]) - middle);
    lags_.add(r, lag);
    timed_lags_.add(r, lag);
    for (LagSeries& coarse : coarse_lags_) coarse.add(r, lag);
  }
  // Between the arrivals at positions j-1 and j, j ranks wait, owed in
  // equal parts to the n - j ranks not there yet (`fair`, per waiting rank:
  // the job's time it cost); each of them kept the waiting ranks there for
  // the whole stretch (`held`: its lateness as measured).
  // Lateness carried over from its previous instance (its host ran ahead)
  // was owed there, or excused there: only what it added since is new
  // waiting. What is carried is lateness in arrival: the instance before
  // may have been judged on durations from each rank's release. A rank
  // released at a known time (`released`) could not have arrived before
  // it: the lateness it would have had arriving then is not its own
  // either (a rank released late by an exchange of another communicator,
  // and excused there, is as late in arrival at the calls it issues right
  // after).
  if (!carried || released) rank_arrivals(arrival);
  add_lags(value, arrival, margin, middle, carried, released, s);
  if (!carried)
    for (size_t j = 0; j < n; ++j) ranks_[by_arrival_[j]].carry = fair_at_[j];
  else
    ranks_[order_[0]].carry = 0;
  double held = 0, fair = 0;
  for (size_t j = 1; j < n; ++j) {
    int32_t r = order_[j];
    double stretch = static_cast<double>(value[r] - value[order_[j - 1]]);
    held += static_cast<double>(j) * stretch / static_cast<double>(n - 1);
    fair += static_cast<double>(j) * stretch / static_cast<double>(n - j) / static_cast<double>(n - 1);
    Rank& rank = ranks_[r];
    double before = 0;
    if (carried) {
      before = rank.carry;
      if (released && (*released)[r] != 0) before = std::max(before, fair_until(arrival, (*released)[r]));
      rank.carry = fair;
    }
    // Never late by less than min_lateness_ns, nor by less than the clocks
    // can tell apart; what is owed is what lies beyond the clocks' margin.
    if (fair < static_cast<double>(std::max(options_.min_lateness_ns, margin[r])) || fair <= 0) continue;
    double owed = fair - std::max(static_cast<double>(margin[r]), before);
    if (owed <= 0) continue;
    int64_t t = static_cast<int64_t>(arrival[r]);
    const int64_t start = t - static_cast<int64_t>(owed);
    // All it is owed here is new: no earlier instance counted any of it.
    const bool whole = start >= rank.blamed_until;
    int64_t from = std::max(start, rank.blamed_until);
    rank.blamed_until = std::max(rank.blamed_until, t);
    if (t <= from) continue;
    uint64_t counted = static_cast<uint64_t>(t - from);
    rank.owed[s] += counted;
    // Held up at this one: new waiting, not the tail of a stretch counted
    // at the previous one (where lateness is carried, any new waiting).
    // Where none of it was counted before, it is new however little of it
    // lies beyond a wide margin: its lateness passed the floor and the
    // margin above.
    if (whole || counted >= options_.min_lateness_ns || carried) {
      rank.held[s] += 1;
      rank.late[s] += held;  // its lateness there, as measured (the margin only guards the decision)
    }
    if (rank.open || rank.evidence_ns > 0) rank.gpu_ns += static_cast<double>(counted) * static_cast<double>(n - 1);
  }
  // A communicator's first full window is learnt as soon as it is full, not
  // at the end of its bucket: a slowdown that appears a second into a job
  // is not structure.
  if (!ranks_.empty() && !ranks_[0].learnt && window_instances() >= options_.baseline_instances) learn(shares());
}

void WaitAttribution::add_lags(const std::vector<int64_t>& value, const std::vector<uint64_t>& arrival,
                               const std::vector<uint64_t>& margin, double middle, bool carried,
                               const std::vector<uint64_t>* released, size_t s) {
  // As waiting is owed (add() below): a rank's lag at an instance counts
  // from `min_lateness_ns` and beyond the clocks' margin; where its host ran
  // ahead, only what it added since its previous instance (its lag in
  // arrival there) or since its release: a host that paused once before
  // 200 queued collectives lagged once, and a rank released late by
  // another communicator's exchange lags for that one's sake. Where
  // values are durations, the lag carried to the next instance is the
  // rank's lag in arrival (by_arrival_ is sorted here).
  const size_t n = ranks_.size();
  int64_t middle_arrival = 0;  // on the earliest arrival
  if (!carried) {
    const uint64_t first = arrival[by_arrival_[0]];
    middle_arrival = n % 2 ? static_cast<int64_t>(arrival[by_arrival_[n / 2]] - first)
                           : static_cast<int64_t>((arrival[by_arrival_[n / 2 - 1]] - first) / 2 +
                                                  (arrival[by_arrival_[n / 2]] - first) / 2);
  }
  const double floor = static_cast<double>(options_.min_lateness_ns);
  for (size_t r = 0; r < n; ++r) {
    Rank& rank = ranks_[r];
    const double lag = std::max(0.0, static_cast<double>(value[r]) - middle);
    double before = 0;
    if (carried) {
      before = rank.lag_carry;
      if (released && (*released)[r] != 0) before = std::max(before, static_cast<double>((*released)[r]) - middle);
      rank.lag_carry = lag;
    } else {
      const int64_t own = static_cast<int64_t>(arrival[r] - arrival[by_arrival_[0]]);
      rank.lag_carry = static_cast<double>(std::max<int64_t>(0, own - middle_arrival));
    }
    const double clocks = static_cast<double>(margin[r]);
    if (carried) {
      // What it added is how much further behind it is: its lag as counted
      // (from the floor, beyond the clocks) less what it was before, less
      // where it caught up. A host preempted now and then and catching up
      // between is behind and ahead by turns: counting each rise alone adds
      // its noise up, several times a step, to a lag of more than 100% of
      // the time; its lag over a run of calls is what it ends it behind.
      auto counted = [&](double l) { return l < std::max(floor, clocks) ? 0.0 : l - clocks; };
      const double added = counted(lag) - counted(before);
      rank.lag[s] += added;
      if (added > 0) rank.lagged[s] += 1;
      continue;
    }
    if (lag < std::max(floor, clocks)) continue;
    const double added = lag - std::max(clocks, before);
    if (added <= 0) continue;
    rank.lag[s] += added;
    rank.lagged[s] += 1;
  }
}

std::vector<Standing> WaitAttribution::standings() const {
  if (!started()) {
    // What the rows would say of nothing: nobody owed anything, within the allowance.
    std::vector<Standing> none(static_cast<size_t>(std::max(0, nranks_)));
    for (Standing& st : none) st.allowance = options_.allowance, st.under = true;
    return none;
  }
  std::vector<double> share = shares();
  std::vector<double> sorted = share;
  std::sort(sorted.begin(), sorted.end());
  const std::vector<double> lag_share = lag_shares();
  const uint64_t wall = window_wall();
  const size_t instances = window_instances();
  const double cap = kEvidenceCap * static_cast<double>(options_.evidence_ns);
  const double lag_cap = kEvidenceCap * options_.lag_evidence_sd;
  // The buckets being filled count in proportion to how full they are:
  // the mean of a bucket's first few instances varies more than a whole
  // bucket's, and counted as one would make a chance peak look like evidence.
  std::vector<double> centred, timed;
  lags_.centred(centred);
  timed_lags_.centred(timed);
  const double job_noise = lags_.noise(), timed_noise = timed_lags_.noise();
  const double fill = lags_.fill(), timed_fill = timed_lags_.fill();
  std::array<std::vector<double>, kCoarse.size()> coarse;
  std::array<double, kCoarse.size()> coarse_noise_now{}, coarse_fill{};
  for (size_t i = 0; i < kCoarse.size(); ++i) {
    coarse_lags_[i].centred(coarse[i]);
    coarse_noise_now[i] = coarse_noise(i);
    coarse_fill[i] = coarse_lags_[i].fill();
  }
  const double bucket_lag = current_ >= 0 ? lag_sum(slot(current_)) : 0;
  std::vector<Standing> out(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const Rank& rank = ranks_[r];
    Standing& st = out[r];
    st.share = share[r];
    st.typical = typical(share, sorted, static_cast<int32_t>(r));
    st.baseline = rank.learnt ? rank.baseline : 0;
    st.learnt = rank.learnt;
    st.allowance = options_.allowance + std::max(st.baseline, st.typical);
    st.owed_ns = std::accumulate(rank.owed.begin(), rank.owed.end(), uint64_t{0});
    st.held = std::accumulate(rank.held.begin(), rank.held.end(), uint32_t{0});
    // Per collective it held up, less its structure over the window.
    double late = std::accumulate(rank.late.begin(), rank.late.end(), 0.0);
    if (st.held > 0)
      st.lateness_ns =
          std::max(0.0, (late - (rank.learnt ? rank.late_baseline : 0) * static_cast<double>(wall)) /
                            static_cast<double>(st.held));
    st.instances = instances;
    st.window_ns = wall;
    st.gpu_ns = rank.gpu_ns;
    st.noise_ns = job_noise;
    // The bucket being filled counts as evidence provisionally.
    if (current_ >= 0 && rank.learnt) {
      size_t s = slot(current_);
      double x = static_cast<double>(rank.owed[s]) - st.allowance * static_cast<double>(wall_[s]);
      st.evidence_ns = std::clamp(rank.evidence_ns + x, 0.0, cap);
      st.slow_evidence_ns = std::clamp(rank.slow_evidence_ns + evidence_step(slow_step(rank, s, bucket_lag)), 0.0, cap);
      st.lag_evidence =
          std::clamp(rank.lag_evidence + fill * lag_step(centred[r], job_noise, rank.lag_persisting[0]), 0.0, lag_cap);
      // Over longer buckets, where the window's have not passed.
      for (size_t i = 0; i < kCoarse.size(); ++i) {
        const double longer =
            std::clamp(rank.coarse_evidence[i] +
                           coarse_fill[i] * lag_step(coarse[i][r], coarse_noise_now[i], rank.lag_persisting[i + 1]),
                       0.0, coarse_cap());
        if (st.lag_evidence < options_.lag_evidence_sd && longer > st.lag_evidence) {
          st.lag_evidence = longer;
          st.noise_ns = coarse_noise_now[i];
          st.chance_scale = static_cast<uint32_t>(kCoarse[i]);
        }
      }
      // The far-behind run, where the CUSUM has not passed: the bucket
      // being filled adds to it in part when it is far behind so far, and
      // ends it only once closed.
      const bool far_now = far_behind(timed[r], timed_noise);
      const double far = std::min(far_evidence(rank.far_run) + (far_now ? timed_fill * far_evidence(1) : 0), lag_cap);
      if (st.lag_evidence < options_.lag_evidence_sd && far > st.lag_evidence) {
        st.lag_evidence = far;
        st.noise_ns = timed_noise;
        st.chance_scale = 1;
        st.far_buckets = rank.far_run + (far_now ? 1 : 0);
      }
    }
    st.lag_share = lag_share[r];
    st.lag_baseline = rank.learnt ? rank.lag_baseline : 0;
    st.lagged = std::accumulate(rank.lagged.begin(), rank.lagged.end(), uint32_t{0});
    // Per instance it lagged at, less its structure over the window.
    if (st.lagged > 0)
      st.lag_ns = std::max(0.0, (std::accumulate(rank.lag.begin(), rank.lag.end(), 0.0) -
                                 std::max(0.0, st.lag_baseline) * static_cast<double>(wall)) /
                                    static_cast<double>(st.lagged));
    // Lagging beyond its structure by more than the allowance of the time.
    st.lags = st.learnt && st.lag_share > options_.allowance + std::max(0.0, st.lag_baseline);
    st.under = st.share <= st.allowance;
    const bool judged = st.learnt && instances >= options_.min_instances && st.lag_evidence >= options_.lag_evidence_sd;
    st.over = judged && st.evidence_ns >= static_cast<double>(options_.evidence_ns) && st.share > st.allowance &&
              st.share >= options_.outsized * st.typical;
    st.slow = judged && !st.over && st.lags && st.slow_evidence_ns >= static_cast<double>(options_.evidence_ns);
  }
  return out;
}

void WaitAttribution::set_open(int32_t rank, bool open) {
  if (rank < 0 || static_cast<size_t>(rank) >= ranks_.size()) return;
  ranks_[rank].open = open;
  if (!open && ranks_[rank].evidence_ns == 0) ranks_[rank].gpu_ns = 0;
}

}  // namespace rankscope::collector
