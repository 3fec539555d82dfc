// rankscope-bench-chance-steps: the straggler detector's waiting attribution
// (collector/detect/attribution.h) on a simulated data-parallel job at real
// step times, in process: how many false findings a healthy job raises over
// many hours, and how many steps a slowed rank takes to be found. Each run
// twice in the same process, with the chance test's clip under test and a
// baseline clip (AttributionOptions::lag_clip_sd), on the same draws.
//
// The job is rankscope-sim's jitter pattern (tools/sim/model.cpp): each
// step, from its release each rank computes 10% + 45% of the step
// (log-normal, sigma), then AllReduce 1 (its host synchronised: judged on
// its time from the release), 45% more, then AllReduce 2 (its host ran
// ahead: judged on its arrival); each transfer 15% of the step; the next
// release up to 20 us apart.
// --tail: the statistic's own distribution over the healthy runs, as the
// detector measures it (AttributionOptions::on_bucket): how often a
// bucket's standardised lag reaches 3 and 5 sd, its spread, its
// correlation from one bucket to the next, and the far-behind runs.
// docs/benchmarks.md, "The chance test's clip".
#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "collector/detect/attribution.h"

namespace po = boost::program_options;
using rankscope::collector::AttributionOptions;
using rankscope::collector::Standing;
using rankscope::collector::WaitAttribution;

namespace {

// The standardised lag (centred lag / noise) of every rank and closed bucket
// of one kind (the window's, or the far-behind run's timed ones).
struct Tail {
  long buckets = 0;           // rank-buckets counted (the job's noise known, past the first window)
  // A far-behind bucket's standardised lag, as WaitAttribution::far_behind reads it.
  static inline const double kFar = AttributionOptions{}.lag_evidence_sd / 4;
  long over3 = 0, over5 = 0;  // at 3 and kFar sd or more
  double sum = 0, squares = 0;
  // Pairs of a rank's value in one bucket and the next (lag-1 correlation).
  double px = 0, py = 0, pxx = 0, pyy = 0, pxy = 0;
  long pairs = 0;
  std::map<long, long> runs;  // far-behind runs (kFar sd or more in a row) by length
  std::vector<double> last;   // by rank: its value in the last bucket (NaN: none)
  std::vector<long> run;      // by rank: its run of far-behind buckets so far
  long seen = 0;              // buckets closed so far

