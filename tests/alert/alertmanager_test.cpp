// Findings pushed to a real Alertmanager (Debian's prometheus-alertmanager),
// read back through its API v2.
#include "collector/alert/alertmanager.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collector/alert/http.h"
#include "common/clock.h"
#include "common/format.h"
#include "tests/support/alertmanager.h"
#include "tests/support/harness.h"

namespace rankscope::collector {
namespace {

using namespace std::chrono_literals;
using rankscope::testing::Process;
using rankscope::testing::SpawnOptions;
using rankscope::testing::TempDir;
using rankscope::testing::wait_for;

AlertmanagerOptions resend_every(uint32_t ms) {
  AlertmanagerOptions options;
  options.resend_interval_ms = ms;
  options.http.timeout_ms = 2000;
  return options;
}
const AlertmanagerOptions kSlowResend = resend_every(30000);
// A short one, to see resends: an open alert expires 4 x 500 ms after the last post.
const AlertmanagerOptions kFastResend = resend_every(500);

using rankscope::testing::has_field;
using rankscope::testing::kAlertmanager;
using rankscope::testing::AlertmanagerWeb;
using rankscope::testing::RealAlertmanager;
using rankscope::testing::TestCertificates;

// The alert of this finding as Alertmanager lists it, or "" when it lists none.
std::string alert_of(RealAlertmanager& alertmanager, uint64_t finding_id) {
  for (const std::string& alert : alertmanager.alerts()) {
    if (has_field(alert, "finding_id", std::to_string(finding_id))) return alert;
  }
  return "";
}

bool is_active(const std::string& alert) {
  return has_field(alert, "state", "active");
}

uint64_t now_ns() {
  return SystemClock::read(CLOCK_REALTIME);
}

Finding hang(uint64_t id, std::vector<int32_t> ranks) {
  Finding finding;
  finding.id = id;
  finding.kind = FindingKind::hang;
  finding.job = "slurm-4242";
  finding.comm = 0x00c0ffee00c0ffeeull;
  finding.seq = 1207;
  finding.ranks = std::move(ranks);
  finding.nodes = {"gpu-1"};
  finding.opened_ns = now_ns() - 5'000'000'000;
  finding.updated_ns = finding.opened_ns;
  finding.summary = "AllReduce #1207 on comm 00c0ffee00c0ffee: ranks missing for 5 s";
  finding.detail = "rank 3 on gpu-1 (pid 4711) last called ncclAllReduce #1206\n\"quoted\" and\ttabbed";
  return finding;
}

Finding straggler(uint64_t id) {
  Finding finding = hang(id, {6});
  finding.kind = FindingKind::straggler;
  finding.summary = "rank 6 is 40 ms late on every collective";
  return finding;
}

class AlertmanagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kAlertmanager))
        << kAlertmanager << " is missing: run scripts/install-deps.sh test (as root) to install Debian's "
        << "prometheus-alertmanager";
    alertmanager_ = std::make_unique<RealAlertmanager>();
    ASSERT_TRUE(alertmanager_->ready()) << "Alertmanager did not become ready:\n" << alertmanager_->log();
  }

  void start_client(const AlertmanagerOptions& options) {
    auto client = AlertmanagerClient::create(alertmanager_->url(), options);
    ASSERT_TRUE(client) << client.error().message;
    client_ = std::move(*client);
  }

  // Syncs before each check of `condition` (wait_for polls every 20 ms) until it holds.
  bool sync_until(const std::vector<Finding>& findings, const std::function<bool()>& condition) {
    return wait_for(
        [&] {
          client_->sync(findings, now_ns());
          return condition();
        },
        15s);
  }

  std::unique_ptr<RealAlertmanager> alertmanager_;
  std::unique_ptr<AlertmanagerClient> client_;  // after alertmanager_: stops posting before it goes
};

