#include "tools/cli/usage_commands.h"

#include <capnp/message.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "common/format.h"
#include "common/json.h"
#include "proto/records.h"

namespace rankscope::cli {

namespace query = proto::query;

namespace {

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (bytes >= 1000 && u < 5) bytes /= 1000, ++u;
  return format_fixed(bytes, bytes < 10 && u > 0 ? 1 : 0) + " " + units[u];
}

std::string trimmed(const std::string& text, size_t width) {
  if (text.size() <= width) return text;
  return text.substr(0, width - 1) + "~";
}

struct Columns {
  double gpu_h, share, cpu_h, off_h, coll_h, wait_h, bytes, waste_h, waste_share, caused_h, cost, waste_cost;
};
Columns columns(query::ReportRow::Reader row, double total_gpu_h, double price) {
  Columns c{};
  c.gpu_h = row.getGpuHours();
  c.share = total_gpu_h > 0 ? row.getGpuHours() / total_gpu_h : 0;
  c.cpu_h = row.getCpuSeconds() / 3600;
  c.off_h = row.getOffCpuSeconds() / 3600;
  c.coll_h = row.getCollectiveSeconds() / 3600;
  c.wait_h = row.getWaitSeconds() / 3600;
  c.bytes = row.getBytes();
  c.waste_h = row.getWasteGpuHours();
  c.waste_share = row.getGpuHours() > 0 ? row.getWasteGpuHours() / row.getGpuHours() : 0;
  c.caused_h = row.getCausedGpuHours();
  c.cost = row.getGpuHours() * price;
  c.waste_cost = row.getWasteGpuHours() * price;
  return c;
}

// A count the ledger keeps as a double, written as the whole number it is.
Json whole(double value) { return value >= 0 && value < 1.8e19 ? Json(static_cast<uint64_t>(std::llround(value))) : Json(value); }

// `unanswered`: in a fleet, the collectors that did not answer (null: alone).
void print_json(query::ReportReply::Reader r, const ReportArgs& args, const Json* unanswered = nullptr) {
  double total = r.getTotal().getGpuHours();
  auto row_json = [&](query::ReportRow::Reader row) {
    Columns c = columns(row, total, args.price_per_gpu_hour);
    Json out = {{"tenant", std::string(row.getTenant())},
                {"gpu_hours", c.gpu_h},
                {"share", c.share},
                {"cpu_seconds", row.getCpuSeconds()},
                {"off_cpu_seconds", row.getOffCpuSeconds()},
                {"collective_seconds", row.getCollectiveSeconds()},
                {"wait_seconds", row.getWaitSeconds()},
                {"bytes", whole(c.bytes)},
                {"collectives", whole(row.getCollectives())},
                {"waste_gpu_hours", c.waste_h},
                {"waste_share", c.waste_share},
                {"caused_gpu_hours", c.caused_h},
                {"top_cause", row.getTopCause().size() ? Json(std::string(row.getTopCause())) : Json(nullptr)},
                {"top_cause_gpu_hours", row.getTopCauseGpuHours()},
                {"nodes", row.getNodes()}};
    if (args.price_given) {
      out["cost"] = c.cost;
      out["waste_cost"] = c.waste_cost;
    }
    return out;
  };
  Json out = {{"since_ns", r.getSinceNs()},
              {"until_ns", r.getUntilNs()},
              {"since", format_time_ns(r.getSinceNs())},
              {"until", format_time_ns(r.getUntilNs())},
              {"by", std::string(r.getBy())},
              {"job", r.getJob().size() ? Json(std::string(r.getJob())) : Json(nullptr)}};
  if (args.price_given) out["price_per_gpu_hour"] = args.price_per_gpu_hour;
  out["rows"] = Json::array();
  for (auto row : r.getRows()) out["rows"].push_back(row_json(row));
  out["total"] = row_json(r.getTotal());
  out["causes"] = Json::array();
  for (auto c : r.getCauses()) out["causes"].push_back(waste_cause_json(c));
  out["findings"] = Json::array();
  for (auto f : r.getFindings())
    out["findings"].push_back({{"id", f.getId()},
                               {"kind", std::string(f.getKind())},
                               {"opened_ns", f.getOpenedNs()},
                               {"resolved_ns", f.getResolvedNs()},
                               {"summary", std::string(f.getSummary())},
                               {"gpu_hours_lost", f.getGpuHoursLost()}});
  out["ledger_rows_read"] = r.getEntries();
  if (unanswered) out["unanswered"] = *unanswered;
  std::printf("%s\n", to_json(out).c_str());
}

void print_csv(query::ReportReply::Reader r, const ReportArgs& args) {
  double total = r.getTotal().getGpuHours();
  std::printf("%s,gpu_hours,share,cpu_seconds,off_cpu_seconds,collective_seconds,wait_seconds,bytes,waste_gpu_hours,"
              "waste_share,caused_gpu_hours,top_cause,top_cause_gpu_hours,nodes%s\n",
              r.getBy().cStr(), args.price_given ? ",cost,waste_cost" : "");
  auto line = [&](query::ReportRow::Reader row) {
    Columns c = columns(row, total, args.price_per_gpu_hour);
    std::printf("%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%u", csv_field(row.getTenant()).c_str(),
                format_fixed(c.gpu_h, 6).c_str(), format_fixed(c.share, 6).c_str(),
                format_fixed(row.getCpuSeconds(), 3).c_str(), format_fixed(row.getOffCpuSeconds(), 3).c_str(),
                format_fixed(row.getCollectiveSeconds(), 6).c_str(), format_fixed(row.getWaitSeconds(), 6).c_str(),
                format_fixed(c.bytes, 0).c_str(), format_fixed(c.waste_h, 6).c_str(),
                format_fixed(c.waste_share, 6).c_str(), format_fixed(c.caused_h, 6).c_str(),
                csv_field(row.getTopCause()).c_str(), format_fixed(row.getTopCauseGpuHours(), 6).c_str(),
                row.getNodes());
    if (args.price_given) std::printf(",%s,%s", format_fixed(c.cost, 4).c_str(), format_fixed(c.waste_cost, 4).c_str());
    std::printf("\n");
  };
  for (auto row : r.getRows()) line(row);
  line(r.getTotal());
}

void print_table(query::ReportReply::Reader r, const ReportArgs& args) {
  double total = r.getTotal().getGpuHours();
  if (r.getJob().size())
    std::printf("Bill of job %s, %s to %s (UTC)\n\n", r.getJob().cStr(), format_time_ns(r.getSinceNs()).c_str(),
                format_time_ns(r.getUntilNs()).c_str());
  else
    std::printf("Usage by %s, %s to %s (UTC)\n\n", r.getBy().cStr(), format_time_ns(r.getSinceNs()).c_str(),
                format_time_ns(r.getUntilNs()).c_str());
  std::string header = r.getJob().size() ? "NODE" : std::string(r.getBy().cStr());
  for (auto& ch : header) ch = static_cast<char>(toupper(static_cast<unsigned char>(ch)));
  std::printf("%-24s %10s %6s %10s %10s %9s %11s %6s %10s  %-24s", header.c_str(), "GPU-HOURS", "SHARE", "CPU-HOURS",
              "OFF-CPU-H", "MOVED", "WASTE GPU-H", "WASTE", "CAUSED", "WAITED MOST ON");
  if (args.price_given) std::printf(" %12s %12s", "COST", "WASTE COST");
  std::printf("\n");
  auto line = [&](query::ReportRow::Reader row) {
    Columns c = columns(row, total, args.price_per_gpu_hour);
    std::printf("%-24s %10s %5s%% %10s %10s %9s %11s %5s%% %10s  %-24s", trimmed(row.getTenant(), 24).c_str(),
                format_fixed(c.gpu_h, 3).c_str(), format_fixed(c.share * 100, 1).c_str(),
                format_fixed(c.cpu_h, 3).c_str(), format_fixed(c.off_h, 3).c_str(), human_bytes(c.bytes).c_str(),
                format_fixed(c.waste_h, 4).c_str(), format_fixed(c.waste_share * 100, 1).c_str(),
                format_fixed(c.caused_h, 4).c_str(),
                trimmed(row.getTopCause().size() ? row.getTopCause().cStr() : "-", 24).c_str());
    if (args.price_given)
      std::printf(" %12s %12s", format_fixed(c.cost, 2).c_str(), format_fixed(c.waste_cost, 2).c_str());
    std::printf("\n");
  };
  for (auto row : r.getRows()) line(row);
  line(r.getTotal());
  if (r.getRows().size() == 0) std::printf("(no usage recorded in this range)\n");
  if (r.getCauses().size()) {
    std::printf("\nGPU-hours lost waiting, by who waited and on whom:\n");
    std::printf("  %-24s %-28s %-14s %12s  %s\n", "WAITED", "ON", "WHY", "GPU-HOURS", "DETAIL");
    size_t shown = 0;
    for (auto c : r.getCauses()) {
      if (++shown > 20) {
        std::printf("  ... %u more (see --json)\n", r.getCauses().size() - 20);
        break;
      }
      std::string detail = c.getCauseDetail();
      if (c.getCauseNode().size()) detail += " on " + std::string(c.getCauseNode().cStr());
      std::printf("  %-24s %-28s %-14s %12s  %s\n", trimmed(c.getVictim(), 24).c_str(),
                  trimmed(c.getCause(), 28).c_str(), c.getReason().cStr(), format_fixed(c.getGpuHours(), 5).c_str(),
                  detail.c_str());
    }
  }
  if (r.getJob().size()) {
    std::printf("\nFindings of job %s:%s\n", r.getJob().cStr(), r.getFindings().size() ? "" : " none");
    for (auto f : r.getFindings()) {
      std::string state = f.getResolvedNs() ? "resolved " + format_time_ns(f.getResolvedNs()) : std::string("OPEN");
      std::printf("  #%llu %-9s opened %s, %s: %s\n", (unsigned long long)f.getId(), f.getKind().cStr(),
                  format_time_ns(f.getOpenedNs()).c_str(), state.c_str(), f.getSummary().cStr());
    }
  }
}
void print_report(query::ReportReply::Reader r, const ReportArgs& args, const Json* unanswered = nullptr) {
  if (args.json)
    print_json(r, args, unanswered);
  else if (args.csv)
    print_csv(r, args);
  else
    print_table(r, args);
}

// The reports of a fleet's collectors as one. Each collector bills the jobs
// it held while it held them (a job that moved is billed in part by each),
// so the rows of a tenant add up; its NODES are the most any one collector
// saw (a node seen by two collectors is one node); its top cause is the
// cause owed the most GPU-hours over all collectors' answers.
void merge_reports(const std::vector<query::ReportReply::Reader>& parts, query::ReportReply::Builder out) {
  struct Sum {
    double gpu = 0, cpu = 0, off = 0, collective = 0, wait = 0, bytes = 0, collectives = 0, waste = 0, caused = 0;
    uint32_t nodes = 0;
    std::map<std::string, double> top;  // by top cause: its GPU-hours
    void add(query::ReportRow::Reader r) {
      gpu += r.getGpuHours();
      cpu += r.getCpuSeconds();
      off += r.getOffCpuSeconds();
      collective += r.getCollectiveSeconds();
      wait += r.getWaitSeconds();
      bytes += r.getBytes();
      collectives += r.getCollectives();
      waste += r.getWasteGpuHours();
      caused += r.getCausedGpuHours();
      nodes = std::max(nodes, r.getNodes());
      if (r.getTopCause().size() > 0) top[r.getTopCause()] += r.getTopCauseGpuHours();
    }
    void write(const std::string& tenant, query::ReportRow::Builder r) const {
      r.setTenant(tenant);
      r.setGpuHours(gpu);
      r.setCpuSeconds(cpu);
      r.setOffCpuSeconds(off);
      r.setCollectiveSeconds(collective);
      r.setWaitSeconds(wait);
      r.setBytes(bytes);
      r.setCollectives(collectives);
      r.setWasteGpuHours(waste);
      r.setCausedGpuHours(caused);
      r.setNodes(nodes);
      auto most =
          std::max_element(top.begin(), top.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
      if (most != top.end()) {
        r.setTopCause(most->first);
        r.setTopCauseGpuHours(most->second);
      }
    }
  };
  std::map<std::string, Sum> rows;
  Sum total;
  using CauseKey = std::tuple<std::string, std::string, std::string, std::string, std::string, std::string>;
  std::map<CauseKey, double> causes;  // (victim, cause, reason, node, detail, job): GPU-hours
  uint64_t since = UINT64_MAX, until = 0, entries = 0;
  size_t findings = 0;
  for (const auto& part : parts) {
    since = std::min(since, part.getSinceNs());
    until = std::max(until, part.getUntilNs());
    entries += part.getEntries();
    for (auto row : part.getRows()) rows[row.getTenant()].add(row);
    total.add(part.getTotal());
    for (auto c : part.getCauses())
      causes[{c.getVictim(), c.getCause(), c.getReason(), c.getCauseNode(), c.getCauseDetail(), c.getCauseJob()}] +=
          c.getGpuHours();
    findings += part.getFindings().size();
  }
  out.setSinceNs(parts.empty() ? 0 : since);
  out.setUntilNs(until);
  if (!parts.empty()) {
    out.setBy(parts[0].getBy());
    out.setJob(parts[0].getJob());
  }
  out.setEntries(entries);
  std::vector<std::pair<std::string, const Sum*>> ordered;
  for (const auto& [tenant, sum] : rows) ordered.emplace_back(tenant, &sum);
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const auto& a, const auto& b) { return a.second->gpu > b.second->gpu; });
  auto out_rows = out.initRows(static_cast<unsigned>(ordered.size()));
  for (unsigned i = 0; i < ordered.size(); ++i) ordered[i].second->write(ordered[i].first, out_rows[i]);
  total.write("TOTAL", out.initTotal());
  std::vector<std::pair<CauseKey, double>> by_hours(causes.begin(), causes.end());
  std::stable_sort(by_hours.begin(), by_hours.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  auto out_causes = out.initCauses(static_cast<unsigned>(by_hours.size()));
  for (unsigned i = 0; i < by_hours.size(); ++i) {
    const auto& [victim, cause, reason, node, detail, job] = by_hours[i].first;
    out_causes[i].setVictim(victim);
    out_causes[i].setCause(cause);
    out_causes[i].setReason(reason);
    out_causes[i].setCauseNode(node);
    out_causes[i].setCauseDetail(detail);
    out_causes[i].setCauseJob(job);
    out_causes[i].setGpuHours(by_hours[i].second);
  }
  auto out_findings = out.initFindings(static_cast<unsigned>(findings));
  unsigned k = 0;
  for (const auto& part : parts)
    for (auto f : part.getFindings()) out_findings.setWithCaveats(k++, f);
}

}  // namespace

