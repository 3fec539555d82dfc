#include "collector/store/write_set.h"

#include <algorithm>
#include <iterator>

#include "collector/store/bytes.h"
#include "common/format.h"

namespace rankscope::collector {

namespace {
constexpr size_t kRecordKeySize = 8 + 4 + 4 + 8;      // (comm, lane, rank, seq): the first layout's
constexpr size_t kBlockKeySize = kRecordKeySize + 8;  // ... of the block's last record, then the write's id

using bytes::get_be;
using bytes::get_le;
using bytes::put_be;
using bytes::put_le;

// Ranks are signed (a record whose rank is unknown carries -1); flipping the
// sign bit keeps byte order equal to numeric order.
uint32_t rank_bits(int32_t rank) { return static_cast<uint32_t>(rank) ^ 0x80000000u; }
int32_t rank_of(uint32_t bits) { return static_cast<int32_t>(bits ^ 0x80000000u); }
}  // namespace

std::string encode_timeline_prefix(uint64_t comm, uint32_t lane, int32_t rank) {
  std::string prefix;
  put_be(prefix, comm, 8);
  put_be(prefix, lane, 4);
  put_be(prefix, rank_bits(rank), 4);
  return prefix;
}

std::string encode_record_key(const RecordKey& key) {
  std::string out = encode_timeline_prefix(key.comm, key.lane, key.rank);
  put_be(out, key.seq, 8);
  return out;
}

std::string encode_block_key(const RecordKey& last, uint64_t write_id) {
  std::string out = encode_record_key(last);
  put_be(out, write_id, 8);
  return out;
}

std::optional<RecordKey> decode_record_key(std::string_view bytes) {
  if (bytes.size() != kRecordKeySize && bytes.size() != kBlockKeySize) return std::nullopt;
  RecordKey key;
  key.comm = get_be(bytes.data(), 8);
  key.lane = static_cast<uint32_t>(get_be(bytes.data() + 8, 4));
  key.rank = rank_of(static_cast<uint32_t>(get_be(bytes.data() + 12, 4)));
  key.seq = get_be(bytes.data() + 16, 8);
  if (bytes.size() == kBlockKeySize) key.write = get_be(bytes.data() + 24, 8);
  return key;
}

namespace {
// The first layout: one record per key (48 bytes, little-endian, version byte first):
// 0 version | 1 op | 2 datatype | 3 redop | 4 result | 5 flags | 6..7 zero
// 8 peer (i32) | 12 pid | 16 count | 24 issue_ns | 32 return_ns | 40..47 zero
constexpr uint8_t kSingleVersion = 1;
constexpr size_t kSingleSize = 48;
// Blocks (docs/protocol.md): version | latest issue_ns (u64 LE) | varint count | records.
constexpr uint8_t kBlockVersion = 2;
constexpr size_t kBlockHeaderSize = 1 + 8;

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
// Differences are taken modulo 2^64 and read back the same way: exact for any two values.
uint64_t zigzag(uint64_t difference) {
  const auto d = static_cast<int64_t>(difference);
  return (static_cast<uint64_t>(d) << 1) ^ static_cast<uint64_t>(d >> 63);
}
uint64_t unzigzag(uint64_t z) {
  return (z >> 1) ^ (~(z & 1) + 1);
}

// Reads a value's bytes front to back; any read past its end, or a varint
// longer than ten bytes, leaves it failed.
struct Reader {
  const char* p;
  const char* end;
  bool failed = false;
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (p == end) break;
      const auto byte = static_cast<uint8_t>(*p++);
      if (shift == 63 && byte > 1) break;  // past 64 bits
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return v;
    }
    failed = true;
    return 0;
  }
  uint8_t byte() {
    if (p == end) {
      failed = true;
      return 0;
    }
    return static_cast<uint8_t>(*p++);
  }
};

bool same_kind(const StoredRecord& a, const StoredRecord& b) {
  return a.call.op == b.call.op && a.call.datatype == b.call.datatype && a.call.redop == b.call.redop &&
         a.call.result == b.call.result && a.call.flags == b.call.flags && a.pid == b.pid;
}

Error damaged(const RecordKey& key, const std::string& what) {
  return make_error(Errc::storage, "a stored block of records of comm " + hex64(key.comm) + " rank " +
                                       std::to_string(key.rank) + " (ending at seq " + std::to_string(key.seq) +
                                       ") is damaged: " + what);
}

Result<void> decode_single(const RecordKey& key, std::string_view bytes, std::vector<StoredRecord>& out) {
  if (bytes.size() < kSingleSize) return damaged(key, "a single record of " + std::to_string(bytes.size()) + " bytes");
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
  out.push_back(record);
  return {};
}
}  // namespace

