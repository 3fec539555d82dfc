#include "collector/store/timeline_store.h"

#include <rocksdb/compaction_filter.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/slice_transform.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "collector/store/bytes.h"

namespace rankscope::collector {

namespace {
constexpr uint8_t kRecordVersion = 1;
constexpr size_t kRecordPrefixSize = 8 + 4 + 4;  // (comm, lane, rank): one rank's timeline
constexpr size_t kRecordKeySize = kRecordPrefixSize + 8;
constexpr size_t kProgressKeySize = 8 + 4;  // (comm, rank)
constexpr size_t kRecordValueSize = 48;

using bytes::get_be;
using bytes::get_le;
using bytes::put_be;
using bytes::put_le;

// Ranks are signed (a record whose rank is unknown carries -1); flipping the
// sign bit keeps byte order equal to numeric order.
uint32_t rank_bits(int32_t rank) { return static_cast<uint32_t>(rank) ^ 0x80000000u; }
int32_t rank_of(uint32_t bits) { return static_cast<int32_t>(bits ^ 0x80000000u); }

Error storage_error(const char* what, const rocksdb::Status& status) {
  return make_error(Errc::storage, std::string(what) + ": " + status.ToString());
}

// Drops the records issued before the cut-off as RocksDB compacts
// (rocksdb/compaction_filter.h): retention without a scan of the keys, which
// are ordered by communicator and sequence, not by time.
class RetentionFilter final : public rocksdb::CompactionFilter {
 public:
  explicit RetentionFilter(std::shared_ptr<std::atomic<uint64_t>> cutoff) : cutoff_(std::move(cutoff)) {}
  bool Filter(int, const rocksdb::Slice&, const rocksdb::Slice& value, std::string*, bool*) const override {
    uint64_t cutoff = cutoff_->load(std::memory_order_relaxed);
    if (cutoff == 0 || value.size() < kRecordValueSize || static_cast<uint8_t>(value[0]) != kRecordVersion) return false;
    return get_le(value.data() + 24, 8) < cutoff;  // issue_ns (encode_record_value)
  }
  const char* Name() const override { return "rankscope.RetentionFilter"; }