Json drops_json(const DropCounts& drops) {
  Json out = Json::object();
  for (const DropReason& reason : kDropReasons) out[std::string(reason.name)] = drops.*reason.count;
  return out;
}

Json waste_cause_json(query::WasteCause::Reader c) {
  return {{"victim", std::string(c.getVictim())},
          {"cause", std::string(c.getCause())},
          {"cause_job", std::string(c.getCauseJob())},
          {"reason", std::string(c.getReason())},
          {"cause_node", std::string(c.getCauseNode())},
          {"cause_detail", std::string(c.getCauseDetail())},
          {"gpu_hours", c.getGpuHours()}};
}

std::optional<uint64_t> parse_time_ns(const std::string& text, uint64_t now_ns) {
  if (text.empty()) return std::nullopt;
  if (text == "now") return now_ns;
  if (text[0] == '-' && text.size() >= 3) {
    char unit = text.back();
    uint64_t n = 0;
    const char* first = text.data() + 1;
    const char* last = text.data() + text.size() - 1;
    auto [end, ec] = std::from_chars(first, last, n);
    if (ec != std::errc() || end != last) return std::nullopt;
    uint64_t scale = unit == 'd' ? 86400 : unit == 'h' ? 3600 : unit == 'm' ? 60 : unit == 's' ? 1 : 0;
    if (!scale || n > UINT64_MAX / 1'000'000'000ull / scale) return std::nullopt;
    uint64_t back = n * scale * 1'000'000'000ull;
    return back > now_ns ? 0 : now_ns - back;
  }
  if (text.find_first_not_of("0123456789.") == std::string::npos) {
    double seconds = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seconds);
    if (ec != std::errc() || end != text.data() + text.size() || !(seconds < 1.8e10)) return std::nullopt;
    return static_cast<uint64_t>(seconds * 1e9);
  }
  for (const char* format : {"%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d"}) {
    std::tm tm{};
    const char* end = strptime(text.c_str(), format, &tm);
    if (!end) continue;
    // Seconds may go on with a fraction (as rankscope prints times), and
    // any form may end in Z (UTC, as every time here is).
    uint64_t fraction_ns = 0;
    if (*end == '.' && format[std::strlen(format) - 1] == 'S') {
      uint64_t scale = 100'000'000;
      for (++end; *end >= '0' && *end <= '9'; ++end, scale /= 10) fraction_ns += static_cast<uint64_t>(*end - '0') * scale;
    }
    if (*end == 'Z') ++end;
    const time_t seconds = timegm(&tm);
    if (*end == '\0' && seconds >= 0) return static_cast<uint64_t>(seconds) * 1'000'000'000ull + fraction_ns;
  }
  return std::nullopt;
}

