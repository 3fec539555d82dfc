// Key files, the allow-list and its ZAP decisions, the node a key is bound
// to, the per-connection rate limit, and retention: all without sockets
// (tests/e2e/auth_test.cpp runs them over real ones).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "collector/auth.h"
#include "collector/ingest/ingest.h"
#include "collector/ingest/rate_limit.h"
#include "collector/options.h"
#include "collector/retention.h"
#include "common/curve.h"
#include "tests/support/harness.h"
#include "tests/support/hello.h"
#include "tests/support/manual_clock.h"
#include "tests/support/store_commit.h"

namespace rankscope::collector {
namespace {

mode_t mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 0777;
}

TEST(KeyFile, WrittenPairReadsBackWithItsModes) {
  ASSERT_TRUE(curve::available()) << "Debian's libzmq is built with CurveZMQ";
  testing::TempDir dir;
  auto key = curve::generate("node-3", "agent");
  ASSERT_TRUE(key) << key.error().message;
  EXPECT_EQ(key->public_key.size(), curve::kZ85KeySize);
  EXPECT_NE(key->public_key, key->secret_key);
  ASSERT_TRUE(curve::write(dir.file("node-3"), *key, false));
  EXPECT_EQ(mode_of(dir.file("node-3.key")), 0600u);
  EXPECT_EQ(mode_of(dir.file("node-3.pub")), 0644u);

  auto secret = curve::read(dir.file("node-3.key"));
  ASSERT_TRUE(secret) << secret.error().message;
  EXPECT_EQ(secret->public_key, key->public_key);
  EXPECT_EQ(secret->secret_key, key->secret_key);
  EXPECT_EQ(secret->name, "node-3");
  EXPECT_EQ(secret->role, "agent");
  auto pub = curve::read(dir.file("node-3.pub"));
  ASSERT_TRUE(pub);
  EXPECT_EQ(pub->public_key, key->public_key);
  EXPECT_TRUE(pub->secret_key.empty()) << "a .pub file must not carry the secret";

  // Never replaced by accident.
  auto again = curve::write(dir.file("node-3"), *key, false);
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().message.find("already exists"), std::string::npos);
}

TEST(KeyFile, ClientKeysNeedTheSecretFile) {
  testing::TempDir dir;
  auto mine = curve::generate("alice", "client");
  auto collector = curve::generate("collector", "collector");
  ASSERT_TRUE(mine && collector);
  ASSERT_TRUE(curve::write(dir.file("alice"), *mine, false));
  ASSERT_TRUE(curve::write(dir.file("collector"), *collector, false));
  auto keys = curve::load_client_keys(dir.file("alice.key"), dir.file("collector.pub"));
  ASSERT_TRUE(keys) << keys.error().message;
  EXPECT_EQ(keys->server_key, collector->public_key);
  EXPECT_EQ(keys->secret_key, mine->secret_key);
  auto wrong = curve::load_client_keys(dir.file("alice.pub"), dir.file("collector.pub"));
  ASSERT_FALSE(wrong);
  EXPECT_NE(wrong.error().message.find("holds no secret-key"), std::string::npos) << wrong.error().message;
  auto missing = curve::load_client_keys(dir.file("nobody.key"), dir.file("collector.pub"));
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("cannot read key file"), std::string::npos);
}

TEST(KeyFile, MalformedKeysAreRefusedWithTheLine) {
  auto bad = curve::parse("curve\n    public-key = \"short\"\n", "x.pub");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("x.pub line 2: public-key is not a 40-character Z85 key"), std::string::npos)
      << bad.error().message;
  EXPECT_FALSE(curve::parse("metadata\n  name = \"a\"\n", "y.pub"));
  EXPECT_FALSE(curve::generate("two words", "agent"));
  EXPECT_FALSE(curve::generate("n", "admin"));
}

class AllowListTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_.file("allowed"));
    agent_ = add("node-1", "agent");
    client_ = add("alice", "client");
  }
  std::string add(const std::string& name, const std::string& role) {
    auto key = curve::generate(name, role);
    EXPECT_TRUE(key);
    EXPECT_TRUE(curve::write(dir_.file("allowed/" + name), *key, false));
    std::filesystem::remove(dir_.file("allowed/" + name + ".key"));  // an allow-list holds public keys
    return key->public_key;
  }
  testing::TempDir dir_;
  std::string agent_, client_;
};

TEST_F(AllowListTest, AgentKeysAreBoundToTheirNodeAndClientsToQueries) {
  AllowList allow(dir_.file("allowed"));
  ASSERT_TRUE(allow.load());
  EXPECT_EQ(allow.size(), 2u);
  auto agent = decide(allow, kAgentDomain, "CURVE", agent_);
  EXPECT_TRUE(agent.allowed);
  EXPECT_EQ(agent.user_id, "node-1");
  auto client = decide(allow, kQueryDomain, "CURVE", client_);
  EXPECT_TRUE(client.allowed);
  EXPECT_EQ(client.user_id, "client:alice");
  // Each key only where its role belongs.
  EXPECT_FALSE(decide(allow, kQueryDomain, "CURVE", agent_).allowed);
  EXPECT_FALSE(decide(allow, kAgentDomain, "CURVE", client_).allowed);
  auto stranger = curve::generate("x", "agent");
  auto refused = decide(allow, kAgentDomain, "CURVE", stranger->public_key);
  EXPECT_FALSE(refused.allowed);
  EXPECT_NE(refused.reason.find("not in the allow-list"), std::string::npos);
  EXPECT_FALSE(decide(allow, kAgentDomain, "NULL", agent_).allowed);
}

TEST_F(AllowListTest, ReloadsWhenTheDirectoryChanges) {
  AllowList allow(dir_.file("allowed"));
  ASSERT_TRUE(allow.load());
  std::string later = add("node-2", "agent");
  allow.refresh(1);  // first check: the directory changed since load()
  EXPECT_TRUE(decide(allow, kAgentDomain, "CURVE", later).allowed);
  std::filesystem::remove(dir_.file("allowed/node-1.pub"));
  allow.refresh(1 + 2'000'000'000ull);
  EXPECT_FALSE(decide(allow, kAgentDomain, "CURVE", agent_).allowed) << "a removed key is revoked";
}

TEST_F(AllowListTest, MissingDirectoryIsAClearError) {
  AllowList allow(dir_.file("nowhere"));
  auto r = allow.load();
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("is not a directory"), std::string::npos);
}

using FixedClock = testing::ManualClock;

std::string hello(const std::string& node) {
  return testing::hello_message(node, 5);
}

struct HelloAnswer {
  bool accepted = false;
  std::string reason;
};
HelloAnswer answer(const Outbox& out) {
  HelloAnswer a;
  EXPECT_EQ(out.now.size(), 1u);
  if (out.now.empty()) return a;
  auto read = proto::read_packed<wire::CollectorMessage>(out.now.back().second, proto::ReadLimits{}, [&](auto m) {
    a.accepted = m.getHelloReply().getAccepted();
    a.reason = m.getHelloReply().getReason();
  });
  EXPECT_TRUE(read);
  return a;
}

TEST(KeyBinding, HelloForAnotherNodeIsRefusedAndCounted) {
  testing::TempDir dir;
  auto store = TimelineStore::open(dir.file("db"));
  ASSERT_TRUE(store);
  FixedClock clock;
  testing::StoreCommit commit{**store};
  Ingest ingest(**store, commit, clock);
  Outbox own;
  ingest.on_agent_message("c1", hello("node-1"), own, "node-1");
  EXPECT_TRUE(answer(own).accepted);
  Outbox other;
  ingest.on_agent_message("c2", hello("node-2"), other, "node-1");
  HelloAnswer refused = answer(other);
  EXPECT_FALSE(refused.accepted);
  EXPECT_NE(refused.reason.find("bound to node node-1, not node-2"), std::string::npos) << refused.reason;
  EXPECT_EQ(ingest.node("node-2"), nullptr) << "no state made for the name it claimed";
  EXPECT_EQ(ingest.node("node-1")->bad_messages, 1u) << "counted against the node whose key it holds";
  EXPECT_EQ(ingest.counters().bad_messages, 1u);
  // Without a key (--insecure) any name is taken.
  Outbox plain;
  ingest.on_agent_message("c3", hello("node-2"), plain);
  EXPECT_TRUE(answer(plain).accepted);
}

