// The timeline store on a real RocksDB in a temporary folder.
#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <unistd.h>

#include <filesystem>

#include "collector/store/timeline_store.h"
#include "tests/support/harness.h"

namespace rankscope::collector {
namespace {

StoredRecord record(uint64_t comm, int32_t rank, uint64_t seq) {
  StoredRecord r;
  r.key = RecordKey{comm, 0, rank, seq};
  r.call.seq = seq;
  r.call.issue_ns = 1000 + seq * 10;
  r.call.return_ns = 1005 + seq * 10;
  r.call.count = 4096 + seq;
  r.call.op = RS_OP_ALLREDUCE;
  r.call.datatype = 7;
  r.call.peer = -1;
  r.pid = 77;
  return r;
}

TEST(TimelineStore, RewritingTheSameBatchChangesNothing) {
  testing::TempDir dir;
  auto store = TimelineStore::open(dir.file("db"));
  ASSERT_TRUE(store) << store.error().message;
  for (int round = 0; round < 3; ++round) {
    WriteSet writes = (*store)->writes();
    for (uint64_t seq = 0; seq < 50; ++seq) writes.put_record(record(0xabc, 2, seq));
    ASSERT_TRUE((*store)->commit(writes));
  }
  auto count = (*store)->count(0xabc, 0, 2);
  ASSERT_TRUE(count);
  EXPECT_EQ(*count, 50u);
}

TEST(TimelineStore, TailReturnsTheLastRecordsOfOneRankInOrder) {
  testing::TempDir dir;
  auto store = TimelineStore::open(dir.file("db"));
  ASSERT_TRUE(store);
  WriteSet writes = (*store)->writes();
  for (int32_t rank : {-1, 0, 1, 2})
    for (uint64_t seq = 0; seq < 300; ++seq) writes.put_record(record(0xabc, rank, seq));
  writes.put_record(record(0xabd, 1, 999));  // a neighbouring communicator
  ASSERT_TRUE((*store)->commit(writes));

  auto tail = (*store)->tail(0xabc, 0, 1, 5);
  ASSERT_TRUE(tail);
  ASSERT_EQ(tail->size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ((*tail)[i].key.seq, 295 + i);
    EXPECT_EQ((*tail)[i].key.rank, 1);
    EXPECT_EQ((*tail)[i].call, record(0xabc, 1, 295 + i).call);
    EXPECT_EQ((*tail)[i].pid, 77u);
  }
  auto all = (*store)->tail(0xabc, 0, -1, 0);
  ASSERT_TRUE(all);
  EXPECT_EQ(all->size(), 300u);
  EXPECT_EQ(all->front().key.rank, -1);
}

TEST(TimelineStore, ReopenedDatabaseHasWhatWasCommitted) {
  testing::TempDir dir;
  {
    auto store = TimelineStore::open(dir.file("db"));
    ASSERT_TRUE(store);
    WriteSet writes = (*store)->writes();
    writes.put_record(record(1, 0, 0));
    writes.put_comm(1, "comm-meta");
    writes.put_node("gpu-1", "node-meta");
    ASSERT_TRUE((*store)->commit(writes));
  }
  auto store = TimelineStore::open(dir.file("db"));
  ASSERT_TRUE(store);
  EXPECT_EQ(*(*store)->count(1, 0, 0), 1u);
  EXPECT_EQ(*(*store)->all_comms(), std::vector<std::string>{"comm-meta"});
  EXPECT_EQ(*(*store)->all_nodes(), std::vector<std::string>{"node-meta"});
}

// Records whose every field moves: peers (none, a rank), counts of every
// size, calls that returned before they were issued on the corrected clock,
// kinds and pids that change within a block, seq gaps.
std::vector<StoredRecord> varied(uint64_t comm, uint32_t lane, int32_t rank, uint64_t from, size_t n) {
  std::vector<StoredRecord> out;
  uint64_t seq = from;
  for (size_t i = 0; i < n; ++i) {
    StoredRecord r = record(comm, rank, seq);
    r.key.lane = lane;
    r.call.peer = i % 3 == 0 ? -1 : static_cast<int32_t>(i % 17);
    r.call.count = i % 5 == 0 ? UINT64_MAX - i : (1ull << (i % 60)) + i;
    r.call.issue_ns = 1'700'000'000'000'000'000ull + seq * 1'000'000 + (i % 7) * 999;
    r.call.return_ns = i % 4 == 0 ? r.call.issue_ns - 123 : r.call.issue_ns + i * 1000;
    r.call.op = static_cast<uint8_t>(i % 9 < 6 ? RS_OP_ALLREDUCE : RS_OP_SEND);
    r.call.result = static_cast<uint8_t>(i % 11 == 0 ? 3 : 0);
    r.call.flags = static_cast<uint8_t>(i % 13 == 0 ? 1 : 0);
    r.pid = i < n / 2 ? 77 : 4'000'000'000u;
    out.push_back(r);
    seq += 1 + i % 4;
  }
  return out;
}

void expect_same(const std::vector<StoredRecord>& got, const std::vector<StoredRecord>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].key.seq, want[i].key.seq) << i;
    EXPECT_EQ(got[i].key.rank, want[i].key.rank) << i;
    EXPECT_EQ(got[i].key.lane, want[i].key.lane) << i;
    EXPECT_EQ(got[i].call, want[i].call) << i;
    EXPECT_EQ(got[i].pid, want[i].pid) << i;
  }
}

