#include "collector/metrics.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include "common/drops.h"
#include "common/format.h"
#include "common/log.h"

namespace rankscope::collector {

namespace {

// Indexes into kCatalogue, in the same order.
enum class MetricId {
  findings_open,
  findings_opened,
  node_up,
  node_last_contact,
  node_clock_offset,
  node_clock_uncertainty,
  node_clock_drift,
  node_wall_clock_skew,
  agent_drops,
  node_bad_messages,
  node_refused_claims,
  comm_last_sequence,
  collective_issue_lateness,
  detector_incomplete,
  ingest_batches,
  ingest_records,
  ingest_duplicate_batches,
  ingest_bad_messages,
  ingest_bytes,
  ingest_held_batches,
  commit_failures,
  split_children,
  ingest_split_waits,
  ingest_gpu_records,
  detail_comms,
  detail_requests,
  fleet_members,
  fleet_etcd_up,
  fleet_registrations,
  alertmanager_posts,
  handshakes,
  throttled_messages,
  clock_probes,
  metrics_series_dropped,
  tenant_gpu,
  tenant_waste,
  tenant_caused_waste,
  node_unacked_batches,
  findings_waste_gpu_seconds,
  collector_loop,
  collector_last_evaluation,
  count,
};

using Type = MetricType;

// `job_name`, not `job`: Prometheus gives every scraped series a `job` label
// of its own (the scrape job) and would rename ours to `exported_job`.
// The agent drops' help names every reason of common/drops.h.
const std::string kDropsHelp =
    "Records the node's agent lost or could not match, by reason (" + drop_reason_names() + ").";

// clang-format off: one metric per entry reads better than one field per line.
const MetricInfo kCatalogue[] = {
    {"rankscope_findings_open",
     Type::gauge,
     "",
     {"kind"},
     "Findings open now, by kind (hang, mismatch, straggler, node_lost, slow_link)."},
    {"rankscope_findings_opened_total",
     Type::counter,
     "",
     {"kind"},
     "Findings opened since the collector started, by kind."},
    {"rankscope_node_up",
     Type::gauge,
     "",
     {"node"},
     "1 while the node's agent is connected (heard from within the liveness interval), 0 once it went silent."},
    {"rankscope_node_last_contact_timestamp_seconds",
     Type::gauge,
     "seconds",
     {"node"},
     "When the collector last heard from the node's agent, as Unix time."},
    {"rankscope_node_clock_offset_seconds",
     Type::gauge,
     "seconds",
     {"node"},
     "Offset from the node's monotonic clock to the cluster clock: cluster time = node time + offset."},
    {"rankscope_node_clock_uncertainty_seconds",
     Type::gauge,
     "seconds",
     {"node"},
     "Bound on the error of the node's clock offset; lateness below it is never reported."},
    {"rankscope_node_clock_drift_ratio",
     Type::gauge,
     "",
     {"node"},
     "Rate at which the node's clock runs apart from the cluster clock, in seconds per second (30e-6 is 30 ppm)."},
    {"rankscope_node_wall_clock_skew_seconds",
     Type::gauge,
     "seconds",
     {"node"},
     "The node's own wall clock minus the cluster clock (what its NTP gets wrong; rankscope does not rely on it)."},
    {"rankscope_agent_drops_total", Type::counter, "", {"node", "reason"}, kDropsHelp.c_str()},
    {"rankscope_node_bad_messages_total",
     Type::counter,
     "",
     {"node"},
     "Messages from the node's agent refused, whole or in part, as unreadable, past a limit or out of range."},
    {"rankscope_node_refused_claims_total",
     Type::counter,
     "",
     {"node"},
     "Claims from the node's agent refused because they contradict what a communicator's first announcement bound "
     "(its size, a rank's node and process) or touch a communicator the node is not a member of."},
    {"rankscope_comm_last_sequence",
     Type::gauge,
     "",
     {"job_name", "comm", "rank"},
     "Sequence number of the last collective the rank issued on the communicator."},
    {"rankscope_collective_issue_lateness_seconds",
     Type::histogram,
     "seconds",
     {},
     "How much later than its peers' median each rank issued a collective, on the cluster clock."},
    {"rankscope_detector_incomplete_collectives_total",
     Type::counter,
     "",
     {},
     "Complete collectives the straggler detector scored without a batch of a member's node that was missing (lost "
     "on the way, to be re-sent) and did not come within 3 s: the ranks' earlier calls were not all known."},
    {"rankscope_ingest_batches_total", Type::counter, "", {}, "Agent batches stored."},
    {"rankscope_ingest_records_total", Type::counter, "", {}, "Collective records stored."},
    {"rankscope_ingest_duplicate_batches_total",
     Type::counter,
     "",
     {},
     "Batches received again after they were stored (an agent that missed the ack re-sent them), ignored."},
    {"rankscope_ingest_bad_messages_total",
     Type::counter,
     "",
     {},
     "Agent messages refused as unreadable or outside the protocol."},
    {"rankscope_ingest_bytes_total", Type::counter, "bytes", {}, "Wire size of the batches stored."},
    {"rankscope_ingest_held_batches_total",
     Type::counter,
     "",
     {},
     "Batches not taken (nor acknowledged; agents re-send them) while the database could not be written and the "
     "unwritten backlog was full."},
    {"rankscope_commit_failures_total",
     Type::counter,
     "",
     {},
     "Commits to the database that failed; what they held is written by the next commit, and nothing of it was "
     "acknowledged."},
    {"rankscope_split_children_total",
     Type::counter,
     "",
     {"result"},
     "Children of ncclCommSplit whose size and ranks the collector derived (sized), or could not (abandoned: kept, "
     "never matched, so no finding on them)."},
    {"rankscope_ingest_split_waits_total",
     Type::counter,
     "",
     {},
     "Batches not acknowledged (agents re-send them) because they hold records of a split child not sized yet, or "
     "follow one that does."},
    {"rankscope_ingest_gpu_records_total",
     Type::counter,
     "",
     {"result"},
     "GPU-side records of collectives from NCCL's profiler plugin, by result (taken; unmatched: their communicator or "
     "member was not known, or another process holds that member)."},
    {"rankscope_detail_comms",
     Type::gauge,
     "",
     {},
     "Communicators whose NCCL proxy steps the collector asks their agents for now (a straggler, slow link or hang "
     "suspected or found there)."},
    {"rankscope_detail_requests_total",
     Type::counter,
     "",
     {"reason"},
     "Times a communicator's NCCL proxy steps were asked for, by reason (finding: one of its findings is open; link: a "
     "link beyond the others in sampled collectives; rise: its collectives' shortest kernel grew)."},
    {"rankscope_fleet_members",
     Type::gauge,
     "",
     {},
     "Collectors in the fleet as this collector last read them from etcd (--etcd; no series for a collector alone)."},
    {"rankscope_fleet_etcd_up",
     Type::gauge,
     "",
     {},
     "1 when this collector's last exchange with etcd succeeded, 0 when etcd was out of reach or would not register it "
     "(its --collector-id taken); it goes on with the members it last read. No series for a collector alone."},
    {"rankscope_fleet_registrations_total",
     Type::counter,
     "",
     {},
     "Leases this collector was granted in etcd: past 1, it lost its lease (etcd out of reach longer than "
     "--lease-ttl-s, or revoked) and registered again."},
    {"rankscope_alertmanager_posts_total",
     Type::counter,
     "",
     {"result"},
     "Posts of alerts to Alertmanager, by result (ok, failed)."},
    {"rankscope_handshakes_total",
     Type::counter,
     "",
     {"result"},
     "CurveZMQ handshakes on the agent, clock and query sockets, by the allow-list's answer (admitted, refused)."},
    {"rankscope_throttled_messages_total",
     Type::counter,
     "",
     {"socket"},
     "Messages dropped over the per-key rate limit, by socket (agent, query)."},
    {"rankscope_clock_probes_total",
     Type::counter,
     "",
     {"socket", "result"},
     "Clock probes of the agents, by the socket that took them (clock: their own, answered on a thread that nothing "
     "queues ahead of; agent: the agents' socket, for agents that cannot reach the clock port) and result (answered; "
     "dropped: over 20 a second per key, or not a probe)."},
    {"rankscope_metrics_series_dropped_total",
     Type::counter,
     "",
     {},
     "Metric updates dropped because their node or communicator series would pass the series limit."},
    {"rankscope_tenant_gpu_seconds_total",
     Type::counter,
     "seconds",
     {"account"},
     "GPU-seconds held by the processes of a Slurm account since the collector started (the first 20 accounts "
     "seen; the rest add up in account=\"other\"; \"(unknown)\" for processes without one)."},
    {"rankscope_tenant_waste_gpu_seconds_total",
     Type::counter,
     "seconds",
     {"account"},
     "GPU-seconds an account's ranks spent waiting on stragglers and hangs (same accounts as the GPU-seconds)."},
    {"rankscope_tenant_caused_waste_gpu_seconds_total",
     Type::counter,
     "seconds",
     {"account"},
     "GPU-seconds other ranks spent waiting on an account's ranks or on its CPU use as a neighbour."},
    {"rankscope_node_unacked_batches",
     Type::gauge,
     "",
     {"node"},
     "Batches the node's agent has sent or spooled and the collector has not acknowledged yet, at its last heartbeat "
     "(grows while the collector falls behind or cannot write its database)."},
    {"rankscope_findings_waste_gpu_seconds",
     Type::gauge,
     "seconds",
     {"kind", "job_name"},
     "GPU-seconds lost so far to the job's open findings of a kind (waiting on a straggler, idle in a hang); a "
     "series goes once none of that kind is open."},
    {"rankscope_collector_loop_seconds_total",
     Type::counter,
     "seconds",
     {"phase"},
     "Time the collector's loop (one thread) spent, by phase: agents (reading and applying their messages), "
     "evaluate (the detectors and the usage ledger, every 500 ms, and the straggler detector's scoring of settled "
     "collectives between batches), commit (staging each database write; the write "
     "runs on a thread of its own), queries. Their summed rate near 1 is a loop with no time to spare: agents wait "
     "for acks, and clock probes for answers."},
    {"rankscope_collector_last_evaluation_seconds",
     Type::gauge,
     "seconds",
     {},
     "How long the last evaluation took; the loop takes in nothing meanwhile."},
};
// clang-format on
static_assert(std::size(kCatalogue) == static_cast<size_t>(MetricId::count));

// Issue lateness spans a few microseconds of noise to seconds-long stalls.
const std::vector<double> kLatenessBuckets = {10e-6, 30e-6, 100e-6, 300e-6, 1e-3, 3e-3, 10e-3,
                                              30e-3, 0.1,   0.3,    1,      3,    10,   30};


const MetricInfo& info(MetricId id) {
  return kCatalogue[static_cast<size_t>(id)];
}

prometheus::Family<prometheus::Gauge>& gauges(prometheus::Registry& registry, MetricId id) {
  return prometheus::BuildGauge().Name(info(id).name).Help(info(id).help).Register(registry);
}

prometheus::Family<prometheus::Counter>& counters(prometheus::Registry& registry, MetricId id) {
  return prometheus::BuildCounter().Name(info(id).name).Help(info(id).help).Register(registry);
}

prometheus::Counter& counter(prometheus::Registry& registry, MetricId id) {
  return counters(registry, id).Add({});
}

struct ListenAddress {
  std::string host, port;
};

// civetweb (prometheus-cpp's server) takes "HOST:PORT" with HOST an address;
// it does not resolve names, and it reads commas and suffixes as options.
Result<ListenAddress> parse_listen_address(const std::string& host_port) {
  auto bad = [&] {
    return make_error(Errc::invalid_argument, "metrics address '" + host_port +
                                                  "': expected HOST:PORT with HOST an IP address, e.g. 0.0.0.0:9464 "
                                                  "or 127.0.0.1:0 (0: any free port)");
  };
  size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return bad();
  ListenAddress address{host_port.substr(0, colon), host_port.substr(colon + 1)};
  if (address.host.size() > 2 && address.host.front() == '[' && address.host.back() == ']')
    address.host = address.host.substr(1, address.host.size() - 2);
  unsigned char ip[sizeof(in6_addr)];
  bool is_ip = inet_pton(AF_INET, address.host.c_str(), ip) == 1 || inet_pton(AF_INET6, address.host.c_str(), ip) == 1;
  unsigned port = 0;
  auto [end, ec] = std::from_chars(address.port.data(), address.port.data() + address.port.size(), port);
  bool port_ok =
      !address.port.empty() && ec == std::errc() && end == address.port.data() + address.port.size() && port <= 65535;
  if (!is_ip || !port_ok) return bad();
  return address;
}

// civetweb only says that it could not bind; binding a socket the way it
// does (SO_REUSEADDR) tells the operator why.
std::string bind_failure_reason(const ListenAddress& address) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(address.host.c_str(), address.port.c_str(), &hints, &found); rc != 0)
    return gai_strerror(rc);
  std::string reason = "the HTTP server could not listen there (it gives no reason)";
  int fd = socket(found->ai_family, found->ai_socktype, found->ai_protocol);
  int one = 1;
  if (fd < 0) {
    reason = strerror(errno);
  } else {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, found->ai_addr, found->ai_addrlen) != 0) reason = strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  return reason;
}

}  // namespace

