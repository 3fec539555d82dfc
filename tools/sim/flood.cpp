#include "tools/sim/flood.h"

#include <capnp/message.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <cstdio>
#include <fstream>
#include <memory>
#include <zmq.hpp>

#include "common/clock.h"
#include "common/format.h"
#include "common/log.h"
#include "tools/cli/client.h"
#include "tools/sim/agent.h"
#include "tools/sim/jsonl.h"

namespace rankscope::sim {

namespace {
constexpr int64_t kSecond = 1'000'000'000;
constexpr size_t kWindow = 4;  // unacked batches per node

uint64_t proc_kb(int pid, const char* field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::strtoull(line.c_str() + std::strlen(field) + 1, nullptr, 10);
  return 0;
}

struct Sent {
  uint64_t records = 0, bytes = 0, batches = 0;
  double seconds = 0;
  uint64_t start_unix_ns = 0, end_unix_ns = 0;  // the sending, on the wall clock (floods run side by side)
};

// Sends every prebuilt batch of `agents` in time order, each node keeping at
// most kWindow unacked; returns when all are acked.
Sent pump(std::vector<std::unique_ptr<SimAgent>>& agents,
          std::vector<std::vector<std::pair<size_t, std::string>>>& batches, uint64_t t0) {
  auto rel_now = [&] { return static_cast<int64_t>(SystemClock::read(CLOCK_REALTIME) - t0); };
  Sent sent;
  std::vector<size_t> next(agents.size(), 0);
  std::vector<zmq::pollitem_t> items;
  for (auto& a : agents) items.push_back({a->socket().handle(), 0, ZMQ_POLLIN, 0});
  auto start = std::chrono::steady_clock::now();
  sent.start_unix_ns = SystemClock::read(CLOCK_REALTIME);
  for (;;) {
    bool pending = false;
    int64_t now = rel_now();
    for (size_t n = 0; n < agents.size(); ++n) {
      while (next[n] < batches[n].size() && agents[n]->unacked() < kWindow) {
        auto& [records, bytes] = batches[n][next[n]++];
        sent.records += records;
        sent.bytes += bytes.size();
        ++sent.batches;
        agents[n]->submit(std::move(bytes), now);
      }
      pending |= next[n] < batches[n].size() || agents[n]->unacked() > 0;
    }
    if (!pending) break;
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(5));
    now = rel_now();
    for (size_t n = 0; n < agents.size(); ++n)
      if (items[n].revents & ZMQ_POLLIN) agents[n]->service(now);
  }
  sent.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  sent.end_unix_ns = SystemClock::read(CLOCK_REALTIME);
  return sent;
}

bool wait_accepted(std::vector<std::unique_ptr<SimAgent>>& agents, uint64_t t0) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (auto& a : agents) a->start(static_cast<int64_t>(SystemClock::read(CLOCK_REALTIME) - t0));
  std::vector<zmq::pollitem_t> items;
  for (auto& a : agents) items.push_back({a->socket().handle(), 0, ZMQ_POLLIN, 0});
  auto last_hello = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() < deadline) {
    bool all = true;
    for (auto& a : agents) all &= a->accepted();
    if (all) return true;
    // A hello sent before the connection was up is dropped (immediate): say it again.
    if (std::chrono::steady_clock::now() - last_hello > std::chrono::seconds(1)) {
      for (auto& a : agents)
        if (!a->accepted()) a->start(static_cast<int64_t>(SystemClock::read(CLOCK_REALTIME) - t0));
      last_hello = std::chrono::steady_clock::now();
    }
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(10));
    for (size_t n = 0; n < agents.size(); ++n)
      if (items[n].revents & ZMQ_POLLIN)
        agents[n]->service(static_cast<int64_t>(SystemClock::read(CLOCK_REALTIME) - t0));
  }
  return false;
}

// Builds the fleet's records for `steps` steps and cuts them into batches.
std::vector<std::vector<std::pair<size_t, std::string>>> prebuild(Fleet& fleet,
                                                                    std::vector<std::unique_ptr<SimAgent>>& agents,
                                                                    int steps, int steps_per_batch) {
  std::vector<std::vector<SimEvent>> out;
  int64_t horizon = 0;
  while (fleet.steps()[0] < static_cast<uint64_t>(steps)) {
    horizon += kSecond;
    fleet.advance(horizon, out);
  }
  std::vector<std::vector<std::pair<size_t, std::string>>> batches(agents.size());
  for (size_t n = 0; n < agents.size(); ++n) {
    agents[n]->add_events(out[n]);
    batches[n] = agents[n]->prebuild(steps_per_batch * kSecond);
  }
  return batches;
}

double query_ms(cli::QueryClient& client, const std::function<void(proto::query::Request::Builder)>& fill,
                size_t* count) {
  std::vector<double> times;
  for (int i = 0; i < 5; ++i) {
    capnp::MallocMessageBuilder request;
    auto req = request.initRoot<proto::query::Request>();
    req.setProtocolVersion(proto::query::QUERY_PROTOCOL_VERSION);
    fill(req);
    auto start = std::chrono::steady_clock::now();
    auto asked = client.ask(request, [&](proto::query::Reply::Reader reply) {
      if (count && reply.which() == proto::query::Reply::TIMELINE) *count = reply.getTimeline().getRecords().size();
      if (count && reply.which() == proto::query::Reply::FINDINGS) *count = reply.getFindings().getFindings().size();
    });
    if (!asked) {
      RS_LOG(error, "query failed: %s", asked.error().message.c_str());
      return -1;
    }
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}
}  // namespace

