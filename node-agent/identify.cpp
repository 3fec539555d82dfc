#include "node-agent/identify.h"

#include <fcntl.h>
#include <linux/nsfs.h>
#include <pwd.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/log.h"
#include "proto/limits.h"

namespace rankscope::agent {

namespace {
std::optional<int32_t> to_int(const std::string& text) {
  int32_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// The first of `keys` set; a value past proto::kMaxIdentityText is taken as
// not set (never cut: a cut job id could name another job).
const std::string* first_of(const std::map<std::string, std::string>& env, std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    auto it = env.find(key);
    if (it != env.end() && !it->second.empty() && it->second.size() <= proto::kMaxIdentityText) return &it->second;
  }
  return nullptr;
}

void set_int(const std::map<std::string, std::string>& env, std::initializer_list<const char*> keys, int32_t& out) {
  for (const char* key : keys) {
    auto it = env.find(key);
    if (it == env.end()) continue;
    if (auto v = to_int(it->second)) {
      out = *v;
      return;
    }
  }
}
}  // namespace

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::map<std::string, std::string> parse_environ(const std::string& raw) {
  std::map<std::string, std::string> env;
  size_t start = 0;
  while (start < raw.size()) {
    size_t end = raw.find('\0', start);
    if (end == std::string::npos) end = raw.size();
    std::string entry = raw.substr(start, end - start);
    size_t eq = entry.find('=');
    if (eq != std::string::npos && eq > 0) env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
    start = end + 1;
  }
  return env;
}

void apply_environment(const std::map<std::string, std::string>& env, ProcessIdentity& identity) {
  for (const char* name : {"SLURM_JOB_ID", "RANKSCOPE_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_STEP_ID", "SLURM_STEPID",
                           "CUDA_VISIBLE_DEVICES", "POD_NAMESPACE", "MY_POD_NAMESPACE", "POD_NAME", "MY_POD_NAME"})
    if (auto it = env.find(name); it != env.end() && it->second.size() > proto::kMaxIdentityText)
      RS_LOG(warn, "process %u: %s is %zu bytes (at most %llu are taken): taken as not set", identity.pid, name,
             it->second.size(), static_cast<unsigned long long>(proto::kMaxIdentityText));
  set_int(env, {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}, identity.rank);
  set_int(env, {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"}, identity.local_rank);
  set_int(env, {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}, identity.world_size);
  if (auto* job = first_of(env, {"SLURM_JOB_ID", "RANKSCOPE_JOB_ID", "TORCHELASTIC_RUN_ID"})) identity.job = *job;
  // srun sets both names for a task; a batch script has neither (its cgroup says step_batch).
  if (auto* step = first_of(env, {"SLURM_STEP_ID", "SLURM_STEPID"})) identity.slurm_step = *step;
  // SLURM_JOB_ACCOUNT is not read: the account is Slurm's record of the job
  // (read_slurm_account). SLURM_JOB_USER is not read: the user is the process's kernel uid
  // (read_identity), which no one can set in their own environment.
  if (auto* devices = first_of(env, {"CUDA_VISIBLE_DEVICES"})) identity.visible_devices = *devices;
  // The downward API's usual names (the pod spec maps metadata.namespace
  // and metadata.name to them).
  if (auto* ns = first_of(env, {"POD_NAMESPACE", "MY_POD_NAMESPACE"})) identity.pod_namespace = *ns;
  if (auto* name = first_of(env, {"POD_NAME", "MY_POD_NAME"})) identity.pod_name = *name;
}

std::optional<uint64_t> read_start_time(const std::string& proc_root, uint32_t pid) {
  auto stat = read_file(proc_root + "/" + std::to_string(pid) + "/stat");
  if (!stat) return std::nullopt;
  // The command name (field 2) may hold spaces and parentheses: fields are
  // counted from the last ')'. See proc(5).
  size_t close = stat->rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(stat->substr(close + 2));
  std::string field;
  // After ')' come fields 3..; starttime is field 22, the 20th of these.
  for (int i = 3; i <= 22; ++i) {
    if (!(fields >> field)) return std::nullopt;
  }
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (ec != std::errc()) return std::nullopt;
  return value;
}

namespace {
bool is_hex(const std::string& text) {
  return !text.empty() && text.find_first_not_of("0123456789abcdef") == std::string::npos;
}
}  // namespace

namespace {
// A JSON string starting at json[at] == '"': its value, with escapes
// undone (\uXXXX as UTF-8, surrogate pairs joined); `at` ends past it.
std::optional<std::string> json_string(std::string_view json, size_t& at) {
  std::string out;
  ++at;
  while (at < json.size()) {
    char c = json[at++];
    if (c == '"') return out;
    if (static_cast<unsigned char>(c) < 0x20) return std::nullopt;
    if (c != '\\') {
      out.push_back(c);
      continue;
    }
    if (at >= json.size()) return std::nullopt;
    char e = json[at++];
    switch (e) {
      case '"': case '\\': case '/': out.push_back(e); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'u': {
        auto hex4 = [&](uint32_t& v) {
          if (at + 4 > json.size()) return false;
          v = 0;
          for (int i = 0; i < 4; ++i) {
            char h = json[at++];
            v <<= 4;
            if (h >= '0' && h <= '9') v |= static_cast<uint32_t>(h - '0');
            else if (h >= 'a' && h <= 'f') v |= static_cast<uint32_t>(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') v |= static_cast<uint32_t>(h - 'A' + 10);
            else return false;
          }
          return true;
        };
        uint32_t cp = 0;
        if (!hex4(cp)) return std::nullopt;
        if (cp >= 0xD800 && cp < 0xDC00 && at + 1 < json.size() && json[at] == '\\' && json[at + 1] == 'u') {
          at += 2;
          uint32_t low = 0;
          if (!hex4(low) || low < 0xDC00 || low >= 0xE000) return std::nullopt;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        }
        if (cp < 0x80) {
          out.push_back(static_cast<char>(cp));
        } else if (cp < 0x800) {
          out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
          out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        } else if (cp < 0x10000) {
          out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
          out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
          out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        } else {
          out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
          out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
          out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
          out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        }
        break;
      }
      default: return std::nullopt;
    }
  }
  return std::nullopt;
}
}  // namespace

std::map<std::string, std::string> json_string_values(std::string_view json, const std::vector<std::string>& keys) {
  // Token by token: a string is a key when a ':' follows it, and its value
  // counts when the next token is a string too. Strings are read whole, so
  // a key's text inside another string's value is never taken for it.
  std::map<std::string, std::string> out;
  size_t at = 0;
  auto skip_space = [&] {
    while (at < json.size() && (json[at] == ' ' || json[at] == '\n' || json[at] == '\r' || json[at] == '\t')) ++at;
  };
  while (at < json.size()) {
    skip_space();
    if (at >= json.size()) break;
    if (json[at] != '"') {
      ++at;  // structure, numbers, literals
      continue;
    }
    auto key = json_string(json, at);
    if (!key) break;
    skip_space();
    if (at >= json.size() || json[at] != ':') continue;
    ++at;
    skip_space();
    if (at >= json.size() || json[at] != '"') continue;
    auto value = json_string(json, at);
    if (!value) break;
    if (std::find(keys.begin(), keys.end(), *key) != keys.end() && !out.count(*key)) out[*key] = std::move(*value);
  }
  return out;
}

PodNames read_pod_names(const std::string& state_root, const std::string& container_id) {
  PodNames names;
  // An id is hex: nothing in it can step out of the runtime's folder.
  if (container_id.empty() || container_id.size() > 128 || !is_hex(container_id)) return names;
  std::string root = state_root.empty() || state_root.back() != '/' ? state_root + "/" : state_root;
  struct Place {
    std::string path;
    const char* ns_key;
    const char* name_key;
  };
  const Place places[] = {
      {root + "run/containerd/io.containerd.runtime.v2.task/k8s.io/" + container_id + "/config.json",
       "io.kubernetes.cri.sandbox-namespace", "io.kubernetes.cri.sandbox-name"},
      {root + "run/containers/storage/overlay-containers/" + container_id + "/userdata/config.json",
       "io.kubernetes.pod.namespace", "io.kubernetes.pod.name"},
      {root + "var/lib/docker/containers/" + container_id + "/config.v2.json", "io.kubernetes.pod.namespace",
       "io.kubernetes.pod.name"},
  };
  for (const Place& place : places) {
    auto text = read_file(place.path);
    if (!text) continue;
    auto values = json_string_values(*text, {place.ns_key, place.name_key});
    if (values.count(place.ns_key)) names.pod_namespace = values[place.ns_key];
    if (values.count(place.name_key)) names.pod_name = values[place.name_key];
    if (!names.pod_namespace.empty()) break;
  }
  return names;
}

std::optional<ProcessSample> read_sample(const std::string& proc_root, uint32_t pid) {
  std::string dir = proc_root + "/" + std::to_string(pid);
  auto stat = read_file(dir + "/stat");
  if (!stat) return std::nullopt;
  size_t close = stat->rfind(')');
  if (close == std::string::npos || close + 2 >= stat->size()) return std::nullopt;
  ProcessSample sample;
  sample.state = (*stat)[close + 2];
  // Fields 14 and 15 (utime, stime) in clock ticks; the 11th and 12th after the state.
  {
    std::istringstream fields(stat->substr(close + 2));
    std::string field;
    uint64_t utime = 0, stime = 0;
    for (int i = 3; i <= 15 && fields >> field; ++i) {
      if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
      if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
    }
    long ticks = sysconf(_SC_CLK_TCK);
    if (ticks > 0) sample.process_cpu_ns = (utime + stime) * (1'000'000'000ull / static_cast<uint64_t>(ticks));
  }
  // schedstat: "<on-cpu ns> <run-queue wait ns> <timeslices>" (Documentation/scheduler/sched-stats.rst)
  if (auto schedstat = read_file(dir + "/schedstat")) {
    std::istringstream fields(*schedstat);
    fields >> sample.cpu_ns >> sample.runqueue_ns;
  }
  return sample;
}

CgroupMounts read_cgroup_mounts(const std::string& mountinfo_path) {
  // "36 35 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,... shared:14 - cgroup cgroup rw,cpu,cpuacct"
  CgroupMounts mounts;
  auto text = read_file(mountinfo_path);
  if (!text) return mounts;
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line)) {
    size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream before(line.substr(0, dash)), after(line.substr(dash + 3));
    std::string id, parent, devices, root, point, type, source, options;
    if (!(before >> id >> parent >> devices >> root >> point) || !(after >> type >> source >> options)) continue;
    if (root != "/") continue;  // a bind mount of a subtree: not the hierarchy's root
    if (type == "cgroup2" && mounts.unified.empty()) mounts.unified = point;
    if (type != "cgroup" || !mounts.cpu_v1.empty()) continue;
    std::istringstream list(options);
    std::string option;
    while (std::getline(list, option, ','))
      if (option == "cpu") mounts.cpu_v1 = point;
  }
  return mounts;
}

std::optional<CpuThrottling> read_cpu_throttling(const std::string& proc_root, uint32_t pid, const CgroupMounts& mounts) {
  auto cgroups = read_file(proc_root + "/" + std::to_string(pid) + "/cgroup");
  if (!cgroups) return std::nullopt;
  // The v1 cpu hierarchy's line ("4:cpu,cpuacct:/path"), else v2's ("0::/path").
  std::string dir;
  bool v2 = false;
  std::istringstream lines(*cgroups);
  std::string line;
  while (std::getline(lines, line)) {
    size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    std::string controllers = line.substr(first + 1, second - first - 1), path = line.substr(second + 1);
    if (path.find("..") != std::string::npos) continue;
    if (controllers.empty() && line.rfind("0::", 0) == 0) {
      if (dir.empty() && !mounts.unified.empty()) dir = mounts.unified + path, v2 = true;
      continue;
    }
    std::istringstream list(controllers);
    std::string controller;
    while (std::getline(list, controller, ','))
      if (controller == "cpu" && !mounts.cpu_v1.empty()) dir = mounts.cpu_v1 + path, v2 = false;
  }
  if (dir.empty()) return std::nullopt;
  auto stat = read_file(dir + "/cpu.stat");
  if (!stat) return std::nullopt;
  CpuThrottling out;
  std::istringstream fields(*stat);
  std::string key;
  uint64_t value = 0;
  while (fields >> key >> value) {
    if (key == "nr_periods") out.periods = value;
    else if (key == "nr_throttled") out.throttled_periods = value;
    else if (key == "throttled_time") out.throttled_ns = value;        // v1: ns
    else if (key == "throttled_usec") out.throttled_ns = value * 1000;  // v2: us
  }
  int64_t quota = -1, period = 0;
  if (v2) {
    // cpu.max: "max 100000" or "15000 100000" (us)
    if (auto max = read_file(dir + "/cpu.max")) {
      std::istringstream words(*max);
      std::string q;
      words >> q >> period;
      if (q != "max") quota = std::strtoll(q.c_str(), nullptr, 10);
    }
  } else {
    if (auto q = read_file(dir + "/cpu.cfs_quota_us")) quota = std::strtoll(q->c_str(), nullptr, 10);
    if (auto p = read_file(dir + "/cpu.cfs_period_us")) period = std::strtoll(p->c_str(), nullptr, 10);
  }
  if (quota > 0 && period > 0)
    out.quota_millicpus = static_cast<uint32_t>(std::min<int64_t>(quota * 1000 / period, UINT32_MAX));
  return out;
}

std::string read_slurm_account(const std::string& jobs_dir, const std::string& job) {
  // Slurm job ids are numbers (an array task has its own); anything else
  // would name another path.
  if (jobs_dir.empty() || job.empty() || job.size() > 20 || job.find_first_not_of("0123456789") != std::string::npos)
    return {};
  auto trusted = [](const struct stat& st) { return st.st_uid == 0 && (st.st_mode & (S_IWGRP | S_IWOTH)) == 0; };
  struct stat dir {};
  if (lstat(jobs_dir.c_str(), &dir) != 0 || !S_ISDIR(dir.st_mode) || !trusted(dir)) return {};
  int fd = open((jobs_dir + "/" + job).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return {};
  struct stat file {};
  std::string text;
  if (fstat(fd, &file) == 0 && S_ISREG(file.st_mode) && trusted(file) && file.st_size <= 4096) {
    text.resize(static_cast<size_t>(file.st_size));
    ssize_t n = read(fd, text.data(), text.size());
    text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  close(fd);
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line))
    if (line.rfind("account=", 0) == 0) return line.substr(8);
  return {};
}

namespace {
// The user a process in a user namespace that a user other than root made
// counts as (the outermost such namespace's maker), as the agent's BPF
// programs count its share of their tables (bpf/nccl.bpf.c, share__user):
// someone given subordinate uids (/etc/subuid, rootless containers) runs
// processes as many kernel uids, each of them theirs. nullopt: none (the
// initial namespace, or namespaces root made, whose uids root chose), or
// `ns_user` (/proc/PID/ns/user) could not be read.
std::optional<uint32_t> namespace_maker(const std::string& ns_user) {
  int fd = open(ns_user.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<uint32_t> maker;
  // User namespaces nest at most 32 deep.
  for (int depth = 0; depth <= 32; ++depth) {
    uid_t owner = 0;
    if (ioctl(fd, NS_GET_OWNER_UID, &owner) != 0) break;
    // The initial namespace has no parent (EPERM), nor has one above the
    // agent's own.
    int parent = ioctl(fd, NS_GET_PARENT);
    if (parent < 0) break;
    if (owner != 0) maker = owner;
    close(fd);
    fd = parent;
  }
  close(fd);
  return maker;
}
}  // namespace

std::optional<ProcessIdentity> read_identity(const std::string& proc_root, uint32_t pid,
                                             const std::string& container_state_root,
                                             const std::string& slurm_jobs_dir) {
  ProcessIdentity identity;
  identity.pid = pid;
  auto start = read_start_time(proc_root, pid);
  if (!start) return std::nullopt;
  identity.start_time = *start;
  std::string dir = proc_root + "/" + std::to_string(pid);
  char exe[4096];
  ssize_t n = readlink((dir + "/exe").c_str(), exe, sizeof(exe) - 1);
  if (n > 0) identity.exe.assign(exe, static_cast<size_t>(n));
  if (auto status = read_file(dir + "/status")) {
    std::istringstream lines(*status);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("Uid:", 0) == 0) {
        std::istringstream uid(line.substr(4));
        uid >> identity.uid;
        break;
      }
    }
  }
  if (auto environ = read_file(dir + "/environ")) apply_environment(parse_environ(*environ), identity);
  if (auto cgroups = read_file(dir + "/cgroup")) {
    // cgroup v2's single line "0::/path" if it says more than "/", else the
    // first v1 hierarchy's path that does (proc(5): "id:controllers:path").
    std::istringstream lines(*cgroups);
    std::string line, v1;
    while (std::getline(lines, line)) {
      size_t second = line.find(':', line.find(':') + 1);
      if (second == std::string::npos) continue;
      std::string path = line.substr(second + 1);
      if (line.rfind("0::", 0) == 0 && path != "/") identity.cgroup_path = path;
      else if (v1.empty() && line.rfind("0::", 0) != 0 && path != "/") v1 = path;
    }
    if (identity.cgroup_path.empty()) identity.cgroup_path = v1;
    CgroupIdentity from_cgroup = parse_cgroup_path(identity.cgroup_path);
    // The cgroup is Slurm's (slurmstepd made it and put the task in it); the
    // environment is the user's own. Where they disagree the cgroup wins, and
    // the account the environment named goes with the job it lied about.
    if (!from_cgroup.slurm_job.empty() && identity.job != from_cgroup.slurm_job) {
      identity.job = from_cgroup.slurm_job;
      identity.slurm_step.clear();
    }
    if (identity.slurm_step.empty()) identity.slurm_step = from_cgroup.slurm_step;
    identity.slurm_uid = from_cgroup.slurm_uid;
    identity.pod_uid = from_cgroup.pod_uid;
    identity.container_id = from_cgroup.container_id;
    identity.container_runtime = from_cgroup.container_runtime;
  }
  // The job's account as Slurm recorded it at the job's start on this node.
  // Without a Slurm cgroup (proctrack/linuxproc) the job id is the
  // environment's: a user naming another job gets that job's account.
  identity.account = read_slurm_account(slurm_jobs_dir, identity.job);
  if (!container_state_root.empty() && !identity.container_id.empty()) {
    // The container runtime's record of the pod wins over the downward API's
    // variables, which the process's own environment can say anything in.
    PodNames names = read_pod_names(container_state_root, identity.container_id);
    if (!names.pod_namespace.empty()) identity.pod_namespace = names.pod_namespace;
    if (!names.pod_name.empty()) identity.pod_name = names.pod_name;
  }
  {
    // The user is the process's kernel uid, or the maker of the user
    // namespace it runs in (a rootless container's subordinate uids are
    // its maker's); `uid` stays the process's own.
    const uint32_t user = namespace_maker(dir + "/ns/user").value_or(identity.uid);
    identity.user.clear();
    passwd entry{};
    passwd* found = nullptr;
    char buf[1024];
    if (getpwuid_r(user, &entry, buf, sizeof(buf), &found) == 0 && found)
      identity.user = found->pw_name;
    else
      identity.user = "uid " + std::to_string(user);
  }
  // The environment's values are the process's own word, of any length; a
  // value past its bound is taken as not set (never cut).
  std::string changed;
  for (const std::string& what : proto::limit_identity(identity)) changed += (changed.empty() ? "" : ", ") + what;
  if (!changed.empty()) RS_LOG(warn, "process %u: %s: past the bound, not sent", pid, changed.c_str());
  return identity;
}

}  // namespace rankscope::agent
