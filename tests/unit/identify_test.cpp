// Identity from a fake /proc root, as launchers set it.
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "node-agent/identify.h"
#include "tests/support/harness.h"

namespace rankscope::agent {
namespace {

void write(const std::string& path, const std::string& content) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << content;
}

std::string environ_of(std::initializer_list<std::string> entries) {
  std::string raw;
  for (const auto& e : entries) raw += e + '\0';
  return raw;
}

std::string user_of(uid_t uid) {
  passwd* entry = getpwuid(uid);
  return entry ? entry->pw_name : "uid " + std::to_string(uid);
}

// The folder of Slurm Prolog records (deploy/slurm/rankscope-prolog.sh), as
// root makes it: root-owned, 0755, a file per job "account=NAME".
std::string prolog_records(const testing::TempDir& dir, const std::map<std::string, std::string>& accounts) {
  std::string jobs = dir.file("slurm");
  std::filesystem::create_directories(jobs);
  chmod(jobs.c_str(), 0755);
  for (const auto& [job, account] : accounts) {
    write(jobs + "/" + job, "account=" + account + "\n");
    chmod((jobs + "/" + job).c_str(), 0644);
  }
  return jobs;
}

TEST(Identify, SlurmEnvironmentGivesJobAndRanksAndTheProloguesRecordTheAccount) {
  testing::TempDir root;
  write(root.file("31/stat"), "31 (python3 (x)) S 1 31 31 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 9 0 987654 1 2 3\n");
  write(root.file("31/status"), "Name:\tpython3\nUid:\t1000\t1000\t1000\t1000\n");
  write(root.file("31/environ"),
        environ_of({"SLURM_JOB_ID=4711", "SLURM_STEP_ID=2", "SLURM_STEPID=2", "SLURM_PROCID=5", "SLURM_LOCALID=1",
                    "SLURM_NTASKS=8", "SLURM_JOB_ACCOUNT=physics", "SLURM_JOB_USER=alice",
                    "CUDA_VISIBLE_DEVICES=2,3"}));
  testing::TempDir records;
  auto id = read_identity(root.path(), 31, "", prolog_records(records, {{"4711", "physics-lab"}}));
  ASSERT_TRUE(id);
  EXPECT_EQ(id->start_time, 987654u);
  EXPECT_EQ(id->job, "4711");
  EXPECT_EQ(id->slurm_step, "2");
  EXPECT_EQ(id->rank, 5);
  EXPECT_EQ(id->local_rank, 1);
  EXPECT_EQ(id->world_size, 8);
  EXPECT_EQ(id->account, "physics-lab");  // Slurm's record, not SLURM_JOB_ACCOUNT
  EXPECT_EQ(id->uid, 1000u);
  EXPECT_EQ(id->user, user_of(1000));  // the kernel's uid, never SLURM_JOB_USER
  EXPECT_EQ(id->visible_devices, "2,3");
}

// Anyone can start a process with SLURM_JOB_ID, SLURM_JOB_ACCOUNT and
// SLURM_JOB_USER of their choice; the cgroup slurmstepd put the task in and
// the kernel's uid are what identify it.
TEST(Identify, EnvironmentCannotPoseAsAnotherJobOrUser) {
  testing::TempDir root;
  write(root.file("32/stat"), "32 (python3) S 1 32 32 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 9 0 5555 1 2 3\n");
  write(root.file("32/status"), "Name:\tpython3\nUid:\t1000\t1000\t1000\t1000\n");
  write(root.file("32/cgroup"), "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n");
  write(root.file("32/environ"), environ_of({"SLURM_JOB_ID=99", "SLURM_STEP_ID=7", "SLURM_JOB_ACCOUNT=rich-lab",
                                             "SLURM_JOB_USER=root"}));
  testing::TempDir records;
  std::string jobs = prolog_records(records, {{"42", "poor-lab"}, {"99", "rich-lab"}});
  auto id = read_identity(root.path(), 32, "", jobs);
  ASSERT_TRUE(id);
  EXPECT_EQ(id->job, "42");         // the cgroup's
  EXPECT_EQ(id->slurm_step, "0");
  EXPECT_EQ(id->account, "poor-lab");  // the job's, as Slurm recorded it
  EXPECT_EQ(id->user, user_of(1000));
  // Without a record (no Prolog installed) there is no account: the
  // environment's is never taken.
  EXPECT_EQ(read_identity(root.path(), 32)->account, "");
}

// A record anyone but root could have written is not Slurm's.
TEST(Identify, AProloguesRecordOnlyRootCouldWriteIsTrusted) {
  if (geteuid() != 0) GTEST_SKIP() << "records are trusted only when root owns them: run the suite as root";
  testing::TempDir records;
  std::string jobs = prolog_records(records, {{"7", "lab-a"}, {"8", "lab-b"}, {"9", "lab-c"}});
  EXPECT_EQ(read_slurm_account(jobs, "7"), "lab-a");
  chmod((jobs + "/8").c_str(), 0666);
  EXPECT_EQ(read_slurm_account(jobs, "8"), "") << "a world-writable record";
  ASSERT_EQ(chown((jobs + "/9").c_str(), 65534, 65534), 0);
  EXPECT_EQ(read_slurm_account(jobs, "9"), "") << "a record owned by nobody";
  std::filesystem::create_symlink(jobs + "/7", jobs + "/10");
  EXPECT_EQ(read_slurm_account(jobs, "10"), "") << "a link";
  EXPECT_EQ(read_slurm_account(jobs, "../slurm/7"), "") << "not a job id";
  EXPECT_EQ(read_slurm_account(jobs, "404"), "");
  chmod(jobs.c_str(), 0777);
  EXPECT_EQ(read_slurm_account(jobs, "7"), "") << "a folder anyone can write to";
}

// Found in review: a cgroup named uid_<20 digits> made std::stoll throw out of the agent.
TEST(Identify, HugeUidInACgroupPathIsIgnored) {
  CgroupIdentity id = parse_cgroup_path("/slurm/uid_99999999999999999999/job_5/step_0/task_0");
  EXPECT_EQ(id.slurm_uid, -1);
  EXPECT_EQ(id.slurm_job, "5");
  EXPECT_EQ(parse_cgroup_path("/slurm/uid_1000/job_5/step_0").slurm_uid, 1000);
}

TEST(Identify, TorchrunVariablesWinOverSlurmOnes) {
  ProcessIdentity id;
  apply_environment(parse_environ(environ_of({"RANK=3", "SLURM_PROCID=0", "WORLD_SIZE=16", "LOCAL_RANK=3",
                                              "TORCHELASTIC_RUN_ID=run-9"})),
                    id);
  EXPECT_EQ(id.rank, 3);
  EXPECT_EQ(id.world_size, 16);
  EXPECT_EQ(id.local_rank, 3);
  EXPECT_EQ(id.job, "run-9");
}

TEST(Identify, GarbageValuesAreIgnored) {
  ProcessIdentity id;
  apply_environment(parse_environ(environ_of({"RANK=three", "=x", "WORLD_SIZE=", "OMPI_COMM_WORLD_RANK=2"})), id);
  EXPECT_EQ(id.rank, 2);
  EXPECT_EQ(id.world_size, -1);
}

TEST(Identify, VanishedProcessIsNotAnError) {
  testing::TempDir root;
  EXPECT_FALSE(read_identity(root.path(), 12345));
}

}  // namespace
}  // namespace rankscope::agent

