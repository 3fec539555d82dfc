#include "collector/usage/report_query.h"

#include <algorithm>

#include "collector/detect/finding_store.h"

namespace rankscope::collector {

namespace {
void fill_row(const ReportLine& line, proto::query::ReportRow::Builder out) {
  out.setTenant(line.tenant);
  out.setGpuHours(line.usage.gpu_s / 3600);
  out.setCpuSeconds(line.usage.cpu_s);
  out.setOffCpuSeconds(line.usage.off_cpu_s);
  out.setCollectiveSeconds(line.usage.collective_s);
  out.setWaitSeconds(line.usage.wait_s);
  out.setBytes(line.usage.bytes);
  out.setCollectives(line.usage.collectives);
  out.setWasteGpuHours(line.waste_s / 3600);
  out.setCausedGpuHours(line.caused_s / 3600);
  const std::pair<const std::string, double>* top = nullptr;
  for (const auto& entry : line.waited_on)
    if (!top || entry.second > top->second) top = &entry;
  if (top) {
    out.setTopCause(top->first);
    out.setTopCauseGpuHours(top->second / 3600);
  }
  out.setNodes(static_cast<uint32_t>(line.nodes.size()));
}
}  // namespace

Result<void> answer_report(const TimelineStore& store, const FindingBook& findings, uint64_t now_ns,
                           proto::query::ReportQuery::Reader q, proto::query::ReportReply::Builder out) {
  TenantKey by = TenantKey::account;
  std::string by_name = q.getBy();
  std::string job = q.getJob();
  if (!by_name.empty() && !parse_tenant_key(by_name, by))
    return make_error(Errc::invalid_argument,
                      "--by must be account, user, job, namespace, pod, cgroup or node, not '" + by_name + "'");
  uint64_t since_ns = q.getSinceNs();
  uint64_t until_ns = q.getUntilNs() == 0 ? now_ns : q.getUntilNs();
  if (until_ns <= since_ns) return make_error(Errc::invalid_argument, "--until must be after --since");
  uint64_t since_s = since_ns / 1'000'000'000ull;
  uint64_t until_s = (until_ns + 999'999'999ull) / 1'000'000'000ull;
  auto report = make_report(store, since_s, until_s, by, job);
  if (!report) return report.error();
  out.setSinceNs(since_ns);
  out.setUntilNs(until_ns);
  out.setBy(job.empty() ? tenant_key_name(by) : "node");
  out.setJob(job);
  out.setEntries(report->entries);
  auto rows = out.initRows(static_cast<unsigned>(report->rows.size()));
  for (unsigned i = 0; i < report->rows.size(); ++i) fill_row(report->rows[i], rows[i]);
  fill_row(report->total, out.initTotal());
  size_t ncauses = std::min<size_t>(report->causes.size(), 1000);
  auto causes = out.initCauses(static_cast<unsigned>(ncauses));
  for (unsigned i = 0; i < ncauses; ++i) {
    const CauseLine& c = report->causes[i];
    auto o = causes[i];
    o.setVictim(c.victim);
    o.setCause(c.cause);
    o.setReason(waste_reason_name(c.reason));
    o.setCauseNode(c.cause_node);
    o.setCauseDetail(c.cause_detail);
    o.setGpuHours(c.gpu_s / 3600);
    o.setCauseJob(c.cause_job);
  }
  if (!job.empty()) {
    std::vector<const Finding*> mine;
    for (const Finding* f : findings.all()) {
      bool of_job = f->job == job || ("," + f->job + ",").find("," + job + ",") != std::string::npos;
      bool in_range = f->opened_ns < until_ns && (f->resolved_ns == 0 || f->resolved_ns >= since_ns);
      if (of_job && in_range && mine.size() < 200) mine.push_back(f);
    }
    auto list = out.initFindings(static_cast<unsigned>(mine.size()));
    for (unsigned i = 0; i < mine.size(); ++i) fill_finding(*mine[i], list[i]);
  }
  return {};
}

}  // namespace rankscope::collector
