#include "tests/support/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#ifndef RANKSCOPE_BIN_DIR
#error "RANKSCOPE_BIN_DIR must be defined by the build"
#endif

extern char** environ;

namespace rankscope::testing {

bool wait_for(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return condition();
}

void observe_for(std::chrono::milliseconds window) { std::this_thread::sleep_for(window); }

std::string unique_name(const std::string& prefix) {
  static std::atomic<int> counter{0};
  return prefix + std::to_string(getpid() % 100000) + "x" + std::to_string(counter++);
}

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "rankscope-test-XXXXXX").string();
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) abort();
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

Process::Process(const SpawnOptions& options) {
  std::vector<std::string> argv;
  if (!options.netns.empty()) argv = {"/usr/bin/ip", "netns", "exec", options.netns};
  argv.insert(argv.end(), options.argv.begin(), options.argv.end());
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string entry(*e);
    size_t eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [k, v] : options.env) env[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);

  pid_ = fork();
  if (pid_ == 0) {
    setpgid(0, 0);
    std::string out = options.stdout_path.empty() ? "/dev/null" : options.stdout_path;
    std::string err = options.stderr_path.empty() ? out : options.stderr_path;
    int out_fd = open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    int err_fd = err == out ? out_fd : open(err.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (out_fd >= 0) dup2(out_fd, 1);
    if (err_fd >= 0) dup2(err_fd, 2);
    int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, 0);
    std::vector<char*> args, envp;
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
}

Process::Process(Process&& other) noexcept
    : pid_(other.pid_), status_(other.status_), reaped_(other.reaped_) {
  other.pid_ = -1;
}

Process::~Process() {
  if (pid_ > 0 && !reaped_) {
    // The whole process group: a program that forked workers (stress-ng)
    // must not leave them running into the next test.
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);
    kill(pid_, SIGCONT);
    waitpid(pid_, &status_, 0);
  } else if (pid_ > 0) {
    kill(-pid_, SIGKILL);
  }
}

bool Process::running() {
  if (pid_ <= 0 || reaped_) return false;
  pid_t r = waitpid(pid_, &status_, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    return false;
  }
  return true;
}

void Process::signal(int sig) {
  if (pid_ > 0 && !reaped_) kill(pid_, sig);
}

int Process::wait(std::chrono::milliseconds timeout) {
  if (!wait_for([&] { return !running(); }, timeout)) return -1;
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -1;
}

int run_command(const std::string& command) {
  int status = system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::set<long> live_pid_numbers() {
  std::set<long> live;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.empty() && name.find_first_not_of("0123456789") == std::string::npos)
      live.insert(std::stol(name) % 100000);
  }
  return live;
}

int remove_stale_netns_clusters() {
  const std::set<long> live = live_pid_numbers();
  std::error_code ec;
  static const std::regex kOurs("^(rst([0-9]+)x[0-9]+)-(sw|[0-9]+)$");
  std::set<std::string> stale;
  for (const auto& entry : std::filesystem::directory_iterator("/run/netns", ec)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, kOurs) && live.count(std::stol(m[2].str())) == 0) stale.insert(m[1].str());
  }
  for (const auto& prefix : stale)
    run_command(std::string(RANKSCOPE_SOURCE_DIR) + "/scripts/netns-cluster.sh down " + prefix + " >/dev/null 2>&1");
  return static_cast<int>(stale.size());
}

NetnsCluster::NetnsCluster(int nodes) : prefix_(unique_name("rst")) {
  remove_stale_netns_clusters();
  std::string script = std::string(RANKSCOPE_SOURCE_DIR) + "/scripts/netns-cluster.sh";
  ok_ = run_command(script + " up " + prefix_ + " " + std::to_string(nodes) + " >/dev/null 2>&1") == 0;
}

NetnsCluster::~NetnsCluster() {
  run_command(std::string(RANKSCOPE_SOURCE_DIR) + "/scripts/netns-cluster.sh down " + prefix_ + " >/dev/null 2>&1");
}

