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
#include <tuple>

#include "collector/store/bytes.h"

namespace rankscope::collector {

namespace {
constexpr size_t kRecordPrefixSize = 8 + 4 + 4;  // (comm, lane, rank): one rank's timeline (encode_timeline_prefix)
constexpr size_t kProgressKeySize = 8 + 4;  // (comm, rank)

using bytes::get_be;
using bytes::put_be;

Error storage_error(const char* what, const rocksdb::Status& status) {
  return make_error(Errc::storage, std::string(what) + ": " + status.ToString());
}

// Drops the blocks of records issued before the cut-off as RocksDB compacts
// (rocksdb/compaction_filter.h): retention without a scan of the keys, which
// are ordered by communicator and sequence, not by time.
class RetentionFilter final : public rocksdb::CompactionFilter {
 public:
  explicit RetentionFilter(std::shared_ptr<std::atomic<uint64_t>> cutoff) : cutoff_(std::move(cutoff)) {}
  bool Filter(int, const rocksdb::Slice&, const rocksdb::Slice& value, std::string*, bool*) const override {
    uint64_t cutoff = cutoff_->load(std::memory_order_relaxed);
    if (cutoff == 0) return false;
    // A block goes once all its records are before the cut-off (reads leave out those of a block that stays).
    auto latest = stored_latest_issue_ns(std::string_view(value.data(), value.size()));
    return latest && *latest < cutoff;
  }
  const char* Name() const override { return "rankscope.RetentionFilter"; }

 private:
  std::shared_ptr<std::atomic<uint64_t>> cutoff_;
};

}  // namespace

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
  // One writer at a time (the commit's writer thread, or the loop when it
  // commits itself): the memtable-insert hints below need it.
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
  // Each timeline's records in sequence order (a record put twice: the later
  // one), cut into blocks, in key order.
  auto& records = writes.records_;
  std::stable_sort(records.begin(), records.end(), [](const StoredRecord& a, const StoredRecord& b) {
    return std::tie(a.key.comm, a.key.lane, a.key.rank, a.key.seq) <
           std::tie(b.key.comm, b.key.lane, b.key.rank, b.key.seq);
  });
  auto same_timeline = [](const RecordKey& a, const RecordKey& b) {
    return a.comm == b.comm && a.lane == b.lane && a.rank == b.rank;
  };
  // Each block's key ends with an id of this write (RocksDB's sequence
  // number, never used again): a block never replaces another, however its
  // records overlap those of blocks written before.
  const uint64_t write_id = rocks_->db->GetLatestSequenceNumber() + 1;
  std::vector<StoredRecord> run;
  for (size_t i = 0; i < records.size(); ++i) {
    const bool duplicate = i + 1 < records.size() && same_timeline(records[i].key, records[i + 1].key) &&
                           records[i].key.seq == records[i + 1].key.seq;
    if (!duplicate) run.push_back(records[i]);
    const bool run_ends = i + 1 == records.size() || !same_timeline(records[i].key, records[i + 1].key);
    if (run.size() == kMaxBlockRecords || (run_ends && !run.empty())) {
      batch.Put(rocks_->records(), encode_block_key(run.back().key, write_id), encode_block(run.data(), run.size()));
      run.clear();
    }
  }
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
  std::vector<StoredRecord> records;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    auto key = decode_record_key(std::string_view(it->key().data(), it->key().size()));
    records.clear();
    if (!key || !decode_stored_records(*key, std::string_view(it->value().data(), it->value().size()), records))
      continue;  // damaged: a query of its timeline says so
    for (const auto& r : records)
      if (r.call.issue_ns >= cutoff) found.add(r.call.issue_ns);
  }
  if (!it->status().ok()) return storage_error("scanning record times", it->status());
  std::lock_guard lock(times_mutex_);
  found.merge(times_);  // what was committed while we scanned is counted twice at worst: cut-offs err late, not early
  times_ = std::move(found);
  return {};
}

namespace {
// Records read from a timeline's blocks, as a query sees them: in sequence
// order, each seq once (blocks of two writes may overlap: a batch applied
// again; the later write's copy wins), none issued before the retention
// cut-off.
void settle(std::vector<StoredRecord>& records, uint64_t cutoff) {
  auto order = [](const StoredRecord& a, const StoredRecord& b) {
    return std::tie(a.key.seq, a.key.write) < std::tie(b.key.seq, b.key.write);
  };
  if (!std::is_sorted(records.begin(), records.end(), order)) std::sort(records.begin(), records.end(), order);
  // Of equal seqs, the last (the latest write's) stays.
  size_t kept = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    if (i + 1 < records.size() && records[i + 1].key.seq == records[i].key.seq) continue;
    if (cutoff && records[i].call.issue_ns < cutoff) continue;
    if (kept != i) records[kept] = records[i];
    ++kept;
  }
  records.resize(kept);
}
}  // namespace

Result<std::vector<StoredRecord>> TimelineStore::tail(uint64_t comm, uint32_t lane, int32_t rank,
                                                      uint32_t last) const {
  std::string prefix = encode_timeline_prefix(comm, lane, rank);
  std::unique_ptr<rocksdb::Iterator> it(rocks_->db->NewIterator(rocksdb::ReadOptions(), rocks_->records()));
  const uint64_t cutoff = cutoff_->load();
  auto take = [&](std::vector<StoredRecord>& into) -> Result<void> {
    auto key = decode_record_key(std::string_view(it->key().data(), it->key().size()));
    if (!key) return make_error(Errc::storage, "malformed record key in the database");
    return decode_stored_records(*key, std::string_view(it->value().data(), it->value().size()), into);
  };
  std::vector<StoredRecord> out;
  if (last == 0) {
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next())
      if (auto r = take(out); !r) return r.error();
  } else {
    // Blocks from the newest key back. A block's key begins with its last
    // seq, so once `last` distinct seqs (not before the cut-off) are in
    // hand, a block whose key's seq is below the `last`-th newest of them
    // has nothing newer to add.
    std::vector<std::vector<StoredRecord>> blocks;  // newest key first
    size_t held = 0;
    std::string end = prefix + std::string(16, '\xff');
    for (it->SeekForPrev(end); it->Valid() && it->key().starts_with(prefix); it->Prev()) {
      if (held >= last) {
        std::vector<uint64_t> seqs;
        for (const auto& block : blocks)
          for (const auto& r : block)
            if (!cutoff || r.call.issue_ns >= cutoff) seqs.push_back(r.key.seq);
        std::sort(seqs.begin(), seqs.end());
        seqs.erase(std::unique(seqs.begin(), seqs.end()), seqs.end());
        auto key = decode_record_key(std::string_view(it->key().data(), it->key().size()));
        if (seqs.size() >= last && key && key->seq < seqs[seqs.size() - last]) break;
      }
      blocks.emplace_back();
      if (auto r = take(blocks.back()); !r) return r.error();
      held += blocks.back().size();
    }
    for (auto block = blocks.rbegin(); block != blocks.rend(); ++block)
      out.insert(out.end(), block->begin(), block->end());
  }
  if (!it->status().ok()) return storage_error("reading records", it->status());
  settle(out, cutoff);
  if (last != 0 && out.size() > last) out.erase(out.begin(), out.end() - last);
  return out;
}

Result<uint64_t> TimelineStore::count(uint64_t comm, uint32_t lane, int32_t rank) const {
  auto records = tail(comm, lane, rank, 0);
  if (!records) return make_error(Errc::storage, "counting records: " + records.error().message);
  return records->size();
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
