#pragma once
// What one agent message may carry: the collector refuses a batch past any
// of these whole (collector/ingest/validate.h, docs/protocol.md "Limits"), so the
// agent never builds one; what does not fit goes in its next batch.
#include <cstdint>

namespace rankscope::proto {

inline constexpr uint32_t kMaxListEntries = 1u << 16;      // processes, comms, ends, blocks, samples... per message
inline constexpr uint64_t kMaxRecordsPerBatch = 1u << 20;  // collective records and waits, all blocks together
inline constexpr uint32_t kMaxClockSamples = 1024;         // an agent probes once a second, batches ten times that

}  // namespace rankscope::proto
