// rankscope: the command line for the collector.
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "common/clock.h"
#include "common/curve.h"
#include "common/format.h"
#include "common/json.h"
#include "common/version.h"
#include "proto/drops.h"
#include "proto/records.h"
#include "tools/cli/client.h"
#include "tools/cli/fleet.h"
#include "tools/cli/mcp.h"
#include "tools/cli/usage_commands.h"

namespace po = boost::program_options;
namespace query = rankscope::proto::query;
using rankscope::DropCounts;
using rankscope::DropReason;
using rankscope::format_duration_ns;
using rankscope::format_time_ns;
using rankscope::hex64;
using rankscope::Json;
using rankscope::kDropReasons;
using rankscope::records_lost;
using rankscope::to_json;
using rankscope::cli::drops_json;
using rankscope::proto::read_drops;

namespace {

const char* kUsage =
    "rankscope: ask the rankscope collector what it knows.\n\n"
    "Usage: rankscope [--collector ENDPOINT | --etcd URLS] [--key FILE --collector-key FILE | --insecure] COMMAND "
    "[options]\n\n"
    "Commands:\n"
    "  status                       nodes, agents, last contact, clock offsets, drops\n"
    "  jobs                         jobs, their communicators and ranks\n"
    "  timeline --comm C [--rank R] [--last N]\n"
    "                               the NCCL calls of one communicator, per rank\n"
    "  findings [--open] [--kind K] hangs, mismatches, stragglers, lost nodes and slow links, newest first\n"
    "  hangs                        open hangs (findings --open --kind hang)\n"
    "  stragglers                   open stragglers (findings --open --kind straggler)\n"
    "  ack ID                       close finding ID: you have seen it. A mismatch stays open until\n"
    "                               acknowledged; another finding whose condition persists opens again.\n"
    "                               In a fleet: ID@COLLECTOR, as `findings` shows it\n"
    "  fleet                        the collectors sharing the fleet (etcd): answering, reaching etcd\n"
    "  report --by KEY [--since T] [--until T] [--price-per-gpu-hour P] [--csv]\n"
    "                               GPU-hours, CPU, waste and cost per tenant; KEY: account,\n"
    "                               user, job, namespace, pod, cgroup or node\n"
    "  report --job ID              one job's bill: its usage by node, who it waited on, its findings\n"
    "  export --format perfetto --job ID [--since T] [--until T] -o FILE\n"
    "                               the job's collectives per rank as a Chrome/Perfetto trace\n"
    "  mcp                          a Model Context Protocol server on stdin/stdout, for an assistant:\n"
    "                               read-only tools over this collector (docs/operations.md)\n"
    "  keygen --role R [--name N] --out PREFIX [--force]\n"
    "                               write a CurveZMQ key pair: PREFIX.key (secret, 0600) and\n"
    "                               PREFIX.pub (public); R is collector, agent (--name: its node) or client\n\n"
    "Times (T): 2026-11-01, 2026-11-01T12:00:00Z, unix seconds, now, -30d, -2h, -15m.\n"
    "The collector speaks CurveZMQ: --key is this client's key pair (default $RANKSCOPE_KEY or\n"
    "~/.config/rankscope/client.key), --collector-key the collector's public key (default\n"
    "$RANKSCOPE_COLLECTOR_KEY or /etc/rankscope/collector.pub). Every query command takes --json.\n"
    "In a fleet of collectors, status, jobs and findings ask every collector (any one of them as\n"
    "--collector, or --etcd) and say which did not answer.\n";

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value && *value ? value : fallback;
}

int keygen(const std::string& role, const std::string& name, const std::string& out, bool force) {
  if (out.empty()) {
    std::cerr << "rankscope keygen: --out PREFIX is required (writes PREFIX.key and PREFIX.pub)\n";
    return 2;
  }
  if (role == "agent" && name.empty()) {
    std::cerr << "rankscope keygen: an agent key needs --name, the node it speaks for (its --node)\n";
    return 2;
  }
  auto key = rankscope::curve::generate(name.empty() ? role : name, role);
  if (!key) {
    std::cerr << "rankscope keygen: " << key.error().message << "\n";
    return 2;
  }
  if (auto written = rankscope::curve::write(out, *key, force); !written) {
    std::cerr << "rankscope keygen: " << written.error().message << "\n";
    return 1;
  }
  std::printf("wrote %s.key (secret, 0600) and %s.pub (public key %s, %s %s)\n", out.c_str(), out.c_str(),
              key->public_key.c_str(), role.c_str(), key->name.c_str());
  return 0;
}

std::string origin_name(rankscope::proto::wire::CommOrigin origin) {
  switch (origin) {
    case rankscope::proto::wire::CommOrigin::INIT_RANK: return "CommInitRank";
    case rankscope::proto::wire::CommOrigin::INIT_RANK_CONFIG: return "CommInitRankConfig";
    case rankscope::proto::wire::CommOrigin::INIT_ALL: return "CommInitAll";
    case rankscope::proto::wire::CommOrigin::SPLIT: return "CommSplit";
    default: return "unknown (attached late)";
  }
}

