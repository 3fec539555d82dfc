#pragma once
// Pushes findings to Alertmanager (API v2: POST {base}/api/v2/alerts, a JSON
// array of alerts) the way Prometheus does:
//   - an open finding is an alert whose endsAt lies a few resend intervals
//     ahead, posted again every resend interval so Alertmanager keeps it
//     firing, and at once when it appears or its text changes;
//   - a resolved finding is posted with endsAt = its resolution time, at
//     resolution and once more at least one resend interval later, then
//     forgotten;
//   - if the collector stops posting, its alerts end by themselves.
// Alertmanager identifies an alert by its label set, so when a finding's
// labels change (its ranks, its nodes) the old label set is resolved too.
//
// Each post carries every open alert and every resolution still to repeat:
// the newest payload supersedes any older one, so a worker that falls behind
// only ever needs the newest. Posts run on one worker thread; sync() never
// waits on the network.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collector/alert/http.h"
#include "collector/detect/finding.h"
#include "common/json.h"
#include "common/result.h"

namespace rankscope::collector {

struct AlertmanagerOptions {
  uint32_t resend_interval_ms = 30000;  // open alerts are posted again this often
  HttpClientOptions http;               // one post's timeout, TLS and credentials
  // In a fleet of collectors: this collector's id. The finding's id (and
  // the collector) are then annotations, not labels: a job that moves to
  // another collector is judged again there, and its finding, raised again
  // under another id, must be the same alert (Alertmanager de-duplicates
  // by labels). "": alone, the finding's id is a label.
  std::string collector_id;
};

class AlertmanagerClient {
 public:
  // `base_url`: where Alertmanager serves its API, e.g. http://alertmanager:9093
  // or https://alertmanager:9093 (with its --web.route-prefix, if it has one).
  static Result<std::unique_ptr<AlertmanagerClient>> create(const std::string& base_url,
                                                            const AlertmanagerOptions& options = {});
  ~AlertmanagerClient();
  AlertmanagerClient(const AlertmanagerClient&) = delete;
  AlertmanagerClient& operator=(const AlertmanagerClient&) = delete;

  // `findings`: every open finding and those resolved recently (a finding
  // missing from the list while still open is taken as resolved now).
  // `now_ns`: the cluster clock (Unix time, ns), which findings are stamped
  // with. Call it regularly (the collector does every 500 ms) from one thread.
  void sync(const std::vector<Finding>& findings, uint64_t now_ns);

  // Posts done by the worker, by outcome (a non-2xx answer is a failure).
  uint64_t posts_ok() const { return posts_ok_.load(std::memory_order_relaxed); }
  uint64_t posts_failed() const { return posts_failed_.load(std::memory_order_relaxed); }

 private:
  // One alert as Alertmanager knows it: a label set with a time span.
  struct Alert {
    Json labels;       // an object
    Json annotations;  // an object
    uint64_t starts_ns = 0;
    uint64_t ends_ns = 0;                 // 0 while firing; then the resolution time
    uint64_t first_resolved_post_ns = 0;  // when the resolution was first posted
    bool done = false;                    // resolution posted twice: nothing more to say
    uint64_t seen_in_sync = 0;
  };

  AlertmanagerClient(std::string alerts_url, const AlertmanagerOptions& options);

  bool track(const Finding& finding, uint64_t now_ns);
  bool resolve_vanished(uint64_t now_ns);
  std::string take_payload(uint64_t now_ns);
  void append_alert(std::string& payload, Alert& alert, uint64_t now_ns);
  uint64_t resend_ns() const { return uint64_t{options_.resend_interval_ms} * 1000000; }

  void enqueue(std::string payload);
  void post_loop();
  void post(const std::string& payload);
  void warn_at_most_every_30s(const std::string& failure_kind, const std::string& message);

  const std::string alerts_url_;
  const AlertmanagerOptions options_;

  // sync()'s thread only.
  std::map<uint64_t, Alert> by_finding_;  // by Finding::id
  std::vector<Alert> retired_;            // label sets findings no longer have, being resolved
  uint64_t sync_count_ = 0;
  std::optional<uint64_t> last_post_ns_;

  // The worker only.
  std::map<std::string, std::chrono::steady_clock::time_point> last_warned_;

  // Shared.
  std::mutex mutex_;
  std::condition_variable wake_;
  std::optional<std::string> pending_;  // the newest payload not yet posted
  bool stopping_ = false;
  std::atomic<uint64_t> posts_ok_{0};
  std::atomic<uint64_t> posts_failed_{0};
  std::thread worker_;  // last: starts once everything it uses exists
};

}  // namespace rankscope::collector