TEST(TimelineStore, BlocksGiveBackEveryFieldOfEveryRecord) {
  testing::TempDir dir;
  auto store = TimelineStore::open(dir.file("db"));
  ASSERT_TRUE(store);
  // More records of one timeline than one block holds, next to two short ones.
  auto a = varied(0xabc, 0, 3, 5, kMaxBlockRecords * 2 + 7);
  auto b = varied(0xabc, 4, 3, 0, 1);
  auto c = varied(0xabc, 0, -1, 100, 3);
  WriteSet writes = (*store)->writes();
  // Put interleaved, as batches of many nodes arrive.
  for (size_t i = 0; i < a.size(); ++i) {
    writes.put_record(a[i]);
    if (i < b.size()) writes.put_record(b[i]);
    if (i < c.size()) writes.put_record(c[i]);
  }
  ASSERT_TRUE((*store)->commit(writes));
  auto got = (*store)->tail(0xabc, 0, 3, 0);
  ASSERT_TRUE(got) << got.error().message;
  expect_same(*got, a);
  expect_same(*(*store)->tail(0xabc, 4, 3, 0), b);
  expect_same(*(*store)->tail(0xabc, 0, -1, 0), c);
  for (uint32_t last : {1u, 2u, kMaxBlockRecords, kMaxBlockRecords + 1, static_cast<uint32_t>(a.size())}) {
    auto tail = (*store)->tail(0xabc, 0, 3, last);
    ASSERT_TRUE(tail);
    expect_same(*tail, std::vector<StoredRecord>(a.end() - last, a.end()));
  }
}

// A batch lost and re-sent after later ones were stored: its records land in
// a block between (and overlapping) blocks already written. A batch applied
// again (its ack window forgotten) writes a block ending where an earlier,
// longer one ends: neither replaces the other. A record put twice is read
// once, the later write's copy.
TEST(TimelineStore, BlocksOfOneTimelineFromSeveralCommitsReadInOrderEachRecordOnce) {
  testing::TempDir dir;
  auto store = TimelineStore::open(dir.file("db"));
  ASSERT_TRUE(store);
  std::vector<StoredRecord> all;
  for (uint64_t seq = 0; seq < 60; ++seq) all.push_back(record(0xabc, 1, seq));
  auto commit = [&](std::vector<std::pair<uint64_t, uint64_t>> ranges) {
    WriteSet writes = (*store)->writes();
    for (auto [from, to] : ranges)
      for (uint64_t seq = from; seq < to; ++seq) writes.put_record(all[seq]);
    ASSERT_TRUE((*store)->commit(writes));
  };
  commit({{0, 10}, {20, 30}});   // batches 1 and 3 in one commit: one block 0..29 with a hole
  commit({{40, 50}});            // batch 5
  commit({{10, 20}, {25, 28}});  // batch 2 re-sent late, and three records of batch 3 again
  commit({{20, 30}});            // batch 3 again: a block 20..29, ending where the first one does
  commit({{30, 40}, {50, 60}});  // batches 4 and 6
  // Batch 5 again, converted with a newer clock estimate: that copy is read.
  for (uint64_t seq = 40; seq < 50; ++seq) all[seq].call.issue_ns += 7;
  commit({{40, 50}});
  auto got = (*store)->tail(0xabc, 0, 1, 0);
  ASSERT_TRUE(got);
  expect_same(*got, all);
  EXPECT_EQ(*(*store)->count(0xabc, 0, 1), 60u);
  for (uint32_t last = 1; last <= 61; ++last) {
    auto tail = (*store)->tail(0xabc, 0, 1, last);
    ASSERT_TRUE(tail);
    expect_same(*tail, std::vector<StoredRecord>(all.end() - std::min<uint32_t>(last, 60), all.end()));
  }
}