std::string age(uint64_t now, uint64_t then) {
  if (then == 0) return "never";
  return format_duration_ns(static_cast<int64_t>(now - then)) + " ago";
}

Json status_json(query::StatusReply::Reader s) {
  Json out = {{"collector_version", std::string(s.getCollectorVersion())},
              {"started_ns", s.getStartedNs()},
              {"now_ns", s.getNowNs()},
              {"batches_stored", s.getBatchesStored()},
              {"records_stored", s.getRecordsStored()},
              {"duplicate_batches", s.getDuplicateBatches()},
              {"bad_messages", s.getBadMessages()},
              {"throttled_messages", s.getThrottledMessages()},
              {"refused_claims", s.getRefusedClaims()},
              {"batch_bytes", s.getBatchBytes()},
              {"nodes", Json::array()}};
  for (auto n : s.getNodes()) {
    out["nodes"].push_back({{"node", std::string(n.getNode())},
                            {"connected", n.getConnected()},
                            {"last_contact_ns", n.getLastContactNs()},
                            {"agent_version", std::string(n.getAgentVersion())},
                            {"instance", hex64(n.getInstanceId())},
                            {"batches", n.getBatches()},
                            {"records", n.getRecords()},
                            {"traced_processes", n.getTracedProcesses()},
                            {"clock_offset_ns", n.getClockOffsetNs()},
                            {"clock_uncertainty_ns", n.getClockUncertaintyNs()},
                            {"clock_samples", n.getClockSamples()},
                            {"wall_clock_skew_ns", n.getWallClockSkewNs()},
                            {"clock_refinement_ns", n.getClockRefinementNs()},
                            {"clock_drift_ppb", n.getClockDriftPpb()},
                            {"clock_violations", n.getClockViolations()},
                            {"bad_messages", n.getBadMessages()},
                            {"throttled_messages", n.getThrottledMessages()},
                            {"refused_claims", n.getRefusedClaims()},
                            {"drops", drops_json(read_drops(n.getDrops()))}});
  }
  if (s.getCollectorId().size() > 0) out["collector"] = std::string(s.getCollectorId());
  return out;
}

void print_status(query::StatusReply::Reader s, bool json) {
  if (json) {
    std::printf("%s\n", to_json(status_json(s)).c_str());
    return;
  }
  std::printf("collector %s, up %s; %llu batches, %llu records stored", s.getCollectorVersion().cStr(),
              format_duration_ns(static_cast<int64_t>(s.getNowNs() - s.getStartedNs())).c_str(),
              (unsigned long long)s.getBatchesStored(), (unsigned long long)s.getRecordsStored());
  if (s.getRecordsStored() > 0)
    std::printf(", %.1f wire bytes/record", static_cast<double>(s.getBatchBytes()) / s.getRecordsStored());
  std::printf(" (%llu re-sent batches ignored, %llu bad messages", (unsigned long long)s.getDuplicateBatches(),
              (unsigned long long)s.getBadMessages());
  if (s.getRefusedClaims() > 0)
    std::printf(", %llu refused claims: a node spoke for ranks or communicators not its own",
                (unsigned long long)s.getRefusedClaims());
  std::printf(")\n\n");
  std::printf("%-16s %-13s %-14s %9s %10s %5s %-26s %s\n", "NODE", "AGENT", "LAST CONTACT", "BATCHES", "RECORDS",
              "PROCS", "WALL CLOCK SKEW (+/-)", "DROPS");
  for (auto n : s.getNodes()) {
    DropCounts d = read_drops(n.getDrops());
    std::string clock = n.getClockSamples() == 0 && n.getClockUncertaintyNs() >= 1'000'000'000ull
                            ? "from hello (no probe yet)"
                            : format_duration_ns(n.getWallClockSkewNs()) + " (" +
                                  format_duration_ns(static_cast<int64_t>(n.getClockUncertaintyNs())) + ")";
    std::string drop_text = std::to_string(records_lost(d));
    for (const DropReason& reason : kDropReasons)
      if (!reason.status_text.empty() && d.*reason.count)
        drop_text += ", " + std::to_string(d.*reason.count) + " " + std::string(reason.status_text);
    if (n.getRefusedClaims()) drop_text += ", " + std::to_string(n.getRefusedClaims()) + " refused claim(s)";
    std::printf("%-16s %-13s %-14s %9llu %10llu %5u %-26s %s\n", n.getNode().cStr(),
                n.getConnected() ? "connected" : "disconnected", age(s.getNowNs(), n.getLastContactNs()).c_str(),
                (unsigned long long)n.getBatches(), (unsigned long long)n.getRecords(), n.getTracedProcesses(),
                clock.c_str(), drop_text.c_str());
  }
}