TEST_F(AlertmanagerTest, HangFiresWithItsLabelsThenResolves) {
  ASSERT_NO_FATAL_FAILURE(start_client(kSlowResend));
  Finding hung = hang(42, {3, 5});
  Finding slow = straggler(43);
  std::string alert;
  ASSERT_TRUE(sync_until({hung, slow},
                         [&] {
                           alert = alert_of(*alertmanager_, 42);
                           return is_active(alert);
                         }))
      << "alert for finding 42 never active; last seen: " << alert << "\n"
      << alertmanager_->log();
  EXPECT_TRUE(has_field(alert, "alertname", "RankscopeHang")) << alert;
  EXPECT_TRUE(has_field(alert, "severity", "page")) << alert;
  EXPECT_TRUE(has_field(alert, "job", "slurm-4242")) << alert;
  EXPECT_TRUE(has_field(alert, "comm", "00c0ffee00c0ffee")) << alert;
  EXPECT_TRUE(has_field(alert, "ranks", "3,5")) << alert;
  EXPECT_TRUE(has_field(alert, "nodes", "gpu-1")) << alert;
  EXPECT_TRUE(has_field(alert, "summary", hung.summary)) << alert;
  EXPECT_TRUE(has_field(alert, "description", hung.detail)) << alert;
  // Alertmanager echoes startsAt in the form we send: RFC 3339, UTC, milliseconds.
  std::string opened = format_time_ns(hung.opened_ns);  // ...T23:05:01.123456Z
  EXPECT_TRUE(has_field(alert, "startsAt", opened.substr(0, opened.size() - 4) + "Z")) << alert;
  EXPECT_TRUE(has_field(alert_of(*alertmanager_, 43), "severity", "warning"));

  // Alertmanager 0.25 leaves an alert whose endsAt has passed out of every
  // listing, whatever the state filters say: a resolved alert is absent.
  hung.resolved_ns = now_ns();
  ASSERT_TRUE(sync_until({hung, slow}, [&] { return alert_of(*alertmanager_, 42).empty(); }))
      << "resolved alert still listed: " << alert_of(*alertmanager_, 42);
  EXPECT_TRUE(is_active(alert_of(*alertmanager_, 43))) << "the open straggler must stay firing";
  EXPECT_EQ(client_->posts_failed(), 0u);
}

TEST_F(AlertmanagerTest, ResendsKeepAnOpenAlertFiringPastItsFirstEndsAt) {
  ASSERT_NO_FATAL_FAILURE(start_client(kFastResend));
  Finding hung = hang(44, {1});
  ASSERT_TRUE(sync_until({hung}, [&] { return is_active(alert_of(*alertmanager_, 44)); }));
  // The first post said endsAt = now + 4 x 500 ms; keep syncing for longer.
  auto until = std::chrono::steady_clock::now() + 3s;
  while (std::chrono::steady_clock::now() < until) {
    client_->sync({hung}, now_ns());
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(is_active(alert_of(*alertmanager_, 44))) << alert_of(*alertmanager_, 44);
  EXPECT_GE(client_->posts_ok(), 2u);  // the first post and at least one resend
}

TEST_F(AlertmanagerTest, NewRanksResolveTheOldLabelSet) {
  ASSERT_NO_FATAL_FAILURE(start_client(kSlowResend));
  Finding hung = hang(45, {1});
  ASSERT_TRUE(sync_until({hung}, [&] { return is_active(alert_of(*alertmanager_, 45)); }));
  hung.ranks = {1, 2};
  std::vector<std::string> listed;
  ASSERT_TRUE(sync_until({hung},
                         [&] {
                           listed.clear();
                           for (const std::string& alert : alertmanager_->alerts())
                             if (has_field(alert, "finding_id", "45")) listed.push_back(alert);
                           return listed.size() == 1 && has_field(listed[0], "ranks", "1,2");
                         }))
      << "alerts for finding 45: " << ::testing::PrintToString(listed);
}

// In a fleet of collectors a job that moves is judged again by its new
// collector, which raises the same finding under an id of its own: one
// alert, whichever collector tells it (the finding's id and the collector
// are annotations there).
TEST_F(AlertmanagerTest, InAFleetTheSameFindingFromTwoCollectorsIsOneAlert) {
  AlertmanagerOptions first = kSlowResend, second = kSlowResend;
  first.collector_id = "c2";
  second.collector_id = "c3";
  ASSERT_NO_FATAL_FAILURE(start_client(first));
  auto old_owner = std::move(client_);
  ASSERT_NO_FATAL_FAILURE(start_client(second));
  auto stragglers = [&] {
    std::vector<std::string> listed;
    for (const std::string& alert : alertmanager_->alerts())
      if (has_field(alert, "alertname", "RankscopeStraggler")) listed.push_back(alert);
    return listed;
  };
  std::vector<std::string> listed;
  old_owner->sync({straggler(12)}, now_ns());
  ASSERT_TRUE(wait_for([&] { return (listed = stragglers()).size() == 1; }, 15s)) << alertmanager_->log();
  EXPECT_TRUE(has_field(listed[0], "finding_id", "12@c2")) << listed[0];
  EXPECT_TRUE(has_field(listed[0], "collector", "c2")) << listed[0];
  EXPECT_EQ(listed[0].find("\"finding_id\":\"12\""), std::string::npos) << "no id of one collector's in the labels";
  ASSERT_TRUE(sync_until({straggler(3)}, [&] {
    listed = stragglers();
    return listed.size() == 1 && has_field(listed[0], "collector", "c3");
  })) << ::testing::PrintToString(listed);
  EXPECT_TRUE(has_field(listed[0], "finding_id", "3@c3")) << listed[0];
  EXPECT_TRUE(is_active(listed[0]));
}

TEST_F(AlertmanagerTest, ResolutionIsPostedTwiceThenNothingMore) {
  ASSERT_NO_FATAL_FAILURE(start_client(kFastResend));
  Finding hung = hang(47, {2});
  client_->sync({hung}, now_ns());
  ASSERT_TRUE(wait_for([&] { return client_->posts_ok() == 1; }, 5s));
  hung.resolved_ns = now_ns();
  // The collector keeps listing a finding for a while after it resolved.
  auto until = std::chrono::steady_clock::now() + 1500ms;
  while (std::chrono::steady_clock::now() < until) {
    client_->sync({hung}, now_ns());
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(wait_for([&] { return client_->posts_ok() == 3; }, 5s));
  EXPECT_EQ(client_->posts_ok(), 3u) << "open, resolved, resolved again one resend interval later";
  EXPECT_EQ(alert_of(*alertmanager_, 47), "");
}

TEST(AlertmanagerClient, CountsFailedPostsWhenNothingListens) {
  auto client =
      AlertmanagerClient::create("http://127.0.0.1:" + std::to_string(rankscope::testing::free_port()), kFastResend);
  ASSERT_TRUE(client) << client.error().message;
  (*client)->sync({hang(46, {0})}, now_ns());
  EXPECT_TRUE(wait_for([&] { return (*client)->posts_failed() == 1; }, 5s));
  EXPECT_EQ((*client)->posts_ok(), 0u);
}

// Alertmanager behind TLS and basic auth (its --web.config.file), as real
// ones are: the client trusts its CA and sends the user's password.
class SecuredAlertmanagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(certificates_.ok()) << "openssl could not make the test certificates:\n" << certificates_.log();
    alertmanager_ = std::make_unique<RealAlertmanager>(AlertmanagerWeb{&certificates_, "rankscope", "s3cret pass"});
    ASSERT_TRUE(alertmanager_->ready()) << "Alertmanager did not become ready over TLS:\n" << alertmanager_->log();
  }
  // A client of `http` that posted `finding` until it succeeded, or failed 3 times.
  std::unique_ptr<AlertmanagerClient> post(const HttpClientOptions& http, const Finding& finding) {
    AlertmanagerOptions options = kFastResend;
    options.http = http;
    auto client = AlertmanagerClient::create(alertmanager_->url(), options);
    EXPECT_TRUE(client) << client.error().message;
    if (!client) return nullptr;
    wait_for(
        [&] {
          (*client)->sync({finding}, now_ns());
          return (*client)->posts_ok() > 0 || (*client)->posts_failed() >= 3;
        },
        15s);
    return std::move(*client);
  }

  TestCertificates certificates_;
  std::unique_ptr<RealAlertmanager> alertmanager_;
};