// A database written when each record had a key of its own (the first
// layout, docs/protocol.md) is read as it is, beside blocks written since;
// a value of a layout this collector does not know is a clear error.
TEST(TimelineStore, RecordsOfTheFirstLayoutAreReadBesideBlocksAndAnUnknownLayoutIsAnError) {
  testing::TempDir dir;
  const std::string path = dir.file("db");
  auto first_layout = [](const StoredRecord& r) {
    std::string v(48, '\0');
    auto le = [&](size_t at, uint64_t x, int n) {
      for (int i = 0; i < n; ++i) v[at + i] = static_cast<char>((x >> (8 * i)) & 0xff);
    };
    v[0] = 1;
    v[1] = static_cast<char>(r.call.op);
    v[2] = static_cast<char>(r.call.datatype);
    v[3] = static_cast<char>(r.call.redop);
    v[4] = static_cast<char>(r.call.result);
    v[5] = static_cast<char>(r.call.flags);
    le(8, static_cast<uint32_t>(r.call.peer), 4);
    le(12, r.pid, 4);
    le(16, r.call.count, 8);
    le(24, r.call.issue_ns, 8);
    le(32, r.call.return_ns, 8);
    return v;
  };
  auto old = varied(0xabc, 0, 2, 0, 20);
  {
    rocksdb::Options options;
    options.create_if_missing = true;
    options.create_missing_column_families = true;
    std::vector<rocksdb::ColumnFamilyDescriptor> families = {{rocksdb::kDefaultColumnFamilyName, {}}, {"records", {}}};
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(options, path, families, &handles, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    for (const auto& r : old) ASSERT_TRUE(db->Put({}, handles[1], encode_record_key(r.key), first_layout(r)).ok());
    RecordKey unknown{0xdef, 0, 0, 7};
    ASSERT_TRUE(db->Put({}, handles[1], encode_record_key(unknown), std::string("\x09whatever")).ok());
    for (auto* handle : handles) db->DestroyColumnFamilyHandle(handle);
  }
  auto store = TimelineStore::open(path);
  ASSERT_TRUE(store) << store.error().message;
  ASSERT_TRUE((*store)->scan_times());
  EXPECT_EQ((*store)->times().total(), old.size());
  auto newer = varied(0xabc, 0, 2, old.back().key.seq + 1, 30);
  WriteSet writes = (*store)->writes();
  for (const auto& r : newer) writes.put_record(r);
  ASSERT_TRUE((*store)->commit(writes));
  auto want = old;
  want.insert(want.end(), newer.begin(), newer.end());
  expect_same(*(*store)->tail(0xabc, 0, 2, 0), want);
  expect_same(*(*store)->tail(0xabc, 0, 2, 35), std::vector<StoredRecord>(want.end() - 35, want.end()));
  // Retention reads both layouts' times.
  const uint64_t cutoff = old[10].call.issue_ns;
  ASSERT_TRUE((*store)->remove_before(cutoff));
  expect_same(*(*store)->tail(0xabc, 0, 2, 0), std::vector<StoredRecord>(want.begin() + 10, want.end()));

  auto damaged = (*store)->tail(0xdef, 0, 0, 0);
  ASSERT_FALSE(damaged);
  EXPECT_NE(damaged.error().message.find("layout version 9"), std::string::npos) << damaged.error().message;
}

TEST(TimelineStore, ABlockThatDoesNotHoldWhatItSaysIsRefused) {
  auto records = varied(0xabc, 0, 0, 10, 50);
  const std::string good = encode_block(records.data(), records.size());
  const RecordKey key = records.back().key;
  std::vector<StoredRecord> out;
  ASSERT_TRUE(decode_stored_records(key, good, out));
  expect_same(out, records);
  // Every truncation, a byte too many and each single flipped byte: refused or read whole, never partly.
  for (size_t cut = 0; cut < good.size(); ++cut) {
    out.clear();
    EXPECT_FALSE(decode_stored_records(key, good.substr(0, cut), out)) << cut;
    EXPECT_TRUE(out.empty());
  }
  EXPECT_FALSE(decode_stored_records(key, good + '\0', out));
  for (size_t at = 0; at < good.size(); ++at) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x40);
    out.clear();
    if (!decode_stored_records(key, bad, out))
      EXPECT_TRUE(out.empty()) << at;
    else
      EXPECT_EQ(out.size(), records.size()) << at;
  }
}

