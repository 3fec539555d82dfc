#pragma once
// What one agent message may carry: the collector refuses a batch past any
// of these whole (collector/ingest/validate.h, docs/protocol.md "Limits"), so the
// agent never builds one; what does not fit goes in its next batch.
#include <cstdint>

namespace rankscope::proto {

inline constexpr uint32_t kMaxListEntries = 1u << 16;      // processes, comms, ends, blocks, samples... per message
inline constexpr uint64_t kMaxRecordsPerBatch = 1u << 20;  // collective records and waits, all blocks together
inline constexpr uint32_t kMaxClockSamples = 1024;         // an agent probes once a second, batches ten times that
// A batch may claim at most kRecordsFloor + kRecordsPerWireByte x its size on
// the wire records and waits (packed, or compressed). A record costs an
// agent about two bytes at the least (its issue-time delta and duration are
// never both zero words; packed Cap'n Proto spends a tag byte and a data
// byte on a non-zero word, and zstd keeps their entropy). Columns of zeros
// pack to almost nothing, so without this a 100-byte message could claim a
// million records. The agent sends a batch compressed only where it stays
// within this (proto::encode_compact).
inline constexpr uint64_t kRecordsPerWireByte = 2;
inline constexpr uint64_t kRecordsFloor = 1024;
// A compressed batch may unpack to at most this many words per byte
// received, plus kWordsFloor: what packing alone allows (a tag and a count
// byte stand for 256 zero words), so that zstd adds no work per byte.
inline constexpr uint64_t kWordsPerWireByte = 128;
inline constexpr uint64_t kWordsFloor = 8192;

}  // namespace rankscope::proto
