// The usage ledger and reports on a real RocksDB: per-minute rows rolled up
// into hours and days, tenants keyed every way, waste attributed to whom it
// was owed, and heartbeats through the real ingest path becoming GPU- and
// CPU-seconds.
#include <gtest/gtest.h>

#include <optional>
#include <tuple>

#include "collector/service.h"
#include "collector/usage/report.h"
#include "tests/support/feed.h"
#include "tests/support/harness.h"
#include "tests/support/hello.h"
#include "tests/support/manual_clock.h"
#include "tests/support/wire.h"

namespace rankscope::collector {
namespace {

constexpr uint64_t kS = 1'000'000'000ull;
constexpr uint64_t kDay0 = 1'700'006'400ull;  // a UTC midnight (2023-11-15), in seconds


class UsageTest : public ::testing::Test {
 public:
  void SetUp() override {
    auto opened = TimelineStore::open(dir.file("db"));
    ASSERT_TRUE(opened) << opened.error().message;
    store = std::move(*opened);
    start_collector();
  }
  // A collector run on the store, as collector::run has it (anew after a restart).
  void start_collector() {
    service.reset();
    service = std::make_unique<Service>(*store, clock, ServiceOptions{});
    commit = &service->commit();
    ingest = &service->ingest();
    ledger = &service->ledger();
  }
  // node-0's agent (instance 7) says hello, its clock at 0 on kDay0.
  void hello() { testing::feed(*ingest, *commit, "node-0", testing::hello_message("node-0", 7, kDay0 * kS)); }
  // Everything the ledger counted, written now (as when the collector stops).
  void flush() {
    auto committed = commit->run(clock.now, true);
    ASSERT_TRUE(committed) << committed.error().message;
  }
  Report report(uint64_t since_s, uint64_t until_s, TenantKey by, const std::string& job = "") {
    auto r = make_report(*store, since_s, until_s, by, job);
    EXPECT_TRUE(r) << r.error().message;
    return r ? *r : Report{};
  }
  static const ReportLine* row(const Report& r, const std::string& tenant) {
    for (const auto& line : r.rows)
      if (line.tenant == tenant) return &line;
    return nullptr;
  }

  testing::TempDir dir;
  testing::ManualClock clock{kDay0 * kS};
  std::unique_ptr<TimelineStore> store;
  std::unique_ptr<Service> service;
  Commit* commit = nullptr;
  Ingest* ingest = nullptr;
  UsageLedger* ledger = nullptr;
};

Identity identity(const std::string& job, const std::string& account, const std::string& user = "alice") {
  Identity id;
  id.job = job;
  id.account = account;
  id.user = user;
  id.cgroup_path = "/slurm/uid_0/job_" + job + "/step_0";
  return id;
}

TEST(UsagePlan, ARangeIsCoveredOnceByDaysHoursAndMinutes) {
  uint64_t since = kDay0 + 3600 + 120;           // 01:02 on day 0
  uint64_t until = kDay0 + 2 * 86400 + 7200 + 300;  // 02:05 on day 2
  auto ranges = plan_ranges(since, until);
  uint64_t covered = 0;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& r : ranges) {
    EXPECT_EQ(r.from_s % bucket_seconds(r.level), 0u);
    EXPECT_EQ(r.to_s % bucket_seconds(r.level), 0u);
    covered += r.to_s - r.from_s;
    spans.emplace_back(r.from_s, r.to_s);
  }
  EXPECT_EQ(covered, until - since);
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) EXPECT_EQ(spans[i - 1].second, spans[i].first) << "gap or overlap";
  // One whole day in the middle, read as one day bucket.
  bool day = false;
  for (const auto& r : ranges) day |= r.level == Level::day && r.from_s == kDay0 + 86400 && r.to_s == kDay0 + 2 * 86400;
  EXPECT_TRUE(day);
}

