#include "node-agent/check.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <ostream>
#include <sstream>
#include <zmq.hpp>

#include "common/clock.h"
#include "common/log.h"
#include "node-agent/attach.h"
#include "nccl-profiler/ring.h"
#include "node-agent/discover.h"
#include "node-agent/identify.h"
#include "node-agent/transport.h"
#include "proto/agent_wire.h"
#include "proto/codec.h"

namespace rankscope::agent {

namespace {

struct Report {
  std::ostream& out;
  int problems = 0;

  void line(const char* what, bool ok, const std::string& detail, const std::string& fix = "") {
    out << (ok ? "  ok    " : "  FAIL  ") << what;
    for (size_t i = std::string(what).size(); i < 14; ++i) out << ' ';
    out << detail << "\n";
    if (!ok) {
      ++problems;
      if (!fix.empty()) out << "                      -> " << fix << "\n";
    }
  }
  // Works, less well than it could: said, with what to do, not a problem.
  void warn(const char* what, const std::string& detail, const std::string& fix) {
    out << "  warn  " << what;
    for (size_t i = std::string(what).size(); i < 14; ++i) out << ' ';
    out << detail << "\n                      -> " << fix << "\n";
  }
};

bool mounted(const std::string& fstype, const std::string& where) {
  std::ifstream mounts("/proc/mounts");
  std::string device, point, type;
  while (mounts >> device >> point >> type) {
    if (type == fstype && point == where) return true;
    mounts.ignore(4096, '\n');
  }
  return false;
}

// The effective capabilities, from /proc/self/status (CapEff, a hex mask).
uint64_t effective_capabilities() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("CapEff:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  return 0;
}

struct Reached {
  bool accepted = false;
  std::string detail;
  uint16_t clock_port = 0;  // where it answers clock probes apart (0: none)
};

// Says hello to the collector and waits for its answer.
Reached reach_collector(const Options& options) {
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::rcvtimeo, 3000);
  socket.set(zmq::sockopt::sndtimeo, 3000);
  curve::apply(socket, options.keys);
  socket.connect(options.collector);
  proto::Hello hello;
  hello.node = options.node;
  hello.instance_id = 1;
  std::string bytes = proto::encode_hello(hello);
  socket.send(zmq::buffer(bytes), zmq::send_flags::none);
  zmq::message_t reply;
  if (!socket.recv(reply, zmq::recv_flags::none))
    return {false, options.keys.enabled()
                       ? "no answer within 3 s: is it running, with CurveZMQ, is --collector-key its public key, and "
                         "is this node's public key in its allow-list?"
                       : "no answer within 3 s (plaintext: a collector with CurveZMQ does not answer --insecure)"};
  bool accepted = false;
  std::string reason;
  uint16_t clock_port = 0;
  auto read = proto::read_packed<wire::CollectorMessage>(
      std::string_view(static_cast<const char*>(reply.data()), reply.size()), proto::ReadLimits{}, [&](auto m) {
        if (m.which() != wire::CollectorMessage::HELLO_REPLY) return;
        accepted = m.getHelloReply().getAccepted();
        reason = m.getHelloReply().getReason();
        clock_port = m.getHelloReply().getClockPort();
      });
  if (!read) return {false, read.error().message};
  return {accepted, accepted ? "answers and accepts node " + options.node : "refuses: " + reason, clock_port};
}

// One clock probe to the port the collector named, at its host, as the
// agent sends them: whether it was answered, and its round trip.
void check_clock_port(Report& report, const Options& options, uint16_t port) {
  const std::string endpoint = proto::clock_probe_endpoint(options.collector, port);
  if (endpoint.empty()) return;
  zmq::context_t context(1);
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::rcvtimeo, 3000);
  curve::apply(socket, options.keys);
  socket.connect(endpoint);
  SystemClock clock;
  const uint64_t t1 = clock.monotonic_ns();
  (void)socket.send(zmq::buffer(proto::encode_clock_probe(t1)), zmq::send_flags::dontwait);
  zmq::message_t reply;
  const bool answered = socket.recv(reply, zmq::recv_flags::none).has_value();
  const uint64_t t4 = clock.monotonic_ns();
  if (answered) {
    report.line(
        "clock port", true,
        endpoint + ": probes answered apart from batches (round trip " + std::to_string((t4 - t1) / 1000) + " us)");
  } else {
    report.warn("clock port", endpoint + ": no answer within 3 s; the agent sends its clock probes on its connection",
                "open TCP port " + std::to_string(port) +
                    " from this node to the collector (a Service or NAT must forward that same number): there no "
                    "batch queues ahead of a probe, which a busy collector otherwise adds to this node's clock error");
  }
}

