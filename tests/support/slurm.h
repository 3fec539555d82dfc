#pragma once
// A real single-node Slurm for tests: Debian's munged, slurmctld and slurmd,
// started by the test in a folder of their own, with their own munge key and
// socket, their own cluster name and ports, and never the system's services
// or files. Two can run side by side.
//
// Every daemon, and every job step slurmd starts, runs in a cgroup v2 made
// for this instance (daemons in "<top>/ctl", slurmd and its steps in
// "<top>/node"), so that an agent can be scoped to the node's jobs with
// `--cgroup` and so that the destructor can kill everything that Slurm
// started (slurmstepd detaches from slurmd) before it removes the cgroups
// and the folder, also when the test failed.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/harness.h"

namespace rankscope::testing {

class RealSlurm {
 public:
  // The programs it needs that are not installed, by name ("" if none are
  // missing): `scripts/install-deps.sh test` installs them (slurm-wlm, munge).
  static std::string missing_programs();

  // Starts munged, slurmctld and slurmd and waits (30 s at most) until the
  // node is idle; ok() says whether it got there and error() why not.
  RealSlurm();
  ~RealSlurm();
  RealSlurm(const RealSlurm&) = delete;
  RealSlurm& operator=(const RealSlurm&) = delete;

  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }

  const std::string& cluster() const { return cluster_; }
  const std::string& node() const { return node_; }
  const std::string& partition() const { return partition_; }
  const std::string& conf() const { return conf_; }
  // The first job id this cluster hands out (unique per instance, so that a
  // test cannot pass by expecting Slurm's default of 1).
  uint64_t first_job_id() const { return first_job_id_; }
  // cgroup v2 folder (absolute) in which slurmd and every job step run.
  const std::string& node_cgroup() const { return node_cgroup_; }
  // A folder in this instance's tree that every user may write to (for
  // jobs' files and working directories).
  std::string shared_dir() const { return dir_.file("shared"); }
  // Where its slurmd's Prolog (deploy/slurm/rankscope-prolog.sh, with
  // PrologFlags=Alloc) records each job's account, for the agent's
  // --slurm-jobs-dir; the Epilog removes the record.
  std::string jobs_dir() const { return dir_.file("rankscope-jobs"); }
  // The Epilog's configuration (RANKSCOPE_EPILOG_CONF): absent, it writes
  // no report; a test that wants each job's report writes it
  // (deploy/slurm/rankscope-epilog.sh says what it holds).
  std::string epilog_conf() const { return dir_.file("rankscope-epilog.conf"); }
  // What a client (srun, salloc, sinfo, squeue) needs in its environment.
  std::map<std::string, std::string> client_env() const { return {{"SLURM_CONF", conf_}}; }

  // Runs a shell command with client_env(), bounded by `timeout_s`; returns
  // its exit status and puts its standard output (and error) in *output.
  int run(const std::string& command, std::string* output, int timeout_s = 30) const;
  // The daemons' logs, for a failing test's message.
  std::string logs() const;

 private:
  bool start();
  // slurm.conf with two free ports, then slurmctld and slurmd until the node is idle.
  bool start_daemons(const std::string& hardware, std::string* why);
  bool fail(const std::string& why);
  std::unique_ptr<Process> spawn(const std::string& cgroup, const std::vector<std::string>& argv,
                                 const std::string& log);

  TempDir dir_;  // first: removed after everything else is gone
  std::string cluster_, node_, partition_, conf_, munge_socket_;
  std::string top_cgroup_, ctl_cgroup_, node_cgroup_;
  uint64_t first_job_id_ = 0;
  bool ok_ = false;
  std::string error_;
  std::vector<std::unique_ptr<Process>> daemons_;  // munged, slurmctld, slurmd
};

}  // namespace rankscope::testing