TEST(UsageTenants, EveryKeyAndTheUnknownRow) {
  Identity id = Identity::of_cgroup_path(
      "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0123abcd_4567_89ab_cdef_0123456789ab.slice/"
      "cri-containerd-" + std::string(64, 'e') + ".scope");
  EXPECT_EQ(id.pod_uid, "0123abcd-4567-89ab-cdef-0123456789ab");
  EXPECT_EQ(id.container_id, std::string(64, 'e'));
  EXPECT_EQ(tenant_of(id, "n1", TenantKey::pod), "0123abcd-4567-89ab-cdef-0123456789ab");
  EXPECT_EQ(tenant_of(id, "n1", TenantKey::cgroup), std::string(64, 'e'));
  EXPECT_EQ(tenant_of(id, "n1", TenantKey::account), kUnknownTenant);
  EXPECT_EQ(tenant_of(id, "n1", TenantKey::namespace_), kUnknownTenant);
  EXPECT_EQ(tenant_of(id, "n1", TenantKey::node), "n1");

  Identity slurm = Identity::of_cgroup_path("/system.slice/slurmstepd.scope/job_4242/step_7/user/task_0");
  EXPECT_EQ(slurm.job, "4242");
  EXPECT_EQ(slurm.step, "7");
  EXPECT_EQ(tenant_of(slurm, "n", TenantKey::job), "4242");
  EXPECT_EQ(tenant_of(slurm, "n", TenantKey::cgroup), "/system.slice/slurmstepd.scope/job_4242/step_7/user/task_0");

  Identity a = identity("1", "physics", "alice");
  EXPECT_EQ(tenant_of(a, "n", TenantKey::account), "physics");
  EXPECT_EQ(tenant_of(a, "n", TenantKey::user), "alice");
  EXPECT_EQ(tenant_of(a, "n", TenantKey::job), "1");
  TenantKey key;
  for (const char* name : {"account", "user", "job", "namespace", "pod", "cgroup", "node"}) {
    ASSERT_TRUE(parse_tenant_key(name, key)) << name;
    EXPECT_STREQ(tenant_key_name(key), name);
  }
  EXPECT_FALSE(parse_tenant_key("team", key));
  EXPECT_NE(a.digest(), identity("1", "physic", "salice").digest()) << "fields are separated in the digest";
  EXPECT_EQ(a.digest().size(), 16u);
  EXPECT_EQ(a.digest(), identity("1", "physics", "alice").digest());
  // Found in review: the ledger's key was a 64-bit FNV-1a of the fields with
  // a 0xff byte between them, so a job named "x\xff" of account "y" and a job
  // "x" of account "\xffy" shared a key (and a row). Users choose these strings.
  EXPECT_NE(identity("x\xff", "y").digest(), identity("x", "\xffy").digest());
}

TEST(UsageRows, EncodeDecodeAndRefuseTruncated) {
  UsageRow row{"node-3", identity("9", "chem"), {}};
  row.usage.gpu_s = 12.5;
  row.usage.bytes = 1e12;
  std::string key = usage_key(Level::hour, kDay0 + 3600, row.node, row.identity);
  std::string value = encode_usage_row(row);
  auto entry = decode_ledger_entry(key, value);
  ASSERT_TRUE(entry) << entry.error().message;
  EXPECT_FALSE(entry->waste);
  EXPECT_EQ(entry->level, Level::hour);
  EXPECT_EQ(entry->bucket_s, kDay0 + 3600);
  EXPECT_EQ(entry->usage.node, "node-3");
  EXPECT_EQ(entry->usage.identity, row.identity);
  EXPECT_EQ(entry->usage.usage.gpu_s, 12.5);
  EXPECT_EQ(entry->usage.usage.bytes, 1e12);
  EXPECT_FALSE(decode_ledger_entry(key, value.substr(0, value.size() - 3)));
  EXPECT_FALSE(decode_ledger_entry("x", value));
}

TEST_F(UsageTest, MinutesRollUpIntoHoursAndDaysAndAnyRangeAddsUp) {
  // One GPU held for three days from 00:00:30 on day 0, flushed many times
  // along the way (as the collector does every few seconds).
  Identity id = identity("7", "physics");
  uint64_t start = kDay0 * kS + 30 * kS;
  uint64_t step = 7 * 3600 * kS + 13 * kS;  // odd pieces, crossing minutes, hours and days
  for (uint64_t t = start; t < start + 3 * 86400 * kS; t += step) {
    Usage u;
    uint64_t end = std::min(t + step, start + 3 * 86400 * kS);
    u.gpu_s = static_cast<double>(end - t) / kS;
    u.cpu_s = u.gpu_s * 2;
    ledger->add_usage_span(t, end, "node-0", id, u);
    clock.now = end;
    flush();
  }
  // The whole range through the day rows; two ragged ranges through all levels.
  for (auto [since, until] : {std::pair{kDay0, kDay0 + 4 * 86400}, std::pair{kDay0 + 5400, kDay0 + 86400 + 7260},
                              std::pair{kDay0 + 86400 * 2 + 60, kDay0 + 86400 * 2 + 120}}) {
    Report r = report(since, until, TenantKey::account);
    uint64_t from = std::max(since, kDay0 + 30), to = std::min(until, kDay0 + 3 * 86400 + 30);
    ASSERT_EQ(r.rows.size(), 1u);
    EXPECT_EQ(r.rows[0].tenant, "physics");
    EXPECT_NEAR(r.rows[0].usage.gpu_s, static_cast<double>(to - from), 1e-6) << since << ".." << until;
    EXPECT_NEAR(r.rows[0].usage.cpu_s, 2.0 * static_cast<double>(to - from), 1e-6);
    EXPECT_NEAR(r.total.usage.gpu_s, r.rows[0].usage.gpu_s, 1e-9);
  }
  // A month through the rollups reads a handful of rows, not every minute.
  Report month = report(kDay0, kDay0 + 30 * 86400, TenantKey::account);
  EXPECT_LT(month.entries, 10u);
}

