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
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "collector/match/matcher.h"
#include "collector/model/cluster.h"

namespace rankscope::collector {

class ClockRefiner final : public MatchListener, public RecordObserver {
 public:
  explicit ClockRefiner(const ClusterModel& model) : model_(model) {}

  // MatchListener: each rank's collectives, and each instance's last arrival.
  void on_issues(const CommState& comm, int32_t rank, uint32_t lane, std::span<const Issue> issues) override;
  void on_complete(const CollectiveComplete& done) override;
  // RecordObserver: the host waits that follow them.
  void on_waits(const std::string& node, uint32_t pid, std::span<const HostWait> waits) override;
  // Each node's refinement recomputed, and the violations seen since the
  // last update: for ClusterModel::adjust_clocks.
  ClockAdjustments update();

 private:
  static constexpr size_t kIssueHistory = 64;  // recent (seq, issue) per rank, and last arrivals per communicator
  static constexpr size_t kResiduals = 64;     // residuals kept per node
  static constexpr size_t kMinResiduals = 8;
  static constexpr size_t kOpenGroups = 256;  // collectives waiting for the rest of their wait ends

  // The latest (seq, ns) pairs, oldest first, at most kIssueHistory: a
  // fixed ring, so that the per-record path allocates nothing.
  class Recent {
   public:
    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    const std::pair<uint64_t, uint64_t>& operator[](size_t i) const { return at_[(first_ + i) % kIssueHistory]; }
    const std::pair<uint64_t, uint64_t>& back() const { return (*this)[size_ - 1]; }
    void push(uint64_t seq, uint64_t ns);

   private:
    std::array<std::pair<uint64_t, uint64_t>, kIssueHistory> at_{};
    size_t first_ = 0, size_ = 0;
  };
  struct RankIssues {
    Recent issues;     // (seq, issue ns), ascending seq
    uint32_t pid = 0;  // the process last seen as this rank (in members_of_)
    // The collective whose group this rank's wait ends last joined: only
    // the first wait after a collective counts.
    std::optional<uint64_t> joined;
  };
  struct Group {
    std::vector<std::pair<int32_t, uint64_t>> ends;  // (rank, wait end), each rank once
  };
  struct CommTrack {
    // By rank, made for the ranks seen: a communicator announced with many
    // ranks and few of them seen keeps a pointer for each of the others.
    std::vector<std::unique_ptr<RankIssues>> ranks;
    std::map<uint64_t, Group> groups;  // by the seq the waits follow
    Recent last_arrival;               // (seq, its last rank's issue) of completed instances, as they completed
  };
  // (node, pid), looked up by a view of the node's name: no string made per wait.
  struct ProcessHash {
    using is_transparent = void;
    size_t operator()(const std::pair<std::string_view, uint32_t>& key) const {
      return std::hash<std::string_view>()(key.first) * 31 + key.second;
    }
    size_t operator()(const std::pair<std::string, uint32_t>& key) const {
      return (*this)(std::pair<std::string_view, uint32_t>(key.first, key.second));
    }
  };
  struct ProcessEqual {
    using is_transparent = void;
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return a.second == b.second && std::string_view(a.first) == std::string_view(b.first);
    }
  };

  void complete(const CommState& comm, CommTrack& track, uint64_t seq, const Group& group);
  void forget_retired();
  int64_t applied(const std::string& node) const;

  const ClusterModel& model_;
  std::unordered_map<uint64_t, CommTrack> comms_;
  // (node, pid) -> the (comm, rank) it is, learnt from its records: a wait
  // finds its collectives without scanning every member of every comm.
  std::unordered_map<std::pair<std::string, uint32_t>, std::vector<std::pair<uint64_t, int32_t>>, ProcessHash,
                     ProcessEqual>
      members_of_;
  std::map<std::string, std::deque<int64_t>, std::less<>> residuals_;  // per node, on the probes' clocks
  std::map<std::string, uint64_t> violations_;                         // since the last update
  // complete()'s scratch: (node, raw wait end) of a group's ranks, and one node's.
  std::vector<std::pair<const std::string*, int64_t>> scratch_ends_;
  std::vector<int64_t> scratch_raw_, scratch_node_;
};

}  // namespace rankscope::collector
