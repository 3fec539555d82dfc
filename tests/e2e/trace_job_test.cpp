// End to end, all real: a 4-rank fakenccl-train job on two simulated nodes
// (network namespaces) is traced by two agents with eBPF, its collectives
// travel to the collector over ZeroMQ as Cap'n Proto, land in RocksDB, and
// what the collector holds is compared, call by call, with what each rank
// says it called.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "common/format.h"
#include "proto/records.h"
#include "tests/support/cluster.h"
#include "tests/support/harness.h"
#include "tests/support/made_calls.h"

namespace rankscope::testing {
namespace {

namespace query = proto::query;

struct StoredCall {
  uint64_t seq;
  uint8_t op, datatype;
  uint64_t count, bytes;
  std::string node;
};

TEST(TraceJob, CollectorHoldsExactlyTheCallsEveryRankMade) {
  if (geteuid() != 0) GTEST_SKIP() << "eBPF and network namespaces need root: run the suite as root (sudo make test)";
  constexpr int kRanks = 4, kNodes = 2, kSteps = 200;
  TempDir dir;
  NetnsCluster cluster(kNodes);
  ASSERT_TRUE(cluster.ok()) << "could not create network namespaces";
  DeploymentOptions options;
  // The job's communicator leaves the live model 3 s after its ranks ended it.
  options.collector_args = {"--retire-after-s", "3"};
  TestDeployment deployment(dir, cluster, kNodes, options);
  ASSERT_TRUE(deployment.wait_connected(std::chrono::seconds(20)))
      << slurp(dir.file("collector.log")) << slurp(dir.file("agent-0.log"));

  std::vector<Process> ranks;
  for (int rank = 0; rank < kRanks; ++rank) {
    SpawnOptions spawn;
    spawn.argv = {bin_path("fakenccl-train"), "--id-file", dir.file("nccl.id"), "--steps", std::to_string(kSteps),
                  "--buckets", "3", "--bucket-elems", "4096", "--compute-iters", "20000", "--check",
                  "--record", dir.file("rank" + std::to_string(rank) + ".calls")};
    spawn.env = {{"RANK", std::to_string(rank)},
                 {"WORLD_SIZE", std::to_string(kRanks)},
                 {"LOCAL_RANK", std::to_string(rank % 2)}};
    spawn.netns = cluster.name(rank / 2);
    spawn.stdout_path = dir.file("rank" + std::to_string(rank) + ".log");
    ranks.emplace_back(spawn);
  }
  for (int rank = 0; rank < kRanks; ++rank)
    ASSERT_EQ(ranks[rank].wait(std::chrono::seconds(180)), 0)
        << "rank " << rank << ": " << slurp(dir.file("rank" + std::to_string(rank) + ".log"));

  std::vector<std::vector<MadeCall>> made(kRanks);
  size_t total_made = 0;
  for (int rank = 0; rank < kRanks; ++rank) {
    made[rank] = read_made_calls(dir.file("rank" + std::to_string(rank) + ".calls"));
    ASSERT_GE(made[rank].size(), static_cast<size_t>(kSteps * 3)) << "rank " << rank << " recorded too few calls";
    total_made += made[rank].size();
  }

  // Wait until the collector has stored every call (batches leave every 100 ms).
  std::vector<uint64_t> comms;
  ASSERT_TRUE(wait_for(
      [&] {
        capnp::MallocMessageBuilder request;
        auto req = request.initRoot<query::Request>();
        req.setProtocolVersion(query::QUERY_PROTOCOL_VERSION);
        req.setJobs();
        uint64_t stored = 0;
        comms.clear();
        auto result = deployment.client().ask(request, [&](query::Reply::Reader reply) {
          for (auto job : reply.getJobs().getJobs())
            for (auto comm : job.getComms()) {
              comms.push_back(comm.getCommHash());
              for (auto rank : comm.getRanks()) stored += rank.getRecords();
            }
        });
        return result && stored >= total_made;
      },
      std::chrono::seconds(20)))
      << slurp(dir.file("agent-0.log")) << slurp(dir.file("collector.log"));
  ASSERT_EQ(comms.size(), 1u) << "all four ranks must share one communicator hash";

  // Every call each rank made, as the collector holds it: while the job's
  // communicator is live, and once it retired (from the database).
  auto check_timeline = [&](const char* when) {
    SCOPED_TRACE(when);
    capnp::MallocMessageBuilder request;
    auto req = request.initRoot<query::Request>();
    req.setProtocolVersion(query::QUERY_PROTOCOL_VERSION);
    auto timeline = req.initTimeline();
    timeline.setComm(hex64(comms[0]));
    timeline.setLast(0);
    std::map<int, std::vector<StoredCall>> stored;
    int32_t nranks = 0;
    auto result = deployment.client().ask(request, [&](query::Reply::Reader reply) {
      auto t = reply.getTimeline();
      nranks = t.getNranks();
      for (auto r : t.getRecords()) {
        EXPECT_EQ(r.getLane(), 0u);
        EXPECT_EQ(r.getResult(), 0u);
        stored[r.getRank()].push_back(
            StoredCall{r.getSeq(), r.getOp(), r.getDatatype(), r.getCount(), r.getBytes(), r.getNode()});
      }
    });
    ASSERT_TRUE(result) << result.error().message;
    EXPECT_EQ(nranks, kRanks);
    ASSERT_EQ(stored.size(), static_cast<size_t>(kRanks));
    for (int rank = 0; rank < kRanks; ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      const auto& calls = stored[rank];
      ASSERT_EQ(calls.size(), made[rank].size());
      for (size_t i = 0; i < calls.size(); ++i) {
        SCOPED_TRACE("call " + std::to_string(i));
        EXPECT_EQ(calls[i].seq, i) << "sequence numbers run 0..N-1 without gaps";
        EXPECT_EQ(proto::op_name(calls[i].op), made[rank][i].op);
        EXPECT_EQ(calls[i].count, made[rank][i].count);
        EXPECT_EQ(proto::datatype_name(calls[i].datatype), made[rank][i].datatype);
        EXPECT_EQ(calls[i].bytes, made[rank][i].bytes);
        EXPECT_EQ(calls[i].bytes, calls[i].count * proto::datatype_size(calls[i].datatype));
        EXPECT_EQ(calls[i].node, deployment.node_name(rank / 2));
        if (::testing::Test::HasFailure()) return;
      }
    }
  };
  check_timeline("live");
  if (::testing::Test::HasFailure()) return;
  // Ended by every rank and quiet for --retire-after-s: no longer listed.
  ASSERT_TRUE(wait_for([&] { return deployment.min_progress() < 0; }, std::chrono::seconds(30)))
      << "the ended communicator is still live\n" << slurp(dir.file("collector.log"));
  check_timeline("retired");
}

}  // namespace
}  // namespace rankscope::testing