 private:
  std::shared_ptr<std::atomic<uint64_t>> cutoff_;
};

std::string lane_rank_prefix(uint64_t comm, uint32_t lane, int32_t rank) {
  std::string prefix;
  put_be(prefix, comm, 8);
  put_be(prefix, lane, 4);
  put_be(prefix, rank_bits(rank), 4);
  return prefix;
}
}  // namespace

std::string encode_record_key(const RecordKey& key) {
  std::string out = lane_rank_prefix(key.comm, key.lane, key.rank);
  put_be(out, key.seq, 8);
  return out;
}

std::optional<RecordKey> decode_record_key(std::string_view bytes) {
  if (bytes.size() != kRecordKeySize) return std::nullopt;
  RecordKey key;
  key.comm = get_be(bytes.data(), 8);
  key.lane = static_cast<uint32_t>(get_be(bytes.data() + 8, 4));
  key.rank = rank_of(static_cast<uint32_t>(get_be(bytes.data() + 12, 4)));
  key.seq = get_be(bytes.data() + 16, 8);
  return key;
}

std::string encode_record_value(const proto::CallRecord& call, uint32_t pid) {
  // Fixed little-endian layout, version byte first:
  // 0 version | 1 op | 2 datatype | 3 redop | 4 result | 5 flags | 6..7 zero
  // 8 peer (i32) | 12 pid | 16 count | 24 issue_ns | 32 return_ns | 40..47 zero
  std::string out(kRecordValueSize, '\0');
  char* p = out.data();
  p[0] = static_cast<char>(kRecordVersion);
  p[1] = static_cast<char>(call.op);
  p[2] = static_cast<char>(call.datatype);
  p[3] = static_cast<char>(call.redop);
  p[4] = static_cast<char>(call.result);
  p[5] = static_cast<char>(call.flags);
  put_le(p + 8, static_cast<uint32_t>(call.peer), 4);
  put_le(p + 12, pid, 4);
  put_le(p + 16, call.count, 8);
  put_le(p + 24, call.issue_ns, 8);
  put_le(p + 32, call.return_ns, 8);
  return out;
}

Result<StoredRecord> decode_record_value(const RecordKey& key, std::string_view bytes) {
  if (bytes.size() < kRecordValueSize || static_cast<uint8_t>(bytes[0]) != kRecordVersion)
    return make_error(Errc::storage, "record value of an unknown layout (size " + std::to_string(bytes.size()) + ")");
  const char* p = bytes.data();
  StoredRecord record;
  record.key = key;
  record.call.seq = key.seq;
  record.call.op = static_cast<uint8_t>(p[1]);
  record.call.datatype = static_cast<uint8_t>(p[2]);
  record.call.redop = static_cast<uint8_t>(p[3]);
  record.call.result = static_cast<uint8_t>(p[4]);
  record.call.flags = static_cast<uint8_t>(p[5]);
  record.call.peer = static_cast<int32_t>(get_le(p + 8, 4));
  record.pid = static_cast<uint32_t>(get_le(p + 12, 4));
  record.call.count = get_le(p + 16, 8);
  record.call.issue_ns = get_le(p + 24, 8);
  record.call.return_ns = get_le(p + 32, 8);
  return record;
}

void WriteSet::put_record(const StoredRecord& record) {
  records_.emplace_back(encode_record_key(record.key), encode_record_value(record.call, record.pid));
  records_bytes_ += records_.back().first.size() + records_.back().second.size();
  // The histogram's finest bucket is about a second: the records of one
  // batch almost always fall in the same one, counted together.
  uint64_t bucket = record.call.issue_ns >> 30;
  if (bucket != last_bucket_) {
    flush_times();
    last_bucket_ = bucket;
  }
  ++last_bucket_count_;
}

void WriteSet::flush_times() {
  if (last_bucket_count_ > 0) times_.add(last_bucket_ << 30, last_bucket_count_);
  last_bucket_count_ = 0;
  last_bucket_ = UINT64_MAX;
}

void TimeHistogram::add(uint64_t ns, uint64_t count) {
  buckets_[ns >> shift_] += count;
  total_ += count;
  while (buckets_.size() > kMaxBuckets) {
    std::map<uint64_t, uint64_t> wider;
    for (const auto& [bucket, n] : buckets_) wider[bucket >> 1] += n;
    buckets_ = std::move(wider);
    ++shift_;
  }
}

void TimeHistogram::merge(const TimeHistogram& other) {
  for (const auto& [bucket, n] : other.buckets_) add(bucket << other.shift_, n);
}

void TimeHistogram::drop_before(uint64_t ns) {
  // A bucket goes only when it ends before `ns`.
  for (auto it = buckets_.begin(); it != buckets_.end() && ((it->first + 1) << shift_) <= ns;) {
    total_ -= it->second;
    it = buckets_.erase(it);
  }
}

uint64_t TimeHistogram::time_of_share(double share) const {
  if (buckets_.empty()) return 0;
  double wanted = share * static_cast<double>(total_);
  uint64_t seen = 0;
  for (const auto& [bucket, n] : buckets_) {
    seen += n;
    if (static_cast<double>(seen) >= wanted) return (bucket + 1) << shift_;
  }
  return (buckets_.rbegin()->first + 1) << shift_;
}

void WriteSet::add(Family family, std::string key, std::string value, bool erase) {
  writes_bytes_ += key.size() + value.size();
  writes_.push_back(Write{family, erase, std::move(key), std::move(value)});
}

void WriteSet::put_comm(uint64_t comm, std::string value) {
  std::string key;
  put_be(key, comm, 8);
  add(Family::comms, std::move(key), std::move(value));
}

void WriteSet::put_usage(const std::string& key, std::string value) {
  add(Family::usage, key, std::move(value));
}

void WriteSet::put_progress(uint64_t comm, int32_t rank, std::string value) {
  std::string key;
  put_be(key, comm, 8);
  put_be(key, static_cast<uint32_t>(rank), 4);
  add(Family::progress, std::move(key), std::move(value));
}

void WriteSet::delete_usage(const std::string& key) {
  add(Family::usage, key, "", true);
}

void WriteSet::put_node(const std::string& node, std::string value) {
  add(Family::nodes, node, std::move(value));
}

void WriteSet::put_finding(uint64_t id, std::string value) {
  std::string key;
  put_be(key, id, 8);
  add(Family::findings, std::move(key), std::move(value));
}

struct TimelineStore::Rocks {
  std::unique_ptr<rocksdb::CompactionFilter> retention_filter;  // outlives db (declared first)
  std::unique_ptr<rocksdb::DB> db;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;  // in the order opened: default, records, then Family's order
  rocksdb::ColumnFamilyHandle* records() const { return handles[1]; }
  rocksdb::ColumnFamilyHandle* family(WriteSet::Family f) const { return handles[2 + static_cast<size_t>(f)]; }
  ~Rocks() {
    for (auto* handle : handles) db->DestroyColumnFamilyHandle(handle);
  }
};

TimelineStore::TimelineStore() : rocks_(std::make_unique<Rocks>()) {}

namespace {
// With a disk cap: a memtable, and a table file, are a sixteenth of it.
uint64_t sixteenth_of_cap(uint64_t cap) { return std::clamp<uint64_t>(cap / 16, 256 << 10, 64 << 20); }
constexpr int kCappedMemtables = 2;
}  // namespace

uint64_t free_space_reserve(const StoreOptions& options) {
  uint64_t memtables = options.memtable_bytes;
  if (options.max_disk_bytes) memtables = std::min<uint64_t>(memtables, kCappedMemtables * sixteenth_of_cap(options.max_disk_bytes));
  return memtables + (16ull << 20);
}

Result<std::unique_ptr<TimelineStore>> TimelineStore::open(const std::string& path, const StoreOptions& store_options) {
  std::unique_ptr<TimelineStore> store(new TimelineStore());
  store->path_ = path;
  store->reserve_bytes_ = free_space_reserve(store_options);
  rocksdb::Options options;
  options.create_if_missing = true;
  options.create_missing_column_families = true;
  options.IncreaseParallelism(2);
  options.OptimizeLevelStyleCompaction(store_options.memtable_bytes);
  options.db_write_buffer_size = store_options.memtable_bytes;
  options.compression = rocksdb::kLZ4Compression;
  // RocksDB's own text log, kept small: it counts against the disk cap.
  options.keep_log_file_num = 3;
  options.max_log_file_size = 1 << 20;
  if (uint64_t cap = store_options.max_disk_bytes) {
    // Memtables and the write-ahead log are on disk (or will be) before any
    // compaction can free space: keep them a small share of the cap.
    options.write_buffer_size = sixteenth_of_cap(cap);
    options.max_write_buffer_number = kCappedMemtables;
    options.max_total_wal_size = std::clamp<uint64_t>(cap / 8, 1 << 20, 256 << 20);
    options.target_file_size_base = sixteenth_of_cap(cap);
    options.max_bytes_for_level_base = std::clamp<uint64_t>(cap / 4, 1 << 20, 512 << 20);
  }
  // One writer (the ingest thread): the memtable-insert hints below need it.
  options.allow_concurrent_memtable_write = false;
  rocksdb::ColumnFamilyOptions records_options(options);
  records_options.compaction_filter_factory = nullptr;
  // A rank's records arrive in sequence order: the memtable keeps, per
  // (comm, lane, rank) prefix, where the last one went, and inserts the next
  // beside it instead of searching the skip list from the top (that search
  // was a fifth of the collector's time with 8,192 ranks; about 250 bytes
  // per prefix of memtable).
  records_options.memtable_insert_with_hint_prefix_extractor.reset(rocksdb::NewFixedPrefixTransform(kRecordPrefixSize));
  Rocks& rocks = *store->rocks_;
  rocks.retention_filter = std::make_unique<RetentionFilter>(store->cutoff_);
  records_options.compaction_filter = rocks.retention_filter.get();
  // Opened by name: the order here is Rocks's (records, then WriteSet::Family's).
  std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions(options)},
      {"records", records_options},
      {"comms", rocksdb::ColumnFamilyOptions(options)},
      {"progress", rocksdb::ColumnFamilyOptions(options)},
      {"nodes", rocksdb::ColumnFamilyOptions(options)},
      {"findings", rocksdb::ColumnFamilyOptions(options)},
      {"usage", rocksdb::ColumnFamilyOptions(options)},
  };
  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::Status status = rocksdb::DB::Open(options, path, families, &handles, &db);
  if (!status.ok()) return storage_error(("opening the database at " + path).c_str(), status);
  rocks.db.reset(db);
  rocks.handles = std::move(handles);
  return store;
}