namespace {
// The flooded job (8 ranks per node, 1 s steps, four pipeline stages when
// its nodes divide by 4) and the one-node job whose history sits an hour back.
std::pair<FleetConfig, FleetConfig> flood_configs(const FloodOptions& options) {
  FleetConfig main;
  main.seed = options.seed;
  main.prefix = "flood" + std::to_string(options.ranks);
  main.jobs = 1;
  main.nodes_per_job = options.ranks / 8;
  main.pp = main.nodes_per_job % 4 == 0 ? 4 : 1;
  main.step_ms = 1000;
  main.max_skew_s = 1e-3;
  FleetConfig history = main;
  history.prefix = main.prefix + "-hist";
  history.nodes_per_job = 1;
  history.pp = 1;
  history.world_op = false;
  return {main, history};
}
}  // namespace

int run_flood(const FloodOptions& options) {
  if (options.ranks < 8 || options.ranks % 8 != 0) {
    RS_LOG(error, "--ranks must be a multiple of 8");
    return 2;
  }
  auto [main, history] = flood_configs(options);

  // The job's records end about now, the history's an hour before.
  uint64_t now = SystemClock::read(CLOCK_REALTIME);
  uint64_t t0_main = now - static_cast<uint64_t>(options.steps) * kSecond;
  uint64_t t0_hist = t0_main - static_cast<uint64_t>(options.history_steps) * kSecond;
  Fleet fleet(main), hist(history);
  zmq::context_t context(1);
  context.set(zmq::ctxopt::max_sockets, static_cast<int>(fleet.nodes().size()) + 64);
  std::vector<std::unique_ptr<SimAgent>> agents, hist_agents;
  for (size_t n = 0; n < fleet.nodes().size(); ++n)
    agents.push_back(std::make_unique<SimAgent>(context, options.collector, fleet, static_cast<int>(n), t0_main, options.seed));
  hist_agents.push_back(std::make_unique<SimAgent>(context, options.collector, hist, 0, t0_hist, options.seed));
  for (auto* list : {&agents, &hist_agents})
    for (auto& agent : *list)
      agent->set_layout(options.columns ? proto::BlockLayout::columns : proto::BlockLayout::table);

  auto build_start = std::chrono::steady_clock::now();
  auto batches = prebuild(fleet, agents, options.steps, options.steps_per_batch);
  auto hist_batches = prebuild(hist, hist_agents, options.history_steps, 60);
  double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - build_start).count();
  uint64_t rss_idle = options.collector_pid ? proc_kb(options.collector_pid, "VmRSS:") : 0;

  if (!wait_accepted(hist_agents, t0_hist) || !wait_accepted(agents, t0_main)) {
    RS_LOG(error, "the collector at %s did not accept every node within 30 s", options.collector.c_str());
    return 1;
  }
  Sent h = pump(hist_agents, hist_batches, t0_hist);
  RS_LOG(info, "history: %llu records in %.1f s", static_cast<unsigned long long>(h.records), h.seconds);
  Sent s = pump(agents, batches, t0_main);
  uint64_t rss = options.collector_pid ? proc_kb(options.collector_pid, "VmRSS:") : 0;
  uint64_t hwm = options.collector_pid ? proc_kb(options.collector_pid, "VmHWM:") : 0;

  cli::QueryClient client(options.query, 60000);
  size_t findings = 0, timeline_records = 0;
  double findings_ms = query_ms(client, [](auto req) { req.initFindings(); }, &findings);
  uint64_t hist_comm = hist.jobs()[0].comms[0].hash;
  double timeline_ms = query_ms(
      client,
      [&](auto req) {
        auto t = req.initTimeline();
        t.setComm(hex64(hist_comm));
        t.setRank(0);
        t.setLast(0);
      },
      &timeline_records);

  std::printf("%s\n", JsonLine()
                          .add("type", "flood")
                          .add("ranks", options.ranks)
                          .add("nodes", static_cast<int64_t>(fleet.nodes().size()))
                          .add("steps", options.steps)
                          .add("steps_per_batch", options.steps_per_batch)
                          .add("records", s.records)
                          .add("batches", s.batches)
                          .add("seconds", s.seconds)
                          .add("start_unix_ns", s.start_unix_ns)
                          .add("end_unix_ns", s.end_unix_ns)
                          .add("records_per_s", s.seconds > 0 ? static_cast<double>(s.records) / s.seconds : 0.0)
                          .add("wire_bytes_per_record", s.records ? static_cast<double>(s.bytes) / s.records : 0.0)
                          .add("build_s", build_s)
                          .add("rss_idle_kb", rss_idle)
                          .add("rss_kb", rss)
                          .add("hwm_kb", hwm)
                          .add("findings", static_cast<int64_t>(findings))
                          .add("findings_ms", findings_ms)
                          .add("timeline_records", static_cast<int64_t>(timeline_records))
                          .add("timeline_ms", timeline_ms)
                          .add("history_comm", hex64(hist_comm))
                          .str()
                          .c_str());
  return 0;
}

}  // namespace rankscope::sim