TEST_F(SecuredAlertmanagerTest, PostsOverHttpsWithBasicAuth) {
  ASSERT_TRUE(alertmanager_->url().starts_with("https://"));
  auto client = post(alertmanager_->client(), hang(51, {2}));
  ASSERT_TRUE(client);
  EXPECT_GT(client->posts_ok(), 0u);
  EXPECT_EQ(client->posts_failed(), 0u);
  EXPECT_TRUE(wait_for([&] { return is_active(alert_of(*alertmanager_, 51)); }, 10s)) << alertmanager_->log();
}

TEST_F(SecuredAlertmanagerTest, AWrongPasswordIsRefusedAndSaysSo) {
  HttpClientOptions http = alertmanager_->client();
  http.password = "not it";
  auto client = post(http, hang(52, {2}));
  ASSERT_TRUE(client);
  EXPECT_EQ(client->posts_ok(), 0u);
  EXPECT_GE(client->posts_failed(), 3u);
  auto response = http_request("GET", alertmanager_->url() + "/api/v2/alerts", "", "", http);
  ASSERT_TRUE(response) << response.error().message;
  EXPECT_EQ(response->status, 401);
  EXPECT_TRUE(alert_of(*alertmanager_, 52).empty());
}

TEST_F(SecuredAlertmanagerTest, AnUntrustedCertificateIsRefusedWithWhatToDo) {
  HttpClientOptions http = alertmanager_->client();
  http.ca_file.clear();  // the system's CAs, which never signed the test CA
  auto response = http_request("GET", alertmanager_->url() + "/-/ready", "", "", http);
  ASSERT_FALSE(response);
  EXPECT_NE(response.error().message.find("the server's certificate cannot be trusted"), std::string::npos)
      << response.error().message;
  EXPECT_NE(response.error().message.find("--alertmanager-ca-file"), std::string::npos) << response.error().message;
  auto client = post(http, hang(53, {2}));
  ASSERT_TRUE(client);
  EXPECT_EQ(client->posts_ok(), 0u);
}

}  // namespace
}  // namespace rankscope::collector
