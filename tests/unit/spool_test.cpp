// The agent's on-disk spool (node-agent/spool.h) on a real file system, and
// the transport replaying it to a real ZeroMQ socket: order, acks, the bound,
// damaged files, and a restart of the agent.
#include "node-agent/spool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <zmq.hpp>

#include "common/clock.h"
#include "common/placement.h"
#include "node-agent/transport.h"
#include "proto/agent_wire.h"
#include "proto/codec.h"
#include "proto/compress.h"
#include "tests/support/harness.h"
#include "tests/support/manual_clock.h"

namespace rankscope::agent {
namespace {

namespace fs = std::filesystem;

// A real batch as the agent sends it: one process, one communicator, `records` collectives.
std::string batch(uint64_t instance, uint64_t seq, size_t records = 4,
                  proto::BlockLayout layout = proto::BlockLayout::columns) {
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<wire::AgentMessage>().initBatch();
  b.setInstanceId(instance);
  b.setSeq(seq);
  auto procs = b.initProcesses(1);
  procs[0].setPid(10);
  procs[0].setJob("job-" + std::to_string(seq));
  auto comms = b.initComms(1);
  comms[0].setPid(10);
  comms[0].setCommHash(0xc0ffee);
  comms[0].setRank(0);
  comms[0].setNranks(2);
  proto::ColumnBlock block;
  block.pid = 10;
  block.comm_hash = 0xc0ffee;
  block.rank = 0;
  for (size_t i = 0; i < records; ++i) {
    proto::CallRecord r;
    r.seq = seq * 100 + i;
    r.issue_ns = 1'000 + i * 10;
    r.return_ns = r.issue_ns + 5;
    r.count = 1024;
    r.op = RS_OP_ALLREDUCE;
    r.datatype = 7;
    block.records.push_back(r);
  }
  proto::encode_collectives({&block}, b, {}, layout);
  return proto::to_packed(message);
}

std::vector<fs::path> segment_files(const std::string& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".seg") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

class SpoolTest : public ::testing::Test {
 protected:
  testing::TempDir tmp;
  std::string dir = tmp.file("spool/node-a");
  Spool::Limits limits;
  std::unique_ptr<Spool> open() {
    auto spool = Spool::open(dir, limits);
    EXPECT_TRUE(spool) << spool.error().message;
    return spool ? std::move(*spool) : nullptr;
  }
};

TEST_F(SpoolTest, UnackedBatchesComeBackInOrderAfterARestartAndAckedOnesDoNot) {
  {
    auto spool = open();
    ASSERT_TRUE(spool);
    std::vector<SpoolRef> refs;
    for (uint64_t seq = 1; seq <= 6; ++seq) {
      auto ref = spool->append(7, seq, batch(7, seq));
      ASSERT_TRUE(ref) << ref.error().message;
      refs.push_back(*ref);
    }
    spool->acked(7, 2, refs[1]);
    spool->acked(7, 5, refs[4]);
    auto back = spool->read(refs[3]);
    ASSERT_TRUE(back);
    EXPECT_EQ(*back, batch(7, 4));
  }  // the agent stops (or dies: every record was written as it came)
  auto spool = open();
  ASSERT_TRUE(spool);
  auto recovered = spool->take_recovered();
  std::vector<uint64_t> seqs;
  for (const auto& r : recovered) {
    EXPECT_EQ(r.instance, 7u);
    auto bytes = spool->read(r.ref);  // read when it is sent, not held in memory
    ASSERT_TRUE(bytes) << bytes.error().message;
    EXPECT_EQ(*bytes, batch(7, r.seq)) << "the batch comes back byte for byte, with its own instance id and seq";
    seqs.push_back(r.seq);
  }
  EXPECT_EQ(seqs, (std::vector<uint64_t>{1, 3, 4, 6}));
  EXPECT_EQ(spool->damage().bad_tails, 0u);
  EXPECT_TRUE(spool->take_recovered().empty()) << "handed over once";
}

TEST_F(SpoolTest, AFolderAnyoneElseCanWriteIsRefused) {
  // Whoever can write in the spool can make the agent send batches in its
  // node's name: a folder writable by others, or another user's, is refused.
  fs::create_directories(dir);
  fs::permissions(dir, fs::perms::all);  // 0777
  auto open_writable = Spool::open(dir, limits);
  ASSERT_FALSE(open_writable);
  EXPECT_NE(open_writable.error().message.find("chmod 0700 " + dir), std::string::npos) << open_writable.error().message;
  fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace);
  ASSERT_EQ(::chown(dir.c_str(), 65534, 65534), 0);  // nobody's
  auto open_foreign = Spool::open(dir, limits);
  ASSERT_FALSE(open_foreign);
  EXPECT_NE(open_foreign.error().message.find("owned by uid 65534"), std::string::npos) << open_foreign.error().message;
  ASSERT_EQ(::chown(dir.c_str(), ::geteuid(), ::getegid()), 0);
  EXPECT_TRUE(Spool::open(dir, limits)) << "the agent's own, 0700";
}

TEST_F(SpoolTest, ABatchChangedOnDiskAfterItWasWrittenIsNotSent) {
  auto spool = open();
  ASSERT_TRUE(spool);
  auto ref = spool->append(7, 1, batch(7, 1));
  ASSERT_TRUE(ref) << ref.error().message;
  ASSERT_TRUE(spool->read(*ref));
  {
    int fd = ::open(segment_files(dir).back().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char byte = 0;
    off_t at = static_cast<off_t>(ref->offset + ref->size / 2);
    ASSERT_EQ(::pread(fd, &byte, 1, at), 1);
    byte = static_cast<char>(byte ^ 0xff);  // one byte of the payload, every bit flipped
    ASSERT_EQ(::pwrite(fd, &byte, 1, at), 1);
    ::close(fd);
  }
  auto back = spool->read(*ref);
  ASSERT_FALSE(back);
  EXPECT_NE(back.error().message.find("no longer matches its checksum"), std::string::npos) << back.error().message;
}

TEST_F(SpoolTest, SegmentsGoOnceEverythingInThemIsAcked) {
  limits.segment_bytes = 1;  // one batch per segment
  auto spool = open();
  ASSERT_TRUE(spool);
  std::vector<SpoolRef> refs;
  for (uint64_t seq = 1; seq <= 4; ++seq) refs.push_back(*spool->append(3, seq, batch(3, seq)));
  EXPECT_EQ(segment_files(dir).size(), 4u);
  for (uint64_t seq = 1; seq <= 3; ++seq) spool->acked(3, seq, refs[seq - 1]);
  EXPECT_EQ(segment_files(dir).size(), 1u) << "only the segment being written is left";
  spool.reset();
  spool = open();
  auto recovered = spool->take_recovered();
  ASSERT_EQ(recovered.size(), 1u);
  EXPECT_EQ(recovered[0].seq, 4u);
}

TEST_F(SpoolTest, AFullSpoolGivesUpItsOldestSegmentFirst) {
  std::string one = batch(1, 1);
  limits.segment_bytes = 3 * (one.size() + 32);  // three batches per segment
  limits.max_bytes = 3 * limits.segment_bytes;
  auto spool = open();
  ASSERT_TRUE(spool);
  std::vector<SpoolRef> refs;
  std::vector<uint64_t> dropped;
  for (uint64_t seq = 1; seq <= 40; ++seq) {
    refs.push_back(*spool->append(1, seq, batch(1, seq)));
    while (auto segment = spool->segment_to_drop()) {
      for (size_t i = 0; i < refs.size(); ++i)
        if (refs[i].segment == *segment) dropped.push_back(i + 1);
      spool->drop_segment(*segment);
    }
    EXPECT_LE(spool->bytes(), limits.max_bytes + limits.segment_bytes) << "bounded";
  }
  ASSERT_FALSE(dropped.empty());
  for (size_t i = 0; i < dropped.size(); ++i) EXPECT_EQ(dropped[i], i + 1) << "oldest first, in order";
  spool.reset();
  spool = open();
  auto recovered = spool->take_recovered();
  ASSERT_FALSE(recovered.empty());
  EXPECT_EQ(recovered.front().seq, dropped.back() + 1) << "the newest batches are kept";
  EXPECT_EQ(recovered.back().seq, 40u);
}

TEST_F(SpoolTest, ACutShortOrCorruptTailIsSkippedCountedAndNeverTrusted) {
  {
    auto spool = open();
    ASSERT_TRUE(spool);
    for (uint64_t seq = 1; seq <= 3; ++seq) ASSERT_TRUE(spool->append(9, seq, batch(9, seq)));
  }
  auto files = segment_files(dir);
  ASSERT_EQ(files.size(), 1u);
  // A crash in the middle of a write: half a record at the end.
  std::string half = batch(9, 4).substr(0, 17);
  { std::ofstream(files[0], std::ios::app | std::ios::binary) << std::string(32, '\x50') << half; }
  auto spool = open();
  ASSERT_TRUE(spool);
  auto recovered = spool->take_recovered();
  ASSERT_EQ(recovered.size(), 3u);
  EXPECT_EQ(spool->damage().bad_tails, 1u);
  EXPECT_EQ(spool->damage().skipped_bytes, 32u + half.size());
  // New batches go to a fresh segment, never after the damage.
  ASSERT_TRUE(spool->append(9, 4, batch(9, 4)));
  spool.reset();

  // A flipped byte inside the second record: the first is kept, the rest of that file skipped.
  files = segment_files(dir);
  ASSERT_EQ(files.size(), 2u);
  {
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(32 + batch(9, 1).size() + 32 + 5));
    f.put('\x7f');
  }
  spool = open();
  ASSERT_TRUE(spool);
  recovered = spool->take_recovered();
  std::vector<uint64_t> seqs;
  for (const auto& r : recovered) seqs.push_back(r.seq);
  EXPECT_EQ(seqs, (std::vector<uint64_t>{1, 4}));
  EXPECT_EQ(spool->damage().bad_tails, 1u);

  // Not a spool file at all.
  spool.reset();
  { std::ofstream(dir + "/00000000000000ff.seg", std::ios::binary) << "garbage, not a record"; }
  spool = open();
  ASSERT_TRUE(spool);
  EXPECT_EQ(spool->damage().bad_tails, 2u);
}

TEST_F(SpoolTest, OneAgentPerSpool) {
  auto first = open();
  ASSERT_TRUE(first);
  auto second = Spool::open(dir, limits);
  ASSERT_FALSE(second);
  EXPECT_NE(second.error().message.find("in use by another rankscope-agent"), std::string::npos)
      << second.error().message;
  first.reset();
  EXPECT_TRUE(Spool::open(dir, limits)) << "free again once the first is gone";
}

TEST_F(SpoolTest, AFolderThatCannotBeMadeIsAClearError) {
  { std::ofstream(tmp.file("file")) << "x"; }
  auto spool = Spool::open(tmp.file("file/spool"), limits);
  ASSERT_FALSE(spool);
  EXPECT_NE(spool.error().message.find("cannot create spool folder"), std::string::npos) << spool.error().message;
}

TEST(StripDetail, KeepsTheSummariesAndCountsTheRecords) {
  uint64_t records = 0;
  auto stripped = strip_detail(batch(5, 8, 6), records);
  ASSERT_TRUE(stripped);
  EXPECT_EQ(records, 6u);
  ASSERT_TRUE(proto::read_packed<wire::AgentMessage>(*stripped, proto::ReadLimits{}, [&](auto m) {
    auto b = m.getBatch();
    EXPECT_EQ(b.getInstanceId(), 5u);
    EXPECT_EQ(b.getSeq(), 8u);
    ASSERT_EQ(b.getProcesses().size(), 1u);
    EXPECT_EQ(std::string(b.getProcesses()[0].getJob().cStr()), "job-8");
    EXPECT_EQ(b.getComms().size(), 1u);
    EXPECT_EQ(b.getCollectives().size(), 0u);
  }));
  EXPECT_FALSE(strip_detail("not a batch", records));
}

// A stand-in collector: a ROUTER that accepts hellos and acks every batch,
// noting (instance, seq) in arrival order (and, given a clock, when). With
// `ack` off it acks nothing (a collector too slow to); `ask_hello` answers
// the next batch with needHello (as a restarted collector would).
class FakeCollector {
 public:
  FakeCollector(zmq::context_t& context, const std::string& endpoint) : socket_(context, zmq::socket_type::router) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind(endpoint);
  }
  // Answers every message waiting; whether there was one.
  bool serve() {
    bool any = false;
    for (;;) {
      zmq::message_t id, body;
      if (!socket_.recv(id, zmq::recv_flags::dontwait)) return any;
      any = true;
      (void)socket_.recv(body, zmq::recv_flags::none);
      std::string bytes(static_cast<const char*>(body.data()), body.size());
      capnp::MallocMessageBuilder reply;
      bool answer = false;
      std::string inner;  // a compressed batch's
      bool compressed = false;
      EXPECT_TRUE(proto::read_packed<wire::AgentMessage>(bytes, proto::ReadLimits{}, [&](auto m) {
        if (m.which() != wire::AgentMessage::COMPRESSED) return;
        auto data = m.getCompressed();
        auto out =
            proto::decompress(std::string_view(reinterpret_cast<const char*>(data.begin()), data.size()), 1u << 26);
        ASSERT_TRUE(out) << out.error().message;
        inner = std::move(*out);
        compressed = true;
      }));
      EXPECT_TRUE(proto::read_packed<wire::AgentMessage>(compressed ? inner : bytes, proto::ReadLimits{}, [&](auto m) {
        if (m.which() == wire::AgentMessage::HELLO) {
          auto hello = reply.initRoot<wire::CollectorMessage>().initHelloReply();
          hello.setAccepted(true);
          hello.setReadsCompact(reads_compact);
          hello.setCollectorId(id_in_fleet);
          hello.setClockPort(clock_port);
          if (!fleet.empty() && m.getHello().getFollowsFleet()) write_fleet(hello.initFleet());
          agent = std::string(static_cast<const char*>(id.data()), id.size());
          answer = true;
        } else if (m.which() == wire::AgentMessage::CLOCK_PROBE) {
          // Answered here with t2 = t3 = 111: a sample that came this way.
          ++probes;
          auto r = reply.initRoot<wire::CollectorMessage>().initClockReply();
          r.setT1(m.getClockProbe().getT1());
          r.setT2(111);
          r.setT3(111);
          answer = true;
        } else if (m.which() == wire::AgentMessage::BATCH) {
          auto b = m.getBatch();
          received.emplace_back(b.getInstanceId(), b.getSeq());
          keys.push_back(b.getPlacementKey());
          compact.push_back({compressed, b.hasCollectiveTable()});
          auto shape = proto::block_shape(b);
          records.push_back(shape ? shape->records : 0);
          announcements.push_back(b.getCollectives().size() == 0 && b.getProcesses().size() > 0);
          if (clock) times.push_back(clock->monotonic_ns());
          if (ask_hello) {
            auto error = reply.initRoot<wire::CollectorMessage>().initError();
            error.setCode(wire::ErrorCode::NEED_HELLO);
            ask_hello = false;
            answer = true;
          } else if (ack) {
            auto ack = reply.initRoot<wire::CollectorMessage>().initAck();
            ack.setInstanceId(b.getInstanceId());
            ack.setSeq(b.getSeq());
            answer = true;
          }
        }
      }));
      ++messages_in;
      if (!answer) continue;
      socket_.send(id, zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(proto::to_packed(reply)), zmq::send_flags::none);
      ++replies_out;
    }
  }
  // A FleetMap to the agent that said hello last.
  void send_fleet() {
    capnp::MallocMessageBuilder message;
    write_fleet(message.initRoot<wire::CollectorMessage>().initFleet());
    socket_.send(zmq::buffer(agent), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(proto::to_packed(message)), zmq::send_flags::none);
  }
  void write_fleet(wire::FleetMap::Builder map) {
    auto members = map.initMembers(static_cast<unsigned>(fleet.size()));
    for (unsigned i = 0; i < fleet.size(); ++i) {
      members[i].setId(fleet[i].first);
      members[i].setAgents(fleet[i].second);
    }
  }
  // Waits up to `ms` for a message, then serves what came; whether any did.
  bool serve_within(int ms) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(ms));
    return serve();
  }
  std::vector<std::pair<uint64_t, uint64_t>> received;
  std::vector<uint64_t> times;  // of each batch received, on `clock`
  std::vector<std::string> keys;                           // each batch's placement key
  std::vector<std::pair<bool, bool>> compact;              // each batch: (compressed, with a table)
  std::vector<uint64_t> records;                           // each batch's collective records
  bool reads_compact = false;                              // said in the HelloReply
  uint16_t clock_port = 0;                                 // said in the HelloReply
  uint64_t probes = 0;                                     // clock probes that came on this socket
  std::vector<bool> announcements;                         // each batch: processes and no records (an announcement)
  std::string id_in_fleet;                                 // said in the HelloReply
  std::vector<std::pair<std::string, std::string>> fleet;  // (id, endpoint) told to agents that follow a fleet
  std::string agent;                                       // the routing id of the last hello's connection
  const Clock* clock = nullptr;
  bool ack = true, ask_hello = false;
  uint64_t messages_in = 0, replies_out = 0;

 private:
  zmq::socket_t socket_;
};