Json jobs_json(query::JobsReply::Reader r) {
  Json jobs = Json::array();
  for (auto job : r.getJobs()) {
    Json comms = Json::array();
    for (auto c : job.getComms()) {
      Json ranks = Json::array();
      for (auto rk : c.getRanks())
        ranks.push_back({{"rank", rk.getRank()},
                         {"node", std::string(rk.getNode())},
                         {"pid", rk.getPid()},
                         {"records", rk.getRecords()},
                         {"last_seq", rk.getLastSeq()},
                         {"last_issue_ns", rk.getLastIssueNs()},
                         {"gpu", std::string(rk.getGpu())},
                         {"user", std::string(rk.getUser())},
                         {"account", std::string(rk.getAccount())},
                         {"slurm_step", std::string(rk.getSlurmStep())},
                         {"pod_uid", std::string(rk.getPodUid())},
                         {"pod_namespace", std::string(rk.getPodNamespace())},
                         {"pod_name", std::string(rk.getPodName())},
                         {"container_id", std::string(rk.getContainerId())},
                         {"launcher_rank", rk.getLauncherRank()},
                         {"local_rank", rk.getLocalRank()},
                         {"world_size", rk.getWorldSize()}});
      comms.push_back({{"comm", hex64(c.getCommHash())},
                       {"nranks", c.getNranks()},
                       {"origin", origin_name(c.getOrigin())},
                       {"ranks", std::move(ranks)}});
      if (c.getOwner().size() > 0) comms.back()["owner"] = std::string(c.getOwner());
    }
    jobs.push_back({{"job", std::string(job.getJob())},
                    {"first_ns", job.getFirstNs()},
                    {"last_ns", job.getLastNs()},
                    {"comms", std::move(comms)}});
  }
  return jobs;
}

void print_jobs(query::JobsReply::Reader r, bool json) {
  if (json) {
    std::printf("%s\n", to_json(Json{{"jobs", jobs_json(r)}}).c_str());
    return;
  }
  if (r.getJobs().size() == 0) std::printf("no jobs seen yet\n");
  for (auto job : r.getJobs()) {
    std::printf("job %s  (first seen %s, last %s)\n", job.getJob().cStr(), format_time_ns(job.getFirstNs()).c_str(),
                format_time_ns(job.getLastNs()).c_str());
    for (auto c : job.getComms()) {
      std::printf("  comm %s  %d ranks, %s%s\n", hex64(c.getCommHash()).c_str(), c.getNranks(),
                  origin_name(c.getOrigin()).c_str(),
                  (c.getOwner().size() == 0) ? "" : (", placed on collector " + std::string(c.getOwner())).c_str());
      std::printf("    %5s  %-16s %8s %9s %9s  %s\n", "RANK", "NODE", "PID", "CALLS", "LAST SEQ", "LAST ISSUE");
      for (auto rk : c.getRanks())
        std::printf("    %5d  %-16s %8u %9llu %9lld  %s\n", rk.getRank(), rk.getNode().cStr(), rk.getPid(),
                    (unsigned long long)rk.getRecords(), (long long)rk.getLastSeq(),
                    format_time_ns(rk.getLastIssueNs()).c_str());
    }
  }
}

