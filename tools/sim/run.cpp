#include "tools/sim/run.h"

#include <algorithm>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <zmq.hpp>

#include "common/clock.h"
#include "common/format.h"
#include "common/log.h"
#include "common/stats.h"
#include "tools/sim/agent.h"
#include "tools/sim/jsonl.h"

namespace rankscope::sim {

namespace {
constexpr int64_t kMs = 1'000'000;
constexpr int64_t kLookahead = 200 * kMs;  // steps are generated this far ahead of true time
constexpr size_t kClockSamplesPerNode = 16;

// "p50 p90 p99" of `ns`, in microseconds ("" if empty).
std::string percentiles_us(std::vector<int64_t> ns) {
  if (ns.empty()) return "";
  std::sort(ns.begin(), ns.end());
  std::string out;
  for (double q : {0.5, 0.9, 0.99}) {
    const int64_t v = ns[std::min(ns.size() - 1, static_cast<size_t>(q * static_cast<double>(ns.size())))];
    out += (out.empty() ? "" : " ") + std::to_string(v / 1000);
  }
  return out;
}

// The run's line: its configuration and every agent's counters summed.
void write_run(std::ostream& out, const Fleet& fleet, const RunOptions& options, uint64_t t0, int64_t end_rel,
               const std::vector<std::unique_ptr<SimAgent>>& agents) {
  const FleetConfig& c = fleet.config();
  AgentCounters total;
  for (const auto& a : agents) {
    const AgentCounters& k = a->counters();
    total.probe_in_ns.insert(total.probe_in_ns.end(), k.probe_in_ns.begin(), k.probe_in_ns.end());
    total.probe_out_ns.insert(total.probe_out_ns.end(), k.probe_out_ns.begin(), k.probe_out_ns.end());
    total.batches += k.batches;
    total.records += k.records;
    total.records_acked += k.records_acked;
    total.records_lost += k.records_lost;
    total.sends_lost += k.sends_lost;
    total.reordered += k.reordered;
    total.resent += k.resent;
    total.wire_bytes += k.wire_bytes;
  }
  out << JsonLine()
             .add("type", "run")
             .add("seed", c.seed)
             .add("scenario", c.scenario)
             .add("pattern", c.pattern.empty() ? std::string("mixed-parallel") : c.pattern)
             .add("prefix", c.prefix)
             .add("t0_ns", t0)
             .add("end_ns", t0 + static_cast<uint64_t>(end_rel))
             .add("duration_s", static_cast<double>(end_rel) / 1e9)
             .add("step_ms", c.step_ms)
             .add("nominal_step_s", options.nominal_step_s)
             .add("jobs", c.jobs)
             .add("nodes", static_cast<int64_t>(fleet.nodes().size()))
             .add("ranks", static_cast<int64_t>(fleet.total_ranks()))
             .add("gpus", c.gpus)
             .add("pp", c.pp)
             .add("probe_jitter_ms", c.probe_jitter_ms)
             .add("batches", total.batches)
             .add("records_sent", total.records)
             .add("records_acked", total.records_acked)
             .add("records_lost", total.records_lost)
             .add("sends_lost", total.sends_lost)
             .add("reordered", total.reordered)
             .add("resent", total.resent)
             .add("wire_bytes", total.wire_bytes)
             .add("probes_answered", static_cast<uint64_t>(total.probe_in_ns.size()))
             .add("probe_in_us_p50_p90_p99", percentiles_us(total.probe_in_ns))
             .add("probe_out_us_p50_p90_p99", percentiles_us(total.probe_out_ns))
             .str()
      << "\n";
}

// Each job, with its communicators and their members.
void write_jobs(std::ostream& out, const Fleet& fleet) {
  for (size_t j = 0; j < fleet.jobs().size(); ++j) {
    const JobDef& job = fleet.jobs()[j];
    int64_t faults = std::count_if(fleet.faults().begin(), fleet.faults().end(),
                                   [&](const FaultDef& f) { return f.job == static_cast<int>(j); });
    out << JsonLine()
               .add("type", "job")
               .add("job", job.name)
               .add("index", static_cast<int64_t>(j))
               .add("ranks", static_cast<int64_t>(job.ranks.size()))
               .add("nodes", static_cast<int64_t>(job.nodes.size()))
               .add("steps", fleet.steps()[j])
               .add("faults", faults)
               .str()
        << "\n";
    for (const auto& comm : job.comms) {
      std::vector<int64_t> members(comm.members.begin(), comm.members.end());
      std::vector<std::string> nodes;
      for (int r : comm.members) nodes.push_back(fleet.nodes()[job.ranks[r].node].name);
      out << JsonLine()
                 .add("type", "comm")
                 .add("job", job.name)
                 .add("comm", hex64(comm.hash))
                 .add("kind", comm.kind)
                 .add("members", members)
                 .add("nodes", nodes)
                 .str()
          << "\n";
    }
  }
}

// The nodes' clocks and the faults, with whether each started before the end.
void write_nodes_and_faults(std::ostream& out, const Fleet& fleet, uint64_t t0, int64_t end_rel) {
  for (const auto& node : fleet.nodes())
    out << JsonLine()
               .add("type", "node")
               .add("node", node.name)
               .add("job", fleet.jobs()[node.job].name)
               .add("boot_ns", node.boot_ns)
               .add("drift_ppm", node.drift * 1e6)
               .add("wall_skew_ns", node.wall_skew_ns)
               .str()
        << "\n";
  for (const auto& f : fleet.faults()) {
    std::vector<int64_t> ranks(f.ranks.begin(), f.ranks.end());
    std::vector<std::string> nodes;
    for (int n : f.nodes) nodes.push_back(fleet.nodes()[n].name);
    bool started = f.onset_ns < end_rel;
    out << JsonLine()
               .add("type", "fault")
               .add("id", f.id)
               .add("job", fleet.jobs()[f.job].name)
               .add("kind", fault_kind_name(f.kind))
               .add("expect", expected_finding(f.kind))
               .add("onset_ns", t0 + static_cast<uint64_t>(f.onset_ns))
               .add("end_ns", f.end_ns >= kNever ? uint64_t{0} : t0 + static_cast<uint64_t>(f.end_ns))
               .add("started", started)
               .add("ranks", ranks)
               .add("nodes", nodes)
               .add("factor", f.factor)
               .str()
        << "\n";
  }
}

// Each fault's true lateness per (comm, rank), and the issue times whose
// stored values check the clock correction.
void write_lateness_and_clock(std::ostream& out, const Fleet& fleet, uint64_t t0,
                              const std::vector<Fleet::ClockSample>& clock_samples) {
  for (const auto& [key, values] : fleet.lateness()) {
    auto own = fleet.own_lag().find(key);
    out << JsonLine()
               .add("type", "lateness")
               .add("fault", key.fault)
               .add("comm", hex64(key.comm))
               .add("rank", key.rank)
               .add("median_ns", median(values))
               .add("own_median_ns", own == fleet.own_lag().end() ? int64_t{0} : median(own->second))
               .add("samples", static_cast<int64_t>(values.size()))
               .str()
        << "\n";
  }
  for (const auto& s : clock_samples)
    out << JsonLine()
               .add("type", "clock_sample")
               .add("node", fleet.nodes()[s.node].name)
               .add("comm", hex64(s.comm))
               .add("comm_rank", s.comm_rank)
               .add("seq", s.seq)
               .add("true_ns", t0 + static_cast<uint64_t>(s.true_ns))
               .str()
        << "\n";
}

void write_truth(const std::string& path, const Fleet& fleet, const RunOptions& options, uint64_t t0, int64_t end_rel,
                 const std::vector<std::unique_ptr<SimAgent>>& agents,
                 const std::vector<Fleet::ClockSample>& clock_samples) {
  std::ofstream out(path);
  write_run(out, fleet, options, t0, end_rel, agents);
  write_jobs(out, fleet);
  write_nodes_and_faults(out, fleet, t0, end_rel);
  write_lateness_and_clock(out, fleet, t0, clock_samples);
}
}  // namespace

namespace {
// Reads the replies waiting on the agents' sockets (every live agent's, or
// only those of agents awaiting a clock probe's answer) within timeout_ms.
struct Poller {
  std::vector<zmq::pollitem_t> items;
  std::vector<SimAgent*> polled;
  void service(std::vector<std::unique_ptr<SimAgent>>& agents, bool probes_only, int timeout_ms,
               const std::function<int64_t()>& rel_now) {
    items.clear();
    polled.clear();
    for (auto& a : agents)
      if (probes_only ? a->awaiting_probe() : !a->dead()) {
        items.push_back({a->socket().handle(), 0, ZMQ_POLLIN, 0});
        polled.push_back(a.get());
      }
    if (items.empty()) return;
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(timeout_ms));
    int64_t now = rel_now();
    for (size_t i = 0; i < items.size(); ++i)
      if (items[i].revents & ZMQ_POLLIN) polled[i]->service(now);
  }
};

// The records of the last moments, and their acks (5 s at most).
void finish(std::vector<std::unique_ptr<SimAgent>>& agents, Poller& poller, const std::function<int64_t()>& rel_now,
            int64_t end_rel, int64_t duration) {
  for (auto& a : agents) a->flush_now(end_rel);
  int64_t deadline = end_rel + 5000 * kMs;
  for (;;) {
    size_t unacked = 0;
    for (auto& a : agents) unacked += a->dead() ? 0 : a->unacked();
    if (unacked == 0 || rel_now() > deadline) {
      if (unacked) RS_LOG(warn, "%zu batch(es) not acknowledged at the end", unacked);
      return;
    }
    poller.service(agents, false, 10, rel_now);
    int64_t now = rel_now();
    for (auto& a : agents)
      if (!a->dead()) {
        a->tick(std::min(now, duration - 1));
        a->resend_due(now);  // a batch lost at the very end is re-sent too
      }
  }
}
}  // namespace

