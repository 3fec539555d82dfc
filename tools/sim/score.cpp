#include "tools/sim/score.h"

#include <capnp/message.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "common/format.h"
#include "tools/cli/client.h"
#include "tools/sim/jsonl.h"

namespace rankscope::sim {

namespace query = proto::query;

namespace {

struct TruthComm {
  std::string job, kind;
  std::vector<int> members;
  std::vector<std::string> nodes;
};

struct TruthFault {
  int id = 0;
  std::string job, kind, expect;
  uint64_t onset = 0, end = 0;
  bool started = false;
  std::set<int> ranks;
  std::set<std::string> nodes;
  double factor = 1;
};

struct SeenFinding {
  uint64_t id = 0;
  std::string kind, job, comm;
  std::vector<int> ranks;            // global ranks (comm ranks mapped through the truth)
  std::vector<std::string> nodes;
  uint64_t opened = 0, resolved = 0;
  double lateness_s = 0;
  std::string summary;
};

bool is_hang_like(const std::string& kind) {
  return kind == "hang_stop" || kind == "hang_kill" || kind == "mismatch";
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  double pos = p * static_cast<double>(v.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos)), hi = static_cast<size_t>(std::ceil(pos));
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}
// What rankscope-sim run wrote: the run, its jobs, communicators, faults,
// their true lateness and the clock samples to check.
struct Truth {
  JsonObject run;
  std::map<std::string, TruthComm> comms;
  std::vector<TruthFault> faults;
  std::map<std::string, JsonObject> jobs;
  std::map<std::tuple<int, std::string, int>, int64_t> lateness;  // (fault, comm, rank)
  std::map<std::tuple<int, std::string, int>, int64_t> own_lag;   // the same, its own time's lag
  std::vector<JsonObject> clock_samples;
  uint64_t t0 = 0, end = 0;
  std::string run_id;
};

Result<Truth> read_truth(const std::string& path) {
  auto lines = read_json_lines(path);
  if (!lines) return lines.error();
  Truth t;
  JsonObject& run = t.run;
  auto& comms = t.comms;
  auto& faults = t.faults;
  auto& jobs = t.jobs;
  auto& true_lateness = t.lateness;
  auto& clock_samples = t.clock_samples;
  for (auto& line : *lines) {
    std::string type = line.str("type");
    if (type == "run") run = line;
    else if (type == "job") jobs[line.str("job")] = line;
    else if (type == "comm") {
      TruthComm c;
      c.job = line.str("job");
      c.kind = line.str("kind");
      for (double m : line.nums("members")) c.members.push_back(static_cast<int>(m));
      c.nodes = line.strs("nodes");
      comms[line.str("comm")] = std::move(c);
    } else if (type == "fault") {
      TruthFault f;
      f.id = static_cast<int>(line.i64("id"));
      f.job = line.str("job");
      f.kind = line.str("kind");
      f.expect = line.str("expect");
      f.onset = static_cast<uint64_t>(line.i64("onset_ns"));
      f.end = static_cast<uint64_t>(line.i64("end_ns"));
      f.started = line.flag("started");
      for (double r : line.nums("ranks")) f.ranks.insert(static_cast<int>(r));
      for (const auto& n : line.strs("nodes")) f.nodes.insert(n);
      f.factor = line.num("factor", 1);
      faults.push_back(std::move(f));
    } else if (type == "lateness") {
      const std::tuple<int, std::string, int> key{static_cast<int>(line.i64("fault")), line.str("comm"),
                                                  static_cast<int>(line.i64("rank"))};
      true_lateness[key] = line.i64("median_ns");
      if (line.has_number("own_median_ns")) t.own_lag[key] = line.i64("own_median_ns");
    } else if (type == "clock_sample") {
      clock_samples.push_back(line);
    }
  }
  t.t0 = static_cast<uint64_t>(run.i64("t0_ns"));
  t.end = static_cast<uint64_t>(run.i64("end_ns"));
  t.run_id = run.str("scenario") + "/" + std::to_string(run.i64("seed"));
  return t;
}

query::Request::Builder new_request(capnp::MallocMessageBuilder& message) {
  auto req = message.initRoot<query::Request>();
  req.setProtocolVersion(query::QUERY_PROTOCOL_VERSION);
  return req;
}

// Every finding the collector still holds that opened during the run, in
// opening order, its ranks mapped to the job's global ranks.
Result<std::vector<SeenFinding>> seen_findings(cli::QueryClient& client, const Truth& truth) {
  const auto& comms = truth.comms;
  uint64_t t0 = truth.t0, run_end = truth.end;
  std::vector<SeenFinding> seen;
  capnp::MallocMessageBuilder request;
  new_request(request).initFindings().setLimit(100000);
  auto asked = client.ask(request, [&](query::Reply::Reader reply) {
    for (auto f : reply.getFindings().getFindings()) {
      SeenFinding s;
      s.id = f.getId();
      s.kind = f.getKind();
      s.job = f.getJob();
      s.comm = f.getComm() ? hex64(f.getComm()) : "";
      s.opened = f.getOpenedNs();
      s.resolved = f.getResolvedNs();
      s.lateness_s = f.getLatenessS();
      s.summary = f.getSummary();
      for (auto n : f.getNodes()) s.nodes.push_back(n);
      auto comm = comms.find(s.comm);
      for (int32_t r : f.getRanks()) {
        if (comm != comms.end() && r >= 0 && static_cast<size_t>(r) < comm->second.members.size())
          s.ranks.push_back(comm->second.members[r]);
        else if (s.kind == "node_lost")
          s.ranks.push_back(-1);  // node_lost names comm ranks of several comms: use its nodes
      }
      if (s.opened >= t0 && s.opened <= run_end) seen.push_back(std::move(s));
    }
  });
  if (!asked) return make_error(asked.error().code, "findings: " + asked.error().message);
  std::sort(seen.begin(), seen.end(), [](const SeenFinding& a, const SeenFinding& b) { return a.opened < b.opened; });
  return seen;
}

// What the collector says of delivery and of each node's clock.
struct CollectorStatus {
  uint64_t records_stored = 0, duplicates = 0, bad = 0, batch_bytes = 0, ringbuf_reported = 0;
  std::map<std::string, std::pair<int64_t, uint64_t>> offsets;  // node -> (offset, uncertainty)
  std::map<std::string, int64_t> refinements;                 // node -> correction from the collectives
};

Result<CollectorStatus> collector_status(cli::QueryClient& client) {
  CollectorStatus st;
  capnp::MallocMessageBuilder request;
  new_request(request).setStatus();
  auto asked = client.ask(request, [&](query::Reply::Reader reply) {
    auto s = reply.getStatus();
    st.records_stored = s.getRecordsStored();
    st.duplicates = s.getDuplicateBatches();
    st.bad = s.getBadMessages();
    st.batch_bytes = s.getBatchBytes();
    for (auto n : s.getNodes()) {
      st.offsets[n.getNode()] = {n.getClockOffsetNs(), n.getClockUncertaintyNs()};
      st.refinements[n.getNode()] = n.getClockRefinementNs();
      st.ringbuf_reported += n.getDrops().getRingbufFull();
    }
  });
  if (!asked) return make_error(asked.error().code, "status: " + asked.error().message);
  return st;
}

// A finding that names the fault: same job, the expected kind, after the
// onset, and one of its ranks (or, for node_lost, nodes).
bool matches(const SeenFinding& s, const TruthFault& f) {
  if (s.job != f.job || s.kind != f.expect || s.opened < f.onset) return false;
  if (f.expect == "node_lost") {
    for (const auto& n : s.nodes)
      if (f.nodes.count(n)) return true;
    return false;
  }
  for (int r : s.ranks)
    if (f.ranks.count(r)) return true;
  return false;
}

// One incident line per fault that started: found, how fast, the right
// rank and node, the cost's error; `true_positive` gets the findings that named one.
void score_faults(const Truth& truth, const std::vector<SeenFinding>& seen, std::set<uint64_t>& true_positive,
                  std::vector<std::string>& out) {
  for (const auto& f : truth.faults) {
    if (!f.started) continue;
    const SeenFinding* first_match = nullptr;
    const SeenFinding* first_of_kind = nullptr;
    std::vector<double> cost_errors;
    for (const auto& s : seen) {
      // The first finding of the kind after the onset; of several opened by
      // the same evaluation, the most specific (fewest ranks named), then the
      // latest rank (how an operator reads `rankscope hangs`, `stragglers`).
      // Findings that name another fault's culprit (several culprits in one
      // job) are that fault's, not this one's first.
      bool others = false;
      for (const auto& g : truth.faults)
        if (g.id != f.id && g.started && matches(s, g) && !matches(s, f)) others = true;
      if (s.job == f.job && s.kind == f.expect && s.opened >= f.onset && !others &&
          (!first_of_kind ||
           (s.opened == first_of_kind->opened &&
            (s.ranks.size() < first_of_kind->ranks.size() ||
             (s.ranks.size() == first_of_kind->ranks.size() && s.lateness_s > first_of_kind->lateness_s)))))
        first_of_kind = &s;
      if (!matches(s, f)) continue;
      true_positive.insert(s.id);
      if (!first_match) first_match = &s;
      if (s.kind == "straggler" && !s.ranks.empty()) {
        // A slow rank's finding states its lag at each collective (its own
        // time against the median rank's), a costly straggler's how late it
        // arrived when it held the others up: each against its own truth.
        const bool slow = s.summary.find(" is slow: ") != std::string::npos;
        const auto& of_kind = slow ? truth.own_lag : truth.lateness;
        auto t = of_kind.find({f.id, s.comm, s.ranks[0]});
        if (t != of_kind.end() && t->second > 0)
          cost_errors.push_back((s.lateness_s * 1e9 - static_cast<double>(t->second)) / static_cast<double>(t->second));
      }
    }
    JsonLine line;
    line.add("type", "incident")
        .add("run", truth.run_id)
        .add("kind", f.kind)
        .add("expect", f.expect)
        .add("factor", f.factor);
    line.add("ranks", static_cast<int64_t>(truth.run.i64("ranks"))).add("detected", first_match != nullptr);
    if (first_match) line.add("latency_s", static_cast<double>(first_match->opened - f.onset) / 1e9);
    else line.null("latency_s");
    bool rank_ok = first_of_kind && !first_of_kind->ranks.empty() && f.ranks.count(first_of_kind->ranks[0]);
    bool node_ok = first_of_kind && !first_of_kind->nodes.empty() && f.nodes.count(first_of_kind->nodes[0]);
    if (f.expect == "node_lost") rank_ok = node_ok;
    line.add("rank_ok", rank_ok).add("node_ok", node_ok);
    if (!cost_errors.empty()) line.add("cost_rel_err", percentile(cost_errors, 0.5));
    else line.null("cost_rel_err");
    out.push_back(line.str());
  }
}

// Every other finding: collateral of a stopped job, or a false alarm. A
// finding on a job this truth does not hold is another simulator's (one
// beside this run, on the same collector: bench-sim.sh --rate's witness),
// scored against that simulator's truth, not this one's; a finding on no
// job at all is still this run's to account for.
void score_others(const Truth& truth, const std::vector<SeenFinding>& seen, const std::set<uint64_t>& true_positive,
                  std::vector<std::string>& out) {
  for (const auto& s : seen) {
    if (true_positive.count(s.id)) continue;
    if (!s.job.empty() && s.job != "(unknown)" && !truth.jobs.count(s.job)) continue;
    bool collateral = false, node_ok = false;
    for (const auto& f : truth.faults) {
      if (f.job != s.job || !f.started || s.opened < f.onset) continue;
      if (is_hang_like(f.kind)) collateral = true;  // the job stopped: every comm of it hangs
      for (const auto& n : s.nodes) node_ok |= f.nodes.count(n) > 0;
    }
    auto job = truth.jobs.find(s.job);
    bool healthy_job = job != truth.jobs.end() && job->second.i64("faults") == 0;
    out.push_back(JsonLine()
                      .add("type", collateral ? "collateral" : "false_alarm")
                      .add("run", truth.run_id)
                      .add("finding", s.kind)
                      .add("healthy_job", healthy_job)
                      .add("node_ok", node_ok)
                      .add("summary", s.summary)
                      .str());
  }
}

// Simulated job time of the jobs without faults.
std::string exposure_line(const Truth& truth) {
  double nominal = truth.run.num("nominal_step_s", 1);
  int64_t healthy_steps = 0, healthy_jobs = 0;
  for (const auto& [name, job] : truth.jobs)
    if (job.i64("faults") == 0) healthy_steps += job.i64("steps"), ++healthy_jobs;
  return JsonLine()
      .add("type", "exposure")
      .add("run", truth.run_id)
      .add("healthy_jobs", healthy_jobs)
      .add("healthy_steps", healthy_steps)
      .add("nominal_step_s", nominal)
      .add("job_days", static_cast<double>(healthy_steps) * nominal / 86400.0)
      .add("wall_s", truth.run.num("duration_s"))
      .str();
}

// Stored (corrected) issue times against the true ones, per node; returns
// the absolute median errors.
std::vector<double> score_clocks(cli::QueryClient& client, const Truth& truth, const CollectorStatus& st,
                                 std::vector<std::string>& out) {
  std::map<std::pair<std::string, int>, std::map<uint64_t, uint64_t>> wanted;  // (comm, rank) -> seq -> true
  std::map<std::pair<std::string, int>, std::string> node_of;
  for (const auto& c : truth.clock_samples) {
    wanted[{c.str("comm"), static_cast<int>(c.i64("comm_rank"))}][static_cast<uint64_t>(c.i64("seq"))] =
        static_cast<uint64_t>(c.i64("true_ns"));
    node_of[{c.str("comm"), static_cast<int>(c.i64("comm_rank"))}] = c.str("node");
  }
  // Per node: the median error of each of its sampled (comm, rank) pairs
  // (a pipeline's node has several), scored as one node.
  struct NodeErrors {
    std::vector<double> medians;
    int64_t samples = 0;
  };
  std::map<std::string, NodeErrors> by_node;
  for (const auto& [key, seqs] : wanted) {
    capnp::MallocMessageBuilder request;
    auto req = request.initRoot<query::Request>();
    req.setProtocolVersion(query::QUERY_PROTOCOL_VERSION);
    auto t = req.initTimeline();
    t.setComm(key.first);
    t.setRank(key.second);
    // The newest samples kept span up to 1,024 seqs (every 64th instance of
    // a busy communicator without tp).
    t.setLast(2048);
    std::vector<double> errors;
    auto asked = client.ask(request, [&](query::Reply::Reader reply) {
      for (auto r : reply.getTimeline().getRecords()) {
        if (r.getLane() != 0) continue;
        auto it = seqs.find(r.getSeq());
        if (it == seqs.end()) continue;
        errors.push_back(static_cast<double>(static_cast<int64_t>(r.getIssueNs() - it->second)));
      }
    });
    if (!asked || errors.empty()) continue;
    NodeErrors& node = by_node[node_of[key]];
    node.medians.push_back(percentile(errors, 0.5));
    node.samples += static_cast<int64_t>(errors.size());
  }
  std::vector<double> clock_errors;
  for (auto& [node, e] : by_node) {
    const double med = percentile(e.medians, 0.5);
    clock_errors.push_back(std::fabs(med));
    auto offset = st.offsets.find(node);
    auto refined = st.refinements.find(node);
    uint64_t uncertainty = offset == st.offsets.end() ? 0 : offset->second.second;
    int64_t refinement = refined == st.refinements.end() ? 0 : refined->second;
    out.push_back(JsonLine()
                      .add("type", "clock")
                      .add("run", truth.run_id)
                      .add("node", node)
                      .add("error_ns", med)
                      .add("uncertainty_ns", static_cast<int64_t>(uncertainty))
                      .add("refinement_ns", refinement)
                      .add("samples", e.samples)
                      .add("probe_jitter_ms", truth.run.num("probe_jitter_ms"))
                      .str());
  }
  return clock_errors;
}

std::string delivery_line(const Truth& truth, const CollectorStatus& st) {
  return JsonLine()
      .add("type", "delivery")
      .add("run", truth.run_id)
      .add("records_sent", truth.run.i64("records_sent"))
      .add("records_acked", truth.run.i64("records_acked"))
      .add("records_stored", st.records_stored)
      .add("records_lost", truth.run.i64("records_lost"))
      .add("records_lost_reported", st.ringbuf_reported)
      .add("sends_lost", truth.run.i64("sends_lost"))
      .add("reordered", truth.run.i64("reordered"))
      .add("duplicate_batches", st.duplicates)
      .add("bad_messages", st.bad)
      .add("batch_bytes", st.batch_bytes)
      .str();
}

// One line of totals, then the scored lines unless they went to a file.
void print_score(const Truth& truth, const std::vector<SeenFinding>& seen, const CollectorStatus& st,
                 const std::vector<double>& clock_errors, const std::vector<std::string>& out, bool print_lines) {
  int detected = 0, incidents = 0, fa = 0;
  for (const auto& l : out) {
    auto o = parse_json_object(l);
    if (!o) continue;
    if (o->str("type") == "incident") ++incidents, detected += o->flag("detected") ? 1 : 0;
    if (o->str("type") == "false_alarm") ++fa;
  }
  std::printf(
      "%s: %d/%d incidents found, %d false alarm(s), %zu finding(s) in all; records %llu sent, %llu stored; "
      "clock error median %.1f us, max %.1f us over %zu nodes\n",
      truth.run_id.c_str(), detected, incidents, fa, seen.size(),
      static_cast<unsigned long long>(truth.run.i64("records_sent")),
      static_cast<unsigned long long>(st.records_stored), percentile(clock_errors, 0.5) / 1e3,
      clock_errors.empty() ? NAN : *std::max_element(clock_errors.begin(), clock_errors.end()) / 1e3,
      clock_errors.size());
  if (print_lines)
    for (const auto& l : out) std::printf("%s\n", l.c_str());
}

}  // namespace