void print_timeline(query::TimelineReply::Reader t, bool json) {
  using rankscope::proto::datatype_name;
  using rankscope::proto::op_name;
  using rankscope::proto::redop_name;
  if (json) {
    // Streamed a record at a time: a reply holds up to 262,144 of them.
    std::string head = to_json(Json{{"comm", hex64(t.getCommHash())},
                                    {"job", std::string(t.getJob())},
                                    {"nranks", t.getNranks()},
                                    {"records", Json::array()}});
    std::printf("%s", head.substr(0, head.size() - 2).c_str());  // up to and with the list's '['
    bool first = true;
    for (auto r : t.getRecords()) {
      Json record = {{"rank", r.getRank()},
                     {"lane", r.getLane()},
                     {"seq", r.getSeq()},
                     {"op", op_name(r.getOp())},
                     {"datatype", datatype_name(r.getDatatype())},
                     {"redop", redop_name(r.getRedop())},
                     {"peer", r.getPeer()},
                     {"count", r.getCount()},
                     {"bytes", r.getBytes()},
                     {"issue_ns", r.getIssueNs()},
                     {"return_ns", r.getReturnNs()},
                     {"result", r.getResult()},
                     {"flags", r.getFlags()},
                     {"node", std::string(r.getNode())},
                     {"pid", r.getPid()}};
      std::printf("%s%s", first ? "" : ",", to_json(record).c_str());
      first = false;
    }
    std::printf("],\"limited_to\":%u}\n", t.getLimitedTo());
    return;
  }
  std::printf("comm %s  job %s  %d ranks  (times: cluster clock, UTC)\n", hex64(t.getCommHash()).c_str(),
              t.getJob().cStr(), t.getNranks());
  if (t.getLimitedTo() > 0)
    std::printf("(the last %u calls of each rank only: a reply holds at most 262,144; ask with --rank R for more)\n",
                t.getLimitedTo());
  std::printf("%8s %5s %-14s %-12s %-9s %12s %-27s %10s %s\n", "SEQ", "RANK", "NODE", "OP", "TYPE", "BYTES",
              "ISSUED", "CALL", "NOTE");
  for (auto r : t.getRecords()) {
    std::string op = op_name(r.getOp());
    if (r.getLane() != 0) op += " " + std::to_string(r.getPeer());
    else if (r.getPeer() >= 0) op += " root " + std::to_string(r.getPeer());
    std::string note;
    if (r.getResult() != 0) note += rankscope::proto::result_name(r.getResult()) + " ";
    if (r.getFlags() & RS_CALL_IN_GROUP) note += "in-group ";
    if (r.getFlags() & RS_CALL_UNKNOWN_COMM) note += "comm-unmatched ";
    if (rankscope::proto::op_is_collective(r.getOp()) && r.getOp() != RS_OP_ALLGATHER && r.getOp() != RS_OP_BROADCAST &&
        r.getOp() != RS_OP_BCAST && r.getOp() != RS_OP_ALLTOALL && r.getOp() != RS_OP_GATHER && r.getOp() != RS_OP_SCATTER)
      note += redop_name(r.getRedop());
    std::printf("%8llu %5d %-14s %-12s %-9s %12llu %-27s %10s %s\n", (unsigned long long)r.getSeq(), r.getRank(),
                r.getNode().cStr(), op.c_str(), datatype_name(r.getDatatype()).c_str(),
                (unsigned long long)r.getBytes(), format_time_ns(r.getIssueNs()).c_str(),
                format_duration_ns(static_cast<int64_t>(r.getReturnNs() - r.getIssueNs())).c_str(), note.c_str());
  }
}

std::string upper(std::string text) {
  for (auto& c : text) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
  return text;
}

// `collector`: the collector that holds it, in a fleet ("": alone).
Json finding_object(query::Finding::Reader f, const std::string& collector = "") {
  Json ranks = Json::array(), nodes = Json::array();
  for (auto rank : f.getRanks()) ranks.push_back(rank);
  for (auto node : f.getNodes()) nodes.push_back(std::string(node));
  auto time_or_null = [](uint64_t ns) { return ns == 0 ? Json(nullptr) : Json(format_time_ns(ns)); };
  Json out = {
      {"id", f.getId()},
      {"kind", std::string(f.getKind())},
      {"job", std::string(f.getJob())},
      {"comm", f.getComm() == 0 ? Json(nullptr) : Json(hex64(f.getComm()))},
      {"seq", f.getSeq() < 0 ? Json(nullptr) : Json(f.getSeq())},
      {"ranks", std::move(ranks)},
      {"nodes", std::move(nodes)},
      {"opened_at", format_time_ns(f.getOpenedNs())},
      {"resolved_at", time_or_null(f.getResolvedNs())},
      {"opened_ns", f.getOpenedNs()},
      {"resolved_ns", f.getResolvedNs()},
      {"acknowledged_at", time_or_null(f.getAcknowledgedNs())},
      {"acknowledged_by", f.getAcknowledgedNs() == 0 ? Json(nullptr) : Json(std::string(f.getAcknowledgedBy()))},
      {"summary", std::string(f.getSummary())},
      {"detail", std::string(f.getDetail())},
      {"lateness_s", f.getLatenessS()},
      {"wait_share", f.getWaitShare()},
      {"gpu_hours_lost", f.getGpuHoursLost()}};
  if (!collector.empty()) out["collector"] = collector;
  return out;
}

std::string finding_json(query::Finding::Reader f) {
  return to_json(finding_object(f));
}

// `collector`: the collector that holds it, in a fleet ("": alone); its id
// is then ID@COLLECTOR (ids are per collector).
void print_finding(query::Finding::Reader f, uint64_t now_ns, const std::string& collector = "") {
  std::string state = f.getResolvedNs() == 0
                          ? "OPEN for " + format_duration_ns(static_cast<int64_t>(now_ns - f.getOpenedNs()))
                          : "resolved at " + format_time_ns(f.getResolvedNs()) + " after " +
                                format_duration_ns(static_cast<int64_t>(f.getResolvedNs() - f.getOpenedNs()));
  if (f.getAcknowledgedNs() != 0)
    state += ", acknowledged at " + format_time_ns(f.getAcknowledgedNs()) + " by " + std::string(f.getAcknowledgedBy());
  std::printf("#%llu%s %s  %s  (opened %s)\n", (unsigned long long)f.getId(),
              collector.empty() ? "" : ("@" + collector).c_str(), upper(f.getKind()).c_str(), state.c_str(),
              format_time_ns(f.getOpenedNs()).c_str());
  std::string detail = f.getDetail();
  size_t start = 0;
  while (start <= detail.size()) {
    size_t end = detail.find('\n', start);
    if (end == std::string::npos) end = detail.size();
    std::printf("    %s\n", detail.substr(start, end - start).c_str());
    start = end + 1;
  }
  std::printf("\n");
}