// Batches go compact (their records in a table, compressed where that is
// smaller: these are) to a collector that said it reads them so, and with
// their table rewritten as columns, not compressed, to one that did not (an
// older collector in its place).
TEST_F(SpoolTest, BatchesGoCompactOnlyToACollectorThatReadsThemSo) {
  zmq::context_t context(1);
  Options options;
  options.collector = "ipc://" + tmp.file("collector.sock");
  SystemClock clock;
  auto no_samples = [](uint64_t, uint64_t, uint64_t, uint64_t, const std::string&) {};
  for (bool reads : {true, false}) {
    SCOPED_TRACE(reads);
    FakeCollector collector(context, options.collector);
    collector.reads_compact = reads;
    Transport transport(context, options, clock, 7, no_samples, nullptr);
    ASSERT_TRUE(testing::wait_for(
        [&] {
          collector.serve();
          transport.service();
          return transport.accepted();
        },
        std::chrono::seconds(10)));
    EXPECT_EQ(transport.reads_compact(), reads);
    transport.submit(1, batch(7, 1, 500, proto::BlockLayout::table));  // built when the collector said it reads it
    transport.submit(
        2, batch(7, 2, 300, transport.reads_compact() ? proto::BlockLayout::table : proto::BlockLayout::columns));
    ASSERT_TRUE(testing::wait_for(
        [&] {
          collector.serve();
          transport.service();
          return transport.unacked() == 0;
        },
        std::chrono::seconds(10)));
    ASSERT_EQ(collector.compact.size(), 2u);
    for (const auto& [compressed, table] : collector.compact) {
      EXPECT_EQ(compressed, reads);
      EXPECT_EQ(table, reads);
    }
    EXPECT_EQ(collector.records, (std::vector<uint64_t>{500, 300})) << "every record, either way";
  }
}