TEST_F(UsageTest, LateDataForAFlushedMinuteAddsToItNotOverIt) {
  Identity id = identity("7", "physics");
  Usage u;
  u.gpu_s = 10;
  ledger->add_usage(kDay0 * kS + 5 * kS, "node-0", id, u);
  clock.now = kDay0 * kS + 600 * kS;  // ten minutes later: the minute is written and forgotten
  flush();
  ledger->add_usage(kDay0 * kS + 6 * kS, "node-0", id, u);
  flush();
  flush();  // nothing new: no double counting
  Report r = report(kDay0, kDay0 + 60, TenantKey::job);
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_DOUBLE_EQ(r.rows[0].usage.gpu_s, 20);
  Report day = report(kDay0, kDay0 + 86400, TenantKey::job);
  EXPECT_DOUBLE_EQ(day.rows[0].usage.gpu_s, 20);
}

TEST_F(UsageTest, WasteIsChargedToWhoWaitedAndOwedToTheCause) {
  Identity victim = identity("100", "physics", "alice");
  Identity neighbour = Identity::of_cgroup_path("/slurm/uid_0/job_200/step_0");
  neighbour.account = "chem";
  Usage u;
  u.gpu_s = 3600;
  ledger->add_usage(kDay0 * kS, "node-0", victim, u);
  u.gpu_s = 1800;
  ledger->add_usage(kDay0 * kS, "node-0", neighbour, u);
  ledger->add_usage(kDay0 * kS, "node-1", Identity{}, u);  // nobody we know: its own row
  WasteRow w;
  w.node = "node-0";
  w.identity = victim;
  w.cause_node = "node-0";
  w.cause = neighbour;
  w.reason = WasteReason::cpu_neighbour;
  w.cause_detail = "cgroup /slurm/uid_0/job_200/step_0 (2.0 CPUs)";
  w.gpu_s = 360;
  ledger->add_waste(kDay0 * kS + 10 * kS, w);
  flush();
  // The minute rows' hour and day rollups are the rows their keys name.
  for (Level level : {Level::hour, Level::day}) {
    const uint64_t bucket = bucket_start(level, kDay0);
    auto used = store->get_usage(usage_key(level, bucket, "node-0", victim));
    ASSERT_TRUE(used && *used) << static_cast<char>(level);
    auto used_entry = decode_ledger_entry(usage_key(level, bucket, "node-0", victim), **used);
    ASSERT_TRUE(used_entry);
    EXPECT_DOUBLE_EQ(used_entry->usage.usage.gpu_s, 3600);
    auto wasted = store->get_usage(waste_key(level, bucket, w));
    ASSERT_TRUE(wasted && *wasted) << static_cast<char>(level);
    auto wasted_entry = decode_ledger_entry(waste_key(level, bucket, w), **wasted);
    ASSERT_TRUE(wasted_entry);
    EXPECT_DOUBLE_EQ(wasted_entry->edge.gpu_s, 360);
  }

  Report by_account = report(kDay0, kDay0 + 3600, TenantKey::account);
  ASSERT_EQ(by_account.rows.size(), 3u);
  EXPECT_EQ(by_account.rows[0].tenant, "physics") << "largest first";
  EXPECT_DOUBLE_EQ(by_account.rows[0].waste_s, 360);
  EXPECT_EQ(by_account.rows[0].waited_on.begin()->first, "chem");
  const ReportLine* chem = row(by_account, "chem");
  ASSERT_NE(chem, nullptr);
  EXPECT_DOUBLE_EQ(chem->caused_s, 360);
  ASSERT_NE(row(by_account, kUnknownTenant), nullptr) << "unknown identity is a row, never dropped";
  EXPECT_DOUBLE_EQ(by_account.total.usage.gpu_s, 3600 + 1800 + 1800);
  EXPECT_DOUBLE_EQ(by_account.total.waste_s, 360);

  Report bill = report(kDay0, kDay0 + 3600, TenantKey::account, "100");
  ASSERT_EQ(bill.rows.size(), 1u);
  EXPECT_EQ(bill.rows[0].tenant, "node-0");
  EXPECT_DOUBLE_EQ(bill.rows[0].usage.gpu_s, 3600);
  ASSERT_EQ(bill.causes.size(), 1u);
  EXPECT_EQ(bill.causes[0].cause, "job 200");
  EXPECT_EQ(bill.causes[0].reason, WasteReason::cpu_neighbour);
  // The neighbour's bill shows whom it made wait.
  Report other = report(kDay0, kDay0 + 3600, TenantKey::account, "200");
  ASSERT_EQ(other.causes.size(), 1u);
  EXPECT_EQ(other.causes[0].victim, "job 100");
  EXPECT_DOUBLE_EQ(other.total.caused_s, 360);
}

