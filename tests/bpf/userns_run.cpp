// Runs a program in a user namespace of its own, as newuidmap(1) sets one
// up for a rootless container: the namespace is made by --owner (an
// unprivileged user, or root), and root maps --count ids from 0 inside it
// to --base outside, the owner's subordinate ids. The program runs as --as
// inside (kernel uid --base + --as). Test support for the agent's per-user
// shares (tests/bpf/capture_test.cpp); runs as root.
//
//   rankscope-userns-run --owner UID --base ID --count N --as ID -- PROGRAM [ARGS...]
//
// The program keeps this process's pid (exec), so a test follows it by the
// pid it started.
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "rankscope-userns-run: %s: %s\n", what, std::strerror(errno));
  std::exit(125);
}

bool write_file(const std::string& path, const std::string& text) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  long owner = -1, base = -1, count = -1, as = -1;
  int i = 1;
  for (; i + 1 < argc && std::strcmp(argv[i], "--") != 0; i += 2) {
    long value = std::strtol(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--owner") == 0) owner = value;
    else if (std::strcmp(argv[i], "--base") == 0) base = value;
    else if (std::strcmp(argv[i], "--count") == 0) count = value;
    else if (std::strcmp(argv[i], "--as") == 0) as = value;
  }
  if (i >= argc || std::strcmp(argv[i], "--") != 0 || i + 1 >= argc || owner < 0 || base < 0 || count <= 0 ||
      as < 0 || as >= count) {
    std::fprintf(stderr,
                 "usage: rankscope-userns-run --owner UID --base ID --count N --as ID -- PROGRAM [ARGS...] "
                 "(0 <= --as < --count)\n");
    return 2;
  }
  int unshared[2], mapped[2];
  if (pipe2(unshared, O_CLOEXEC) != 0 || pipe2(mapped, O_CLOEXEC) != 0) fail("pipe");
  const pid_t self = getpid();
  const pid_t mapper = fork();
  if (mapper < 0) fail("fork");
  if (mapper == 0) {
    // Root, outside: once the namespace exists, write its maps (what
    // newuidmap and newgidmap do, as root, for the user who made it).
    char byte = 0;
    if (read(unshared[0], &byte, 1) != 1) _exit(1);
    const std::string map = "0 " + std::to_string(base) + " " + std::to_string(count) + "\n";
    const std::string proc = "/proc/" + std::to_string(self);
    byte = write_file(proc + "/uid_map", map) && write_file(proc + "/gid_map", map) ? 1 : 0;
    if (write(mapped[1], &byte, 1) != 1) _exit(1);
    _exit(byte ? 0 : 1);
  }
  if (owner != 0) {
    if (setgroups(0, nullptr) != 0) fail("setgroups");
    if (setresgid(owner, owner, owner) != 0) fail("setresgid (owner)");
    if (setresuid(owner, owner, owner) != 0) fail("setresuid (owner)");
  }
  if (unshare(CLONE_NEWUSER) != 0) fail("unshare(CLONE_NEWUSER)");
  char byte = 1;
  if (write(unshared[1], &byte, 1) != 1) fail("write to the mapper");
  if (read(mapped[0], &byte, 1) != 1 || byte != 1) {
    std::fprintf(stderr, "rankscope-userns-run: the uid and gid maps could not be written\n");
    return 125;
  }
  int status = 0;
  waitpid(mapper, &status, 0);
  if (setresgid(as, as, as) != 0) fail("setresgid (inside)");
  if (setresuid(as, as, as) != 0) fail("setresuid (inside)");
  execvp(argv[i + 1], argv + i + 1);
  fail("exec");
}