const char* metric_type_name(MetricType type) {
  switch (type) {
    case MetricType::counter:
      return "counter";
    case MetricType::gauge:
      return "gauge";
    case MetricType::histogram:
      return "histogram";
  }
  return "?";
}

std::span<const MetricInfo> metric_catalogue() {
  return kCatalogue;
}

Result<std::unique_ptr<Metrics>> Metrics::start(const std::string& host_port, size_t max_series) {
  auto address = parse_listen_address(host_port);
  if (!address) return address.error();
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(host_port);
  } catch (const std::exception&) {
    return make_error(Errc::io, "cannot serve metrics on " + host_port + ": " + bind_failure_reason(*address));
  }
  return std::unique_ptr<Metrics>(new Metrics(std::move(exposer), max_series));
}

Metrics::Metrics(std::unique_ptr<prometheus::Exposer> exposer, size_t max_series)
    : registry_(std::make_shared<prometheus::Registry>()), exposer_(std::move(exposer)), max_series_(max_series) {
  prometheus::Registry& r = *registry_;
  // Every kind has a series from the start: "no hang open" reads as 0, not as no data.
  auto& open = gauges(r, MetricId::findings_open);
  auto& opened = counters(r, MetricId::findings_opened);
  for (FindingKind kind : kAllFindingKinds) {
    findings_open_[static_cast<size_t>(kind)] = &open.Add({{"kind", finding_kind_name(kind)}});
    findings_opened_[static_cast<size_t>(kind)] = &opened.Add({{"kind", finding_kind_name(kind)}});
  }
  node_up_ = &gauges(r, MetricId::node_up);
  node_last_contact_ = &gauges(r, MetricId::node_last_contact);
  node_clock_offset_ = &gauges(r, MetricId::node_clock_offset);
  node_clock_uncertainty_ = &gauges(r, MetricId::node_clock_uncertainty);
  node_clock_drift_ = &gauges(r, MetricId::node_clock_drift);
  node_wall_clock_skew_ = &gauges(r, MetricId::node_wall_clock_skew);
  agent_drops_ = &counters(r, MetricId::agent_drops);
  node_bad_messages_ = &counters(r, MetricId::node_bad_messages);
  node_refused_claims_ = &counters(r, MetricId::node_refused_claims);
  comm_last_sequence_ = &gauges(r, MetricId::comm_last_sequence);
  const MetricInfo& lateness = info(MetricId::collective_issue_lateness);
  issue_lateness_ =
      &prometheus::BuildHistogram().Name(lateness.name).Help(lateness.help).Register(r).Add({}, kLatenessBuckets);
  detector_incomplete_.counter = &counter(r, MetricId::detector_incomplete);
  ingest_batches_.counter = &counter(r, MetricId::ingest_batches);
  ingest_records_.counter = &counter(r, MetricId::ingest_records);
  ingest_duplicate_batches_.counter = &counter(r, MetricId::ingest_duplicate_batches);
  ingest_held_batches_.counter = &counter(r, MetricId::ingest_held_batches);
  commit_failures_.counter = &counter(r, MetricId::commit_failures);
  ingest_bad_messages_.counter = &counter(r, MetricId::ingest_bad_messages);
  ingest_bytes_.counter = &counter(r, MetricId::ingest_bytes);
  auto& splits = counters(r, MetricId::split_children);
  splits_sized_.counter = &splits.Add({{"result", "sized"}});
  splits_abandoned_.counter = &splits.Add({{"result", "abandoned"}});
  split_waits_.counter = &counter(r, MetricId::ingest_split_waits);
  auto& gpu = counters(r, MetricId::ingest_gpu_records);
  gpu_taken_.counter = &gpu.Add({{"result", "taken"}});
  gpu_unmatched_.counter = &gpu.Add({{"result", "unmatched"}});
  detail_comms_ = &gauges(r, MetricId::detail_comms).Add({});
  fleet_members_family_ = &gauges(r, MetricId::fleet_members);
  fleet_etcd_up_family_ = &gauges(r, MetricId::fleet_etcd_up);
  fleet_registrations_family_ = &counters(r, MetricId::fleet_registrations);
  auto& detail = counters(r, MetricId::detail_requests);
  detail_finding_.counter = &detail.Add({{"reason", "finding"}});
  detail_link_.counter = &detail.Add({{"reason", "link"}});
  detail_rise_.counter = &detail.Add({{"reason", "rise"}});
  auto& posts = counters(r, MetricId::alertmanager_posts);
  alert_posts_ok_.counter = &posts.Add({{"result", "ok"}});
  alert_posts_failed_.counter = &posts.Add({{"result", "failed"}});
  auto& handshakes = counters(r, MetricId::handshakes);
  handshakes_admitted_.counter = &handshakes.Add({{"result", "admitted"}});
  handshakes_refused_.counter = &handshakes.Add({{"result", "refused"}});
  auto& throttled = counters(r, MetricId::throttled_messages);
  throttled_agent_.counter = &throttled.Add({{"socket", "agent"}});
  throttled_query_.counter = &throttled.Add({{"socket", "query"}});
  auto& probes = counters(r, MetricId::clock_probes);
  probes_clock_.counter = &probes.Add({{"socket", "clock"}, {"result", "answered"}});
  probes_clock_dropped_.counter = &probes.Add({{"socket", "clock"}, {"result", "dropped"}});
  probes_agent_.counter = &probes.Add({{"socket", "agent"}, {"result", "answered"}});
  series_dropped_ = &counter(r, MetricId::metrics_series_dropped);
  tenant_gpu_ = &counters(r, MetricId::tenant_gpu);
  tenant_waste_ = &counters(r, MetricId::tenant_waste);
  tenant_caused_ = &counters(r, MetricId::tenant_caused_waste);
  node_unacked_batches_ = &gauges(r, MetricId::node_unacked_batches);
  findings_waste_ = &gauges(r, MetricId::findings_waste_gpu_seconds);
  auto& loop = counters(r, MetricId::collector_loop);
  for (size_t phase = 0; phase < kLoopPhases; ++phase)
    loop_[phase].counter = &loop.Add({{"phase", kLoopPhaseNames[phase]}});
  last_evaluation_ = &gauges(r, MetricId::collector_last_evaluation).Add({});

  exposer_->RegisterCollectable(registry_);
  auto ports = exposer_->GetListeningPorts();
  if (!ports.empty()) port_ = static_cast<uint16_t>(ports.front());
}