// Heartbeats through the real ingest path: a process's GPU-seconds run from
// its first sample to (half way to) the sample that finds it gone, times the
// GPUs it selected; CPU-seconds are the kernel's count while it lives and
// the BPF counters' growth up to its exit.
TEST_F(UsageTest, HeartbeatsBecomeGpuAndCpuSecondsPerTenant) {
  auto send = [&](const std::function<void(wire::AgentMessage::Builder)>& fill) { testing::feed(*ingest, *commit, "node-0", fill); };
  hello();
  {
    testing::AgentBatch b;
    b.instance = 7;
    b.processes = {testing::process(100, "1", "physics", "alice"), testing::process(101, "2", "chem", "bob")};
    b.processes[1].cuda_devices = {0, 1, 1};  // two distinct GPUs
    testing::feed(*ingest, *commit, "node-0", b.bytes());
  }
  auto beat = [&](uint64_t at_s, bool alive, uint64_t cpu_s) {
    send([&](auto m) {
      auto hb = m.initHeartbeat();
      hb.setInstanceId(7);
      hb.setMonotonicNs(at_s * kS);
      auto p = hb.initProcesses(2);
      for (unsigned i = 0; i < 2; ++i) {
        p[i].setPid(100 + i);
        p[i].setAlive(alive);
        p[i].setState(alive ? 'R' : 'X');
        p[i].setCpuNs(cpu_s * kS);
        p[i].setSampleNs(at_s * kS);
        // /proc/PID/stat while it lives; the BPF counters (10% more: they
        // hold interrupt and stolen time too) are all there is at its exit.
        if (alive) p[i].setProcessCpuNs(cpu_s * kS * (i + 1));
        auto host = p[i].initHost();
        host.setCpuNs(cpu_s * kS * (i + 1) * 11 / 10);
        host.setOffCpuNs(kS);
      }
    });
    clock.now = kDay0 * kS + at_s * kS;
    ledger->tick(clock.now, {});
  };
  beat(10, true, 1);
  beat(11, true, 1);  // the same sample twice is counted once
  ledger->tick(clock.now, {});
  beat(70, true, 31);
  beat(130, false, 61);
  beat(131, false, 61);  // gone: nothing more
  flush();
  Report r = report(kDay0, kDay0 + 3600, TenantKey::account);
  const ReportLine* physics = row(r, "physics");
  const ReportLine* chem = row(r, "chem");
  ASSERT_NE(physics, nullptr);
  ASSERT_NE(chem, nullptr);
  // 10 s -> exit half way between 70 s and 130 s = 90 s; chem holds 2 GPUs.
  EXPECT_NEAR(physics->usage.gpu_s, 90, 1e-6);
  EXPECT_NEAR(chem->usage.gpu_s, 180, 1e-6);
  // The kernel's 31 s up to the last live sample, then the BPF counters' 33 s to the exit.
  EXPECT_NEAR(physics->usage.cpu_s, 31 + 33, 1e-6);
  EXPECT_NEAR(chem->usage.cpu_s, 2 * (31 + 33), 1e-6);
  EXPECT_NEAR(physics->usage.off_cpu_s, 1, 1e-6);
  Report by_user = report(kDay0, kDay0 + 3600, TenantKey::user);
  EXPECT_NE(row(by_user, "alice"), nullptr);
  EXPECT_NE(row(by_user, "bob"), nullptr);
}

