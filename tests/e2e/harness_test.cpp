// The harness's own cleanup: a test process killed before its simulated
// nodes were removed (a run stopped by a timeout or by hand) leaves their
// network namespaces behind; the next cluster a test makes removes them,
// and leaves those of a live test process alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>

#include "tests/support/harness.h"

namespace rankscope::testing {
namespace {

bool netns_exists(const std::string& name) { return std::filesystem::exists("/run/netns/" + name); }

TEST(NetnsHarness, TheNodesOfAKilledTestProcessAreRemovedByTheNextCluster) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root: run the suite as root";
  NetnsCluster mine(1);  // a live process's cluster: ours
  ASSERT_TRUE(mine.ok());
  // A process number no live process has, as a killed test process's
  // would be (unique_name: "rst<pid % 100000>x<n>").
  const std::set<long> live = live_pid_numbers();
  long gone = (getpid() % 100000 + 50000) % 100000;
  while (live.count(gone)) gone = (gone + 1) % 100000;
  const std::string prefix = "rst" + std::to_string(gone) + "x0";
  ASSERT_EQ(run_command("ip netns add " + prefix + "-sw && ip netns add " + prefix + "-0"), 0);
  ASSERT_TRUE(netns_exists(prefix + "-sw"));

  NetnsCluster next(1);
  EXPECT_TRUE(next.ok());
  EXPECT_FALSE(netns_exists(prefix + "-sw")) << "the killed process's switch is left";
  EXPECT_FALSE(netns_exists(prefix + "-0")) << "the killed process's node is left";
  EXPECT_TRUE(netns_exists(mine.switch_name())) << "a live process's cluster was removed";
  EXPECT_TRUE(netns_exists(mine.name(0)));
  // Whatever the assertions said: nothing of ours is left.
  run_command("ip netns del " + prefix + "-sw 2>/dev/null; ip netns del " + prefix + "-0 2>/dev/null");
}

}  // namespace
}  // namespace rankscope::testing
