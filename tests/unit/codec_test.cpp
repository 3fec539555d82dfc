// The columnar encoding of collective records: lossless, compact, and
// refusing malformed input with a reason.
#include "proto/codec.h"

#include <gtest/gtest.h>
#include <zstd.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <tuple>

#include "proto/agent_wire.h"
#include "proto/compress.h"
#include "proto/limits.h"

namespace rankscope::proto {
namespace {

ColumnBlock training_block(size_t n, uint64_t first_seq) {
  ColumnBlock block;
  block.pid = 4242;
  block.comm_hash = 0x1234567890abcdefull;
  block.rank = 3;
  uint64_t t = 1'000'000'000'000ull;
  const uint64_t bucket_counts[] = {1u << 20, 1u << 20, 1u << 19};
  for (size_t i = 0; i < n; ++i) {
    CallRecord r;
    r.seq = first_seq + i;
    t += (i % 3 == 0) ? 48'000'000 + (i * 7919) % 2'000'000 : 9'000 + (i * 31) % 1'000;  // step, then buckets
    r.issue_ns = t;
    r.return_ns = t + 12'000 + (i * 13) % 5'000;
    r.count = bucket_counts[i % 3];
    r.op = RS_OP_ALLREDUCE;
    r.datatype = 7;  // float32
    r.redop = 0;
    block.records.push_back(r);
  }
  return block;
}

std::string pack_block(const ColumnBlock& block) {
  capnp::MallocMessageBuilder message;
  auto batch = message.initRoot<wire::AgentMessage>().initBatch();
  encode_collectives({&block}, batch);
  return to_packed(message);
}

ColumnBlock unpack_block(const std::string& bytes) {
  ColumnBlock out;
  auto read = read_packed<wire::AgentMessage>(bytes, ReadLimits{}, [&](auto message) {
    auto decoded = decode_columns(message.getBatch().getCollectives()[0], message.getBatch());
    ASSERT_TRUE(decoded) << decoded.error().message;
    out = *decoded;
  });
  EXPECT_TRUE(read) << (read ? "" : read.error().message);
  return out;
}

TEST(Codec, RoundTripKeepsEveryField) {
  ColumnBlock block = training_block(300, 17);
  block.records[5].peer = 2;
  block.records[5].op = RS_OP_BROADCAST;
  block.records[9].result = 4;
  block.records[11].flags = RS_CALL_IN_GROUP;
  block.records[12].seq += 3;  // a gap (a record lost to a full ring buffer)
  for (size_t i = 13; i < block.records.size(); ++i) block.records[i].seq += 3;
  block.records[20].return_ns = block.records[20].issue_ns + 10'000'000'000ull;  // a 10 s call: saturates

  ColumnBlock back = unpack_block(pack_block(block));
  EXPECT_EQ(back.pid, block.pid);
  EXPECT_EQ(back.comm_hash, block.comm_hash);
  EXPECT_EQ(back.rank, block.rank);
  ASSERT_EQ(back.records.size(), block.records.size());
  for (size_t i = 0; i < block.records.size(); ++i) {
    SCOPED_TRACE(i);
    CallRecord want = block.records[i];
    if (i == 20) {
      want.return_ns = want.issue_ns + UINT32_MAX;
      want.flags |= RS_CALL_DURATION_SAT;
    }
    EXPECT_EQ(back.records[i], want);
  }
}

TEST(Codec, ATrainingLoopCostsUnderSixteenBytesPerRecord) {
  const size_t n = 3000;
  std::string one = pack_block(training_block(n, 0));
  std::string empty = pack_block(training_block(0, 0));
  double per_record = static_cast<double>(one.size() - empty.size()) / n;
  EXPECT_LT(per_record, 16.0) << one.size() << " bytes for " << n << " records";
}

TEST(Codec, ColumnOfTheWrongLengthIsRefused) {
  capnp::MallocMessageBuilder message;
  auto batch = message.initRoot<wire::Batch>();
  batch.initCommTable(1);
  auto columns = batch.initCollectives(1)[0];
  columns.setCount(4);
  columns.initIssueDeltaNs(3);
  auto decoded = decode_columns(columns.asReader(), batch.asReader());
  ASSERT_FALSE(decoded);
  EXPECT_NE(decoded.error().message.find("issueDeltaNs"), std::string::npos);
}

TEST(Codec, AbsurdRecordCountOrCommIndexIsRefused) {
  capnp::MallocMessageBuilder message;
  auto batch = message.initRoot<wire::Batch>();
  batch.initCommTable(1);
  auto columns = batch.initCollectives(2);
  columns[0].setCount(0xffffffffu);
  columns[1].setComm(1);
  EXPECT_FALSE(decode_columns(columns[0].asReader(), batch.asReader()));
  auto bad_index = decode_columns(columns[1].asReader(), batch.asReader());
  ASSERT_FALSE(bad_index);
  EXPECT_NE(bad_index.error().message.find("communicator #1"), std::string::npos);
}

// Found in review: the wraparound check compared against prev + 1, which is
// 0 once prev is 2^64-1, so a block starting at the largest sequence number
// went on from 0 (a record keyed before every real one).
TEST(Codec, SequenceNumbersNeverWrapAround) {
  auto block_from = [](uint64_t first_seq, capnp::MallocMessageBuilder& message) {
    auto batch = message.initRoot<wire::Batch>();
    batch.initCommTable(1);
    auto columns = batch.initCollectives(1)[0];
    columns.setCount(2);
    columns.setFirstSeq(first_seq);
    columns.initSeqGap(2);
    columns.initIssueDeltaNs(2);
    columns.initDurationNs(2);
    columns.initCode(2);
    columns.initCountDelta(2);
    columns.initPeer(2);
    columns.initResult(2);
    return decode_columns(columns.asReader(), batch.asReader());
  };
  capnp::MallocMessageBuilder at_top, at_zero;
  auto wrapped = block_from(UINT64_MAX, at_top);
  ASSERT_FALSE(wrapped);
  EXPECT_NE(wrapped.error().message.find("overflows in record 1"), std::string::npos) << wrapped.error().message;
  auto fine = block_from(0, at_zero);  // the first record's predecessor is -1: no overflow
  ASSERT_TRUE(fine) << fine.error().message;
  EXPECT_EQ(fine->records[0].seq, 0u);
  EXPECT_EQ(fine->records[1].seq, 1u);
}

TEST(Codec, SparseBlocksOfThreeCallsStayCompact) {
  // Four ranks of one node, three calls each in one 100 ms batch: the header
  // of each block is paid by three records only.
  std::vector<ColumnBlock> blocks;
  for (int rank = 0; rank < 4; ++rank) {
    blocks.push_back(training_block(3, 300));
    blocks.back().pid = 1000 + rank;
    blocks.back().rank = rank;
  }
  capnp::MallocMessageBuilder message;
  auto batch = message.initRoot<wire::AgentMessage>().initBatch();
  encode_collectives({&blocks[0], &blocks[1], &blocks[2], &blocks[3]}, batch);
  size_t bytes = to_packed(message).size();
  EXPECT_EQ(batch.getCommTable().size(), 1u) << "one communicator, listed once";
  RecordProperty("bytes_per_record_sparse", std::to_string(bytes / 12.0));
  EXPECT_LT(bytes / 12.0, 40.0);
}

TEST(Codec, GarbageBytesGiveAnErrorNotACrash) {
  std::mt19937 rng(7);
  for (int round = 0; round < 500; ++round) {
    std::string bytes(1 + rng() % 200, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng());
    auto result = read_packed<wire::AgentMessage>(bytes, ReadLimits{}, [&](auto message) {
      if (message.which() == wire::AgentMessage::BATCH)
        for (auto c : message.getBatch().getCollectives()) (void)decode_columns(c, message.getBatch());
    });
    (void)result;  // either outcome is fine; not crashing is the point
  }
  auto too_big = read_packed<wire::AgentMessage>(std::string(100, 'x'), ReadLimits{50, 1000, 8}, [](auto) {});
  ASSERT_FALSE(too_big);
  EXPECT_NE(too_big.error().message.find("over the limit"), std::string::npos);
}

TEST(Codec, WaitsRoundTripAndStayCompact) {
  // One synchronize per 100 ms step on one stream, for 20 steps.
  WaitBlock block;
  block.pid = 77;
  block.tid = 78;
  uint64_t t = 5'000'000'000ull;
  for (int i = 0; i < 20; ++i) {
    t += 80'000'000 + (i * 7919) % 1'000'000;
    block.waits.push_back(WaitRecord{1, 0x55d1c0ffee00ull, t, t + 20'000'000 + (i * 131) % 100'000, i == 5 ? 700 : 0});
    t += 20'000'000;
  }
  block.waits[9].kind = 2;
  block.waits[9].object = 0;
  capnp::MallocMessageBuilder message;
  auto batch = message.initRoot<wire::AgentMessage>().initBatch();
  encode_waits({block}, batch);
  std::string bytes = to_packed(message);
  WaitBlock back;
  ASSERT_TRUE(read_packed<wire::AgentMessage>(bytes, ReadLimits{}, [&](auto m) {
    auto decoded = decode_waits(m.getBatch().getWaits()[0], m.getBatch());
    ASSERT_TRUE(decoded) << decoded.error().message;
    back = *decoded;
  }));
  EXPECT_EQ(back.pid, 77u);
  EXPECT_EQ(back.tid, 78u);
  ASSERT_EQ(back.waits.size(), block.waits.size());
  for (size_t i = 0; i < block.waits.size(); ++i) EXPECT_EQ(back.waits[i], block.waits[i]) << i;
  capnp::MallocMessageBuilder empty;
  encode_waits({WaitBlock{77, 78, {}}}, empty.initRoot<wire::AgentMessage>().initBatch());
  double per_wait = static_cast<double>(bytes.size() - to_packed(empty).size()) / 20.0;
  EXPECT_LT(per_wait, 16.0) << bytes.size() << " bytes for 20 waits";
}

// A rank's AllReduces as the profiler plugin reports them: queued on the
// GPU behind the previous step's work, a kernel each.
GpuBlock gpu_block(size_t n) {
  GpuBlock block;
  block.pid = 4242;
  block.comm_hash = 0x1234567890abcdefull;
  block.rank = 3;
  block.op = RS_OP_ALLREDUCE;
  uint64_t t = 1'000'000'000'000ull;
  for (size_t i = 0; i < n; ++i) {
    t += 48'000'000 + (i * 7919) % 2'000'000;
    GpuRecord r;
    r.seq = 40 + i;
    r.count = 1u << 20;
    r.enqueued_ns = t;
    r.kernel_start_ns = t + 180'000'000 + (i * 31) % 1'000;  // queued behind ~4 steps
    r.kernel_end_ns = r.kernel_start_ns + 33'000'000;
    block.records.push_back(r);
  }
  return block;
}

TEST(Codec, GpuRecordsRoundTripBesideHostRecordsAndShareTheCommTable) {
  ColumnBlock host = training_block(30, 0);
  GpuBlock gpu = gpu_block(200);
  gpu.records[3].kernel_start_ns = gpu.records[3].enqueued_ns - 20'000;  // within the GPU clock's uncertainty
  gpu.records[7].seq += 2;                                              // a gap (the plugin's ring was full)
  for (size_t i = 8; i < gpu.records.size(); ++i) gpu.records[i].seq += 2;
  gpu.records[9].count = 77;
  for (size_t i = 20; i < 40; ++i) {  // NCCL's proxy steps, asked for a while: the slowest send link
    gpu.records[i].link_peer = static_cast<int32_t>(i % 3);
    gpu.records[i].link_wait_ns = 1'200'000 + i * 1'000;
  }
  GpuBlock other = gpu_block(3);
  other.comm_hash = 0x42;
  other.op = RS_OP_ALLGATHER;
  capnp::MallocMessageBuilder message;
  auto batch = message.initRoot<wire::AgentMessage>().initBatch();
  encode_collectives({&host}, batch, {&gpu, &other});
  const std::string bytes = to_packed(message);
  auto read = read_packed<wire::AgentMessage>(bytes, ReadLimits{}, [&](auto m) {
    auto b = m.getBatch();
    ASSERT_EQ(b.getCommTable().size(), 2u) << "one table entry per communicator, host and GPU blocks together";
    ASSERT_EQ(b.getGpuCollectives().size(), 2u);
    BatchFrame frame(b);
    auto back = decode_gpu(b.getGpuCollectives()[0], frame);
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(back->pid, gpu.pid);
    EXPECT_EQ(back->comm_hash, gpu.comm_hash);
    EXPECT_EQ(back->rank, gpu.rank);
    EXPECT_EQ(back->op, gpu.op);
    ASSERT_EQ(back->records.size(), gpu.records.size());
    for (size_t i = 0; i < gpu.records.size(); ++i) EXPECT_EQ(back->records[i], gpu.records[i]) << i;
    auto second = decode_gpu(b.getGpuCollectives()[1], frame);
    ASSERT_TRUE(second) << second.error().message;
    EXPECT_EQ(second->comm_hash, 0x42u);
    EXPECT_EQ(second->op, RS_OP_ALLGATHER);
  });
  ASSERT_TRUE(read) << read.error().message;
  // Steady steps cost a few bytes a collective: the columns are deltas.
  capnp::MallocMessageBuilder alone;
  GpuBlock steady = gpu_block(3000);
  encode_collectives({}, alone.initRoot<wire::AgentMessage>().initBatch(), {&steady});
  EXPECT_LT(to_packed(alone).size() / 3000.0, 24.0);
}

TEST(Codec, HostileGpuBlocksAreRefusedWithAReason) {
  auto refused = [](const std::function<void(wire::GpuColumns::Builder)>& spoil) {
    capnp::MallocMessageBuilder message;
    auto batch = message.initRoot<wire::AgentMessage>().initBatch();
    GpuBlock block = gpu_block(4);
    encode_collectives({}, batch, {&block});
    spoil(batch.getGpuCollectives()[0]);
    std::string why;
    auto read = read_packed<wire::AgentMessage>(to_packed(message), ReadLimits{}, [&](auto m) {
      auto back = decode_gpu(m.getBatch().getGpuCollectives()[0], BatchFrame(m.getBatch()));
      why = back ? "" : back.error().message;
    });
    EXPECT_TRUE(read);
    return why;
  };
  EXPECT_NE(refused([](auto g) { g.setCount(1u << 30); }).find("claims"), std::string::npos);
  EXPECT_NE(refused([](auto g) { g.setComm(7); }).find("table"), std::string::npos);
  EXPECT_NE(refused([](auto g) { g.setCount(5); }).find("expected 5"), std::string::npos);
  EXPECT_NE(refused([](auto g) { g.setBaseOffsetNs(INT64_MIN); }).find("range"), std::string::npos);
  EXPECT_NE(refused([](auto g) { g.getStartNs().set(2, INT64_MAX); }).find("overflow"), std::string::npos);
  EXPECT_NE(refused([](auto g) { g.getKernelNs().set(1, UINT64_MAX); }).find("overflow"), std::string::npos);
  EXPECT_NE(refused([](auto g) { g.getEnqueueDeltaNs().set(3, INT64_MIN); }).find("overflow"), std::string::npos);
  EXPECT_NE(refused([](auto g) { g.initLinkPeer(4).set(1, 3); }).find("link wait"), std::string::npos)
      << "a link without a wait";
  EXPECT_NE(refused([](auto g) {
              g.initLinkPeer(4).set(1, UINT32_MAX);
              g.initLinkWaitNs(4).set(1, 5);
            }).find("link wait"),
            std::string::npos)
      << "a peer past any rank";
  EXPECT_NE(refused([](auto g) {
              g.initLinkPeer(4).set(1, 1);
              g.initLinkWaitNs(4).set(1, UINT64_MAX);
            }).find("link wait"),
            std::string::npos);
  EXPECT_NE(refused([](auto g) {
              g.setFirstSeq(UINT64_MAX - 1);
              g.initSeqGap(4).set(2, 5);
            }).find("sequence"),
            std::string::npos);
}

// Blocks as a node's agent has them in one 1 s batch of a pipeline job: 8
// ranks in a TP communicator (2 calls each), each rank's DP AllReduce (1
// call) and its Send/Recv lanes to the next stage (1 call each), varied
// enough to cover every field.
std::vector<ColumnBlock> node_blocks(std::mt19937& rng) {
  std::vector<ColumnBlock> blocks;
  const uint64_t tp = 0x1111222233334444ull, dp = 0x5555666677778888ull, pp = 0x99990000aaaabbbbull;
  const uint64_t t0 = 5'000'000'000'000ull;
  for (int rank = 0; rank < 8; ++rank) {
    const uint32_t pid = 4000 + 7 * rank;
    auto add = [&](uint64_t comm, int32_t rank_in, uint32_t lane, size_t n, uint64_t first_seq, uint8_t op,
                   int32_t peer) {
      ColumnBlock& b = blocks.emplace_back();
      b.pid = pid, b.comm_hash = comm, b.rank = rank_in, b.lane = lane;
      uint64_t t = t0 + rng() % 900'000'000;
      for (size_t i = 0; i < n; ++i) {
        CallRecord r;
        r.seq = first_seq + i + (i == 1 && rng() % 4 == 0 ? 2 : 0);  // now and then a gap
        t += i ? rng() % 150'000'000 : 0;
        r.issue_ns = t;
        r.return_ns = t + 3'000 + rng() % 12'000;
        r.count = op == RS_OP_SEND || op == RS_OP_RECV ? 4u << 20 : (1u << 20) * (1 + i % 2);
        r.op = op, r.datatype = 7, r.peer = peer;
        if (rng() % 50 == 0) r.result = 3;
        if (rng() % 40 == 0) r.return_ns = t + 6'000'000'000ull;  // saturates
        b.records.push_back(r);
      }
    };
    add(tp, rank, 0, 2, 24, RS_OP_ALLREDUCE, -1);
    add(dp, 64 + rank, 0, 1, 19, RS_OP_ALLREDUCE, -1);
    const int32_t next = 8 + rank;
    add(pp, rank, 1 + 2 * static_cast<uint32_t>(next), 1, 4, RS_OP_SEND, next);
    add(pp, rank, 2 + 2 * static_cast<uint32_t>(next), 1, 4, RS_OP_RECV, next);
  }
  blocks.emplace_back().pid = 1;  // a block with no records: no row of a table, nothing made up
  blocks.back().comm_hash = tp;
  return blocks;
}

std::string pack_blocks(const std::vector<ColumnBlock>& blocks, BlockLayout layout) {
  std::vector<const ColumnBlock*> pointers;
  for (const auto& b : blocks) pointers.push_back(&b);
  capnp::MallocMessageBuilder message;
  encode_collectives(pointers, message.initRoot<wire::AgentMessage>().initBatch(), {}, layout);
  return to_packed(message);
}

// Every block for_each_block reads, or the first error.
std::vector<ColumnBlock> unpack_blocks(const std::string& bytes, std::string* error = nullptr) {
  std::vector<ColumnBlock> out;
  auto read = read_packed<wire::AgentMessage>(bytes, ReadLimits{}, [&](auto message) {
    for_each_block(message.getBatch(), BatchFrame(message.getBatch()), [&](Result<ColumnBlock> block) {
      if (block)
        out.push_back(std::move(*block));
      else if (error && error->empty())
        *error = block.error().message;
    });
  });
  EXPECT_TRUE(read) << (read ? "" : read.error().message);
  return out;
}

std::vector<std::tuple<uint64_t, uint32_t, int32_t, uint32_t, std::vector<CallRecord>>> sorted(
    const std::vector<ColumnBlock>& blocks) {
  std::vector<std::tuple<uint64_t, uint32_t, int32_t, uint32_t, std::vector<CallRecord>>> out;
  for (const auto& b : blocks) out.emplace_back(b.comm_hash, b.lane, b.rank, b.pid, b.records);
  std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) {
    return std::tie(std::get<0>(x), std::get<1>(x), std::get<2>(x), std::get<3>(x)) <
           std::tie(std::get<0>(y), std::get<1>(y), std::get<2>(y), std::get<3>(y));
  });
  return out;
}

TEST(Codec, ATableOfBlocksReadsBackAsTheirColumnsDo) {
  std::mt19937 rng(11);
  for (int round = 0; round < 50; ++round) {
    SCOPED_TRACE(round);
    const std::vector<ColumnBlock> blocks = node_blocks(rng);
    auto columns = unpack_blocks(pack_blocks(blocks, BlockLayout::columns));
    ASSERT_EQ(columns.size(), blocks.size());
    columns.pop_back();  // the block without records
    const std::string table_bytes = pack_blocks(blocks, BlockLayout::table);
    const auto table = unpack_blocks(table_bytes);
    ASSERT_EQ(table.size(), blocks.size() - 1);
    EXPECT_EQ(sorted(table), sorted(columns));
    // Rewritten for a collector that reads no table: the same blocks, as columns.
    auto plain = batch_without_table(table_bytes);
    ASSERT_TRUE(plain);
    ASSERT_TRUE(read_packed<wire::AgentMessage>(*plain, ReadLimits{}, [&](auto m) {
      EXPECT_FALSE(m.getBatch().hasCollectiveTable());
      EXPECT_EQ(m.getBatch().getCollectives().size(), blocks.size() - 1);
    }));
    EXPECT_EQ(sorted(unpack_blocks(*plain)), sorted(columns));
    EXPECT_FALSE(batch_without_table(pack_blocks(blocks, BlockLayout::columns))) << "no table: nothing to rewrite";
    auto shape = read_packed<wire::AgentMessage>(table_bytes, ReadLimits{}, [&](auto m) {
      auto s = block_shape(m.getBatch());
      ASSERT_TRUE(s);
      EXPECT_EQ(s->blocks, blocks.size() - 1);
      EXPECT_EQ(s->records, 8u * 5u);
      EXPECT_EQ(block_comms(m.getBatch()).size(), blocks.size() - 1);
    });
    EXPECT_TRUE(shape);
  }
}

TEST(Codec, ATableCostsFarLessABlockThanColumns) {
  // One 1 s batch of a pipeline job's node: 41 blocks for 40 records, the
  // case where each CollectiveColumns header (~40 bytes) is paid by one or
  // two records.
  std::mt19937 rng(5);
  const std::vector<ColumnBlock> blocks = node_blocks(rng);
  const double columns = pack_blocks(blocks, BlockLayout::columns).size() / 40.0;
  const double table = pack_blocks(blocks, BlockLayout::table).size() / 40.0;
  RecordProperty("bytes_per_record_columns", std::to_string(columns));
  RecordProperty("bytes_per_record_table", std::to_string(table));
  EXPECT_LT(table, 0.7 * columns) << table << " bytes a record in a table, " << columns << " in columns";
}

TEST(Codec, HostileTablesAreRefusedWithAReasonAndCostOnlyTheirOwnRows) {
  auto read = [](const std::function<void(wire::Batch::Builder)>& build, std::string* error) {
    capnp::MallocMessageBuilder message;
    auto batch = message.initRoot<wire::AgentMessage>().initBatch();
    batch.initCommTable(2);
    build(batch);
    return unpack_blocks(to_packed(message), error);
  };
  std::string error;
  // More rows than any list may hold.
  EXPECT_TRUE(read([](auto b) { b.initCollectiveTable().setBlocks(kMaxListEntries + 1); }, &error).empty());
  EXPECT_NE(error.find("claims 65537 blocks"), std::string::npos) << error;
  // A header column of another length than the rows.
  error.clear();
  EXPECT_TRUE(read(
                  [](auto b) {
                    auto t = b.initCollectiveTable();
                    t.setBlocks(3);
                    t.initRank(2);
                  },
                  &error)
                  .empty());
  EXPECT_NE(error.find("table rank has 2 entries, expected 3"), std::string::npos) << error;
  // More records than a batch may carry, and record columns not as long as the counts say.
  error.clear();
  EXPECT_TRUE(read(
                  [](auto b) {
                    auto t = b.initCollectiveTable();
                    t.setBlocks(2);
                    auto count = t.initCount(2);
                    count.set(0, static_cast<uint32_t>(kMaxRecordsPerBatch));
                    count.set(1, static_cast<uint32_t>(kMaxRecordsPerBatch) ^ 1u);  // xor: 1 record
                  },
                  &error)
                  .empty());
  EXPECT_NE(error.find("records (limit"), std::string::npos) << error;
  error.clear();
  EXPECT_TRUE(read(
                  [](auto b) {
                    auto t = b.initCollectiveTable();
                    t.setBlocks(1);
                    t.initCount(1).set(0, 4);
                    t.initDurationNs(3);
                  },
                  &error)
                  .empty());
  EXPECT_NE(error.find("durationNs has 3 entries, expected 4"), std::string::npos) << error;
  // A row without records (an agent writes none: it would be work for no record).
  error.clear();
  EXPECT_TRUE(read(
                  [](auto b) {
                    auto t = b.initCollectiveTable();
                    t.setBlocks(2);
                    t.initCount(2).set(0, 1);  // the second row: 1 xor 1
                    t.getCount().set(1, 1);
                  },
                  &error)
                  .empty());
  EXPECT_NE(error.find("a row without records"), std::string::npos) << error;
  // A row naming a communicator past the table, and a row whose sequence
  // numbers overflow: those rows are refused, the row between them read.
  error.clear();
  auto rows = read(
      [](auto b) {
        auto t = b.initCollectiveTable();
        t.setBlocks(3);
        auto comm = t.initComm(3);
        comm.set(0, 5);                // #5 of 2
        comm.set(1, uint32_t(0) - 4);  // back to #1
        auto count = t.initCount(3);
        count.set(0, 1);
        auto first_seq = t.initFirstSeq(3);
        first_seq.set(2, 1);  // zigzag(-1): row 1's 0 less one, the largest sequence number
        count.set(2, 1 ^ 2);  // 2 records
        t.initSeqGap(4);
      },
      &error);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].comm_hash, 0u);  // commTable[1], left zero
  EXPECT_EQ(rows[0].records.size(), 1u);
  EXPECT_NE(error.find("row 0 refers to communicator #5"), std::string::npos) << error;
}

