#pragma once
// The collector's RocksDB: one column family per kind of data.
//   records: (comm, lane, rank, seq) -> one NCCL call, times on the cluster clock
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

#include "common/result.h"
#include "proto/records.h"

namespace rankscope::collector {

struct RecordKey {
  uint64_t comm = 0;
  uint32_t lane = 0;
  int32_t rank = 0;
  uint64_t seq = 0;
};

struct StoredRecord {
  RecordKey key;
  proto::CallRecord call;  // times on the cluster clock
  uint32_t pid = 0;
};

std::string encode_record_key(const RecordKey& key);
std::optional<RecordKey> decode_record_key(std::string_view bytes);
std::string encode_record_value(const proto::CallRecord& call, uint32_t pid);
Result<StoredRecord> decode_record_value(const RecordKey& key, std::string_view bytes);

// How many records were issued in each time bucket (cluster clock): what
// retention needs to find the cut-off that frees a given share of the
// records, oldest first. Buckets start at about a second (2^30 ns) and
// double in width whenever there are more than kMaxBuckets.
class TimeHistogram {
 public:
  static constexpr size_t kMaxBuckets = 4096;
  void add(uint64_t ns, uint64_t count = 1);
  void merge(const TimeHistogram& other);
  // Forgets what is before `ns` (whole buckets only).
  void drop_before(uint64_t ns);
  uint64_t total() const { return total_; }
  // The end of the earliest run of buckets holding at least `share` (0..1) of the records.
  uint64_t time_of_share(double share) const;
  bool empty() const { return total_ == 0; }

 private:
  unsigned shift_ = 30;
  std::map<uint64_t, uint64_t> buckets_;  // ns >> shift_ -> records
  uint64_t total_ = 0;
};

// A set of writes that become durable together (TimelineStore::commit). It
// is only a buffer: nothing reaches the database until the commit, and a
// commit that fails leaves it whole.
class WriteSet {
 public:
  void put_record(const StoredRecord& record);
  void put_comm(uint64_t comm, std::string value);
  void put_progress(uint64_t comm, int32_t rank, std::string value);
  void put_node(const std::string& node, std::string value);
  void put_finding(uint64_t id, std::string value);
  void put_usage(const std::string& key, std::string value);
  void delete_usage(const std::string& key);
  size_t records() const { return records_.size(); }
  bool empty() const { return writes_.empty() && records_.empty(); }
  // Bytes the set holds in memory (what a failing disk lets pile up).
  uint64_t bytes() const { return writes_bytes_ + records_bytes_; }

  // Everything but the records, in the order written (a later write of a
  // key wins): what a store applies, and what a test's store reads.
  enum class Family : uint8_t { comms, progress, nodes, findings, usage };
  struct Write {
    Family family;
    bool erase = false;
    std::string key, value;
  };
  const std::vector<Write>& writes() const { return writes_; }

 private:
  friend class TimelineStore;
  void add(Family family, std::string key, std::string value, bool erase = false);
  std::vector<Write> writes_;
  uint64_t writes_bytes_ = 0;
  // Records go into RocksDB's batch at commit, in key order: its memtable
  // (a skip list) then inserts each next to the one before, where records
  // in arrival order (every rank's newest few, all over the key space) cost
  // a search from the top each. (Encoded key, value.)
  std::vector<std::pair<std::string, std::string>> records_;
  uint64_t records_bytes_ = 0;
  TimeHistogram times_;
  uint64_t last_bucket_ = UINT64_MAX, last_bucket_count_ = 0;  // times_'s newest bucket, not yet added
  void flush_times();
};

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

// The usage ledger's rows (its own keys, collector/usage/ledger.h), read
// back: the store, or a test's map.
class UsageRows {
 public:
  virtual ~UsageRows() = default;
  // One row by key (nullopt: none).
  virtual Result<std::optional<std::string>> get_usage(const std::string& key) const = 0;
  // Every row with from <= key < to in key order, handed to `row` (which returns false to stop).
  virtual Result<void> scan_usage(
      const std::string& from, const std::string& to,
      const std::function<bool(std::string_view key, std::string_view value)>& row) const = 0;
};

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

  // The last `last` records (0: all) of one (comm, lane, rank), in seq order.
  Result<std::vector<StoredRecord>> tail(uint64_t comm, uint32_t lane, int32_t rank, uint32_t last) const;
  // Number of records stored for (comm, lane, rank).
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
  // Removes every record issued before `cutoff_ns` (cluster clock): a
  // compaction filter drops them as RocksDB rewrites its files, and a full
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

}  // namespace rankscope::collector