// What an agent may report of a process's end, in the order it may come:
// each process's CPU is billed up to its exit once, never twice.
//   - pid 100 is found gone before its exit event was read (no counters),
//     and the next heartbeat carries its counters at exit: the CPU of its
//     last interval is billed (it was not: the first "dead" was final);
//   - pid 101 is a zombie first: alive to /proc, whose counters already ran
//     to its exit, without BPF counters (its entry went at exit); its exit's
//     BPF counters then add nothing (they were billed again);
//   - pid 102 exits, and its pid is taken by another process, which is
//     billed from its own start (it was not billed at all);
//   - pid 103 is found gone, its counters at exit never come (its exit
//     event was lost), and another process takes its pid: that one's
//     heartbeats before its identity came are not billed to the old one.
TEST_F(UsageTest, EveryWayAnExitIsReportedBillsTheProcessUpToItsExitOnce) {
  hello();
  uint64_t seq = 0;
  auto identities = [&](std::vector<proto::ProcessIdentity> processes) {
    testing::AgentBatch b;
    b.instance = 7;
    b.seq = ++seq;
    b.processes = std::move(processes);
    testing::feed(*ingest, *commit, "node-0", b.bytes());
  };
  auto with_start = [](proto::ProcessIdentity p, uint64_t start_ticks) {
    p.start_time = start_ticks;
    return p;
  };
  identities(
      {with_start(testing::process(100, "1", "gone-early"), 500), with_start(testing::process(101, "2", "zombie"), 500),
       with_start(testing::process(102, "3", "first"), 500), with_start(testing::process(103, "5", "lost-exit"), 500)});
  struct Beat {
    uint32_t pid;
    char state;       // 'X': gone
    uint64_t stat_s;  // /proc/PID/stat CPU (0: none)
    int64_t host_s;   // BPF counters (-1: none)
  };
  auto beat = [&](uint64_t at_s, std::vector<Beat> beats) {
    testing::feed(*ingest, *commit, "node-0", [&](wire::AgentMessage::Builder m) {
      auto hb = m.initHeartbeat();
      hb.setInstanceId(7);
      hb.setMonotonicNs(at_s * kS);
      auto p = hb.initProcesses(static_cast<unsigned>(beats.size()));
      for (unsigned i = 0; i < beats.size(); ++i) {
        p[i].setPid(beats[i].pid);
        p[i].setAlive(beats[i].state != 'X');
        p[i].setState(static_cast<uint8_t>(beats[i].state));
        p[i].setSampleNs(at_s * kS);
        p[i].setProcessCpuNs(beats[i].stat_s * kS);
        if (beats[i].host_s >= 0) p[i].initHost().setCpuNs(static_cast<uint64_t>(beats[i].host_s) * kS);
      }
    });
    clock.now = kDay0 * kS + at_s * kS;
    ledger->tick(clock.now, {});
  };
  beat(10, {{100, 'R', 1, 1}, {101, 'R', 1, 1}, {102, 'R', 1, 1}, {103, 'R', 1, 1}});
  beat(70, {{100, 'R', 31, 32}, {101, 'R', 31, 32}, {102, 'R', 31, 32}, {103, 'R', 31, 32}});
  beat(90, {{100, 'X', 0, -1}, {101, 'Z', 41, -1}, {102, 'X', 0, 43}, {103, 'X', 0, -1}});
  beat(91, {{100, 'X', 0, 43}, {101, 'X', 0, 43}});
  beat(92, {{100, 'X', 0, 43}, {101, 'X', 0, 43}});                      // the same again: nothing more
  identities({with_start(testing::process(102, "4", "second"), 9500)});  // pid 102 again, started at 95 s
  beat(100, {{102, 'R', 2, 2}, {103, 'R', 1, 1}});  // pid 103 again (started at 96 s), named only later
  beat(130, {{103, 'R', 20, 20}});
  identities({with_start(testing::process(103, "6", "third"), 9600)});
  beat(160, {{102, 'R', 32, 33}, {103, 'R', 40, 40}});
  flush();
  Report r = report(kDay0, kDay0 + 3600, TenantKey::account);
  for (const char* account : {"gone-early", "zombie", "first", "second", "lost-exit", "third"})
    ASSERT_NE(row(r, account), nullptr) << account;
  // The kernel's 31 s to the last live sample, then the BPF counters' 11 s to its exit.
  EXPECT_NEAR(row(r, "gone-early")->usage.cpu_s, 31 + 11, 1e-6);
  EXPECT_NEAR(row(r, "gone-early")->usage.gpu_s, 75, 1e-6) << "from its start at 5 s to half way from 70 s to 90 s";
  // The kernel's 41 s: its zombie's counters ran to its exit.
  EXPECT_NEAR(row(r, "zombie")->usage.cpu_s, 41, 1e-6);
  EXPECT_NEAR(row(r, "first")->usage.cpu_s, 31 + 11, 1e-6);
  // The new process from its start at 95 s, its CPU counters all its own.
  EXPECT_NEAR(row(r, "second")->usage.gpu_s, 65, 1e-6);
  EXPECT_NEAR(row(r, "second")->usage.cpu_s, 32, 1e-6);
  // Without its counters at exit, its last interval cannot be billed; the
  // next process on its pid is not billed to it, and is billed from its start.
  EXPECT_NEAR(row(r, "lost-exit")->usage.cpu_s, 31, 1e-6);
  EXPECT_NEAR(row(r, "lost-exit")->usage.gpu_s, 75, 1e-6);
  EXPECT_NEAR(row(r, "third")->usage.gpu_s, 64, 1e-6);
  EXPECT_NEAR(row(r, "third")->usage.cpu_s, 40, 1e-6);
}