void print_findings(query::FindingsReply::Reader r, bool json) {
  if (json) {
    std::string out = "[";
    for (auto f : r.getFindings()) out += (out.size() > 1 ? "," : "") + finding_json(f);
    std::printf("%s]\n", out.c_str());
    return;
  }
  if (r.getFindings().size() == 0) {
    std::printf("no findings\n");
    return;
  }
  for (auto f : r.getFindings()) print_finding(f, r.getNowNs());
}

using rankscope::cli::FleetAnswer;

// What every collector of a fleet answered (`expected`: a status, jobs or
// findings reply), merged, and which did not answer. Returns 1 when none did.
int print_fleet_answers(query::Reply::Which expected, const std::vector<FleetAnswer>& answers, bool json) {
  std::vector<const FleetAnswer*> answered;
  Json unanswered = Json::array();
  for (const auto& a : answers) {
    if (a.reply && a.get().which() == expected)
      answered.push_back(&a);
    else
      unanswered.push_back({{"collector", a.target.id},
                            {"endpoint", a.target.endpoint},
                            {"error", a.reply ? "answered with something else" : a.error}});
  }
  Json out = Json::object();
  if (expected == query::Reply::FINDINGS) {
    // One list, newest first; ids are per collector: ID@COLLECTOR.
    struct Row {
      query::Finding::Reader finding;
      const FleetAnswer* from;
    };
    std::vector<Row> rows;
    for (const FleetAnswer* a : answered)
      for (auto f : a->get().getFindings().getFindings()) rows.push_back({f, a});
    std::stable_sort(rows.begin(), rows.end(),
                     [](const Row& x, const Row& y) { return x.finding.getOpenedNs() > y.finding.getOpenedNs(); });
    out["findings"] = Json::array();
    for (const auto& row : rows) {
      if (json)
        out["findings"].push_back(finding_object(row.finding, row.from->target.id));
      else
        print_finding(row.finding, row.from->get().getFindings().getNowNs(), row.from->target.id);
    }
    if (!json && rows.empty()) std::printf("no findings\n");
  } else {
    out["collectors"] = Json::array();
    for (const FleetAnswer* a : answered) {
      if (json) {
        Json one = {{"collector", a->target.id}, {"endpoint", a->target.endpoint}};
        if (expected == query::Reply::STATUS)
          one["status"] = status_json(a->get().getStatus());
        else
          one["jobs"] = jobs_json(a->get().getJobs());
        out["collectors"].push_back(std::move(one));
        continue;
      }
      std::printf("== collector %s (%s)\n", a->target.id.c_str(), a->target.endpoint.c_str());
      if (expected == query::Reply::STATUS)
        print_status(a->get().getStatus(), false);
      else
        print_jobs(a->get().getJobs(), false);
      std::printf("\n");
    }
  }
  if (json) {
    out["unanswered"] = unanswered;
    std::printf("%s\n", to_json(out).c_str());
  } else {
    for (const auto& u : unanswered)
      std::printf("collector %s (%s) did not answer: %s\n", u["collector"].get<std::string>().c_str(),
                  u["endpoint"].get<std::string>().c_str(), u["error"].get<std::string>().c_str());
  }
  return answered.empty() ? 1 : 0;
}

