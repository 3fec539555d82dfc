#pragma once
// `rankscope report`'s answer: the usage report (usage/report.h) of the
// asked range and key, with a job's findings when it asks for one job.
#include <cstdint>

#include "collector/detect/findings.h"
#include "collector/store/timeline_store.h"
#include "collector/usage/report.h"
#include "common/result.h"
#include "proto/query.capnp.h"

namespace rankscope::collector {

Result<void> answer_report(const TimelineStore& store, const FindingBook& findings, uint64_t now_ns,
                           proto::query::ReportQuery::Reader query, proto::query::ReportReply::Builder out);

}  // namespace rankscope::collector
