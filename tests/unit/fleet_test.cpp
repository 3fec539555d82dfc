// A fleet of collectors, the parts that need no etcd: placement by
// rendezvous hashing, the members' records, etcd's base64 and the
// endpoints' checks. (tests/e2e/fleet_test.cpp runs real etcd.)
#include <gtest/gtest.h>

#include <map>

#include "collector/fleet/etcd.h"
#include "common/placement.h"

namespace rankscope::fleet {
namespace {

std::vector<Member> members_named(const std::vector<std::string>& ids) {
  std::vector<Member> out;
  for (const auto& id : ids) out.push_back({id, "tcp://" + id + ":7600", "tcp://" + id + ":7601", "", "", "", 0});
  return out;
}

TEST(Placement, EveryReaderAgreesWhateverOrderItKnowsTheMembersIn) {
  auto forward = members_named({"c1", "c2", "c3", "c4"});
  auto backward = members_named({"c4", "c3", "c2", "c1"});
  for (int i = 0; i < 1000; ++i) {
    std::string key = placement_key("job-" + std::to_string(i), 0);
    EXPECT_EQ(owner(key, forward)->id, owner(key, backward)->id) << key;
  }
  EXPECT_EQ(owner("job:x", {}), nullptr);
}

TEST(Placement, JobsSpreadOverTheMembersAndOnlyALostMembersJobsMove) {
  auto all = members_named({"c1", "c2", "c3"});
  auto survivors = members_named({"c1", "c3"});
  std::map<std::string, int> owned;
  int moved = 0;
  constexpr int kJobs = 3000;
  for (int i = 0; i < kJobs; ++i) {
    std::string key = placement_key(std::to_string(100000 + i), 0);
    const std::string before = owner(key, all)->id, after = owner(key, survivors)->id;
    ++owned[before];
    if (before != "c2") {
      EXPECT_EQ(before, after) << key << ": owned by a survivor, so it stays";
    }
    moved += before != after;
  }
  // Each member's share of 3,000 keys: 1,000 expected, sd 26; 6 sd either side.
  for (const auto& [id, count] : owned) EXPECT_NEAR(count, kJobs / 3, 160) << id;
  EXPECT_EQ(moved, owned["c2"]);
}

TEST(Placement, ACommunicatorWithoutAJobIsPlacedByItsHash) {
  EXPECT_EQ(placement_key("", 0xabc), "comm:0000000000000abc");
  EXPECT_EQ(placement_key("4711", 0xabc), "job:4711");
  // The separator: ("ab", "c") and ("a", "bc") score apart.
  EXPECT_NE(rendezvous_score("ab", "c"), rendezvous_score("a", "bc"));
}

TEST(Placement, AMembersRecordReadsBackAndAnythingElseIsRefused) {
  Member m{"c1",
           "tcp://10.0.0.5:7600",
           "tcp://10.0.0.5:7601",
           "10.0.0.5:9464",
           "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7",
           "1.2.3",
           1'700'000'000'000'000'000ull};
  auto back = parse_member(member_json(m));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->id, m.id);
  EXPECT_EQ(back->agents, m.agents);
  EXPECT_EQ(back->queries, m.queries);
  EXPECT_EQ(back->metrics, m.metrics);
  EXPECT_EQ(back->public_key, m.public_key);
  EXPECT_EQ(back->started_ns, m.started_ns);
  for (const char* bad :
       {"", "[]", "{\"id\":\"c1\"}", "{\"id\":7,\"queries\":\"tcp://x:1\"}", "{\"queries\":\"q\"}", "not json"})
    EXPECT_FALSE(parse_member(bad)) << bad;
}

TEST(Etcd, BytesGoAsBase64BothWays) {
  for (std::string bytes : {std::string(), std::string("/rankscope/collectors/"), std::string("\0\xff\x01", 3)}) {
    auto back = from_base64(base64(bytes));
    ASSERT_TRUE(back);
    EXPECT_EQ(*back, bytes);
  }
  EXPECT_EQ(base64("/rankscope/"), "L3JhbmtzY29wZS8=");
  EXPECT_FALSE(from_base64("not base64!"));
}

TEST(Etcd, EndpointsAreCheckedAndADeadOneSaysSo) {
  EXPECT_FALSE(EtcdClient::make(""));
  EXPECT_FALSE(EtcdClient::make("etcd:2379"));  // no scheme
  EXPECT_FALSE(EtcdClient::make("http://e:2379/v3"));
  auto two = EtcdClient::make("http://e1:2379,,https://e2:2379");
  ASSERT_TRUE(two) << two.error().message;
  EXPECT_EQ(two->endpoints(), (std::vector<std::string>{"http://e1:2379", "https://e2:2379"}));
  // Nothing listens on port 1: the error names the endpoint and what failed.
  collector::HttpClientOptions http;
  http.timeout_ms = 1000;
  auto dead = EtcdClient::make("http://127.0.0.1:1", http);
  ASSERT_TRUE(dead);
  auto read = dead->range_prefix("/rankscope/");
  ASSERT_FALSE(read);
  EXPECT_NE(read.error().message.find("no etcd endpoint answered (http://127.0.0.1:1: "), std::string::npos)
      << read.error().message;
}

}  // namespace
}  // namespace rankscope::fleet
