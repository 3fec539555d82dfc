// rankscope-bench-overhead: the cost the node agent adds to one NCCL call,
// next to the floor of any uprobe tracer on this kernel, in one run.
//
//   floor  = (no-op call with a bare uprobe + uretprobe) - (no-op call)
//   added  = (ncclAllReduce traced by rankscope-agent) - (ncclAllReduce alone)
//
// and, to tell what any tracer pays on this particular function from what
// the agent's own work costs, the bare pair on ncclAllReduce itself.
//
// Every call is timed on its own; a loop is summarised by its mean and by
// its median call. Each repetition measures the loops back to back (the
// floor before the NCCL loops and again right after the traced one), so
// drift of the machine hits both sides of each difference alike; the report
// gives the median and the range over the repetitions, and the ratio per
// repetition. Then a paced run issues collectives at a fixed rate with the
// agent attached and reads the agent's CPU time from /proc, next to the
// same agent idle. Last, a node's ranks: several processes, each calling
// at a fixed rate, untraced and traced in alternation, for the agent's CPU
// and what it adds to each call when it follows many processes at once.
//
// The NCCL calls are real calls into libnccl.so.2 (by default the fakenccl
// stand-in: a one-rank communicator, a one-element in-place AllReduce),
// made inside a group by default (NcclLoop::time says why). The agent is
// the real daemon, started with --pid <this process>, sending to a real
// collector.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench/measure.h"
#include "bench_noop.skel.h"
#include "common/curve.h"
#include "common/log.h"
#include "proto/query.capnp.h"
#include "tools/cli/client.h"

