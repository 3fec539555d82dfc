#include "tools/cli/mcp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <istream>
#include <map>
#include <optional>
#include <ostream>
#include <vector>

#include "common/format.h"
#include "common/json.h"
#include "proto/drops.h"
#include "proto/records.h"
#include "tools/cli/usage_commands.h"

namespace rankscope::cli {
namespace {

namespace query = proto::query;

// The MCP revisions this server speaks, newest first. A client asking for
// one of them gets it; any other gets the newest (the client then decides).
const char* const kProtocolVersions[] = {"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"};

// JSON-RPC 2.0 error codes.
constexpr int kParseError = -32700, kInvalidRequest = -32600, kMethodNotFound = -32601, kInvalidParams = -32602;

// Past this many findings a query is not narrowed further (the collector's
// book holds fewer).
constexpr uint32_t kAllFindings = 1'000'000;

// A tool's arguments that are not what its schema says: the tool answers
// with an error result, so that the assistant can correct its call.
struct ArgumentError {
  std::string message;
};

// What a tool returns: text for the assistant to read, and the same as data.
struct ToolResult {
  std::string text;
  Json data = Json::object();
  bool error = false;
};

ToolResult tool_error(std::string message) {
  return {std::move(message), Json::object(), true};
}

// 0.5, 10, 86400: a number as people write it.
std::string format_double(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

// ---- arguments

const Json* argument(const Json& args, const char* name) {
  auto it = args.find(name);
  return it == args.end() || it->is_null() ? nullptr : &*it;
}

std::optional<std::string> string_arg(const Json& args, const char* name) {
  const Json* v = argument(args, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw ArgumentError{std::string("'") + name + "' must be a string"};
  return v->get<std::string>();
}

std::optional<int64_t> int_arg(const Json& args, const char* name, int64_t min, int64_t max) {
  const Json* v = argument(args, name);
  if (!v) return std::nullopt;
  // A whole number sent as 3.0 is still 3.
  bool whole = v->is_number_integer() || (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>());
  if (!whole) throw ArgumentError{std::string("'") + name + "' must be an integer"};
  double value = v->get<double>();
  if (value < static_cast<double>(min) || value > static_cast<double>(max))
    throw ArgumentError{std::string("'") + name + "' must be from " + std::to_string(min) + " to " +
                        std::to_string(max)};
  return static_cast<int64_t>(value);
}

std::optional<double> number_arg(const Json& args, const char* name, double min, double max) {
  const Json* v = argument(args, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw ArgumentError{std::string("'") + name + "' must be a number"};
  double value = v->get<double>();
  if (!(value >= min && value <= max))
    throw ArgumentError{std::string("'") + name + "' must be from " + format_double(min) + " to " +
                        format_double(max)};
  return value;
}

std::optional<bool> bool_arg(const Json& args, const char* name) {
  const Json* v = argument(args, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw ArgumentError{std::string("'") + name + "' must be true or false"};
  return v->get<bool>();
}

std::optional<uint64_t> time_arg(const Json& args, const char* name) {
  auto text = string_arg(args, name);
  if (!text) return std::nullopt;
  auto parsed = parse_time_ns(*text, now_ns());
  if (!parsed)
    throw ArgumentError{std::string("'") + name + "' is not a time: '" + *text +
                        "' (2026-11-01T12:00:00Z, unix seconds, now, -30m, -2h)"};
  return *parsed;
}

// ---- what the replies say

std::string iso(uint64_t ns) { return ns == 0 ? "" : format_time_ns(ns); }
Json iso_or_null(uint64_t ns) {
  return ns == 0 ? Json(nullptr) : Json(format_time_ns(ns));
}

std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : separator) + p;
  return out;
}

std::string finding_state(query::Finding::Reader f) {
  if (f.getAcknowledgedNs() != 0) return "acknowledged";
  return f.getResolvedNs() == 0 ? "open" : "resolved";
}

Json finding_brief(query::Finding::Reader f) {
  Json ranks = Json::array(), nodes = Json::array();
  for (auto r : f.getRanks()) ranks.push_back(r);
  for (auto n : f.getNodes()) nodes.push_back(std::string(n));
  return {{"id", f.getId()},
          {"kind", std::string(f.getKind())},
          {"state", finding_state(f)},
          {"job", std::string(f.getJob())},
          {"comm", f.getComm() == 0 ? Json(nullptr) : Json(hex64(f.getComm()))},
          {"seq", f.getSeq() < 0 ? Json(nullptr) : Json(f.getSeq())},
          {"ranks", ranks},
          {"nodes", nodes},
          {"opened_at", iso(f.getOpenedNs())},
          {"resolved_at", iso_or_null(f.getResolvedNs())},
          {"summary", std::string(f.getSummary())},
          {"lateness_s", f.getLatenessS()},
          {"wait_share", f.getWaitShare()},
          {"gpu_hours_lost", f.getGpuHoursLost()}};
}

std::string ranks_text(query::Finding::Reader f) {
  std::vector<std::string> ranks, nodes;
  for (auto r : f.getRanks()) ranks.push_back(std::to_string(r));
  for (auto n : f.getNodes()) nodes.push_back(n);
  if (ranks.empty()) return nodes.empty() ? "no rank named" : "node(s) " + join(nodes, ", ");
  return std::string(ranks.size() == 1 ? "rank " : "ranks ") + join(ranks, ", ") +
         (nodes.empty() ? "" : " on " + join(nodes, ", "));
}

std::string finding_line(query::Finding::Reader f, uint64_t now) {
  std::string state = finding_state(f);
  if (state == "open") state += " for " + format_duration_ns(static_cast<int64_t>(now - f.getOpenedNs()));
  std::string kind = f.getKind();
  std::transform(kind.begin(), kind.end(), kind.begin(), [](unsigned char c) { return std::toupper(c); });
  return "#" + std::to_string(f.getId()) + " " + kind + " (" + state + ", opened " + iso(f.getOpenedNs()) + ") job " +
         std::string(f.getJob()) + ", " + ranks_text(f) + ": " + std::string(f.getSummary());
}

// What an operator does next about a finding, by its kind.
std::vector<std::string> next_steps(query::Finding::Reader f) {
  std::string kind = f.getKind();
  std::string rank = f.getRanks().size() > 0 ? std::to_string(f.getRanks()[0]) : "";
  std::string node = f.getNodes().size() > 0 ? std::string(f.getNodes()[0]) : "its node";
  std::string comm = f.getComm() == 0 ? "" : hex64(f.getComm());
  std::vector<std::string> steps;
  if (kind == "hang") {
    steps.push_back("Look at rank " + rank + "'s process on " + node +
                    ": the cause above gives its state and time off-CPU; `py-spy dump --pid PID` or `gdb -p PID -batch "
                    "-ex 'thread apply all bt'` there shows where it stopped.");
    steps.push_back("A process that is gone or cannot go on stops the whole job: end it and restart from the last "
                    "checkpoint, leaving " + node + " out if the node is at fault.");
    if (!comm.empty())
      steps.push_back("Its last calls: rank_timeline with comm=" + comm + ", rank=" + rank + ".");
  } else if (kind == "straggler") {
    steps.push_back("Act on the cause above: raise or remove a CPU quota on the rank's cgroup (cpu.max, "
                    "cpu.cfs_quota_us), move CPU-hungry neighbours off its cores or pin them elsewhere, look at "
                    "I/O or paging where it is off-CPU.");
    steps.push_back("If " + node + " slows jobs again and again, drain it (`scontrol update NodeName=" + node +
                    " State=DRAIN Reason=...`, or the collector's --drain-after-jobs).");
    steps.push_back("It costs the job " + format_percent(f.getWaitShare()) + " of its time; " +
                    format_fixed(f.getGpuHoursLost(), 3) + " GPU-hours lost so far (job_report has the whole bill).");
  } else if (kind == "mismatch") {
    steps.push_back("The ranks called different collectives at the same position: a code path differs between ranks "
                    "(a data-dependent branch, a skipped step, different shapes). NCCL may have combined mismatched "
                    "buffers: treat the job's results since then as suspect.");
    if (!comm.empty())
      steps.push_back("Compare the culprit ranks' calls around the position: rank_timeline with comm=" + comm +
                      " for each of them.");
    steps.push_back("It stays open until someone acknowledges it: `rankscope ack " + std::to_string(f.getId()) +
                    "` once handled.");
  } else if (kind == "node_lost") {
    steps.push_back("Its agent stopped reporting: is " + node + " up, is rankscope-agent running there "
                    "(`systemctl status rankscope-agent`), can it reach the collector?");
    steps.push_back("Ranks on " + node + " are not observed meanwhile: hangs and stragglers there cannot be seen.");
  } else if (kind == "slow_link") {
    const std::string to = f.getNodes().size() > 1 ? std::string(f.getNodes()[1]) : "its peer's node";
    steps.push_back("Check the link from " + node + " to " + to + ": the NIC's error and speed counters on both "
                    "(`ethtool -S`, `ibstat`, `ibv_devinfo`), the cable and the switch ports between them.");
    steps.push_back("Its transfers waited longest on the network, not its GPU or its host: replacing the rank's GPU "
                    "will not help. It costs the collectives " + format_percent(f.getWaitShare()) +
                    " of their GPU time where sampled.");
  }
  return steps;
}

Json record_json(query::TimelineRecord::Reader r) {
  return {{"seq", r.getSeq()},
          {"lane", r.getLane()},
          {"op", proto::op_name(r.getOp())},
          {"peer", r.getPeer()},
          {"datatype", proto::datatype_name(r.getDatatype())},
          {"bytes", r.getBytes()},
          {"issued_at", iso(r.getIssueNs())},
          {"issue_ns", r.getIssueNs()},
          {"call_s", static_cast<double>(r.getReturnNs() - r.getIssueNs()) / 1e9},
          {"result", r.getResult() == 0 ? std::string("ok") : proto::result_name(r.getResult())},
          {"in_group", (r.getFlags() & RS_CALL_IN_GROUP) != 0}};
}

std::string record_line(query::TimelineRecord::Reader r) {
  std::string op = proto::op_name(r.getOp());
  if (r.getLane() != 0) op += " peer " + std::to_string(r.getPeer());
  return "  #" + std::to_string(r.getSeq()) + "  " + iso(r.getIssueNs()) + "  " + op + "  " +
         std::to_string(r.getBytes()) + " B  call " +
         format_duration_ns(static_cast<int64_t>(r.getReturnNs() - r.getIssueNs())) +
         (r.getResult() != 0 ? "  " + proto::result_name(r.getResult()) : "");
}

// The calls rank_timeline shows (indices into `records`, by lane and
// sequence): those within `window_ns` of `around`, the nearest past
// `limit`; without a time, the last `limit`. With the calls just before
// (at or before `around`) and after it.
struct ChosenCalls {
  std::vector<unsigned> shown;
  std::optional<unsigned> before, after;
};
ChosenCalls choose_calls(capnp::List<query::TimelineRecord>::Reader records, std::optional<uint64_t> around,
                         uint64_t window_ns, size_t limit) {
  ChosenCalls out;
  auto issue = [&](unsigned i) { return records[i].getIssueNs(); };
  for (unsigned i = 0; i < records.size(); ++i) {
    if (!around) {
      out.shown.push_back(i);
      continue;
    }
    if (issue(i) + window_ns >= *around && issue(i) <= *around + window_ns) out.shown.push_back(i);
    if (issue(i) <= *around && (!out.before || issue(i) >= issue(*out.before))) out.before = i;
    if (issue(i) > *around && (!out.after || issue(i) < issue(*out.after))) out.after = i;
  }
  if (out.shown.size() > limit) {
    // Nearest to the time first, or newest first; keep `limit`.
    auto distance = [&](unsigned i) { return issue(i) > *around ? issue(i) - *around : *around - issue(i); };
    std::stable_sort(out.shown.begin(), out.shown.end(), [&](unsigned a, unsigned b) {
      return around ? distance(a) < distance(b) : issue(a) > issue(b);
    });
    out.shown.resize(limit);
  }
  std::sort(out.shown.begin(), out.shown.end(), [&](unsigned a, unsigned b) {
    return records[a].getLane() != records[b].getLane() ? records[a].getLane() < records[b].getLane()
                                                        : records[a].getSeq() < records[b].getSeq();
  });
  return out;
}

// ---- the tools

class Tools {
 public:
  explicit Tools(QueryClient& client) : client_(client) {}

  struct Tool {
    const char* name;
    const char* title;
    const char* description;
    Json input_schema;
    std::function<ToolResult(const Json&)> run;
  };

  const std::vector<Tool>& all() const { return tools_; }

 private:
  ToolResult list_findings(const Json& args) {
    bool open_only = bool_arg(args, "open_only").value_or(true);
    std::string kind = string_arg(args, "kind").value_or("");
    std::string job = string_arg(args, "job").value_or("");
    auto limit = static_cast<size_t>(int_arg(args, "limit", 1, 500).value_or(50));
    capnp::MallocMessageBuilder request;
    auto q = request.initRoot<query::Request>().initFindings();
    q.setOpenOnly(open_only);
    q.setKind(kind);
    q.setLimit(job.empty() ? static_cast<uint32_t>(limit) : kAllFindings);
    ToolResult result;
    auto asked = client_.ask(request, [&](query::Reply::Reader reply) {
      if (reply.which() != query::Reply::FINDINGS) return;
      auto r = reply.getFindings();
      Json list = Json::array();
      std::string lines;
      for (auto f : r.getFindings()) {
        if (!job.empty() && std::string(f.getJob()) != job) continue;
        if (list.size() >= limit) break;
        list.push_back(finding_brief(f));
        lines += finding_line(f, r.getNowNs()) + "\n";
      }
      std::string scope = std::string(open_only ? "open " : "") + (kind.empty() ? "finding" : kind) + "(s)" +
                          (job.empty() ? "" : " of job " + job);
      result.text = list.empty() ? "no " + scope + "\n"
                                 : std::to_string(list.size()) + " " + scope + ", newest first:\n" + lines +
                                       "(explain_finding with an id gives its cause, cost and what to do next)\n";
      result.data = {{"findings", list}, {"count", list.size()}, {"now", iso(r.getNowNs())}};
    });
    if (!asked) return tool_error("the collector did not answer: " + asked.error().message);
    return result;
  }

  ToolResult explain_finding(const Json& args) {
    auto id = int_arg(args, "id", 1, INT64_MAX);
    if (!id) throw ArgumentError{"'id' is required: the finding's number (list_findings lists them)"};
    capnp::MallocMessageBuilder request;
    auto q = request.initRoot<query::Request>().initFindings();
    q.setOpenOnly(false);
    q.setLimit(kAllFindings);
    std::optional<ToolResult> result;
    auto asked = client_.ask(request, [&](query::Reply::Reader reply) {
      if (reply.which() != query::Reply::FINDINGS) return;
      auto r = reply.getFindings();
      for (auto f : r.getFindings()) {
        if (f.getId() != static_cast<uint64_t>(*id)) continue;
        ToolResult out;
        Json data = finding_brief(f);
        Json ranks = data["ranks"], nodes = data["nodes"];
        data["culprit"] = {{"ranks", ranks}, {"nodes", nodes}};
        data["cause"] = std::string(f.getDetail());
        data["cost"] = {{"lateness_s", f.getLatenessS()},
                        {"wait_share", f.getWaitShare()},
                        {"gpu_hours_lost", f.getGpuHoursLost()}};
        std::vector<std::string> steps = next_steps(f);
        data["next_steps"] = steps;
        if (f.getAcknowledgedNs() != 0) {
          data["acknowledged_at"] = iso(f.getAcknowledgedNs());
          data["acknowledged_by"] = std::string(f.getAcknowledgedBy());
        }
        out.text = finding_line(f, r.getNowNs()) + "\n\nCulprit: " + ranks_text(f) + "\n\nWhat rankscope saw:\n" +
                   std::string(f.getDetail()) + "\n";
        if (std::string(f.getKind()) == "straggler")
          out.text += "\nCost: the others waited " + format_percent(f.getWaitShare()) + " of the job's time for it, " +
                      format_duration_ns(static_cast<int64_t>(f.getLatenessS() * 1e9)) +
                      " late when it held them up; " + format_fixed(f.getGpuHoursLost(), 4) +
                      " GPU-hours lost so far.\n";
        out.text += "\nWhat to do next:\n";
        for (const auto& step : steps) out.text += "- " + step + "\n";
        out.data = std::move(data);
        result = std::move(out);
        return;
      }
    });
    if (!asked) return tool_error("the collector did not answer: " + asked.error().message);
    if (!result)
      return tool_error("no finding #" + std::to_string(*id) +
                        " (list_findings with open_only=false lists every finding the collector holds)");
    return *result;
  }

  ToolResult rank_timeline(const Json& args) {
    auto comm = string_arg(args, "comm");
    auto rank = int_arg(args, "rank", 0, INT32_MAX);
    if (!comm || comm->empty() || !rank)
      throw ArgumentError{"'comm' (a communicator hash in hex, from list_findings or list_jobs) and 'rank' are required"};
    auto around = time_arg(args, "around");
    double window_s = number_arg(args, "window_s", 0.001, 86400).value_or(10);
    auto limit = static_cast<size_t>(int_arg(args, "limit", 1, 1000).value_or(100));
    capnp::MallocMessageBuilder request;
    auto q = request.initRoot<query::Request>().initTimeline();
    q.setComm(*comm);
    q.setRank(static_cast<int32_t>(*rank));
    q.setLast(0);
    ToolResult result;
    auto asked = client_.ask(request, [&](query::Reply::Reader reply) {
      if (reply.which() != query::Reply::TIMELINE) return;
      auto t = reply.getTimeline();
      auto records = t.getRecords();
      auto [chosen, before, after] = choose_calls(records, around, static_cast<uint64_t>(window_s * 1e9), limit);
      Json list = Json::array();
      std::string lines;
      for (unsigned i : chosen) {
        list.push_back(record_json(records[i]));
        lines += record_line(records[i]) + "\n";
      }
      std::string node = records.size() > 0 ? std::string(records[0].getNode()) : "";
      uint32_t pid = records.size() > 0 ? records[0].getPid() : 0;
      result.data = {{"comm", hex64(t.getCommHash())},
                     {"job", std::string(t.getJob())},
                     {"nranks", t.getNranks()},
                     {"rank", *rank},
                     {"node", node},
                     {"pid", pid},
                     {"around", around ? Json(iso(*around)) : Json(nullptr)},
                     {"window_s", around ? Json(window_s) : Json(nullptr)},
                     {"calls_held", records.size()},
                     {"limited_to", t.getLimitedTo()},
                     {"records", list},
                     {"last_before", before ? record_json(records[*before]) : Json(nullptr)},
                     {"first_after", after ? record_json(records[*after]) : Json(nullptr)}};
      std::string head = "rank " + std::to_string(*rank) + " of comm " + hex64(t.getCommHash()) + " (job " +
                         std::string(t.getJob()) + ", " + std::to_string(t.getNranks()) + " ranks" +
                         (node.empty() ? "" : ", node " + node + ", pid " + std::to_string(pid)) +
                         "), cluster clock, UTC";
      if (records.size() == 0) {
        result.text = head + ": no calls recorded for this rank\n";
        return;
      }
      if (around)
        head += ": " + std::to_string(list.size()) + " call(s) within " + format_double(window_s) + " s of " +
                iso(*around);
      else
        head += ": its last " + std::to_string(list.size()) + " call(s)";
      result.text = head + "\n" + lines;
      if (around) {
        result.text += before ? "last call at or before that time:\n" + record_line(records[*before]) + "\n"
                              : "no call at or before that time\n";
        result.text += after ? "first call after it:\n" + record_line(records[*after]) + "\n"
                             : "no call after it: the rank has issued nothing since\n";
      }
    });
    if (!asked) return tool_error("the collector did not answer: " + asked.error().message);
    return result;
  }

  ToolResult job_report(const Json& args) {
    auto job = string_arg(args, "job");
    if (!job || job->empty()) throw ArgumentError{"'job' is required (list_jobs lists them)"};
    auto since = time_arg(args, "since");
    capnp::MallocMessageBuilder request;
    auto q = request.initRoot<query::Request>().initReport();
    q.setJob(*job);
    q.setBy("node");
    if (since) q.setSinceNs(*since);
    ToolResult result;
    auto asked = client_.ask(request, [&](query::Reply::Reader reply) {
      if (reply.which() != query::Reply::REPORT) return;
      auto r = reply.getReport();
      auto total = r.getTotal();
      Json nodes = Json::array(), causes = Json::array(), findings = Json::array();
      std::string text = "job " + *job + " from " + iso(r.getSinceNs()) + " to " + iso(r.getUntilNs()) + ": " +
                         format_fixed(total.getGpuHours(), 4) + " GPU-hours held, " +
                         format_fixed(total.getWasteGpuHours(), 4) + " of them idle waiting for stragglers and hangs";
      double share = total.getGpuHours() > 0 ? total.getWasteGpuHours() / total.getGpuHours() : 0;
      text += " (" + format_percent(share) + ")\n";
      for (auto row : r.getRows()) {
        nodes.push_back({{"node", std::string(row.getTenant())},
                         {"gpu_hours", row.getGpuHours()},
                         {"waste_gpu_hours", row.getWasteGpuHours()},
                         {"caused_gpu_hours", row.getCausedGpuHours()},
                         {"cpu_seconds", row.getCpuSeconds()},
                         {"collectives", row.getCollectives()}});
        text += "  node " + std::string(row.getTenant()) + ": " + format_fixed(row.getGpuHours(), 4) + " GPU-hours, " +
                format_fixed(row.getWasteGpuHours(), 4) + " waiting, " + format_fixed(row.getCausedGpuHours(), 4) +
                " caused others to wait\n";
      }
      if (r.getCauses().size() > 0) text += "who it waited on:\n";
      for (auto c : r.getCauses()) {
        causes.push_back(waste_cause_json(c));
        text += "  " + format_fixed(c.getGpuHours(), 4) + " GPU-hours: " + std::string(c.getReason()) + ", " +
                std::string(c.getCauseDetail()) + " on " + std::string(c.getCauseNode()) + "\n";
      }
      text += r.getFindings().size() > 0 ? "findings:\n" : "no findings\n";
      for (auto f : r.getFindings()) {
        findings.push_back(finding_brief(f));
        text += "  " + finding_line(f, now_ns()) + "\n";
      }
      result.text = text;
      result.data = {{"job", *job},
                     {"since", iso(r.getSinceNs())},
                     {"until", iso(r.getUntilNs())},
                     {"gpu_hours", total.getGpuHours()},
                     {"waste_gpu_hours", total.getWasteGpuHours()},
                     {"waste_share", share},
                     {"cpu_seconds", total.getCpuSeconds()},
                     {"collectives", total.getCollectives()},
                     {"nodes", nodes},
                     {"waited_on", causes},
                     {"findings", findings}};
    });
    if (!asked) return tool_error("the collector did not answer: " + asked.error().message);
    return result;
  }

  ToolResult node_status(const Json& args) {
    std::string only = string_arg(args, "node").value_or("");
    capnp::MallocMessageBuilder request;
    request.initRoot<query::Request>().setStatus();
    ToolResult result;
    auto asked = client_.ask(request, [&](query::Reply::Reader reply) {
      if (reply.which() != query::Reply::STATUS) return;
      auto s = reply.getStatus();
      Json nodes = Json::array();
      std::vector<std::string> known;
      std::string lines;
      for (auto n : s.getNodes()) {
        known.push_back(n.getNode());
        if (!only.empty() && std::string(n.getNode()) != only) continue;
        DropCounts d = proto::read_drops(n.getDrops());
        uint64_t drops = records_lost(d);
        nodes.push_back({{"node", std::string(n.getNode())},
                         {"connected", n.getConnected()},
                         {"last_contact", iso_or_null(n.getLastContactNs())},
                         {"agent_version", std::string(n.getAgentVersion())},
                         {"traced_processes", n.getTracedProcesses()},
                         {"batches", n.getBatches()},
                         {"records", n.getRecords()},
                         {"clock_offset_ns", n.getClockOffsetNs()},
                         {"clock_uncertainty_ns", n.getClockUncertaintyNs()},
                         {"wall_clock_skew_ns", n.getWallClockSkewNs()},
                         {"events_dropped", drops},
                         {"records_lost_unsent", d.lost_records},
                         {"drops", drops_json(d)},
                         {"bad_messages", n.getBadMessages()},
                         {"throttled_messages", n.getThrottledMessages()},
                         {"refused_claims", n.getRefusedClaims()}});
        lines += "  " + std::string(n.getNode()) + ": " + (n.getConnected() ? "connected" : "DISCONNECTED") +
                 ", last contact " +
                 (n.getLastContactNs() == 0
                      ? std::string("never")
                      : format_duration_ns(static_cast<int64_t>(s.getNowNs() - n.getLastContactNs())) + " ago") +
                 ", " + std::to_string(n.getTracedProcesses()) + " traced process(es), clock +/- " +
                 format_duration_ns(static_cast<int64_t>(n.getClockUncertaintyNs())) + ", " + std::to_string(drops) +
                 " events dropped" +
                 (n.getBadMessages() ? ", " + std::to_string(n.getBadMessages()) + " bad messages" : "") + "\n";
      }
      if (!only.empty() && nodes.empty()) {
        result = tool_error("no node '" + only + "' has reported to this collector (known: " +
                            (known.empty() ? std::string("none") : join(known, ", ")) + ")");
        return;
      }
      result.text = "collector " + std::string(s.getCollectorVersion()) + ", up " +
                    format_duration_ns(static_cast<int64_t>(s.getNowNs() - s.getStartedNs())) + ", " +
                    std::to_string(nodes.size()) + " node(s):\n" + lines;
      result.data = {{"collector_version", std::string(s.getCollectorVersion())},
                     {"up_s", static_cast<double>(s.getNowNs() - s.getStartedNs()) / 1e9},
                     {"nodes", nodes}};
    });
    if (!asked) return tool_error("the collector did not answer: " + asked.error().message);
    return result;
  }

  ToolResult list_jobs(const Json& args) {
    std::string only = string_arg(args, "job").value_or("");
    capnp::MallocMessageBuilder request;
    request.initRoot<query::Request>().setJobs();
    ToolResult result;
    auto asked = client_.ask(request, [&](query::Reply::Reader reply) {
      if (reply.which() != query::Reply::JOBS) return;
      Json jobs = Json::array();
      std::string lines;
      for (auto job : reply.getJobs().getJobs()) {
        if (!only.empty() && std::string(job.getJob()) != only) continue;
        Json comms = Json::array();
        lines += "job " + std::string(job.getJob()) + " (first seen " + iso(job.getFirstNs()) + ", last " +
                 iso(job.getLastNs()) + ")\n";
        for (auto c : job.getComms()) {
          Json ranks = Json::array();
          std::vector<std::string> where;
          for (auto rk : c.getRanks()) {
            ranks.push_back({{"rank", rk.getRank()},
                             {"node", std::string(rk.getNode())},
                             {"pid", rk.getPid()},
                             {"calls", rk.getRecords()},
                             {"last_seq", rk.getLastSeq()},
                             {"last_issue", iso_or_null(rk.getLastIssueNs())}});
            where.push_back(std::to_string(rk.getRank()) + "@" + std::string(rk.getNode()));
          }
          comms.push_back({{"comm", hex64(c.getCommHash())}, {"nranks", c.getNranks()}, {"ranks", ranks}});
          lines += "  comm " + hex64(c.getCommHash()) + ", " + std::to_string(c.getNranks()) + " ranks: " +
                   join(where, " ") + "\n";
        }
        jobs.push_back({{"job", std::string(job.getJob())},
                        {"first_seen", iso(job.getFirstNs())},
                        {"last_seen", iso(job.getLastNs())},
                        {"comms", comms}});
      }
      result.text = jobs.empty() ? (only.empty() ? "no jobs seen yet\n" : "no job '" + only + "'\n") : lines;
      result.data = {{"jobs", jobs}};
    });
    if (!asked) return tool_error("the collector did not answer: " + asked.error().message);
    return result;
  }

  QueryClient& client_;
  const std::vector<Tool> tools_ = {
      {"list_findings",
       "Open findings",
       "Hangs, collective mismatches, stragglers, lost nodes and slow links the collector has found, newest first: each with "
       "its id, job, communicator, culprit ranks and nodes, and a one-line summary.",
       {{"type", "object"},
        {"properties",
         {{"open_only", {{"type", "boolean"}, {"description", "only findings still open (default true)"}}},
          {"kind",
           {{"type", "string"},
            {"enum", {"hang", "mismatch", "straggler", "node_lost", "slow_link"}},
            {"description", "only this kind"}}},
          {"job", {{"type", "string"}, {"description", "only this job's findings"}}},
          {"limit",
           {{"type", "integer"}, {"minimum", 1}, {"maximum", 500}, {"description", "at most (default 50)"}}}}}},
       [this](const Json& a) { return list_findings(a); }},
      {"explain_finding",
       "Explain a finding",
       "One finding in full: the culprit rank(s) and node(s), the cause rankscope saw (process state, off-CPU "
       "time, CPU quota throttling, run-queue waits), its cost (lateness, share of the job's time, GPU-hours lost) "
       "and what to do next.",
       {{"type", "object"},
        {"properties", {{"id", {{"type", "integer"}, {"minimum", 1}, {"description", "the finding's id"}}}}},
        {"required", {"id"}}},
       [this](const Json& a) { return explain_finding(a); }},
      {"rank_timeline",
       "A rank's timeline",
       "The NCCL calls one rank of a communicator issued around a time (cluster clock): sequence number, "
       "operation, bytes, when issued, how long the call took; and its last call before and first after that time "
       "(a hung rank has none after).",
       {{"type", "object"},
        {"properties",
         {{"comm", {{"type", "string"}, {"description", "communicator hash in hex, or a unique prefix"}}},
          {"rank", {{"type", "integer"}, {"minimum", 0}}},
          {"around",
           {{"type", "string"},
            {"description", "a time: 2026-11-01T12:00:00Z, unix seconds, now, -5m (default: its last calls)"}}},
          {"window_s",
           {{"type", "number"}, {"exclusiveMinimum", 0}, {"description", "seconds either side (default 10)"}}},
          {"limit",
           {{"type", "integer"}, {"minimum", 1}, {"maximum", 1000}, {"description", "at most (default 100)"}}}}},
        {"required", {"comm", "rank"}}},
       [this](const Json& a) { return rank_timeline(a); }},
      {"job_report",
       "A job's report",
       "One job's bill: GPU-hours held and lost waiting, by node; whom it waited on (stragglers, hangs, CPU "
       "neighbours) and for how many GPU-hours; its findings.",
       {{"type", "object"},
        {"properties",
         {{"job", {{"type", "string"}, {"description", "the job id (list_jobs lists them)"}}},
          {"since", {{"type", "string"}, {"description", "from this time (default: the job's start)"}}}}},
        {"required", {"job"}}},
       [this](const Json& a) { return job_report(a); }},
      {"node_status",
       "Node status",
       "Each node's agent: connected or not, last contact, traced processes, clock offset and uncertainty, events "
       "dropped, malformed or refused messages.",
       {{"type", "object"}, {"properties", {{"node", {{"type", "string"}, {"description", "only this node"}}}}}},
       [this](const Json& a) { return node_status(a); }},
      {"list_jobs",
       "Jobs",
       "The jobs the collector sees, their communicators (hash, size) and ranks (node, pid, calls, last call).",
       {{"type", "object"}, {"properties", {{"job", {{"type", "string"}, {"description", "only this job"}}}}}},
       [this](const Json& a) { return list_jobs(a); }},
  };
};

// ---- JSON-RPC

Json error_reply(const Json& id, int code, const std::string& message) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", message}}}};
}

Json result_reply(const Json& id, Json result) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
}

class Server {
 public:
  Server(QueryClient& client, const McpArgs& args, std::ostream& log) : tools_(client), args_(args), log_(log) {}

