#pragma once
// Usage and cost reports: the usage ledger's rows over a time range, summed
// per tenant (--by), with the waste each tenant suffered and caused, and who
// it waited on. Cost is the CLI's (a price per GPU-hour times the figures).
// The query's answer is built from it by usage/report_query.h.
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "collector/store/write_set.h"
#include "collector/usage/ledger.h"
#include "common/result.h"

namespace rankscope::collector {

struct ReportLine {
  std::string tenant;
  Usage usage;
  double waste_s = 0;                       // GPU-seconds it waited
  double caused_s = 0;                      // GPU-seconds others waited on it
  std::map<std::string, double> waited_on;  // cause tenant -> GPU-seconds
  std::set<std::string> nodes;
};

struct CauseLine {
  std::string victim, cause, cause_job, cause_node, cause_detail;
  WasteReason reason = WasteReason::straggler;
  double gpu_s = 0;
};

struct Report {
  std::vector<ReportLine> rows;  // largest GPU-seconds first, then by name
  ReportLine total;
  std::vector<CauseLine> causes;  // largest first
  uint64_t entries = 0;           // ledger rows read
};

// `job` non-empty: only that job's rows (by node), the waste it suffered and
// the waste it caused others.
Result<Report> make_report(const UsageRows& rows, uint64_t since_s, uint64_t until_s, TenantKey by,
                           const std::string& job, Level coarsest = Level::day);

}  // namespace rankscope::collector