extern "C" uint64_t rankscope_bench_noop(uint64_t value);
extern "C" uint64_t rankscope_bench_noop_stepped(uint64_t value);

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace rankscope::bench {
namespace {

struct Options {
  int reps = 7;
  uint64_t noop_calls = 20000;   // per timed no-op loop
  uint64_t nccl_calls = 20000;   // per timed NCCL loop
  uint64_t chunk = 1000;         // NCCL calls between two (untimed) stream synchronizes
  uint64_t blocks = 20;          // blocks of the traced loop and the floor, alternated
  bool grouped = true;           // each chunk inside ncclGroupStart/ncclGroupEnd (untimed)
  uint64_t warmup = 1000;        // untimed calls before each timed loop
  double paced_rate = 10000;     // collective calls per second in the paced run
  double paced_seconds = 10;
  double idle_seconds = 5;       // the same agent with no calls, for comparison
  uint64_t paced_sync_every = 100;
  int ranks = 8;              // processes in the ranks run (0: none)
  double rank_rate = 1000;    // collective calls per second of each
  double ranks_seconds = 10;  // length of each of its runs
  int ranks_reps = 2;         // untraced and traced runs, alternated
  std::string bin_dir = RANKSCOPE_BIN_DIR;
  std::string nccl_lib = std::string(RANKSCOPE_FAKENCCL_DIR) + "/libnccl.so.2";
  std::vector<std::string> agent_args;  // extra flags for rankscope-agent
  std::string json;
  bool keep = false;
};

// ---------------------------------------------------------------- the floor

using NoopFunction = uint64_t (*)(uint64_t);

// The bare uprobe + uretprobe pair of bench/noop.bpf.c on a function of
// bench/noop.c.
class NoopProbes {
 public:
  static Result<std::unique_ptr<NoopProbes>> open() {
    std::unique_ptr<NoopProbes> probes(new NoopProbes());
    probes->skel_ = bench_noop__open_and_load();
    if (!probes->skel_)
      return make_error(Errc::system, std::string("loading bench/noop.bpf.c: ") + std::strerror(errno) +
                                          " (eBPF needs root)");
    Dl_info info{};
    if (!dladdr(reinterpret_cast<void*>(&rankscope_bench_noop), &info) || !info.dli_fname)
      return make_error(Errc::not_found, "cannot find the library that holds rankscope_bench_noop");
    probes->library_ = fs::canonical(info.dli_fname).string();
    return probes;
  }
  ~NoopProbes() {
    detach();
    if (skel_) bench_noop__destroy(skel_);
  }

  // As the agent does: by file and symbol, for every process (pid -1). The
  // library is bench/noop.c's unless one is named.
  Result<void> attach(const char* function, const std::string& library = {}) {
    const std::string& file = library.empty() ? library_ : library;
    LIBBPF_OPTS(bpf_uprobe_opts, entry, .retprobe = false, .func_name = function);
    LIBBPF_OPTS(bpf_uprobe_opts, ret, .retprobe = true, .func_name = function);
    entry_ = bpf_program__attach_uprobe_opts(skel_->progs.noop_enter, -1, file.c_str(), 0, &entry);
    if (!entry_) return make_error(Errc::system, "uprobe on " + std::string(function) + ": " + std::strerror(errno));
    return_ = bpf_program__attach_uprobe_opts(skel_->progs.noop_return, -1, file.c_str(), 0, &ret);
    if (!return_) return make_error(Errc::system, "uretprobe on " + std::string(function) + ": " + std::strerror(errno));
    return {};
  }
  void detach() {
    if (entry_) bpf_link__destroy(entry_);
    if (return_) bpf_link__destroy(return_);
    entry_ = return_ = nullptr;
  }

 private:
  NoopProbes() = default;
  bench_noop* skel_ = nullptr;
  bpf_link* entry_ = nullptr;
  bpf_link* return_ = nullptr;
  std::string library_;
};

// One timed loop: every call's own time (one clock read per call, so the
// intervals tile the loop), summarised two ways. The mean is what the loop
// cost per call, everything included; the median is the typical call,
// untouched by the rare call that wakes a thread, takes a page fault or
// loses its CPU to another VM on the host.
struct LoopTime {
  double mean = 0, median = 0;
  double switches = 0;  // context switches of this process per call (NCCL loops)
};

class CallTimes {
 public:
  void reserve(uint64_t calls) { ns_.reserve(ns_.size() + calls); }
  void add(uint64_t ns) { ns_.push_back(ns); }
  void add_switches(uint64_t n) { switches_ += n; }
  LoopTime summary() const {
    LoopTime t;
    if (ns_.empty()) return t;
    uint64_t sum = 0;
    for (uint64_t v : ns_) sum += v;
    std::vector<uint64_t> sorted = ns_;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    t.mean = static_cast<double>(sum) / static_cast<double>(ns_.size());
    t.median = static_cast<double>(sorted[sorted.size() / 2]);
    t.switches = static_cast<double>(switches_) / static_cast<double>(ns_.size());
    return t;
  }

 private:
  std::vector<uint64_t> ns_;
  uint64_t switches_ = 0;
};

// `calls` calls of a no-op function, each timed, added to `times`.
void time_noop_into(CallTimes& times, NoopFunction function, uint64_t calls) {
  times.reserve(calls);
  uint64_t sink = 0;
  uint64_t last = monotonic_ns();
  for (uint64_t i = 0; i < calls; ++i) {
    sink = function(sink);
    uint64_t now = monotonic_ns();
    times.add(now - last);
    last = now;
  }
  if (sink != calls) std::abort();  // the calls were made
}

LoopTime time_noop(NoopFunction function, uint64_t calls) {
  CallTimes times;
  time_noop_into(times, function, calls);
  return times.summary();
}

// ---------------------------------------------------------------- BPF program time

// The kernel's own account of the time each loaded BPF program ran
// (kernel.bpf_stats: on only while the descriptor of bpf_enable_stats is
// open, and it adds two clock reads to every run, so the timed loops run
// without it).
struct ProgCounters {
  std::string name;  // truncated to 15 characters by the kernel
  uint64_t run_ns = 0, runs = 0;
};

std::map<uint32_t, ProgCounters> prog_counters() {
  std::map<uint32_t, ProgCounters> out;
  uint32_t id = 0;
  while (bpf_prog_get_next_id(id, &id) == 0) {
    int fd = bpf_prog_get_fd_by_id(id);
    if (fd < 0) continue;
    bpf_prog_info info{};
    uint32_t length = sizeof(info);
    if (bpf_obj_get_info_by_fd(fd, &info, &length) == 0) out[id] = {info.name, info.run_time_ns, info.run_cnt};
    close(fd);
  }
  return out;
}

// ns per run of the program called `name` that ran `calls` times (give or
// take 1%) between the two snapshots: other tracers on the machine may load
// programs of the same name, and they did not run in our loop.
std::optional<double> ns_per_run(const std::map<uint32_t, ProgCounters>& before,
                                 const std::map<uint32_t, ProgCounters>& after, const std::string& name,
                                 uint64_t calls) {
  for (const auto& [id, end] : after) {
    if (name.compare(0, 15, end.name) != 0) continue;
    auto start = before.find(id);
    uint64_t runs = end.runs - (start == before.end() ? 0 : start->second.runs);
    uint64_t run_ns = end.run_ns - (start == before.end() ? 0 : start->second.run_ns);
    if (runs >= calls && runs <= calls + calls / 100 + 1) return static_cast<double>(run_ns) / static_cast<double>(runs);
  }
  return std::nullopt;
}

// Every other program that ran between the two snapshots (the agent's
// scheduler tracepoints, fired by the calls' own wakeups and switches, and
// anything else on the machine), per call of the loop.
struct OtherProgram {
  std::string name;
  double runs_per_call = 0, ns_per_call = 0;
};

std::vector<OtherProgram> other_programs(const std::map<uint32_t, ProgCounters>& before,
                                         const std::map<uint32_t, ProgCounters>& after,
                                         const std::vector<std::string>& except, uint64_t calls) {
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_name;  // runs, ns
  for (const auto& [id, end] : after) {
    bool excepted = false;
    for (const auto& name : except) excepted = excepted || name.compare(0, 15, end.name) == 0;
    if (excepted) continue;
    auto start = before.find(id);
    uint64_t runs = end.runs - (start == before.end() ? 0 : start->second.runs);
    uint64_t run_ns = end.run_ns - (start == before.end() ? 0 : start->second.run_ns);
    if (runs == 0) continue;
    by_name[end.name].first += runs;
    by_name[end.name].second += run_ns;
  }
  std::vector<OtherProgram> out;
  for (const auto& [name, totals] : by_name)
    out.push_back({name, static_cast<double>(totals.first) / static_cast<double>(calls),
                   static_cast<double>(totals.second) / static_cast<double>(calls)});
  return out;
}

// ---------------------------------------------------------------- NCCL calls

// A one-rank communicator, its stream and a one-element buffer: made and
// destroyed per loop, so that an agent attached in between sees the
// communicator created, as it would in a job it traces from the start.
class NcclLoop {
 public:
  // `grouped`: the timed calls are made inside a group (see time()).
  static Result<std::unique_ptr<NcclLoop>> open(bool grouped = false) {
    std::unique_ptr<NcclLoop> loop(new NcclLoop());
    loop->grouped_ = grouped;
    ncclUniqueId id;
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return nccl_error("ncclGetUniqueId", r);
    if (ncclResult_t r = ncclCommInitRank(&loop->comm_, 1, id, 0); r != ncclSuccess)
      return nccl_error("ncclCommInitRank", r);
    if (cudaStreamCreate(&loop->stream_) != cudaSuccess) return make_error(Errc::system, "cudaStreamCreate failed");
    if (cudaMalloc(reinterpret_cast<void**>(&loop->buffer_), sizeof(float)) != cudaSuccess)
      return make_error(Errc::system, "cudaMalloc failed");
    return loop;
  }
  ~NcclLoop() {
    if (stream_) cudaStreamSynchronize(stream_);
    if (comm_) ncclCommDestroy(comm_);
    if (buffer_) cudaFree(buffer_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  ncclResult_t call() { return ncclAllReduce(buffer_, buffer_, 1, ncclFloat, ncclSum, comm_, stream_); }
  bool sync() { return cudaStreamSynchronize(stream_) == cudaSuccess; }
  bool call_and_sync() { return call() == ncclSuccess && sync(); }

  // `calls` calls, each timed, in chunks; the stream is drained between
  // chunks, outside the timed part. Also counts the context switches of the
  // whole process (this thread and the stream's worker) per call.
  //
  // Grouped, each chunk's calls are made between ncclGroupStart and
  // ncclGroupEnd (both untimed): a call then only checks its arguments and
  // appends itself to the group, as in NVIDIA's NCCL, and the work is
  // queued once at ncclGroupEnd. Ungrouped, every call queues work on the
  // stream, and fakenccl's stream is a host thread that must be woken when
  // it has gone to sleep (a GPU needs no such wakeup). How often it has gone
  // to sleep depends on how fast the calls come, so a traced call, slower,
  // paid for more wakeups than an untraced one: the difference of the two
  // loops then held a cost of the fake stream (0.06-0.09 context switches
  // per untraced call against 0.2-0.4 per traced call; each ~2-5 µs here),
  // and swung by ±0.5 µs from run to run. The agent's work per call is the
  // same either way: the same probes, programs and record, with the group
  // flag set.
  Result<void> time_into(CallTimes& times, uint64_t calls, uint64_t chunk) {
    times.reserve(calls);
    uint64_t switches_before = process_switches();
    for (uint64_t done = 0; done < calls;) {
      uint64_t n = std::min(chunk, calls - done);
      uint64_t failed = 0;
      if (grouped_ && ncclGroupStart() != ncclSuccess) return make_error(Errc::system, "ncclGroupStart failed");
      uint64_t last = monotonic_ns();
      for (uint64_t i = 0; i < n; ++i) {
        failed += call() != ncclSuccess;
        uint64_t now = monotonic_ns();
        times.add(now - last);
        last = now;
      }
      if (grouped_ && ncclGroupEnd() != ncclSuccess) return make_error(Errc::system, "ncclGroupEnd failed");
      if (failed) return make_error(Errc::system, std::to_string(failed) + " ncclAllReduce call(s) failed");
      if (!sync()) return make_error(Errc::system, "cudaStreamSynchronize failed");
      done += n;
    }
    times.add_switches(process_switches() - switches_before);
    return {};
  }
  Result<LoopTime> time(uint64_t calls, uint64_t chunk) {
    CallTimes times;
    if (auto r = time_into(times, calls, chunk); !r) return r.error();
    return times.summary();
  }

 private:
  NcclLoop() = default;
  static Error nccl_error(const char* what, ncclResult_t r) {
    return make_error(Errc::system, std::string(what) + ": " + ncclGetErrorString(r));
  }
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* buffer_ = nullptr;
  bool grouped_ = false;

  static uint64_t process_switches() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<uint64_t>(usage.ru_nvcsw + usage.ru_nivcsw);
  }
};

// ---------------------------------------------------------------- daemons

struct Deployment {
  Deployment(const Options& o, std::string folder) : options(o), dir(std::move(folder)) {}
  Options options;
  std::string dir;
  int agent_port = 0, query_port = 0;
  std::optional<Child> collector;
  int agents_started = 0;

  std::string agent_endpoint() const { return "tcp://127.0.0.1:" + std::to_string(agent_port); }
  std::string query_endpoint() const { return "tcp://127.0.0.1:" + std::to_string(query_port); }

  // CurveZMQ keys as deployed (its encryption is part of the agent's cost):
  // the collector's, the agent's (node "bench", admitted) and a client's.
  Result<void> make_keys() {
    std::error_code ec;
    std::filesystem::create_directories(dir + "/keys/allowed", ec);
    for (auto [name, role] : {std::pair{"collector", "collector"}, {"bench", "agent"}, {"bench-client", "client"}}) {
      auto key = curve::generate(name, role);
      if (!key) return key.error();
      if (auto r = curve::write(dir + "/keys/" + name, *key, true); !r) return r;
      if (std::string(role) != "collector")
        std::filesystem::copy_file(dir + "/keys/" + name + ".pub", dir + "/keys/allowed/" + name + ".pub",
                                   std::filesystem::copy_options::overwrite_existing, ec);
    }
    auto client = curve::load_client_keys(dir + "/keys/bench-client.key", dir + "/keys/collector.pub");
    if (!client) return client.error();
    client_keys = *client;
    return {};
  }
  curve::ClientKeys client_keys;

  Result<void> start_collector() {
    if (auto r = make_keys(); !r) return r;
    auto agent = free_port();
    auto query = free_port();
    if (!agent) return agent.error();
    if (!query) return query.error();
    agent_port = *agent;
    query_port = *query;
    auto child = Child::start({options.bin_dir + "/rankscope-collector", "--listen", agent_endpoint(), "--query",
                               query_endpoint(), "--db", dir + "/db", "--key", dir + "/keys/collector.key",
                               "--allow", dir + "/keys/allowed"},
                              dir + "/collector.log");
    if (!child) return child.error();
    collector.emplace(std::move(*child));
    return {};
  }

  // The agent, tracing this process (or the processes `pids`); returns once
  // its probe is on ncclAllReduce in this process.
  Result<Child> start_agent(const std::vector<pid_t>& pids = {}) {
    std::vector<std::string> argv = {options.bin_dir + "/rankscope-agent",
                                     "--collector",
                                     agent_endpoint(),
                                     "--node",
                                     "bench",
                                     "--nccl-lib",
                                     options.nccl_lib,
                                     "--spool-dir",
                                     dir + "/spool",
                                     "--key",
                                     dir + "/keys/bench.key",
                                     "--collector-key",
                                     dir + "/keys/collector.pub"};
    argv.push_back("--pid");
    if (pids.empty()) argv.push_back(std::to_string(getpid()));
    for (pid_t pid : pids) argv.push_back(std::to_string(pid));
    argv.insert(argv.end(), options.agent_args.begin(), options.agent_args.end());
    std::string log = dir + "/agent-" + std::to_string(++agents_started) + ".log";
    uint64_t earlier_instance = bench_instance();
    auto child = Child::start(argv, log);
    if (!child) return child.error();
    // Every probe this process's calls pass through (a communicator made
    // before the probe on its creation would be one the agent cannot
    // match), and the collector's welcome of this agent (a new instance of
    // node "bench"): then the loops may start.
    uint64_t deadline = monotonic_ns() + 20'000'000'000ull;
    while (!probed_functions().missing.empty() || bench_instance() == earlier_instance) {
      if (!child->running() || monotonic_ns() > deadline)
        return make_error(Errc::system, "rankscope-agent did not attach to " + probed_functions().missing +
                                            " or was not accepted by the collector; its log (" + log + "):\n" +
                                            slurp(log));
      usleep(5000);
    }
    return child;
  }

  // The NCCL entry points the loops call, by whether a uprobe is on them.
  struct Probed {
    std::string present, missing;  // names, space-separated
  };
  static Probed probed_functions() {
    Probed out;
    for (const char* name : {"ncclCommInitRank", "ncclAllReduce", "ncclCommDestroy"}) {
      void* code = dlsym(RTLD_DEFAULT, name);
      if (!code) continue;
      std::string& list = has_breakpoint(code) ? out.present : out.missing;
      list += (list.empty() ? "" : " ") + std::string(name);
    }
    return out;
  }

  // Waits (up to 30 s) until another agent that is stopping has retired its
  // uprobes from the functions the loops call; fails if one stays.
  static Result<void> wait_for_foreign_probes(const std::string& library) {
    for (int i = 0; i < 300 && !probed_functions().present.empty(); ++i) usleep(100000);
    if (auto present = probed_functions().present; !present.empty())
      return make_error(Errc::system, "something else has a uprobe on " + present + " in " + library +
                                          " (another rankscope-agent?): the loop without the agent would be traced");
    return {};
  }

  // The warnings and errors of every log of this run, for a failure report.
  std::string log_problems() const {
    std::string out;
    std::vector<std::string> logs = {dir + "/collector.log"};
    for (int i = 1; i <= agents_started; ++i) logs.push_back(dir + "/agent-" + std::to_string(i) + ".log");
    for (const auto& path : logs) {
      std::istringstream in(slurp(path));
      std::string line;
      int shown = 0;
      while (std::getline(in, line) && shown < 20) {
        if (line.find(" warn") == std::string::npos && line.find(" error") == std::string::npos) continue;
        out += "  " + path.substr(path.rfind('/') + 1) + ": " + line + "\n";
        ++shown;
      }
    }
    return out;
  }

  // Until the agent is quiet (under 5% of a core over 100 ms, or 10 s
  // passed): its start (loading, attaching, scanning /proc) and its first
  // look at a new process would otherwise overlap a timed loop.
  static void settle(Child& agent) {
    uint64_t deadline = monotonic_ns() + 10'000'000'000ull;
    auto before = cpu_time_of(agent.pid());
    while (before && monotonic_ns() < deadline) {
      usleep(100000);
      auto after = cpu_time_of(agent.pid());
      if (!after || after->runtime_ns - before->runtime_ns < 5'000'000ull) return;
      before = after;
    }
  }

  // Stops an agent and waits until its probes are gone from this process.
  Result<void> stop_agent(Child& agent) {
    int status = agent.stop(60000);
    if (status != 0) return make_error(Errc::system, "rankscope-agent exited with status " + std::to_string(status));
    void* target = dlsym(RTLD_DEFAULT, "ncclAllReduce");
    uint64_t deadline = monotonic_ns() + 10'000'000'000ull;
    while (has_breakpoint(target)) {
      if (monotonic_ns() > deadline) return make_error(Errc::system, "the agent's probes stayed after it stopped");
      usleep(2000);
    }
    return {};
  }

  // Asks the collector for its status; a failure is logged (`read` not called).
  void ask_status(cli::QueryClient& client, const std::function<void(proto::query::StatusReply::Reader)>& read) {
    capnp::MallocMessageBuilder request;
    auto req = request.initRoot<proto::query::Request>();
    req.setProtocolVersion(proto::query::QUERY_PROTOCOL_VERSION);
    req.setStatus();
    auto result = client.ask(request, [&](proto::query::Reply::Reader reply) { read(reply.getStatus()); });
    if (!result) RS_LOG(warn, "status query: %s", result.error().message.c_str());
  }

  // The agent instance the collector last welcomed as node "bench" (0: none yet).
  uint64_t bench_instance() {
    cli::QueryClient client(query_endpoint(), 2000, client_keys);
    uint64_t instance = 0;
    ask_status(client, [&](proto::query::StatusReply::Reader status) {
      for (auto node : status.getNodes())
        if (node.getNode() == "bench") instance = node.getInstanceId();
    });
    return instance;
  }

  // Records the collector has stored, once it holds at least `expected` (or
  // the deadline passed).
  uint64_t records_stored(uint64_t expected) {
    cli::QueryClient client(query_endpoint(), 2000, client_keys);
    uint64_t stored = 0;
    // Long enough for a batch whose ack was lost to be sent again.
    uint64_t deadline = monotonic_ns() + 30'000'000'000ull;
    do {
      ask_status(client, [&](proto::query::StatusReply::Reader status) { stored = status.getRecordsStored(); });
      if (stored >= expected) break;
      usleep(100000);
    } while (monotonic_ns() < deadline);
    return stored;
  }

  static std::string slurp(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
};

// ---------------------------------------------------------------- the run

// One figure over the repetitions, in both summaries of a loop.
struct Series {
  std::vector<double> mean, median;
  void add(const LoopTime& t) {
    mean.push_back(t.mean);
    median.push_back(t.median);
  }
  void add_difference(const LoopTime& with, const LoopTime& without) {
    mean.push_back(with.mean - without.mean);
    median.push_back(with.median - without.median);
  }
};

struct Results {
  Series noop_bare, noop_probed, nccl_bare, nccl_agent;
  Series floor, added;
  Series nccl_bare_pair, nccl_pair_added;  // the bare pair on ncclAllReduce itself
  Series stepped_floor;  // a first instruction that is single-stepped
  std::vector<double> nccl_bare_switches, nccl_agent_switches;  // per call
  uint64_t traced_calls = 0;  // NCCL collective calls made while an agent ran
  // paced run
  uint64_t paced_calls = 0;
  double paced_seconds = 0, paced_rate = 0;
  double agent_idle_stat = 0, agent_idle_runtime = 0;    // % of one core
  double agent_paced_stat = 0, agent_paced_runtime = 0;  // % of one core
  double collector_paced_runtime = 0;
  uint64_t records_stored = 0;
  // ns per call inside the BPF programs (kernel.bpf_stats, a separate pass)
  std::optional<double> prog_noop_entry, prog_noop_return, prog_agent_entry, prog_agent_return;
  std::vector<OtherProgram> prog_others;  // during the traced NCCL loop
  std::string nccl_entry, noop_entry;  // first code bytes, before any probe
  // the ranks run: per repetition an untraced run, one with the bare pair
  // on ncclAllReduce, and a traced one
  enum class Ranks { untraced, bare_pair, traced };
  struct RanksRun {
    int rep = 0;
    Ranks kind = Ranks::untraced;
    uint64_t calls = 0;            // timed calls of all ranks
    double rate = 0;               // calls a second of all ranks together
    double median_ns = 0;          // the median over the ranks of each one's median call
    double mean_ns = 0;            // every timed call's mean
    double cpu_ns_per_call = 0;    // the ranks' CPU (all their threads) per timed call
    double agent_stat = 0, agent_runtime = 0, collector_runtime = 0;  // % of one core (traced)
  };
  std::vector<RanksRun> ranks_runs;
  std::vector<OtherProgram> ranks_programs;  // every BPF program in a traced ranks run, per call
  uint64_t ranks_calls = 0;                  // the calls of that run
};

// The first bytes of a function's code, in hex.
std::string first_bytes(const void* code, size_t n) {
  std::string out;
  char hex[4];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(hex, sizeof(hex), "%02x", static_cast<const volatile uint8_t*>(code)[i]);
    out += (i ? " " : "") + std::string(hex);
  }
  return out;
}

// Where the time goes inside the two pairs of programs: the bare pair on
// the no-op function and the agent's pair on ncclAllReduce, with the
// kernel's run-time statistics on (a pass of its own, not timed).
Result<void> measure_prog_time(const Options& options, NoopProbes& probes, Child& agent, Results& out) {
  int stats = bpf_enable_stats(BPF_STATS_RUN_TIME);
  if (stats < 0) {
    RS_LOG(warn, "cannot turn on kernel.bpf_stats (%s): the programs' own run time is left out", std::strerror(errno));
    return {};
  }
  if (auto r = probes.attach("rankscope_bench_noop"); !r) {
    close(stats);
    return r;
  }
  auto before = prog_counters();
  time_noop(&rankscope_bench_noop, options.noop_calls);
  auto after = prog_counters();
  probes.detach();
  out.prog_noop_entry = ns_per_run(before, after, "noop_enter", options.noop_calls);
  out.prog_noop_return = ns_per_run(before, after, "noop_return", options.noop_calls);
  auto loop = NcclLoop::open(options.grouped);
  if (!loop) {
    close(stats);
    return loop.error();
  }
  Deployment::settle(agent);
  before = prog_counters();
  auto timed = (*loop)->time(options.nccl_calls, options.chunk);
  after = prog_counters();
  close(stats);
  if (!timed) return timed.error();
  out.traced_calls += options.nccl_calls;
  out.prog_agent_entry = ns_per_run(before, after, "nccl_allreduce_enter", options.nccl_calls);
  out.prog_agent_return = ns_per_run(before, after, "nccl_call_return", options.nccl_calls);
  out.prog_others = other_programs(before, after, {"nccl_allreduce_enter", "nccl_call_return"}, options.nccl_calls);
  return {};
}

// The four loops, `reps` times. The agent of the last repetition is kept
// running and returned (the paced run uses it): each agent takes seconds to
// stop, as the kernel retires its uprobes one at a time.
Result<Child> measure_calls(const Options& options, Deployment& deployment, Results& out) {
  auto probes = NoopProbes::open();
  if (!probes) return probes.error();
  // A no-op function alone and with the bare pair on it.
  struct NoopPair {
    LoopTime alone, with_pair;
  };
  auto probed_noop = [&](const char* name, NoopFunction function) -> Result<NoopPair> {
    if (has_breakpoint(reinterpret_cast<void*>(function)))
      return make_error(Errc::system, std::string("something else has a uprobe on ") + name);
    NoopPair pair;
    time_noop(function, options.warmup);
    pair.alone = time_noop(function, options.noop_calls);
    if (auto r = (*probes)->attach(name); !r) return r.error();
    if (!has_breakpoint(reinterpret_cast<void*>(function)))
      return make_error(Errc::system, std::string("the bare uprobe is not on ") + name);
    time_noop(function, options.warmup);
    pair.with_pair = time_noop(function, options.noop_calls);
    (*probes)->detach();
    return pair;
  };
  for (int rep = 0; rep < options.reps; ++rep) {
    auto stepped = probed_noop("rankscope_bench_noop_stepped", &rankscope_bench_noop_stepped);
    if (!stepped) return stepped.error();
    out.stepped_floor.add_difference(stepped->with_pair, stepped->alone);

    // The no-op alone, ncclAllReduce alone and with the bare pair on it.
    if (has_breakpoint(reinterpret_cast<void*>(&rankscope_bench_noop)))
      return make_error(Errc::system, "something else has a uprobe on rankscope_bench_noop");
    time_noop(&rankscope_bench_noop, options.warmup);
    LoopTime noop_alone = time_noop(&rankscope_bench_noop, options.noop_calls);
    LoopTime alone, bare_pair;
    // An agent that is stopping (another test's, say) takes seconds to
    // retire its uprobes: give it 30 s before calling the probe foreign.
    if (auto r = Deployment::wait_for_foreign_probes(options.nccl_lib); !r) return r.error();
    {
      auto loop = NcclLoop::open(options.grouped);
      if (!loop) return loop.error();
      if (auto w = (*loop)->time(options.warmup, options.chunk); !w) return w.error();
      auto t = (*loop)->time(options.nccl_calls, options.chunk);
      if (!t) return t.error();
      alone = *t;
      // What any uprobe tracer costs on this function, before it does any work.
      if (auto r = (*probes)->attach("ncclAllReduce", options.nccl_lib); !r) return r.error();
      auto w = (*loop)->time(options.warmup, options.chunk);
      auto p = w ? (*loop)->time(options.nccl_calls, options.chunk) : w;
      (*probes)->detach();
      if (!p) return p.error();
      bare_pair = *p;
    }

    // Traced by the agent, interleaved with the floor: the bare pair stays on
    // the no-op function (the agent probes other functions), and blocks of
    // the two loops alternate. This machine's trap cost jumps by a third
    // and back within seconds (the floor measured before and after one
    // traced loop differed so); alternating blocks put both sides of the
    // ratio under the same jumps.
    auto agent = deployment.start_agent();
    if (!agent) return agent.error();
    Deployment::settle(*agent);
    CallTimes traced_times, probed_times;
    {
      auto loop = NcclLoop::open(options.grouped);
      if (!loop) return loop.error();
      if (auto w = (*loop)->time(options.warmup, options.chunk); !w) return w.error();
      if (auto r = (*probes)->attach("rankscope_bench_noop"); !r) return r.error();
      if (!has_breakpoint(reinterpret_cast<void*>(&rankscope_bench_noop)))
        return make_error(Errc::system, "the bare uprobe is not on rankscope_bench_noop");
      time_noop(&rankscope_bench_noop, options.warmup);
      Deployment::settle(*agent);
      for (uint64_t b = 0; b < options.blocks; ++b) {
        time_noop_into(probed_times, &rankscope_bench_noop, options.noop_calls / options.blocks);
        if (auto r = (*loop)->time_into(traced_times, options.nccl_calls / options.blocks, options.chunk); !r)
          return r.error();
      }
      (*probes)->detach();
    }
    LoopTime traced = traced_times.summary(), noop_probed = probed_times.summary();
    out.noop_bare.add(noop_alone);
    out.noop_probed.add(noop_probed);
    out.floor.add_difference(noop_probed, noop_alone);
    out.traced_calls += options.warmup + options.nccl_calls / options.blocks * options.blocks;
    out.nccl_bare.add(alone);
    out.nccl_agent.add(traced);
    out.added.add_difference(traced, alone);
    out.nccl_bare_pair.add(bare_pair);
    out.nccl_pair_added.add_difference(bare_pair, alone);
    out.nccl_bare_switches.push_back(alone.switches);
    out.nccl_agent_switches.push_back(traced.switches);
    std::fprintf(stderr,
                 "rep %d/%d (median call, ns): floor %.0f; ncclAllReduce %.0f, with the bare pair %.0f, traced %.0f: "
                 "added %.0f = %.2fx the floor; context switches per call %.3f untraced, %.3f traced\n",
                 rep + 1, options.reps, out.floor.median.back(), alone.median,
                 bare_pair.median, traced.median, out.added.median.back(),
                 out.floor.median.back() > 0 ? out.added.median.back() / out.floor.median.back() : 0.0,
                 alone.switches, traced.switches);
    if (rep + 1 == options.reps) {
      if (auto r = measure_prog_time(options, **probes, *agent, out); !r) return r.error();
      return std::move(*agent);
    }
    if (auto r = deployment.stop_agent(*agent); !r) return r.error();
  }
  return make_error(Errc::invalid_argument, "no repetitions");
}

// Sleeps until call `i`'s slot on a fixed schedule from `t0`: absolute
// deadlines, so a late call does not shift the ones after it.
void sleep_until_slot(uint64_t t0, uint64_t i, double period_ns) {
  uint64_t deadline = t0 + static_cast<uint64_t>(static_cast<double>(i) * period_ns);
  if (monotonic_ns() >= deadline) return;
  timespec ts{static_cast<time_t>(deadline / 1'000'000'000ull), static_cast<long>(deadline % 1'000'000'000ull)};
  clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr);
}

double percent_of_core(uint64_t cpu_ns, uint64_t wall_ns) {
  return wall_ns ? 100.0 * static_cast<double>(cpu_ns) / static_cast<double>(wall_ns) : 0;
}

Result<void> measure_paced(const Options& options, Deployment& deployment, Child& agent, Results& out) {
  auto loop = NcclLoop::open();
  if (!loop) return loop.error();
  if (!(*loop)->call_and_sync()) return make_error(Errc::system, "ncclAllReduce failed");
  Deployment::settle(agent);
  uint64_t ns_per_tick = 1'000'000'000ull / ticks_per_second();

  // The same agent with nothing to trace (its timers, scans, heartbeats).
  auto idle_start = cpu_time_of(agent.pid());
  uint64_t idle_t0 = monotonic_ns();
  usleep(static_cast<useconds_t>(options.idle_seconds * 1e6));
  auto idle_end = cpu_time_of(agent.pid());
  uint64_t idle_wall = monotonic_ns() - idle_t0;
  if (!idle_start || !idle_end) return make_error(Errc::system, "the agent exited while idle");
  out.agent_idle_stat = percent_of_core((idle_end->stat_ticks - idle_start->stat_ticks) * ns_per_tick, idle_wall);
  out.agent_idle_runtime = percent_of_core(idle_end->runtime_ns - idle_start->runtime_ns, idle_wall);

  // Calls on a fixed schedule (absolute deadlines: a late call does not
  // shift the ones after it), the stream drained every few calls as a
  // training step would.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  uint64_t total = static_cast<uint64_t>(options.paced_rate * options.paced_seconds);
  out.traced_calls += 1;  // the call above
  double period_ns = 1e9 / options.paced_rate;
  auto agent_start = cpu_time_of(agent.pid());
  auto collector_start = cpu_time_of(deployment.collector->pid());
  uint64_t t0 = monotonic_ns();
  uint64_t failed = 0;
  for (uint64_t i = 0; i < total; ++i) {
    sleep_until_slot(t0, i, period_ns);
    failed += (*loop)->call() != ncclSuccess;
    if ((i + 1) % options.paced_sync_every == 0 && !(*loop)->sync()) ++failed;
  }
  (*loop)->sync();
  uint64_t wall = monotonic_ns() - t0;
  auto agent_end = cpu_time_of(agent.pid());
  auto collector_end = cpu_time_of(deployment.collector->pid());
  if (failed) return make_error(Errc::system, std::to_string(failed) + " call(s) failed in the paced run");
  if (!agent_start || !agent_end) return make_error(Errc::system, "the agent exited during the paced run");
  out.paced_calls = total;
  out.traced_calls += total;
  out.paced_seconds = static_cast<double>(wall) / 1e9;
  out.paced_rate = static_cast<double>(total) / out.paced_seconds;
  out.agent_paced_stat = percent_of_core((agent_end->stat_ticks - agent_start->stat_ticks) * ns_per_tick, wall);
  out.agent_paced_runtime = percent_of_core(agent_end->runtime_ns - agent_start->runtime_ns, wall);
  if (collector_start && collector_end)
    out.collector_paced_runtime = percent_of_core(collector_end->runtime_ns - collector_start->runtime_ns, wall);
  loop->reset();
  // Counted while the last agent still runs: batches it had not seen acked
  // when it stops stay in its spool for its next start, not in the database.
  out.records_stored = deployment.records_stored(out.traced_calls);
  return deployment.stop_agent(agent);
}

// ---------------------------------------------------------------- a node's ranks

constexpr uint64_t kRankWarmup = 100;  // untimed calls of each rank before its paced ones

// What one rank of the ranks run measured, as it prints it.
struct RankFigures {
  uint64_t calls = 0, failed = 0, cpu_ns = 0, wall_ns = 0;
  double median_ns = 0, mean_ns = 0;
};

// One rank of the ranks run (`--rank-child GO`, started by measure_ranks):
// waits for the file GO, makes a communicator, then --rank-rate calls a
// second for --ranks-seconds, each timed, the stream drained every
// paced_sync_every calls as a training step would; prints one line.
int rank_child(const Options& options, const std::string& go) {
  while (access(go.c_str(), F_OK) != 0) usleep(10000);
  auto loop = NcclLoop::open(false);
  if (!loop) {
    std::fprintf(stderr, "rank-child: %s\n", loop.error().message.c_str());
    return 1;
  }
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  RankFigures f;
  for (uint64_t i = 0; i < kRankWarmup; ++i) f.failed += (*loop)->call() != ncclSuccess;
  f.failed += !(*loop)->sync();
  uint64_t total = static_cast<uint64_t>(options.rank_rate * options.ranks_seconds);
  double period_ns = 1e9 / options.rank_rate;
  CallTimes times;
  times.reserve(total);
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  uint64_t t0 = monotonic_ns();
  for (uint64_t i = 0; i < total; ++i) {
    sleep_until_slot(t0, i, period_ns);
    uint64_t start = monotonic_ns();
    f.failed += (*loop)->call() != ncclSuccess;
    times.add(monotonic_ns() - start);
    if ((i + 1) % options.paced_sync_every == 0) f.failed += !(*loop)->sync();
  }
  f.failed += !(*loop)->sync();
  f.wall_ns = monotonic_ns() - t0;
  getrusage(RUSAGE_SELF, &after);
  auto ns_of = [](const rusage& u) {
    return static_cast<uint64_t>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1'000'000'000ull +
           static_cast<uint64_t>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1000ull;
  };
  f.cpu_ns = ns_of(after) - ns_of(before);
  LoopTime t = times.summary();
  loop->reset();
  std::printf("rank-child calls=%llu failed=%llu median_ns=%.1f mean_ns=%.1f cpu_ns=%llu wall_ns=%llu\n",
              static_cast<unsigned long long>(total), static_cast<unsigned long long>(f.failed), t.median, t.mean,
              static_cast<unsigned long long>(f.cpu_ns), static_cast<unsigned long long>(f.wall_ns));
  return f.failed ? 1 : 0;
}

Result<RankFigures> read_rank_figures(const std::string& log) {
  std::string text = Deployment::slurp(log);
  size_t at = text.find("rank-child calls=");
  RankFigures f;
  unsigned long long calls = 0, failed = 0, cpu = 0, wall = 0;
  if (at == std::string::npos ||
      std::sscanf(text.c_str() + at,
                  "rank-child calls=%llu failed=%llu median_ns=%lf mean_ns=%lf cpu_ns=%llu wall_ns=%llu", &calls,
                  &failed, &f.median_ns, &f.mean_ns, &cpu, &wall) != 6)
    return make_error(Errc::system, "a rank of the ranks run printed no figures; its log (" + log + "):\n" + text);
  if (failed) return make_error(Errc::system, std::to_string(failed) + " call(s) failed in a rank; its log: " + log);
  f.calls = calls;
  f.cpu_ns = cpu;
  f.wall_ns = wall;
  return f;
}

// One run of a node's ranks: options.ranks processes, each making
// options.rank_rate collective calls a second, untraced, or traced by one
// agent that follows them all (--pid). Traced, each of the ranks' threads is
// followed by the agent's scheduler tracepoints too, so the ranks' CPU per
// call holds what the agent adds outside the calls. `stats`: with the
// kernel's run-time statistics on (they slow every program run), for the
// agent's programs per call, not for the timings.
Result<Results::RanksRun> run_ranks(const Options& options, Deployment& deployment, int rep, Results::Ranks kind,
                                    bool stats, Results& out) {
  bool traced = kind == Results::Ranks::traced;
  std::error_code ec;
  std::string self = fs::read_symlink("/proc/self/exe", ec).string();
  if (ec) return make_error(Errc::system, "cannot read /proc/self/exe: " + ec.message());
  char rate[32], seconds[32];
  std::snprintf(rate, sizeof(rate), "%g", options.rank_rate);
  std::snprintf(seconds, sizeof(seconds), "%g", options.ranks_seconds);
  const char* kinds[] = {"-untraced", "-bare-pair", "-traced"};
  std::string tag = std::to_string(rep) + (stats ? "-stats" : kinds[static_cast<int>(kind)]);
  std::string go = deployment.dir + "/go-" + tag;
  if (auto r = Deployment::wait_for_foreign_probes(options.nccl_lib); !r) return r.error();
  std::vector<Child> ranks;
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (int k = 0; k < options.ranks; ++k) {
    logs.push_back(deployment.dir + "/rank-" + tag + "-" + std::to_string(k) + ".log");
    auto child = Child::start({self, "--rank-child", go, "--rank-rate", rate, "--ranks-seconds", seconds}, logs.back());
    if (!child) return child.error();
    pids.push_back(child->pid());
    ranks.push_back(std::move(*child));
  }
  std::optional<Child> agent;
  std::unique_ptr<NoopProbes> probes;
  if (kind == Results::Ranks::bare_pair) {
    auto opened = NoopProbes::open();
    if (!opened) return opened.error();
    probes = std::move(*opened);
    if (auto r = probes->attach("ncclAllReduce", options.nccl_lib); !r) return r.error();
  }
  if (traced) {
    auto started = deployment.start_agent(pids);
    if (!started) return started.error();
    agent.emplace(std::move(*started));
    Deployment::settle(*agent);
  }
  int stats_fd = -1;
  if (stats && (stats_fd = bpf_enable_stats(BPF_STATS_RUN_TIME)) < 0)
    return make_error(Errc::system, std::string("cannot turn on kernel.bpf_stats: ") + std::strerror(errno));
  auto progs_before = stats ? prog_counters() : std::map<uint32_t, ProgCounters>{};
  std::optional<CpuTime> agent_start, agent_end;
  if (agent) {
    auto t = cpu_time_of(agent->pid());
    if (!t) return make_error(Errc::system, "the agent exited before the ranks run");
    agent_start = *t;
  }
  auto collector_start = cpu_time_of(deployment.collector->pid());
  uint64_t t0 = monotonic_ns();
  std::ofstream(go).put('\n');
  uint64_t deadline = t0 + static_cast<uint64_t>((options.ranks_seconds + 60) * 1e9);
  for (auto& rank : ranks)
    while (rank.running()) {
      if (monotonic_ns() > deadline) return make_error(Errc::system, "a rank of the ranks run did not finish");
      usleep(50000);
    }
  uint64_t wall = monotonic_ns() - t0;
  if (agent) {
    auto t = cpu_time_of(agent->pid());
    if (!t) return make_error(Errc::system, "the agent exited during the ranks run");
    agent_end = *t;
  }
  auto collector_end = cpu_time_of(deployment.collector->pid());
  auto progs_after = stats ? prog_counters() : std::map<uint32_t, ProgCounters>{};
  if (stats_fd >= 0) close(stats_fd);
  Results::RanksRun run;
  if (probes) probes->detach();
  run.rep = rep;
  run.kind = kind;
  std::vector<double> medians;
  double sum_ns = 0, cpu_ns = 0;
  for (const auto& log : logs) {
    auto f = read_rank_figures(log);
    if (!f) return f.error();
    run.calls += f->calls;
    medians.push_back(f->median_ns);
    sum_ns += f->mean_ns * static_cast<double>(f->calls);
    cpu_ns += static_cast<double>(f->cpu_ns);
  }
  uint64_t all_calls = static_cast<uint64_t>(options.ranks) * kRankWarmup + run.calls;
  run.rate = static_cast<double>(run.calls) / options.ranks_seconds;
  run.median_ns = spread_of(medians).median;
  run.mean_ns = run.calls ? sum_ns / static_cast<double>(run.calls) : 0;
  run.cpu_ns_per_call = run.calls ? cpu_ns / static_cast<double>(run.calls) : 0;
  if (stats) {
    out.ranks_programs = other_programs(progs_before, progs_after, {}, all_calls);
    out.ranks_calls = all_calls;
  }
  if (agent) {
    uint64_t ns_per_tick = 1'000'000'000ull / ticks_per_second();
    run.agent_stat = percent_of_core((agent_end->stat_ticks - agent_start->stat_ticks) * ns_per_tick, wall);
    run.agent_runtime = percent_of_core(agent_end->runtime_ns - agent_start->runtime_ns, wall);
    if (collector_start && collector_end)
      run.collector_runtime = percent_of_core(collector_end->runtime_ns - collector_start->runtime_ns, wall);
    out.traced_calls += all_calls;
    // Counted while the agent runs (see measure_paced).
    out.records_stored = deployment.records_stored(out.traced_calls);
    if (auto r = deployment.stop_agent(*agent); !r) return r.error();
  }
  std::fprintf(stderr,
               "ranks run %s: %d ranks, %.0f calls/s in all: median call %.0f ns, the ranks' CPU %.0f ns "
               "per call; agent %.2f%% of a core\n",
               tag.c_str(), options.ranks, run.rate, run.median_ns, run.cpu_ns_per_call, run.agent_stat);
  return run;
}

// The ranks runs: untraced, the bare pair, traced, options.ranks_reps times; then one
// traced run with the kernel's statistics on, untimed.
Result<void> measure_ranks(const Options& options, Deployment& deployment, Results& out) {
  for (int rep = 1; rep <= options.ranks_reps; ++rep)
    for (auto kind : {Results::Ranks::untraced, Results::Ranks::bare_pair, Results::Ranks::traced}) {
      auto run = run_ranks(options, deployment, rep, kind, false, out);
      if (!run) return run.error();
      out.ranks_runs.push_back(*run);
    }
  auto run = run_ranks(options, deployment, options.ranks_reps + 1, Results::Ranks::traced, true, out);
  if (!run) return run.error();
  return {};
}

// Added / floor per repetition, and the ratio of the medians over them.
struct Ratio {
  double of_medians = 0;
  Spread per_rep;
};
Ratio ratio_of(const std::vector<double>& added, const std::vector<double>& floor) {
  std::vector<double> ratios;
  for (size_t i = 0; i < floor.size() && i < added.size(); ++i)
    if (floor[i] > 0) ratios.push_back(added[i] / floor[i]);
  double f = spread_of(floor).median;
  return {f > 0 ? spread_of(added).median / f : 0.0, spread_of(ratios)};
}

// Every per-call figure: its row in the Markdown table, its name in the JSON.
struct Figure {
  const char* row;
  const char* key;
  const Series* series;
};
std::vector<Figure> figures_of(const Results& r) {
  return {{"no-op function", "noop_bare", &r.noop_bare},
          {"no-op function + bare uprobe/uretprobe", "noop_probed", &r.noop_probed},
          {"**floor** (difference)", "floor", &r.floor},
          {"ncclAllReduce", "nccl_bare", &r.nccl_bare},
          {"ncclAllReduce traced by rankscope-agent", "nccl_agent", &r.nccl_agent},
          {"**added by the agent** (difference)", "added", &r.added},
          {"ncclAllReduce + bare uprobe/uretprobe", "nccl_bare_pair", &r.nccl_bare_pair},
          {"bare pair on ncclAllReduce (difference): the floor on this function", "nccl_pair_added",
           &r.nccl_pair_added},
          {"no-op function whose first instruction is single-stepped, + the pair, difference", "stepped_floor",
           &r.stepped_floor}};
}

// "`name` R runs, N ns; ..." of the programs, and their time and runs in all.
struct ProgramList {
  std::string text;
  double ns = 0, runs = 0;
};
ProgramList program_list(const std::vector<OtherProgram>& programs) {
  ProgramList out;
  for (const auto& program : programs) {
    out.runs += program.runs_per_call;
    out.ns += program.ns_per_call;
    char item[160];
    std::snprintf(item, sizeof(item), "%s`%s` %.2f runs, %.0f ns", out.text.empty() ? "" : "; ", program.name.c_str(),
                  program.runs_per_call, program.ns_per_call);
    out.text += item;
  }
  return out;
}

// What the agent and the bare pair added per call in the ranks run, per
// repetition: the traced run's figure, and the bare pair's, less the
// untraced one's (measure_ranks runs the three in that order).
struct RanksAdded {
  std::vector<double> median_ns, cpu_ns, pair_median_ns, pair_cpu_ns, ratio, agent_stat, agent_runtime;
};
RanksAdded ranks_added(const Results& r) {
  RanksAdded out;
  for (size_t i = 0; i + 2 < r.ranks_runs.size(); i += 3) {
    const auto &untraced = r.ranks_runs[i], &pair = r.ranks_runs[i + 1], &traced = r.ranks_runs[i + 2];
    out.median_ns.push_back(traced.median_ns - untraced.median_ns);
    out.cpu_ns.push_back(traced.cpu_ns_per_call - untraced.cpu_ns_per_call);
    out.pair_median_ns.push_back(pair.median_ns - untraced.median_ns);
    out.pair_cpu_ns.push_back(pair.cpu_ns_per_call - untraced.cpu_ns_per_call);
    if (out.pair_median_ns.back() > 0) out.ratio.push_back(out.median_ns.back() / out.pair_median_ns.back());
    out.agent_stat.push_back(traced.agent_stat);
    out.agent_runtime.push_back(traced.agent_runtime);
  }
  return out;
}

void print_ranks(const Options& options, const Results& r) {
  if (r.ranks_runs.empty()) return;
  std::printf(
      "\n| %d ranks, %.0f calls/s each | calls/s, all ranks | median call, µs | mean call, µs | the ranks' CPU "
      "per call, µs | agent CPU, /proc stat | agent CPU, schedstat | collector CPU |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- |\n",
      options.ranks, options.rank_rate);
  for (const auto& run : r.ranks_runs) {
    if (run.kind == Results::Ranks::traced)
      std::printf("| %d: traced | %.0f | %.2f | %.2f | %.2f | **%.2f%%** | %.3f%% | %.2f%% |\n", run.rep, run.rate,
                  run.median_ns / 1000, run.mean_ns / 1000, run.cpu_ns_per_call / 1000, run.agent_stat,
                  run.agent_runtime, run.collector_runtime);
    else
      std::printf("| %d: %s | %.0f | %.2f | %.2f | %.2f | | | |\n", run.rep,
                  run.kind == Results::Ranks::untraced ? "untraced" : "bare uprobe/uretprobe", run.rate,
                  run.median_ns / 1000, run.mean_ns / 1000, run.cpu_ns_per_call / 1000);
  }
  RanksAdded added = ranks_added(r);
  Spread median = spread_of(added.median_ns), cpu = spread_of(added.cpu_ns), agent = spread_of(added.agent_stat);
  Spread pair = spread_of(added.pair_median_ns), pair_cpu = spread_of(added.pair_cpu_ns),
         ratio = spread_of(added.ratio);
  std::printf(
      "\n%d processes, each with its own one-rank communicator, calling ncclAllReduce outside any group "
      "(%.0f a second each for %g s, the stream drained every %llu calls): untraced, with a bare uprobe + "
      "uretprobe pair on ncclAllReduce, and traced by one agent that follows all of them (`--pid`), %d "
      "times. Added per call, traced: **%.2f µs** to the median call (per repetition %.2f - %.2f), %.2f µs of "
      "the ranks' CPU (per repetition %.2f - %.2f; it holds the probes and the agent's scheduler tracepoints "
      "on the ranks' switches); with the bare pair: %.2f µs to the median call (%.2f - %.2f), %.2f µs of CPU "
      "(%.2f - %.2f). Added by the agent / by the bare pair, median call: **%.2fx** (per repetition %.2f - "
      "%.2f). Agent CPU: **%.2f%%** of one core (per repetition %.2f - %.2f) at %.0f calls/s in all.\n",
      options.ranks, options.rank_rate, options.ranks_seconds,
      static_cast<unsigned long long>(options.paced_sync_every), options.ranks_reps, median.median / 1000,
      median.min / 1000, median.max / 1000, cpu.median / 1000, cpu.min / 1000, cpu.max / 1000, pair.median / 1000,
      pair.min / 1000, pair.max / 1000, pair_cpu.median / 1000, pair_cpu.min / 1000, pair_cpu.max / 1000, ratio.median,
      ratio.min, ratio.max, agent.median, agent.min, agent.max, options.ranks * options.rank_rate);
  if (r.ranks_programs.empty()) return;
  // process_exit runs at the exit of every thread on the machine, not per
  // call (the ranks' own exits are in the run's window): told apart.
  std::vector<OtherProgram> per_call;
  std::string exits;
  for (const auto& program : r.ranks_programs) {
    if (program.name != "process_exit") {
      per_call.push_back(program);
      continue;
    }
    char item[200];
    std::snprintf(item, sizeof(item),
                  " `process_exit` ran %.0f times in that run (every thread that exited on the machine), %.0f µs a "
                  "run.",
                  program.runs_per_call * static_cast<double>(r.ranks_calls),
                  program.runs_per_call > 0 ? program.ns_per_call / program.runs_per_call / 1000 : 0.0);
    exits = item;
  }
  ProgramList list = program_list(per_call);
  std::printf(
      "Time inside BPF programs per call, in one more traced run with kernel.bpf_stats on (untimed; the "
      "statistics add two clock reads to every run): %.0f ns (%s).%s\n",
      list.ns, list.text.c_str(), exits.c_str());
}

void print_markdown(const Options& options, const Results& r) {
  auto row = [](const char* what, const Series& s) {
    Spread mean = spread_of(s.mean), median = spread_of(s.median);
    std::printf("| %s | %.2f | %.2f - %.2f | %.2f | %.2f - %.2f |\n", what, mean.median / 1000, mean.min / 1000,
                mean.max / 1000, median.median / 1000, median.min / 1000, median.max / 1000);
  };
  std::printf("| per call (µs) | mean | range | median call | range |\n| --- | --- | --- | --- | --- |\n");
  for (const Figure& f : figures_of(r)) row(f.row, *f.series);
  Ratio by_median = ratio_of(r.added.median, r.floor.median), by_mean = ratio_of(r.added.mean, r.floor.mean);
  Ratio by_function = ratio_of(r.added.median, r.nccl_pair_added.median);
  Spread bare_switches = spread_of(r.nccl_bare_switches), agent_switches = spread_of(r.nccl_agent_switches);
  std::printf("\nAdded / floor: **%.2fx** for the median call (the median of the per-repetition ratios, which "
              "range %.2f - %.2f; the ratio of the medians is %.2fx; goal 1.2x); %.2fx for the mean (per repetition "
              "%.2f - %.2f). Added / the bare pair on ncclAllReduce itself: %.2fx for the median call (per repetition "
              "%.2f - %.2f), which sets what any uprobe tracer pays on this function apart from the agent's own "
              "work.\n",
              by_median.per_rep.median, by_median.per_rep.min, by_median.per_rep.max, by_median.of_medians,
              by_mean.per_rep.median, by_mean.per_rep.min, by_mean.per_rep.max, by_function.per_rep.median,
              by_function.per_rep.min, by_function.per_rep.max);
  std::printf("\n%d repetitions of %llu no-op and %llu NCCL calls each, every call timed; the NCCL calls %s. "
              "Context switches of this process per NCCL call: %.3f untraced, %.3f traced (medians over the "
              "repetitions). First code bytes: ncclAllReduce `%s`, rankscope_bench_noop `%s` (both a push, which the "
              "kernel emulates).\n",
              options.reps, static_cast<unsigned long long>(options.noop_calls),
              static_cast<unsigned long long>(options.nccl_calls),
              options.grouped ? ("made inside groups of " + std::to_string(options.chunk) +
                                 " (ncclGroupStart and ncclGroupEnd untimed)")
                                    .c_str()
                              : "made outside any group (each queues work on fakenccl's stream thread)",
              bare_switches.median, agent_switches.median, r.nccl_entry.c_str(), r.noop_entry.c_str());
  auto ns = [](const std::optional<double>& v) { return v ? *v : 0.0; };
  if (r.prog_agent_entry && r.prog_agent_return && r.prog_noop_entry && r.prog_noop_return)
    std::printf("\nTime inside the BPF programs per call (kernel.bpf_stats, a separate untimed pass): the bare pair "
                "%.0f ns (entry %.0f + return %.0f), the agent's pair %.0f ns (`nccl_allreduce_enter` %.0f + "
                "`nccl_call_return` %.0f).\n",
                ns(r.prog_noop_entry) + ns(r.prog_noop_return), ns(r.prog_noop_entry), ns(r.prog_noop_return),
                ns(r.prog_agent_entry) + ns(r.prog_agent_return), ns(r.prog_agent_entry), ns(r.prog_agent_return));
  else
    std::printf("\nTime inside the BPF programs per call: not measured (kernel.bpf_stats unavailable, or another "
                "program of the same name ran during the pass).\n");
  if (!r.prog_others.empty()) {
    ProgramList others = program_list(r.prog_others);
    std::printf(
        "Other BPF programs that ran during the same traced loop, per NCCL call: %.0f ns in %.2f runs (%s). "
        "The agent's scheduler tracepoints run on the wakeups and context switches the calls cause (on either "
        "core).\n",
        others.ns, others.runs, others.text.c_str());
  }
  std::printf("\n| paced run | calls | seconds | calls/s | agent CPU, /proc stat | agent CPU, schedstat | collector CPU |\n"
              "| --- | --- | --- | --- | --- | --- | --- |\n");
  std::printf("| agent idle | 0 | %.1f | 0 | %.2f%% | %.3f%% | |\n", options.idle_seconds, r.agent_idle_stat,
              r.agent_idle_runtime);
  std::printf("| %.0f calls/s | %llu | %.1f | %.0f | **%.2f%%** | %.3f%% | %.2f%% |\n", options.paced_rate,
              static_cast<unsigned long long>(r.paced_calls), r.paced_seconds, r.paced_rate, r.agent_paced_stat,
              r.agent_paced_runtime, r.collector_paced_runtime);
  std::printf("\nAgent CPU is %% of one core (goal: under 1%% at 10,000 calls/s). Records stored by the collector: "
              "%llu of %llu traced calls.\n",
              static_cast<unsigned long long>(r.records_stored), static_cast<unsigned long long>(r.traced_calls));
  print_ranks(options, r);
}

Result<void> write_json(const std::string& path, const Options& options, const Results& r) {
  std::ofstream out(path);
  if (!out) return make_error(Errc::io, "cannot write " + path);
  std::map<std::string, double> values;
  auto put = [&](const std::string& name, const Series& series) {
    for (auto [summary, xs] : {std::pair{"mean", &series.mean}, std::pair{"median_call", &series.median}}) {
      Spread s = spread_of(*xs);
      values[name + "_" + summary + "_ns_median"] = s.median;
      values[name + "_" + summary + "_ns_min"] = s.min;
      values[name + "_" + summary + "_ns_max"] = s.max;
    }
  };
  for (const Figure& f : figures_of(r)) put(f.key, *f.series);
  values["added_over_nccl_pair"] = ratio_of(r.added.median, r.nccl_pair_added.median).per_rep.median;

  values["added_over_floor"] = ratio_of(r.added.median, r.floor.median).per_rep.median;
  values["added_over_floor_of_medians"] = ratio_of(r.added.median, r.floor.median).of_medians;
  values["added_over_floor_mean"] = ratio_of(r.added.mean, r.floor.mean).per_rep.median;
  values["grouped"] = options.grouped ? 1 : 0;
  values["nccl_bare_switches_per_call"] = spread_of(r.nccl_bare_switches).median;
  values["nccl_agent_switches_per_call"] = spread_of(r.nccl_agent_switches).median;
  values["reps"] = options.reps;
  values["paced_calls"] = static_cast<double>(r.paced_calls);
  values["paced_seconds"] = r.paced_seconds;
  values["paced_rate"] = r.paced_rate;
  values["agent_idle_cpu_percent_stat"] = r.agent_idle_stat;
  values["agent_idle_cpu_percent_schedstat"] = r.agent_idle_runtime;
  values["agent_paced_cpu_percent_stat"] = r.agent_paced_stat;
  values["agent_paced_cpu_percent_schedstat"] = r.agent_paced_runtime;
  values["collector_paced_cpu_percent_schedstat"] = r.collector_paced_runtime;
  if (!r.ranks_runs.empty()) {
    RanksAdded added = ranks_added(r);
    values["ranks"] = options.ranks;
    values["ranks_rate_per_rank"] = options.rank_rate;
    values["ranks_added_median_call_ns"] = spread_of(added.median_ns).median;
    values["ranks_added_cpu_ns_per_call"] = spread_of(added.cpu_ns).median;
    values["ranks_pair_added_median_call_ns"] = spread_of(added.pair_median_ns).median;
    values["ranks_pair_added_cpu_ns_per_call"] = spread_of(added.pair_cpu_ns).median;
    values["ranks_added_over_pair"] = spread_of(added.ratio).median;
    values["ranks_agent_cpu_percent_stat"] = spread_of(added.agent_stat).median;
    values["ranks_agent_cpu_percent_schedstat"] = spread_of(added.agent_runtime).median;
    for (const auto& program : r.ranks_programs) {
      values["ranks_prog_" + program.name + "_runs_per_call"] = program.runs_per_call;
      values["ranks_prog_" + program.name + "_ns_per_call"] = program.ns_per_call;
    }
  }
  values["traced_calls"] = static_cast<double>(r.traced_calls);
  values["records_stored"] = static_cast<double>(r.records_stored);
  if (r.prog_noop_entry) values["prog_noop_entry_ns"] = *r.prog_noop_entry;
  if (r.prog_noop_return) values["prog_noop_return_ns"] = *r.prog_noop_return;
  if (r.prog_agent_entry) values["prog_agent_entry_ns"] = *r.prog_agent_entry;
  if (r.prog_agent_return) values["prog_agent_return_ns"] = *r.prog_agent_return;
  for (const auto& other : r.prog_others) {
    values["prog_other_" + other.name + "_runs_per_call"] = other.runs_per_call;
    values["prog_other_" + other.name + "_ns_per_call"] = other.ns_per_call;
  }
  out << "{";
  bool first = true;
  for (const auto& [name, value] : values) {
    char number[64];
    std::snprintf(number, sizeof(number), "%.6g", value);
    out << (first ? "" : ",") << "\"" << name << "\":" << number;
    first = false;
  }
  out << "}\n";
  return out ? Result<void>{} : make_error(Errc::io, "cannot write " + path);
}

int run(const Options& options) {
  char tmpl[] = "/tmp/rankscope-bench-XXXXXX";
  if (!mkdtemp(tmpl)) {
    RS_LOG(error, "cannot create a temporary folder: %s", std::strerror(errno));
    return 1;
  }
  Deployment deployment{options, tmpl};
  // NCCL's bootstrap picks the first non-loopback interface unless told; a
  // one-rank communicator only talks to itself.
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  Results results;
  // Another agent that is stopping takes seconds to retire its uprobes
  // (the first bytes below are read without them).
  for (int i = 0; i < 300 && !Deployment::probed_functions().present.empty(); ++i) usleep(100000);
  results.nccl_entry = first_bytes(dlsym(RTLD_DEFAULT, "ncclAllReduce"), 4);
  results.noop_entry = first_bytes(reinterpret_cast<void*>(&rankscope_bench_noop), 4);
  auto fail = [&](const Error& error) {
    RS_LOG(error, "%s", error.message.c_str());
    RS_LOG(error, "logs kept in %s", deployment.dir.c_str());
    return 1;
  };
  if (auto r = deployment.start_collector(); !r) return fail(r.error());
  auto agent = measure_calls(options, deployment, results);
  if (!agent) return fail(agent.error());
  if (auto r = measure_paced(options, deployment, *agent, results); !r) return fail(r.error());
  if (options.ranks > 0) {
    if (auto r = measure_ranks(options, deployment, results); !r) return fail(r.error());
  }
  if (int status = deployment.collector->stop(30000); status != 0)
    return fail(make_error(Errc::system, "rankscope-collector exited with status " + std::to_string(status)));
  print_markdown(options, results);
  if (!options.json.empty()) {
    if (auto r = write_json(options.json, options, results); !r) return fail(r.error());
  }
  if (results.records_stored != results.traced_calls) {
    RS_LOG(error, "the collector stored %llu records for %llu traced calls",
           static_cast<unsigned long long>(results.records_stored),
           static_cast<unsigned long long>(results.traced_calls));
    std::string problems = deployment.log_problems();
    return fail(make_error(Errc::protocol, "records lost between the agent and the collector; warnings and errors "
                                           "logged:\n" + (problems.empty() ? "  (none)\n" : problems)));
  }
  if (!options.keep) fs::remove_all(deployment.dir);
  return 0;
}

}  // namespace
}  // namespace rankscope::bench