  // The reply to one message; null for a notification (or a reply to us).
  Json handle(const Json& message) {
    if (!message.is_object()) return error_reply(nullptr, kInvalidRequest, "a JSON-RPC message is an object");
    const bool has_id = message.contains("id");
    Json id = has_id ? message["id"] : Json(nullptr);
    if (has_id && !(id.is_string() || id.is_number_integer()))
      return error_reply(nullptr, kInvalidRequest, "'id' must be a string or an integer");
    auto method = message.find("method");
    if (method == message.end()) {
      // A response to a request of ours: this server sends none.
      if (message.contains("result") || message.contains("error")) return nullptr;
      return error_reply(id, kInvalidRequest, "no 'method'");
    }
    if (message.value("jsonrpc", "") != "2.0" || !method->is_string())
      return error_reply(id, kInvalidRequest, "not a JSON-RPC 2.0 request");
    if (!has_id) return nullptr;  // notifications/initialized, cancelled, ...: nothing to answer
    const std::string name = *method;
    const Json params =
        message.contains("params") && message["params"].is_object() ? message["params"] : Json::object();
    if (name == "initialize") return result_reply(id, initialize(params));
    if (name == "ping") return result_reply(id, Json::object());
    if (name == "tools/list") return result_reply(id, list());
    if (name == "tools/call") return call(id, params);
    return error_reply(id, kMethodNotFound, "method not found: " + name + " (this server has tools only)");
  }