Metrics::~Metrics() = default;

template <typename T>
T* Metrics::add_series(prometheus::Family<T>& family, const std::map<std::string, std::string>& labels) {
  if (series_ >= max_series_) {
    series_dropped_->Increment();
    if (!warned_series_limit_) {
      RS_LOG(warn,
             "metrics: %zu node and communicator series in use, the limit; updates needing more are dropped "
             "(rankscope_metrics_series_dropped_total)",
             max_series_);
      warned_series_limit_ = true;
    }
    return nullptr;
  }
  ++series_;
  std::map<std::string, std::string> valid;
  for (const auto& [name, value] : labels) valid.emplace(name, valid_utf8(value));
  return &family.Add(valid);
}

void Metrics::set_node_gauge(prometheus::Gauge*& gauge, prometheus::Family<prometheus::Gauge>& family,
                             const std::string& node, double value) {
  if (!gauge) gauge = add_series(family, {{"node", node}});
  if (gauge) gauge->Set(value);
}

// Totals restart from zero when their source restarts (an agent's drop
// counts); then the whole new total is growth, as Prometheus reads resets.
void Metrics::advance(CounterTotal& counter, uint64_t total) {
  counter.counter->Increment(static_cast<double>(total >= counter.last ? total - counter.last : total));
  counter.last = total;
}

