#include "collector/retention.h"

#include <algorithm>
#include <chrono>

#include "common/format.h"
#include "common/log.h"

namespace rankscope::collector {

namespace {
// Past this share of the cap, the oldest records go until the database is
// back to about kTargetShare of it (RocksDB's logs and a compaction's new
// files need the rest).
constexpr double kTriggerShare = 0.7;
constexpr double kTargetShare = 0.5;
// Records kept at the least, as a share of those stored: the cap never
// empties the store at once.
constexpr double kMaxShareRemoved = 0.9;
}  // namespace

uint64_t RetentionPolicy::cutoff(uint64_t now_ns, uint64_t used, const TimeHistogram& times) const {
  uint64_t cut = max_age_ns != 0 && now_ns > max_age_ns ? now_ns - max_age_ns : 0;
  if (max_disk_bytes != 0 && used > kTriggerShare * static_cast<double>(max_disk_bytes) && !times.empty()) {
    double share = (static_cast<double>(used) - kTargetShare * static_cast<double>(max_disk_bytes)) / static_cast<double>(used);
    cut = std::max(cut, times.time_of_share(std::min(share, kMaxShareRemoved)));
  }
  return cut;
}

Retention::Retention(TimelineStore& store, const Clock& clock, RetentionPolicy policy, uint64_t interval_ns)
    : store_(store), clock_(clock), policy_(policy), interval_ns_(interval_ns) {}

std::unique_ptr<Retention> Retention::start(TimelineStore& store, const Clock& clock, const Options& options) {
  RetentionPolicy policy{options.retention_ns(), options.max_disk()};
  if (!policy.enabled()) return nullptr;
  std::unique_ptr<Retention> retention(
      new Retention(store, clock, policy, static_cast<uint64_t>(options.retention_check_s) * 1'000'000'000ull));
  RS_LOG(info, "retention: records older than %s removed, database kept under %s bytes, checked every %u s",
         policy.max_age_ns ? format_duration_ns(static_cast<int64_t>(policy.max_age_ns)).c_str() : "(forever)",
         policy.max_disk_bytes ? std::to_string(policy.max_disk_bytes).c_str() : "(no cap)", options.retention_check_s);
  retention->thread_ = std::thread([r = retention.get()] { r->loop(); });
  return retention;
}

Retention::~Retention() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<void> Retention::enforce() {
  uint64_t now = clock_.realtime_ns();
  uint64_t used = store_.disk_bytes();
  uint64_t cut = policy_.cutoff(now, used, store_.times());
  uint64_t current = store_.cutoff_ns();
  // Age alone moves the cut-off a little every pass; a full compaction is
  // worth it once it moved by a hundredth of the age (natural compactions
  // apply the cut-off in between). Over the cap: at once.
  bool over_cap = policy_.max_disk_bytes != 0 && used > kTriggerShare * static_cast<double>(policy_.max_disk_bytes);
  if (cut <= current || (!over_cap && current != 0 && cut - current < policy_.max_age_ns / 100)) return {};
  if (auto r = store_.remove_before(cut); !r) return r;
  uint64_t after = store_.disk_bytes();
  RS_LOG(info, "retention: removed records issued before %s (%s); database %llu -> %llu bytes%s",
         format_time_ns(cut).c_str(), over_cap ? "over the disk cap" : "older than --retention",
         static_cast<unsigned long long>(used), static_cast<unsigned long long>(after),
         policy_.max_disk_bytes && after > policy_.max_disk_bytes ? " (still over the cap: RocksDB frees files as it can)" : "");
  return {};
}

void Retention::loop() {
  if (policy_.max_disk_bytes != 0)
    if (auto r = store_.scan_times(); !r) RS_LOG(error, "retention: %s", r.error().message.c_str());
  std::unique_lock lock(mutex_);
  while (!stop_) {
    lock.unlock();
    if (auto r = enforce(); !r) RS_LOG(error, "retention: %s", r.error().message.c_str());
    lock.lock();
    wake_.wait_for(lock, std::chrono::nanoseconds(interval_ns_), [&] { return stop_; });
  }
}

}  // namespace rankscope::collector