 private:
  Json initialize(const Json& params) {
    std::string asked = params.value("protocolVersion", "");
    std::string version = kProtocolVersions[0];
    for (const char* v : kProtocolVersions)
      if (asked == v) version = v;
    auto client = params.find("clientInfo");
    if (client != params.end() && client->is_object())
      log_ << "rankscope mcp: " << client->value("name", "a client") << " " << client->value("version", "")
           << " connected (protocol " << version << ")\n";
    return {{"protocolVersion", version},
            {"capabilities", {{"tools", {{"listChanged", false}}}}},
            {"serverInfo", {{"name", "rankscope"}, {"title", "rankscope"}, {"version", args_.version}}},
            {"instructions",
             "rankscope finds the rank holding back or hanging a multi-node GPU training job. Start with "
             "list_findings (optionally for one job), then explain_finding for the culprit, its cause and cost; "
             "rank_timeline shows a rank's NCCL calls around a time, job_report a job's GPU-hours and whom it "
             "waited on, node_status the agents. Times are the cluster clock, UTC. Read-only."}};
  }

  Json list() {
    Json tools = Json::array();
    for (const auto& t : tools_.all())
      tools.push_back({{"name", t.name},
                       {"title", t.title},
                       {"description", t.description},
                       {"inputSchema", t.input_schema},
                       {"annotations", {{"readOnlyHint", true}, {"openWorldHint", false}}}});
    return {{"tools", tools}};
  }