// A node past the collector's bound on health entries (4,096; a user may
// start that many processes) has its dead processes dropped from the
// table. One dropped while its counters at exit were still to come is
// billed its last interval when they come, not its whole CPU again.
// (`restart`: and the collector restarts on its database before the exit comes.)
void dropped_then_exit(UsageTest& t, bool restart) {
  auto& ingest = t.ingest;
  auto& commit = t.commit;
  auto& clock = t.clock;
  auto identity = [&](uint64_t seq) {
    testing::AgentBatch b;
    b.instance = 7;
    b.seq = seq;
    b.processes = {testing::process(100, "1", "physics")};
    b.processes[0].start_time = 500;
    testing::feed(*ingest, *commit, "node-0", b.bytes());
  };
  t.hello();
  identity(1);
  constexpr uint32_t kOthers = 4200;
  // pid 100: its state, /proc CPU and BPF CPU (-1: none); the others alive.
  auto beat = [&](uint64_t at_s, std::optional<std::tuple<char, uint64_t, int64_t>> first) {
    testing::feed(*ingest, *commit, "node-0", [&](wire::AgentMessage::Builder m) {
      auto hb = m.initHeartbeat();
      hb.setInstanceId(7);
      hb.setMonotonicNs(at_s * kS);
      auto p = hb.initProcesses(kOthers + (first ? 1 : 0));
      for (uint32_t i = 0; i < kOthers; ++i) {
        p[i].setPid(1000 + i);
        p[i].setAlive(true);
        p[i].setState('S');
        p[i].setSampleNs(at_s * kS);
      }
      if (first) {
        auto [state, stat_s, host_s] = *first;
        p[kOthers].setPid(100);
        p[kOthers].setAlive(state != 'X');
        p[kOthers].setState(static_cast<uint8_t>(state));
        p[kOthers].setSampleNs(at_s * kS);
        p[kOthers].setProcessCpuNs(stat_s * kS);
        if (host_s >= 0) p[kOthers].initHost().setCpuNs(static_cast<uint64_t>(host_s) * kS);
      }
    });
    clock.now = kDay0 * kS + at_s * kS;
    t.ledger->tick(clock.now, {});
  };
  beat(10, std::make_tuple('R', 1, 1));
  beat(70, std::make_tuple('R', 31, 32));
  beat(90, std::make_tuple('X', 0, -1));  // gone, its exit event not read yet
  beat(91, std::nullopt);                 // the table is over its bound: pid 100 is dropped
  ASSERT_EQ(ingest->node("node-0")->health.count(100), 0u);
  if (restart) {
    t.flush();
    t.start_collector();
    ASSERT_TRUE(t.service->restore());
    t.hello();
    identity(2);  // the agent tells who its processes are again
  }
  beat(92, std::make_tuple('X', 0, 43));  // its exit, with its counters
  t.flush();
  Report r = t.report(kDay0, kDay0 + 3600, TenantKey::account);
  ASSERT_NE(UsageTest::row(r, "physics"), nullptr);
  EXPECT_NEAR(UsageTest::row(r, "physics")->usage.cpu_s, 31 + 11, 1e-6);
  EXPECT_NEAR(UsageTest::row(r, "physics")->usage.gpu_s, 75, 1e-6);
}

TEST_F(UsageTest, AProcessDroppedFromAFullHealthTableIsNotBilledTwiceWhenItsExitComes) {
  dropped_then_exit(*this, false);
}

TEST_F(UsageTest, AProcessDroppedFromAFullHealthTableIsNotBilledTwiceAfterACollectorRestart) {
  dropped_then_exit(*this, true);
}