TimelineStore::~TimelineStore() = default;

Result<void> TimelineStore::commit(WriteSet& writes) {
  if (struct statvfs fs; statvfs(path_.c_str(), &fs) == 0) {
    uint64_t free = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    if (free < reserve_bytes_)
      return Error{Errc::storage, "the database's filesystem (" + path_ + ") has " + std::to_string(free >> 20) +
                                      " MiB free, under the " + std::to_string(reserve_bytes_ >> 20) +
                                      " MiB RocksDB needs for its log and memtable flushes; not writing until there "
                                      "is room (free space, lower --db-memory-mb, or set --max-disk-bytes)"};
  }
  if (failed_) {
    // RocksDB stops writing after an I/O error until told to resume (once
    // the cause, e.g. a full disk, is gone); still failing: try next time.
    if (rocksdb::Status resumed = rocks_->db->Resume(); !resumed.ok())
      return storage_error("resuming RocksDB after a failed write", resumed);
    failed_ = false;
  }
  rocksdb::WriteBatch batch;
  std::sort(writes.records_.begin(), writes.records_.end());
  for (const auto& [key, value] : writes.records_) batch.Put(rocks_->records(), key, value);
  for (const auto& write : writes.writes_) {
    if (write.erase)
      batch.Delete(rocks_->family(write.family), write.key);
    else
      batch.Put(rocks_->family(write.family), write.key, write.value);
  }
  writes.flush_times();
  rocksdb::WriteOptions options;
  options.sync = true;
  rocksdb::Status status = rocks_->db->Write(options, &batch);
  if (!status.ok()) {
    failed_ = true;
    return storage_error("writing to RocksDB", status);
  }
  writes.records_.clear();
  writes.records_bytes_ = 0;
  writes.writes_.clear();
  writes.writes_bytes_ = 0;
  if (!writes.times_.empty()) {
    std::lock_guard lock(times_mutex_);
    times_.merge(writes.times_);
    writes.times_ = TimeHistogram();
  }
  return {};
}

