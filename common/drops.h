#pragma once
// Why an agent lost or could not match records: one table for every reader
// and writer of the counts: the agent's batches and heartbeats, the wire
// (proto/drops.h binds each row to its field of wire::DropCounters, in this
// order), the collector's node model and status replies, the metric
// `rankscope_agent_drops_total{reason}`, the CLI and the MCP server. Tests
// hold it against the schema and against docs/metrics.md.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace rankscope {

// The agent's running counts since its instance started; they only grow.
struct DropCounts {
  uint64_t ringbuf_full = 0;
  uint64_t map_full = 0;
  uint64_t unknown_comm = 0;
  uint64_t nested = 0;
  uint64_t send_queue_full = 0;
  uint64_t lost_records = 0;
  uint64_t spool_damaged = 0;
  uint64_t lost_returns = 0;
  uint64_t malformed = 0;
  uint64_t profiler_dropped = 0;
  uint64_t user_share = 0;

  bool operator==(const DropCounts&) const = default;
};

struct DropReason {
  std::string_view name;  // the JSON key and the metric's `reason` label
  uint64_t DropCounts::*count;
  // Records gone for good: `rankscope status` sums these in its DROPS
  // column. The others are said beside the sum, as "N <status_text>".
  bool lost;
  std::string_view status_text;  // empty for the summed ones and for `nested` (not a loss)
};

// What each means is in docs/metrics.md (the `reason` label), which a test
// holds to this table.
inline constexpr std::array<DropReason, 11> kDropReasons = {{
    {"ringbuf_full", &DropCounts::ringbuf_full, true, ""},
    {"map_full", &DropCounts::map_full, true, ""},
    {"unknown_comm", &DropCounts::unknown_comm, false, "unmatched"},
    {"nested", &DropCounts::nested, false, ""},
    {"send_queue_full", &DropCounts::send_queue_full, true, ""},
    {"lost_records", &DropCounts::lost_records, false, "records lost unsent"},
    {"spool_damaged", &DropCounts::spool_damaged, false, "damaged spool file(s)"},
    {"lost_returns", &DropCounts::lost_returns, false, "call(s) running while the agent attached"},
    {"malformed", &DropCounts::malformed, true, ""},
    {"profiler_dropped", &DropCounts::profiler_dropped, false, "GPU-side record(s) the profiler plugin dropped"},
    {"user_share", &DropCounts::user_share, true, ""},
}};

// Each count the larger of the two: whatever arrives late or out of order
// never lowers what is already known.
inline void keep_larger(DropCounts& into, const DropCounts& seen) {
  for (const DropReason& r : kDropReasons)
    if (seen.*r.count > into.*r.count) into.*r.count = seen.*r.count;
}

// The sum of the reasons that lose records (DropReason::lost).
inline uint64_t records_lost(const DropCounts& counts) {
  uint64_t total = 0;
  for (const DropReason& r : kDropReasons)
    if (r.lost) total += counts.*r.count;
  return total;
}

// "ringbuf_full, map_full, ...": every reason's name, in table order.
inline std::string drop_reason_names() {
  std::string out;
  for (const DropReason& r : kDropReasons) {
    if (!out.empty()) out += ", ";
    out += r.name;
  }
  return out;
}

}  // namespace rankscope
