#pragma once
// The collector's Prometheus metrics, served on GET /metrics.
//
// One catalogue (name, type, unit, labels, help) is the source for the code
// that registers the metrics, for docs/metrics.md and for the test that
// checks both against the exposition (tests/alert/metrics_test.cpp).
//
// Series labelled by node or communicator grow with the cluster, so they
// share a budget; past it, updates that would create a series are dropped
// and counted, never silently.
#include <array>
#include <iterator>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "collector/detect/finding.h"
#include "common/result.h"

namespace prometheus {
class Counter;
class Exposer;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace rankscope::collector {

enum class MetricType { counter, gauge, histogram };
const char* metric_type_name(MetricType type);  // "counter", "gauge", "histogram"

struct MetricInfo {
  const char* name;
  MetricType type;
  const char* unit;  // the base unit in the name ("seconds", "bytes"); "" for counts and states
  std::vector<std::string> labels;
  const char* help;
};

// Every metric the collector exports.
std::span<const MetricInfo> metric_catalogue();

// Registers the catalogue and serves it. Calls come from one thread (the
// collector loop); scrapes run on the server's own threads.
class Metrics {
 public:
  // A cluster of 1,000 nodes and 8,000 ranks in one communicator each needs
  // about 6 x 1,000 node series, 4 x 1,000 drop series and 8,000 rank series;
  // 20,000 leaves room for a few more communicators per rank and keeps one
  // scrape to a few megabytes.
  static constexpr size_t kDefaultMaxSeries = 20000;

  // Serves GET /metrics on HOST:PORT, HOST an IP address ("0.0.0.0:9464");
  // port 0 takes a free port (see port()).
  static Result<std::unique_ptr<Metrics>> start(const std::string& host_port, size_t max_series = kDefaultMaxSeries);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  uint16_t port() const { return port_; }

  void set_open_findings(FindingKind kind, size_t open);
  void count_opened(FindingKind kind);

  // Seconds: offset (cluster time = node time + offset) and its uncertainty;
  // wall skew is the node's own wall clock minus the cluster clock.
  void set_node_clock(const std::string& node, double offset_seconds, double uncertainty_seconds, double drift_ratio,
                      double wall_skew_seconds);
  void set_node_up(const std::string& node, bool up);
  void set_node_last_contact(const std::string& node, double unix_seconds);
  // What the node's agent had not had acknowledged at its last heartbeat.
  void set_node_unacked_batches(const std::string& node, uint32_t batches);
  // GPU-seconds lost to the open findings, by kind and job; series of pairs
  // missing here are removed.
  void set_findings_waste_gpu_seconds(const std::map<std::pair<FindingKind, std::string>, double>& lost);
  // `total`: the agent's running count for `reason` (a name in
  // common/drops.h); a smaller total than before means the
  // agent restarted and counts from zero again.
  void set_node_drops(const std::string& node, const std::string& reason, uint64_t total);
  // `total`: the collector's running count of the node's refused messages.
  void set_node_bad_messages(const std::string& node, uint64_t total);
  void set_node_refused_claims(const std::string& node, uint64_t total);

  void set_comm_progress(const std::string& job, const std::string& comm_hex, int32_t rank, int64_t last_seq);
  // Removes the communicator's series (it was destroyed).
  void forget_comm(const std::string& comm_hex);

  void observe_lateness(double seconds);

  // Running totals since the collector started; only their growth is added.
  void set_ingest_totals(uint64_t batches, uint64_t records, uint64_t duplicate_batches, uint64_t bad_messages,
                         uint64_t batch_bytes);
  void set_alert_posts(uint64_t ok, uint64_t failed);
  // Collectives the straggler detector scored without a missing batch (Detector::scored_incomplete).
  void set_detector_totals(uint64_t incomplete);
  // CurveZMQ handshakes the allow-list admitted and refused, and messages
  // dropped over the rate limit on each socket.
  // Failed commits (Commit::failures) and batches held back meanwhile (IngestCounters::held_batches).
  void set_commit_totals(uint64_t failures, uint64_t held_batches);
  // Split children sized and abandoned, and batches sent back to wait for one (IngestCounters).
  void set_split_totals(uint64_t sized, uint64_t abandoned, uint64_t waits);
  void set_gpu_totals(uint64_t taken, uint64_t unmatched);
  // NCCL's proxy steps asked for (collector/detect/detail.h): communicators
  // now, and the times one became wanted, by reason.
  void set_detail(size_t comms, uint64_t for_finding, uint64_t for_link, uint64_t for_rise);
  // A collector in a fleet (collector/fleet/membership.h): the members it
  // last read, whether its last exchange with etcd succeeded, the leases it
  // was granted. Never called for a collector alone, which has no such series.
  void set_fleet(size_t members, bool etcd_ok, uint64_t registrations);
  void set_security_totals(uint64_t admitted, uint64_t refused, uint64_t agent_throttled, uint64_t query_throttled);
  // Clock probes answered and dropped on their own socket, and answered on the agents'.
  void set_clock_probes(uint64_t apart, uint64_t apart_dropped, uint64_t on_agent_socket);
  // The collector loop's time by phase since it started (ns; LoopPhase
  // order), and how long its last evaluation took.
  static constexpr size_t kLoopPhases = 4;
  static constexpr std::array<const char*, kLoopPhases> kLoopPhaseNames = {"agents", "evaluate", "commit", "queries"};
  void set_loop_time(const std::array<uint64_t, kLoopPhases>& total_ns, uint64_t last_evaluation_ns);