void Metrics::set_tenant_usage(const std::string& account, double gpu_seconds, double waste_seconds,
                               double caused_seconds) {
  TenantLast& last = tenant_last_[account];
  // The first kTenantSeries accounts keep series of their own, for good:
  // "other" then only ever grows, as a counter must.
  std::string label = valid_utf8(account);
  if (!tenant_series_.count(label)) {
    if (tenant_series_.size() >= kTenantSeries) label = "other";
    if (!tenant_series_.count(label)) {
      TenantSeries& series = tenant_series_[label];
      series.gpu = &tenant_gpu_->Add({{"account", label}});
      series.waste = &tenant_waste_->Add({{"account", label}});
      series.caused = &tenant_caused_->Add({{"account", label}});
    }
  }
  TenantSeries& series = tenant_series_.at(label);
  series.gpu->Increment(std::max(0.0, gpu_seconds - last.gpu));
  series.waste->Increment(std::max(0.0, waste_seconds - last.waste));
  series.caused->Increment(std::max(0.0, caused_seconds - last.caused));
  last.gpu = std::max(last.gpu, gpu_seconds);
  last.waste = std::max(last.waste, waste_seconds);
  last.caused = std::max(last.caused, caused_seconds);
}

void Metrics::set_open_findings(FindingKind kind, size_t open) {
  findings_open_[static_cast<size_t>(kind)]->Set(static_cast<double>(open));
}