namespace rankscope::agent {
namespace {

TEST(CgroupIdentity, SlurmCgroupV1) {
  auto id = parse_cgroup_path("/slurm/uid_1000/job_4711/step_0/task_2");
  EXPECT_EQ(id.slurm_job, "4711");
  EXPECT_EQ(id.slurm_step, "0");
  EXPECT_EQ(id.slurm_uid, 1000);
  EXPECT_EQ(id.pod_uid, "");
}

TEST(CgroupIdentity, SlurmCgroupV2BatchStep) {
  auto id = parse_cgroup_path("/system.slice/slurmstepd.scope/job_88121/step_batch/user/task_0");
  EXPECT_EQ(id.slurm_job, "88121");
  EXPECT_EQ(id.slurm_step, "batch");
  EXPECT_EQ(id.slurm_uid, -1);
}

TEST(CgroupIdentity, KubernetesSystemdDriverWithContainerd) {
  auto id = parse_cgroup_path(
      "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6f1c2a9e_3b4d_4c1e_9a7b_0d2e5f8a1b3c.slice/"
      "cri-containerd-0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9.scope");
  EXPECT_EQ(id.pod_uid, "6f1c2a9e-3b4d-4c1e-9a7b-0d2e5f8a1b3c");
  EXPECT_EQ(id.container_id, "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9");
  EXPECT_EQ(id.container_runtime, "containerd");
  EXPECT_EQ(id.slurm_job, "");
}

TEST(CgroupIdentity, KubernetesCgroupfsDriverAndCrio) {
  std::string container(64, 'c');
  auto v1 = parse_cgroup_path("/kubepods/besteffort/pod11112222-3333-4444-5555-666677778888/" + container);
  EXPECT_EQ(v1.pod_uid, "11112222-3333-4444-5555-666677778888");
  EXPECT_EQ(v1.container_id, container);
  auto crio = parse_cgroup_path("/kubepods.slice/kubepods-pod0000aaaa_1111_2222_3333_444455556666.slice/crio-" +
                                container + ".scope");
  EXPECT_EQ(crio.pod_uid, "0000aaaa-1111-2222-3333-444455556666");
  EXPECT_EQ(crio.container_runtime, "crio");
}

TEST(CgroupIdentity, PlainDockerAndNothing) {
  std::string container(64, 'd');
  auto docker = parse_cgroup_path("/system.slice/docker-" + container + ".scope");
  EXPECT_EQ(docker.container_id, container);
  EXPECT_EQ(docker.container_runtime, "docker");
  auto user = parse_cgroup_path("/user.slice/user-1000.slice/session-3.scope");
  EXPECT_EQ(user.slurm_job, "");
  EXPECT_EQ(user.pod_uid, "");
  EXPECT_EQ(user.container_id, "");
}

TEST(Identify, CgroupFillsTheJobWhenTheEnvironmentDoesNot) {
  testing::TempDir root;
  write(root.file("9/stat"), "9 (train) S 1 9 9 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 9 0 555 1 2 3\n");
  write(root.file("9/cgroup"), "12:cpu,cpuacct:/slurm/uid_0/job_77/step_3\n0::/\n");
  write(root.file("9/environ"), environ_of({"RANK=1"}));
  auto id = read_identity(root.path(), 9);
  ASSERT_TRUE(id);
  EXPECT_EQ(id->cgroup_path, "/slurm/uid_0/job_77/step_3");
  EXPECT_EQ(id->job, "77");
  EXPECT_EQ(id->slurm_step, "3");
}

TEST(Identify, SlurmStepFromTheEnvironmentWinsOverTheCgroups) {
  ProcessIdentity old_name;
  apply_environment(parse_environ(environ_of({"SLURM_JOB_ID=12", "SLURM_STEPID=4"})), old_name);
  EXPECT_EQ(old_name.slurm_step, "4");

  // A task of step 1 whose cgroup was left at the job's step_0 (a launcher
  // that does not move tasks): the job and step come from the environment,
  // as srun set them, and agree with each other.
  testing::TempDir root;
  write(root.file("8/stat"), "8 (train) S 1 8 8 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 9 0 444 1 2 3\n");
  write(root.file("8/cgroup"), "0::/slurm/uid_0/job_12/step_0\n");
  write(root.file("8/environ"), environ_of({"SLURM_JOB_ID=12", "SLURM_STEP_ID=1", "SLURM_PROCID=1"}));
  auto id = read_identity(root.path(), 8);
  ASSERT_TRUE(id);
  EXPECT_EQ(id->job, "12");
  EXPECT_EQ(id->slurm_step, "1");
  EXPECT_EQ(id->slurm_uid, 0);
}

// A pod's namespace and name: from the downward API's variables when the
// pod spec sets them, else from what the container runtime recorded for the
// container the cgroup path names (containerd, CRI-O, Docker, each in its
// own place and spelling).
TEST(PodNames, FromEachRuntimesAnnotationsBeforeTheEnvironment) {
  ProcessIdentity from_env;
  apply_environment(parse_environ(environ_of({"POD_NAMESPACE=team-a", "POD_NAME=trainer-0"})), from_env);
  EXPECT_EQ(from_env.pod_namespace, "team-a");
  EXPECT_EQ(from_env.pod_name, "trainer-0");

  testing::TempDir state;
  std::string containerd(64, 'a'), crio(64, 'b'), docker(64, 'c'), absent(64, 'd');
  write(state.file("run/containerd/io.containerd.runtime.v2.task/k8s.io/" + containerd + "/config.json"),
        R"({"ociVersion":"1.1.0","process":{"env":["X=\"io.kubernetes.cri.sandbox-namespace\": \"fake\""]},)"
        R"("annotations":{"io.kubernetes.cri.container-type":"container","io.kubernetes.cri.sandbox-id":"f00",)"
        R"("io.kubernetes.cri.sandbox-name":"trainer-\u00e9-0","io.kubernetes.cri.sandbox-namespace" : "ml-prod"}})");
  write(state.file("run/containers/storage/overlay-containers/" + crio + "/userdata/config.json"),
        R"({"annotations":{"io.kubernetes.pod.name":"crio-pod","io.kubernetes.pod.namespace":"ml-dev"}})");
  write(state.file("var/lib/docker/containers/" + docker + "/config.v2.json"),
        R"({"Config":{"Labels":{"io.kubernetes.pod.namespace":"legacy","io.kubernetes.pod.name":"old-pod"}}})");

  PodNames a = read_pod_names(state.path(), containerd);
  EXPECT_EQ(a.pod_namespace, "ml-prod");  // not the key's text inside the env string
  EXPECT_EQ(a.pod_name, "trainer-\xc3\xa9-0");
  PodNames b = read_pod_names(state.path(), crio);
  EXPECT_EQ(b.pod_namespace, "ml-dev");
  EXPECT_EQ(b.pod_name, "crio-pod");
  PodNames c = read_pod_names(state.path(), docker);
  EXPECT_EQ(c.pod_namespace, "legacy");
  EXPECT_EQ(c.pod_name, "old-pod");
  PodNames none = read_pod_names(state.path(), absent);
  EXPECT_EQ(none.pod_namespace, "");
  // An id that is not hex never becomes a path.
  write(state.file("run/containerd/io.containerd.runtime.v2.task/k8s.io/../config.json"),
        R"({"annotations":{"io.kubernetes.cri.sandbox-namespace":"escaped"}})");
  EXPECT_EQ(read_pod_names(state.path(), "..").pod_namespace, "");

  // Through read_identity: the cgroup names the container; the runtime's
  // record wins over the environment, which the process's user writes.
  testing::TempDir root;
  write(root.file("5/stat"), "5 (train) S 1 5 5 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 9 0 333 1 2 3\n");
  write(root.file("5/cgroup"),
        "0::/kubepods.slice/kubepods-pod0123abcd_4567_89ab_cdef_0123456789ab.slice/cri-containerd-" + containerd +
            ".scope\n");
  write(root.file("5/environ"), environ_of({"POD_NAME=from-env"}));
  auto id = read_identity(root.path(), 5, state.path());
  ASSERT_TRUE(id);
  EXPECT_EQ(id->pod_namespace, "ml-prod");
  EXPECT_EQ(id->pod_name, "trainer-\xc3\xa9-0");
  auto without = read_identity(root.path(), 5);
  ASSERT_TRUE(without);
  EXPECT_EQ(without->pod_namespace, "");
}

