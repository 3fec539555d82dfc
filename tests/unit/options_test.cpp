// The collector's and the agent's flags and config files, parsed by the
// functions their main() calls (and tests/fuzz/config_fuzz.cpp drives).
#include "collector/options.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "collector/clock_responder.h"
#include "node-agent/options.h"
#include "tests/support/harness.h"

namespace rankscope {
namespace {

Result<collector::CommandLine> collector_config(const std::string& text) {
  const char* argv[] = {"rankscope-collector", "--config", "test.conf"};
  std::istringstream file(text);
  return collector::parse_command_line(3, argv, &file);
}

Result<agent::CommandLine> agent_config(const std::string& text) {
  const char* argv[] = {"rankscope-agent", "--config", "test.conf"};
  std::istringstream file(text);
  return agent::parse_command_line(3, argv, &file);
}

TEST(Options, CollectorReadsTheConfigFileItIsGiven) {
  testing::TempDir dir;
  std::ofstream(dir.file("c.conf")) << "listen = tcp://127.0.0.1:9000\nhang-timeout-s = 4.5\nlog-level = debug\n";
  std::string path = dir.file("c.conf");
  const char* argv[] = {"rankscope-collector", "--config", path.c_str(), "--hang-timeout-s", "7"};
  auto line = collector::parse_command_line(5, argv);
  ASSERT_TRUE(line) << line.error().message;
  EXPECT_EQ(line->options.listen, "tcp://127.0.0.1:9000");
  EXPECT_EQ(line->options.hang_timeout_s, 7);  // the flag wins over the file
  EXPECT_EQ(line->options.log_level, "debug");
}

TEST(Options, MissingConfigFileIsAnError) {
  const char* argv[] = {"rankscope-collector", "--config", "/nonexistent/rankscope.conf"};
  auto line = collector::parse_command_line(3, argv);
  ASSERT_FALSE(line);
  EXPECT_NE(line.error().message.find("cannot read config file /nonexistent/rankscope.conf"), std::string::npos);
}

// Found by fuzz_config: Boost.Program_options 1.74 loops forever formatting
// the error for an unknown option whose name holds its own placeholder.
TEST(Options, PlaceholderInAnUnknownOptionIsRefusedNotLooped) {
  const std::string found =
      "# every \x01\x01 = 64\ntest-clock-offset-noption '%canonical_option%'s =\xff\xff\xff -2500001test-clofkc-ofset-ns00\n"
      "log-hang-timeout-s";
  auto collector_line = collector_config(found);
  ASSERT_FALSE(collector_line);
  EXPECT_NE(collector_line.error().message.find("%canonical_option%"), std::string::npos) << collector_line.error().message;
  EXPECT_FALSE(agent_config(found));
  EXPECT_FALSE(collector_config("liveness-ms = %value%\n"));  // the same through a bad value
  const char* argv[] = {"rankscope-agent", "--batch-interval-ms", "%value%"};
  EXPECT_FALSE(agent::parse_command_line(3, argv));
}

TEST(Options, PercentSignsThatAreNoPlaceholderAreValues) {
  auto line = collector_config("db = /data/100%/db\n");
  ASSERT_TRUE(line) << line.error().message;
  EXPECT_EQ(line->options.db, "/data/100%/db");
}

TEST(Options, CollectorTimeoutsOutOfRangeAreRefused) {
  // nan and 1e300 passed the old `< 1` check; run() then cast them to integer nanoseconds (undefined).
  for (const char* bad : {"hang-timeout-s = nan\n", "hang-timeout-s = 1e300\n", "hang-timeout-s = 0.5\n",
                          "node-lost-timeout-s = inf\n", "node-lost-timeout-s = 2\n", "liveness-ms = 0\n",
                          "liveness-ms = -1\n", "listen = \n", "log-level = loud\n", "retire-after-s = 0\n",
                          "retire-after-s = nan\n", "drain-after-jobs = 1\n", "drain-after-jobs = 101\n",
                          "drain-window-h = 0\n", "drain-after-jobs = 2\ndrain-command = \n"}) {
    auto line = collector_config(bad);
    EXPECT_FALSE(line) << bad;
  }
  auto line = collector_config("hang-timeout-s = 604800\nnode-lost-timeout-s = 3\nretire-after-s = 60\n"
                               "drain-after-jobs = 3\ndrain-window-h = 48\ndrain-dry-run = true\n");
  ASSERT_TRUE(line) << line.error().message;
  EXPECT_EQ(line->options.hang_timeout_ns(), 604800'000'000'000ull);
  EXPECT_EQ(line->options.retire_after_ns(), 60'000'000'000ull);
  EXPECT_EQ(line->options.drain_after_jobs, 3u);
  EXPECT_TRUE(line->options.drain_dry_run);
}

// --clock-listen: auto (--listen's host, any free port), none, or an
// endpoint; nothing else.
TEST(Options, ClockListenIsAutoNoneOrAnEndpoint) {
  for (const char* bad : {"clock-listen = 7602\n", "clock-listen = \n", "clock-listen = yes\n"})
    EXPECT_FALSE(collector_config(bad)) << bad;
  auto line = collector_config("listen = tcp://10.1.2.3:7600\n");
  ASSERT_TRUE(line) << line.error().message;
  EXPECT_EQ(collector::clock_endpoint(line->options.clock_listen, line->options.listen), "tcp://10.1.2.3:*");
  EXPECT_EQ(collector::clock_endpoint("auto", "tcp://[fd00::5]:7600"), "tcp://[fd00::5]:*");
  EXPECT_EQ(collector::clock_endpoint("auto", "ipc:///run/rankscope.sock"), "") << "no port to take beside it";
  EXPECT_EQ(collector::clock_endpoint("none", "tcp://10.1.2.3:7600"), "");
  line = collector_config("clock-listen = tcp://0.0.0.0:7602\n");
  ASSERT_TRUE(line) << line.error().message;
  EXPECT_EQ(collector::clock_endpoint(line->options.clock_listen, line->options.listen), "tcp://0.0.0.0:7602");
}

TEST(Options, AlertmanagerCredentialsComeWholeAndOneKindAtATime) {
  for (const char* bad : {"alertmanager-ca-file = /ca.crt\n",  // without --alertmanager
                          "alertmanager = https://am:9093\nalertmanager-cert-file = /c.crt\n",
                          "alertmanager = https://am:9093\nalertmanager-basic-auth-user = am\n",
                          "alertmanager = https://am:9093\nalertmanager-password-file = /pw\n",
                          "alertmanager = https://am:9093\nalertmanager-bearer-token-file = /t\n"
                          "alertmanager-basic-auth-user = am\nalertmanager-password-file = /pw\n"}) {
    auto line = collector_config(bad);
    EXPECT_FALSE(line) << bad;
  }
  auto line = collector_config("alertmanager = https://am:9093\nalertmanager-ca-file = /ca.crt\n"
                               "alertmanager-basic-auth-user = am\nalertmanager-password-file = /pw\n");
  ASSERT_TRUE(line) << line.error().message;
  EXPECT_EQ(line->options.alertmanager_basic_auth_user, "am");
}

TEST(Options, FleetOptionsNeedEtcdAndSaneValues) {
  for (const char* bad :
       {"collector-id = c1\n",  // without --etcd
        "etcd-ca-file = /ca.crt\n", "advertise = 10.0.0.5\n",
        "etcd = http://e:2379\netcd-cert-file = /c.crt\n",  // without its key
        "etcd = http://e:2379\netcd-prefix = rankscope\n", "etcd = http://e:2379\ncollector-id = has space\n",
        "etcd = http://e:2379\nlease-ttl-s = 1\n", "etcd = http://e:2379\nlease-ttl-s = 301\n",
        // the default --query is loopback: no other machine would reach it
        "etcd = http://e:2379\nlisten = tcp://0.0.0.0:7600\n",
        "etcd = http://e:2379\nlisten = ipc:///tmp/a\nquery = tcp://0.0.0.0:7601\n",
        "etcd = http://e:2379\nadvertise = fd00::5\n"}) {
    auto line = collector_config(bad);
    EXPECT_FALSE(line) << bad;
  }
  auto line = collector_config(
      "etcd = http://e1:2379,http://e2:2379\ncollector-id = gpu-head-1:7600\n"
      "advertise = 10.0.0.5\nlease-ttl-s = 10\netcd-prefix = /fleet-a/\nquery = tcp://10.0.0.5:7601\n");
  ASSERT_TRUE(line) << line.error().message;
  EXPECT_EQ(line->options.collector_id, "gpu-head-1:7600");
  EXPECT_EQ(line->options.lease_ttl_s, 10u);
  // Both sockets on every address: the id and the address come from the machine's name.
  line = collector_config("etcd = http://e:2379\nquery = tcp://0.0.0.0:7601\n");
  ASSERT_TRUE(line) << line.error().message;
}

TEST(Options, AgentValuesOutOfRangeAreRefused) {
  for (const char* bad : {"batch-interval-ms = 0\n", "ack-timeout-ms = 5\n", "scan-interval-ms = 1\n",
                          "max-unacked-mb = 0\n", "max-unacked-mb = 18446744073709551615\n", "pid = 0\n",
                          "node = two words\n", "collector = \n", "cuda-waits = maybe\n", "unknown-key = 1\n",
                          "proxy-detail-period-ms = 50\n", "proxy-detail-ms = 30001\n"}) {
    auto line = agent_config(bad);
    EXPECT_FALSE(line) << bad;
  }
  auto line = agent_config("max-unacked-mb = 16\npid = 10\npid = 11\nnode = gpu-12\nproxy-detail-ms = 0\n");
  ASSERT_TRUE(line) << line.error().message;
  EXPECT_EQ(line->options.proxy_detail_ms, 0u) << "no background sample: proxy steps only when the collector asks";
  EXPECT_EQ(line->options.max_unacked_bytes, 16u << 20);
  EXPECT_EQ(line->options.pids, (std::vector<uint32_t>{10, 11}));
  EXPECT_EQ(line->options.node, "gpu-12");
}

TEST(Options, AgentCheckCommandAndHelp) {
  const char* check[] = {"rankscope-agent", "check", "--node", "n1"};
  auto line = agent::parse_command_line(4, check);
  ASSERT_TRUE(line) << line.error().message;
  EXPECT_TRUE(line->check);
  const char* help[] = {"rankscope-agent", "--help"};
  line = agent::parse_command_line(2, help);
  ASSERT_TRUE(line);
  EXPECT_TRUE(line->help);
  EXPECT_NE(agent::usage().find("--max-unacked-mb"), std::string::npos);
  EXPECT_NE(collector::usage().find("--hang-timeout-s"), std::string::npos);
}

}  // namespace
}  // namespace rankscope