std::string bin_path(const std::string& name) { return std::string(RANKSCOPE_BIN_DIR) + "/" + name; }

namespace {

// The lowest port the kernel hands out for outgoing connections and bind(0)
// (net.ipv4.ip_local_port_range), 32768 unless configured otherwise.
int ephemeral_low() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  if (range >> low && low > 2048) return low;
  return 32768;
}

bool bindable(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace

int free_port() {
  // Below the ephemeral range: a port from bind(0) is one the kernel may give
  // the next outgoing connection of any process (ours or a test running
  // beside us) before our daemon binds it. Drawn at random so that tests run
  // in parallel rarely draw the same one.
  static std::atomic<uint64_t> draws{0};
  int low = 10000, high = ephemeral_low() - 1;
  if (high - low < 1000) low = 1024;
  uint64_t seed = static_cast<uint64_t>(getpid()) << 32 ^
                  static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  for (int attempt = 0; attempt < 200; ++attempt) {
    uint64_t x = seed + 0x9E3779B97F4A7C15ULL * ++draws;  // splitmix64
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    x ^= x >> 31;
    int port = low + static_cast<int>(x % static_cast<uint64_t>(high - low + 1));
    if (bindable(port)) return port;
  }
  // Every draw taken: what the kernel picks, as a last resort.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string cgroup2_root() {
  struct stat st {};
  if (stat("/sys/fs/cgroup/unified/cgroup.procs", &st) == 0) return "/sys/fs/cgroup/unified";
  return "/sys/fs/cgroup";
}

std::optional<CpuController> cpu_controller() {
  if (std::filesystem::exists("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")) return CpuController{"/sys/fs/cgroup/cpu", false};
  std::string unified = cgroup2_root();
  if (slurp(unified + "/cgroup.controllers").find("cpu") != std::string::npos) return CpuController{unified, true};
  return std::nullopt;
}

void set_cpu_quota(const CpuController& controller, const std::string& group, double cpus) {
  const auto quota = std::to_string(static_cast<long>(cpus * 100000));
  if (controller.v2) {
    std::ofstream(group + "/cpu.max") << quota << " 100000";
  } else {
    std::ofstream(group + "/cpu.cfs_period_us") << "100000";
    std::ofstream(group + "/cpu.cfs_quota_us") << quota;
  }
}

CgroupTree::~CgroupTree() {
  for (auto it = made_.rbegin(); it != made_.rend(); ++it) {
    // A process left inside (a failed test) would keep the directory busy.
    std::string procs = slurp(*it + "/cgroup.procs");
    size_t start = 0;
    while (start < procs.size()) {
      size_t end = procs.find('\n', start);
      if (end == std::string::npos) end = procs.size();
      std::string pid = procs.substr(start, end - start);
      if (!pid.empty()) {
        kill(std::stoi(pid), SIGKILL);
        FILE* root = std::fopen((root_ + "/cgroup.procs").c_str(), "w");
        if (root) {
          std::fputs(pid.c_str(), root);
          std::fclose(root);
        }
      }
      start = end + 1;
    }
    // A killed process leaves its cgroup only once it has exited: on a busy
    // machine (a test's CPU hogs dying) that takes a moment.
    for (int tries = 0; rmdir(it->c_str()) != 0 && errno == EBUSY && tries < 500; ++tries) usleep(10'000);
  }
}

std::string CgroupTree::make(const std::string& relative) {
  std::string path = root_;
  size_t start = 0;
  while (start < relative.size()) {
    size_t end = relative.find('/', start);
    if (end == std::string::npos) end = relative.size();
    path += "/" + relative.substr(start, end - start);
    if (mkdir(path.c_str(), 0755) == 0) made_.push_back(path);
    start = end + 1;
  }
  return path;
}

}  // namespace rankscope::testing