Result<void> TimelineStore::remove_before(uint64_t cutoff_ns) {
  uint64_t before = cutoff_->load();
  while (cutoff_ns > before && !cutoff_->compare_exchange_weak(before, cutoff_ns)) {
  }
  rocksdb::CompactRangeOptions options;
  // The last level too: that is where the oldest records are.
  options.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  rocksdb::Status status = rocks_->db->CompactRange(options, rocks_->records(), nullptr, nullptr);
  if (!status.ok()) return storage_error("compacting the records for retention", status);
  std::lock_guard lock(times_mutex_);
  times_.drop_before(cutoff_->load());
  return {};
}

uint64_t TimelineStore::disk_bytes() const {
  std::error_code ec;
  uint64_t total = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(path_, ec)) {
    std::error_code size_ec;  // a file compacted away while we look: skipped
    if (entry.is_regular_file(size_ec)) {
      uint64_t size = entry.file_size(size_ec);
      if (!size_ec) total += size;
    }
  }
  return total;
}

TimeHistogram TimelineStore::times() const {
  std::lock_guard lock(times_mutex_);
  return times_;
}

Result<void> TimelineStore::scan_times() {
  rocksdb::ReadOptions read;
  read.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(rocks_->db->NewIterator(read, rocks_->records()));
  TimeHistogram found;
  uint64_t cutoff = cutoff_->load();
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    auto value = it->value();
    if (value.size() < kRecordValueSize) continue;
    uint64_t issue = get_le(value.data() + 24, 8);
    if (issue >= cutoff) found.add(issue);
  }
  if (!it->status().ok()) return storage_error("scanning record times", it->status());
  std::lock_guard lock(times_mutex_);
  found.merge(times_);  // what was committed while we scanned is counted twice at worst: cut-offs err late, not early
  times_ = std::move(found);
  return {};
}

Result<std::vector<StoredRecord>> TimelineStore::tail(uint64_t comm, uint32_t lane, int32_t rank,
                                                      uint32_t last) const {
  std::string prefix = lane_rank_prefix(comm, lane, rank);
  std::unique_ptr<rocksdb::Iterator> it(rocks_->db->NewIterator(rocksdb::ReadOptions(), rocks_->records()));
  std::vector<StoredRecord> out;
  auto take = [&]() -> Result<void> {
    auto key = decode_record_key(std::string_view(it->key().data(), it->key().size()));
    if (!key) return make_error(Errc::storage, "malformed record key in the database");
    auto record = decode_record_value(*key, std::string_view(it->value().data(), it->value().size()));
    if (!record) return record.error();
    out.push_back(std::move(*record));
    return {};
  };
  if (last == 0) {
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next())
      if (auto r = take(); !r) return r.error();
  } else {
    std::string end = prefix;
    put_be(end, UINT64_MAX, 8);
    for (it->SeekForPrev(end); it->Valid() && it->key().starts_with(prefix) && out.size() < last; it->Prev())
      if (auto r = take(); !r) return r.error();
    std::reverse(out.begin(), out.end());
  }
  if (!it->status().ok()) return storage_error("reading records", it->status());
  return out;
}

