#pragma once
// The query service: answers the CLI's requests from the live state and the
// timeline store.
#include <string>
#include <string_view>

#include "collector/detect/findings.h"
#include "collector/fleet/membership.h"
#include "collector/ingest/ingest.h"
#include "collector/store/timeline_store.h"
#include "common/clock.h"

namespace rankscope::collector {

// A timeline reply holds at most this many records (TimelineReply.limitedTo).
inline constexpr uint64_t kMaxTimelineRecords = 262'144;

struct QueryContext {
  const Ingest& ingest;
  const TimelineStore& store;
  FindingBook& findings;  // read, and closed by an acknowledgement
  const Clock& clock;
  uint64_t liveness_ns;  // a node heard from within this window is "connected"
  const fleet::Membership* fleet = nullptr;  // null: this collector is alone (no --etcd)
};

// Decodes one request and returns the packed reply (an error reply for bad
// input). `client`: who asks, as the query socket knows it (its CurveZMQ
// key's name; "" with --insecure), recorded with an acknowledgement.
std::string answer_query(std::string_view request, const QueryContext& context, const std::string& client = "");

}  // namespace rankscope::collector
