#pragma once
// Encoding and decoding of the wire messages: the columnar collective
// records, and whole messages to and from packed bytes with limits that a
// hostile peer cannot talk past.
#include <capnp/message.h>
#include <capnp/serialize-packed.h>
#include <kj/exception.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "proto/agent.capnp.h"
#include "proto/query.capnp.h"
#include "proto/records.h"

namespace rankscope::proto {

// The records of one (process, communicator, lane), sorted by seq.
struct ColumnBlock {
  uint32_t pid = 0;
  uint64_t comm_hash = 0;
  int32_t rank = -1;
  uint32_t lane = 0;
  std::vector<CallRecord> records;
};

// The GPU records of one (process, communicator, op), sorted by seq.
struct GpuBlock {
  uint32_t pid = 0;
  uint64_t comm_hash = 0;
  int32_t rank = -1;
  uint8_t op = 0;
  std::vector<GpuRecord> records;
};

// How a batch carries its host blocks: one CollectiveColumns each, or all
// in one CollectiveTable (a few bytes a block instead of ~40; only to a
// collector that said it reads one: HelloReply.readsCompact).
enum class BlockLayout { columns, table };

// Writes the blocks into the batch: its time base (the earliest issue or
// enqueue time), its table of communicator hashes, the host blocks as
// `layout` says and one GpuColumns per GPU block.
void encode_collectives(const std::vector<const ColumnBlock*>& blocks, wire::Batch::Builder batch,
                        const std::vector<const GpuBlock*>& gpu = {}, BlockLayout layout = BlockLayout::columns);
// What the blocks of one batch share, read from it once: its table of
// communicator hashes and its time base. (A Cap'n Proto reader charges the
// traversal limit each time a list is got: getting the table once per block
// made reading a batch quadratic in its size, and a batch of 65,536 blocks
// was refused as over the limit.)
struct BatchFrame {
  explicit BatchFrame(wire::Batch::Reader batch) : table(batch.getCommTable()), base_ns(batch.getBaseNs()) {}
  capnp::List<uint64_t>::Reader table;
  uint64_t base_ns;
};

// Decodes one block of a batch. Checks that every column is empty or exactly
// `count` long, that the comm index is in the table, and that sequence
// numbers and times do not overflow; throws nothing.
Result<ColumnBlock> decode_columns(wire::CollectiveColumns::Reader in, const BatchFrame& frame);
inline Result<ColumnBlock> decode_columns(wire::CollectiveColumns::Reader in, wire::Batch::Reader batch) {
  return decode_columns(in, BatchFrame(batch));  // one block; a loop over a batch's blocks takes one frame
}

// How many host blocks and records a batch claims, in its CollectiveColumns
// and its CollectiveTable together (a table whose header columns do not fit
// together, or that claims more than kMaxRecordsPerBatch records, is an error),
// and with its waits and GPU records: what the collector bounds by the
// batch's size on the wire (collector/ingest/validate.h), and the agent keeps
// within when it compresses (encode_compact).
struct BlockShape {
  uint64_t blocks = 0;
  uint64_t records = 0;
  uint64_t claimed = 0;  // records, waits and GPU records
};
Result<BlockShape> block_shape(wire::Batch::Reader batch);
// The comm index (into Batch.commTable) of each host block, unchecked; an
// unreadable table adds none.
std::vector<uint32_t> block_comms(wire::Batch::Reader batch);
// Decodes every host block of the batch, its CollectiveColumns first, then
// its table's rows, and calls `use` with each: a block that cannot be read is
// an error of its own (the others are read); a table whose columns do not
// fit together is one error for all of its blocks.
void for_each_block(wire::Batch::Reader batch, const BatchFrame& frame,
                    const std::function<void(Result<ColumnBlock>)>& use);

// A batch message whose CollectiveTable is rewritten as CollectiveColumns
// (same time base and comm table; rows that cannot be read are left out),
// for a collector that does not read tables; nullopt when `bytes` is not a
// batch with a table, or cannot be read.
std::optional<std::string> batch_without_table(std::string_view bytes);

// Decodes one GPU block, with the same checks as decode_columns.
Result<GpuBlock> decode_gpu(wire::GpuColumns::Reader in, const BatchFrame& frame);

// The ended host waits of one thread.
struct WaitRecord {
  uint8_t kind = 0;        // WaitKind
  uint64_t object = 0;     // stream or event
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  int32_t result = 0;
  bool operator==(const WaitRecord&) const = default;
};
struct WaitBlock {
  uint32_t pid = 0;
  uint32_t tid = 0;
  std::vector<WaitRecord> waits;  // in start order
};

// Writes the wait blocks into the batch, relative to its time base (set by
// encode_collectives; taken from the first wait when there was none).
void encode_waits(const std::vector<WaitBlock>& blocks, wire::Batch::Builder batch);
Result<WaitBlock> decode_waits(wire::WaitColumns::Reader in, const BatchFrame& frame);
inline Result<WaitBlock> decode_waits(wire::WaitColumns::Reader in, wire::Batch::Reader batch) {
  return decode_waits(in, BatchFrame(batch));
}

// Limits applied to every message read from a socket.
struct ReadLimits {
  size_t max_bytes = 64u << 20;              // a larger frame is refused unread
  uint64_t traversal_words = 16u << 20;      // Cap'n Proto traversal limit (words)
  int nesting = 16;
};

// Serialises a message with the packed encoding.
std::string to_packed(capnp::MessageBuilder& message);

// Parses packed bytes as message type T and calls `use` with its root, all
// inside one guard: Cap'n Proto reports malformed data while the reader is
// traversed, not only when it is opened, so `use` runs under the guard too.
template <typename T>
Result<void> read_packed(std::string_view bytes, const ReadLimits& limits,
                         const std::function<void(typename T::Reader)>& use) {
  if (bytes.size() > limits.max_bytes)
    return make_error(Errc::protocol, "message of " + std::to_string(bytes.size()) + " bytes is over the limit of " +
                                          std::to_string(limits.max_bytes));
  if (bytes.empty()) return make_error(Errc::protocol, "empty message");
  capnp::ReaderOptions options;
  options.traversalLimitInWords = limits.traversal_words;
  options.nestingLimit = limits.nesting;
  kj::Maybe<kj::Exception> failure = kj::runCatchingExceptions([&]() {
    kj::ArrayInputStream input(
        kj::ArrayPtr<const kj::byte>(reinterpret_cast<const kj::byte*>(bytes.data()), bytes.size()));
    capnp::PackedMessageReader reader(input, options);
    use(reader.getRoot<T>());
  });
  KJ_IF_MAYBE(e, failure) {
    return make_error(Errc::protocol, std::string("malformed message: ") + e->getDescription().cStr());
  }
  return {};
}

}  // namespace rankscope::proto
