#include "collector/alert/alertmanager.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <type_traits>
#include <utility>

#include "collector/alert/http.h"
#include "common/format.h"
#include "common/json.h"
#include "common/log.h"

namespace rankscope::collector {

namespace {

// An open alert's endsAt lies this many resend intervals ahead, so that a
// post or two lost on the way does not end it (Prometheus uses 4 too).
constexpr uint64_t kOpenLifetimeResends = 4;

// Ranks and nodes listed in one label value; a hang can miss thousands of
// ranks, and a notification must stay readable. The description has them all.
constexpr size_t kMaxListedInLabel = 32;

constexpr auto kWarnEvery = std::chrono::seconds(30);

const char* alert_name(FindingKind kind) {
  switch (kind) {
    case FindingKind::hang:
      return "RankscopeHang";
    case FindingKind::mismatch:
      return "RankscopeMismatch";
    case FindingKind::straggler:
      return "RankscopeStraggler";
    case FindingKind::node_lost:
      return "RankscopeNodeLost";
    case FindingKind::slow_link:
      return "RankscopeSlowLink";
  }
  return "Rankscope";
}

// A hang, a mismatch or a lost node stops the job: someone must look now. A
// straggler or a slow link only slows it.
const char* severity(FindingKind kind) {
  return kind == FindingKind::straggler || kind == FindingKind::slow_link ? "warning" : "page";
}

template <typename T>
std::string join_list(const std::vector<T>& items) {
  std::string out;
  size_t shown = std::min(items.size(), kMaxListedInLabel);
  for (size_t i = 0; i < shown; ++i) {
    if (i > 0) out += ',';
    if constexpr (std::is_same_v<T, std::string>)
      out += items[i];
    else
      out += std::to_string(items[i]);
  }
  if (items.size() > shown) out += ",+" + std::to_string(items.size() - shown) + " more";
  return out;
}

// Fields with an empty value are left out: Alertmanager, like Prometheus,
// treats an empty label as no label.
Json json_object(const std::vector<std::pair<const char*, std::string>>& fields) {
  Json out = Json::object();
  for (const auto& [name, value] : fields)
    if (!value.empty()) out[name] = value;
  return out;
}

// `collector`: the collector's id in a fleet ("": alone).
Json labels_json(const Finding& finding, const std::string& collector) {
  return json_object({
      {"alertname", alert_name(finding.kind)},
      {"severity", severity(finding.kind)},
      {"job", finding.job},
      {"comm", finding.comm != 0 ? hex64(finding.comm) : ""},
      {"ranks", join_list(finding.ranks)},
      {"nodes", join_list(finding.nodes)},
      {"finding_id", collector.empty() ? std::to_string(finding.id) : ""},
  });
}

Json annotations_json(const Finding& finding, const std::string& collector) {
  return json_object({{"summary", finding.summary},
                      {"description", finding.detail},
                      {"finding_id", collector.empty() ? "" : std::to_string(finding.id) + "@" + collector},
                      {"collector", collector}});
}

// RFC 3339 in UTC with milliseconds, as Alertmanager writes times itself.
std::string rfc3339_ms(uint64_t unix_ns) {
  time_t seconds = static_cast<time_t>(unix_ns / 1000000000);
  tm parts{};
  gmtime_r(&seconds, &parts);
  char text[80];  // sized for any int in tm, as -Wformat-truncation reckons
  snprintf(text, sizeof(text), "%04d-%02d-%02dT%02d:%02d:%02d.%03uZ", parts.tm_year + 1900, parts.tm_mon + 1,
           parts.tm_mday, parts.tm_hour, parts.tm_min, parts.tm_sec,
           static_cast<unsigned>(unix_ns % 1000000000 / 1000000));
  return text;
}

}  // namespace

Result<std::unique_ptr<AlertmanagerClient>> AlertmanagerClient::create(const std::string& base_url,
                                                                       const AlertmanagerOptions& options) {
  auto url = parse_http_url(base_url);
  if (!url) return make_error(url.error().code, "Alertmanager URL " + url.error().message);
  if (url->path.find_first_of("?#") != std::string::npos)
    return make_error(Errc::invalid_argument,
                      "Alertmanager URL " + base_url + ": give the base URL only, without a query or fragment");
  if (options.resend_interval_ms == 0)
    return make_error(Errc::invalid_argument, "Alertmanager resend interval must be at least 1 ms");
  std::string base = base_url;
  while (base.ends_with('/')) base.pop_back();
  return std::unique_ptr<AlertmanagerClient>(new AlertmanagerClient(base + "/api/v2/alerts", options));
}

AlertmanagerClient::AlertmanagerClient(std::string alerts_url, const AlertmanagerOptions& options)
    : alerts_url_(std::move(alerts_url)), options_(options) {
  worker_ = std::thread([this] { post_loop(); });
}

AlertmanagerClient::~AlertmanagerClient() {
  // A payload still waiting is dropped rather than delaying shutdown by a
  // post timeout: the alerts it held end by their endsAt anyway.
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  worker_.join();
}

void AlertmanagerClient::sync(const std::vector<Finding>& findings, uint64_t now_ns) {
  ++sync_count_;
  bool changed = false;
  for (const Finding& finding : findings) changed |= track(finding, now_ns);
  changed |= resolve_vanished(now_ns);
  // A wall clock stepped back counts as due too, or alerts could lapse until it caught up.
  bool resend_due = !last_post_ns_ || now_ns < *last_post_ns_ || now_ns >= *last_post_ns_ + resend_ns();
  if (!changed && !resend_due) return;
  std::string payload = take_payload(now_ns);
  if (payload.empty()) return;
  last_post_ns_ = now_ns;
  enqueue(std::move(payload));
}

// Returns whether Alertmanager must hear about this finding now.
bool AlertmanagerClient::track(const Finding& finding, uint64_t now_ns) {
  Json labels = labels_json(finding, options_.collector_id);
  Json annotations = annotations_json(finding, options_.collector_id);
  auto [it, inserted] = by_finding_.try_emplace(finding.id);
  Alert& alert = it->second;
  alert.seen_in_sync = sync_count_;
  bool changed = inserted;
  if (inserted) {
    alert.labels = labels;
    alert.annotations = annotations;
    alert.starts_ns = finding.opened_ns != 0 ? finding.opened_ns : now_ns;
  }
  if (alert.ends_ns != 0) return changed;  // resolved: its last word is said
  if (alert.labels != labels) {
    // Alertmanager would keep the old label set firing until its endsAt.
    Alert old = alert;
    old.ends_ns = now_ns;
    retired_.push_back(std::move(old));
    alert.labels = std::move(labels);
    changed = true;
  }
  if (alert.annotations != annotations) {
    alert.annotations = std::move(annotations);
    changed = true;
  }
  if (!finding.open()) {
    alert.ends_ns = finding.resolved_ns;
    changed = true;
  }
  return changed;
}

// Resolves, as of now, the open alerts whose finding the collector no longer
// lists, and forgets the finished ones it no longer lists.
bool AlertmanagerClient::resolve_vanished(uint64_t now_ns) {
  bool changed = false;
  for (auto it = by_finding_.begin(); it != by_finding_.end();) {
    Alert& alert = it->second;
    if (alert.seen_in_sync == sync_count_) {
      ++it;
    } else if (alert.done) {
      it = by_finding_.erase(it);
    } else {
      if (alert.ends_ns == 0) {
        alert.ends_ns = now_ns;
        changed = true;
      }
      ++it;
    }
  }
  return changed;
}

// The JSON array of everything Alertmanager must hear now; "" when nothing.
std::string AlertmanagerClient::take_payload(uint64_t now_ns) {
  std::string payload = "[";
  for (auto& [id, alert] : by_finding_) append_alert(payload, alert, now_ns);
  for (Alert& alert : retired_) append_alert(payload, alert, now_ns);
  std::erase_if(retired_, [](const Alert& alert) { return alert.done; });
  if (payload.size() == 1) return "";
  return payload + "]";
}

void AlertmanagerClient::append_alert(std::string& payload, Alert& alert, uint64_t now_ns) {
  if (alert.done) return;
  uint64_t ends_ns = alert.ends_ns != 0 ? alert.ends_ns : now_ns + kOpenLifetimeResends * resend_ns();
  if (payload.size() > 1) payload += ',';
  payload += to_json({{"labels", alert.labels},
                      {"annotations", alert.annotations},
                      {"startsAt", rfc3339_ms(alert.starts_ns)},
                      {"endsAt", rfc3339_ms(ends_ns)}});
  if (alert.ends_ns == 0) return;
  // A resolution is said twice, a resend interval apart, in case the first
  // post was lost; after that the alert has ended in Alertmanager either way.
  if (alert.first_resolved_post_ns == 0)
    alert.first_resolved_post_ns = now_ns;
  else if (now_ns >= alert.first_resolved_post_ns + resend_ns())
    alert.done = true;
}

void AlertmanagerClient::enqueue(std::string payload) {
  {
    std::lock_guard lock(mutex_);
    pending_ = std::move(payload);  // replaces an older one: the newest holds the whole current state
  }
  wake_.notify_one();
}

void AlertmanagerClient::post_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stopping_ || pending_.has_value(); });
    if (stopping_) return;
    std::string payload = std::move(*pending_);
    pending_.reset();
    lock.unlock();
    post(payload);
    lock.lock();
  }
}

void AlertmanagerClient::post(const std::string& payload) {
  auto response = http_request("POST", alerts_url_, payload, "application/json", options_.http);
  if (response && response->status / 100 == 2) {
    posts_ok_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  posts_failed_.fetch_add(1, std::memory_order_relaxed);
  if (!response) {
    warn_at_most_every_30s("transport", response.error().message);
    return;
  }
  std::string status = "HTTP " + std::to_string(response->status);
  warn_at_most_every_30s(status, status + ": " + response->body.substr(0, 300));
}

// Alertmanager down means a failure every post; one line per kind of
// failure every 30 s says so without flooding the log.
void AlertmanagerClient::warn_at_most_every_30s(const std::string& failure_kind, const std::string& message) {
  auto now = std::chrono::steady_clock::now();
  auto [it, inserted] = last_warned_.try_emplace(failure_kind, now);
  if (!inserted) {
    if (now - it->second < kWarnEvery) return;
    it->second = now;
  }
  RS_LOG(warn,
         "cannot post alerts to %s: %s (posted again at the next resend; this warning repeats at most every 30 s)",
         alerts_url_.c_str(), message.c_str());
}

}  // namespace rankscope::collector
