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
// where the probes put it, and bounded by the probes' uncertainty, is added
// to that node's offset. Also checked: no rank leaves a collective before
// the last rank arrived (a violation means a clock error at least that big).
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "collector/ingest/ingest.h"

namespace rankscope::collector {

class ClockRefiner final : public RecordObserver {
 public:
  explicit ClockRefiner(Ingest& ingest) : ingest_(ingest) {}

  void on_record(const CommState& comm, int32_t rank, uint32_t lane, const proto::CallRecord& record) override;
  void on_wait(const std::string& node, uint32_t pid, uint64_t start_ns, uint64_t end_ns) override;
  // Recomputes each node's refinement and applies it to its clock
  // (NodeClock::set_refinement; read back with refinement_ns()).
  void update();

 private:
  static constexpr size_t kIssueHistory = 64;  // recent (seq, issue) per rank
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
    std::map<uint64_t, Group> groups;  // by the seq the waits follow
  };

  void complete(const CommState& comm, CommTrack& track, uint64_t seq, const Group& group);
  void forget_retired();
  int64_t applied(const std::string& node) const;

  Ingest& ingest_;
  std::map<uint64_t, CommTrack> comms_;
  // (node, pid) -> the (comm, rank) it is, learnt from its records: a wait
  // finds its collectives without scanning every member of every comm.
  std::map<std::pair<std::string, uint32_t>, std::vector<std::pair<uint64_t, int32_t>>> members_of_;
  std::map<std::string, std::deque<int64_t>> residuals_;  // per node, on the probes' clocks
};

}  // namespace rankscope::collector