namespace {
void report_request(const ReportArgs& args, capnp::MallocMessageBuilder& request) {
  auto req = request.initRoot<query::Request>();
  req.setProtocolVersion(query::QUERY_PROTOCOL_VERSION);
  auto q = req.initReport();
  q.setSinceNs(args.since_ns);
  q.setUntilNs(args.until_ns);
  q.setBy(args.by);
  q.setJob(args.job);
}
}  // namespace

int run_report(QueryClient& client, const ReportArgs& args) {
  capnp::MallocMessageBuilder request;
  report_request(args, request);
  auto result = client.ask(request, [&](query::Reply::Reader reply) {
    if (reply.which() != query::Reply::REPORT) {
      std::cerr << "rankscope report: the collector answered with something else (is it older than this CLI?)\n";
      return;
    }
    print_report(reply.getReport(), args);
  });
  if (!result) {
    std::cerr << "rankscope report: " << result.error().message << "\n";
    return 1;
  }
  return 0;
}

int run_report(const std::vector<FleetTarget>& targets, int timeout_ms, const ReportArgs& args) {
  if (targets.size() == 1) {
    QueryClient client(targets[0].endpoint, timeout_ms, targets[0].keys);
    return run_report(client, args);
  }
  capnp::MallocMessageBuilder request;
  report_request(args, request);
  std::vector<FleetAnswer> answers = ask_all(targets, request, timeout_ms);
  std::vector<query::ReportReply::Reader> parts;
  Json unanswered = Json::array();
  for (const auto& a : answers) {
    if (a.reply && a.get().which() == query::Reply::REPORT) {
      parts.push_back(a.get().getReport());
      continue;
    }
    const std::string why = a.reply ? "answered with something else" : a.error;
    unanswered.push_back({{"collector", a.target.id}, {"endpoint", a.target.endpoint}, {"error", why}});
    if (!args.json)
      std::cerr << "rankscope report: collector " << a.target.id << " (" << a.target.endpoint
                << ") did not answer: " << why << "; what it billed is missing below\n";
  }
  if (parts.empty()) return 1;
  capnp::MallocMessageBuilder merged;
  merge_reports(parts, merged.initRoot<query::ReportReply>());
  print_report(merged.getRoot<query::ReportReply>().asReader(), args, &unanswered);
  return 0;
}

