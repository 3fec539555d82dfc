#pragma once
// Finding what to trace: the processes in this agent's scope and the libnccl
// files they map, each file once (by device and inode), wherever it lives.
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/result.h"
#include "node-agent/options.h"

namespace rankscope::agent {

struct Scope {
  uint32_t netns_ino = 0;      // 0: any network namespace
  uint64_t cgroup_id = 0;      // 0: any cgroup
  uint32_t cgroup_level = 0;   // depth of cgroup_id below the cgroup v2 root
  std::string cgroup_path;     // as in /proc/PID/cgroup ("/a/b")
  std::set<uint32_t> pids;     // empty: any process
  // What each user's processes may hold of the BPF tables every traced
  // process shares (bpf/nccl.bpf.c, user_shares): entries of each table.
  struct UserShares {
    uint32_t processes = 0, comms = 0, lanes = 0, threads = 0;
    // `percent` of each table (--user-table-share).
    static UserShares of_percent(uint32_t percent);
  };
  UserShares shares = UserShares::of_percent(kDefaultUserTableShare);
  std::string describe() const;
};

// Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or
// /sys/fs/cgroup/unified on hybrid hosts); nullopt if it is not.
std::optional<std::string> cgroup2_mount();

// Turns the scope options into kernel identifiers (namespace inode, cgroup id).
Result<Scope> resolve_scope(const Options& options);

// The libraries the agent probes: NCCL's API, the CUDA runtime's waits and
// cudaSetDevice, libc's setenv (CUDA_VISIBLE_DEVICES changed at run time).
enum class LibraryKind { nccl, cudart, libc };
const char* library_kind_name(LibraryKind kind);
// The kind of a library from its file name; nullopt if rankscope does not probe it.
std::optional<LibraryKind> library_kind_of(const std::string& path);

struct LibraryFile {
  std::string path;  // a path this agent can open (through /proc/PID/root for other mount namespaces)
  dev_t dev = 0;
  ino_t ino = 0;
  LibraryKind kind = LibraryKind::nccl;
  bool operator<(const LibraryFile& other) const { return dev != other.dev ? dev < other.dev : ino < other.ino; }
};

class Discovery {
 public:
  explicit Discovery(std::string proc_root) : proc_root_(std::move(proc_root)) {}

  // Is the process inside the scope? False if it is gone.
  bool in_scope(const Scope& scope, uint32_t pid) const;
  // libnccl, libcudart and libc files mapped by processes in scope that were not reported before.
  // Reads the maps of processes not seen before; all of them every `full_every` calls.
  std::vector<LibraryFile> scan(const Scope& scope);
  // A library file given by path (standard locations, --nccl-lib); nullopt if missing.
  // Its kind comes from its file name (libcudart.so*, libc.so*, or else NCCL).
  static std::optional<LibraryFile> from_path(const std::string& path);
  // Marks a library as known so that scan() does not report it again.
  void remember(const LibraryFile& library) { known_.insert(library); }
  bool known(const LibraryFile& library) const { return known_.count(library) > 0; }
  // The NCCL and CUDA runtime libraries in the places distributions and NVIDIA
  // install them, and the host's C library.
  static std::vector<std::string> standard_locations();

 private:
  std::string proc_root_;
  std::set<LibraryFile> known_;
  struct Seen {
    uint64_t start_time;  // tells a reused pid
    ino_t ino;            // of /proc/PID as readdir gave it: a new process gets a new one
  };
  std::map<uint32_t, Seen> seen_pids_;  // processes whose maps were already read
  unsigned scans_ = 0;
};

}  // namespace rankscope::agent
