#pragma once
// What the integration tests share: child processes, temporary folders,
// network namespaces as simulated nodes, and waiting for a condition with a
// deadline (never a bare sleep). Everything cleans up in its destructor, so
// a failing test leaves nothing behind.
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace rankscope::testing {

// Polls `condition` every few milliseconds until it holds or `timeout` passes.
bool wait_for(const std::function<bool()>& condition, std::chrono::milliseconds timeout);

// Waits out an observation window: for checking that something does *not*
// happen (no second finding, no finding at all) in a given time.
void observe_for(std::chrono::milliseconds window);

// A unique name for this run: prefix + pid + counter (names of namespaces, ports...).
std::string unique_name(const std::string& prefix);

class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct SpawnOptions {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;  // added to (or replacing in) this process's environment
  std::string netns;                       // run inside `ip netns exec NAME`
  std::string stdout_path;                 // default: /dev/null
  std::string stderr_path;                 // default: same as stdout
};

class Process {
 public:
  explicit Process(const SpawnOptions& options);
  ~Process();  // SIGKILLs the process and its process group (what it forked)
  Process(Process&&) noexcept;
  Process(const Process&) = delete;

  pid_t pid() const { return pid_; }
  // The pid of the program itself when it runs under `ip netns exec` (which execs it, so they are the same).
  bool running();
  void signal(int sig);
  // Waits for exit; returns the exit code, 128+signal if killed, -1 on timeout.
  int wait(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  bool reaped_ = false;
};

// The live processes' pid numbers as unique_name writes them (pid % 100000).
std::set<long> live_pid_numbers();

// Removes the simulated nodes of earlier test processes killed before their
// NetnsCluster was destroyed (a run stopped by a timeout or by hand): the
// namespaces named as unique_name names them, "rst<pid % 100000>x<n>-...",
// where no live process has that pid number. Each NetnsCluster does it
// before making its own. Returns how many clusters it removed.
int remove_stale_netns_clusters();

// Simulated nodes: network namespaces on one bridge, made and removed by
// scripts/netns-cluster.sh (node i has address 10.213.0.(i+1)).
class NetnsCluster {
 public:
  explicit NetnsCluster(int nodes);
  ~NetnsCluster();
  bool ok() const { return ok_; }
  std::string name(int node) const { return prefix_ + "-" + std::to_string(node); }
  std::string path(int node) const { return "/run/netns/" + name(node); }
  std::string address(int node) const { return "10.213.0." + std::to_string(node + 1); }
  // The namespace holding the bridge; node i's port on it is `p<i>` (down: node i is cut off).
  std::string switch_name() const { return prefix_ + "-sw"; }

 private:
  std::string prefix_;
  bool ok_ = false;
};

// The cgroup v2 hierarchy of this machine (hybrid: /sys/fs/cgroup/unified).
std::string cgroup2_root();

// The cgroup v1 cpu controller, or cgroup v2 where its cpu controller is on.
struct CpuController {
  std::string root;
  bool v2 = false;
};
std::optional<CpuController> cpu_controller();
// Holds cgroup `group` (a directory under the controller's root) to `cpus`
// of a core: cpu.max on v2, cpu.cfs_quota_us over a 100 ms period on v1.
void set_cpu_quota(const CpuController& controller, const std::string& group, double cpus);

// A cgroup v2 directory tree made by a test, removed leaf first by the
// destructor (after moving out any process still inside).
class CgroupTree {
 public:
  explicit CgroupTree(std::string root = cgroup2_root()) : root_(std::move(root)) {}
  ~CgroupTree();
  CgroupTree(const CgroupTree&) = delete;
  // Makes every missing directory of `relative` below the root; returns the full path.
  std::string make(const std::string& relative);

 private:
  std::string root_;
  std::vector<std::string> made_;
};

// Runs a shell command; returns its exit status.
int run_command(const std::string& command);
// Absolute path of a program built into build/bin.
std::string bin_path(const std::string& name);
// A TCP port free on 127.0.0.1 at the time of the call, drawn at random
// below the kernel's ephemeral range (which outgoing connections take from).
int free_port();
// The content of a file, or "" if it cannot be read.
std::string slurp(const std::string& path);

}  // namespace rankscope::testing
