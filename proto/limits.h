#pragma once
// What one agent message may carry: the collector refuses a batch past any
// of these whole (collector/ingest/validate.h, docs/protocol.md "Limits"), so the
// agent never builds one; what does not fit goes in its next batch.
#include <cstdint>

namespace rankscope::proto {

inline constexpr uint32_t kMaxListEntries = 1u << 16;      // processes, comms, ends, blocks, samples... per message
inline constexpr uint64_t kMaxRecordsPerBatch = 1u << 20;  // collective records and waits, all blocks together
inline constexpr uint32_t kMaxClockSamples = 1024;         // an agent probes once a second, batches ten times that
// Broken communicators a batch tells (an agent tells each once; each costs
// the collector a walk of the communicator's members): the collector skips
// the rest of a batch past it, the agent sends them in its next batches.
inline constexpr uint32_t kMaxAsyncErrorsPerBatch = 256;
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

// The largest frame the collector reads on its agent socket
// (ZMQ_MAXMSGSIZE). libzmq drops a larger frame unread and closes the
// connection, so a batch past it would never be acknowledged and would
// hold up every batch behind it: the agent keeps each batch under
// kAgentBatchBytes, by the worst-case costs below.
inline constexpr uint64_t kMaxAgentMessageBytes = 16ull << 20;
inline constexpr uint64_t kAgentBatchBytes = 12ull << 20;
// Worst-case packed bytes of one item (every word a tag byte and 8 data
// bytes): a host or GPU record (its column entries), a wait, a block's or
// a wait block's header and comm-table entry, a communicator's
// announcement and end, a process's fixed fields (its strings are
// charged by size), and a batch's clock samples.
inline constexpr uint64_t kWireRecordBytes = 40;
inline constexpr uint64_t kWireGpuRecordBytes = 64;
inline constexpr uint64_t kWireWaitBytes = 40;
inline constexpr uint64_t kWireBlockBytes = 160;
inline constexpr uint64_t kWireCommBytes = 128;
inline constexpr uint64_t kWireCommEndBytes = 64;
inline constexpr uint64_t kWireProcessBytes = 256;
inline constexpr uint64_t kWireClockSamplesBytes = 48 * kMaxClockSamples;
// Processes' identities take at most this much of a batch (the rest go in
// the next ones), so that processes re-announced again and again (a
// setenv loop) never crowd out a node's records.
inline constexpr uint64_t kAgentIdentityBytesPerBatch = 1ull << 20;
static_assert(kAgentBatchBytes + (1u << 20) <= kMaxAgentMessageBytes, "room for a batch's own fields");
// A re-announcement to a job's new collector carries all of its
// communicators, in the order they were made, and identities up to the
// above.
static_assert(kAgentIdentityBytesPerBatch + kMaxListEntries * kWireCommBytes <= kAgentBatchBytes,
              "a re-announcement fits");

// A process's identity, as the agent announces it: its strings come from
// its own environment (up to 128 KiB each on Linux) and its cgroup, so each
// is bounded. A value from the environment past kMaxIdentityText is taken
// as not set (never cut: a cut job id could name another job); exe and the
// cgroup path are paths (PATH_MAX). The collector skips a process past any
// of these, with the reason.
inline constexpr uint64_t kMaxIdentityText = 1024;
inline constexpr uint64_t kMaxIdentityPath = 4096;
inline constexpr uint32_t kMaxCudaDevices = 64;  // ordinals a process chose with cudaSetDevice

}  // namespace rankscope::proto
