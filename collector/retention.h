#pragma once
// Retention: timelines older than --retention are removed, and the database
// is kept under --max-disk-bytes by removing the oldest records first. Runs
// on its own thread every --retention-check-s; ingest never waits for it
// (RocksDB takes writes while it compacts). What is removed is whole
// records by issue time (TimelineStore::remove_before); communicator,
// node and finding entries stay (they are small).
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "collector/options.h"
#include "collector/store/timeline_store.h"
#include "common/clock.h"
#include "common/result.h"

namespace rankscope::collector {

struct RetentionPolicy {
  uint64_t max_age_ns = 0;      // 0: keep
  uint64_t max_disk_bytes = 0;  // 0: no cap
  bool enabled() const { return max_age_ns != 0 || max_disk_bytes != 0; }
  // The cut-off for one pass: records issued before it go (0: none).
  // `used` is the database's size now; `times` when its records were issued.
  uint64_t cutoff(uint64_t now_ns, uint64_t used, const TimeHistogram& times) const;
};

class Retention {
 public:
  // Null when the options ask for no retention.
  static std::unique_ptr<Retention> start(TimelineStore& store, const Clock& clock, const Options& options);
  ~Retention();
  // One pass: what the thread does every interval.
  Result<void> enforce();

 private:
  Retention(TimelineStore& store, const Clock& clock, RetentionPolicy policy, uint64_t interval_ns);
  void loop();

  TimelineStore& store_;
  const Clock& clock_;
  RetentionPolicy policy_;
  uint64_t interval_ns_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace rankscope::collector