// Fields past their type's range are damage, not values cut short.
TEST(TimelineStore, ABlockWithAFieldPastItsRangeIsRefused) {
  auto block = [](std::string pid, std::string count) {
    std::string v(1, '\x02');
    v += std::string(8, '\0');                    // latest issue: 0
    v += '\x01';                                  // one record
    v += '\x01';                                  // its kind follows
    v += std::string("\x01\x07\x00\x00\x00", 5);  // op, datatype, redop, result, flags
    v += pid;
    v += '\0';    // seq: the key's
    v += '\x01';  // peer -1
    v += count;
    v += '\0';  // issue: the header's
    v += '\0';  // returned when issued
    return v;
  };
  const RecordKey key{0xabc, 0, 0, 9};
  std::vector<StoredRecord> out;
  ASSERT_TRUE(decode_stored_records(key, block(std::string("\xff\xff\xff\xff\x0f", 5), "\x05"), out));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].pid, UINT32_MAX);
  EXPECT_EQ(out[0].call.count, 5u);
  EXPECT_EQ(out[0].call.peer, -1);
  out.clear();
  EXPECT_FALSE(decode_stored_records(key, block(std::string("\xff\xff\xff\xff\x1f", 5), "\x05"), out))
      << "a pid past 32 bits";
  std::string max64(9, '\xff');
  EXPECT_TRUE(decode_stored_records(key, block("\x01", max64 + '\x01'), out)) << "2^64 - 1 is a count";
  EXPECT_EQ(out.back().call.count, UINT64_MAX);
  out.clear();
  EXPECT_FALSE(decode_stored_records(key, block("\x01", max64 + '\x02'), out)) << "a count past 64 bits";
  EXPECT_TRUE(out.empty());
}

TEST(TimelineStore, UnopenableDatabaseIsAClearError) {
  auto store = TimelineStore::open("/proc/version/db");
  ASSERT_FALSE(store);
  EXPECT_NE(store.error().message.find("/proc/version/db"), std::string::npos);
}

// A full disk: Debian's RocksDB aborts the process when its log cannot be
// written, so the store stops short of the disk's end. Here a real small
// filesystem (a tmpfs the test mounts) filled by another file.
TEST(TimelineStore, AFilesystemWithoutRoomIsAnErrorNotACrashAndWritesResumeOnceFreed) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root: run the suite as root (sudo make test)";
  testing::TempDir dir;
  std::string mount = dir.file("small");
  std::filesystem::create_directory(mount);
  ASSERT_EQ(testing::run_command("mount -t tmpfs -o size=48m tmpfs " + mount), 0);
  struct Unmount {
    std::string path;
    ~Unmount() { testing::run_command("umount " + path); }
  } unmount{mount};
  StoreOptions options;
  options.max_disk_bytes = 8ull << 20;  // small memtables: a reserve that fits the small disk
  ASSERT_LT(free_space_reserve(options), 40ull << 20);
  auto store = TimelineStore::open(mount + "/db", options);
  ASSERT_TRUE(store) << store.error().message;
  WriteSet writes = (*store)->writes();
  for (uint64_t seq = 0; seq < 100; ++seq) writes.put_record(record(0xf11, 0, seq));
  ASSERT_TRUE((*store)->commit(writes));

  // Another file takes the disk down to less than the reserve.
  ASSERT_EQ(testing::run_command("dd if=/dev/zero of=" + mount + "/filler bs=64k 2>/dev/null; true"), 0);
  for (uint64_t seq = 100; seq < 200; ++seq) writes.put_record(record(0xf11, 0, seq));
  auto full = (*store)->commit(writes);
  ASSERT_FALSE(full) << "no room: the commit fails (the process is still here to say so)";
  EXPECT_NE(full.error().message.find("MiB free"), std::string::npos) << full.error().message;
  EXPECT_EQ(*(*store)->count(0xf11, 0, 0), 100u);

  std::filesystem::remove(mount + "/filler");
  ASSERT_TRUE((*store)->commit(writes)) << "room again: what the failed commit held is written";
  EXPECT_EQ(*(*store)->count(0xf11, 0, 0), 200u);
}

}  // namespace
}  // namespace rankscope::collector
