// The shipped Prometheus rules and Grafana dashboard against the real thing:
// Debian's Prometheus scrapes a live collector with
// deploy/prometheus/rankscope-rules.yml loaded, during a job with an
// injected hang. The hang's alert fires in Prometheus and reaches a real
// Alertmanager through Prometheus (the collector's own push is off here);
// then every panel query of deploy/grafana/rankscope.json is evaluated by
// that Prometheus (tests/deploy/verify_dashboard.py --prometheus).
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>

#include "tests/support/alertmanager.h"
#include "tests/support/cluster.h"
#include "tests/support/harness.h"
#include "tests/support/prometheus.h"

namespace rankscope::testing {
namespace {

constexpr int kRanks = 4, kNodes = 2, kStopped = 2;

TEST(PrometheusE2E, TheRulesRaiseALiveHangThroughAlertmanagerAndEveryDashboardQueryAnswers) {
  if (geteuid() != 0) GTEST_SKIP() << "eBPF and network namespaces need root: run the suite as root (sudo make test)";
  RealAlertmanager alertmanager;
  ASSERT_TRUE(alertmanager.ready()) << alertmanager.log();
  TempDir dir;
  NetnsCluster cluster{kNodes};
  ASSERT_TRUE(cluster.ok()) << "could not create network namespaces";
  const std::string metrics = "127.0.0.1:" + std::to_string(free_port());
  DeploymentOptions options;
  options.collector_args = {"--hang-timeout-s", "2", "--metrics", metrics};
  TestDeployment deployment(dir, cluster, kNodes, options);
  ASSERT_TRUE(deployment.wait_connected(std::chrono::seconds(20))) << slurp(dir.file("collector.log"));
  RealPrometheus prometheus({metrics}, {std::string(RANKSCOPE_SOURCE_DIR) + "/deploy/prometheus/rankscope-rules.yml"},
                            alertmanager.url());
  ASSERT_TRUE(prometheus.ready()) << prometheus.log();
  auto scraped = [&] {
    auto up = prometheus.query("up{job=\"rankscope\"} == 1");
    return up.is_object() && !up["result"].empty();
  };
  ASSERT_TRUE(wait_for(scraped, std::chrono::seconds(20))) << "Prometheus never scraped the collector\n"
                                                           << prometheus.log();
  // The rules loaded: Prometheus would have refused to start otherwise, and
  // the recording rules have values.
  EXPECT_TRUE(wait_for([&] { return !prometheus.query("rankscope:nodes_down:count")["result"].empty(); },
                       std::chrono::seconds(10)))
      << prometheus.log();

  auto ranks = launch_train_job(dir, cluster, kRanks, "prometheus-job",
                                {"--steps", "1000000", "--compute-iters", "2000000", "--bucket-elems", "1024"});
  ASSERT_TRUE(wait_for([&] { return deployment.min_progress() >= 30; }, std::chrono::seconds(60)));
  EXPECT_EQ(prometheus.alert_state("RankscopeHangOpen"), "inactive");
  ranks[kStopped].signal(SIGSTOP);

  ASSERT_TRUE(wait_for(
      [&] {
        for (const auto& f : deployment.findings(true))
          if (f.kind == "hang" && f.ranks == std::vector<int32_t>{kStopped}) return true;
        return false;
      },
      std::chrono::seconds(30)))
      << slurp(dir.file("collector.log"));
  EXPECT_TRUE(wait_for([&] { return prometheus.alert_state("RankscopeHangOpen") == "firing"; },
                       std::chrono::seconds(20)))
      << "the rule did not fire; state " << prometheus.alert_state("RankscopeHangOpen") << "\n" << prometheus.log();
  auto delivered = [&] {
    for (const auto& alert : alertmanager.alerts())
      if (has_field(alert, "alertname", "RankscopeHangOpen") && has_field(alert, "state", "active") &&
          has_field(alert, "severity", "page"))
        return true;
    return false;
  };
  EXPECT_TRUE(wait_for(delivered, std::chrono::seconds(20)))
      << "Prometheus did not deliver the alert to Alertmanager\n" << prometheus.log() << alertmanager.log();

  // The collector's own load, from its loop: taking in the agents' messages
  // took time, and evaluations ran.
  EXPECT_TRUE(wait_for(
      [&] {
        return !prometheus.query("increase(rankscope_collector_loop_seconds_total{phase=\"agents\"}[1m]) > 0")["result"]
                    .empty();
      },
      std::chrono::seconds(20)))
      << prometheus.log();
  EXPECT_FALSE(prometheus.query("rankscope_collector_last_evaluation_seconds > 0")["result"].empty());

  // Every panel's query, live: valid, and with data.
  std::string command = std::string(RANKSCOPE_SOURCE_DIR) + "/tests/deploy/verify_dashboard.py --prometheus " +
                        prometheus.url() + " > " + dir.file("dashboard.out") + " 2>&1";
  EXPECT_EQ(run_command(command), 0) << slurp(dir.file("dashboard.out"));
  ranks[kStopped].signal(SIGCONT);
}

}  // namespace
}  // namespace rankscope::testing
