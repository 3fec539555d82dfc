#pragma once
// The collector's RocksDB: one column family per kind of data.
//   records: (comm, lane, rank, seq) -> one NCCL call, times on the cluster clock
//   comms:   comm -> StoredComm (job, members, lanes)
//   nodes:   node -> StoredNode
//   findings: id -> StoredFinding
//   usage:   the usage ledger's rows (collector/usage.h), keys made there
// Keys are big-endian so that RocksDB's byte order is sequence order.
// rocksdb::Status is converted to Result here and never leaves this file.
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

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

// A set of writes that become durable together (made by TimelineStore::writes).
class WriteSet {
 public:
  void put_record(const StoredRecord& record);
  void put_comm(uint64_t comm, std::string value);
  void put_node(const std::string& node, std::string value);
  void put_finding(uint64_t id, std::string value);
  void put_usage(const std::string& key, std::string value);
  size_t records() const { return records_; }
  bool empty() const { return batch_.Count() == 0; }

 private:
  friend class TimelineStore;
  WriteSet(rocksdb::ColumnFamilyHandle* records, rocksdb::ColumnFamilyHandle* comms, rocksdb::ColumnFamilyHandle* nodes,
           rocksdb::ColumnFamilyHandle* findings, rocksdb::ColumnFamilyHandle* usage)
      : records_family_(records), comms_family_(comms), nodes_family_(nodes), findings_family_(findings),
        usage_family_(usage) {}
  rocksdb::ColumnFamilyHandle* records_family_;
  rocksdb::ColumnFamilyHandle* comms_family_;
  rocksdb::ColumnFamilyHandle* nodes_family_;
  rocksdb::ColumnFamilyHandle* findings_family_;
  rocksdb::ColumnFamilyHandle* usage_family_;
  rocksdb::WriteBatch batch_;
  size_t records_ = 0;
};

class TimelineStore {
 public:
  static Result<std::unique_ptr<TimelineStore>> open(const std::string& path);
  ~TimelineStore();

  WriteSet writes() const { return WriteSet(records_, comms_, nodes_, findings_, usage_); }
  // Writes and syncs the write-ahead log before returning: what this
  // returns ok for survives a crash, so only then is it acknowledged.
  Result<void> commit(WriteSet& writes);

  // The last `last` records (0: all) of one (comm, lane, rank), in seq order.
  Result<std::vector<StoredRecord>> tail(uint64_t comm, uint32_t lane, int32_t rank, uint32_t last) const;
  // Number of records stored for (comm, lane, rank).
  Result<uint64_t> count(uint64_t comm, uint32_t lane, int32_t rank) const;

  Result<std::vector<std::string>> all_comms() const;  // values
  Result<std::vector<std::string>> all_nodes() const;  // values
  Result<std::vector<std::string>> all_findings() const;  // values, in id order

  // The usage ledger's rows: one by key (nullopt: none), and every row with
  // from <= key < to in key order, handed to `row` (which returns false to stop).
  Result<std::optional<std::string>> get_usage(const std::string& key) const;
  Result<void> scan_usage(const std::string& from, const std::string& to,
                          const std::function<bool(std::string_view key, std::string_view value)>& row) const;

 private:
  TimelineStore() = default;
  Result<std::vector<std::string>> all_values(rocksdb::ColumnFamilyHandle* family) const;

  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  rocksdb::ColumnFamilyHandle* records_ = nullptr;
  rocksdb::ColumnFamilyHandle* comms_ = nullptr;
  rocksdb::ColumnFamilyHandle* nodes_ = nullptr;
  rocksdb::ColumnFamilyHandle* findings_ = nullptr;
  rocksdb::ColumnFamilyHandle* usage_ = nullptr;
};

}  // namespace rankscope::collector