void Metrics::count_opened(FindingKind kind) {
  findings_opened_[static_cast<size_t>(kind)]->Increment();
}

void Metrics::set_node_clock(const std::string& node, double offset_seconds, double uncertainty_seconds,
                             double drift_ratio, double wall_skew_seconds) {
  NodeSeries& series = nodes_[node];
  set_node_gauge(series.clock_offset, *node_clock_offset_, node, offset_seconds);
  set_node_gauge(series.clock_uncertainty, *node_clock_uncertainty_, node, uncertainty_seconds);
  set_node_gauge(series.clock_drift, *node_clock_drift_, node, drift_ratio);
  set_node_gauge(series.wall_clock_skew, *node_wall_clock_skew_, node, wall_skew_seconds);
}

void Metrics::set_node_up(const std::string& node, bool up) {
  set_node_gauge(nodes_[node].up, *node_up_, node, up ? 1 : 0);
}

void Metrics::set_node_unacked_batches(const std::string& node, uint32_t batches) {
  set_node_gauge(nodes_[node].unacked_batches, *node_unacked_batches_, node, batches);
}

void Metrics::set_findings_waste_gpu_seconds(const std::map<std::pair<FindingKind, std::string>, double>& lost) {
  for (auto it = findings_waste_series_.begin(); it != findings_waste_series_.end();) {
    if (lost.count(it->first)) {
      ++it;
      continue;
    }
    findings_waste_->Remove(it->second);
    --series_;
    it = findings_waste_series_.erase(it);
  }
  for (const auto& [key, hours] : lost) {
    prometheus::Gauge*& gauge = findings_waste_series_[key];
    if (!gauge)
      gauge = add_series(*findings_waste_, {{"kind", finding_kind_name(key.first)}, {"job_name", key.second}});
    if (gauge) gauge->Set(hours);
    else findings_waste_series_.erase(key);
  }
}