// The kernel, BTF, privileges and tracefs.
void check_host(Report& report) {
  utsname uts{};
  uname(&uts);
  int major = 0, minor = 0;
  std::sscanf(uts.release, "%d.%d", &major, &minor);
  bool kernel_ok = major > 5 || (major == 5 && minor >= 11);
  report.line("kernel", kernel_ok, uts.release,
              "rankscope needs Linux 5.11 or newer (BPF ring buffer, task-local storage in tracing programs)");

  struct stat st {};
  bool btf = stat("/sys/kernel/btf/vmlinux", &st) == 0;
  report.line("BTF", btf, btf ? "/sys/kernel/btf/vmlinux" : "/sys/kernel/btf/vmlinux is missing",
              "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y (distribution kernels since about 2020 are)");

  // CAP_BPF is 39, CAP_PERFMON 38, CAP_SYS_ADMIN 21 (linux/capability.h).
  uint64_t caps = effective_capabilities();
  bool admin = caps & (1ull << 21);
  bool bpf_caps = (caps & (1ull << 39)) && (caps & (1ull << 38));
  report.line("privileges", admin || bpf_caps,
              geteuid() == 0 ? "root" : (bpf_caps ? "CAP_BPF and CAP_PERFMON" : "neither root nor CAP_BPF + CAP_PERFMON"),
              "run the agent as root, or grant CAP_BPF, CAP_PERFMON, CAP_SYS_RESOURCE and CAP_SYS_PTRACE "
              "(deploy/systemd/rankscope-agent.service does)");

  bool tracefs = mounted("tracefs", "/sys/kernel/tracing") || mounted("debugfs", "/sys/kernel/debug");
  report.line("tracefs", true,
              tracefs ? "mounted" : "not mounted (not needed for uprobes; tracepoint probes will want it: "
                                    "mount -t tracefs nodev /sys/kernel/tracing)");
}

// Each library the agent would attach to now: the --nccl-lib paths, the
// standard install paths and what processes in scope map, each file once.
void check_libraries(Report& report, const Options& options, const Scope& scope, NcclProbes& probes) {
  std::vector<LibraryFile> libraries;
  for (const auto& path : options.nccl_libs) {
    auto library = Discovery::from_path(path);
    if (!library)
      report.line("library", false, path + ": no such file", "fix the --nccl-lib path");
    else
      libraries.push_back(*library);
  }
  for (const auto& path : Discovery::standard_locations())
    if (auto library = Discovery::from_path(path)) libraries.push_back(*library);
  // Each file once (lib64 is often a link to lib), as the agent does.
  Discovery discovery(options.proc_root);
  std::vector<LibraryFile> unique;
  for (const auto& library : libraries) {
    if (discovery.known(library)) continue;
    discovery.remember(library);
    unique.push_back(library);
  }
  libraries = std::move(unique);
  for (const auto& library : discovery.scan(scope)) libraries.push_back(library);
  int nccl = 0;
  for (const auto& library : libraries) {
    auto attached = probes.attach(library);
    std::string kind = library_kind_name(library.kind);
    if (attached) {
      nccl += library.kind == LibraryKind::nccl ? 1 : 0;
      std::string detail = library.path + ": " + kind + ", " + std::to_string(attached->functions.size()) +
                           (attached->functions.size() == 1 ? " function probed" : " functions probed");
      if (!attached->missing.empty()) detail += " (" + std::to_string(attached->missing.size()) + " absent)";
      report.line("library", true, detail);
    } else {
      report.line("library", false, library.path + ": " + attached.error().message);
    }
  }
  if (nccl == 0)
    report.line("library", true,
                "no libnccl found yet: processes that map one are found while the agent runs; give the path of "
                "your jobs' copy with --nccl-lib to catch their start (a wheel: "
                ".../site-packages/nvidia/nccl/lib/libnccl.so.2)");
}