  void add(std::span<const double> centred, double noise) {
    constexpr long kSkip = 20;  // the first buckets: the noise is measured on few changes
    if (last.empty()) last.assign(centred.size(), std::nan("")), run.assign(centred.size(), 0);
    if (++seen <= kSkip || noise <= 0) return;
    for (size_t r = 0; r < centred.size(); ++r) {
      const double z = centred[r] / noise;
      buckets += 1;
      over3 += z >= 3;
      over5 += z >= kFar;
      sum += z;
      squares += z * z;
      if (!std::isnan(last[r])) {
        px += last[r], py += z, pxx += last[r] * last[r], pyy += z * z, pxy += last[r] * z;
        pairs += 1;
      }
      last[r] = z;
      if (z >= kFar) {
        run[r] += 1;
      } else if (run[r] > 0) {
        runs[run[r]] += 1;
        run[r] = 0;
      }
    }
  }
  void finish() {
    for (long& r : run)
      if (r > 0) runs[r] += 1, r = 0;
  }
  void merge(const Tail& o) {
    buckets += o.buckets, over3 += o.over3, over5 += o.over5, sum += o.sum, squares += o.squares;
    px += o.px, py += o.py, pxx += o.pxx, pyy += o.pyy, pxy += o.pxy, pairs += o.pairs;
    for (const auto& [length, n] : o.runs) runs[length] += n;
  }
  void print(const char* kind) const {
    auto one_in = [&](long n) { return n > 0 ? "1 in " + std::to_string(buckets / n) : std::string("none"); };
    const double mean = buckets > 0 ? sum / static_cast<double>(buckets) : 0;
    const double sd = buckets > 1 ? std::sqrt(squares / static_cast<double>(buckets) - mean * mean) : 0;
    const double n = static_cast<double>(pairs);
    const double cov = pairs > 1 ? pxy / n - (px / n) * (py / n) : 0;
    const double vx = pairs > 1 ? pxx / n - (px / n) * (px / n) : 0, vy = pairs > 1 ? pyy / n - (py / n) * (py / n) : 0;
    const double lag1 = vx > 0 && vy > 0 ? cov / std::sqrt(vx * vy) : 0;
    std::string lengths;
    for (const auto& [length, count] : runs)
      if (length >= 2) lengths += (lengths.empty() ? "" : ", ") + std::to_string(length) + ": " + std::to_string(count);
    std::printf("| %s | %ld | %s | %s | %.2f | %.3f | %s |\n", kind, buckets, one_in(over3).c_str(),
                one_in(over5).c_str(), sd, lag1, lengths.empty() ? "none" : lengths.c_str());
  }
};

struct Run {
  long false_findings = 0;  // a rank other than the slowed one found (each opening counted once)
  double highest = 0;       // the highest chance evidence of a rank not slowed
  long found_after = -1;    // steps after the slowdown began (-1: never, or none)
  Tail window, timed;       // with `tail`: the statistic's distribution
};

// `hours` of 1 s steps of `ranks` ranks; from `slow_from` on, rank 0 computes
// `factor` times as long.
Run run(int ranks, double hours, uint32_t seed, double sigma, double clip, double factor, long slow_from,
        bool tail = false) {
  constexpr double kStepNs = 1e9;
  Run out;
  AttributionOptions options;
  options.lag_clip_sd = clip;
  if (tail)
    options.on_bucket = [&out](bool timed, std::span<const double> centred, double noise) {
      (timed ? out.timed : out.window).add(centred, noise);
    };
  WaitAttribution waits(ranks, options);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> lognormal(-sigma * sigma / 2, sigma);
  std::uniform_real_distribution<double> spread(0, 20e3);
  const auto n = static_cast<size_t>(ranks);
  std::vector<double> release(n, 1e15), first(n), second(n);
  std::vector<int64_t> value(n);
  std::vector<uint64_t> arrival(n);
  const std::vector<uint64_t> margin(n, 0);
  std::vector<bool> was(n, false);
  const long steps = static_cast<long>(hours * 3600);
  for (long s = 0; s < steps; ++s) {
    const bool slowed = factor > 1 && s >= slow_from;
    auto compute = [&](double part, size_t r) {
      return kStepNs * part * std::exp(lognormal(rng)) * (slowed && r == 0 ? factor : 1.0);
    };
    for (size_t r = 0; r < n; ++r) {
      first[r] = release[r] + compute(0.1, r) + compute(0.45, r);
      value[r] = static_cast<int64_t>(first[r] - release[r]);
      arrival[r] = static_cast<uint64_t>(first[r]);
    }
    const double last = *std::max_element(first.begin(), first.end());
    waits.add(value, arrival, margin, static_cast<uint64_t>(last), false);
    for (size_t r = 0; r < n; ++r) {
      second[r] = first[r] + 15e3 + compute(0.45, r);
      value[r] = static_cast<int64_t>(second[r]);
      arrival[r] = static_cast<uint64_t>(second[r]);
    }
    const double last2 = *std::max_element(second.begin(), second.end());
    waits.add(value, arrival, margin, static_cast<uint64_t>(last2), true);
    const double done = std::max(last + 0.15 * kStepNs, last2) + 0.15 * kStepNs;
    for (size_t r = 0; r < n; ++r) release[r] = done + spread(rng);
    const std::vector<Standing> standings = waits.standings();
    for (size_t r = 0; r < n; ++r) {
      const bool found = standings[r].slow || standings[r].over;
      if (r == 0 && factor > 1) {
        if (slowed && found && out.found_after < 0) out.found_after = s - slow_from;
        if (slowed) continue;
      }
      if (found && !was[r]) out.false_findings += 1;
      was[r] = found;
      out.highest = std::max(out.highest, standings[r].lag_evidence);
    }
  }
  out.window.finish();
  out.timed.finish();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 64;
  double hours = 20;
  uint32_t seeds = 5;
  double sigma = 0.25;
  double clip = AttributionOptions{}.lag_clip_sd;
  double baseline = 5;
  std::vector<double> factors;
  bool tail = false;
  po::options_description opts("rankscope-bench-chance-steps: false findings and time to find, at real steps");
  opts.add_options()("help", "this text")("ranks", po::value(&ranks)->default_value(ranks), "ranks in the job")(
      "hours", po::value(&hours)->default_value(hours), "job-hours of 1 s steps per seed (healthy runs)")(
      "seeds", po::value(&seeds)->default_value(seeds), "seeds 1..N")("sigma", po::value(&sigma)->default_value(sigma),
                                                                      "log-normal sigma of compute times")(
      "clip", po::value(&clip)->default_value(clip), "the chance test's clip under test, in sd")(
      "baseline-clip", po::value(&baseline)->default_value(baseline), "the clip it is measured against")(
      "factor", po::value(&factors)->multitoken(),
      "instead of healthy runs: rank 0 slowed by each factor after 1 hour (steps to find it, up to 1 hour)")(
      "tail", po::bool_switch(&tail),
      "healthy runs: also the standardised lag's distribution (the clip under test's runs; the clip does not change "
      "it)");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "rankscope-bench-chance-steps: " << e.what() << "\n" << opts;
    return 2;
  }
  if (vm.count("help")) {
    std::cout << opts;
    return 0;
  }
  if (ranks < 2 || hours <= 0 || seeds == 0 || sigma <= 0 || clip <= 0 || baseline <= 0) {
    std::cerr << "rankscope-bench-chance-steps: need --ranks >= 2, --hours > 0, --seeds >= 1, --sigma > 0 and "
                 "clips > 0\n";
    return 2;
  }
  std::printf("%d ranks, sigma %.2f, 1 s steps; clip %.2g sd against %.2g sd\n", ranks, sigma, clip, baseline);
  if (factors.empty()) {
    std::printf(
        "| seed | job-hours | false findings (clip %.2g) | highest evidence | false findings (clip %.2g) | "
        "highest evidence |\n| --- | --- | --- | --- | --- | --- |\n",
        clip, baseline);
    long total[2] = {0, 0};
    Tail window, timed;
    for (uint32_t seed = 1; seed <= seeds; ++seed) {
      const Run a = run(ranks, hours, seed, sigma, clip, 1, 0, tail);
      window.merge(a.window);
      timed.merge(a.timed);
      const Run b = run(ranks, hours, seed, sigma, baseline, 1, 0);
      total[0] += a.false_findings;
      total[1] += b.false_findings;
      std::printf("| %u | %.1f | %ld | %.1f | %ld | %.1f |\n", seed, hours, a.false_findings, a.highest,
                  b.false_findings, b.highest);
    }
    std::printf("in all, %.1f job-hours: %ld false findings at clip %.2g, %ld at %.2g\n", hours * seeds, total[0], clip,
                total[1], baseline);
    if (tail) {
      std::printf(
          "\nThe standardised lag (centred lag / the job's noise), every rank and closed bucket past each run's "
          "first 20:\n\n| buckets | rank-buckets | 3 sd or more | %.3g sd or more | sd | lag-1 correlation | "
          "far-behind "
          "runs (%.3g sd or more in a row) of 2 or more, by length |\n| --- | --- | --- | --- | --- | --- | --- |\n",
          Tail::kFar, Tail::kFar);
      window.print("the window's (the CUSUM's)");
      timed.print("of 1 s or more (the far-behind run's)");
    }
    return 0;
  }
  std::printf("| factor | seed | steps to find (clip %.2g) | steps to find (clip %.2g) |\n| --- | --- | --- | --- |\n",
              clip, baseline);
  for (double factor : factors)
    for (uint32_t seed = 1; seed <= seeds; ++seed) {
      const Run a = run(ranks, 2, seed, sigma, clip, factor, 3600);
      const Run b = run(ranks, 2, seed, sigma, baseline, factor, 3600);
      auto steps = [](long s) { return s < 0 ? std::string("not in 1 h") : std::to_string(s); };
      std::printf("| %.2f | %u | %s | %s |\n", factor, seed, steps(a.found_after).c_str(),
                  steps(b.found_after).c_str());
    }
  return 0;
}