// The agent keeps each batch under the collector's frame size by what its
// items cost at the worst (proto/limits.h). Items whose every field is
// random (nothing packs, nothing codes to a small delta) cost no more than
// that, in either layout, one record a block or a hundred.
TEST(Codec, NoItemPacksToMoreThanTheAgentChargesForIt) {
  std::mt19937_64 rng(2024);
  auto size_of = [](const std::function<void(wire::Batch::Builder)>& fill) {
    capnp::MallocMessageBuilder message;
    fill(message.initRoot<wire::AgentMessage>().initBatch());
    return to_packed(message).size();
  };
  const size_t empty = size_of([](auto) {});
  const size_t kBlocks = 64;
  for (size_t n : {size_t{1}, size_t{100}}) {
    std::vector<ColumnBlock> host(kBlocks);
    std::vector<GpuBlock> gpu(kBlocks);
    std::vector<WaitBlock> waits(kBlocks);
    for (size_t b = 0; b < kBlocks; ++b) {
      host[b].pid = gpu[b].pid = waits[b].pid = static_cast<uint32_t>(rng());
      host[b].comm_hash = gpu[b].comm_hash = rng();
      host[b].rank = gpu[b].rank = static_cast<int32_t>(rng() % 65536);
      host[b].lane = static_cast<uint32_t>(rng());
      gpu[b].op = static_cast<uint8_t>(rng());
      waits[b].tid = static_cast<uint32_t>(rng());
      uint64_t t = (1ull << 40) + rng() % (1ull << 40), seq = rng() % (1ull << 40);
      for (size_t i = 0; i < n; ++i) {
        t += rng() % (1ull << 40);
        seq += 1 + rng() % (1ull << 31);
        CallRecord r;
        r.seq = seq, r.issue_ns = t, r.return_ns = t + rng() % (1ull << 33), r.count = rng();
        r.peer = static_cast<int32_t>(rng()), r.op = static_cast<uint8_t>(rng());
        r.datatype = static_cast<uint8_t>(rng()), r.redop = static_cast<uint8_t>(rng());
        r.result = static_cast<uint8_t>(rng()), r.flags = static_cast<uint8_t>(rng());
        host[b].records.push_back(r);
        GpuRecord g;
        g.seq = seq, g.count = rng(), g.enqueued_ns = t, g.kernel_start_ns = t + rng() % (1ull << 40);
        g.kernel_end_ns = g.kernel_start_ns + rng() % (1ull << 40);
        g.link_peer = static_cast<int32_t>(rng() % 65536), g.link_wait_ns = rng() % (1ull << 40);
        gpu[b].records.push_back(g);
        waits[b].waits.push_back(WaitRecord{static_cast<uint8_t>(rng() % 4), rng(), t, t + rng() % (1ull << 40),
                                            static_cast<int32_t>(rng())});
      }
    }
    std::vector<const ColumnBlock*> host_ptrs;
    std::vector<const GpuBlock*> gpu_ptrs;
    for (size_t b = 0; b < kBlocks; ++b) host_ptrs.push_back(&host[b]), gpu_ptrs.push_back(&gpu[b]);
    for (BlockLayout layout : {BlockLayout::columns, BlockLayout::table}) {
      const size_t bytes = size_of([&](auto b) { encode_collectives(host_ptrs, b, {}, layout); }) - empty;
      EXPECT_LE(bytes, kBlocks * (kWireBlockBytes + n * kWireRecordBytes))
          << n << " records a block, layout " << static_cast<int>(layout);
    }
    const size_t gpu_bytes = size_of([&](auto b) { encode_collectives({}, b, gpu_ptrs); }) - empty;
    EXPECT_LE(gpu_bytes, kBlocks * (kWireBlockBytes + n * kWireGpuRecordBytes)) << n << " GPU records a block";
    const size_t wait_bytes = size_of([&](auto b) { encode_waits(waits, b); }) - empty;
    EXPECT_LE(wait_bytes, kBlocks * (kWireBlockBytes + n * kWireWaitBytes)) << n << " waits a block";
  }
  std::vector<CommJoined> comms(kBlocks);
  for (auto& c : comms) {
    c.pid = static_cast<uint32_t>(rng()), c.hash = rng(), c.handle = rng(), c.parent_hash = rng();
    c.entry_ns = rng(), c.return_ns = rng(), c.rank = static_cast<int32_t>(rng()),
    c.nranks = static_cast<int32_t>(rng());
    c.result = static_cast<int32_t>(rng()), c.origin = wire::CommOrigin::SPLIT, c.color = static_cast<int32_t>(rng());
    c.key = static_cast<int32_t>(rng()), c.split_index = static_cast<int32_t>(rng());
  }
  EXPECT_LE(size_of([&](auto b) { write_comms(comms, b); }) - empty, kBlocks * kWireCommBytes);
  // Identities: every string at its bound, of random bytes but NUL.
  std::vector<ProcessIdentity> identities(kBlocks);
  std::vector<const ProcessIdentity*> pointers;
  uint64_t charged = 0;
  auto text = [&](uint64_t size) {
    std::string s(size, 'x');
    for (char& c : s) c = static_cast<char>(1 + rng() % 255);
    return s;
  };
  for (auto& id : identities) {
    id.pid = static_cast<uint32_t>(rng()), id.start_time = rng(), id.uid = static_cast<uint32_t>(rng());
    id.cgroup_id = rng(), id.rank = id.local_rank = id.world_size = static_cast<int32_t>(rng());
    id.exe = text(kMaxIdentityPath), id.cgroup_path = text(kMaxIdentityPath);
    for (std::string* s : {&id.job, &id.user, &id.account, &id.visible_devices, &id.slurm_step, &id.pod_uid,
                           &id.pod_namespace, &id.pod_name, &id.container_id})
      *s = text(kMaxIdentityText);
    for (uint32_t d = 0; d < kMaxCudaDevices; ++d) id.cuda_devices.push_back(static_cast<int32_t>(rng()));
    EXPECT_TRUE(limit_identity(id).empty());
    charged += identity_wire_bytes(id);
    pointers.push_back(&id);
  }
  EXPECT_LE(size_of([&](auto b) { write_processes(pointers, b); }) - empty, charged);
}

