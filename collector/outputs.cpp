#include "collector/outputs.h"

#include <fstream>
#include <iterator>
#include <set>

#include "collector/alert/alertmanager.h"
#include "collector/alert/drain.h"
#include "collector/commit.h"
#include "collector/detect/detail.h"
#include "collector/detect/detector.h"
#include "collector/detect/findings.h"
#include "collector/ingest/ingest.h"
#include "collector/metrics.h"
#include "collector/usage/ledger.h"
#include "common/drops.h"
#include "common/format.h"
#include "common/log.h"

namespace rankscope::collector {

namespace {
// Resolved findings still handed to the Alertmanager client (it repeats a resolution once).
constexpr uint64_t kAlertResolvedWindowNs = 600'000'000'000ull;

// Mirrors the collector's state into the Prometheus exposition (--metrics).
class MetricsOutput final : public Output {
 public:
  // `alerts`: the Alertmanager output whose posts are counted, if any.
  MetricsOutput(std::unique_ptr<Metrics> metrics, const AlertmanagerClient* alerts)
      : owned_(std::move(metrics)), metrics_(*owned_), alerts_(alerts) {}

  void publish(const Evaluated& e) override {
    update(e.ingest, e.findings, e.detector, e.now_ns, e.liveness_ns);
    for (const auto& [account, totals] : e.ledger.totals(TenantKey::account))
      metrics_.set_tenant_usage(account, totals.gpu_s, totals.waste_s, totals.caused_s);
    if (alerts_) metrics_.set_alert_posts(alerts_->posts_ok(), alerts_->posts_failed());
    metrics_.set_security_totals(e.keys_admitted, e.keys_refused, e.ingest.counters().throttled_messages,
                                 e.queries_throttled);
    metrics_.set_clock_probes(e.clock_probes_apart, e.clock_probes_apart_dropped, e.ingest.counters().clock_probes);
    metrics_.set_commit_totals(e.commit.failures(), e.ingest.counters().held_batches);
    const IngestCounters& counters = e.ingest.counters();
    metrics_.set_split_totals(counters.splits_sized, counters.splits_abandoned, counters.split_waits);
    metrics_.set_gpu_totals(counters.gpu_records, counters.gpu_unmatched);
    const DetailPolicy::Counts& detail = e.detail.counts();
    metrics_.set_detail(e.detail.wanted_comms(), detail.finding, detail.link, detail.rise);
    if (e.fleet) metrics_.set_fleet(e.fleet->members, e.fleet->etcd_ok, e.fleet->registrations);
    static_assert(LoopTime::phases == Metrics::kLoopPhases);
    metrics_.set_loop_time(e.loop.total_ns, e.loop.last_evaluation_ns);
  }

 private:
  void update(const Ingest& ingest, const FindingBook& findings, Detector& detector, uint64_t now_ns,
              uint64_t liveness_ns) {
    for (FindingKind kind : kAllFindingKinds)
      metrics_.set_open_findings(kind, findings.open_count(kind));
    for (const Finding* f : findings.all()) {
      if (f->id <= newest_finding_) break;  // newest first
      metrics_.count_opened(f->kind);
    }
    if (auto all = findings.all(); !all.empty()) newest_finding_ = std::max(newest_finding_, all.front()->id);
    // GPU-seconds lost to open findings, per job: a straggler's as its
    // finding counts them; a hang's, every rank of its communicator idle
    // since it opened.
    std::map<std::pair<FindingKind, std::string>, double> lost;
    for (const Finding* f : findings.open()) {
      double seconds = f->gpu_hours_lost * 3600;
      if (f->kind == FindingKind::hang) {
        auto comm = ingest.comms().find(f->comm);
        int32_t ranks = comm == ingest.comms().end() ? 0 : std::max(0, comm->second.nranks);
        seconds = now_ns > f->opened_ns ? static_cast<double>(now_ns - f->opened_ns) / 1e9 * ranks : 0;
      }
      if (f->kind == FindingKind::hang || f->kind == FindingKind::straggler)
        lost[{f->kind, f->job.empty() ? "(unknown)" : f->job}] += seconds;
    }
    metrics_.set_findings_waste_gpu_seconds(lost);
    for (const auto& [name, node] : ingest.nodes()) {
      metrics_.set_node_clock(name, static_cast<double>(node.clock.offset_ns()) / 1e9,
                              static_cast<double>(node.clock.uncertainty_ns()) / 1e9, node.clock.drift_ppb() / 1e9,
                              static_cast<double>(node.wall_offset_ns - node.clock.offset_ns()) / 1e9);
      metrics_.set_node_up(name, node.last_contact_ns != 0 && now_ns - node.last_contact_ns < liveness_ns);
      metrics_.set_node_unacked_batches(name, node.unacked_batches);
      metrics_.set_node_last_contact(name, static_cast<double>(node.last_contact_ns) / 1e9);
      for (const DropReason& reason : kDropReasons)
        metrics_.set_node_drops(name, std::string(reason.name), node.drops.*reason.count);
      metrics_.set_node_bad_messages(name, node.bad_messages);
      metrics_.set_node_refused_claims(name, node.refused_claims);
    }
    // Series of communicators ended or retired go.
    for (auto it = exported_comms_.begin(); it != exported_comms_.end();) {
      if (ingest.live(*it)) {
        ++it;
        continue;
      }
      metrics_.forget_comm(hex64(*it));
      it = exported_comms_.erase(it);
    }
    for (const auto& [hash, comm] : ingest.comms()) {
      std::string hex = hex64(hash);
      if (comm.ended) continue;
      exported_comms_.insert(hash);
      for (const auto& [rank, member] : comm.members) metrics_.set_comm_progress(comm.job, hex, rank, member.last_seq);
    }
    for (double lateness : detector.take_lateness_samples()) metrics_.observe_lateness(lateness);
    metrics_.set_detector_totals(detector.scored_incomplete());
    const IngestCounters& c = ingest.counters();
    metrics_.set_ingest_totals(c.batches_stored, c.records_stored, c.duplicate_batches, c.bad_messages, c.batch_bytes);
  }

