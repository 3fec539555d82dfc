// The usage ledger fed by the collective matcher alone: a cluster model built
// by hand, records handed to the matcher and the ledger as the ingest hands
// them, the ledger's rows kept in a map. No RocksDB, no wire message.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "collector/detect/finding.h"
#include "collector/match/matcher.h"
#include "collector/model/cluster.h"
#include "collector/usage/ledger.h"
#include "collector/usage/report.h"
#include "proto/records.h"
#include "tests/support/model.h"

namespace rankscope::collector {
namespace {

constexpr uint64_t kS = 1'000'000'000ull;
constexpr uint64_t kMs = 1'000'000ull;
constexpr uint64_t kDay0 = 1'700'006'400ull;  // a UTC midnight (2023-11-15), in seconds
constexpr uint64_t kComm = 0x5eed0000c0ffee22ull;

// The ledger's rows in memory: what a commit's usage writes leave.
class MemoryRows final : public UsageRows {
 public:
  Result<std::optional<std::string>> get_usage(const std::string& key) const override {
    auto it = rows_.find(key);
    return it == rows_.end() ? std::optional<std::string>() : std::optional<std::string>(it->second);
  }
  Result<void> scan_usage(const std::string& from, const std::string& to,
                          const std::function<bool(std::string_view, std::string_view)>& row) const override {
    for (auto it = rows_.lower_bound(from); it != rows_.end() && it->first < to; ++it)
      if (!row(it->first, it->second)) break;
    return {};
  }
  void apply(const WriteSet& writes) {
    for (const auto& w : writes.writes()) {
      if (w.family != WriteSet::Family::usage) continue;
      if (w.erase)
        rows_.erase(w.key);
      else
        rows_[w.key] = w.value;
    }
  }

 private:
  std::map<std::string, std::string> rows_;
};

class UsageFromMatcherTest : public ::testing::Test {
 protected:
  // `nranks` ranks, two per node; the last rank's process bills to "chem",
  // the others' to "physics".
  void start(int32_t nranks) {
    this->nranks = nranks;
    testing::add_comm(model, kComm, nranks, "job-1");
    for (auto& [key, process] : model.processes) process.account = process.rank == nranks - 1 ? "chem" : "physics";
    ledger = std::make_unique<UsageLedger>(model, matcher, rows, UsageOptions{});
  }

  // Every rank issues AllReduce #seq at t + delay(rank): to the matcher,
  // then to the ledger (the ingest's order of observers).
  void instance(uint64_t seq, uint64_t t, const std::function<uint64_t(int32_t)>& delay) {
    CommState& comm = model.comms.at(kComm);
    for (int32_t r = 0; r < nranks; ++r) {
      proto::CallRecord call = testing::allreduce(comm.members.at(r), seq, t + delay(r));
      matcher.on_record(comm, r, 0, call);
      ledger->on_record(comm, r, 0, call);
    }
  }

  // A commit that succeeds: the ledger stages, the rows take the writes.
  void commit(uint64_t now_ns) {
    WriteSet writes;
    auto staged = ledger->stage(writes, now_ns, true);
    ASSERT_TRUE(staged) << staged.error().message;
    rows.apply(writes);
    ledger->committed();
  }

  Report report(uint64_t from_s = kDay0, uint64_t to_s = kDay0 + 86400) {
    auto r = make_report(rows, from_s, to_s, TenantKey::account, "");
    EXPECT_TRUE(r) << r.error().message;
    return r ? *r : Report{};
  }
  static const ReportLine* line(const Report& r, const std::string& tenant) {
    for (const auto& l : r.rows)
      if (l.tenant == tenant) return &l;
    return nullptr;
  }

  Finding hang_of_last_rank(uint64_t opened_ns) const {
    Finding f;
    f.id = 5;
    f.kind = FindingKind::hang;
    f.job = "job-1";
    f.comm = kComm;
    f.seq = 10;
    f.ranks = {nranks - 1};
    f.opened_ns = opened_ns;
    return f;
  }

