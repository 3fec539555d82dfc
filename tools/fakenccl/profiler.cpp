#include "tools/fakenccl/profiler.h"

#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "nccl-profiler/abi.h"
#include "tools/fakenccl/error.h"

namespace rankscope::fakenccl {
namespace {

namespace abi = ::rankscope::profiler::abi;

// The plugin of this process, loaded at the first communicator.
struct Plugin {
  const abi::ProfilerV5* v5 = nullptr;
  const abi::ProfilerV4* v4 = nullptr;
  bool loaded() const { return v5 || v4; }
};

void* openLibrary(const std::string& name) {
  if (name.find('/') != std::string::npos) return dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  // NCCL's order: libnccl-profiler-NAME.so, then NAME itself, on the library path.
  if (void* lib = dlopen(("libnccl-profiler-" + name + ".so").c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
  return dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
}

const Plugin& plugin() {
  static Plugin loaded;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* name = std::getenv("NCCL_PROFILER_PLUGIN");
    if (name == nullptr || *name == '\0' || std::strcmp(name, "none") == 0) return;
    void* lib = openLibrary(name);
    if (lib == nullptr) {
      warn("NCCL_PROFILER_PLUGIN=%s: cannot load it (%s); running without a profiler plugin", name, dlerror());
      return;
    }
    loaded.v5 = static_cast<const abi::ProfilerV5*>(dlsym(lib, "ncclProfiler_v5"));
    if (!loaded.v5) loaded.v4 = static_cast<const abi::ProfilerV4*>(dlsym(lib, "ncclProfiler_v4"));
    if (!loaded.loaded())
      warn("NCCL_PROFILER_PLUGIN=%s: neither ncclProfiler_v5 nor ncclProfiler_v4 in it; running without", name);
  });
  return loaded;
}

// %globaltimer as modelled: the wall clock in ns, plus the GPU's own error.
uint64_t gpuNow() {
  static const int64_t offset = [] {
    const char* env = std::getenv("FAKECUDA_GPU_CLOCK_OFFSET_NS");
    return env ? std::strtoll(env, nullptr, 10) : 0;
  }();
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec + offset);
}

// NCCL's logger as plugins get it: a message is printed when NCCL_DEBUG
// asks for its level (VERSION 1, WARN 2, INFO 3, TRACE 5), else dropped.
void pluginLog(int level, unsigned long, const char*, int, const char* format, ...) {
  static const int wanted = [] {
    const char* env = std::getenv("NCCL_DEBUG");
    if (!env) return 0;
    const std::string v = env;
    return v == "VERSION" ? 1 : v == "WARN" ? 2 : v == "INFO" ? 3 : v == "TRACE" ? 5 : 0;
  }();
  if (level <= 0 || level > wanted) return;
  char text[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  std::fprintf(stderr, "NCCL %s %s\n", level == 2 ? "WARN" : "INFO", text);
}

// NCCL's activation mask: one per process, given to every init.
int activationMask = 0;

// Both versions' descriptors from one description.
struct Event {
  uint64_t type = 0;
  void* parent = nullptr;
  int rank = 0;
  abi::CollDescr coll{};
  abi::P2pDescr p2p{};
  abi::KernelChDescr kernel{};
  abi::ProxyOpDescr proxyOp{};
  int step = 0;
};

}  // namespace

std::unique_ptr<ProfilerComm> ProfilerComm::open(uint64_t commHash, int nranks, int rank) {
  const Plugin& p = plugin();
  if (!p.loaded()) return nullptr;
  std::unique_ptr<ProfilerComm> comm(new ProfilerComm(rank));
  // NCCL enables nothing until the plugin says what it wants.
  const std::string name = "fakenccl";
  abi::Result result = p.v5 ? p.v5->init(&comm->context_, commHash, &activationMask, name.c_str(), 1, nranks, rank,
                                         pluginLog)
                            : p.v4->init(&comm->context_, &activationMask, name.c_str(), commHash, 1, nranks, rank,
                                         pluginLog);
  if (result != abi::kSuccess) {
    warn("the profiler plugin's init failed (%d) for rank %d: this communicator runs without it", result, rank);
    return nullptr;
  }
  return comm;
}

ProfilerComm::~ProfilerComm() {
  const Plugin& p = plugin();
  if (p.v5) p.v5->finalize(context_);
  if (p.v4) p.v4->finalize(context_);
}

namespace {
void* startEvent(void* context, const Event& e) {
  const Plugin& p = plugin();
  void* handle = nullptr;
  if (p.v5) {
    abi::EventDescrV5 d{};
    d.type = e.type;
    d.parent = e.parent;
    d.rank = e.rank;
    if (e.type == abi::kColl) d.coll.d = e.coll;
    if (e.type == abi::kP2p) d.p2p.d = e.p2p;
    if (e.type == abi::kKernelCh) d.kernel_ch = e.kernel;
    if (e.type == abi::kProxyOp) d.proxy_op = e.proxyOp;
    if (e.type == abi::kProxyStep) d.proxy_step.step = e.step;
    p.v5->start_event(context, &handle, &d);
  } else {
    abi::EventDescrV4 d{};
    d.type = static_cast<uint8_t>(e.type);
    d.parent = e.parent;
    d.rank = e.rank;
    if (e.type == abi::kColl) d.coll = e.coll;
    if (e.type == abi::kP2p) d.p2p = e.p2p;
    if (e.type == abi::kKernelCh) d.kernel_ch = e.kernel;
    if (e.type == abi::kProxyOp) d.proxy_op = e.proxyOp;
    if (e.type == abi::kProxyStep) d.proxy_step.step = e.step;
    p.v4->start_event(context, &handle, &d);
  }
  return handle;
}

void stopEvent(void* handle) {
  if (handle == nullptr) return;
  const Plugin& p = plugin();
  p.v5 ? p.v5->stop_event(handle) : p.v4->stop_event(handle);
}

void recordState(void* handle, int state, abi::StateArgs* args) {
  if (handle == nullptr) return;
  const Plugin& p = plugin();
  p.v5 ? p.v5->record_event_state(handle, state, args) : p.v4->record_event_state(handle, state, args);
}
}  // namespace

int ProfilerComm::mask() const { return __atomic_load_n(&activationMask, __ATOMIC_RELAXED); }

void* ProfilerComm::enqueued(const CollectiveCall& call, uint64_t seqNumber) {
  Event e;
  e.rank = rank_;
  const bool p2p = call.kind == OpKind::kSend || call.kind == OpKind::kRecv;
  e.type = p2p ? abi::kP2p : abi::kColl;
  if (!(static_cast<uint64_t>(call.profilerMask) & abi::started_for(e.type))) return nullptr;
  if (p2p) {
    e.p2p.func = call.kind == OpKind::kSend ? "Send" : "Recv";
    e.p2p.buff = call.recvbuff;
    e.p2p.datatype = datatypeName(call.datatype);
    e.p2p.count = call.count;
    e.p2p.peer = call.root;
    e.p2p.n_channels = 1;
  } else {
    e.coll.seq_number = seqNumber;
    e.coll.func = opKindName(call.kind);
    e.coll.send_buff = call.sendbuff;
    e.coll.recv_buff = call.recvbuff;
    e.coll.count = call.count;
    e.coll.root = call.root;
    e.coll.datatype = datatypeName(call.datatype);
    e.coll.n_channels = 1;
    e.coll.algo = "RING";
    e.coll.proto = "SIMPLE";
  }
  void* handle = startEvent(context_, e);
  stopEvent(handle);  // enqueued; the handle stays the parent of its kernel
  return handle;
}

void* ProfilerComm::kernelStarted(void* call) {
  if (call == nullptr || !(mask() & static_cast<int>(abi::kKernelCh))) return nullptr;
  Event e;
  e.rank = rank_;
  e.type = abi::kKernelCh;
  e.parent = call;
  e.kernel.channel_id = 0;
  e.kernel.gpu_start_ns = gpuNow();
  return startEvent(context_, e);
}

void ProfilerComm::kernelStopped(void* kernel) {
  if (kernel == nullptr) return;
  abi::StateArgs args{};
  args.kernel_ch.gpu_stop_ns = gpuNow();
  recordState(kernel, abi::kKernelChStop, &args);
  stopEvent(kernel);
}

// As NCCL's proxy thread reports a send: the operation (its parent is the
// call's event), one step, its data ready on the GPU (SendGPUWait) and at
// once handed to the network (SendWait, with its size); both stop when the
// network is done with it.
void ProfilerComm::posted(const SendSegment& segment, bool handed) {
  // The mask as it was when the call was enqueued: NCCL decides then
  // whether a call's proxy work reports events.
  const auto mask = static_cast<uint64_t>(segment.ownerMask);
  if (segment.owner == nullptr || !(mask & abi::started_for(abi::kProxyOp))) return;
  Event op;
  op.rank = rank_;
  op.type = abi::kProxyOp;
  op.parent = segment.owner;
  op.proxyOp.pid = ::getpid();
  op.proxyOp.channel_id = 0;
  op.proxyOp.peer = segment.peer;
  op.proxyOp.n_steps = 1;
  op.proxyOp.chunk_size = static_cast<int>(std::min<uint64_t>(segment.header.bytes, INT32_MAX));
  op.proxyOp.is_send = 1;
  Proxy proxy;
  proxy.op = startEvent(context_, op);
  if (proxy.op == nullptr) return;
  if (mask & abi::started_for(abi::kProxyStep)) {
    Event step;
    step.rank = rank_;
    step.type = abi::kProxyStep;
    step.parent = proxy.op;
    step.step = 0;
    proxy.step = startEvent(context_, step);
    abi::StateArgs args{};
    recordState(proxy.step, abi::kProxyStepSendGpuWait, &args);
    args.proxy_step.trans_size = segment.header.bytes;
    if (handed) recordState(proxy.step, abi::kProxyStepSendWait, &args);
  }
  proxies_[&segment] = proxy;
}

void ProfilerComm::abandonSends() {
  for (auto& [segment, proxy] : proxies_) {
    stopEvent(proxy.step);
    stopEvent(proxy.op);
  }
  proxies_.clear();
}

void ProfilerComm::done(const SendSegment& segment) {
  auto it = proxies_.find(&segment);
  if (it == proxies_.end()) return;
  stopEvent(it->second.step);
  stopEvent(it->second.op);
  proxies_.erase(it);
}

}  // namespace rankscope::fakenccl