// A collector killed after a flush and started again on the same database:
// the new run goes on from what the last flush counted (GPU time across the
// gap included, the cumulative CPU counter not counted again), and a pid
// reused by another process (another start time) is counted afresh.
TEST_F(UsageTest, ARestartedCollectorGoesOnFromTheLastFlush) {
  uint64_t seq = 0;
  auto identities = [&](uint64_t start_of_101) {
    testing::AgentBatch b;
    b.instance = 7;
    b.seq = ++seq;
    for (uint32_t i = 0; i < 2; ++i) {
      b.processes.push_back(testing::process(100 + i, std::to_string(i + 1), i == 0 ? "physics" : "chem"));
      b.processes.back().start_time = i == 0 ? 500 : start_of_101;
    }
    testing::feed(*ingest, *commit, "node-0", b.bytes());
  };
  auto beat = [&](uint64_t at_s, uint64_t cpu_s) {
    testing::feed(*ingest, *commit, "node-0", [&](wire::AgentMessage::Builder m) {
      auto hb = m.initHeartbeat();
      hb.setInstanceId(7);
      hb.setMonotonicNs(at_s * kS);
      auto p = hb.initProcesses(2);
      for (unsigned i = 0; i < 2; ++i) {
        p[i].setPid(100 + i);
        p[i].setAlive(true);
        p[i].setState('R');
        p[i].setSampleNs(at_s * kS);
        p[i].setProcessCpuNs(cpu_s * kS);
      }
    });
    clock.now = kDay0 * kS + at_s * kS;
    ledger->tick(clock.now, {});
  };
  hello();
  identities(600);
  beat(10, 1);
  beat(40, 16);
  flush();
  beat(50, 21);  // counted, never flushed: lost with the collector

  // Killed; a new run on the same database, the agent's Hello and identities again.
  start_collector();
  ASSERT_TRUE(service->restore());
  hello();
  identities(4500);  // pid 101 is now another process, started at 45 s
  beat(70, 31);
  flush();

  Report r = report(kDay0, kDay0 + 3600, TenantKey::account);
  const ReportLine* physics = row(r, "physics");
  const ReportLine* chem = row(r, "chem");
  ASSERT_NE(physics, nullptr);
  ASSERT_NE(chem, nullptr);
  // From its start (500 ticks: 5 s) to 70 s, once, through the gap; its CPU counter up to 31 s.
  EXPECT_NEAR(physics->usage.gpu_s, 65, 1e-6);
  EXPECT_NEAR(physics->usage.cpu_s, 31, 1e-6);
  // pid 101 as it was flushed (6 s to 40 s, 16 CPU-s), then the new
  // process from its start at 45 s (its whole CPU counter is its own).
  EXPECT_NEAR(chem->usage.gpu_s, 34 + 25, 1e-6);
  EXPECT_NEAR(chem->usage.cpu_s, 16 + 31, 1e-6);
}

// Collectives through the real ingest path: a rank that arrives 50 ms late
// at each of 10 collectives costs the other rank 0.5 GPU-seconds, charged to
// the waiting rank's account and owed to the late rank's; every call is
// counted with its bytes.
TEST_F(UsageTest, ALateRankIsOwedTheWaitingOfTheOthers) {
  constexpr uint64_t kComm = 0xabcdef0123456789ull;
  std::map<std::string, uint64_t> seqs;
  for (int32_t rank = 0; rank < 2; ++rank) {
    std::string node = "node-" + std::to_string(rank);
    testing::feed(*ingest, *commit, node, testing::hello_message(node, 7));
    testing::AgentBatch b;
    b.instance = 7;
    b.seq = ++seqs[node];
    b.processes = {testing::process(100 + rank, "job-1", rank == 0 ? "physics" : "chem")};
    b.comms = {testing::member(100 + rank, kComm, rank, 2)};
    b.clock_samples = {testing::tight_clock_sample()};
    testing::feed(*ingest, *commit, node, b.bytes());
  }
  uint64_t t0 = kDay0 * kS + 120 * kS;
  for (int32_t rank = 0; rank < 2; ++rank) {
    std::string node = "node-" + std::to_string(rank);
    proto::ColumnBlock block;
    block.pid = 100 + rank;
    block.comm_hash = kComm;
    block.rank = rank;
    for (uint64_t seq = 0; seq < 10; ++seq)
      block.records.push_back(testing::allreduce_call(seq, t0 + seq * kS + (rank == 1 ? 50'000'000ull : 0)));
    testing::AgentBatch b;
    b.instance = 7;
    b.seq = ++seqs[node];
    b.calls = {block};
    testing::feed(*ingest, *commit, node, b.bytes());
  }
  clock.now = t0 + 20 * kS;
  ledger->tick(clock.now, {});
  flush();
  Report r = report(kDay0, kDay0 + 3600, TenantKey::account);
  const ReportLine* physics = row(r, "physics");
  const ReportLine* chem = row(r, "chem");
  ASSERT_NE(physics, nullptr);
  ASSERT_NE(chem, nullptr);
  EXPECT_NEAR(physics->waste_s, 0.5, 1e-6);
  EXPECT_EQ(physics->waited_on.begin()->first, "chem");
  EXPECT_NEAR(chem->caused_s, 0.5, 1e-6);
  EXPECT_NEAR(chem->waste_s, 0, 1e-12) << "the late rank waited on nobody";
  EXPECT_DOUBLE_EQ(physics->usage.collectives, 10);
  EXPECT_DOUBLE_EQ(physics->usage.bytes, 10 * 1024 * 4);
  ASSERT_EQ(r.causes.size(), 1u);
  EXPECT_EQ(r.causes[0].reason, WasteReason::straggler);
  EXPECT_EQ(r.causes[0].cause_node, "node-1");
}