std::string encode_block(const StoredRecord* records, size_t n) {
  uint64_t latest = 0;
  for (size_t i = 0; i < n; ++i) latest = std::max(latest, records[i].call.issue_ns);
  std::string out;
  out.reserve(kBlockHeaderSize + 2 + n * 16);
  out.push_back(static_cast<char>(kBlockVersion));
  out.resize(kBlockHeaderSize);
  put_le(out.data() + 1, latest, 8);
  put_varint(out, n);
  uint64_t previous_issue = latest;
  for (size_t i = 0; i < n; ++i) {
    const StoredRecord& r = records[i];
    const bool kind_follows = i == 0 || !same_kind(r, records[i - 1]);
    out.push_back(static_cast<char>(kind_follows ? 1 : 0));
    if (kind_follows) {
      out.push_back(static_cast<char>(r.call.op));
      out.push_back(static_cast<char>(r.call.datatype));
      out.push_back(static_cast<char>(r.call.redop));
      out.push_back(static_cast<char>(r.call.result));
      out.push_back(static_cast<char>(r.call.flags));
      put_varint(out, r.pid);
    }
    // The first record's seq is told as its distance below the key's (the last's).
    put_varint(out, i == 0 ? records[n - 1].key.seq - r.key.seq : r.key.seq - records[i - 1].key.seq);
    put_varint(out, zigzag(static_cast<uint64_t>(static_cast<int64_t>(r.call.peer))));
    put_varint(out, r.call.count);
    put_varint(out, zigzag(r.call.issue_ns - previous_issue));
    put_varint(out, zigzag(r.call.return_ns - r.call.issue_ns));
    previous_issue = r.call.issue_ns;
  }
  return out;
}

Result<void> decode_stored_records(const RecordKey& key, std::string_view bytes, std::vector<StoredRecord>& out) {
  if (bytes.empty()) return damaged(key, "an empty value");
  const auto version = static_cast<uint8_t>(bytes[0]);
  if (version == kSingleVersion) return decode_single(key, bytes, out);
  if (version != kBlockVersion)
    return damaged(key, "layout version " + std::to_string(version) + ", which this collector does not know");
  if (bytes.size() < kBlockHeaderSize) return damaged(key, "a header of " + std::to_string(bytes.size()) + " bytes");
  const uint64_t latest = get_le(bytes.data() + 1, 8);
  Reader in{bytes.data() + kBlockHeaderSize, bytes.data() + bytes.size()};
  const uint64_t n = in.varint();
  if (in.failed || n == 0 || n > kMaxBlockRecords) return damaged(key, "a count of " + std::to_string(n) + " records");
  const size_t first = out.size();
  out.reserve(first + n);
  uint64_t previous_issue = latest, seq = 0, max_issue = 0;
  StoredRecord r;
  r.key = key;
  for (uint64_t i = 0; i < n && !in.failed; ++i) {
    const uint8_t kind = in.byte();
    if (kind > 1 || (i == 0 && kind == 0)) {
      in.failed = true;
      break;
    }
    if (kind == 1) {
      r.call.op = in.byte();
      r.call.datatype = in.byte();
      r.call.redop = in.byte();
      r.call.result = in.byte();
      r.call.flags = in.byte();
      const uint64_t pid = in.varint();
      if (pid > UINT32_MAX) in.failed = true;
      r.pid = static_cast<uint32_t>(pid);
    }
    const uint64_t step = in.varint();
    if (i == 0) {
      if (step > key.seq) in.failed = true;
      seq = key.seq - step;
    } else {
      if (step == 0 || step > key.seq - seq) in.failed = true;
      seq += step;
    }
    r.key.seq = r.call.seq = seq;
    const auto peer = static_cast<int64_t>(unzigzag(in.varint()));
    if (peer < INT32_MIN || peer > INT32_MAX) in.failed = true;
    r.call.peer = static_cast<int32_t>(peer);
    r.call.count = in.varint();
    r.call.issue_ns = previous_issue + unzigzag(in.varint());
    r.call.return_ns = r.call.issue_ns + unzigzag(in.varint());
    previous_issue = r.call.issue_ns;
    max_issue = std::max(max_issue, r.call.issue_ns);
    out.push_back(r);
  }
  if (in.failed || seq != key.seq || max_issue != latest || in.p != in.end) {
    out.resize(first);
    return damaged(key, "its records do not decode to what its key and header say");
  }
  return {};
}

std::optional<uint64_t> stored_latest_issue_ns(std::string_view value) {
  if (value.empty()) return std::nullopt;
  const auto version = static_cast<uint8_t>(value[0]);
  if (version == kSingleVersion && value.size() >= kSingleSize) return get_le(value.data() + 24, 8);
  if (version == kBlockVersion && value.size() >= kBlockHeaderSize) return get_le(value.data() + 1, 8);
  return std::nullopt;
}

void WriteSet::put_record(const StoredRecord& record) {
  records_.push_back(record);
  // The histogram's finest bucket is about a second: the records of one
  // batch almost always fall in the same one, counted together.
  uint64_t bucket = record.call.issue_ns >> 30;
  if (bucket != last_bucket_) {
    flush_times();
    last_bucket_ = bucket;
  }
  ++last_bucket_count_;
}

void WriteSet::put_under(WriteSet& older) {
  older.records_.insert(older.records_.end(), records_.begin(), records_.end());
  records_ = std::move(older.records_);
  older.writes_.insert(older.writes_.end(), std::make_move_iterator(writes_.begin()),
                       std::make_move_iterator(writes_.end()));
  writes_ = std::move(older.writes_);
  writes_bytes_ += older.writes_bytes_;
  older.flush_times();
  flush_times();
  times_.merge(older.times_);
  older = WriteSet();
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

}  // namespace rankscope::collector
