// A real Slurm job: Debian's slurmctld, slurmd and munged, started by the
// test (tests/support/slurm.h), run `fakenccl-train` as a two-task step
// launched by `srun` inside a `salloc` allocation, as an unprivileged user
// with an account of the test's choosing. The agent, scoped to the cgroup
// slurmd and its steps run in, and the collector then name each rank with
// the job id, step id, user and account Slurm gave it, and the rank, local
// rank and world size srun set (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS),
// as `rankscope jobs --json` prints them.
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "tests/support/alertmanager.h"
#include "tests/support/cluster.h"
#include "tests/support/harness.h"
#include "tests/support/slurm.h"

namespace rankscope::testing {
namespace {

// Standard output of a command (run by /bin/sh), "" if it fails to start.
std::string capture(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {};
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) text.append(buf, n);
  pclose(pipe);
  return text;
}

// The value of "key" in a flat JSON object as the CLI prints it: a string's
// contents (unescaped quotes only), or a number's digits.
std::string field(const std::string& object, const std::string& key) {
  std::string tag = "\"" + key + "\":";
  size_t at = object.find(tag);
  if (at == std::string::npos) return "<missing " + key + ">";
  at += tag.size();
  if (object[at] == '"') {
    std::string value;
    for (size_t i = at + 1; i < object.size() && object[i] != '"'; ++i) value += object[i] == '\\' ? object[++i] : object[i];
    return value;
  }
  return object.substr(at, object.find_first_of(",}", at) - at);
}

// The objects of a JSON text that hold no other object (the ranks of
// `rankscope jobs --json`).
std::vector<std::string> leaf_objects(const std::string& json) {
  std::vector<std::string> leaves;
  std::vector<std::pair<size_t, bool>> open;  // start, holds an object
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    char c = json[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      if (!open.empty()) open.back().second = true;
      open.push_back({i, false});
    } else if (c == '}' && !open.empty()) {
      if (!open.back().second) leaves.push_back(json.substr(open.back().first, i - open.back().first + 1));
      open.pop_back();
    }
  }
  return leaves;
}

// The entries of an environment: /proc/PID/environ (separated by NULs) or `env`'s output (by newlines).
std::set<std::string> env_entries(const std::string& text, char separator) {
  std::set<std::string> out;
  std::istringstream in(text);
  for (std::string entry; std::getline(in, entry, separator);)
    if (!entry.empty()) out.insert(entry);
  return out;
}

