#pragma once
// Who a traced process is: read from /proc (under an injectable root) and
// from its environment, the way launchers (Slurm, torchrun, Open MPI) pass it.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/cgroup_path.h"
#include "proto/agent_wire.h"

namespace rankscope::agent {

// Who a traced process is (what the agent announces: proto/agent_wire.h).
using ProcessIdentity = proto::ProcessIdentity;

// What a cgroup path says about who runs there (common/cgroup_path.h; the
// collector's usage ledger reads its neighbours' paths with it too).
using rankscope::CgroupIdentity;
using rankscope::parse_cgroup_path;

// Parses the NUL-separated contents of /proc/PID/environ.
std::map<std::string, std::string> parse_environ(const std::string& raw);
// Fills the environment-derived fields of `identity` (first match wins, in
// the order RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK; likewise for the rest).
void apply_environment(const std::map<std::string, std::string>& env, ProcessIdentity& identity);
// A Kubernetes pod's namespace and name as its container runtime recorded
// them for `container_id`, under `state_root` ("/" on the host):
//   containerd  run/containerd/io.containerd.runtime.v2.task/k8s.io/ID/config.json
//               (OCI annotations io.kubernetes.cri.sandbox-namespace, -name)
//   CRI-O       run/containers/storage/overlay-containers/ID/userdata/config.json
//               (OCI annotations io.kubernetes.pod.namespace, .name)
//   Docker      var/lib/docker/containers/ID/config.v2.json (labels, as CRI-O's)
// Empty fields where none of them has it.
struct PodNames {
  std::string pod_namespace, pod_name;
};
PodNames read_pod_names(const std::string& state_root, const std::string& container_id);
// The string values of `keys` in a JSON document, wherever they are (a key
// whose value is not a string is left out); what follows a syntax error is
// not read.
std::map<std::string, std::string> json_string_values(std::string_view json, const std::vector<std::string>& keys);
// The Slurm account of `job` as slurmd's Prolog recorded it
// (deploy/slurm/rankscope-prolog.sh writes `<jobs_dir>/<job>`, a line
// `account=NAME`): "" when there is no record, or when the record or its
// folder could have been written by anyone but root (owned by another user,
// writable by group or others, a link, not a regular file). The account in
// a process's environment is its user's word, and never taken.
std::string read_slurm_account(const std::string& jobs_dir, const std::string& job);
// Reads everything about pid under proc_root (and the pod's names under
// container_state_root, the Slurm account from slurm_jobs_dir; "" skips
// them); nullopt if the process is gone.
std::optional<ProcessIdentity> read_identity(const std::string& proc_root, uint32_t pid,
                                             const std::string& container_state_root = "",
                                             const std::string& slurm_jobs_dir = "");
// /proc/PID/stat start time, or nullopt if the process is gone.
std::optional<uint64_t> read_start_time(const std::string& proc_root, uint32_t pid);
struct ProcessSample {
  char state = '?';          // /proc/PID/stat field 3
  uint64_t cpu_ns = 0;       // /proc/PID/schedstat: on-CPU time of the main thread
  uint64_t runqueue_ns = 0;  // /proc/PID/schedstat: time spent waiting for a CPU
  uint64_t process_cpu_ns = 0;  // /proc/PID/stat utime + stime: all threads, kernel accounting (clock-tick resolution)
};
// Reads the process's scheduling state; nullopt if it is gone.
std::optional<ProcessSample> read_sample(const std::string& proc_root, uint32_t pid);

// Where the cpu controller is mounted: cgroup v1's hierarchy with "cpu"
// among its controllers, and the cgroup v2 (unified) mount ("" where none).
struct CgroupMounts {
  std::string cpu_v1, unified;
};
// From a mountinfo file (proc(5)); the agent's own: /proc/self/mountinfo.
CgroupMounts read_cgroup_mounts(const std::string& mountinfo_path);
// The CPU quota of a process's cgroup and how often it throttled the
// cgroup (cgroup v1: cpu.cfs_quota_us, cpu.cfs_period_us, cpu.stat
// throttled_time; v2: cpu.max, cpu.stat throttled_usec), counters
// cumulative. nullopt: not in a cgroup of the cpu controller, or unreadable.
struct CpuThrottling {
  uint64_t periods = 0;            // enforcement periods that have elapsed
  uint64_t throttled_periods = 0;  // ... in which the cgroup ran out of quota
  uint64_t throttled_ns = 0;       // total time it was throttled
  uint32_t quota_millicpus = 0;    // its quota in thousandths of a CPU; 0: no quota
};
std::optional<CpuThrottling> read_cpu_throttling(const std::string& proc_root, uint32_t pid, const CgroupMounts& mounts);

// Reads a whole small file; nullopt if it cannot be opened.
std::optional<std::string> read_file(const std::string& path);

}  // namespace rankscope::agent