// ---------------------------------------------------------------- export

namespace {
struct Slice {
  uint64_t issue_ns, return_ns;
  uint64_t seq, bytes, comm;
  uint32_t lane;
  uint8_t op;
  int32_t peer;
};
struct Track {
  std::string node;
  uint32_t pid = 0;
  int32_t rank = -1;          // in the job's largest communicator
  std::vector<Slice> slices;
};
std::string micros(uint64_t ns) {
  char buf[48];
  snprintf(buf, sizeof(buf), "%llu.%03llu", (unsigned long long)(ns / 1000), (unsigned long long)(ns % 1000));
  return buf;
}
using Tracks = std::map<std::pair<std::string, uint32_t>, Track>;  // by (node, pid)

struct CommOf {
  uint64_t hash;
  size_t ranks;
};

// The job's communicators, largest first, and a track for each of its
// ranks' processes (by node and pid).
Result<std::vector<CommOf>> job_comms(QueryClient& client, const ExportArgs& args, Tracks& tracks) {
  capnp::MallocMessageBuilder jobs_request;
  auto jr = jobs_request.initRoot<query::Request>();
  jr.setProtocolVersion(query::QUERY_PROTOCOL_VERSION);
  jr.setJobs();
  std::vector<CommOf> comms;
  auto got = client.ask(jobs_request, [&](query::Reply::Reader reply) {
    for (auto job : reply.getJobs().getJobs()) {
      if (std::string(job.getJob().cStr()) != args.job) continue;
      for (auto c : job.getComms()) {
        comms.push_back({c.getCommHash(), c.getRanks().size()});
        for (auto r : c.getRanks()) {
          Track& t = tracks[{r.getNode(), r.getPid()}];
          t.node = r.getNode();
          t.pid = r.getPid();
        }
      }
    }
  });
  if (!got) return got.error();
  if (comms.empty()) return make_error(Errc::not_found, "no job '" + args.job + "' (see `rankscope jobs`)");
  std::sort(comms.begin(), comms.end(), [](const CommOf& a, const CommOf& b) { return a.ranks > b.ranks; });
  return comms;
}

// Every rank's calls on each communicator into its process's track; the
// ranks are named by the largest communicator (the job's world).
Result<void> read_timelines(QueryClient& client, const ExportArgs& args, const std::vector<CommOf>& comms,
                            Tracks& tracks) {
  bool largest = true;
  for (const CommOf& comm : comms) {
    capnp::MallocMessageBuilder request;
    auto req = request.initRoot<query::Request>();
    req.setProtocolVersion(query::QUERY_PROTOCOL_VERSION);
    auto t = req.initTimeline();
    t.setComm(hex64(comm.hash));
    t.setLast(0);
    auto read = client.ask(request, [&](query::Reply::Reader reply) {
      if (uint32_t limited = reply.getTimeline().getLimitedTo(); limited > 0)
        std::fprintf(stderr,
                     "rankscope: comm %s: the trace holds the last %u calls of each rank only (a reply holds at most "
                     "262,144)\n",
                     hex64(comm.hash).c_str(), limited);
      for (auto r : reply.getTimeline().getRecords()) {
        Track& track = tracks[{r.getNode(), r.getPid()}];
        track.node = r.getNode();
        track.pid = r.getPid();
        if (largest) track.rank = r.getRank();
        if (args.since_ns && r.getIssueNs() < args.since_ns) continue;
        if (args.until_ns && r.getIssueNs() >= args.until_ns) continue;
        track.slices.push_back(
            {r.getIssueNs(), r.getReturnNs(), r.getSeq(), r.getBytes(), comm.hash, r.getLane(), r.getOp(), r.getPeer()});
      }
    });
    if (!read)
      return make_error(read.error().code, "timeline of comm " + hex64(comm.hash) + ": " + read.error().message);
    largest = false;
  }
  return {};
}

struct FindingEvents {
  std::string json;  // ",\n{...}" per finding
  size_t count = 0;
};
// Findings of the job, as instant events on their culprit ranks' tracks.
Result<FindingEvents> finding_events(QueryClient& client, const ExportArgs& args, const Tracks& tracks,
                                     const std::map<std::string, int>& node_ids) {
  capnp::MallocMessageBuilder findings_request;
  auto fr = findings_request.initRoot<query::Request>();
  fr.setProtocolVersion(query::QUERY_PROTOCOL_VERSION);
  fr.initFindings().setLimit(10000);
  std::string findings_json;
  size_t findings = 0;
  auto fread = client.ask(findings_request, [&](query::Reply::Reader reply) {
    for (auto f : reply.getFindings().getFindings()) {
      if (std::string(f.getJob().cStr()) != args.job) continue;
      if (args.since_ns && f.getOpenedNs() < args.since_ns) continue;
      if (args.until_ns && f.getOpenedNs() >= args.until_ns) continue;
      // On the first culprit's track when it is known, else on the whole trace.
      std::string where = "\"s\":\"g\",\"pid\":0,\"tid\":0";
      if (f.getRanks().size() > 0) {
        for (auto& [key, track] : tracks)
          if (track.rank == f.getRanks()[0] && f.getComm() != 0) {
            where = "\"s\":\"t\",\"pid\":" + std::to_string(node_ids.at(track.node)) +
                    ",\"tid\":" + std::to_string(track.pid);
            break;
          }
      }
      findings_json += ",\n{\"name\":" + json_quote(std::string(f.getKind().cStr()) + " #" + std::to_string(f.getId())) +
                       ",\"cat\":\"finding\",\"ph\":\"i\"," + where + ",\"ts\":" + micros(f.getOpenedNs()) +
                       ",\"args\":{\"summary\":" + json_quote(f.getSummary()) + ",\"resolved_ns\":" +
                       std::to_string(f.getResolvedNs()) + "}}";
      ++findings;
    }
  });
  if (!fread) return make_error(fread.error().code, "findings: " + fread.error().message);
  return FindingEvents{std::move(findings_json), findings};
}

// The trace's metadata and slices (up to the findings); returns the slices written.
size_t write_tracks(std::ostream& out, const ExportArgs& args, Tracks& tracks,
                    const std::map<std::string, int>& node_ids) {
  out << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"job\":" << json_quote(args.job)
      << ",\"clock\":\"rankscope cluster clock (unix time, corrected per node)\"},\"traceEvents\":[\n";
  out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":" << json_quote("job " + args.job)
      << "}}";
  for (auto& [node, id] : node_ids) {
    out << ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << id << ",\"tid\":0,\"args\":{\"name\":"
        << json_quote("node " + node) << "}}";
    out << ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" << id << ",\"tid\":0,\"args\":{\"sort_index\":"
        << id << "}}";
  }
  size_t slices = 0;
  for (auto& [key, track] : tracks) {
    int pid = node_ids.at(track.node);
    std::string name = (track.rank >= 0 ? "rank " + std::to_string(track.rank) : std::string("rank ?")) + " (pid " +
                       std::to_string(track.pid) + ")";
    out << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << pid << ",\"tid\":" << track.pid
        << ",\"args\":{\"name\":" << json_quote(name) << "}}";
    out << ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":" << pid << ",\"tid\":" << track.pid
        << ",\"args\":{\"sort_index\":" << (track.rank >= 0 ? track.rank : 1 << 30) << "}}";
    std::sort(track.slices.begin(), track.slices.end(), [](const Slice& a, const Slice& b) {
      return std::tie(a.issue_ns, a.comm, a.lane, a.seq) < std::tie(b.issue_ns, b.comm, b.lane, b.seq);
    });
    for (const Slice& s : track.slices) {
      uint64_t dur = s.return_ns > s.issue_ns ? s.return_ns - s.issue_ns : 0;
      std::string op = proto::op_name(s.op);
      out << ",\n{\"name\":" << json_quote(op) << ",\"cat\":\"nccl\",\"ph\":\"X\",\"pid\":" << pid
          << ",\"tid\":" << track.pid << ",\"ts\":" << micros(s.issue_ns) << ",\"dur\":" << micros(dur)
          << ",\"args\":{\"comm\":\"" << hex64(s.comm) << "\",\"seq\":" << s.seq << ",\"lane\":" << s.lane
          << ",\"bytes\":" << s.bytes << ",\"peer\":" << s.peer << "}}";
      ++slices;
    }
  }
  return slices;
}

}  // namespace