void Metrics::set_node_last_contact(const std::string& node, double unix_seconds) {
  set_node_gauge(nodes_[node].last_contact, *node_last_contact_, node, unix_seconds);
}

void Metrics::set_node_drops(const std::string& node, const std::string& reason, uint64_t total) {
  CounterTotal& drops = nodes_[node].drops[reason];
  if (!drops.counter) drops.counter = add_series(*agent_drops_, {{"node", node}, {"reason", reason}});
  if (drops.counter) advance(drops, total);
}

void Metrics::set_node_bad_messages(const std::string& node, uint64_t total) {
  CounterTotal& bad = nodes_[node].bad_messages;
  if (!bad.counter) bad.counter = add_series(*node_bad_messages_, {{"node", node}});
  if (bad.counter) advance(bad, total);
}

void Metrics::set_node_refused_claims(const std::string& node, uint64_t total) {
  CounterTotal& refused = nodes_[node].refused_claims;
  if (!refused.counter) refused.counter = add_series(*node_refused_claims_, {{"node", node}});
  if (refused.counter) advance(refused, total);
}

void Metrics::set_comm_progress(const std::string& job, const std::string& comm_hex, int32_t rank, int64_t last_seq) {
  RankSeries& series = comms_[comm_hex][rank];
  if (series.last_sequence && series.job != job) {
    // The job's name became known (or changed): keep one series per rank, under the newest name.
    comm_last_sequence_->Remove(series.last_sequence);
    series.last_sequence = nullptr;
    --series_;
  }
  if (!series.last_sequence) {
    series.job = job;
    series.last_sequence =
        add_series(*comm_last_sequence_, {{"job_name", job}, {"comm", comm_hex}, {"rank", std::to_string(rank)}});
  }
  if (series.last_sequence) series.last_sequence->Set(static_cast<double>(last_seq));
}

