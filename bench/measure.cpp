#include "bench/measure.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace rankscope::bench {

uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

Spread spread_of(std::vector<double> values) {
  Spread out;
  if (values.empty()) return out;
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  out.median = n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  out.min = values.front();
  out.max = values.back();
  return out;
}

uint64_t ticks_per_second() {
  long ticks = sysconf(_SC_CLK_TCK);
  return ticks > 0 ? static_cast<uint64_t>(ticks) : 100;
}

Result<CpuTime> cpu_time_of(pid_t pid) {
  std::string base = "/proc/" + std::to_string(pid);
  std::ifstream stat(base + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return make_error(Errc::not_found, "process " + std::to_string(pid) + " is gone");
  // The command name (field 2) may hold spaces and parentheses: count the
  // fields from the last ')' (proc(5)); utime and stime are fields 14 and 15.
  size_t close = line.rfind(')');
  if (close == std::string::npos) return make_error(Errc::protocol, base + "/stat is not in the proc(5) format");
  std::istringstream fields(line.substr(close + 2));
  std::string field;
  CpuTime out;
  for (int index = 3; index <= 15 && fields >> field; ++index) {
    if (index == 14 || index == 15) out.stat_ticks += std::stoull(field);
  }
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator(base + "/task", error)) {
    std::ifstream schedstat(task.path() / "schedstat");
    uint64_t on_cpu_ns = 0;
    if (schedstat >> on_cpu_ns) out.runtime_ns += on_cpu_ns;
  }
  return out;
}

Result<Child> Child::start(const std::vector<std::string>& argv, const std::string& log_path) {
  int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) return make_error(Errc::io, "cannot create " + log_path + ": " + std::strerror(errno));
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    ::close(log);
    return make_error(Errc::system, std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    execv(args[0], args.data());
    dprintf(STDERR_FILENO, "cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  ::close(log);
  Child child;
  child.pid_ = pid;
  return child;
}

Child::Child(Child&& other) noexcept : pid_(other.pid_), reaped_(other.reaped_), status_(other.status_) {
  other.pid_ = -1;
}

Child& Child::operator=(Child&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0 && !reaped_) stop(2000);
    pid_ = other.pid_;
    reaped_ = other.reaped_;
    status_ = other.status_;
    other.pid_ = -1;
  }
  return *this;
}

Child::~Child() {
  if (pid_ > 0 && !reaped_) stop(5000);
}

bool Child::running() {
  if (pid_ <= 0 || reaped_) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    reaped_ = true;
    status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }
  return true;
}

int Child::stop(int grace_ms) {
  if (pid_ <= 0) return -1;
  if (reaped_) return status_;
  kill(pid_, SIGTERM);
  uint64_t deadline = monotonic_ns() + static_cast<uint64_t>(grace_ms) * 1000000ull;
  while (running() && monotonic_ns() < deadline) usleep(2000);
  if (!reaped_) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  return status_;
}

bool has_breakpoint(const void* code) { return *static_cast<const volatile uint8_t*>(code) == 0xCC; }

Result<int> free_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error(Errc::system, std::string("socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(fd);
    return make_error(Errc::system, std::string("no free port on 127.0.0.1: ") + std::strerror(errno));
  }
  ::close(fd);
  return static_cast<int>(ntohs(address.sin_port));
}

}  // namespace rankscope::bench
