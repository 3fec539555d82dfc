#include "tests/support/slurm.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace rankscope::testing {

namespace {

constexpr const char* kPrograms[] = {"/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd",
                                     "/usr/bin/srun",    "/usr/bin/salloc",     "/usr/bin/sinfo",
                                     "/usr/bin/squeue",  "/usr/bin/scancel"};

std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The first cgroup v2 mount (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a
// hybrid host); "" if there is none.
std::string cgroup2_mount() {
  std::ifstream mounts("/proc/self/mounts");
  std::string line;
  while (std::getline(mounts, line)) {
    std::istringstream fields(line);
    std::string source, target, type;
    if (fields >> source >> target >> type && type == "cgroup2") return target;
  }
  return {};
}

// Kills every process in a cgroup v2 folder: cgroup.kill where the kernel
// has it (5.14), else each pid that cgroup.procs lists, until none is left.
void kill_cgroup(const std::string& cgroup) {
  if (cgroup.empty()) return;
  {
    std::ofstream kill_file(cgroup + "/cgroup.kill");
    if (kill_file) kill_file << "1" << std::flush;
  }
  wait_for(
      [&] {
        std::ifstream procs(cgroup + "/cgroup.procs");
        if (!procs) return true;
        bool any = false;
        pid_t pid = 0;
        while (procs >> pid) {
          any = true;
          kill(pid, SIGKILL);
        }
        return !any;
      },
      std::chrono::seconds(10));
}

// Removes a cgroup folder once its last (killed) process has left it.
void remove_cgroup(const std::string& cgroup) {
  if (cgroup.empty()) return;
  wait_for([&] { return rmdir(cgroup.c_str()) == 0 || errno == ENOENT; }, std::chrono::seconds(10));
}

std::string tail_of(const std::string& path, size_t lines) {
  std::string text = slurp(path);
  size_t at = text.size();
  for (size_t n = 0; n <= lines && at != std::string::npos && at > 0; ++n) at = text.rfind('\n', at - 1);
  return at == std::string::npos || at == 0 ? text : text.substr(at + 1);
}

}  // namespace

std::string RealSlurm::missing_programs() {
  std::string missing;
  for (const char* program : kPrograms)
    if (access(program, X_OK) != 0) missing += (missing.empty() ? "" : " ") + std::string(program);
  return missing;
}

RealSlurm::RealSlurm() { ok_ = start(); }

RealSlurm::~RealSlurm() {
  // Slurm's steps run under slurmstepd, which is no child of ours: the
  // cgroups hold them all. Kill, then reap our own children, then remove.
  kill_cgroup(node_cgroup_);
  kill_cgroup(ctl_cgroup_);
  daemons_.clear();
  remove_cgroup(node_cgroup_);
  remove_cgroup(ctl_cgroup_);
  remove_cgroup(top_cgroup_);
  // dir_ goes last (member order), with the state, spool, logs and key.
}

bool RealSlurm::fail(const std::string& why) {
  error_ = why;
  return false;
}

std::unique_ptr<Process> RealSlurm::spawn(const std::string& cgroup, const std::vector<std::string>& argv,
                                          const std::string& log) {
  // Into the cgroup first, then exec: one process throughout, and whatever
  // it starts is born in the cgroup. Killed with the test's process if that
  // dies before the destructor runs (a crash, a ctest timeout).
  SpawnOptions spawn;
  spawn.argv = {"/usr/bin/setpriv", "--pdeathsig", "KILL", "/bin/sh", "-c",
                "echo $$ > \"$0/cgroup.procs\" && exec \"$@\"", cgroup};
  spawn.argv.insert(spawn.argv.end(), argv.begin(), argv.end());
  spawn.env = client_env();
  spawn.stdout_path = dir_.file(log);
  return std::make_unique<Process>(spawn);
}

bool RealSlurm::start() {
  std::string missing = missing_programs();
  if (!missing.empty())
    return fail("not installed: " + missing + " (scripts/install-deps.sh test installs slurm-wlm and munge)");

  static std::atomic<int> instances{0};
  int instance = instances++;
  cluster_ = unique_name("rs");
  partition_ = "rstest";
  // Unique per process and instance; well below Slurm's MaxJobId (67043328).
  first_job_id_ = 1000 + static_cast<uint64_t>(getpid() % 100000) * 100 + static_cast<uint64_t>(instance % 100);

  // Every user may reach the socket, the configuration and the shared folder
  // (jobs can run as an unprivileged user); nothing is writable by others but
  // the shared folder.
  chmod(dir_.path().c_str(), 0755);
  for (const char* sub : {"munge", "state", "spool", "shared"})
    if (mkdir(dir_.file(sub).c_str(), 0755) != 0) return fail("mkdir " + dir_.file(sub) + ": " + strerror(errno));
  chmod(shared_dir().c_str(), 01777);

  // cgroups for the daemons and for the node (slurmd and its steps).
  std::string mount = cgroup2_mount();
  if (mount.empty()) return fail("no cgroup v2 mount in /proc/self/mounts: the Slurm fixture puts its daemons in one");
  top_cgroup_ = mount + "/rankscope-slurm-" + cluster_;
  if (mkdir(top_cgroup_.c_str(), 0755) != 0) {
    std::string why = "mkdir " + top_cgroup_ + ": " + strerror(errno);
    top_cgroup_.clear();
    return fail(why);
  }
  for (std::string* cg : {&ctl_cgroup_, &node_cgroup_}) {
    std::string path = top_cgroup_ + (cg == &ctl_cgroup_ ? "/ctl" : "/node");
    if (mkdir(path.c_str(), 0755) != 0) return fail("mkdir " + path + ": " + strerror(errno));
    *cg = path;
  }

  // munge: a key of our own (munged wants it private to its owner) and a
  // socket in our folder, so that the system's munged (if any) is never used.
  std::string key = dir_.file("munge/munge.key");
  {
    std::ifstream random("/dev/urandom", std::ios::binary);
    char bytes[1024];
    if (!random.read(bytes, sizeof(bytes))) return fail("cannot read /dev/urandom for a munge key");
    std::ofstream out(key, std::ios::binary);
    out.write(bytes, sizeof(bytes));
    if (!out) return fail("cannot write " + key);
  }
  chmod(key.c_str(), 0600);
  munge_socket_ = dir_.file("munge/munge.socket");
  daemons_.push_back(spawn(ctl_cgroup_,
                           {"/usr/sbin/munged", "--foreground", "--force", "--socket=" + munge_socket_,
                            "--key-file=" + key, "--pid-file=" + dir_.file("munge/munged.pid"),
                            "--log-file=" + dir_.file("munge/munged.log"),
                            "--seed-file=" + dir_.file("munge/munged.seed"), "--num-threads=2"},
                           "munged.out"));
  if (!wait_for(
          [&] {
            struct stat st {};
            return stat(munge_socket_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
          },
          std::chrono::seconds(10)))
    return fail("munged did not create " + munge_socket_);

  // This machine as slurmd sees it (its name, CPUs, sockets, cores, memory):
  // the first line of `slurmd -C`, "NodeName=... CPUs=... RealMemory=...".
  std::string hardware;
  if (run("/usr/sbin/slurmd -C", &hardware, 30) != 0 || hardware.rfind("NodeName=", 0) != 0)
    return fail("`slurmd -C` did not describe this node: " + hardware);
  hardware = hardware.substr(0, hardware.find('\n'));
  node_ = hardware.substr(9, hardware.find(' ') - 9);

  // A port drawn free can still be taken before the daemon binds it (by a
  // test running beside this one): then both daemons start again on others.
  for (int attempt = 1;; ++attempt) {
    std::string why;
    if (start_daemons(hardware, &why)) return true;
    bool port_taken = why.find("Address already in use") != std::string::npos;
    if (!port_taken || attempt == 3) return fail(why);
    daemons_.resize(1);  // munged stays
    for (const char* log : {"slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"})
      rename(dir_.file(log).c_str(), (dir_.file(log) + ".try" + std::to_string(attempt)).c_str());
  }
}

bool RealSlurm::start_daemons(const std::string& hardware, std::string* why) {
  int ctld_port = free_port();
  int slurmd_port = free_port();
  while (slurmd_port == ctld_port) slurmd_port = free_port();
  // The shipped Prolog, Epilog and TaskProlog, writing to this instance's
  // folder and naming this build's profiler plugin (slurmd runs them with
  // the job's variables only: a wrapper names them).
  // The TaskProlog names the plugin for jobs of this cluster's partition (the site's opt-in).
  const std::string task_prolog_conf = dir_.file("task-prolog.conf");
  std::ofstream(task_prolog_conf) << "RANKSCOPE_PROFILER_PARTITIONS=\"" << partition_ << "\"\n";
  auto hook = [&](const std::string& which) {
    std::string path = dir_.file("rankscope-" + which + ".sh");
    std::ofstream(path) << "#!/bin/sh\nRANKSCOPE_SLURM_DIR='" << jobs_dir() << "' RANKSCOPE_EPILOG_CONF='"
                        << epilog_conf() << "' RANKSCOPE_TASK_PROLOG_CONF='" << task_prolog_conf
                        << "' RANKSCOPE_PROFILER_LIB='" << RANKSCOPE_PROFILER_PLUGIN
                        << "' SLURM_CONF='" << conf_ << "' exec /bin/sh '" << RANKSCOPE_SOURCE_DIR
                        << "/deploy/slurm/rankscope-" << which << ".sh'\n";
    chmod(path.c_str(), 0755);
    return path;
  };
  conf_ = dir_.file("slurm.conf");
  {
    std::ofstream conf(conf_);
    conf << "# Written by rankscope's tests (tests/support/slurm.cpp): a single-node cluster\n"
         << "ClusterName=" << cluster_ << "\n"
         << "SlurmctldHost=" << node_ << "(127.0.0.1)\n"
         << "SlurmctldPort=" << ctld_port << "\n"
         << "SlurmdPort=" << slurmd_port << "\n"
         << "SlurmUser=root\nSlurmdUser=root\n"
         << "AuthType=auth/munge\nCredType=cred/munge\n"
         << "AuthInfo=socket=" << munge_socket_ << "\n"
         << "StateSaveLocation=" << dir_.file("state") << "\n"
         << "SlurmdSpoolDir=" << dir_.file("spool") << "\n"
         << "SlurmctldPidFile=" << dir_.file("slurmctld.pid") << "\n"
         << "SlurmdPidFile=" << dir_.file("slurmd.pid") << "\n"
         << "SlurmctldLogFile=" << dir_.file("slurmctld.log") << "\n"
         << "SlurmdLogFile=" << dir_.file("slurmd.log") << "\n"
         << "SlurmctldDebug=info\nSlurmdDebug=info\n"
         << "FirstJobId=" << first_job_id_ << "\n"
         << "MailProg=/bin/true\n"
         // No cgroups of Slurm's own: steps stay in slurmd's cgroup (ours).
         << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
         << "JobAcctGatherType=jobacct_gather/none\n"
         << "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n"
         << "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
         << "SwitchType=switch/none\nMpiDefault=none\n"
         << "ReturnToService=2\n"
         << "Prolog=" << hook("prolog") << "\nEpilog=" << hook("epilog") << "\nPrologFlags=Alloc\n"
         << "TaskProlog=" << hook("task-prolog") << "\n"
         << hardware << " NodeAddr=127.0.0.1 State=UNKNOWN\n"
         << "PartitionName=" << partition_ << " Nodes=" << node_ << " Default=YES MaxTime=10 State=UP\n";
    if (!conf) {
      *why = "cannot write " + conf_;
      return false;
    }
  }

  daemons_.push_back(spawn(ctl_cgroup_, {"/usr/sbin/slurmctld", "-D", "-f", conf_}, "slurmctld.out"));
  daemons_.push_back(spawn(node_cgroup_, {"/usr/sbin/slurmd", "-D", "-f", conf_}, "slurmd.out"));

  std::string state;
  if (!wait_for(
          [&] {
            for (auto& daemon : daemons_)
              if (!daemon->running()) return true;  // died: stop waiting
            return run("/usr/bin/sinfo -h -N -n " + node_ + " -o %T", &state, 10) == 0 && state == "idle\n";
          },
          std::chrono::seconds(30)) ||
      state != "idle\n") {
    *why = "node " + node_ + " of cluster " + cluster_ + " did not become idle (sinfo says '" + state + "')\n" + logs();
    return false;
  }
  return true;
}

int RealSlurm::run(const std::string& command, std::string* output, int timeout_s) const {
  std::string line = "env SLURM_CONF=" + shell_quote(conf_) + " timeout -k 5 " + std::to_string(timeout_s) +
                     " /bin/sh -c " + shell_quote(command) + " 2>&1";
  FILE* pipe = popen(line.c_str(), "r");
  if (!pipe) return -1;
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) text.append(buf, n);
  int status = pclose(pipe);
  if (output) *output = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string RealSlurm::logs() const {
  std::string out;
  for (const char* log : {"munge/munged.log", "slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"})
    out += std::string("--- ") + log + " (last lines)\n" + tail_of(dir_.file(log), 25);
  return out;
}

}  // namespace rankscope::testing