void Metrics::forget_comm(const std::string& comm_hex) {
  auto it = comms_.find(comm_hex);
  if (it == comms_.end()) return;
  for (auto& [rank, series] : it->second) {
    if (!series.last_sequence) continue;
    comm_last_sequence_->Remove(series.last_sequence);
    --series_;
  }
  comms_.erase(it);
}

void Metrics::observe_lateness(double seconds) {
  issue_lateness_->Observe(seconds);
}

void Metrics::set_ingest_totals(uint64_t batches, uint64_t records, uint64_t duplicate_batches, uint64_t bad_messages,
                                uint64_t batch_bytes) {
  advance(ingest_batches_, batches);
  advance(ingest_records_, records);
  advance(ingest_duplicate_batches_, duplicate_batches);
  advance(ingest_bad_messages_, bad_messages);
  advance(ingest_bytes_, batch_bytes);
}

void Metrics::set_commit_totals(uint64_t failures, uint64_t held_batches) {
  advance(commit_failures_, failures);
  advance(ingest_held_batches_, held_batches);
}

void Metrics::set_security_totals(uint64_t admitted, uint64_t refused, uint64_t agent_throttled,
                                  uint64_t query_throttled) {
  advance(handshakes_admitted_, admitted);
  advance(handshakes_refused_, refused);
  advance(throttled_agent_, agent_throttled);
  advance(throttled_query_, query_throttled);
}

void Metrics::set_clock_probes(uint64_t apart, uint64_t apart_dropped, uint64_t on_agent_socket) {
  advance(probes_clock_, apart);
  advance(probes_clock_dropped_, apart_dropped);
  advance(probes_agent_, on_agent_socket);
}

void Metrics::set_detector_totals(uint64_t incomplete) {
  advance(detector_incomplete_, incomplete);
}

void Metrics::set_loop_time(const std::array<uint64_t, kLoopPhases>& total_ns, uint64_t last_evaluation_ns) {
  for (size_t phase = 0; phase < kLoopPhases; ++phase) {
    CounterTotal& counter = loop_[phase];
    if (total_ns[phase] > counter.last)
      counter.counter->Increment(static_cast<double>(total_ns[phase] - counter.last) / 1e9);
    counter.last = total_ns[phase];
  }
  last_evaluation_->Set(static_cast<double>(last_evaluation_ns) / 1e9);
}

void Metrics::set_split_totals(uint64_t sized, uint64_t abandoned, uint64_t waits) {
  advance(splits_sized_, sized);
  advance(splits_abandoned_, abandoned);
  advance(split_waits_, waits);
}

void Metrics::set_gpu_totals(uint64_t taken, uint64_t unmatched) {
  advance(gpu_taken_, taken);
  advance(gpu_unmatched_, unmatched);
}

void Metrics::set_fleet(size_t members, bool etcd_ok, uint64_t registrations) {
  if (!fleet_members_) {  // the first time: a collector alone has no such series
    fleet_members_ = &fleet_members_family_->Add({});
    fleet_etcd_up_ = &fleet_etcd_up_family_->Add({});
    fleet_registrations_.counter = &fleet_registrations_family_->Add({});
  }
  fleet_members_->Set(static_cast<double>(members));
  fleet_etcd_up_->Set(etcd_ok ? 1 : 0);
  advance(fleet_registrations_, registrations);
}

void Metrics::set_detail(size_t comms, uint64_t for_finding, uint64_t for_link, uint64_t for_rise) {
  detail_comms_->Set(static_cast<double>(comms));
  advance(detail_finding_, for_finding);
  advance(detail_link_, for_link);
  advance(detail_rise_, for_rise);
}

void Metrics::set_alert_posts(uint64_t ok, uint64_t failed) {
  advance(alert_posts_ok_, ok);
  advance(alert_posts_failed_, failed);
}

}  // namespace rankscope::collector