std::string trim(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

TEST(SlurmE2E, SrunLaunchIsAttributedToItsJobStepUserAccountAndRanks) {
  if (geteuid() != 0) GTEST_SKIP() << "slurmd, cgroups and eBPF need root: run the suite as root";
  std::string missing = RealSlurm::missing_programs();
  if (!missing.empty())
    GTEST_SKIP() << "Slurm is not installed (" << missing << "): scripts/install-deps.sh test installs slurm-wlm and munge";

  RealSlurm slurm;
  ASSERT_TRUE(slurm.ok()) << slurm.error();
  TempDir dir;
  DeploymentOptions options;
  options.agent_args = [&](int) { return std::vector<std::string>{"--cgroup", slurm.node_cgroup()}; };
  options.slurm_jobs_dir = slurm.jobs_dir();
  TestDeployment deployment(dir, 1, options);
  ASSERT_TRUE(deployment.wait_connected(std::chrono::seconds(20))) << slurp(dir.file("agent-0.log"));
  // The Epilog's way to the collector, for the end-of-job report: a client key of its own.
  {
    auto keys = deployment.keys().cli_args();  // --key K --collector-key C
    std::ofstream(slurm.epilog_conf()) << "RANKSCOPE_COLLECTOR=" << deployment.query_endpoint()
                                       << "\nRANKSCOPE_KEY=" << keys[1] << "\nRANKSCOPE_COLLECTOR_KEY=" << keys[3]
                                       << "\nRANKSCOPE_CLI=" << bin_path("rankscope") << "\n";
  }

  // The job: an allocation of two tasks for `account`, as user nobody; a
  // first step that only runs `true` (step 0), then the training job as
  // step 1, until the test cancels it (or --time, 2 minutes, ends it). Its
  // tasks claim another account in their environment: the account is
  // Slurm's, as the Prolog recorded it.
  const std::string account = unique_name("acct-");
  const std::string job_name = unique_name("train-");
  const std::string work = slurm.shared_dir();
  std::string train = bin_path("fakenccl-train") + " --id-file " + work + "/nccl.id" +
                      " --steps 1000000 --compute-iters 1000000 --bucket-elems 1024 --quiet";
  // Step 0 opts out of the profiler plugin the TaskProlog names, and writes its environment.
  std::string steps = "srun -n1 --chdir=" + work + " --export=ALL,RANKSCOPE_NCCL_PROFILER=0 env > " + work +
                      "/step0.env && exec srun -N1 -n2 --chdir=" + work + " env SLURM_JOB_ACCOUNT=someone-elses " + train;
  SpawnOptions salloc;
  salloc.argv = {"/bin/sh", "-c",
                 "cd " + work + " && exec env -u RANK -u WORLD_SIZE -u LOCAL_RANK setpriv --reuid=nobody "
                     "--regid=nogroup --clear-groups salloc -N1 -n2 --time=2 --account=" + account + " -J " +
                     job_name + " /bin/sh -c '" + steps + "'"};
  salloc.env = slurm.client_env();
  // fakenccl's rendezvous and mesh on loopback (exact name), whatever else this host has.
  salloc.env["NCCL_SOCKET_IFNAME"] = "=lo";
  salloc.stdout_path = dir.file("salloc.log");
  Process job(salloc);

  // Slurm's own view: the job (id, account, user, two CPUs on one node) and its steps.
  std::string job_line, step_lines;
  ASSERT_TRUE(wait_for(
      [&] {
        slurm.run("squeue -h -n " + job_name + " -o '%i|%a|%u|%D|%C|%T'", &job_line, 10);
        slurm.run("squeue -h -s -n " + job_name + " -o '%i|%j'", &step_lines, 10);
        return step_lines.find(".1|") != std::string::npos || !job.running();
      },
      std::chrono::seconds(30)));
  ASSERT_TRUE(job.running()) << slurp(dir.file("salloc.log")) << slurm.logs();
  job_line = trim(job_line);
  std::string job_id = job_line.substr(0, job_line.find('|'));
  ASSERT_FALSE(job_id.empty()) << "squeue lists no job " << job_name << ": " << step_lines;
  EXPECT_EQ(job_line, job_id + "|" + account + "|nobody|1|2|RUNNING");
  EXPECT_GE(std::stoull(job_id), slurm.first_job_id());
  EXPECT_NE(step_lines.find(job_id + ".1|"), std::string::npos) << step_lines;
  EXPECT_NE(slurp(dir.file("salloc.log")).find("Granted job allocation " + job_id), std::string::npos)
      << slurp(dir.file("salloc.log"));

  // What rankscope says, through the CLI: the Slurm job with one two-rank
  // communicator, each rank named as Slurm launched it.
  std::string cli = bin_path("rankscope") + " jobs --json" + deployment.cli_flags();
  std::string json;
  std::vector<std::string> ranks;
  bool seen = wait_for(
      [&] {
        json = capture(cli);
        ranks.clear();
        for (const auto& object : leaf_objects(json))
          if (object.find("\"launcher_rank\"") != std::string::npos) ranks.push_back(object);
        return json.find("\"job\":\"" + job_id + "\"") != std::string::npos && ranks.size() == 2 &&
               !field(ranks[0], "user").empty() && !field(ranks[1], "user").empty();  // identities in
      },
      std::chrono::seconds(30));
  ASSERT_TRUE(seen) << json << "\n" << slurp(dir.file("agent-0.log")) << slurp(dir.file("salloc.log"));
  EXPECT_EQ(array_objects(json.substr(json.find('['))).size(), 1u) << "one job only: " << json;
  EXPECT_NE(json.find("\"nranks\":2"), std::string::npos) << json;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string& r = ranks[rank];
    SCOPED_TRACE(r);
    EXPECT_EQ(field(r, "rank"), std::to_string(rank));  // the communicator's (fakenccl took SLURM_PROCID)
    EXPECT_EQ(field(r, "launcher_rank"), std::to_string(rank));  // the agent's, from SLURM_PROCID
    EXPECT_EQ(field(r, "local_rank"), std::to_string(rank));     // SLURM_LOCALID
    EXPECT_EQ(field(r, "world_size"), "2");                      // SLURM_NTASKS
    EXPECT_EQ(field(r, "slurm_step"), "1");                      // SLURM_STEP_ID, squeue's <job>.1
    EXPECT_EQ(field(r, "user"), "nobody");                       // SLURM_JOB_USER
    EXPECT_EQ(field(r, "account"), account);                     // the Prolog's record, not SLURM_JOB_ACCOUNT
    EXPECT_EQ(field(r, "node"), deployment.node_name(0));
    // The pid is a task of that step: srun's environment is in it.
    std::string environ = slurp("/proc/" + field(r, "pid") + "/environ");
    EXPECT_NE(environ.find(std::string("SLURM_JOB_ID=") + job_id + '\0'), std::string::npos);
    EXPECT_NE(environ.find(std::string("SLURM_PROCID=") + std::to_string(rank) + '\0'), std::string::npos);
    // The TaskProlog named rankscope's NCCL profiler plugin for the job's partition, which the
    // site listed (deploy/slurm/rankscope-task-prolog.sh).
    EXPECT_EQ(env_entries(environ, '\0').count(std::string("NCCL_PROFILER_PLUGIN=") + RANKSCOPE_PROFILER_PLUGIN), 1u)
        << "task " << rank << "'s environment names no profiler plugin";
  }
  // Step 0 opted out: the TaskProlog left NCCL_PROFILER_PLUGIN unset.
  std::set<std::string> step0 = env_entries(slurp(work + "/step0.env"), '\n');
  EXPECT_EQ(step0.count("SLURM_STEP_ID=0"), 1u) << "step 0 wrote no environment";
  EXPECT_EQ(step0.count("RANKSCOPE_NCCL_PROFILER=0"), 1u);
  for (const std::string& entry : step0) EXPECT_FALSE(entry.starts_with("NCCL_PROFILER_PLUGIN=")) << entry;

  // The usage report bills the job, its user and its account as Slurm named
  // them (the ledger writes every few seconds: wait for GPU-hours to show).
  std::string report = bin_path("rankscope") + deployment.cli_flags() + "report --json ";
  for (const auto& [by, tenant] : std::vector<std::pair<std::string, std::string>>{
           {"job", job_id}, {"user", "nobody"}, {"account", account}}) {
    std::string out;
    bool billed = wait_for(
        [&] {
          out = capture(report + "--by " + by);
          for (const auto& row : leaf_objects(out))
            if (field(row, "tenant") == tenant && std::atof(field(row, "gpu_hours").c_str()) > 0) return true;
          return false;
        },
        std::chrono::seconds(30));
    EXPECT_TRUE(billed) << "--by " << by << ": no row for " << tenant << " with GPU-hours\n" << out;
  }
  std::string bill = capture(report + "--job " + job_id);
  EXPECT_NE(bill.find("\"job\":\"" + job_id + "\""), std::string::npos) << bill;
  EXPECT_NE(bill.find("\"tenant\":\"" + deployment.node_name(0) + "\""), std::string::npos) << bill;

  // Cancelled, the job ends: salloc returns and Slurm lists nothing.
  std::string cancel;
  EXPECT_EQ(slurm.run("scancel " + job_id, &cancel, 10), 0) << cancel;
  EXPECT_NE(job.wait(std::chrono::seconds(30)), -1) << "salloc still running after scancel";
  std::string left;
  EXPECT_TRUE(wait_for(
      [&] { return slurm.run("squeue -h -o %i", &left, 10) == 0 && left.empty(); }, std::chrono::seconds(30)))
      << left;
  // The Epilog removed the job's record, and left the job's report in its
  // working directory, written as the job's user.
  EXPECT_TRUE(wait_for([&] { return !std::filesystem::exists(slurm.jobs_dir() + "/" + job_id); },
                       std::chrono::seconds(30)))
      << slurm.logs();
  const std::string report_file = work + "/rankscope-" + job_id + ".txt";
  ASSERT_TRUE(wait_for([&] { return std::filesystem::exists(report_file); }, std::chrono::seconds(30)))
      << "no end-of-job report in " << work << "\n" << slurm.logs();
  std::string written;
  ASSERT_TRUE(wait_for(
      [&] {
        written = slurp(report_file);
        return written.find('\n', written.find(deployment.node_name(0))) != std::string::npos;
      },
      std::chrono::seconds(10)))
      << written;
  EXPECT_TRUE(written.starts_with("rankscope report of Slurm job " + job_id)) << written;
  EXPECT_NE(written.find(job_id), written.rfind(job_id)) << "the bill itself names the job\n" << written;
  EXPECT_NE(written.find(deployment.node_name(0)), std::string::npos) << "its node's row\n" << written;
  EXPECT_EQ(written.find("could not be read"), std::string::npos) << written;
  struct stat st {};
  ASSERT_EQ(stat(report_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, getpwnam("nobody")->pw_uid) << "written as the job's user, not root";
}

// Two instances side by side, as parallel test runs make them: each is its
// own cluster (its jobs run there and see its name), and neither disturbs
// the other.
TEST(SlurmE2E, TwoClustersRunSideBySide) {
  if (geteuid() != 0) GTEST_SKIP() << "slurmd and cgroups need root: run the suite as root";
  std::string missing = RealSlurm::missing_programs();
  if (!missing.empty())
    GTEST_SKIP() << "Slurm is not installed (" << missing << "): scripts/install-deps.sh test installs slurm-wlm and munge";
  RealSlurm first;
  RealSlurm second;
  ASSERT_TRUE(first.ok()) << first.error();
  ASSERT_TRUE(second.ok()) << second.error();
  EXPECT_NE(first.cluster(), second.cluster());
  for (RealSlurm* slurm : {&first, &second}) {
    std::string out;
    EXPECT_EQ(slurm->run("srun -n1 --chdir=" + slurm->shared_dir() + " printenv SLURM_CLUSTER_NAME SLURM_JOB_ID",
                         &out, 60),
              0)
        << out << slurm->logs();
    EXPECT_EQ(out, slurm->cluster() + "\n" + std::to_string(slurm->first_job_id()) + "\n");
  }
}

}  // namespace
}  // namespace rankscope::testing