TEST_F(SpoolTest, ARestartedAgentReplaysTheEarlierInstancesBatchesFirstUnderTheirOwnIds) {
  zmq::context_t context(1);
  Options options;
  options.collector = "ipc://" + tmp.file("collector.sock");
  SystemClock clock;
  auto no_samples = [](uint64_t, uint64_t, uint64_t, uint64_t, const std::string&) {};
  {
    // No collector: everything stays unacked, on disk.
    Transport first(context, options, clock, 111, no_samples, open());
    for (uint64_t seq = 1; seq <= 5; ++seq) first.submit(seq, batch(111, seq));
    first.service();
    EXPECT_EQ(first.unacked(), 5u);
  }  // the agent is killed
  Transport second(context, options, clock, 222, no_samples, open());
  EXPECT_EQ(second.unacked(), 5u) << "the earlier run's batches are queued at start";
  second.submit(1, batch(222, 1));
  second.submit(2, batch(222, 2));
  FakeCollector collector(context, options.collector);
  ASSERT_TRUE(testing::wait_for(
      [&] {
        collector.serve();
        second.service();
        return second.unacked() == 0;
      },
      std::chrono::seconds(20)))
      << collector.received.size() << " batch(es) received";
  std::vector<std::pair<uint64_t, uint64_t>> expected = {{111, 1}, {111, 2}, {111, 3}, {111, 4}, {111, 5},
                                                         {222, 1}, {222, 2}};
  ASSERT_GE(collector.received.size(), expected.size());
  EXPECT_EQ(std::vector(collector.received.begin(), collector.received.begin() + 7), expected)
      << "in order: the earlier instance first, each batch with its own instance id and seq";
  EXPECT_EQ(second.discarded_batches(), 0u);
}

