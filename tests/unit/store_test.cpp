// The timeline store on a real RocksDB in a temporary folder.
#include <gtest/gtest.h>
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