int main(int argc, char** argv) {
  rankscope::log::set_program("rankscope-bench-overhead");
  rankscope::bench::Options options;
  bool smoke = false;
  std::string rank_child_go;
  po::options_description desc(
      "rankscope-bench-overhead: what rankscope-agent adds to one NCCL call, against a bare uprobe + uretprobe "
      "pair on a no-op function (the floor on this kernel), and the agent's CPU at a fixed call rate. Needs "
      "root.\n\nUsage: rankscope-bench-overhead [options]\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("reps", po::value(&options.reps)->default_value(options.reps), "repetitions of the loops (the floor, the NCCL call alone, with the bare pair and traced)")
    ("noop-calls", po::value(&options.noop_calls)->default_value(options.noop_calls), "calls per timed no-op loop")
    ("nccl-calls", po::value(&options.nccl_calls)->default_value(options.nccl_calls), "calls per timed NCCL loop")
    ("chunk", po::value(&options.chunk)->default_value(options.chunk), "NCCL calls between two untimed stream synchronizes")
    ("blocks", po::value(&options.blocks)->default_value(options.blocks), "blocks the traced loop and the floor are cut into, alternated")
    ("warmup", po::value(&options.warmup)->default_value(options.warmup), "untimed calls before each timed loop")
    ("paced-rate", po::value(&options.paced_rate)->default_value(options.paced_rate), "collective calls per second in the paced run")
    ("paced-seconds", po::value(&options.paced_seconds)->default_value(options.paced_seconds), "length of the paced run")
    ("idle-seconds", po::value(&options.idle_seconds)->default_value(options.idle_seconds), "length of the idle-agent window")
    ("ranks", po::value(&options.ranks)->default_value(options.ranks), "processes in the ranks run, a node's ranks each calling at --rank-rate, untraced and traced (0: no ranks run)")
    ("rank-rate", po::value(&options.rank_rate)->default_value(options.rank_rate), "collective calls per second of each rank in the ranks run")
    ("ranks-seconds", po::value(&options.ranks_seconds)->default_value(options.ranks_seconds), "length of each untraced and traced ranks run")
    ("ranks-reps", po::value(&options.ranks_reps)->default_value(options.ranks_reps), "untraced and traced ranks runs, alternated")
    ("rank-child", po::value(&rank_child_go), "(internal) be one rank of the ranks run, starting once this file exists")
    ("bin-dir", po::value(&options.bin_dir)->default_value(options.bin_dir), "where rankscope-agent and rankscope-collector are")
    ("nccl-lib", po::value(&options.nccl_lib)->default_value(options.nccl_lib), "the libnccl.so.2 this program runs against (for the agent's --nccl-lib)")
    ("agent-arg", po::value(&options.agent_args)->multitoken(), "extra flag for rankscope-agent (repeatable), e.g. --agent-arg=--cuda-waits=false")
    ("json", po::value(&options.json), "also write the figures to this file as one JSON object")
    ("keep", po::bool_switch(&options.keep), "keep the temporary folder (logs, database)")
    ("ungrouped", "time NCCL calls made outside a group: each queues work on fakenccl's stream thread, whose "
                  "wakeups then weigh on the difference (see NcclLoop::time)")
    ("smoke", po::bool_switch(&smoke), "a tiny run that only checks that everything works (figures meaningless)");
  // clang-format on
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "rankscope-bench-overhead: " << e.what() << "\n(see rankscope-bench-overhead --help)\n";
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (vm.count("ungrouped")) options.grouped = false;
  if (!rank_child_go.empty()) return rankscope::bench::rank_child(options, rank_child_go);
  if (smoke) {
    options.reps = 2;
    options.noop_calls = options.nccl_calls = 200;
    options.chunk = 100;
    options.warmup = 50;
    options.paced_rate = 1000;
    options.paced_seconds = 1;
    options.idle_seconds = 0.5;
    options.ranks = 2;
    options.rank_rate = 200;
    options.ranks_seconds = 0.5;
    options.ranks_reps = 1;
  }
  if (options.reps < 1 || options.noop_calls == 0 || options.nccl_calls == 0 || options.chunk == 0 ||
      options.paced_rate <= 0 || options.paced_seconds <= 0 || options.paced_sync_every == 0 || options.blocks == 0 ||
      options.blocks > options.noop_calls || options.blocks > options.nccl_calls || options.ranks < 0 ||
      options.rank_rate <= 0 || options.ranks_seconds <= 0 || options.ranks_reps < 1) {
    std::cerr << "rankscope-bench-overhead: --reps, the call counts, --chunk, --blocks, --paced-rate, "
                 "--paced-seconds, --rank-rate, --ranks-seconds and --ranks-reps must be positive, --ranks not "
                 "negative, and --blocks no more than the call counts\n";
    return 2;
  }
  if (geteuid() != 0) {
    std::cerr << "rankscope-bench-overhead: eBPF probes need root; run it as root (sudo)\n";
    return 1;
  }
  return rankscope::bench::run(options);
}