int run_export(QueryClient& client, const ExportArgs& args) {
  if (args.format != "perfetto" && args.format != "chrome") {
    std::cerr << "rankscope export: --format must be perfetto (Chrome Trace Event JSON), not '" << args.format << "'\n";
    return 2;
  }
  Tracks tracks;
  auto comms = job_comms(client, args, tracks);
  auto read = comms ? read_timelines(client, args, *comms, tracks) : Result<void>(comms.error());
  if (!read) {
    std::cerr << "rankscope export: " << read.error().message << "\n";
    return 1;
  }
  std::map<std::string, int> node_ids;  // Perfetto's process per node
  for (auto& [key, track] : tracks) node_ids.emplace(track.node, 0);
  int next_node = 1;
  for (auto& [node, id] : node_ids) id = next_node++;
  auto findings = finding_events(client, args, tracks, node_ids);
  if (!findings) {
    std::cerr << "rankscope export: " << findings.error().message << "\n";
    return 1;
  }
  std::ofstream out(args.output);
  if (!out) {
    std::cerr << "rankscope export: cannot write " << args.output << "\n";
    return 1;
  }
  size_t slices = write_tracks(out, args, tracks, node_ids);
  out << findings->json << "\n]}\n";
  out.close();
  if (!out) {
    std::cerr << "rankscope export: writing " << args.output << " failed\n";
    return 1;
  }
  std::fprintf(stderr, "wrote %s: %zu rank track(s) on %zu node(s), %zu collective slice(s), %zu finding(s)\n",
               args.output.c_str(), tracks.size(), node_ids.size(), slices, findings->count);
  return 0;
}

}  // namespace rankscope::cli
