#pragma once
// What the collector tells the outside world after each evaluation, beside
// its query socket: the Alertmanager (--alertmanager), the Slurm node
// drainer (--drain-after-jobs) and the Prometheus exposition (--metrics).
// Each is an Output; the collector starts those its options ask for and
// hands every one the same picture, in that order, twice a second.
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "collector/options.h"

namespace rankscope::collector {

class Commit;
class DetailPolicy;
class Detector;
class FindingBook;
class Ingest;
class UsageLedger;

// The pipeline just after an evaluation.
// The collector loop's time since it started, by phase (ns), in the order
// of Metrics::kLoopPhaseNames, and how long its last evaluation took.
struct LoopTime {
  enum Phase { agents, evaluate, commit, queries, phases };
  std::array<uint64_t, phases> total_ns{};
  uint64_t last_evaluation_ns = 0;
};

struct Evaluated {
  uint64_t now_ns = 0;       // cluster clock
  uint64_t liveness_ns = 0;  // a node unheard of for this long is down
  const Ingest& ingest;
  const FindingBook& findings;
  Detector& detector;   // its lateness samples are taken by the metrics
  UsageLedger& ledger;  // totals() builds its view on demand
  const Commit& commit;
  const DetailPolicy& detail;  // NCCL's proxy steps asked for (collector/detect/detail.h)
  uint64_t keys_admitted = 0, keys_refused = 0;  // CurveZMQ keys (the ZAP handler)
  uint64_t queries_throttled = 0;
  // In a fleet (--etcd): the members last read, whether the last exchange
  // with etcd succeeded, the leases granted. Absent for a collector alone.
  struct Fleet {
    size_t members = 0;
    bool etcd_ok = false;
    uint64_t registrations = 0;
  };
  std::optional<Fleet> fleet;
  LoopTime loop;  // up to the evaluation before this one
  // Clock probes answered, and dropped, on their own socket (collector/clock_responder.h).
  uint64_t clock_probes_apart = 0, clock_probes_apart_dropped = 0;
};

class Output {
 public:
  virtual ~Output() = default;
  virtual void publish(const Evaluated& evaluated) = 0;
};

using Outputs = std::vector<std::unique_ptr<Output>>;

// The outputs the options ask for; nullopt after logging why one cannot start.
// `fleet_id`: this collector's id in a fleet of collectors ("": alone).
std::optional<Outputs> start_outputs(const Options& options, const std::string& fleet_id = "");

}  // namespace rankscope::collector