// Two nodes of two ranks, one account each; two late ranks in one minute,
// counted in one fold. A late rank's node-mate waits on it, the rank does
// not wait on itself, and each wait is charged per victim's GPUs.
TEST_F(UsageTest, EachLateRankIsOwedTheWaitingOfItsNodeMateAndTheOtherNode) {
  constexpr uint64_t kComm = 0x5eed0123456789abull;
  std::map<std::string, uint64_t> seqs;
  auto node_of = [](int32_t rank) { return "node-" + std::to_string(rank / 2); };
  for (int32_t n = 0; n < 2; ++n) {
    std::string node = "node-" + std::to_string(n);
    testing::feed(*ingest, *commit, node, testing::hello_message(node, 7));
    testing::AgentBatch b;
    b.instance = 7;
    b.seq = ++seqs[node];
    for (int32_t rank = 2 * n; rank < 2 * n + 2; ++rank) {
      b.processes.push_back(testing::process(100 + rank, "job-1", n == 0 ? "physics" : "chem"));
      b.comms.push_back(testing::member(100 + rank, kComm, rank, 4));
    }
    b.clock_samples = {testing::tight_clock_sample()};
    testing::feed(*ingest, *commit, node, b.bytes());
  }
  // Rank 1 (physics) 50 ms late at instances 0-4, rank 2 (chem) 30 ms at 5-9.
  uint64_t t0 = kDay0 * kS + 120 * kS;
  for (int32_t rank = 0; rank < 4; ++rank) {
    proto::ColumnBlock block;
    block.pid = 100 + rank;
    block.comm_hash = kComm;
    block.rank = rank;
    for (uint64_t seq = 0; seq < 10; ++seq) {
      uint64_t late = 0;
      if (rank == 1 && seq < 5) late = 50'000'000ull;
      if (rank == 2 && seq >= 5) late = 30'000'000ull;
      block.records.push_back(testing::allreduce_call(seq, t0 + seq * kS + late));
    }
    testing::AgentBatch b;
    b.instance = 7;
    b.seq = ++seqs[node_of(rank)];
    b.calls = {block};
    testing::feed(*ingest, *commit, node_of(rank), b.bytes());
  }
  clock.now = t0 + 20 * kS;
  ledger->tick(clock.now, {});
  flush();
  Report r = report(kDay0, kDay0 + 3600, TenantKey::account);
  const ReportLine* physics = row(r, "physics");
  const ReportLine* chem = row(r, "chem");
  ASSERT_NE(physics, nullptr);
  ASSERT_NE(chem, nullptr);
  // Rank 1's 0.25 s: rank 0 (physics) and ranks 2, 3 (chem) wait.
  // Rank 2's 0.15 s: ranks 0, 1 (physics) and rank 3 (chem) wait.
  EXPECT_NEAR(physics->waste_s, 0.25 + 2 * 0.15, 1e-6);
  EXPECT_NEAR(chem->waste_s, 2 * 0.25 + 0.15, 1e-6);
  EXPECT_NEAR(physics->caused_s, 3 * 0.25, 1e-6);
  EXPECT_NEAR(chem->caused_s, 3 * 0.15, 1e-6);
  // Per cause and victim: rank 1 on node-0 and rank 2 on node-1.
  std::map<std::pair<std::string, std::string>, double> causes;
  for (const auto& c : r.causes) causes[{c.cause_node, c.victim}] += c.gpu_s;
  ASSERT_EQ(causes.size(), 4u);
  EXPECT_NEAR((causes[{"node-0", "physics"}]), 0.25, 1e-6);
  EXPECT_NEAR((causes[{"node-0", "chem"}]), 0.5, 1e-6);
  EXPECT_NEAR((causes[{"node-1", "physics"}]), 0.3, 1e-6);
  EXPECT_NEAR((causes[{"node-1", "chem"}]), 0.15, 1e-6);
}

}  // namespace
}  // namespace rankscope::collector