// A batch of `key`'s stream: records, or (announcement) only a process.
std::string keyed_batch(uint64_t instance, uint64_t seq, const std::string& key, bool announcement = false) {
  if (!announcement) {
    std::string bytes = batch(instance, seq);
    capnp::MallocMessageBuilder message;
    EXPECT_TRUE(
        proto::read_packed<wire::AgentMessage>(bytes, proto::ReadLimits{}, [&](auto m) { message.setRoot(m); }));
    message.getRoot<wire::AgentMessage>().getBatch().setPlacementKey(key);
    return proto::to_packed(message);
  }
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<wire::AgentMessage>().initBatch();
  b.setInstanceId(instance);
  b.setSeq(seq);
  b.initProcesses(1)[0].setPid(10);
  b.setPlacementKey(key);
  return proto::to_packed(message);
}

// In a fleet: the configured collector (a) names the members; each key's
// batches go to its owner, after an announcement when its owner is not the
// configured collector; when the owner of a key leaves the fleet, what it
// did not acknowledge goes to the new owner after a new announcement, each
// batch under its own instance id and seq, and nothing of another key moves.
TEST_F(SpoolTest, InAFleetEachKeyGoesToItsOwnerAndFollowsItWhenItMoves) {
  zmq::context_t context(1);
  Options options;
  options.collector = "ipc://" + tmp.file("a.sock");
  const std::string b_endpoint = "ipc://" + tmp.file("b.sock");
  SystemClock clock;
  FakeCollector a(context, options.collector), b(context, b_endpoint);
  a.id_in_fleet = "a";
  b.id_in_fleet = "b";
  a.fleet = b.fleet = {{"a", options.collector}, {"b", b_endpoint}};
  std::vector<fleet::Member> both = {{"a", options.collector, "", "", "", "", 0}, {"b", b_endpoint, "", "", "", "", 0}};
  std::string on_a, on_b;  // a key placed on each
  for (int i = 0; on_a.empty() || on_b.empty(); ++i) {
    std::string key = fleet::placement_key("job-" + std::to_string(i), 0);
    (fleet::owner(key, both)->id == "a" ? on_a : on_b) = key;
  }
  Transport transport(
      context, options, clock, 7, [](uint64_t, uint64_t, uint64_t, uint64_t, const std::string&) {}, open());
  auto turn = [&] {
    a.serve_within(2);
    b.serve();
    transport.service();
  };
  ASSERT_TRUE(testing::wait_for([&] { return turn(), transport.in_fleet(); }, std::chrono::seconds(10)));
  EXPECT_EQ(transport.route(on_a), "a");
  EXPECT_EQ(transport.route(on_b), "b");
  // As the agent does: each key's stream is tracked, a key placed elsewhere announced first.
  auto send = [&](const std::string& key) {
    transport.track(key);
    for (const auto& moved : transport.take_moved()) {
      auto [instance, seq] = transport.batch_id(moved);
      transport.submit(instance, seq, keyed_batch(instance, seq, moved, true), moved, true);
    }
    auto [instance, seq] = transport.batch_id(key);
    transport.submit(instance, seq, keyed_batch(instance, seq, key), key);
  };
  b.ack = false;  // b stores nothing: it will be lost with its unacknowledged batches
  for (int i = 0; i < 3; ++i) {
    send(on_a);
    send(on_b);
  }
  ASSERT_TRUE(testing::wait_for([&] { return turn(), a.received.size() >= 3 && b.received.size() >= 4; },
                                std::chrono::seconds(10)));
  EXPECT_EQ(a.keys, std::vector<std::string>(3, on_a));
  EXPECT_EQ(b.keys, std::vector<std::string>(4, on_b));
  EXPECT_EQ(b.announcements, (std::vector<bool>{true, false, false, false})) << "b is told of the processes first";
  const std::vector<std::pair<uint64_t, uint64_t>> sent_to_b(b.received.begin(), b.received.begin() + 4);
  EXPECT_EQ(transport.unacked(), 4u);

  // b leaves the fleet: its key is a's now.
  a.fleet = {{"a", options.collector}};
  a.send_fleet();
  ASSERT_TRUE(testing::wait_for([&] { return turn(), transport.route(on_b) == "a"; }, std::chrono::seconds(10)));
  const size_t before = a.received.size();
  send(on_b);
  ASSERT_TRUE(testing::wait_for([&] { return turn(), transport.unacked() == 0; }, std::chrono::seconds(10)))
      << transport.unacked() << " unacknowledged";
  std::vector<std::pair<uint64_t, uint64_t>> moved(a.received.begin() + static_cast<std::ptrdiff_t>(before),
                                                   a.received.end());
  std::vector<bool> announced(a.announcements.begin() + static_cast<std::ptrdiff_t>(before), a.announcements.end());
  ASSERT_EQ(moved.size(), 6u);
  EXPECT_TRUE(announced[0]) << "a is told of the moved key's processes before its records";
  EXPECT_EQ(std::vector(moved.begin() + 1, moved.begin() + 5), sent_to_b)
      << "b's unacknowledged batches, in order, under their own ids";
  EXPECT_EQ(moved[5].first, sent_to_b[0].first) << "the key's stream goes on";
  EXPECT_EQ(moved[5].second, 6u);
  for (size_t i = before; i < a.keys.size(); ++i) EXPECT_EQ(a.keys[i], on_b);
}

