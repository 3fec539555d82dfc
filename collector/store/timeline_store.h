#pragma once
// The collector's RocksDB: one column family per kind of data.
//   records: (comm, lane, rank, last seq, write) -> a block of that rank's NCCL calls, times on the cluster clock
//   comms:   comm -> StoredComm (job, members, lanes)
//   progress: (comm, rank) -> StoredProgress (that member's counters)
//   nodes:   node -> StoredNode
//   findings: id -> StoredFinding
//   usage:   the usage ledger's rows (collector/usage/ledger.h), keys made there
// Keys are big-endian so that RocksDB's byte order is sequence order.
// RocksDB itself is behind this header (timeline_store.cpp): no type or
// status of it leaves the store, so the stages above it (ingest, detect,
// usage) build and test without it.
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collector/commit.h"
#include "collector/store/write_set.h"
#include "common/result.h"

namespace rankscope::collector {

struct StoreOptions {
  // Size the database should stay under (0: none); sizes RocksDB's memtables
  // and write-ahead log to fit under it.
  uint64_t max_disk_bytes = 0;
  // Memory for RocksDB's memtables, all column families together: past it
  // the largest is flushed to disk. (RocksDB's level-style defaults would
  // let the records family alone hold 6 x 128 MiB.)
  uint64_t memtable_bytes = 256ull << 20;
};

// Room a commit wants free on the database's filesystem: what RocksDB may
// write before it can free anything (its memtables, flushed, and its log),
// plus slack. Debian's RocksDB aborts the process when a log write meets a
// full disk, so the store stops short of it: a commit with less free fails
// like an I/O error (kept and written again once there is room).
uint64_t free_space_reserve(const StoreOptions& options);

class TimelineStore final : public UsageRows {
 public:
  static Result<std::unique_ptr<TimelineStore>> open(const std::string& path, const StoreOptions& options = {});
  ~TimelineStore() override;

  WriteSet writes() const { return WriteSet(); }
  // Writes and syncs the write-ahead log before returning: what this
  // returns ok for survives a crash, so only then is it acknowledged. On
  // failure `writes` keeps everything it held (written again next time),
  // and the next call first asks RocksDB to resume from its error.
  Result<void> commit(WriteSet& writes);

  // The last `last` records (0: all) of one (comm, lane, rank), in seq order,
  // each seq once, none issued before the retention cut-off.
  Result<std::vector<StoredRecord>> tail(uint64_t comm, uint32_t lane, int32_t rank, uint32_t last) const;
  // Number of records tail(comm, lane, rank, 0) returns (it reads them all).
  Result<uint64_t> count(uint64_t comm, uint32_t lane, int32_t rank) const;

  Result<std::vector<std::string>> all_comms() const;  // values
  // The values of the communicators whose hash is in [first, last].
  Result<std::vector<std::string>> comms_between(uint64_t first, uint64_t last) const;
  struct Progress {
    uint64_t comm;
    int32_t rank;
    std::string value;
  };
  Result<std::vector<Progress>> all_progress() const;
  Result<std::vector<Progress>> progress_of(uint64_t comm) const;  // one communicator's members'

  Result<std::vector<std::string>> all_nodes() const;  // values
  Result<std::vector<std::string>> all_findings() const;  // values, in id order

  // The usage ledger's rows (UsageRows).
  Result<std::optional<std::string>> get_usage(const std::string& key) const override;
  Result<void> scan_usage(const std::string& from, const std::string& to,
                          const std::function<bool(std::string_view key, std::string_view value)>& row) const override;
  // Retention (safe to call from another thread than the one that commits).
  // Removes every record issued before `cutoff_ns` (cluster clock): reads
  // leave them out at once; a compaction filter drops each block all of
  // whose records are before it as RocksDB rewrites its files, and a full
  // compaction of the records is run now so that the space comes back at
  // once. Ingest goes on meanwhile. Cut-offs only move forward.
  Result<void> remove_before(uint64_t cutoff_ns);
  uint64_t cutoff_ns() const { return cutoff_->load(); }
  // Bytes of every file in the database directory (tables, logs, manifest).
  uint64_t disk_bytes() const;
  // The issue times of the records stored (rebuilt by scan_times() after a restart).
  TimeHistogram times() const;
  Result<void> scan_times();

 private:
  struct Rocks;  // the database, its column families and the retention filter
  TimelineStore();
  Result<std::vector<std::string>> all_values(WriteSet::Family family, const char* what) const;
  // The progress rows whose key starts with `prefix` ("": all).
  Result<std::vector<Progress>> progress_rows(const std::string& prefix) const;

  std::string path_;
  bool failed_ = false;  // the last commit failed: resume before the next
  uint64_t reserve_bytes_ = 0;  // free_space_reserve()
  std::shared_ptr<std::atomic<uint64_t>> cutoff_ = std::make_shared<std::atomic<uint64_t>>(0);
  mutable std::mutex times_mutex_;
  TimeHistogram times_;
  std::unique_ptr<Rocks> rocks_;
};

// Commits go to the store.
class StoreTarget final : public CommitTarget {
 public:
  explicit StoreTarget(TimelineStore& store) : store_(store) {}
  WriteSet writes() const override { return store_.writes(); }
  Result<void> commit(WriteSet& writes) override { return store_.commit(writes); }

 private:
  TimelineStore& store_;
};

}  // namespace rankscope::collector
