#pragma once
// An opt-in action on the outside world: drain a Slurm node whose ranks keep
// straggling across jobs, so that the scheduler stops placing jobs on it
// until an operator looks (`scontrol update NodeName=N State=DRAIN
// Reason="rankscope: ..."`). One slow job can be the job's own doing; the
// same node slowing several jobs is the node's.
//
// The command runs without a shell (its arguments cannot be injected into),
// in the background, bounded in time; its outcome is logged. A dry run logs
// what it would run instead. A node is drained at most once per window.
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "collector/detect/finding.h"

namespace rankscope::collector {

struct DrainOptions {
  uint32_t after_jobs = 0;                         // 0: off; else drain a node straggling in this many jobs
  uint64_t window_ns = 24 * 3600'000'000'000ull;   // ... whose findings opened within this long
  std::string command = "scontrol";                // looked up in PATH; its environment is the collector's
  bool dry_run = false;                            // log the command instead of running it
  uint64_t timeout_ns = 30'000'000'000ull;         // a command still running after this is killed
};

class NodeDrainer {
 public:
  explicit NodeDrainer(DrainOptions options) : options_(std::move(options)) {}
  ~NodeDrainer();
  NodeDrainer(const NodeDrainer&) = delete;
  NodeDrainer& operator=(const NodeDrainer&) = delete;

  // `findings`: the collector's findings (FindingBook::all); the straggler
  // ones opened within the window count, open or resolved. Starts a drain
  // of each node past the threshold, and collects the outcome of those
  // started earlier. Call it regularly from one thread.
  void evaluate(const std::vector<const Finding*>& findings, uint64_t now_ns);

  struct Action {
    std::string node;
    std::vector<std::string> argv;  // the command as run (or as a dry run would have run it)
    bool dry_run = false;
    bool done = false;              // finished (or a dry run)
    int exit_status = -1;           // when done and run: its exit status (-1: killed or could not start)
  };
  const std::vector<Action>& actions() const { return actions_; }

 private:
  void collect(uint64_t now_ns);

  DrainOptions options_;
  std::map<std::string, uint64_t> acted_;  // node -> when a drain of it started
  struct Running {
    pid_t pid;
    size_t action;
    uint64_t started_ns;
  };
  std::vector<Running> running_;
  std::vector<Action> actions_;
};

}  // namespace rankscope::collector
