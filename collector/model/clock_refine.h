#pragma once
// Refines the nodes' clock offsets with the collectives themselves.
//
// Probes bound a node's offset within half their round trip but cannot see
// an asymmetric path (a slow direction looks like an offset). Collectives
// can: the ranks of a blocking collective leave it at nearly the same true
// time. The leaving is seen as the end of the host wait that follows it
// (cudaStreamSynchronize after the step's last collective): for each
// collective whose every rank reported such a wait, each node's residual is
// the median over its ranks of (wait end - median wait end of all ranks).
// The median of a node's recent residuals, anchored so the nodes' mean stays
// where the probes put it, and bounded by the probes' uncertainty, becomes
// that node's refinement. Also checked: no rank leaves a collective before
// the last rank arrived (a violation means a clock error at least that big).
//
// The collectives come from the matcher (each rank's issue, and each
// completed instance's last arrival); the waits from the ingest. The
// refiner only reads the model: update() says what to change, and the
// model's owner applies it (ClusterModel::adjust_clocks).
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "collector/match/matcher.h"
#include "collector/model/cluster.h"

namespace rankscope::collector {

class ClockRefiner final : public MatchListener, public RecordObserver {
 public:
  explicit ClockRefiner(const ClusterModel& model) : model_(model) {}

  // MatchListener: each rank's collectives, and each instance's last arrival.
  void on_issue(const CommState& comm, int32_t rank, uint32_t lane, uint64_t seq, uint64_t issue_ns) override;
  void on_complete(const CollectiveComplete& done) override;
  // RecordObserver: the host waits that follow them.
  void on_wait(const std::string& node, uint32_t pid, uint64_t start_ns, uint64_t end_ns) override;
  // Each node's refinement recomputed, and the violations seen since the
  // last update: for ClusterModel::adjust_clocks.
  ClockAdjustments update();

 private:
  static constexpr size_t kIssueHistory = 64;  // recent (seq, issue) per rank, and last arrivals per communicator
  static constexpr size_t kResiduals = 64;     // residuals kept per node
  static constexpr size_t kMinResiduals = 8;
  static constexpr size_t kOpenGroups = 256;  // collectives waiting for the rest of their wait ends

  struct RankIssues {
    std::deque<std::pair<uint64_t, uint64_t>> issues;  // (seq, issue ns), ascending seq
    uint32_t pid = 0;                                  // the process last seen as this rank (in members_of_)
  };
  struct Group {
    std::map<int32_t, uint64_t> ends;  // rank -> wait end
  };
  struct CommTrack {
    std::map<int32_t, RankIssues> ranks;
    std::map<uint64_t, Group> groups;         // by the seq the waits follow
    std::map<uint64_t, uint64_t> last_arrival;  // seq -> its last rank's issue (completed instances)
  };

  void complete(const CommState& comm, CommTrack& track, uint64_t seq, const Group& group);
  void forget_retired();
  int64_t applied(const std::string& node) const;

  const ClusterModel& model_;
  std::map<uint64_t, CommTrack> comms_;
  // (node, pid) -> the (comm, rank) it is, learnt from its records: a wait
  // finds its collectives without scanning every member of every comm.
  std::map<std::pair<std::string, uint32_t>, std::vector<std::pair<uint64_t, int32_t>>> members_of_;
  std::map<std::string, std::deque<int64_t>> residuals_;  // per node, on the probes' clocks
  std::map<std::string, uint64_t> violations_;           // since the last update
};

}  // namespace rankscope::collector