  ClusterModel model;
  CollectiveMatcher matcher;
  MemoryRows rows;
  std::unique_ptr<UsageLedger> ledger;
  int32_t nranks = 0;
  const uint64_t t0 = kDay0 * kS + 120 * kS;
};

TEST_F(UsageFromMatcherTest, TheOthersWaitingOnALateRankIsOwedToIt) {
  start(4);
  for (uint64_t seq = 0; seq < 10; ++seq)
    instance(seq, t0 + seq * kS, [&](int32_t r) { return r == 3 ? 50 * kMs : r * kMs / 10; });
  ledger->tick(t0 + 20 * kS, {});
  commit(t0 + 20 * kS);

  Report r = report();
  const ReportLine* physics = line(r, "physics");
  const ReportLine* chem = line(r, "chem");
  ASSERT_NE(physics, nullptr);
  ASSERT_NE(chem, nullptr);
  // Three ranks waited from the second-latest arrival (rank 2, 0.2 ms) to
  // rank 3's (50 ms), ten times, one GPU each.
  EXPECT_NEAR(physics->waste_s, 3 * 10 * 0.0498, 1e-6);
  EXPECT_NEAR(chem->caused_s, 3 * 10 * 0.0498, 1e-6);
  EXPECT_NEAR(chem->waste_s, 0, 1e-12) << "the late rank waited on nobody";
  EXPECT_DOUBLE_EQ(physics->usage.collectives, 30);
  EXPECT_DOUBLE_EQ(physics->usage.bytes, 30 * 1024 * 4);
  EXPECT_NEAR(physics->usage.collective_s, 30 * 10e-6, 1e-9);
  ASSERT_EQ(r.causes.size(), 1u);
  EXPECT_EQ(r.causes[0].reason, WasteReason::straggler);
  EXPECT_EQ(r.causes[0].cause_node, "node-1");
  EXPECT_EQ(r.causes[0].cause_detail, "rank 3 (pid 103)");
}

TEST_F(UsageFromMatcherTest, BackToBackCollectivesWaitingOnOneLateArrivalAreCountedOnce) {
  start(2);
  // Rank 0 enqueues #0 and #1 a millisecond apart; rank 1 comes 50 ms late
  // to #0 and enqueues #1 right after. Rank 0's GPU waited ~50 ms, not 100:
  // #1's wait is #0's, except the last millisecond (under the jitter floor).
  instance(0, t0, [&](int32_t r) { return r == 1 ? 50 * kMs : 0; });
  instance(1, t0 + kMs, [&](int32_t r) { return r == 1 ? 50 * kMs : 0; });
  ledger->tick(t0 + 10 * kS, {});
  commit(t0 + 10 * kS);
  const ReportLine* physics = line(report(), "physics");
  ASSERT_NE(physics, nullptr);
  EXPECT_NEAR(physics->waste_s, 0.050, 1e-6);
}

TEST_F(UsageFromMatcherTest, AVictimNamesItsMostWaitedOnCausesEachMinuteAndSpreadsTheRest) {
  start(40);  // 20 nodes, two ranks each: node-19's rank 39 bills to chem
  // Each second one rank is late: rank 39 by 200 ms every fifth second,
  // else one of ranks 2-37 (nodes 1-18) by 10-14 ms. Node-0's two ranks
  // wait on all of them: 19 parties, more than the 8 named a minute.
  const size_t named = UsageOptions{}.named_causes;
  double node0_waste = 0, chem_caused = 0, total = 0;
  auto late = [](uint64_t seq) { return seq % 5 == 0 ? 39 : 2 + static_cast<int32_t>(seq % 36); };
  auto delay = [](int32_t rank) { return rank == 39 ? 200 * kMs : 10 * kMs + static_cast<uint64_t>(rank) * kMs / 10; };
  // Node-0's minute rows: named causes (by cause node and detail) and the spread rows.
  auto node0_rows = [&](std::set<std::string>& causes, std::vector<WasteRow>& spread) {
    causes.clear();
    spread.clear();
    double sum = 0;
    auto scanned = scan_ledger(
        rows, kDay0, kDay0 + 86400,
        [&](const LedgerEntry& e) {
          if (!e.waste || e.edge.node != "node-0") return;
          sum += e.edge.gpu_s;
          if (e.edge.cause_node == kSpreadCauseNode)
            spread.push_back(e.edge);
          else
            causes.insert(e.edge.cause_node + " " + e.edge.cause_detail);
        },
        Level::minute);
    EXPECT_TRUE(scanned);
    return sum;
  };
  std::set<std::string> first, second;
  std::vector<WasteRow> spread;
  for (uint64_t half : {0, 1}) {
    for (uint64_t seq = half * 20; seq < half * 20 + 20; ++seq) {
      const int32_t l = late(seq);
      const double d = static_cast<double>(delay(l)) / kS;
      instance(seq, t0 + seq * kS, [&](int32_t r) { return r == l ? delay(l) : 0; });
      node0_waste += 2 * d;  // both of node-0's ranks waited, one GPU each
      total += (nranks - 1) * d;
      if (l == 39) chem_caused += (nranks - 1) * d;
    }
    ledger->tick(t0 + (half + 1) * 20 * kS, {});
    commit(t0 + (half + 1) * 20 * kS);
    EXPECT_NEAR(node0_rows(half == 0 ? first : second, spread), node0_waste, 1e-9) << "half " << half;
    ASSERT_EQ(spread.size(), 1u) << "half " << half;
  }
  // One minute: at most `named` causes and one spread row for node-0, the
  // most waited on among them, and a cause named once stays named.
  EXPECT_EQ(second.size(), named);
  EXPECT_TRUE(second.count("node-19 rank 39 (pid 139)"));
  for (const auto& cause : first) EXPECT_TRUE(second.count(cause)) << cause << " was named, then not";
  // The spread row keeps what its causes share: the job and the account.
  EXPECT_EQ(spread[0].cause.job, "job-1");
  EXPECT_EQ(spread[0].cause.account, "physics");
  EXPECT_EQ(spread[0].reason, WasteReason::straggler);
  // Nothing is lost: by account, chem caused its own waiting and physics the rest.
  Report r = report();
  ASSERT_NE(line(r, "chem"), nullptr);
  ASSERT_NE(line(r, "physics"), nullptr);
  EXPECT_NEAR(line(r, "chem")->caused_s, chem_caused, 1e-9);
  EXPECT_NEAR(line(r, "physics")->caused_s, total - chem_caused, 1e-9);
  EXPECT_NEAR(r.total.waste_s, total, 1e-9);
}

TEST_F(UsageFromMatcherTest, HostWaitsAreBilledToTheirProcessMinuteByMinute) {
  start(4);
  // Rank 3's process (node-1, pid 103) bills to chem: a block of its waits.
  const std::vector<HostWait> waits = {
      {t0 + 50 * kS, t0 + 70 * kS},  // 10 s in each of two minutes
      {t0 + 75 * kS, t0 + 75 * kS},  // empty
      {t0 + 80 * kS, t0 + 79 * kS},  // ends before it starts
  };
  ledger->on_waits("node-1", 103, waits);
  // Rank 0's (physics) since 1970: counted over its last day alone.
  ledger->on_wait("node-0", 100, 0, t0 + 90 * kS);
  ledger->tick(t0 + 100 * kS, {});
  commit(t0 + 100 * kS);

  // t0 is kDay0 + 120 s: the first wait spans seconds 170-190 of the day.
  for (uint64_t minute : {kDay0 + 120, kDay0 + 180}) {
    const ReportLine* chem = line(report(minute, minute + 60), "chem");
    ASSERT_NE(chem, nullptr) << "minute " << minute - kDay0;
    EXPECT_NEAR(chem->usage.wait_s, 10, 1e-6) << "minute " << minute - kDay0;
  }
  EXPECT_NEAR(line(report(), "chem")->usage.wait_s, 20, 1e-6) << "the empty and backward waits add nothing";
  const ReportLine* physics = line(report(kDay0 - 86400, kDay0 + 86400), "physics");
  ASSERT_NE(physics, nullptr);
  EXPECT_NEAR(physics->usage.wait_s, 86400, 1e-3);
  EXPECT_NEAR(line(report(), "physics")->usage.wait_s, 210, 1e-3) << "its last day ends 210 s into day 0";
}

TEST_F(UsageFromMatcherTest, AnOpenHangChargesTheWaitingRanksToTheMissingOneUntilItCloses) {
  start(4);
  UsageOptions defaults;
  const uint64_t opened = t0 + 60 * kS;
  Finding hang = hang_of_last_rank(opened);
  // Found a hang timeout after the ranks started waiting: counted from then.
  ledger->tick(opened + 10 * kS, {&hang});
  commit(opened + 10 * kS);
  const double first = static_cast<double>(10 * kS + defaults.hang_timeout_ns) / 1e9;
  Report r = report();
  ASSERT_NE(line(r, "physics"), nullptr);
  EXPECT_NEAR(line(r, "physics")->waste_s, 3 * first, 1e-6);
  ASSERT_EQ(r.causes.size(), 1u);
  EXPECT_EQ(r.causes[0].reason, WasteReason::hang);
  EXPECT_EQ(r.causes[0].cause_detail, "missing rank(s) in finding #5");
  EXPECT_NEAR(line(r, "chem")->caused_s, 3 * first, 1e-6);

  ledger->tick(opened + 15 * kS, {&hang});  // five seconds more
  ledger->tick(opened + 100 * kS, {});      // closed: nothing after
  commit(opened + 100 * kS);
  EXPECT_NEAR(line(report(), "physics")->waste_s, 3 * (first + 5), 1e-6);
}

TEST_F(UsageFromMatcherTest, ALedgerRestartedOnItsRowsGoesOnCountingAHangWhereTheLastOneStopped) {
  start(4);
  UsageOptions defaults;
  const uint64_t opened = t0 + 60 * kS;
  Finding hang = hang_of_last_rank(opened);
  ledger->tick(opened + 10 * kS, {&hang});
  commit(opened + 10 * kS);

  // A new collector: a new matcher and ledger on the same rows and model.
  CollectiveMatcher matcher_after;
  ledger = std::make_unique<UsageLedger>(model, matcher_after, rows, UsageOptions{});
  auto restored = ledger->restore();
  ASSERT_TRUE(restored) << restored.error().message;
  ledger->tick(opened + 15 * kS, {&hang});
  commit(opened + 15 * kS);
  const double counted = static_cast<double>(15 * kS + defaults.hang_timeout_ns) / 1e9;
  EXPECT_NEAR(line(report(), "physics")->waste_s, 3 * counted, 1e-6) << "the first 40 s are not counted again";
}

}  // namespace
}  // namespace rankscope::collector
