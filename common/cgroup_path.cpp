#include "common/cgroup_path.h"

#include <cctype>
#include <charconv>

namespace rankscope {

namespace {
// The value after `prefix` up to the next '/', '.', or the end.
std::string component_after(const std::string& path, const std::string& prefix) {
  size_t at = path.find(prefix);
  if (at == std::string::npos) return {};
  size_t start = at + prefix.size();
  size_t end = path.find_first_of("/.", start);
  return path.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

bool is_hex(const std::string& text) {
  return !text.empty() && text.find_first_not_of("0123456789abcdef") == std::string::npos;
}
}  // namespace

CgroupIdentity parse_cgroup_path(const std::string& path) {
  CgroupIdentity id;
  // Slurm (src/plugins/cgroup/v1 and v2): /slurm/uid_1000/job_42/step_0/task_1,
  // /system.slice/slurmstepd.scope/job_42/step_batch/user/task_0.
  id.slurm_job = component_after(path, "/job_");
  if (!id.slurm_job.empty()) {
    id.slurm_step = component_after(path, "/step_");
    std::string uid = component_after(path, "/uid_");
    // from_chars, not stoll: a cgroup named uid_<20 digits> (anyone may make
    // one under a delegated subtree) must not throw out of the agent.
    int64_t value = -1;
    auto [end, ec] = std::from_chars(uid.data(), uid.data() + uid.size(), value);
    if (!uid.empty() && ec == std::errc() && end == uid.data() + uid.size() && value >= 0) id.slurm_uid = value;
  }
  // Kubernetes: /kubepods/burstable/pod<uid>/<container> (cgroupfs driver) or
  // /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/
  // cri-containerd-<id>.scope (systemd driver; crio-<id>.scope, docker-<id>.scope).
  if (path.find("kubepods") != std::string::npos) {
    // "pod" right after '/' or '-' and followed by the uid ("kubepods" itself is not it).
    for (size_t at = path.find("pod"); at != std::string::npos; at = path.find("pod", at + 1)) {
      if (at == 0 || (path[at - 1] != '/' && path[at - 1] != '-') || at + 3 >= path.size() ||
          !isxdigit(static_cast<unsigned char>(path[at + 3])))
        continue;
      std::string pod = component_after(path.substr(at - 1), std::string(1, path[at - 1]) + "pod");
      for (auto& c : pod)
        if (c == '_') c = '-';
      id.pod_uid = pod;
      break;
    }
  }
  struct Runtime {
    const char* prefix;
    const char* name;
  };
  for (const Runtime& runtime :
       {Runtime{"cri-containerd-", "containerd"}, Runtime{"crio-", "crio"}, Runtime{"docker-", "docker"}}) {
    std::string container = component_after(path, runtime.prefix);
    if (is_hex(container)) {
      id.container_id = container;
      id.container_runtime = runtime.name;
      return id;
    }
  }
  // cgroupfs layouts: the container id is the last component (64 hex digits).
  size_t slash = path.rfind('/');
  std::string last = slash == std::string::npos ? path : path.substr(slash + 1);
  if (last.size() == 64 && is_hex(last) &&
      (path.find("/docker/") != std::string::npos || path.find("kubepods") != std::string::npos)) {
    id.container_id = last;
    id.container_runtime = path.find("/docker/") != std::string::npos ? "docker" : "";
  }
  return id;
}

}  // namespace rankscope
