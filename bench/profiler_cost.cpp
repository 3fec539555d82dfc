// rankscope-bench-profiler: what librankscope-nccl-profiler.so costs NCCL per
// collective, called as NCCL calls it: the collective's start, two kernel
// channels started and stopped with their GPU times, then the collective's
// stop (eight calls), timed one collective at a time. Three runs in the same
// process: through a table of empty functions (the floor: NCCL's indirect
// calls alone), through the plugin with a reader draining its ring (as the
// agent does), and through the plugin with no reader (records only counted).
// Then the agent's side: its own reader and summariser on the ring while
// the plugin is called at a real rate, and the CPU they take.
// docs/benchmarks.md, "NCCL profiler plugin".
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/program_options.hpp>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/drops.h"
#include "nccl-profiler/abi.h"
#include "nccl-profiler/ring.h"
#include "node-agent/profiler_rings.h"
#include "node-agent/summarise.h"
#include "proto/agent_wire.h"

namespace po = boost::program_options;
using namespace rankscope::profiler;
namespace pabi = rankscope::profiler::abi;

namespace {

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The floor: a table whose functions do nothing (but hand out a handle).
int handle_storage;
pabi::Result noop_init(void** context, uint64_t, int* mask, const char*, int, int, int, pabi::Logger) {
  *context = &handle_storage;
  *mask = 0x46;
  return 0;
}
pabi::Result noop_start(void*, void** handle, pabi::EventDescrV5*) {
  *handle = &handle_storage;
  return 0;
}
pabi::Result noop_stop(void*) {
  return 0;
}
pabi::Result noop_state(void*, int, pabi::StateArgs*) {
  return 0;
}
pabi::Result noop_finalize(void*) {
  return 0;
}
pabi::ProfilerV5 noop_table = {"noop", noop_init, noop_start, noop_stop, noop_state, noop_finalize};

struct Figures {
  double median_ns = 0, p99_ns = 0;
};

// `collectives` collectives through `table`, per-collective times; every
// kBurst collectives, `between` runs untimed (the agent's drain).
constexpr int kBurst = 2'000;  // 12,000 records: within the ring, as a tick's worth is
// NCCL's proxy thread's calls for one collective while the agent asks for
// proxy steps (detail): per channel a send and a receive operation of
// kProxySteps steps, each step started, moved through its states and
// stopped, as NCCL 2.28 reported a 4 MiB AllReduce's on the H100
// (docs/benchmarks.md): 88 calls.
constexpr int kProxySteps = 4;
void proxy_work(pabi::ProfilerV5* table, void* context, void* coll) {
  pabi::StateArgs args{};
  args.proxy_step.trans_size = 1 << 19;
  for (int ch = 0; ch < 2; ++ch) {
    for (int send = 1; send >= 0; --send) {
      pabi::EventDescrV5 op{};
      op.type = pabi::kProxyOp;
      op.parent = coll;
      op.proxy_op.pid = getpid();  // this process's own (another's, by PXN, is not recorded)
      op.proxy_op.channel_id = static_cast<uint8_t>(ch);
      op.proxy_op.peer = 1;
      op.proxy_op.n_steps = kProxySteps;
      op.proxy_op.chunk_size = 1 << 19;
      op.proxy_op.is_send = send;
      void* o = nullptr;
      table->start_event(context, &o, &op);
      for (int step = 0; step < kProxySteps; ++step) {
        pabi::EventDescrV5 st{};
        st.type = pabi::kProxyStep;
        st.parent = o;
        st.proxy_step.step = step;
        void* h = nullptr;
        table->start_event(context, &h, &st);
        const int states[2][3] = {
            {pabi::kProxyStepRecvWait, pabi::kProxyStepRecvFlushWait, pabi::kProxyStepRecvGpuWait},
            {pabi::kProxyStepSendGpuWait, pabi::kProxyStepSendPeerWait, pabi::kProxyStepSendWait}};
        for (int state : states[send]) table->record_event_state(h, state, &args);
        table->stop_event(h);
      }
      table->stop_event(o);
    }
  }
}

// One collective as NCCL reports it: its start, two kernel channels started
// with their GPU times, its stop, each channel's KernelChStop and stop; with
// `detail`, its proxy work too.
void collective(pabi::ProfilerV5* table, void* context, uint64_t seq, bool detail = false) {
  pabi::EventDescrV5 coll{};
  coll.type = pabi::kColl;
  coll.coll.d.func = "AllReduce";
  coll.coll.d.count = 1 << 20;
  coll.coll.d.datatype = "ncclFloat32";
  coll.coll.d.n_channels = 2;
  coll.coll.d.seq_number = seq;
  pabi::EventDescrV5 kernel{};
  kernel.type = pabi::kKernelCh;
  pabi::StateArgs stop{};
  void* c = nullptr;
  table->start_event(context, &c, &coll);
  void* k[2] = {nullptr, nullptr};
  for (int ch = 0; ch < 2; ++ch) {
    kernel.parent = c;
    kernel.kernel_ch.channel_id = static_cast<uint8_t>(ch);
    kernel.kernel_ch.gpu_start_ns = seq * 1000;
    table->start_event(context, &k[ch], &kernel);
  }
  table->stop_event(c);
  if (detail) proxy_work(table, context, c);
  for (int ch = 0; ch < 2; ++ch) {
    stop.kernel_ch.gpu_stop_ns = seq * 1000 + 500;
    table->record_event_state(k[ch], pabi::kKernelChStop, &stop);
    table->stop_event(k[ch]);
  }
}

Figures run(pabi::ProfilerV5* table, void* context, int collectives, const std::function<void()>& between = {},
            bool detail = false) {
  asm volatile("" : "+r"(table));  // no devirtualising: every call indirect, as NCCL makes them
  std::vector<uint64_t> took(static_cast<size_t>(collectives));
  const int burst = detail ? kBurst / 20 : kBurst;  // ~90 records a collective: a ring's worth between drains
  for (int i = 0; i < collectives; ++i) {
    if (between && i % burst == 0) between();
    uint64_t start = now_ns();
    collective(table, context, static_cast<uint64_t>(i), detail);
    took[static_cast<size_t>(i)] = now_ns() - start;
  }
  std::sort(took.begin(), took.end());
  return {static_cast<double>(took[took.size() / 2]), static_cast<double>(took[took.size() * 99 / 100])};
}

double thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

struct Paced {
  double agent_cpu = 0;  // of one core
  uint64_t collectives = 0, records = 0, sent = 0, dropped = 0;
  size_t batch_bytes = 0;
};

// The agent's side at a real rate: the plugin called for `rate` collectives
// a second for `seconds`, while another thread runs the agent's own reader
// (ProfilerRings, drained every 25 ms tick) and summariser (a batch encoded
// every 100 ms, the agent's default interval), as its main loop does. That
// thread's CPU time is what the GPU side adds to the agent (sending the
// bytes aside).
Paced paced(pabi::ProfilerV5* table, void* context, int rate, double seconds, uint64_t first_seq, bool detail) {
  Paced out;
  std::atomic<bool> done{false}, ready{false};
  double cpu = 0, wall = 0;
  std::thread agent([&] {
    rankscope::SystemClock system;
    rankscope::OffsetClock clock(system, 0);
    rankscope::agent::Summariser summariser("/proc", "bench", clock);
    rankscope::agent::ProfilerRings rings;
    rings.set_detail(detail);
    if (!rings.attach(static_cast<uint32_t>(getpid()), own_start_time())) {
      std::fprintf(stderr, "rankscope-bench-profiler: the agent's reader could not attach\n");
      ready = true;
      return;
    }
    auto take = [&](const rankscope::agent::GpuCollective& c) {
      summariser.on_gpu(c);
      ++out.sent;
    };
    auto batch = [&](uint64_t seq) {
      out.batch_bytes += rankscope::proto::encode_batch(1, seq, now_ns(), [&](auto b) {
                           summariser.fill(b, rankscope::DropCounts{});
                         }).size();
    };
    ready = true;
    const double cpu0 = thread_cpu_ns();
    const uint64_t wall0 = now_ns();
    uint64_t next_batch = wall0 + 100'000'000, seq = 0;
    while (!done.load()) {
      rings.drain(take);
      if (now_ns() >= next_batch) {
        batch(++seq);
        next_batch += 100'000'000;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    rings.drain(take);
    while (!summariser.empty()) batch(++seq);
    cpu = thread_cpu_ns() - cpu0;
    wall = static_cast<double>(now_ns() - wall0);
    out.records = rings.counts().records;
    out.dropped = rings.counts().plugin_dropped;
  });
  while (!ready.load()) std::this_thread::yield();
  const uint64_t n = static_cast<uint64_t>(rate * seconds), t0 = now_ns();
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t due = t0 + i * 1'000'000'000ull / static_cast<uint64_t>(rate);
    timespec at{static_cast<time_t>(due / 1'000'000'000ull), static_cast<long>(due % 1'000'000'000ull)};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, nullptr);
    collective(table, context, first_seq + i, detail);
  }
  out.collectives = n;
  done = true;
  agent.join();
  out.agent_cpu = wall > 0 ? cpu / wall : 0;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int collectives = 200'000, rate = 10'000;
  double seconds = 10;
  std::string plugin, chain;
  po::options_description desc("rankscope-bench-profiler");
  desc.add_options()("help", "this text")("plugin", po::value(&plugin)->required(),
                                          "path of librankscope-nccl-profiler.so")(
      "collectives", po::value(&collectives)->default_value(collectives), "collectives per run")(
      "rate", po::value(&rate)->default_value(rate), "collectives a second in the agent's run")(
      "seconds", po::value(&seconds)->default_value(seconds), "length of the agent's run")(
      "chain", po::value(&chain), "a profiler plugin to chain to (RANKSCOPE_NCCL_PROFILER_CHAIN), timed too");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc;
      return 0;
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rankscope-bench-profiler: %s\n", e.what());
    return 2;
  }
  void* lib = dlopen(plugin.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "rankscope-bench-profiler: %s\n", dlerror());
    return 2;
  }
  auto* table = static_cast<pabi::ProfilerV5*>(dlsym(lib, "ncclProfiler_v5"));
  if (!table) {
    std::fprintf(stderr, "rankscope-bench-profiler: %s has no ncclProfiler_v5\n", plugin.c_str());
    return 2;
  }
  void* context = nullptr;
  int mask = 0;
  table->init(&context, 0x1234, &mask, "bench", 1, 8, 0, nullptr);
  void* noop_context = nullptr;
  noop_table.init(&noop_context, 0, &mask, "bench", 1, 8, 0, nullptr);

  // The agent's side: the ring, mapped, and drained by another thread
  // between bursts of collectives (as the agent drains it once a tick).
  std::string why;
  auto mapped = map_process_ring("/proc", static_cast<uint32_t>(getpid()), own_start_time(), why);
  if (!mapped) {
    std::fprintf(stderr, "rankscope-bench-profiler: the plugin made no ring it can read%s%s\n", why.empty() ? "" : ": ",
                 why.c_str());
    return 2;
  }
  RingView ring = *mapped;
  std::atomic<bool> stop{false}, drain{false};
  std::atomic<uint64_t> drained{0};
  std::thread reader([&] {
    Record r;
    while (!stop.load()) {
      if (!drain.load()) {
        std::this_thread::yield();
        continue;
      }
      while (ring_read(ring, r)) drained.fetch_add(1, std::memory_order_relaxed);
      drain.store(false);
    }
  });
  auto drain_now = [&] {
    drain.store(true);
    while (drain.load()) std::this_thread::yield();
  };

  run(&noop_table, noop_context, collectives / 10);  // warm-up
  Figures floor = run(&noop_table, noop_context, collectives);
  ring.header->reader.store(static_cast<uint32_t>(getpid()));
  uint64_t dropped_before = ring.header->dropped.load();
  Figures read = run(table, context, collectives, drain_now);
  drain_now();
  uint64_t dropped_reading = ring.header->dropped.load() - dropped_before;
  const uint64_t drained_plain = drained.load();
  ring.header->detail.store(1);  // the agent asks for proxy steps (the plugin reads it at the next collective)
  Figures detailed = run(table, context, collectives / 10, drain_now, /*detail=*/true);
  drain_now();
  ring.header->detail.store(0);
  const uint64_t drained_detail = drained.load() - drained_plain;
  const uint64_t dropped_detail = ring.header->dropped.load() - dropped_before - dropped_reading;
  ring.header->reader.store(0);
  Figures unread = run(table, context, collectives);
  // Chained to another plugin: a communicator made with
  // RANKSCOPE_NCCL_PROFILER_CHAIN set (the plugin loads it then), its
  // collectives passed on as well as recorded.
  Figures chained{};
  void* chained_context = nullptr;
  if (!chain.empty()) {
    setenv("RANKSCOPE_NCCL_PROFILER_CHAIN", chain.c_str(), 1);
    table->init(&chained_context, 0x5678, &mask, "bench", 1, 8, 0, nullptr);
    unsetenv("RANKSCOPE_NCCL_PROFILER_CHAIN");
    ring.header->reader.store(static_cast<uint32_t>(getpid()));
    chained = run(table, chained_context, collectives, drain_now);
    drain_now();
    ring.header->reader.store(0);
    table->finalize(chained_context);
  }
  Paced agent = paced(table, context, rate, seconds, 3ull * static_cast<uint64_t>(collectives), false);
  Paced agent_detail = paced(table, context, rate / 10, seconds, 4ull * static_cast<uint64_t>(collectives), true);
  stop.store(true);
  reader.join();
  table->finalize(context);
  unmap_ring(ring);

  std::printf("| run | median ns per collective | p99 ns | median / floor |\n| --- | ---: | ---: | ---: |\n");
  std::printf("| empty table (floor: 8 indirect calls) | %.0f | %.0f | 1.0 |\n", floor.median_ns, floor.p99_ns);
  std::printf("| plugin, ring drained by another thread between bursts | %.0f | %.0f | %.1f |\n", read.median_ns,
              read.p99_ns, read.median_ns / std::max(1.0, floor.median_ns));
  std::printf("| plugin, no reader (counted only) | %.0f | %.0f | %.1f |\n", unread.median_ns, unread.p99_ns,
              unread.median_ns / std::max(1.0, floor.median_ns));
  std::printf("| plugin, ring drained, with NCCL's proxy steps (detail: 88 more calls) | %.0f | %.0f | %.1f |\n",
              detailed.median_ns, detailed.p99_ns, detailed.median_ns / std::max(1.0, floor.median_ns));
  if (!chain.empty())
    std::printf("| plugin, ring drained, chaining to %s (RANKSCOPE_NCCL_PROFILER_CHAIN) | %.0f | %.0f | %.1f |\n",
                chain.substr(chain.rfind('/') + 1).c_str(), chained.median_ns, chained.p99_ns,
                chained.median_ns / std::max(1.0, floor.median_ns));
  std::printf("\n%d collectives per run (%d with proxy steps); %llu records read, %llu dropped while read (ring of "
              "%u); with proxy steps %llu read, %llu dropped.\n",
              collectives, collectives / 10, static_cast<unsigned long long>(drained_plain),
              static_cast<unsigned long long>(dropped_reading), kRingSlots,
              static_cast<unsigned long long>(drained_detail),
              static_cast<unsigned long long>(dropped_detail));
  std::printf("\nThe agent's side at %d collectives a second for %.0f s (its reader drained every 25 ms, a batch "
              "encoded every 100 ms): %.2f%% of a core; %llu collectives, %llu records read, %llu GPU records sent, "
              "%llu dropped by the plugin, %.1f wire bytes per collective.\n",
              rate, seconds, agent.agent_cpu * 100, static_cast<unsigned long long>(agent.collectives),
              static_cast<unsigned long long>(agent.records), static_cast<unsigned long long>(agent.sent),
              static_cast<unsigned long long>(agent.dropped),
              agent.sent ? static_cast<double>(agent.batch_bytes) / static_cast<double>(agent.sent) : 0.0);
  std::printf("\nWith NCCL's proxy steps asked for, at %d collectives a second for %.0f s: %.2f%% of a core; %llu "
              "collectives, %llu records read, %llu GPU records sent, %llu dropped by the plugin, %.1f wire bytes per "
              "collective.\n",
              rate / 10, seconds, agent_detail.agent_cpu * 100, static_cast<unsigned long long>(agent_detail.collectives),
              static_cast<unsigned long long>(agent_detail.records), static_cast<unsigned long long>(agent_detail.sent),
              static_cast<unsigned long long>(agent_detail.dropped),
              agent_detail.sent ? static_cast<double>(agent_detail.batch_bytes) / static_cast<double>(agent_detail.sent)
                                : 0.0);
  return 0;
}