  std::unique_ptr<Metrics> owned_;
  Metrics& metrics_;
  const AlertmanagerClient* alerts_;
  uint64_t newest_finding_ = 0;
  std::set<uint64_t> exported_comms_;
};

// Pushes the findings to the Alertmanager (--alertmanager).
class AlertmanagerOutput final : public Output {
 public:
  explicit AlertmanagerOutput(std::unique_ptr<AlertmanagerClient> client) : client_(std::move(client)) {}
  void publish(const Evaluated& e) override {
    client_->sync(e.findings.for_alerts(e.now_ns - kAlertResolvedWindowNs), e.now_ns);
  }
  const AlertmanagerClient& client() const { return *client_; }

 private:
  std::unique_ptr<AlertmanagerClient> client_;
};

// Drains a node that straggles in several jobs (--drain-after-jobs).
class DrainOutput final : public Output {
 public:
  explicit DrainOutput(DrainOptions options) : drainer_(std::move(options)) {}
  void publish(const Evaluated& e) override { drainer_.evaluate(e.findings.all(), e.now_ns); }

 private:
  NodeDrainer drainer_;
};

// A secret's file: its content less a trailing newline; never empty.
Result<std::string> read_secret(const std::string& path, const char* option) {
  std::ifstream in(path);
  if (!in) return make_error(Errc::io, std::string(option) + " " + path + ": cannot be read");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (text.empty()) return make_error(Errc::invalid_argument, std::string(option) + " " + path + " is empty");
  return text;
}

// How the collector reaches Alertmanager: TLS files and credentials.
Result<HttpClientOptions> alertmanager_http(const Options& options) {
  HttpClientOptions http;
  for (const auto& [path, option] : {std::pair{&options.alertmanager_ca_file, "--alertmanager-ca-file"},
                                     {&options.alertmanager_cert_file, "--alertmanager-cert-file"},
                                     {&options.alertmanager_key_file, "--alertmanager-key-file"}})
    if (!path->empty() && !std::ifstream(*path))
      return make_error(Errc::io, std::string(option) + " " + *path + ": cannot be read");
  http.ca_file = options.alertmanager_ca_file;
  http.cert_file = options.alertmanager_cert_file;
  http.key_file = options.alertmanager_key_file;
  if (!options.alertmanager_bearer_token_file.empty()) {
    auto token = read_secret(options.alertmanager_bearer_token_file, "--alertmanager-bearer-token-file");
    if (!token) return token.error();
    http.bearer_token = std::move(*token);
  }
  if (!options.alertmanager_basic_auth_user.empty()) {
    auto password = read_secret(options.alertmanager_password_file, "--alertmanager-password-file");
    if (!password) return password.error();
    http.username = options.alertmanager_basic_auth_user;
    http.password = std::move(*password);
  }
  return http;
}

}  // namespace

std::optional<Outputs> start_outputs(const Options& options, const std::string& fleet_id) {
  Outputs out;
  // Bound first: a port in use is the likeliest failure, said before anything else starts.
  std::unique_ptr<Metrics> metrics;
  if (!options.metrics.empty()) {
    auto started = Metrics::start(options.metrics);
    if (!started) {
      RS_LOG(error, "--metrics %s: %s", options.metrics.c_str(), started.error().message.c_str());
      return std::nullopt;
    }
    metrics = std::move(*started);
    RS_LOG(info, "Prometheus metrics on %s (port %u)", options.metrics.c_str(), metrics->port());
  }
  const AlertmanagerClient* alerts = nullptr;
  if (!options.alertmanager.empty()) {
    auto http = alertmanager_http(options);
    if (!http) {
      RS_LOG(error, "--alertmanager: %s", http.error().message.c_str());
      return std::nullopt;
    }
    AlertmanagerOptions alert_options;
    alert_options.http = std::move(*http);
    alert_options.collector_id = fleet_id;
    auto created = AlertmanagerClient::create(options.alertmanager, alert_options);
    if (!created) {
      RS_LOG(error, "--alertmanager %s: %s", options.alertmanager.c_str(), created.error().message.c_str());
      return std::nullopt;
    }
    auto output = std::make_unique<AlertmanagerOutput>(std::move(*created));
    alerts = &output->client();
    out.push_back(std::move(output));
    RS_LOG(info, "pushing findings to the Alertmanager at %s", options.alertmanager.c_str());
  }
  if (options.drain_after_jobs > 0) {
    out.push_back(std::make_unique<DrainOutput>(DrainOptions{options.drain_after_jobs,
                                                             static_cast<uint64_t>(options.drain_window_h * 3600e9),
                                                             options.drain_command, options.drain_dry_run}));
    RS_LOG(info, "a node straggling in %u jobs within %.0f h will be drained with %s%s", options.drain_after_jobs,
           options.drain_window_h, options.drain_command.c_str(),
           options.drain_dry_run ? " (dry run: logged only)" : "");
  }
  // Last: it counts what the others did this round.
  if (metrics) out.push_back(std::make_unique<MetricsOutput>(std::move(metrics), alerts));
  return out;
}

}  // namespace rankscope::collector
