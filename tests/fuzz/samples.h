#pragma once
// Valid messages made with the real encoders: the seeds of the fuzz targets
// and the state the query target answers from. Nothing here is a fixture of
// bytes; change the schema or the encoder and these follow.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "tests/support/manual_clock.h"

namespace rankscope::fuzz {

// Separates the agent messages of one fuzz input.
inline constexpr std::string_view kMessageSeparator = "\nRS-MESSAGE\n";
// The first byte of each message of an agent_message input says how it is
// sent: by which of two nodes (node-a, node-b: each its own connection and
// key), whether with the other node's key on that connection, and whether a
// commit round (detectors, ledger, commit) follows it. The rest is the
// message's packed bytes.
enum Route : uint8_t { kNodeB = 1, kOtherKey = 2, kCommitAfter = 4 };
std::string routed(uint8_t route, const std::string& message);

// Splits one fuzz input into the messages it holds.
std::vector<std::string_view> split_messages(std::string_view input);
// Joins messages into one fuzz input.
std::string join_messages(const std::vector<std::string>& messages);

// The node every sample batch comes from, and the communicator it traces.
inline constexpr uint64_t kInstance = 0x5eed;
inline constexpr uint64_t kCommHash = 0xc0ffee1234567890ull;

// Agent messages, packed, as rankscope-agent sends them.
std::string hello(const std::string& node, uint64_t instance = kInstance);
// A batch of `records` collectives of `rank` (of 2) from seq `first_seq`, a
// point-to-point lane, two ended host waits, identity (the process started
// at `start_time` clock ticks after boot) and clock samples.
std::string batch(uint64_t seq, int32_t rank, uint64_t first_seq, size_t records, uint64_t instance = kInstance,
                  int32_t nranks = 2, uint64_t start_time = 4242);
// The same batch as an agent sends it to a collector that reads it compact:
// its records in a table, the message compressed.
std::string compact_batch(uint64_t seq, int32_t rank, uint64_t first_seq, size_t records);
// A communicator's end by the process of `rank`.
std::string comm_end(uint64_t seq, int32_t rank, uint64_t instance = kInstance);
std::string heartbeat(uint32_t pid, bool alive, bool open_wait);
std::string clock_probe(uint64_t t1);

// Query requests, packed, as the rankscope CLI sends them.
std::string status_request();
std::string jobs_request();
std::string timeline_request(const std::string& comm_prefix, int32_t rank, uint32_t last);
std::string findings_request(bool open_only, const std::string& kind, uint32_t limit);
std::string future_request();  // a newer protocol version than the collector's

// A clock the test moves by hand.
using ManualClock = testing::ManualClock;

}  // namespace rankscope::fuzz