int run_fleet(const FleetConfig& config, const RunOptions& options) {
  Fleet fleet(config);
  zmq::context_t context(1);
  // One socket per simulated node (ZeroMQ's default cap is 1023).
  context.set(zmq::ctxopt::max_sockets, static_cast<int>(fleet.nodes().size()) + 64);
  uint64_t t0 = SystemClock::read(CLOCK_REALTIME);
  ClockProber prober(t0, config.probe_jitter_ms, fleet.nodes().size());
  auto rel_now = [&] { return static_cast<int64_t>(SystemClock::read(CLOCK_REALTIME) - t0); };
  std::vector<std::unique_ptr<SimAgent>> agents;
  for (size_t n = 0; n < fleet.nodes().size(); ++n)
    agents.push_back(
        std::make_unique<SimAgent>(context, options.collector, fleet, static_cast<int>(n), t0, config.seed, &prober));
  RS_LOG(info, "%zu jobs, %zu nodes, %zu ranks against %s for %.0f s (scenario %s, seed %llu)", fleet.jobs().size(),
         fleet.nodes().size(), fleet.total_ranks(), options.collector.c_str(), options.duration_s,
         config.scenario.c_str(), static_cast<unsigned long long>(config.seed));

  std::vector<std::vector<SimEvent>> out;
  // Clock samples are kept from the last third of the run (after convergence), the newest few per node.
  std::map<int, std::deque<Fleet::ClockSample>> samples;
  int64_t duration = static_cast<int64_t>(options.duration_s * 1e9);
  int64_t rel = 0;
  Poller poller;
  auto service_all = [&](int timeout_ms) { poller.service(agents, false, timeout_ms, rel_now); };
  // Probe replies are read as they come, between chunks of 8 of the
  // fleet's ticks: a reply left waiting for a longer chunk reads as a long
  // way back (at 1,024 nodes, chunks of 64 left the collector's uncertainty
  // about each node's clock at a median of 4.3 ms, against 2.8 ms).
  auto service_probes = [&] { poller.service(agents, true, 0, rel_now); };
  while ((rel = rel_now()) < duration) {
    fleet.advance(rel + kLookahead, out);
    for (size_t n = 0; n < out.size(); ++n)
      if (!out[n].empty()) agents[n]->add_events(out[n]);
    for (auto& s : fleet.take_clock_samples()) {
      if (s.true_ns < duration * 2 / 3 || s.true_ns >= duration) continue;
      auto& ring = samples[s.node];
      ring.push_back(s);
      while (ring.size() > kClockSamplesPerNode) ring.pop_front();
    }
    rel = rel_now();
    for (size_t n = 0; n < agents.size(); ++n) {
      agents[n]->tick(rel);
      if (n % 8 == 7) service_probes();
    }
    service_all(2);
  }
  int64_t end_rel = rel_now();
  finish(agents, poller, rel_now, end_rel, duration);
  std::vector<Fleet::ClockSample> kept;
  for (auto& [node, ring] : samples) kept.insert(kept.end(), ring.begin(), ring.end());
  uint64_t records = 0, bytes = 0;
  for (const auto& a : agents) records += a->counters().records, bytes += a->counters().wire_bytes;
  if (!options.truth.empty()) write_truth(options.truth, fleet, options, t0, end_rel, agents, kept);
  uint64_t steps = 0;
  for (uint64_t s : fleet.steps()) steps += s;
  RS_LOG(info, "done: %llu steps, %llu records sent (%.1f wire bytes/record), %zu faults; truth in %s",
         static_cast<unsigned long long>(steps), static_cast<unsigned long long>(records),
         records ? static_cast<double>(bytes) / static_cast<double>(records) : 0.0, fleet.faults().size(),
         options.truth.empty() ? "(not written)" : options.truth.c_str());
  return 0;
}

}  // namespace rankscope::sim
