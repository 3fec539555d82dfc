#pragma once
// `rankscope report` (usage and cost per tenant, or one job's bill) and
// `rankscope export --format perfetto` (a job's timeline for ui.perfetto.dev).
#include <cstdint>
#include <optional>
#include <string>

#include "common/drops.h"
#include "common/json.h"
#include "tools/cli/client.h"
#include "tools/cli/fleet.h"

namespace rankscope::cli {

// "2026-11-01", "2026-11-01T12:00:00Z", "2026-11-01 12:00", unix seconds,
// "now", or relative to now: "-30d", "-2h", "-15m", "-10s"; nullopt if unreadable.
std::optional<uint64_t> parse_time_ns(const std::string& text, uint64_t now_ns);

// Who waited on whom, as `report --json` and the MCP job_report write it.
Json waste_cause_json(proto::query::WasteCause::Reader cause);

// A node's drop counts by reason name (common/drops.h), as `status --json`
// and the MCP node_status write them.
Json drops_json(const DropCounts& drops);

struct ReportArgs {
  uint64_t since_ns = 0, until_ns = 0;
  std::string by = "account";
  std::string job;
  double price_per_gpu_hour = 0;
  bool price_given = false;
  bool csv = false, json = false;
};
int run_report(QueryClient& client, const ReportArgs& args);
// In a fleet: every collector asked at once, their reports summed
// (docs/operations.md, "A fleet of collectors"), and those that did not
// answer named. One target: as above.
int run_report(const std::vector<FleetTarget>& targets, int timeout_ms, const ReportArgs& args);

struct ExportArgs {
  std::string format = "perfetto";
  std::string job;
  uint64_t since_ns = 0, until_ns = 0;  // 0: unbounded
  std::string output;
};
int run_export(QueryClient& client, const ExportArgs& args);

}  // namespace rankscope::cli