  Json call(const Json& id, const Json& params) {
    auto name = params.find("name");
    if (name == params.end() || !name->is_string()) return error_reply(id, kInvalidParams, "tools/call needs a 'name'");
    const auto& all = tools_.all();
    auto tool = std::find_if(all.begin(), all.end(), [&](const auto& t) { return *name == t.name; });
    if (tool == all.end()) return error_reply(id, kInvalidParams, "unknown tool: " + name->get<std::string>());
    Json args = params.contains("arguments") ? params["arguments"] : Json::object();
    if (args.is_null()) args = Json::object();
    ToolResult result;
    if (!args.is_object()) {
      result = tool_error("'arguments' must be an object");
    } else {
      try {
        result = tool->run(args);
      } catch (const ArgumentError& e) {
        result = tool_error(std::string(tool->name) + ": " + e.message);
      }
    }
    Json content = Json::array({{{"type", "text"}, {"text", result.text}}});
    Json out = {{"content", content}, {"isError", result.error}};
    if (!result.error) {
      // The data as JSON text too, for clients that read only the text.
      out["content"].push_back({{"type", "text"}, {"text", to_json(result.data)}});
      out["structuredContent"] = result.data;
    }
    return result_reply(id, out);
  }

  Tools tools_;
  const McpArgs& args_;
  std::ostream& log_;
};

}  // namespace

int run_mcp(QueryClient& client, const McpArgs& args, std::istream& in, std::ostream& out, std::ostream& log) {
  Server server(client, args, log);
  auto send = [&](const Json& reply) {
    // One message per line: the writer escapes every newline inside strings.
    out << to_json(reply) << "\n";
    out.flush();
  };
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json message = Json::parse(line, nullptr, false);
    if (message.is_discarded()) {
      send(error_reply(nullptr, kParseError, "not JSON: each message is one line of JSON"));
      continue;
    }
    if (message.is_array()) {
      // A batch (MCP 2025-03-26 allowed them).
      if (message.empty()) {
        send(error_reply(nullptr, kInvalidRequest, "an empty batch"));
        continue;
      }
      Json replies = Json::array();
      for (const auto& m : message)
        if (Json r = server.handle(m); !r.is_null()) replies.push_back(std::move(r));
      if (!replies.empty()) send(replies);
      continue;
    }
    if (Json reply = server.handle(message); !reply.is_null()) send(reply);
  }
  log << "rankscope mcp: the client closed its end; exiting\n";
  return 0;
}

}  // namespace rankscope::cli
