#pragma once
// What the collector writes, before it reaches the database: the record
// encoding (keys and values, one place), the set of writes a commit makes
// durable together, and the read side the usage ledger needs. Free of
// RocksDB (store/timeline_store.cpp holds it) and of Cap'n Proto, so every
// stage above the store builds and tests without either.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/result.h"
#include "proto/records.h"

namespace rankscope::collector {

struct RecordKey {
  uint64_t comm = 0;
  uint32_t lane = 0;
  int32_t rank = 0;
  uint64_t seq = 0;
  uint64_t write = 0;  // read back: the write that stored its block (0: the first layout)
};

struct StoredRecord {
  RecordKey key;
  proto::CallRecord call;  // times on the cluster clock
  uint32_t pid = 0;
};

// The records are stored in blocks: one value holds consecutive records of
// one (comm, lane, rank), keyed by the sequence number of its last record
// and the write that stored it (docs/protocol.md, "Storage of the
// records"): a block never replaces another, and where two hold a seq the
// later write's copy is read. A database written when each record had a
// key of its own reads the same: such a value is a block of one.
constexpr uint32_t kMaxBlockRecords = 1024;  // a commit's run of one timeline is cut into blocks of at most this

// The first 16 bytes of every key of one (comm, lane, rank)'s timeline.
std::string encode_timeline_prefix(uint64_t comm, uint32_t lane, int32_t rank);
// The key of one record of the first layout: (comm, lane, rank, seq).
std::string encode_record_key(const RecordKey& key);
// The key of a block whose last record is `last`, stored by write `write_id`.
std::string encode_block_key(const RecordKey& last, uint64_t write_id);
// Either kind of key; `seq` is its (last) record's.
std::optional<RecordKey> decode_record_key(std::string_view bytes);
// One block of records of one (comm, lane, rank), in sequence order,
// strictly increasing (1 to kMaxBlockRecords of them).
std::string encode_block(const StoredRecord* records, size_t n);
// Appends the records of a stored value (a block, or a single record of the
// first layout) under `key` (its last record's) to `out`, in sequence order.
// A value of an unknown layout, or one that does not hold what it says, is
// an error and appends nothing.
Result<void> decode_stored_records(const RecordKey& key, std::string_view value, std::vector<StoredRecord>& out);
// The latest issue time (cluster clock) of the records of a stored value,
// read without decoding them (retention's filter); nullopt for a value of an
// unknown layout.
std::optional<uint64_t> stored_latest_issue_ns(std::string_view value);

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
  // Puts `older`'s writes under this set's (a later write of a key wins):
  // a failed commit's set, back under what was put since. Leaves `older` empty.
  void put_under(WriteSet& older);
  size_t records() const { return records_.size(); }
  bool empty() const { return writes_.empty() && records_.empty(); }
  // Bytes the set holds in memory (what a failing disk lets pile up).
  uint64_t bytes() const { return writes_bytes_ + records_.size() * sizeof(StoredRecord); }

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
  // The records as put, in arrival order: at commit they are sorted by
  // (comm, lane, rank, seq) and each timeline's run goes into RocksDB as
  // blocks, in key order (its memtable, a skip list, then inserts each next
  // to the one before, where keys in arrival order cost a search from the
  // top each).
  std::vector<StoredRecord> records_;
  TimeHistogram times_;
  uint64_t last_bucket_ = UINT64_MAX, last_bucket_count_ = 0;  // times_'s newest bucket, not yet added
  void flush_times();
};

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

}  // namespace rankscope::collector