TEST(PodNames, JsonStringValuesTakesOnlyStringsAndStopsAtBrokenText) {
  auto values = json_string_values(R"({"a":1,"b":"two","c":{"d":"x\"y\\z\n\ud83d\ude00"},"e":["f","g"],"h":null})",
                                   {"a", "b", "d", "e", "f", "h"});
  EXPECT_EQ(values.count("a"), 0u);  // a number
  EXPECT_EQ(values["b"], "two");
  EXPECT_EQ(values["d"], "x\"y\\z\n\xf0\x9f\x98\x80");
  EXPECT_EQ(values.count("e"), 0u);  // an array
  EXPECT_EQ(values.count("f"), 0u);  // an array element, not a key
  EXPECT_EQ(values.count("h"), 0u);
  // The first value wins; an unterminated string ends the reading.
  auto broken = json_string_values(R"({"k":"first","k":"second","m":"cut)", {"k", "m"});
  EXPECT_EQ(broken["k"], "first");
  EXPECT_EQ(broken.count("m"), 0u);
  EXPECT_TRUE(json_string_values("", {"k"}).empty());
  EXPECT_TRUE(json_string_values(R"("k":"\q")", {"k"}).empty());
}

}  // namespace
}  // namespace rankscope::agent

namespace rankscope::agent {
namespace {

// mountinfo lines as the kernel writes them (proc(5)).
TEST(CpuThrottling, CgroupV1QuotaAndThrottlingFromTheCpuHierarchy) {
  testing::TempDir root;
  std::string cpu = root.file("sys/fs/cgroup/cpu,cpuacct");
  write(root.file("mountinfo"),
        "30 25 0:26 / " + root.file("sys/fs/cgroup/unified") + " rw,nosuid shared:5 - cgroup2 cgroup2 rw\n"
        "36 25 0:31 / " + cpu + " rw,nosuid shared:14 - cgroup cgroup rw,cpu,cpuacct\n"
        "37 25 0:32 / " + root.file("sys/fs/cgroup/memory") + " rw shared:15 - cgroup cgroup rw,memory\n");
  CgroupMounts mounts = read_cgroup_mounts(root.file("mountinfo"));
  EXPECT_EQ(mounts.cpu_v1, cpu);
  EXPECT_EQ(mounts.unified, root.file("sys/fs/cgroup/unified"));
  write(root.file("proc/41/cgroup"), "5:memory:/slurm/job_7\n4:cpu,cpuacct:/slurm/job_7/step_0\n0::/\n");
  write(cpu + "/slurm/job_7/step_0/cpu.stat", "nr_periods 1200\nnr_throttled 1000\nthrottled_time 85123456789\n");
  write(cpu + "/slurm/job_7/step_0/cpu.cfs_quota_us", "15000\n");
  write(cpu + "/slurm/job_7/step_0/cpu.cfs_period_us", "100000\n");
  auto t = read_cpu_throttling(root.file("proc"), 41, mounts);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->periods, 1200u);
  EXPECT_EQ(t->throttled_periods, 1000u);
  EXPECT_EQ(t->throttled_ns, 85123456789u);
  EXPECT_EQ(t->quota_millicpus, 150u);
}

TEST(CpuThrottling, CgroupV2CpuMaxAndMicrosecondsNoQuotaAndNoCgroup) {
  testing::TempDir root;
  std::string unified = root.file("sys/fs/cgroup");
  write(root.file("mountinfo"), "25 1 0:26 / " + unified + " rw,nosuid shared:5 - cgroup2 cgroup2 rw,nsdelegate\n");
  CgroupMounts mounts = read_cgroup_mounts(root.file("mountinfo"));
  EXPECT_EQ(mounts.cpu_v1, "");
  EXPECT_EQ(mounts.unified, unified);
  write(root.file("proc/42/cgroup"), "0::/kubepods.slice/pod-a/cri-containerd-1.scope\n");
  std::string dir = unified + "/kubepods.slice/pod-a/cri-containerd-1.scope";
  write(dir + "/cpu.stat", "usage_usec 9\nuser_usec 5\nsystem_usec 4\nnr_periods 50\nnr_throttled 20\nthrottled_usec 1500\n");
  write(dir + "/cpu.max", "250000 100000\n");
  auto t = read_cpu_throttling(root.file("proc"), 42, mounts);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->periods, 50u);
  EXPECT_EQ(t->throttled_periods, 20u);
  EXPECT_EQ(t->throttled_ns, 1'500'000u);
  EXPECT_EQ(t->quota_millicpus, 2500u);
  // No quota: "max".
  write(dir + "/cpu.max", "max 100000\n");
  EXPECT_EQ(read_cpu_throttling(root.file("proc"), 42, mounts)->quota_millicpus, 0u);
  // A process gone, or a cgroup without cpu.stat: nothing, no error.
  EXPECT_FALSE(read_cpu_throttling(root.file("proc"), 43, mounts));
  write(root.file("proc/44/cgroup"), "0::/elsewhere\n");
  EXPECT_FALSE(read_cpu_throttling(root.file("proc"), 44, mounts));
}

}  // namespace
}  // namespace rankscope::agent
