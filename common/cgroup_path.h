#pragma once
// What a cgroup path says about who runs there: Slurm's
// ".../job_<id>/step_<n>/..." (v1 and v2, with "uid_<n>"), Kubernetes'
// "kubepods...pod<uid>..." with a containerd, CRI-O or Docker container, a
// plain Docker container. Fields it cannot find stay empty. One parser for
// the agent (a traced process's own cgroup) and the collector's usage
// ledger (the neighbour cgroups it bills for a straggler).
#include <cstdint>
#include <string>

namespace rankscope {

struct CgroupIdentity {
  std::string slurm_job, slurm_step;
  int64_t slurm_uid = -1;
  std::string pod_uid, container_id, container_runtime;
};
CgroupIdentity parse_cgroup_path(const std::string& path);

}  // namespace rankscope