// A clock the test moves.
using StepClock = testing::ManualClock;

// Hello and its answer.
void accept(FakeCollector& collector, Transport& transport) {
  ASSERT_TRUE(testing::wait_for(
      [&] {
        collector.serve_within(5);
        transport.service();
        return transport.accepted();
      },
      std::chrono::seconds(10)));
}

// Turns until `until_ns` on the agent's clock: the agent does what is due,
// and every message goes back and forth (each side has received all the
// other sent: nothing is on its way); then `step_ns` of the agent's time
// passes. Time never moves while a message travels, however slow the machine.
void run_turns(FakeCollector& collector, Transport& transport, StepClock& clock, uint64_t until_ns,
               uint64_t step_ns = 200'000'000ull) {
  while (clock.now < until_ns) {
    for (;;) {
      transport.service();
      if (transport.messages_sent() == collector.messages_in && collector.replies_out == transport.messages_received())
        break;
      collector.serve_within(2);
      zmq::pollitem_t item{transport.socket().handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(2));
    }
    clock.now += step_ns;
  }
}

// A collector that takes batches but never acknowledges them (too slow):
// the agent sends the same batch again after 2 s, then waits twice as long
// each time (4, 8, 16, 32 s), at most 60 s; a collector that asks for a new
// hello (restarted) gets it at once, and the waiting starts again at 2 s.
TEST_F(SpoolTest, TheWaitForAnAckDoublesWithEachReSendAndANewConnectionStartsAfresh) {
  zmq::context_t context(1);
  Options options;  // --ack-timeout-ms 2000
  options.collector = "ipc://" + tmp.file("slow.sock");
  StepClock clock{1'000'000'000ull};
  FakeCollector collector(context, options.collector);
  collector.clock = &clock;
  collector.ack = false;
  Transport transport(
      context, options, clock, 7, [](uint64_t, uint64_t, uint64_t, uint64_t, const std::string&) {}, open());
  accept(collector, transport);
  uint64_t t0 = clock.now;
  transport.submit(1, batch(7, 1));
  run_turns(collector, transport, clock, t0 + 200'000'000'000ull);
  collector.ask_hello = true;  // the next re-send (at 242 s) is answered "hello first"
  run_turns(collector, transport, clock, t0 + 250'000'000'000ull);
  std::vector<double> at;
  for (uint64_t t : collector.times) at.push_back(static_cast<double>(t - t0) / 1e9);
  std::string seen;
  for (double a : at) seen += std::to_string(a) + " ";
  // Sent at 0, then re-sent at 2, 6, 14, 30, 62, then a minute apart: 122, 182, 242.
  std::vector<double> expected = {0, 2, 6, 14, 30, 62, 122, 182, 242};
  ASSERT_GE(at.size(), expected.size() + 2) << seen;
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(at[i], expected[i], 0.45) << "send " << i << ": " << seen;
  // Welcomed again: sent at once (within the turn of the needHello, the
  // hello and its answer), then after 2 s, not after another minute.
  EXPECT_LT(at[9] - at[8], 0.45) << seen;
  EXPECT_NEAR(at[10] - at[9], 2, 0.45) << seen;
  EXPECT_EQ(transport.unacked(), 1u);
  for (const auto& [instance, seq] : collector.received) {
    EXPECT_EQ(instance, 7u);
    EXPECT_EQ(seq, 1u);
  }
}

TEST_F(SpoolTest, ACollectorThatAcknowledgesLateIsGivenTimeBeforeAnythingIsSentAgain) {
  zmq::context_t context(1);
  Options options;  // --ack-timeout-ms 2000
  options.collector = "ipc://" + tmp.file("behind.sock");
  StepClock clock{1'000'000'000ull};
  FakeCollector collector(context, options.collector);
  collector.clock = &clock;
  Transport transport(
      context, options, clock, 7, [](uint64_t, uint64_t, uint64_t, uint64_t, const std::string&) {}, open());
  accept(collector, transport);
  EXPECT_EQ(transport.ack_timeout_ns(), 2'000'000'000ull) << "nothing learnt yet: the configured timeout";
  // A collector working through a backlog: each batch is acknowledged 5 s
  // after it was sent (the agent does nothing meanwhile, so it re-sends nothing).
  for (uint64_t seq = 1; seq <= 8; ++seq) {
    transport.submit(seq, batch(7, seq));
    uint64_t replies = collector.replies_out;
    ASSERT_TRUE(testing::wait_for(
        [&] {
          collector.serve_within(2);
          return collector.replies_out > replies;
        },
        std::chrono::seconds(10)));
    clock.now += 5'000'000'000ull;
    // The ack is on its way: the agent looks only once it is there.
    zmq::pollitem_t item{transport.socket().handle(), 0, ZMQ_POLLIN, 0};
    ASSERT_EQ(zmq::poll(&item, 1, std::chrono::seconds(10)), 1);
    uint64_t received = transport.messages_received();
    transport.service();
    ASSERT_GT(transport.messages_received(), received);
  }
  EXPECT_EQ(transport.unacked(), 0u);
  EXPECT_EQ(collector.received.size(), 8u) << "acks that came late, but within the wait, cause no re-send";
  uint64_t learnt = transport.ack_timeout_ns();
  EXPECT_GT(learnt, 5'000'000'000ull) << "the wait follows the acks' round trip";
  EXPECT_LT(learnt, 8'000'000'000ull) << "the smoothed round trip plus four times its (decaying) variation";

  // Now no ack comes: the first re-send waits for the learnt time, not 2 s,
  // and the next waits twice as long.
  collector.ack = false;
  collector.times.clear();
  uint64_t t0 = clock.now;
  transport.submit(9, batch(7, 9));
  run_turns(collector, transport, clock, t0 + 30'000'000'000ull);
  std::string seen;
  for (uint64_t t : collector.times) seen += std::to_string(static_cast<double>(t - t0) / 1e9) + " ";
  ASSERT_GE(collector.times.size(), 3u) << seen;
  double first = static_cast<double>(collector.times[1] - collector.times[0]) / 1e9;
  double second = static_cast<double>(collector.times[2] - collector.times[1]) / 1e9;
  EXPECT_NEAR(first, static_cast<double>(learnt) / 1e9, 0.45) << seen;
  EXPECT_NEAR(second, 2 * static_cast<double>(learnt) / 1e9, 0.45) << seen;
}

TEST_F(SpoolTest, AFullSpoolKeepsSummariesAndCountsTheLostRecords) {
  zmq::context_t context(1);
  Options options;
  options.collector = "ipc://" + tmp.file("nobody.sock");
  SystemClock clock;
  limits.segment_bytes = 2 * (batch(1, 1).size() + 32);
  limits.max_bytes = 4 * limits.segment_bytes;
  Transport transport(
      context, options, clock, 1, [](uint64_t, uint64_t, uint64_t, uint64_t, const std::string&) {}, open());
  for (uint64_t seq = 1; seq <= 50; ++seq) transport.submit(seq, batch(1, seq, 4));
  ASSERT_GT(transport.discarded_batches(), 0u);
  EXPECT_EQ(transport.lost_records(), transport.discarded_batches() * 4) << "every dropped batch had 4 records";
  EXPECT_EQ(transport.unacked(), 50u) << "every batch is still to be sent: the dropped ones as summaries";
  EXPECT_LE(transport.spool()->bytes(), limits.max_bytes + limits.segment_bytes);
}

// A collector that names a clock port (HelloReply.clockPort) gets the
// probes there, at the host the agent reached it at, and its answers there
// are the samples; while nothing answers at that port (a firewall, a
// Service that does not forward it) the probes go on the link.
TEST_F(SpoolTest, ClockProbesGoToTheClockPortAndOnTheLinkWhileNothingAnswersThere) {
  zmq::context_t context(1);
  Options options;
  options.collector = "tcp://127.0.0.1:" + std::to_string(testing::free_port());
  const int clock_port = testing::free_port();
  SystemClock clock;
  FakeCollector collector(context, options.collector);
  collector.clock_port = static_cast<uint16_t>(clock_port);
  std::vector<uint64_t> t2s;
  Transport transport(context, options, clock, 7,
                      [&](uint64_t, uint64_t t2, uint64_t, uint64_t, const std::string&) { t2s.push_back(t2); });
  accept(collector, transport);

  // Nothing at the clock port yet: on the link.
  transport.send_clock_probe();
  ASSERT_TRUE(testing::wait_for([&] { return collector.serve_within(2), transport.service(), t2s.size() == 1; },
                                std::chrono::seconds(10)));
  EXPECT_EQ(t2s[0], 111u);
  EXPECT_EQ(collector.probes, 1u);

  // A responder at the clock port (t2 = t3 = 222): once the agent's socket reaches it, every probe goes there.
  zmq::socket_t responder(context, zmq::socket_type::router);
  responder.set(zmq::sockopt::linger, 0);
  responder.bind("tcp://127.0.0.1:" + std::to_string(clock_port));
  auto answer = [&] {
    zmq::message_t id, body;
    while (responder.recv(id, zmq::recv_flags::dontwait)) {
      (void)responder.recv(body, zmq::recv_flags::none);
      auto t1 = proto::read_clock_probe(std::string_view(static_cast<const char*>(body.data()), body.size()));
      ASSERT_TRUE(t1);
      responder.send(id, zmq::send_flags::sndmore);
      responder.send(zmq::buffer(proto::encode_clock_reply(*t1, 222, 222)), zmq::send_flags::none);
    }
  };
  auto turn = [&] {
    answer();
    collector.serve_within(2);
    transport.service();
  };
  ASSERT_TRUE(testing::wait_for(
      [&] {
        transport.send_clock_probe();
        for (int i = 0; i < 10; ++i) turn();
        return !t2s.empty() && t2s.back() == 222;
      },
      std::chrono::seconds(10)));
  const uint64_t on_link = collector.probes;
  const size_t samples = t2s.size();
  for (int i = 0; i < 3; ++i) transport.send_clock_probe();
  ASSERT_TRUE(testing::wait_for([&] { return turn(), t2s.size() == samples + 3; }, std::chrono::seconds(10)));
  EXPECT_EQ(std::vector<uint64_t>(t2s.begin() + static_cast<std::ptrdiff_t>(samples), t2s.end()),
            std::vector<uint64_t>(3, 222));
  EXPECT_EQ(collector.probes, on_link) << "none on the link once the clock port answers";
}

TEST_F(SpoolTest, WithoutASpoolMemoryStaysBounded) {
  zmq::context_t context(1);
  Options options;
  options.collector = "ipc://" + tmp.file("nobody.sock");
  options.max_unacked_bytes = 20 * batch(1, 1).size();
  SystemClock clock;
  Transport transport(context, options, clock, 1, [](uint64_t, uint64_t, uint64_t, uint64_t, const std::string&) {});
  for (uint64_t seq = 1; seq <= 500; ++seq) transport.submit(seq, batch(1, seq, 4));
  EXPECT_LE(transport.memory_bytes(), options.max_unacked_bytes);
  EXPECT_GT(transport.discarded_batches(), 0u);
  EXPECT_GT(transport.lost_records(), 0u);
}

}  // namespace
}  // namespace rankscope::agent