int score_run(const ScoreOptions& options) {
  auto truth = read_truth(options.truth);
  if (!truth) {
    std::cerr << "rankscope-sim score: " << truth.error().message << "\n";
    return 2;
  }
  cli::QueryClient client(options.query, 10000);
  auto seen = seen_findings(client, *truth);
  auto st = seen ? collector_status(client) : Result<CollectorStatus>(seen.error());
  if (!st) {
    std::cerr << "rankscope-sim score: " << st.error().message << "\n";
    return 2;
  }
  std::vector<std::string> out;
  std::set<uint64_t> true_positive;
  score_faults(*truth, *seen, true_positive, out);
  score_others(*truth, *seen, true_positive, out);
  out.push_back(exposure_line(*truth));
  std::vector<double> clock_errors = score_clocks(client, *truth, *st, out);
  out.push_back(delivery_line(*truth, *st));
  if (!options.out.empty()) {
    std::ofstream file(options.out, std::ios::app);
    for (const auto& l : out) file << l << "\n";
  }
  if (!options.quiet) print_score(*truth, *seen, *st, clock_errors, out, options.out.empty());
  return 0;
}

// A slowdown's size class; other faults by their kind.
std::string bucket(const std::string& kind, double factor) {
  if (kind.rfind("slowdown", 0) != 0) return kind;
  const char* b = factor < 1.05 ? "1.02-1.05x" : factor < 1.1 ? "1.05-1.1x" : factor < 1.5 ? "1.1-1.5x" : "1.5-5x";
  return kind + " " + b;
}