// `rankscope fleet`: the collectors sharing the fleet, each asked for its
// own view (is it answering, does it reach etcd, how many members it sees).
int print_fleet(const std::vector<FleetAnswer>& answers, bool json) {
  Json out = Json::array();
  if (!json) std::printf("%-24s %-28s %-28s %-10s %s\n", "COLLECTOR", "QUERIES", "AGENTS", "UP", "STATE");
  int answering = 0;
  for (const auto& a : answers) {
    Json row = {{"collector", a.target.id}, {"queries", a.target.endpoint}, {"answering", a.reply != nullptr}};
    std::string agents = "-", up = "-", state;
    if (!a.reply && rankscope::cli::unknown_request(a.error)) {
      ++answering;  // an older collector, alone
      row["answering"] = true;
      state = "alone (a collector older than fleets)";
    } else if (!a.reply || a.get().which() != query::Reply::FLEET) {
      state = "not answering: " + (a.reply ? std::string("answered with something else") : a.error);
    } else {
      ++answering;
      auto f = a.get().getFleet();
      if (f.getSelf().size() == 0) {
        state = "alone (run without --etcd)";
      } else {
        state = f.getEtcdOk() ? "etcd ok" : "etcd unreachable: " + std::string(f.getEtcdError());
        state += ", sees " + std::to_string(f.getMembers().size()) + " collector(s)";
      }
      for (auto m : f.getMembers()) {
        if (m.getId() != f.getSelf()) continue;
        agents = std::string(m.getAgents());
        const uint64_t now = rankscope::SystemClock::read(CLOCK_REALTIME);
        // Its start is on its own clock: one ahead of this machine's shows no time up, not less.
        up = format_duration_ns(now > m.getStartedNs() ? static_cast<int64_t>(now - m.getStartedNs()) : 0);
        row["agents"] = agents;
        row["metrics"] = std::string(m.getMetrics());
        row["version"] = std::string(m.getVersion());
        row["started_ns"] = m.getStartedNs();
      }
      row["etcd"] = std::string(f.getEtcd());
      row["etcd_ok"] = f.getEtcdOk();
      row["etcd_error"] = std::string(f.getEtcdError());
      row["members_seen"] = f.getMembers().size();
      row["registrations"] = f.getRegistrations();
    }
    if (!json)
      std::printf("%-24s %-28s %-28s %-10s %s\n", a.target.id.empty() ? "(alone)" : a.target.id.c_str(),
                  a.target.endpoint.c_str(), agents.c_str(), up.c_str(), state.c_str());
    out.push_back(std::move(row));
  }
  if (json) std::printf("%s\n", to_json(Json{{"collectors", std::move(out)}}).c_str());
  return answering == 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string endpoint = "tcp://127.0.0.1:7601";
  std::string command, comm;
  int rank = -1;
  unsigned last = 20;
  int timeout_ms = 5000;
  bool json = false, open_only = false;
  std::string kind;
  std::string since, until, output;
  std::string ack_id;
  std::string etcd, etcd_prefix = "/rankscope/";
  rankscope::collector::HttpClientOptions etcd_tls;
  std::string ack_collector;  // ack ID@COLLECTOR
  rankscope::cli::ReportArgs report;
  rankscope::cli::ExportArgs export_args;
  std::string home = env_or("HOME", "");
  std::string key_file = env_or("RANKSCOPE_KEY", home.empty() ? "" : home + "/.config/rankscope/client.key");
  std::string collector_key = env_or("RANKSCOPE_COLLECTOR_KEY", "/etc/rankscope/collector.pub");
  bool insecure = false, force = false;
  std::string role, name, out;
  po::options_description desc("Options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("collector", po::value(&endpoint)->default_value(endpoint), "the collector's query endpoint (in a fleet: any of them)")
    ("etcd", po::value(&etcd), "status, jobs, findings, ack, fleet: ask every collector of the fleet registered in this etcd (http[s]://HOST:PORT,...) instead of --collector")
    ("etcd-prefix", po::value(&etcd_prefix)->default_value(etcd_prefix), "the fleet's keys in etcd (the collectors' --etcd-prefix)")
    ("etcd-ca-file", po::value(&etcd_tls.ca_file), "https etcd: the CA certificate(s) that signed its")
    ("etcd-cert-file", po::value(&etcd_tls.cert_file), "https etcd: a client certificate (mutual TLS), with --etcd-key-file")
    ("etcd-key-file", po::value(&etcd_tls.key_file), "https etcd: the client certificate's key")
    ("timeout-ms", po::value(&timeout_ms)->default_value(timeout_ms), "how long to wait for the collector")
    ("json", po::bool_switch(&json), "print JSON instead of a table")
    ("comm", po::value(&comm), "timeline: communicator hash (hex, a unique prefix is enough)")
    ("rank", po::value(&rank), "timeline: only this rank")
    ("last", po::value(&last)->default_value(last), "timeline: the last N calls per rank (0: all)")
    ("open", po::bool_switch(&open_only), "findings: only the open ones")
    ("kind", po::value(&kind), "findings: only hang, mismatch, straggler, node_lost or slow_link")
    ("since", po::value(&since), "report, export: from this time (default: the start of the record)")
    ("until", po::value(&until), "report, export: up to this time (default: now)")
    ("by", po::value(&report.by)->default_value(report.by), "report: account, user, job, namespace, pod, cgroup or node")
    ("job", po::value(&report.job), "report: one job's bill; export: the job to export")
    ("price-per-gpu-hour", po::value(&report.price_per_gpu_hour), "report: adds cost columns (GPU-hours x P)")
    ("csv", po::bool_switch(&report.csv), "report: CSV instead of a table")
    ("format", po::value(&export_args.format)->default_value(export_args.format), "export: perfetto (Chrome Trace Event JSON)")
    ("output,o", po::value(&output), "export: the file to write")
    ("key", po::value(&key_file)->default_value(key_file), "this client's CurveZMQ key pair (rankscope keygen --role client)")
    ("collector-key", po::value(&collector_key)->default_value(collector_key), "the collector's public key file")
    ("insecure", po::bool_switch(&insecure), "plaintext, no key: only for a collector run with --insecure")
    ("role", po::value(&role), "keygen: collector, agent or client")
    ("name", po::value(&name), "keygen: the node an agent key speaks for (its --node), or a client's name")
    ("out", po::value(&out), "keygen: write OUT.key and OUT.pub")
    ("force", po::bool_switch(&force), "keygen: replace existing files")
    ("command", po::value(&command), "status | jobs | timeline | findings | hangs | stragglers | ack | report | export | mcp | keygen")
    ("id", po::value(&ack_id), "ack: the finding's id (rankscope findings lists them)");
  // clang-format on
  po::positional_options_description positional;
  positional.add("command", 1).add("id", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "rankscope: " << e.what() << "\n\n" << kUsage;
    return 2;
  }
  if (vm.count("help") || command.empty()) {
    std::cout << kUsage << "\n" << desc << "\n";
    return command.empty() && !vm.count("help") ? 2 : 0;
  }

  // This client's CurveZMQ keys (none with --insecure); nullopt after
  // saying why they could not be read.
  auto client_keys = [&]() -> std::optional<rankscope::curve::ClientKeys> {
    if (insecure) return rankscope::curve::ClientKeys{};
    if (!etcd.empty()) {
      // Each collector's public key comes from its record in etcd.
      auto own = rankscope::curve::read(key_file);
      if (!own || own->secret_key.empty()) {
        std::cerr << "rankscope " << command
                  << ": --key: " << (own ? key_file + " holds no secret-key" : own.error().message) << "\n";
        return std::nullopt;
      }
      return rankscope::curve::ClientKeys{own->public_key, own->secret_key, ""};
    }
    auto loaded = rankscope::curve::load_client_keys(key_file, collector_key);
    if (!loaded) {
      std::cerr << "rankscope " << command << ": " << loaded.error().message
                << "\n(--key, --collector-key: see docs/operations.md; --insecure for a collector run with --insecure)\n";
      return std::nullopt;
    }
    return *loaded;
  };

  if (!etcd.empty() && (command == "export" || command == "mcp" || command == "timeline")) {
    std::cerr << "rankscope " << command << ": --etcd is for status, jobs, findings, report, ack and fleet; " << command
              << " asks one collector: give it with --collector\n";
    return 2;
  }
  if (command == "report" || command == "export") {
    uint64_t now = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count());
    uint64_t since_ns = 0, until_ns = 0;
    for (auto [text, into, name] : {std::tuple{&since, &since_ns, "--since"}, std::tuple{&until, &until_ns, "--until"}}) {
      if (text->empty()) continue;
      auto parsed = rankscope::cli::parse_time_ns(*text, now);
      if (!parsed) {
        std::cerr << "rankscope " << command << ": " << name << " '" << *text
                  << "' is not a time (2026-11-01, 2026-11-01T12:00:00Z, unix seconds, now, -30d, -2h)\n";
        return 2;
      }
      *into = *parsed;
    }
    auto keys = client_keys();
    if (!keys) return 2;
    rankscope::cli::QueryClient client(endpoint, timeout_ms, *keys);
    if (command == "report") {
      report.since_ns = since_ns;
      report.until_ns = until_ns;
      report.json = json;
      report.price_given = vm.count("price-per-gpu-hour") > 0;
      if (report.price_given && !(report.price_per_gpu_hour >= 0)) {
        std::cerr << "rankscope report: --price-per-gpu-hour must be a price, 0 or more\n";
        return 2;
      }
      // In a fleet, every collector's part of the bill.
      auto targets = rankscope::cli::fleet_targets(endpoint, *keys, etcd, etcd_tls, etcd_prefix, timeout_ms);
      if (!targets) {
        std::cerr << "rankscope report: " << targets.error().message << "\n";
        return 1;
      }
      return rankscope::cli::run_report(*targets, timeout_ms, report);
    }
    if (report.job.empty() || output.empty()) {
      std::cerr << "rankscope export: --job and -o FILE are required (jobs are listed by `rankscope jobs`)\n";
      return 2;
    }
    export_args.job = report.job;
    export_args.since_ns = since_ns;
    export_args.until_ns = until_ns;
    export_args.output = output;
    return rankscope::cli::run_export(client, export_args);
  }
  if (command == "mcp") {
    auto keys = client_keys();
    if (!keys) return 2;
    rankscope::cli::QueryClient client(endpoint, timeout_ms, *keys);
    return rankscope::cli::run_mcp(client, {rankscope::kVersion, endpoint}, std::cin, std::cout, std::cerr);
  }
  if (command == "keygen") {
    if (!rankscope::curve::valid_role(role)) {
      std::cerr << "rankscope keygen: --role must be collector, agent or client\n";
      return 2;
    }
    return keygen(role, name, out, force);
  }

  capnp::MallocMessageBuilder request;
  auto req = request.initRoot<query::Request>();
  req.setProtocolVersion(query::QUERY_PROTOCOL_VERSION);
  if (command == "status") {
    req.setStatus();
  } else if (command == "jobs") {
    req.setJobs();
  } else if (command == "timeline") {
    if (comm.empty()) {
      std::cerr << "rankscope timeline: --comm is required (communicator hashes are listed by `rankscope jobs`)\n";
      return 2;
    }
    auto t = req.initTimeline();
    t.setComm(comm);
    t.setRank(rank);
    t.setLast(last);
  } else if (command == "findings" || command == "hangs" || command == "stragglers") {
    auto f = req.initFindings();
    f.setOpenOnly(open_only || command != "findings");
    f.setKind(command == "hangs" ? "hang" : command == "stragglers" ? "straggler" : kind);
  } else if (command == "fleet") {
    req.setFleet();
  } else if (command == "ack") {
    // ID, or in a fleet ID@COLLECTOR (ids are per collector).
    if (size_t at = ack_id.find('@'); at != std::string::npos) {
      ack_collector = ack_id.substr(at + 1);
      ack_id.resize(at);
    }
    uint64_t id = 0;
    auto [end, ec] = std::from_chars(ack_id.data(), ack_id.data() + ack_id.size(), id);
    if (ack_id.empty() || ec != std::errc() || end != ack_id.data() + ack_id.size() || id == 0) {
      std::cerr << "rankscope ack: give the id of a finding (`rankscope findings` lists them), e.g. rankscope ack 12\n";
      return 2;
    }
    auto a = req.initAck();
    a.setId(id);
    const char* user = std::getenv("USER");
    a.setBy(user && *user ? user : ("uid " + std::to_string(getuid())).c_str());
    a.setCollector(ack_collector);
  } else {
    std::cerr << "rankscope: unknown command '" << command << "'\n\n" << kUsage;
    return 2;
  }

  auto keys = client_keys();
  if (!keys) return 2;
  // In a fleet, these ask every collector (or, ack, the one that holds the finding).
  if (command != "timeline") {
    auto targets = rankscope::cli::fleet_targets(endpoint, *keys, etcd, etcd_tls, etcd_prefix, timeout_ms);
    if (!targets) {
      std::cerr << "rankscope " << command << ": " << targets.error().message << "\n";
      return 1;
    }
    if (command == "fleet") return print_fleet(rankscope::cli::ask_all(*targets, request, timeout_ms), json);
    if (command == "ack" && (targets->size() > 1 || !ack_collector.empty())) {
      auto holder = std::find_if(targets->begin(), targets->end(),
                                 [&](const rankscope::cli::FleetTarget& t) { return t.id == ack_collector; });
      if (holder == targets->end()) {
        std::cerr << "rankscope ack: in a fleet, finding ids are per collector: give ID@COLLECTOR as `rankscope "
                     "findings` shows it"
                  << (ack_collector.empty() ? "" : " (no collector '" + ack_collector + "' in the fleet)") << "\n";
        return 2;
      }
      targets = std::vector<rankscope::cli::FleetTarget>{*holder};
    }
    if (targets->size() > 1)
      return print_fleet_answers(command == "status" ? query::Reply::STATUS
                                 : command == "jobs" ? query::Reply::JOBS
                                                     : query::Reply::FINDINGS,
                                 rankscope::cli::ask_all(*targets, request, timeout_ms), json);
    if (!etcd.empty() || !ack_collector.empty()) {  // else the collector asked, as asked
      endpoint = targets->front().endpoint;
      keys = targets->front().keys;
    }
  }
  rankscope::cli::QueryClient client(endpoint, timeout_ms, *keys);
  auto result = client.ask(request, [&](query::Reply::Reader reply) {
    switch (reply.which()) {
      case query::Reply::STATUS: print_status(reply.getStatus(), json); break;
      case query::Reply::JOBS: print_jobs(reply.getJobs(), json); break;
      case query::Reply::TIMELINE: print_timeline(reply.getTimeline(), json); break;
      case query::Reply::FINDINGS: print_findings(reply.getFindings(), json); break;
      case query::Reply::ACK:
        if (json) std::printf("%s\n", finding_json(reply.getAck()).c_str());
        else print_finding(reply.getAck(), reply.getAck().getUpdatedNs());
        break;
      default: std::cerr << "rankscope: the collector answered with something this CLI does not know\n"; break;
    }
  });
  if (!result) {
    std::cerr << "rankscope " << command << ": " << result.error().message << "\n";
    return 1;
  }
  return 0;
}
