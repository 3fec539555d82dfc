// A stand-in for another NCCL profiler plugin (NVIDIA's NCCL Inspector, say)
// that rankscope's plugin chains to (RANKSCOPE_NCCL_PROFILER_CHAIN): it asks
// for groups (which rankscope does not), collectives and kernel channels,
// and checks that every call it gets is one NCCL could have made to it
// alone: handles and parents its own, a kernel's parent its collective, a
// proxy step's its proxy operation. rankscope_test_chain_set_mask changes
// what it asks for, through the mask NCCL gave it, as a plugin may.
// Its counts: rankscope_test_chain_counts() in-process, and one line per
// process appended to RANKSCOPE_TEST_CHAIN_LOG at its last finalize.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "nccl-profiler/abi.h"

namespace {
namespace abi = rankscope::profiler::abi;

struct Counts {
  std::atomic<int> inits{0}, finalized{0};
  std::atomic<int> groups{0}, colls{0}, kernels{0}, others{0}, proxy_ops{0}, proxy_steps{0};
  std::atomic<int> stops{0}, kernel_stops{0};
  std::atomic<int> foreign{0};  // a handle or parent not its own, or a kernel whose parent is no collective
};
Counts counts;

struct Event {
  uint64_t type = 0;
};
constexpr int kEvents = 1 << 14;
Event events[kEvents];
std::atomic<int> next{0};

bool own(void* handle) {
  auto* e = static_cast<Event*>(handle);
  return e >= events && e < events + kEvents;
}

int* nccl_mask = nullptr;

abi::Result init(void** context, int* mask) {
  *mask = static_cast<int>(abi::kGroup | abi::kColl | abi::kKernelCh);
  nccl_mask = mask;
  counts.inits++;
  *context = &counts;
  return abi::kSuccess;
}

abi::Result start(void* context, void** handle, uint64_t type, void* parent) {
  *handle = nullptr;
  if (context != &counts) counts.foreign++;
  if (parent && !own(parent)) counts.foreign++;
  switch (type) {
    case abi::kGroup: counts.groups++; break;
    case abi::kColl:
      counts.colls++;
      if (parent && static_cast<Event*>(parent)->type != abi::kGroup) counts.foreign++;
      break;
    case abi::kKernelCh:
      counts.kernels++;
      if (!parent || static_cast<Event*>(parent)->type != abi::kColl) counts.foreign++;
      break;
    case abi::kProxyOp:
      counts.proxy_ops++;
      if (!parent || static_cast<Event*>(parent)->type != abi::kColl) counts.foreign++;
      break;
    case abi::kProxyStep:
      counts.proxy_steps++;
      if (!parent || static_cast<Event*>(parent)->type != abi::kProxyOp) counts.foreign++;
      break;
    default: counts.others++; break;  // never asked for
  }
  Event* e = &events[next.fetch_add(1) % kEvents];
  e->type = type;
  *handle = e;
  return abi::kSuccess;
}

abi::Result stop(void* handle) {
  if (!own(handle)) counts.foreign++;
  counts.stops++;
  return abi::kSuccess;
}

abi::Result state(void* handle, int state, abi::StateArgs*) {
  if (!own(handle)) counts.foreign++;
  if (state == abi::kKernelChStop) counts.kernel_stops++;
  return abi::kSuccess;
}

abi::Result finalize(void* context) {
  if (context != &counts) counts.foreign++;
  if (++counts.finalized != counts.inits) return abi::kSuccess;
  if (const char* log = std::getenv("RANKSCOPE_TEST_CHAIN_LOG")) {
    if (FILE* f = std::fopen(log, "a")) {
      std::fprintf(f, "pid=%d inits=%d groups=%d colls=%d kernels=%d kernel_stops=%d stops=%d others=%d foreign=%d\n",
                   getpid(), counts.inits.load(), counts.groups.load(), counts.colls.load(), counts.kernels.load(),
                   counts.kernel_stops.load(), counts.stops.load(), counts.others.load(), counts.foreign.load());
      std::fclose(f);
    }
  }
  return abi::kSuccess;
}

abi::Result init_v5(void** context, uint64_t, int* mask, const char*, int, int, int, abi::Logger) {
  return init(context, mask);
}
abi::Result init_v4(void** context, int* mask, const char*, uint64_t, int, int, int, abi::Logger) {
  return init(context, mask);
}
abi::Result start_v5(void* context, void** handle, abi::EventDescrV5* d) { return start(context, handle, d->type, d->parent); }
abi::Result start_v4(void* context, void** handle, abi::EventDescrV4* d) { return start(context, handle, d->type, d->parent); }
}  // namespace

extern "C" {
__attribute__((visibility("default"))) abi::ProfilerV5 ncclProfiler_v5 = {"test-chained", init_v5, start_v5, stop,
                                                                          state, finalize};
__attribute__((visibility("default"))) abi::ProfilerV4 ncclProfiler_v4 = {"test-chained", init_v4, start_v4, stop,
                                                                          state, finalize};
// Its counts, for a test in the same process: inits, finalized, groups,
// colls, kernels, others, stops, kernel_stops, foreign, proxy_ops, proxy_steps.
__attribute__((visibility("default"))) void rankscope_test_chain_counts(int* out) {
  const int values[] = {counts.inits,        counts.finalized, counts.groups,  counts.colls,
                        counts.kernels,      counts.others,    counts.stops,   counts.kernel_stops,
                        counts.foreign,      counts.proxy_ops, counts.proxy_steps};
  for (int i = 0; i < 11; ++i) out[i] = values[i];
}
// Asks for `mask` from now on (NCCL reads it at its next operation).
__attribute__((visibility("default"))) void rankscope_test_chain_set_mask(int mask) {
  if (nccl_mask) __atomic_store_n(nccl_mask, mask, __ATOMIC_RELAXED);
}
}
