#include "collector/store/write_set.h"

#include "collector/store/bytes.h"

namespace rankscope::collector {

namespace {
constexpr uint8_t kRecordVersion = 1;
constexpr size_t kRecordKeySize = 8 + 4 + 4 + 8;  // (comm, lane, rank, seq)
constexpr size_t kRecordValueSize = 48;

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

std::optional<uint64_t> record_issue_ns(std::string_view value) {
  if (value.size() < kRecordValueSize || static_cast<uint8_t>(value[0]) != kRecordVersion) return std::nullopt;
  return get_le(value.data() + 24, 8);  // encode_record_value's layout
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

}  // namespace rankscope::collector
