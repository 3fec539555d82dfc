// The collector's /metrics: scraped over HTTP, checked by the real promtool,
// and held against the catalogue and docs/metrics.md.
#include "collector/metrics.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "collector/alert/http.h"
#include "tests/support/harness.h"

namespace rankscope::collector {
namespace {

using rankscope::testing::slurp;
using rankscope::testing::TempDir;

constexpr const char* kPromtool = "/usr/bin/promtool";

std::string scrape(const Metrics& metrics) {
  auto response = http_request("GET", "http://127.0.0.1:" + std::to_string(metrics.port()) + "/metrics");
  EXPECT_TRUE(response) << response.error().message;
  if (!response) return "";
  EXPECT_EQ(response->status, 200);
  return response->body;
}

// The value of one series, written with its labels sorted by name as the
// exposition has them; nullopt when the series is absent.
std::optional<double> sample(const std::string& exposition, const std::string& series) {
  std::istringstream lines(exposition);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with(series + " ")) return std::stod(line.substr(series.size() + 1));
  }
  return std::nullopt;
}

struct CommandResult {
  int status = -1;
  std::string output;  // stdout and stderr
};

CommandResult run_with_stdin(const std::string& command, const std::string& input) {
  TempDir dir;
  std::ofstream(dir.file("stdin")) << input;
  CommandResult result;
  FILE* pipe = popen((command + " < " + dir.file("stdin") + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  for (size_t got; (got = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) result.output.append(buffer, got);
  int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

void set_every_metric(Metrics& metrics) {
  metrics.set_open_findings(FindingKind::hang, 2);
  metrics.count_opened(FindingKind::hang);
  metrics.count_opened(FindingKind::straggler);
  metrics.set_node_up("gpu-0", true);
  metrics.set_node_up("gpu-1", false);
  metrics.set_node_last_contact("gpu-0", 1795301101.25);
  metrics.set_node_clock("gpu-0", -12.5e-6, 40e-6, 25e-6, 0.003);
  metrics.set_node_drops("gpu-0", "ringbuf_full", 17);
  metrics.set_node_bad_messages("gpu-0", 3);
  metrics.set_node_refused_claims("gpu-0", 2);
  // A job name is whatever bytes the user gave it: invalid UTF-8 here made
  // Prometheus refuse the whole scrape (promtool checks it below).
  metrics.set_comm_progress("job-\xff\xfe", "00c0ffee00c0ffef", 0, 5);
  metrics.set_comm_progress("slurm-4242", "00c0ffee00c0ffee", 3, 1207);
  metrics.observe_lateness(0.0042);
  metrics.set_ingest_totals(12, 3400, 1, 2, 52000);
  metrics.set_alert_posts(5, 1);
  metrics.set_split_totals(4, 1, 3);
  metrics.set_detail(2, 1, 0, 3);
  metrics.set_fleet(3, false, 2);
  metrics.set_loop_time({1'500'000'000, 250'000'000, 0, 0}, 0);
  metrics.set_loop_time({2'500'000'000, 750'000'000, 100'000'000, 0}, 125'000'000);  // totals: only growth is added
  metrics.set_tenant_usage("physics", 7200, 360, 0);
  metrics.set_tenant_usage("(unknown)", 60, 0, 12.5);
  metrics.set_node_unacked_batches("gpu-0", 42);
  metrics.set_findings_waste_gpu_seconds({{{FindingKind::straggler, "slurm-4242"}, 2700}, {{FindingKind::hang, "slurm-7"}, 10800}});
}

TEST(Metrics, ExpositionPassesPromtoolAndHasEveryCatalogueMetric) {
  ASSERT_TRUE(std::filesystem::exists(kPromtool))
      << kPromtool << " is missing: run scripts/install-deps.sh test (as root) to install Debian's prometheus";
  auto metrics = Metrics::start("127.0.0.1:0");
  ASSERT_TRUE(metrics) << metrics.error().message;
  ASSERT_NE((*metrics)->port(), 0);
  set_every_metric(**metrics);
  std::string exposition = scrape(**metrics);

  CommandResult check = run_with_stdin(std::string(kPromtool) + " check metrics", exposition);
  EXPECT_EQ(check.status, 0) << check.output;
  EXPECT_EQ(check.output, "") << "promtool found problems:\n" << check.output;

  for (const MetricInfo& metric : metric_catalogue()) {
    std::string type_line = "# TYPE " + std::string(metric.name) + " " + metric_type_name(metric.type) + "\n";
    EXPECT_NE(exposition.find(type_line), std::string::npos) << type_line;
  }
  EXPECT_EQ(sample(exposition, "rankscope_findings_open{kind=\"hang\"}"), 2);
  EXPECT_EQ(sample(exposition, "rankscope_findings_open{kind=\"node_lost\"}"), 0);
  EXPECT_EQ(sample(exposition, "rankscope_node_up{node=\"gpu-1\"}"), 0);
  EXPECT_EQ(sample(exposition, "rankscope_node_clock_uncertainty_seconds{node=\"gpu-0\"}"), 40e-6);
  EXPECT_EQ(
      sample(exposition, "rankscope_comm_last_sequence{comm=\"00c0ffee00c0ffee\",job_name=\"slurm-4242\",rank=\"3\"}"),
      1207);
  EXPECT_EQ(sample(exposition, "rankscope_collective_issue_lateness_seconds_bucket{le=\"0.003\"}"), 0);
  EXPECT_EQ(sample(exposition, "rankscope_collective_issue_lateness_seconds_bucket{le=\"0.01\"}"), 1);
  EXPECT_EQ(sample(exposition, "rankscope_alertmanager_posts_total{result=\"failed\"}"), 1);
  EXPECT_EQ(sample(exposition, "rankscope_tenant_gpu_seconds_total{account=\"physics\"}"), 7200);
  EXPECT_EQ(sample(exposition, "rankscope_tenant_caused_waste_gpu_seconds_total{account=\"(unknown)\"}"), 12.5);
  EXPECT_EQ(sample(exposition, "rankscope_node_unacked_batches{node=\"gpu-0\"}"), 42);
  EXPECT_EQ(sample(exposition, "rankscope_detail_comms"), 2);
  EXPECT_EQ(sample(exposition, "rankscope_detail_requests_total{reason=\"rise\"}"), 3);
  EXPECT_EQ(sample(exposition, "rankscope_fleet_members"), 3);
  EXPECT_EQ(sample(exposition, "rankscope_fleet_etcd_up"), 0);
  EXPECT_EQ(sample(exposition, "rankscope_fleet_registrations_total"), 2);
  EXPECT_EQ(sample(exposition, "rankscope_collector_loop_seconds_total{phase=\"agents\"}"), 2.5);
  EXPECT_EQ(sample(exposition, "rankscope_collector_loop_seconds_total{phase=\"evaluate\"}"), 0.75);
  EXPECT_EQ(sample(exposition, "rankscope_collector_loop_seconds_total{phase=\"commit\"}"), 0.1);
  EXPECT_EQ(sample(exposition, "rankscope_collector_loop_seconds_total{phase=\"queries\"}"), 0);
  EXPECT_EQ(sample(exposition, "rankscope_collector_last_evaluation_seconds"), 0.125);
  EXPECT_EQ(sample(exposition, "rankscope_findings_waste_gpu_seconds{job_name=\"slurm-4242\",kind=\"straggler\"}"), 2700);
}

// A job's series goes once none of its findings of that kind is open.
TEST(Metrics, GpuHoursOfFindingsFollowTheOpenOnes) {
  auto metrics = Metrics::start("127.0.0.1:0");
  ASSERT_TRUE(metrics) << metrics.error().message;
  (*metrics)->set_findings_waste_gpu_seconds({{{FindingKind::straggler, "a"}, 1.5}, {{FindingKind::hang, "b"}, 2}});
  (*metrics)->set_findings_waste_gpu_seconds({{{FindingKind::straggler, "a"}, 2.5}});
  std::string exposition = scrape(**metrics);
  EXPECT_EQ(sample(exposition, "rankscope_findings_waste_gpu_seconds{job_name=\"a\",kind=\"straggler\"}"), 2.5);
  EXPECT_FALSE(sample(exposition, "rankscope_findings_waste_gpu_seconds{job_name=\"b\",kind=\"hang\"}"));
}

TEST(Metrics, TenantSeriesAreBoundedAndOtherOnlyGrows) {
  auto metrics = Metrics::start("127.0.0.1:0");
  ASSERT_TRUE(metrics) << metrics.error().message;
  for (size_t i = 0; i < Metrics::kTenantSeries + 5; ++i)
    (*metrics)->set_tenant_usage("acct-" + std::to_string(i), 100, 10, 1);
  (*metrics)->set_tenant_usage("acct-0", 150, 10, 1);   // grows by 50
  (*metrics)->set_tenant_usage("acct-21", 130, 12, 1);  // folded into other: +30, +2
  std::string exposition = scrape(**metrics);
  EXPECT_EQ(sample(exposition, "rankscope_tenant_gpu_seconds_total{account=\"acct-0\"}"), 150);
  EXPECT_EQ(sample(exposition, "rankscope_tenant_gpu_seconds_total{account=\"acct-19\"}"), 100);
  EXPECT_FALSE(sample(exposition, "rankscope_tenant_gpu_seconds_total{account=\"acct-20\"}"));
  EXPECT_EQ(sample(exposition, "rankscope_tenant_gpu_seconds_total{account=\"other\"}"), 5 * 100 + 30);
  EXPECT_EQ(sample(exposition, "rankscope_tenant_waste_gpu_seconds_total{account=\"other\"}"), 5 * 10 + 2);
  size_t series = 0;
  for (size_t at = exposition.find("rankscope_tenant_gpu_seconds_total{"); at != std::string::npos;
       at = exposition.find("rankscope_tenant_gpu_seconds_total{", at + 1))
    ++series;
  EXPECT_EQ(series, Metrics::kTenantSeries + 1);
}

TEST(Metrics, CountersFollowRunningTotalsAcrossAnAgentRestart) {
  auto metrics = Metrics::start("127.0.0.1:0");
  ASSERT_TRUE(metrics) << metrics.error().message;
  (*metrics)->set_ingest_totals(10, 100, 1, 0, 4096);
  (*metrics)->set_ingest_totals(15, 160, 1, 2, 5000);
  (*metrics)->set_node_drops("gpu-0", "map_full", 5);
  (*metrics)->set_node_drops("gpu-0", "map_full", 2);  // the agent restarted and counts from 0 again

  std::string exposition = scrape(**metrics);
  EXPECT_EQ(sample(exposition, "rankscope_ingest_batches_total"), 15);
  EXPECT_EQ(sample(exposition, "rankscope_ingest_records_total"), 160);
  EXPECT_EQ(sample(exposition, "rankscope_ingest_duplicate_batches_total"), 1);
  EXPECT_EQ(sample(exposition, "rankscope_ingest_bad_messages_total"), 2);
  EXPECT_EQ(sample(exposition, "rankscope_ingest_bytes_total"), 5000);
  EXPECT_EQ(sample(exposition, "rankscope_agent_drops_total{node=\"gpu-0\",reason=\"map_full\"}"), 7);
}

TEST(Metrics, SeriesPastTheLimitAreDroppedAndCountedUntilACommIsForgotten) {
  auto metrics = Metrics::start("127.0.0.1:0", 3);
  ASSERT_TRUE(metrics) << metrics.error().message;
  const std::string comm = "00000000000000aa";
  for (int32_t rank = 0; rank < 5; ++rank) (*metrics)->set_comm_progress("job-7", comm, rank, 10 + rank);

  auto series = [&](const std::string& c, const std::string& job, int32_t rank) {
    return "rankscope_comm_last_sequence{comm=\"" + c + "\",job_name=\"" + job + "\",rank=\"" + std::to_string(rank) +
           "\"}";
  };
  std::string exposition = scrape(**metrics);
  EXPECT_EQ(sample(exposition, series(comm, "job-7", 2)), 12);
  EXPECT_FALSE(sample(exposition, series(comm, "job-7", 3)));
  EXPECT_FALSE(sample(exposition, series(comm, "job-7", 4)));
  EXPECT_EQ(sample(exposition, "rankscope_metrics_series_dropped_total"), 2);

  (*metrics)->forget_comm(comm);
  (*metrics)->set_comm_progress("job-8", "00000000000000bb", 0, 1);
  exposition = scrape(**metrics);
  EXPECT_FALSE(sample(exposition, series(comm, "job-7", 0)));
  EXPECT_EQ(sample(exposition, series("00000000000000bb", "job-8", 0)), 1);
}

TEST(Metrics, AnAddressInUseIsAClearError) {
  auto first = Metrics::start("127.0.0.1:0");
  ASSERT_TRUE(first) << first.error().message;
  std::string address = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = Metrics::start(address);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code, Errc::io);
  EXPECT_EQ(second.error().message, "cannot serve metrics on " + address + ": Address already in use");
}

TEST(Metrics, AnAddressThatIsNotHostPortIsRefused) {
  for (const char* bad : {"9464", "localhost:9464", "127.0.0.1:http", "127.0.0.1:70000", "127.0.0.1:9464,9465"}) {
    auto metrics = Metrics::start(bad);
    ASSERT_FALSE(metrics) << bad;
    EXPECT_EQ(metrics.error().code, Errc::invalid_argument) << bad;
    EXPECT_NE(metrics.error().message.find("expected HOST:PORT with HOST an IP address"), std::string::npos)
        << metrics.error().message;
  }
}

// docs/metrics.md has one table row per metric with its type, unit and labels.
TEST(Metrics, DocsDescribeEveryCatalogueMetric) {
  std::string docs = slurp(std::string(RANKSCOPE_SOURCE_DIR) + "/docs/metrics.md");
  ASSERT_FALSE(docs.empty()) << "docs/metrics.md not found under " << RANKSCOPE_SOURCE_DIR;
  for (const MetricInfo& metric : metric_catalogue()) {
    std::string row;
    std::istringstream lines(docs);
    for (std::string line; std::getline(lines, line);) {
      if (line.starts_with("| `" + std::string(metric.name) + "` |")) row = line;
    }
    ASSERT_FALSE(row.empty()) << "no row for " << metric.name << " in docs/metrics.md";
    EXPECT_NE(row.find("| " + std::string(metric_type_name(metric.type)) + " |"), std::string::npos) << row;
    if (*metric.unit) {
      EXPECT_NE(row.find(metric.unit), std::string::npos) << row;
    }
    for (const std::string& label : metric.labels) EXPECT_NE(row.find("`" + label + "`"), std::string::npos) << row;
  }
}

}  // namespace
}  // namespace rankscope::collector