// What the scored lines of every run add up to.
struct Tally {
  struct Group {
    int incidents = 0, detected = 0, rank_ok = 0, node_ok = 0;
    std::vector<double> latency, cost;
  };
  std::map<std::string, Group> groups;  // by fault kind (slowdowns by size)
  std::map<std::string, int> tp_findings, fa_findings, fa_node_ok, collateral;
  int fa_healthy = 0;
  double job_days = 0, wall_s = 0;
  std::vector<double> clock_errors;
  std::set<double> jitters;
  int64_t sent = 0, stored = 0, lost = 0, sends_lost = 0, reordered = 0, dups = 0;

  void add(const JsonObject& o) {
    std::string type = o.str("type");
    if (type == "incident") {
      Group& g = groups[bucket(o.str("kind"), o.num("factor", 1))];
      ++g.incidents;
      if (o.flag("detected")) {
        ++g.detected;
        g.latency.push_back(o.num("latency_s"));
        ++tp_findings[o.str("expect")];
      }
      g.rank_ok += o.flag("rank_ok");
      g.node_ok += o.flag("node_ok");
      if (o.has_number("cost_rel_err"))
        g.cost.push_back(std::fabs(o.num("cost_rel_err")));
    } else if (type == "false_alarm") {
      ++fa_findings[o.str("finding")];
      fa_node_ok[o.str("finding")] += o.flag("node_ok");
      fa_healthy += o.flag("healthy_job");
    } else if (type == "collateral") {
      ++collateral[o.str("finding")];
    } else if (type == "exposure") {
      job_days += o.num("job_days");
      wall_s += o.num("wall_s");
    } else if (type == "clock") {
      clock_errors.push_back(std::fabs(o.num("error_ns")));
      jitters.insert(o.num("probe_jitter_ms"));
    } else if (type == "delivery") {
      sent += o.i64("records_sent");
      stored += o.i64("records_stored");
      lost += o.i64("records_lost");
      sends_lost += o.i64("sends_lost");
      reordered += o.i64("reordered");
      dups += o.i64("duplicate_batches");
    }
  }
};

