#include "node-agent/discover.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "bpf/nccl_events.h"
#include "common/log.h"
#include "node-agent/identify.h"

namespace rankscope::agent {

namespace {
constexpr unsigned kFullRescanEvery = 60;

std::string base_name(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}


std::string cgroup_v2_path(const std::string& proc_root, uint32_t pid) {
  auto content = read_file(proc_root + "/" + std::to_string(pid) + "/cgroup");
  if (!content) return {};
  std::istringstream lines(*content);
  std::string line;
  while (std::getline(lines, line))
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  return {};
}
}  // namespace

std::optional<std::string> cgroup2_mount() {
  std::ifstream mountinfo("/proc/self/mountinfo");
  std::string line;
  while (std::getline(mountinfo, line)) {
    // "... mount-point options - fstype source ..." (proc(5))
    size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream tail(line.substr(dash + 3));
    std::string fstype;
    tail >> fstype;
    if (fstype != "cgroup2") continue;
    std::istringstream head(line.substr(0, dash));
    std::string field, mount_point;
    for (int i = 0; i < 5 && head >> field; ++i)
      if (i == 4) mount_point = field;
    return mount_point;
  }
  return std::nullopt;
}

const char* library_kind_name(LibraryKind kind) {
  switch (kind) {
    case LibraryKind::nccl: return "NCCL";
    case LibraryKind::cudart: return "CUDA runtime";
    case LibraryKind::libc: return "C library";
  }
  return "?";
}

std::optional<LibraryKind> library_kind_of(const std::string& path) {
  std::string base = base_name(path);
  if (base.rfind("libnccl.so", 0) == 0) return LibraryKind::nccl;
  if (base.rfind("libcudart.so", 0) == 0) return LibraryKind::cudart;
  if (base.rfind("libc.so", 0) == 0) return LibraryKind::libc;
  return std::nullopt;
}

std::string Scope::describe() const {
  std::string out;
  if (netns_ino) out += "netns inode " + std::to_string(netns_ino) + " ";
  if (cgroup_id) out += "cgroup " + cgroup_path + " ";
  if (!pids.empty()) out += std::to_string(pids.size()) + " pid(s) ";
  return out.empty() ? "every process" : out;
}

Result<Scope> resolve_scope(const Options& options) {
  Scope scope;
  if (!options.netns.empty()) {
    struct stat st {};
    if (stat(options.netns.c_str(), &st) != 0)
      return make_error(Errc::invalid_argument,
                        "--netns " + options.netns + ": " + strerror(errno) + " (give /run/netns/NAME or /proc/PID/ns/net)");
    scope.netns_ino = static_cast<uint32_t>(st.st_ino);
  }
  if (!options.cgroup.empty()) {
    auto root = cgroup2_mount();
    if (!root) return make_error(Errc::unsupported_version, "--cgroup needs cgroup v2, and no cgroup2 mount was found");
    std::string path = options.cgroup;
    if (path.rfind(*root, 0) != 0)
      return make_error(Errc::invalid_argument, "--cgroup " + path + " is not below the cgroup v2 mount " + *root);
    struct stat st {};
    if (stat(path.c_str(), &st) != 0)
      return make_error(Errc::invalid_argument, "--cgroup " + path + ": " + strerror(errno));
    scope.cgroup_id = st.st_ino;  // a cgroup v2 id is its kernfs inode number
    scope.cgroup_path = path.substr(root->size());
    if (scope.cgroup_path.empty()) scope.cgroup_path = "/";
    for (char c : scope.cgroup_path) scope.cgroup_level += (c == '/');
    if (scope.cgroup_path == "/") scope.cgroup_level = 0;
  }
  scope.pids.insert(options.pids.begin(), options.pids.end());
  scope.shares = Scope::UserShares::of_percent(options.user_table_share);
  return scope;
}

Scope::UserShares Scope::UserShares::of_percent(uint32_t percent) {
  auto part = [&](uint64_t table) { return static_cast<uint32_t>(std::max<uint64_t>(1, table * percent / 100)); };
  return UserShares{part(RS_PROCESSES), part(RS_COMM_SLOTS), part(RS_P2P_LANES), part(RS_THREADS)};
}

bool Discovery::in_scope(const Scope& scope, uint32_t pid) const {
  std::string dir = proc_root_ + "/" + std::to_string(pid);
  if (!scope.pids.empty() && !scope.pids.count(pid)) return false;
  if (scope.netns_ino) {
    struct stat st {};
    if (stat((dir + "/ns/net").c_str(), &st) != 0 || st.st_ino != scope.netns_ino) return false;
  }
  if (scope.cgroup_id) {
    std::string path = cgroup_v2_path(proc_root_, pid);
    if (scope.cgroup_path != "/" &&
        !(path == scope.cgroup_path || path.rfind(scope.cgroup_path + "/", 0) == 0))
      return false;
  }
  return true;
}

std::optional<LibraryFile> Discovery::from_path(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return LibraryFile{path, st.st_dev, st.st_ino, library_kind_of(path).value_or(LibraryKind::nccl)};
}

std::vector<std::string> Discovery::standard_locations() {
  return {"/usr/lib/x86_64-linux-gnu/libnccl.so.2", "/usr/lib64/libnccl.so.2", "/usr/lib/libnccl.so.2",
          "/usr/local/lib/libnccl.so.2", "/usr/local/cuda/lib/libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2",
          "/usr/local/nccl/lib/libnccl.so.2", "/opt/nccl/lib/libnccl.so.2",
          "/usr/local/cuda/lib/libcudart.so.13", "/usr/local/cuda/lib64/libcudart.so.13",
          "/usr/local/cuda/lib64/libcudart.so.12", "/usr/lib/x86_64-linux-gnu/libcudart.so.12",
          "/usr/lib/x86_64-linux-gnu/libcudart.so.13", "/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6"};
}

std::vector<LibraryFile> Discovery::scan(const Scope& scope) {
  std::vector<LibraryFile> found;
  bool full = (scans_++ % kFullRescanEvery) == 0;
  DIR* proc = opendir(proc_root_.c_str());
  if (!proc) {
    RS_LOG(error, "cannot read %s: %s", proc_root_.c_str(), strerror(errno));
    return found;
  }
  std::map<uint32_t, Seen> alive;
  while (dirent* entry = readdir(proc)) {
    char* end = nullptr;
    unsigned long pid = strtoul(entry->d_name, &end, 10);
    if (!end || *end != '\0' || pid == 0) continue;
    auto seen = seen_pids_.find(pid);
    // Known, and readdir gives the same inode: the same process (procfs
    // makes a new inode for a new process). Its start time is not read
    // again: that open, read and close of /proc/PID/stat for every process
    // twice a second was half of an idle agent's CPU.
    if (!full && seen != seen_pids_.end() && entry->d_ino != 0 && seen->second.ino == entry->d_ino) {
      alive[pid] = seen->second;
      continue;
    }
    auto start = read_start_time(proc_root_, static_cast<uint32_t>(pid));
    if (!start) continue;
    alive[pid] = Seen{*start, entry->d_ino};
    if (!full && seen != seen_pids_.end() && seen->second.start_time == *start) continue;
    if (!in_scope(scope, static_cast<uint32_t>(pid))) continue;
    std::string dir = proc_root_ + "/" + std::to_string(pid);
    std::ifstream maps(dir + "/maps");
    std::string line;
    while (std::getline(maps, line)) {
      size_t slash = line.find('/');
      if (slash == std::string::npos) continue;
      std::string path = line.substr(slash);
      auto kind = library_kind_of(path);
      if (!kind || path.find(" (deleted)") != std::string::npos) continue;
      // Open through the process's root so libraries in containers resolve.
      auto library = from_path(dir + "/root" + path);
      if (library) library->kind = *kind;
      if (!library || known_.count(*library)) continue;
      known_.insert(*library);
      found.push_back(*library);
      RS_LOG(info, "found %s in process %lu", path.c_str(), pid);
    }
  }
  closedir(proc);
  seen_pids_ = std::move(alive);
  return found;
}

}  // namespace rankscope::agent
