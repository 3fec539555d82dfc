#pragma once
// NCCL's profiler-plugin interface, versions 5 (NCCL 2.28 and later, which
// adapt it for their own newer versions) and 4 (NCCL 2.27), declared from
// NCCL's public plugin headers (plugins/profiler/example/nccl/profiler_v5.h
// and profiler_v4.h in NVIDIA/nccl). Only the layout matters: NCCL passes
// these structs by pointer and finds the plugin's table by the symbol names
// ncclProfiler_v5 and ncclProfiler_v4. tests/unit/profiler_abi_test.cpp
// holds every size and offset used here to NCCL's, x86-64.
#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace rankscope::profiler::abi {

using Result = int;  // ncclResult_t: ncclSuccess = 0
constexpr Result kSuccess = 0;

// Event types: the activation mask's bits and a descriptor's `type`.
enum EventType : uint64_t {
  kGroup = 1 << 0,
  kColl = 1 << 1,       // a collective as NCCL schedules it (seqNumber)
  kP2p = 1 << 2,        // a Send or Recv
  kProxyOp = 1 << 3,    // the network proxy's work for one channel and peer
  kProxyStep = 1 << 4,  // one step (chunk) of a proxy operation
  kProxyCtrl = 1 << 5,
  kKernelCh = 1 << 6,  // a kernel's channel, with the GPU's %globaltimer
  kNetPlugin = 1 << 7,
  // v5 only (NCCL 2.28): API calls and kernel launches.
  kGroupApi = 1 << 8,
  kCollApi = 1 << 9,
  kP2pApi = 1 << 10,
  kKernelLaunch = 1 << 11,
};

// NCCL starts an event of `type` when its activation mask holds that type
// or one reported only beneath it (its children need a parent): the
// conditions of src/plugin/profiler.cc in NCCL 2.28. A plugin that asks
// for kernel channels alone hears collectives and p2p operations too.
constexpr uint64_t started_for(uint64_t type) {
  constexpr uint64_t kBelowTask = kProxyOp | kProxyStep | kKernelCh | kNetPlugin;
  switch (type) {
    case kGroupApi:
      return kGroupApi | kCollApi | kP2pApi | kKernelLaunch | kGroup | kColl | kP2p | kBelowTask;
    case kCollApi: return kCollApi | kColl | kBelowTask;
    case kP2pApi: return kP2pApi | kP2p | kBelowTask;
    case kGroup: return kGroup | kColl | kP2p | kBelowTask;
    case kColl: return kColl | kBelowTask;
    case kP2p: return kP2p | kBelowTask;
    case kProxyOp: return kProxyOp | kProxyStep | kNetPlugin;
    case kProxyStep: return kProxyStep | kNetPlugin;
    default: return type;  // kProxyCtrl, kKernelCh, kNetPlugin, kKernelLaunch
  }
}

// The types NCCL 2.28 gives an event of `type` as its parent (parentObj);
// 0: none.
constexpr uint64_t parent_types(uint64_t type) {
  switch (type) {
    case kColl: return kCollApi;
    case kP2p: return kP2pApi;
    case kCollApi:
    case kP2pApi:
    case kKernelLaunch: return kGroupApi;
    case kKernelCh:
    case kProxyOp: return kColl | kP2p;
    case kProxyStep: return kProxyOp;
    case kNetPlugin: return kProxyStep;
    default: return 0;
  }
}

// recordEventState's states that rankscope reads (the rest are ignored).
enum State : int {
  kProxyStepSendGpuWait = 8,
  kProxyStepSendWait = 9,
  kProxyStepRecvWait = 10,
  kProxyStepRecvFlushWait = 11,
  kProxyStepRecvGpuWait = 12,
  kProxyOpInProgress = 19,
  kProxyStepSendPeerWait = 20,
  kKernelChStop = 22,
};

using Logger = void (*)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

struct CollDescr {
  uint64_t seq_number;  // per communicator: equal on every rank for the same collective
  const char* func;     // "AllReduce", ...
  const void* send_buff;
  void* recv_buff;
  size_t count;
  int root;
  const char* datatype;
  uint8_t n_channels;
  uint8_t n_warps;
  const char* algo;
  const char* proto;
};
struct P2pDescr {
  const char* func;  // "Send", "Recv"
  void* buff;
  const char* datatype;
  size_t count;
  int peer;
  uint8_t n_channels;
};
struct ProxyOpDescr {
  pid_t pid;
  uint8_t channel_id;
  int peer;
  int n_steps;
  int chunk_size;
  int is_send;
};
struct KernelChDescr {
  uint8_t channel_id;
  uint64_t gpu_start_ns;  // %globaltimer when the channel's kernel started
};

// v5: `type` is 64 bits; coll and p2p end with a parent-group pointer.
struct EventDescrV5 {
  uint64_t type;
  void* parent;
  int rank;
  union {
    struct {
      CollDescr d;
      void* parent_group;
    } coll;
    struct {
      P2pDescr d;
      void* parent_group;
    } p2p;
    ProxyOpDescr proxy_op;
    struct {
      int step;
    } proxy_step;
    KernelChDescr kernel_ch;
    struct {
      int64_t id;
      void* data;
    } net_plugin;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graph_captured;
    } coll_api;  // the largest of the API events (not enabled)
  };
};

// v4: `type` is 8 bits.
struct EventDescrV4 {
  uint8_t type;
  void* parent;
  int rank;
  union {
    CollDescr coll;
    P2pDescr p2p;
    ProxyOpDescr proxy_op;
    struct {
      int step;
    } proxy_step;
    KernelChDescr kernel_ch;
    struct {
      int64_t id;
      void* data;
    } net_plugin;
  };
};

// The same in v4 and v5.
union StateArgs {
  struct {
    size_t trans_size;
  } proxy_step;
  struct {
    int appended_proxy_ops;
  } proxy_ctrl;
  struct {
    void* data;
  } net_plugin;
  struct {
    uint64_t gpu_stop_ns;  // %globaltimer at kKernelChStop
  } kernel_ch;
};

struct ProfilerV5 {
  const char* name;
  Result (*init)(void** context, uint64_t comm_hash, int* activation_mask, const char* comm_name, int n_nodes,
                 int nranks, int rank, Logger log);
  Result (*start_event)(void* context, void** handle, EventDescrV5* descr);
  Result (*stop_event)(void* handle);
  Result (*record_event_state)(void* handle, int state, StateArgs* args);
  Result (*finalize)(void* context);
};

struct ProfilerV4 {
  const char* name;
  Result (*init)(void** context, int* activation_mask, const char* comm_name, uint64_t comm_hash, int n_nodes,
                 int nranks, int rank, Logger log);
  Result (*start_event)(void* context, void** handle, EventDescrV4* descr);
  Result (*stop_event)(void* handle);
  Result (*record_event_state)(void* handle, int state, StateArgs* args);
  Result (*finalize)(void* context);
};

}  // namespace rankscope::profiler::abi
