#include "collector/usage/report.h"

#include <algorithm>
#include <tuple>

namespace rankscope::collector {

namespace {
// The tenant a waste edge's cause bills to: in a job's bill, the cause's job
// (or its cgroup when it has none); else by the report's key.
std::string cause_tenant(const WasteRow& edge, TenantKey by, bool job_bill) {
  if (job_bill) {
    if (!edge.cause.job.empty()) return "job " + edge.cause.job;
    return tenant_of(edge.cause, edge.cause_node, TenantKey::cgroup);
  }
  return tenant_of(edge.cause, edge.cause_node, by);
}

}  // namespace

Result<Report> make_report(const UsageRows& rows, uint64_t since_s, uint64_t until_s, TenantKey by,
                           const std::string& job, Level coarsest) {
  bool job_bill = !job.empty();
  if (job_bill) by = TenantKey::node;
  std::map<std::string, ReportLine> lines;
  std::map<std::tuple<std::string, std::string, std::string, std::string, uint8_t>, CauseLine> causes;
  Report report;
  auto line = [&](const std::string& tenant) -> ReportLine& {
    ReportLine& l = lines[tenant];
    l.tenant = tenant;
    return l;
  };
  auto scanned = scan_ledger(
      rows, since_s, until_s,
      [&](const LedgerEntry& e) {
        ++report.entries;
        if (!e.waste) {
          if (job_bill && e.usage.identity.job != job) return;
          ReportLine& l = line(tenant_of(e.usage.identity, e.usage.node, by));
          l.usage.add(e.usage.usage);
          l.nodes.insert(e.usage.node);
          return;
        }
        const WasteRow& w = e.edge;
        bool victim_in = !job_bill || w.identity.job == job;
        bool cause_in = !job_bill || w.cause.job == job;
        if (!victim_in && !cause_in) return;
        std::string victim =
            job_bill ? (victim_in ? w.node : "job " + w.identity.job) : tenant_of(w.identity, w.node, by);
        std::string cause = cause_tenant(w, by, job_bill);
        if (victim_in) {
          ReportLine& l = line(victim);
          l.waste_s += w.gpu_s;
          l.waited_on[cause] += w.gpu_s;
        }
        if (cause_in) {
          // Who made others wait: the cause's own row (in a bill: its node).
          std::string own = job_bill ? w.cause_node : cause;
          line(own).caused_s += w.gpu_s;
        }
        CauseLine& c = causes[{victim, cause, w.cause_node, w.cause_detail, static_cast<uint8_t>(w.reason)}];
        c.victim = victim;
        c.cause = cause;
        c.cause_job = w.cause.job;
        c.cause_node = w.cause_node;
        c.cause_detail = w.cause_detail;
        c.reason = w.reason;
        c.gpu_s += w.gpu_s;
      },
      coarsest);
  if (!scanned) return scanned.error();
  report.total.tenant = "TOTAL";
  for (auto& [tenant, l] : lines) {
    report.total.usage.add(l.usage);
    report.total.waste_s += l.waste_s;
    report.total.nodes.insert(l.nodes.begin(), l.nodes.end());
    report.rows.push_back(std::move(l));
  }
  // Caused waste is the same GPU-seconds seen from the other side; the total
  // says how much of it the rows' tenants caused.
  for (const auto& row : report.rows) report.total.caused_s += row.caused_s;
  std::sort(report.rows.begin(), report.rows.end(), [](const ReportLine& a, const ReportLine& b) {
    if (a.usage.gpu_s != b.usage.gpu_s) return a.usage.gpu_s > b.usage.gpu_s;
    if (a.waste_s != b.waste_s) return a.waste_s > b.waste_s;
    return a.tenant < b.tenant;
  });
  for (auto& [k, c] : causes) report.causes.push_back(std::move(c));
  std::sort(report.causes.begin(), report.causes.end(),
            [](const CauseLine& a, const CauseLine& b) { return a.gpu_s > b.gpu_s; });
  return report;
}

}  // namespace rankscope::collector