// The keys, then a hello to the collector with them.
void check_collector(Report& report, const Options& options) {
  Options with_keys = options;
  if (auto keys = load_keys(with_keys); !keys) {
    report.line("keys", false, keys.error().message,
                "make this node's key pair with `rankscope keygen --role agent --name " + options.node +
                    " --out /etc/rankscope/agent`, copy the collector's collector.pub beside it, and add agent.pub "
                    "to the collector's allow-list");
  } else {
    report.line("keys", true, with_keys.insecure ? "--insecure: plaintext, no key" : "CurveZMQ, public key " + with_keys.keys.public_key);
  }
  const Reached reached = reach_collector(with_keys);
  report.line("collector", reached.accepted, options.collector + ": " + reached.detail,
              "start rankscope-collector there, or give its address with --collector");
  if (reached.accepted && reached.clock_port != 0) check_clock_port(report, with_keys, reached.clock_port);
}

bool maps_nccl(const std::string& proc_root, uint32_t pid) {
  std::ifstream maps(proc_root + "/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("/libnccl.so") != std::string::npos) return true;
  return false;
}

// `name`'s value in the process's environment, as the process started
// ("" when unset or unreadable); its bytes are the user's: only printable
// ASCII is kept, at most 200 bytes.
std::string environ_value(const std::string& proc_root, uint32_t pid, const std::string& name) {
  std::ifstream environ(proc_root + "/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string entry;
  while (std::getline(environ, entry, '\0')) {
    if (entry.compare(0, name.size() + 1, name + "=") != 0) continue;
    std::string value;
    for (char c : entry.substr(name.size() + 1, 200)) value.push_back(c >= ' ' && c <= '~' ? c : '?');
    return value;
  }
  return "";
}

// Whether rankscope's NCCL profiler plugin is loaded in process `pid` (its
// ring is among the process's descriptors) and read, or why it is not.
std::string profiler_state(const std::string& proc_root, uint32_t pid) {
  std::string why;
  if (auto start = read_start_time(proc_root, pid)) {
    // A ring its plugin is making right now is looked at again, a second at most.
    bool unfinished = false;
    auto ring = profiler::map_process_ring(proc_root, pid, *start, why, &unfinished);
    for (int tries = 0; !ring && unfinished && tries < 20; ++tries) {
      usleep(50'000);
      ring = profiler::map_process_ring(proc_root, pid, *start, why, &unfinished);
    }
    if (ring) {
      const uint32_t reader = ring->header->reader.load();
      const uint64_t written = ring->header->written.load(), dropped = ring->header->dropped.load();
      profiler::unmap_ring(*ring);
      const std::string chain = environ_value(proc_root, pid, "RANKSCOPE_NCCL_PROFILER_CHAIN");
      return "rankscope's NCCL profiler plugin is loaded; its ring is " +
             (reader ? "read by the agent (pid " + std::to_string(reader) + ")"
                     : std::string("not read (no agent reads it: its events are only counted)")) +
             ", " + std::to_string(written) + " records written, " + std::to_string(dropped) + " dropped" +
             (chain.empty() ? "" : "; chained to " + chain);
    }
  }
  if (!why.empty()) return "its profiler ring is refused: " + why;
  const std::string plugin = environ_value(proc_root, pid, "NCCL_PROFILER_PLUGIN");
  if (plugin.empty() || plugin == "none")
    return "no profiler plugin (NCCL_PROFILER_PLUGIN is not set): host timing only";
  if (plugin.find("rankscope") != std::string::npos)
    return "NCCL_PROFILER_PLUGIN=" + plugin +
           ", but no ring: NCCL loads the plugin at the process's first communicator, or could not load it "
           "(NCCL_DEBUG=INFO says why)";
  return "another profiler plugin (NCCL_PROFILER_PLUGIN=" + plugin +
         "): host timing only (NCCL loads one profiler plugin per process; to keep it, name rankscope's in "
         "NCCL_PROFILER_PLUGIN and it in RANKSCOPE_NCCL_PROFILER_CHAIN)";
}

// Each NCCL process in scope: is rankscope's profiler plugin loaded (the GPU
// side, docs/gpu-timing.md)? Told, not a problem: a job may run without it.
void check_profiler(Report& report, const Options& options, const Scope& scope) {
  constexpr size_t kShown = 20;
  std::vector<uint32_t> pids;
  if (DIR* d = opendir(options.proc_root.c_str())) {
    while (dirent* entry = readdir(d)) {
      char* end = nullptr;
      const unsigned long pid = std::strtoul(entry->d_name, &end, 10);
      if (*end == '\0' && pid > 0 && pid != static_cast<unsigned long>(getpid())) pids.push_back(static_cast<uint32_t>(pid));
    }
    closedir(d);
  }
  std::sort(pids.begin(), pids.end());
  Discovery discovery(options.proc_root);
  size_t nccl = 0;
  for (uint32_t pid : pids) {
    if (!discovery.in_scope(scope, pid) || !maps_nccl(options.proc_root, pid)) continue;
    if (++nccl > kShown) continue;
    report.line("GPU side", true, "process " + std::to_string(pid) + ": " + profiler_state(options.proc_root, pid));
  }
  if (nccl > kShown) report.line("GPU side", true, std::to_string(nccl - kShown) + " more NCCL processes not listed");
  if (nccl == 0)
    report.line("GPU side", true,
                "no NCCL process in scope now; a job loads rankscope's NCCL profiler plugin with "
                "NCCL_PROFILER_PLUGIN=<path of librankscope-nccl-profiler.so> (docs/gpu-timing.md)");
}

}  // namespace

int run_check(const Options& options, std::ostream& out) {
  Report report{out};
  out << "rankscope-agent check, node " << options.node << "\n";
  check_host(report);
  auto scope = resolve_scope(options);
  report.line("scope", scope.ok(), scope ? scope->describe() : scope.error().message);
  if (!scope) scope = Scope{};

  auto probes = NcclProbes::open(
      *scope, [](const void*, size_t) {}, options.host_context, options.multi_uprobes);
  report.line("BPF programs", probes.ok(), probes ? "loaded and verified" : probes.error().message);
  if (probes)
    report.line("uprobes", true,
                (*probes)->multi_uprobes() ? "multi-uprobe links (Linux 6.6+): one per program and library"
                                           : std::string("one perf event per uprobe (") +
                                                 (options.multi_uprobes ? "kernel before 6.6" : "--multi-uprobes=0") +
                                                 "): the agent takes about 0.1 s a uprobe to stop");
  if (probes && options.host_context) {
    const auto& host = (*probes)->host_probes();
    std::string attached;
    for (const auto& what : host) attached += (attached.empty() ? "" : "; ") + what;
    report.line("host context", host.size() == 3, host.empty() ? "no scheduler or TCP tracepoint attached" : attached,
                "needs tp_btf support (Linux 5.5+ with BTF); without it off-CPU time and run-queue latency come "
                "from /proc only and TCP retransmits are not counted");
  }
  if (probes) check_libraries(report, options, *scope, **probes);
  check_profiler(report, options, *scope);
  check_collector(report, options);
  out << (report.problems == 0 ? "ready: this node can be traced\n"
                               : "not ready: " + std::to_string(report.problems) + " problem(s) above\n");
  return report.problems == 0 ? 0 : 1;
}

}  // namespace rankscope::agent