TEST(Compress, RoundTripsAndRefusesBombsTrailingBytesCutFramesAndFramesWithoutASize) {
  std::mt19937 rng(3);
  std::string bytes(100'000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i % 7 ? rng() % 16 : 0);
  const std::string frame = compress(bytes);
  ASSERT_LT(frame.size(), bytes.size());
  auto back = decompress(frame, 1u << 20);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(*back, bytes);

  auto over = decompress(frame, 50'000);  // the reader's own limit
  ASSERT_FALSE(over);
  EXPECT_NE(over.error().message.find("would be 100000"), std::string::npos) << over.error().message;
  const std::string bomb = compress(std::string(8u << 20, '\0'));
  auto bombed = decompress(bomb, 64u << 20);
  ASSERT_FALSE(bombed);
  EXPECT_NE(bombed.error().message.find("would be 8388608"), std::string::npos) << bombed.error().message;

  // A batch message is sent compressed only where that is smaller...
  EXPECT_EQ(encode_compact("tiny"), "tiny");
  const std::string batch = pack_block(training_block(3000, 0));
  ASSERT_LT(encode_compressed(batch).size(), batch.size());
  EXPECT_EQ(encode_compact(batch), encode_compressed(batch));
  // ...and where the collector takes it so: 2 MiB of a repeated string in
  // a process's identity would grow from a frame of a few KiB past 32x + 1 MiB.
  capnp::MallocMessageBuilder message;
  const std::string job(2u << 20, 'A');
  message.initRoot<wire::AgentMessage>().initBatch().initProcesses(1)[0].setJob(job.c_str());
  const std::string packed = to_packed(message);
  EXPECT_LT(encode_compressed(packed).size(), packed.size() / 100);
  EXPECT_EQ(encode_compact(packed), packed);

  auto trailing = decompress(frame + "x", 1u << 20);
  ASSERT_FALSE(trailing);
  EXPECT_NE(trailing.error().message.find("after its one zstd frame"), std::string::npos);
  EXPECT_FALSE(decompress(frame.substr(0, frame.size() - 3), 1u << 20));
  EXPECT_FALSE(decompress("", 1u << 20));

  std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> context(ZSTD_createCCtx(), ZSTD_freeCCtx);
  ZSTD_CCtx_setParameter(context.get(), ZSTD_c_contentSizeFlag, 0);
  std::string sizeless(ZSTD_compressBound(bytes.size()), '\0');
  sizeless.resize(ZSTD_compress2(context.get(), sizeless.data(), sizeless.size(), bytes.data(), bytes.size()));
  auto unsized = decompress(sizeless, 1u << 20);
  ASSERT_FALSE(unsized);
  EXPECT_NE(unsized.error().message.find("does not state its size"), std::string::npos) << unsized.error().message;
}

TEST(Records, NamesAndSizesFollowNcclH) {
  EXPECT_EQ(op_name(RS_OP_ALLREDUCE), "AllReduce");
  EXPECT_EQ(op_from_name("ReduceScatter"), RS_OP_REDUCESCATTER);
  EXPECT_EQ(datatype_size(6), 2u);   // ncclFloat16
  EXPECT_EQ(datatype_size(9), 2u);   // ncclBfloat16
  EXPECT_EQ(datatype_size(8), 8u);   // ncclFloat64
  EXPECT_EQ(datatype_size(12), 0u);  // ncclNumTypes: not a type
  CallRecord r;
  r.count = 1000;
  r.datatype = 7;
  EXPECT_EQ(record_bytes(r), 4000u);
}

}  // namespace
}  // namespace rankscope::proto

namespace rankscope::proto {
namespace {

// The agent's communicator hash is NCCL's commHash, so the profiler
// plugin's records (which carry NCCL's) join the uprobes' by value. The
// expected values are NCCL's: its getHash and split hashing
// (NVIDIA/nccl src/include/bitops.h, src/init.cc) compiled and run on these
// inputs.
TEST(CommHash, IsNcclsCommHashOfTheUniqueIdAndOfASplit) {
  uint8_t id[128];
  for (int i = 0; i < 128; ++i) id[i] = static_cast<uint8_t>(i);
  uint64_t hash = comm_hash_of_unique_id(id, sizeof(id));
  EXPECT_EQ(hash, 0x6afe1cc17717e1f4ull);
  std::vector<uint8_t> ab(128, 0xab);
  EXPECT_EQ(comm_hash_of_unique_id(ab.data(), ab.size()), 0xfa8282068074ca8aull);
  // NCCL's first split of a parent has childCount 1.
  EXPECT_EQ(comm_hash_of_split(hash, 1, 0), 0x79030d073b3c579full);
  EXPECT_EQ(comm_hash_of_split(hash, 2, 3), 0x761890fa75046d6cull);
}

}  // namespace
}  // namespace rankscope::proto