  // Running totals of one Slurm account since the collector started (the
  // usage ledger's); only their growth is added. The first kTenantSeries
  // accounts get series of their own, every later one adds to "other".
  static constexpr size_t kTenantSeries = 20;
  void set_tenant_usage(const std::string& account, double gpu_seconds, double waste_seconds, double caused_seconds);

 private:
  // A counter fed from a running total kept elsewhere.
  struct CounterTotal {
    prometheus::Counter* counter = nullptr;
    uint64_t last = 0;
  };
  struct NodeSeries {
    prometheus::Gauge* up = nullptr;
    prometheus::Gauge* last_contact = nullptr;
    prometheus::Gauge* clock_offset = nullptr;
    prometheus::Gauge* clock_uncertainty = nullptr;
    prometheus::Gauge* clock_drift = nullptr;
    prometheus::Gauge* wall_clock_skew = nullptr;
    prometheus::Gauge* unacked_batches = nullptr;
    std::map<std::string, CounterTotal> drops;  // by reason
    CounterTotal bad_messages;
    CounterTotal refused_claims;
  };
  struct RankSeries {
    std::string job;
    prometheus::Gauge* last_sequence = nullptr;
  };
  static constexpr size_t kFindingKinds = std::size(kAllFindingKinds);

  Metrics(std::unique_ptr<prometheus::Exposer> exposer, size_t max_series);

  template <typename T>
  T* add_series(prometheus::Family<T>& family, const std::map<std::string, std::string>& labels);
  void set_node_gauge(prometheus::Gauge*& gauge, prometheus::Family<prometheus::Gauge>& family, const std::string& node,
                      double value);
  static void advance(CounterTotal& counter, uint64_t total);

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;  // after registry_: stops serving before it goes
  uint16_t port_ = 0;
  const size_t max_series_;
  size_t series_ = 0;  // node- and communicator-labelled series in use
  bool warned_series_limit_ = false;

  std::array<prometheus::Gauge*, kFindingKinds> findings_open_{};
  std::array<prometheus::Counter*, kFindingKinds> findings_opened_{};
  prometheus::Family<prometheus::Gauge>* node_up_;
  prometheus::Family<prometheus::Gauge>* node_last_contact_;
  prometheus::Family<prometheus::Gauge>* node_clock_offset_;
  prometheus::Family<prometheus::Gauge>* node_clock_uncertainty_;
  prometheus::Family<prometheus::Gauge>* node_clock_drift_;
  prometheus::Family<prometheus::Gauge>* node_wall_clock_skew_;
  prometheus::Family<prometheus::Counter>* agent_drops_;
  prometheus::Family<prometheus::Counter>* node_bad_messages_;
  prometheus::Family<prometheus::Counter>* node_refused_claims_;
  prometheus::Family<prometheus::Gauge>* comm_last_sequence_;
  prometheus::Family<prometheus::Gauge>* node_unacked_batches_;
  prometheus::Family<prometheus::Gauge>* findings_waste_;
  std::array<CounterTotal, kLoopPhases> loop_;
  prometheus::Gauge* last_evaluation_ = nullptr;
  std::map<std::pair<FindingKind, std::string>, prometheus::Gauge*> findings_waste_series_;
  struct TenantSeries {
    prometheus::Counter* gpu = nullptr;
    prometheus::Counter* waste = nullptr;
    prometheus::Counter* caused = nullptr;
  };
  struct TenantLast {
    double gpu = 0, waste = 0, caused = 0;
  };
  prometheus::Family<prometheus::Counter>* tenant_gpu_;
  prometheus::Family<prometheus::Counter>* tenant_waste_;
  prometheus::Family<prometheus::Counter>* tenant_caused_;
  std::map<std::string, TenantSeries> tenant_series_;  // by label: the first kTenantSeries accounts, "other"
  std::map<std::string, TenantLast> tenant_last_;      // by account
  prometheus::Histogram* issue_lateness_;
  CounterTotal ingest_batches_, ingest_records_, ingest_duplicate_batches_, ingest_bad_messages_, ingest_bytes_;
  CounterTotal ingest_held_batches_, commit_failures_, detector_incomplete_;
  CounterTotal splits_sized_, splits_abandoned_, split_waits_;
  CounterTotal gpu_taken_, gpu_unmatched_;
  prometheus::Gauge* detail_comms_;
  prometheus::Family<prometheus::Gauge>*fleet_members_family_ = nullptr, *fleet_etcd_up_family_ = nullptr;
  prometheus::Family<prometheus::Counter>* fleet_registrations_family_ = nullptr;
  prometheus::Gauge *fleet_members_ = nullptr, *fleet_etcd_up_ = nullptr;
  CounterTotal fleet_registrations_;
  CounterTotal detail_finding_, detail_link_, detail_rise_;
  CounterTotal alert_posts_ok_, alert_posts_failed_;
  CounterTotal handshakes_admitted_, handshakes_refused_, throttled_agent_, throttled_query_;
  CounterTotal probes_clock_, probes_clock_dropped_, probes_agent_;
  prometheus::Counter* series_dropped_;

  std::unordered_map<std::string, NodeSeries> nodes_;
  std::unordered_map<std::string, std::map<int32_t, RankSeries>> comms_;  // by comm hex, then rank
};

}  // namespace rankscope::collector