Result<uint64_t> TimelineStore::count(uint64_t comm, uint32_t lane, int32_t rank) const {
  std::string prefix = lane_rank_prefix(comm, lane, rank);
  std::unique_ptr<rocksdb::Iterator> it(rocks_->db->NewIterator(rocksdb::ReadOptions(), rocks_->records()));
  uint64_t n = 0;
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) ++n;
  if (!it->status().ok()) return storage_error("counting records", it->status());
  return n;
}

Result<std::vector<std::string>> TimelineStore::all_values(WriteSet::Family family, const char* what) const {
  std::unique_ptr<rocksdb::Iterator> it(rocks_->db->NewIterator(rocksdb::ReadOptions(), rocks_->family(family)));
  std::vector<std::string> out;
  for (it->SeekToFirst(); it->Valid(); it->Next()) out.push_back(it->value().ToString());
  if (!it->status().ok()) return storage_error(what, it->status());
  return out;
}

Result<std::optional<std::string>> TimelineStore::get_usage(const std::string& key) const {
  std::string value;
  rocksdb::Status status =
      rocks_->db->Get(rocksdb::ReadOptions(), rocks_->family(WriteSet::Family::usage), key, &value);
  if (status.IsNotFound()) return std::optional<std::string>();
  if (!status.ok()) return storage_error("reading the usage ledger", status);
  return std::optional<std::string>(std::move(value));
}

Result<void> TimelineStore::scan_usage(const std::string& from, const std::string& to,
                                       const std::function<bool(std::string_view, std::string_view)>& row) const {
  rocksdb::ReadOptions read;
  rocksdb::Slice upper(to);
  read.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(rocks_->db->NewIterator(read, rocks_->family(WriteSet::Family::usage)));
  for (it->Seek(from); it->Valid(); it->Next())
    if (!row(std::string_view(it->key().data(), it->key().size()), std::string_view(it->value().data(), it->value().size())))
      break;
  if (!it->status().ok()) return storage_error("reading the usage ledger", it->status());
  return {};
}

Result<std::vector<std::string>> TimelineStore::all_comms() const {
  return all_values(WriteSet::Family::comms, "reading communicators");
}

Result<std::vector<std::string>> TimelineStore::comms_between(uint64_t first, uint64_t last) const {
  std::string from, to;
  put_be(from, first, 8);
  put_be(to, last, 8);
  std::unique_ptr<rocksdb::Iterator> it(
      rocks_->db->NewIterator(rocksdb::ReadOptions(), rocks_->family(WriteSet::Family::comms)));
  std::vector<std::string> out;
  for (it->Seek(from); it->Valid() && it->key().compare(to) <= 0; it->Next()) out.push_back(it->value().ToString());
  if (!it->status().ok()) return storage_error("reading communicators", it->status());
  return out;
}

Result<std::vector<TimelineStore::Progress>> TimelineStore::all_progress() const { return progress_rows(""); }

Result<std::vector<TimelineStore::Progress>> TimelineStore::progress_of(uint64_t comm) const {
  std::string prefix;
  put_be(prefix, comm, 8);
  return progress_rows(prefix);
}

Result<std::vector<TimelineStore::Progress>> TimelineStore::progress_rows(const std::string& prefix) const {
  std::vector<Progress> out;
  std::unique_ptr<rocksdb::Iterator> it(
      rocks_->db->NewIterator(rocksdb::ReadOptions(), rocks_->family(WriteSet::Family::progress)));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    rocksdb::Slice key = it->key();
    if (key.size() != kProgressKeySize)
      return make_error(Errc::storage, "a progress row has a key of " + std::to_string(key.size()) + " bytes, not " +
                                           std::to_string(kProgressKeySize) + ": the database is damaged");
    out.push_back(Progress{get_be(key.data(), 8), static_cast<int32_t>(get_be(key.data() + 8, 4)), it->value().ToString()});
  }
  if (!it->status().ok()) return storage_error("reading the members' progress", it->status());
  return out;
}
Result<std::vector<std::string>> TimelineStore::all_nodes() const {
  return all_values(WriteSet::Family::nodes, "reading nodes");
}
Result<std::vector<std::string>> TimelineStore::all_findings() const {
  return all_values(WriteSet::Family::findings, "reading findings");
}

}  // namespace rankscope::collector
