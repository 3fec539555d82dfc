// The opt-in drain action against a real Slurm (Debian's slurmctld, slurmd
// and munged, started by the test: tests/support/slurm.h): a node named in
// straggler findings of two jobs is drained with the real scontrol, Slurm
// itself then reports it drained with rankscope's reason; a node of one job,
// findings past the window and a dry run leave it alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>

#include "collector/alert/drain.h"
#include "tests/support/harness.h"
#include "tests/support/slurm.h"

namespace rankscope::collector {
namespace {

constexpr uint64_t kHour = 3600'000'000'000ull;

Finding straggler(uint64_t id, const std::string& job, const std::string& node, uint64_t opened_ns) {
  Finding f;
  f.id = id;
  f.kind = FindingKind::straggler;
  f.job = job;
  f.nodes = {node};
  f.ranks = {3};
  f.opened_ns = opened_ns;
  return f;
}

std::vector<const Finding*> pointers(const std::vector<Finding>& findings) {
  std::vector<const Finding*> out;
  for (const Finding& f : findings) out.push_back(&f);
  return out;
}

// A real single-node Slurm that the drainer's scontrol reaches, as it would
// from the collector host: through the cluster's configuration.
class Drain : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "slurmd and cgroups need root: run the suite as root";
    std::string missing = testing::RealSlurm::missing_programs();
    if (!missing.empty())
      GTEST_SKIP() << "Slurm is not installed (" << missing << "): scripts/install-deps.sh test installs slurm-wlm and munge";
    slurm = std::make_unique<testing::RealSlurm>();
    ASSERT_TRUE(slurm->ok()) << slurm->error();
    setenv("SLURM_CONF", slurm->conf().c_str(), 1);
  }
  // The node's state and reason, as sinfo reports them.
  std::string state() {
    std::string out;
    slurm->run("sinfo -h -N -n " + slurm->node() + " -o '%T|%E'", &out, 10);
    return out.substr(0, out.find('\n'));
  }
  std::unique_ptr<testing::RealSlurm> slurm;
};

TEST_F(Drain, ANodeStragglingInTwoJobsIsDrainedInSlurmAndOnlyThat) {
  ASSERT_EQ(state(), "idle|none");

  const uint64_t now = 1'800'000'000'000'000'000ull;
  const std::string node = slurm->node();
  std::vector<Finding> findings = {
      straggler(7, "4101", node, now - 2 * kHour),
      straggler(8, "4101", node, now - kHour),       // the same job again: still one
      straggler(9, "4102", "other-node", now - kHour),
      straggler(3, "3999", node, now - 30 * kHour),  // past the window
  };

  // One job on the node: nothing.
  NodeDrainer drainer(DrainOptions{2, 24 * kHour, "scontrol", false});
  drainer.evaluate(pointers(findings), now);
  EXPECT_TRUE(drainer.actions().empty());

  // A dry run of two jobs: said, not done.
  findings.push_back(straggler(10, "4102", node, now - kHour / 2));
  NodeDrainer dry(DrainOptions{2, 24 * kHour, "scontrol", true});
  dry.evaluate(pointers(findings), now);
  ASSERT_EQ(dry.actions().size(), 1u);
  EXPECT_TRUE(dry.actions()[0].dry_run);
  EXPECT_EQ(dry.actions()[0].argv.back(), "Reason=rankscope: straggler in 2 jobs (4101, 4102; findings #7, #10)");
  ASSERT_EQ(state(), "idle|none");

  // For real: Slurm drains it, with the reason.
  drainer.evaluate(pointers(findings), now);
  ASSERT_EQ(drainer.actions().size(), 1u);
  EXPECT_EQ(drainer.actions()[0].node, node);
  ASSERT_TRUE(testing::wait_for(
      [&] {
        drainer.evaluate(pointers(findings), now + 1);
        return drainer.actions()[0].done;
      },
      std::chrono::seconds(30)));
  EXPECT_EQ(drainer.actions()[0].exit_status, 0) << slurm->logs();
  EXPECT_EQ(state(), "drained|rankscope: straggler in 2 jobs (4101, 4102; findings #7, #10)") << slurm->logs();
  // Once per window.
  drainer.evaluate(pointers(findings), now + kHour);
  EXPECT_EQ(drainer.actions().size(), 1u);
}

// A node Slurm does not know (an agent named otherwise than slurmd): the
// failure is reported, nothing else happens.
TEST_F(Drain, ANodeSlurmDoesNotKnowIsAFailureSaid) {
  const uint64_t now = 1'800'000'000'000'000'000ull;
  std::vector<Finding> findings = {straggler(1, "1", "no-such-node", now), straggler(2, "2", "no-such-node", now)};
  NodeDrainer drainer(DrainOptions{2, 24 * kHour, "scontrol", false});
  drainer.evaluate(pointers(findings), now);
  ASSERT_EQ(drainer.actions().size(), 1u);
  ASSERT_TRUE(testing::wait_for(
      [&] {
        drainer.evaluate(pointers(findings), now);
        return drainer.actions()[0].done;
      },
      std::chrono::seconds(30)));
  EXPECT_NE(drainer.actions()[0].exit_status, 0);

  NodeDrainer missing_command(DrainOptions{2, 24 * kHour, "/nonexistent/scontrol", false});
  missing_command.evaluate(pointers(findings), now);
  ASSERT_EQ(missing_command.actions().size(), 1u);
  EXPECT_TRUE(missing_command.actions()[0].done);
  EXPECT_EQ(missing_command.actions()[0].exit_status, -1);
}

}  // namespace
}  // namespace rankscope::collector