// The accuracy, false-alarm, clock and delivery tables.
void print_report(Tally& t) {
  auto f2 = [](double v, const char* fmt = "%.2f") {
    if (std::isnan(v)) return std::string("-");
    char buf[32];
    snprintf(buf, sizeof(buf), fmt, v);
    return std::string(buf);
  };
  std::printf("| fault | incidents | recall | latency p50 / p90 / p99 (s) | top-1 rank | top-1 node | cost error (median, abs) |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const auto& [name, g] : t.groups) {
    std::printf("| %s | %d | %s | %s / %s / %s | %s | %s | %s |\n", name.c_str(), g.incidents,
                f2(g.incidents ? static_cast<double>(g.detected) / g.incidents : NAN).c_str(),
                f2(percentile(g.latency, 0.5)).c_str(), f2(percentile(g.latency, 0.9)).c_str(),
                f2(percentile(g.latency, 0.99)).c_str(),
                f2(g.incidents ? static_cast<double>(g.rank_ok) / g.incidents : NAN).c_str(),
                f2(g.incidents ? static_cast<double>(g.node_ok) / g.incidents : NAN).c_str(),
                g.cost.empty() ? "-" : (f2(percentile(g.cost, 0.5) * 100, "%.0f") + "%").c_str());
  }
  std::printf("\n| finding kind | true positives | false alarms | of which on the culprit's node | precision | collateral (job already stopped) |\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  std::set<std::string> kinds;
  for (const auto& [k, n] : t.tp_findings) kinds.insert(k);
  for (const auto& [k, n] : t.fa_findings) kinds.insert(k);
  for (const auto& k : kinds) {
    int tp = t.tp_findings[k], fa = t.fa_findings[k];
    std::printf("| %s | %d | %d | %d | %s | %d |\n", k.c_str(), tp, fa, t.fa_node_ok[k],
                f2(tp + fa ? static_cast<double>(tp) / (tp + fa) : NAN).c_str(), t.collateral[k]);
  }
  std::printf("\nHealthy jobs: %.2f simulated job-days (%.0f s of wall time), %d false alarm(s): %s per job-day.\n",
              t.job_days, t.wall_s, t.fa_healthy, f2(t.job_days > 0 ? t.fa_healthy / t.job_days : NAN).c_str());
  std::string jit;
  for (double j : t.jitters) jit += (jit.empty() ? "" : ", ") + f2(j, "%.1f");
  std::printf(
      "Clock: %zu node(s), probe jitter %s ms: error of the corrected issue times p50 %s us, p99 %s us, max %s us.\n",
      t.clock_errors.size(), jit.c_str(), f2(percentile(t.clock_errors, 0.5) / 1e3, "%.1f").c_str(),
      f2(percentile(t.clock_errors, 0.99) / 1e3, "%.1f").c_str(),
      f2(t.clock_errors.empty() ? NAN : *std::max_element(t.clock_errors.begin(), t.clock_errors.end()) / 1e3, "%.1f")
          .c_str());
  std::printf(
      "Delivery: %lld records sent, %lld stored; %lld lost before the wire (sequence gaps), %lld batch sends lost "
      "(re-sent), %lld reordered, %lld duplicate batches ignored.\n",
      (long long)t.sent, (long long)t.stored, (long long)t.lost, (long long)t.sends_lost, (long long)t.reordered,
      (long long)t.dups);
}

int report(const std::vector<std::string>& files) {
  Tally tally;
  for (const auto& file : files) {
    auto lines = read_json_lines(file);
    if (!lines) {
      std::cerr << "rankscope-sim report: " << lines.error().message << "\n";
      return 2;
    }
    for (const auto& o : *lines) tally.add(o);
  }
  print_report(tally);
  return 0;
}

}  // namespace rankscope::sim