TEST(KeyBinding, ThrottledMessagesAreCountedForTheirNode) {
  testing::TempDir dir;
  auto store = TimelineStore::open(dir.file("db"));
  ASSERT_TRUE(store);
  FixedClock clock;
  testing::StoreCommit commit{**store};
  Ingest ingest(**store, commit, clock);
  Outbox out;
  ingest.on_agent_message("c1", hello("node-1"), out, "node-1");
  ingest.on_throttled("c1", "node-1", "test");
  ingest.on_throttled("c1", "", "test");  // found through its Hello
  ingest.on_throttled("c9", "", "test");  // nobody: the total only
  EXPECT_EQ(ingest.node("node-1")->throttled_messages, 2u);
  EXPECT_EQ(ingest.counters().throttled_messages, 3u);
}

TEST(RateLimiter, ExcessIsDroppedAndTheBudgetRefills) {
  RateLimiter limit(10, 0);
  uint64_t t = 5'000'000'000ull;
  int passed = 0;
  for (int i = 0; i < 100; ++i) passed += limit.admit("flood", 100, t);
  EXPECT_EQ(passed, 10) << "a burst of one second's worth";
  EXPECT_TRUE(limit.admit("calm", 100, t)) << "another connection has its own budget";
  EXPECT_FALSE(limit.admit("flood", 100, t + 50'000'000ull));
  EXPECT_TRUE(limit.admit("flood", 100, t + 150'000'000ull)) << "a tenth of a second refills one message";
  passed = 0;
  for (int i = 0; i < 100; ++i) passed += limit.admit("flood", 100, t + 10'000'000'000ull);
  EXPECT_EQ(passed, 10) << "refilled up to the burst, not beyond";
}

TEST(RateLimiter, BytesBudgetAndLargeMessages) {
  RateLimiter limit(0, 1000);
  uint64_t t = 1'000'000'000ull;
  EXPECT_TRUE(limit.admit("a", 600, t));
  EXPECT_FALSE(limit.admit("a", 600, t));
  EXPECT_TRUE(limit.admit("a", 400, t));
  // Larger than a second's budget: passes only with a full bucket, else it never could.
  EXPECT_TRUE(limit.admit("b", 5000, t));
  EXPECT_FALSE(limit.admit("b", 5000, t + 500'000'000ull));
  EXPECT_TRUE(limit.admit("b", 5000, t + 6'000'000'000ull));
  RateLimiter off(0, 0);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(off.admit("x", 1 << 20, t));
}

TEST(Options, RetentionAndCapParse) {
  EXPECT_EQ(*parse_age_ns("30d"), 30ull * 86400 * 1'000'000'000ull);
  EXPECT_EQ(*parse_age_ns("90m"), 90ull * 60 * 1'000'000'000ull);
  EXPECT_EQ(*parse_age_ns("45"), 45ull * 1'000'000'000ull);
  EXPECT_EQ(*parse_age_ns(""), 0u);
  EXPECT_FALSE(parse_age_ns("3 weeks"));
  EXPECT_FALSE(parse_age_ns("-1d"));
  EXPECT_EQ(*parse_bytes("64M"), 64ull << 20);
  EXPECT_EQ(*parse_bytes("2GB"), 2ull << 30);
  EXPECT_EQ(*parse_bytes("4096"), 4096u);
  EXPECT_FALSE(parse_bytes("lots"));
  EXPECT_FALSE(parse_bytes("-5M"));
  const char* argv[] = {"rankscope-collector", "--retention", "7d", "--max-disk-bytes", "100G", "--insecure"};
  auto line = parse_command_line(6, argv, nullptr);
  ASSERT_TRUE(line) << line.error().message;
  EXPECT_TRUE(line->options.insecure);
  EXPECT_EQ(line->options.retention_ns(), 7ull * 86400 * 1'000'000'000ull);
  EXPECT_EQ(line->options.max_disk(), 100ull << 30);
  const char* tiny[] = {"rankscope-collector", "--max-disk-bytes", "1K"};
  EXPECT_FALSE(parse_command_line(3, tiny, nullptr));
}

StoredRecord record_at(uint64_t seq, uint64_t issue_ns) {
  StoredRecord r;
  r.key = RecordKey{0xfeed, 0, 0, seq};
  r.call.seq = seq;
  r.call.issue_ns = issue_ns;
  r.call.return_ns = issue_ns + 10;
  r.call.op = RS_OP_ALLREDUCE;
  return r;
}

TEST(Retention, RecordsBeforeTheCutoffGoAndLaterOnesStay) {
  testing::TempDir dir;
  auto store = TimelineStore::open(dir.file("db"));
  ASSERT_TRUE(store);
  const uint64_t second = 1'000'000'000ull;
  WriteSet writes = (*store)->writes();
  for (uint64_t seq = 0; seq < 100; ++seq) writes.put_record(record_at(seq, 1000 * second + seq * second));
  ASSERT_TRUE((*store)->commit(writes));
  EXPECT_EQ((*store)->times().total(), 100u);
  ASSERT_TRUE((*store)->remove_before(1040 * second));
  auto left = (*store)->tail(0xfeed, 0, 0, 0);
  ASSERT_TRUE(left);
  ASSERT_EQ(left->size(), 60u);
  EXPECT_EQ(left->front().call.seq, 40u);
  EXPECT_EQ(left->back().call.seq, 99u);
  // New records keep going in, and an earlier cut-off never brings anything back.
  WriteSet more = (*store)->writes();
  more.put_record(record_at(100, 1100 * second));
  ASSERT_TRUE((*store)->commit(more));
  ASSERT_TRUE((*store)->remove_before(1010 * second));
  EXPECT_EQ((*store)->cutoff_ns(), 1040 * second);
  EXPECT_EQ(*(*store)->count(0xfeed, 0, 0), 61u);
  // The time histogram forgets what went (whole buckets of about a second).
  EXPECT_LE((*store)->times().total(), 62u);
  EXPECT_GE((*store)->times().total(), 61u);
}

TEST(Retention, CutoffForAgeAndForTheCap) {
  const uint64_t second = 1'000'000'000ull;
  TimeHistogram times;
  for (uint64_t s = 0; s < 100; ++s) times.add(s * (1ull << 30), 10);  // 100 buckets of ~1 s, 10 records each
  RetentionPolicy age{50 * second, 0};
  EXPECT_EQ(age.cutoff(200 * second, 1 << 30, times), 150 * second);
  RetentionPolicy cap{0, 1000};
  EXPECT_EQ(cap.cutoff(200 * second, 690, times), 0u) << "under 70% of the cap: nothing goes";
  // 2000 bytes used of 1000: back to 500 means removing 75% of the records, oldest first.
  EXPECT_EQ(cap.cutoff(200 * second, 2000, times), 75ull << 30);
  // Never more than 90% at once.
  EXPECT_EQ(cap.cutoff(200 * second, 1'000'000, times), 90ull << 30);
  RetentionPolicy both{150 * second, 1000};
  EXPECT_EQ(both.cutoff(200 * second, 2000, times), 75ull << 30) << "the later of the two cut-offs";
}

TEST(Retention, HistogramWidensPastItsBucketBudget) {
  TimeHistogram times;
  for (uint64_t i = 0; i < 3 * TimeHistogram::kMaxBuckets; ++i) times.add(i << 30);
  EXPECT_EQ(times.total(), 3 * TimeHistogram::kMaxBuckets);
  uint64_t half = times.time_of_share(0.5);
  EXPECT_GE(half, (3 * TimeHistogram::kMaxBuckets / 2) << 30);
  EXPECT_LE(half, ((3 * TimeHistogram::kMaxBuckets / 2) + 8) << 30);
}

}  // namespace
}  // namespace rankscope::collector
