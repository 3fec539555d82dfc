// libcudart.so.13 stand-in: the part of the CUDA runtime API that NCCL programs
// use, on a machine without a GPU.
//
// "Device" memory is host memory. Each stream is a FIFO of host work run by one
// worker thread, so work queued on a stream runs in order, after the caller has
// moved on, and cudaStreamSynchronize waits for it: the same asynchrony a
// tracer sees with real kernels. The NULL stream is one such stream per device.
// Simplification: the legacy NULL stream does not implicitly order itself with
// the other streams; only the synchronous calls (cudaMemcpy, cudaMemset,
// cudaFree) wait for every stream of the device, as they do on a GPU.
//
// Every function is compiled against NVIDIA's cuda_runtime_api.h, so names and
// signatures are the real ones; libcudart.map gives them the real symbol
// version (libcudart.so.13) so binaries built against either library load the
// other.

#include <algorithm>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tools/fakenccl/fakecuda.h"

// Opaque in driver_types.h; this library gives them their content.
struct CUstream_st {
  std::mutex mu;
  std::condition_variable cv;  // signalled on new work, completion, destroy
  std::deque<std::function<void()>> queue;
  uint64_t enqueued = 0;   // work items ever queued
  uint64_t completed = 0;  // work items that have finished running
  bool destroyed = false;  // finish the queue, then let the worker exit
};

namespace rankscope::fakecuda {
namespace {

// ---------------------------------------------------------------- errors --

thread_local cudaError_t tlsLastError = cudaSuccess;

// Every failing call leaves its code for cudaGetLastError, as the runtime does.
cudaError_t fail(cudaError_t error) {
  tlsLastError = error;
  return error;
}

struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};

// The codes this stand-in returns, with the runtime's names and wording.
constexpr ErrorText kErrorTexts[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const ErrorText* findErrorText(cudaError_t code) {
  for (const ErrorText& entry : kErrorTexts) {
    if (entry.code == code) return &entry;
  }
  return nullptr;
}

// --------------------------------------------------------------- devices --

constexpr int kDefaultDeviceCount = 8;

// FAKECUDA_DEVICES=N pretends the machine has N GPUs (0 means none).
int physicalDeviceCount() {
  const char* env = std::getenv("FAKECUDA_DEVICES");
  if (env == nullptr || *env == '\0') return kDefaultDeviceCount;
  char* end = nullptr;
  long value = std::strtol(env, &end, 10);
  if (*end != '\0' || value < 0 || value > 1024) {
    std::fprintf(stderr, "fakecuda: ignoring FAKECUDA_DEVICES=%s (want 0..1024); using %d\n", env, kDefaultDeviceCount);
    return kDefaultDeviceCount;
  }
  return static_cast<int>(value);
}

// The physical GPU behind each device ordinal of this process. As with the
// driver, CUDA_VISIBLE_DEVICES (read once, at the first call) narrows and
// orders them: a comma-separated list of ordinals, taken up to the first
// entry that is not a valid, unused one.
const std::vector<int>& visibleDevices() {
  static const std::vector<int> devices = [] {
    const int physical = physicalDeviceCount();
    std::vector<int> visible;
    const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
    if (env == nullptr) {
      for (int d = 0; d < physical; ++d) visible.push_back(d);
      return visible;
    }
    for (const char* cursor = env; *cursor != '\0';) {
      char* end = nullptr;
      long ordinal = std::strtol(cursor, &end, 10);
      const bool valid = end != cursor && (*end == ',' || *end == '\0') && ordinal >= 0 && ordinal < physical &&
                         std::find(visible.begin(), visible.end(), ordinal) == visible.end();
      if (!valid) break;
      visible.push_back(static_cast<int>(ordinal));
      cursor = *end == ',' ? end + 1 : end;
    }
    return visible;
  }();
  return devices;
}

int deviceCount() {
  return static_cast<int>(visibleDevices().size());
}

bool validDevice(int device) {
  return device >= 0 && device < deviceCount();
}

thread_local int tlsDevice = 0;

// --------------------------------------------------------------- runtime --

struct Allocation {
  size_t size;
  int device;
  cudaMemoryType type;
};

}  // namespace

struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // cudaEventRecord calls so far
  uint64_t completed = 0;  // the latest record whose stream work has run
  std::chrono::steady_clock::time_point when;
};

}  // namespace rankscope::fakecuda

struct CUevent_st {
  unsigned flags;
  // Shared with the stream work that completes a record, which may run after
  // cudaEventDestroy (the runtime allows destroying an event still pending).
  std::shared_ptr<rankscope::fakecuda::EventState> state = std::make_shared<rankscope::fakecuda::EventState>();
};

namespace rankscope::fakecuda {
namespace {

struct Runtime {
  std::mutex mu;
  // Streams the user may name (cudaStreamCreate* until cudaStreamDestroy).
  std::unordered_map<CUstream_st*, std::shared_ptr<CUstream_st>> userStreams;
  // Every stream ever started per device, for the device-wide waits; a
  // destroyed stream stays until its worker has drained it.
  std::vector<std::vector<std::weak_ptr<CUstream_st>>> deviceStreams;
  std::vector<std::shared_ptr<CUstream_st>> defaultStreams;  // created lazily
  std::unordered_set<CUevent_st*> events;
  std::map<uintptr_t, Allocation> allocations;  // keyed by base address
};

// Never destroyed: stream workers may still run while the process exits.
Runtime& runtime() {
  static Runtime* instance = [] {
    auto* r = new Runtime;
    r->deviceStreams.resize(deviceCount());
    r->defaultStreams.resize(deviceCount());
    return r;
  }();
  return *instance;
}

// --------------------------------------------------------------- streams --

// FAKECUDA_GPU_DELAY_US=N: a slow GPU. Each work item on this process's
// streams starts N microseconds after the stream reached it (the kernels
// before it ran slow), while the host goes on issuing on time. With
// FAKECUDA_GPU_DELAY_AFTER=M, from the process's M-th work item on (a GPU
// that slows down while the job runs).
std::chrono::microseconds gpuDelay() {
  static const std::chrono::microseconds delay = [] {
    const char* env = std::getenv("FAKECUDA_GPU_DELAY_US");
    return std::chrono::microseconds(env ? std::strtoll(env, nullptr, 10) : 0);
  }();
  static const long long after = [] {
    const char* env = std::getenv("FAKECUDA_GPU_DELAY_AFTER");
    return env ? std::strtoll(env, nullptr, 10) : 0;
  }();
  static std::atomic<long long> items{0};
  if (delay.count() == 0) return delay;
  return items.fetch_add(1, std::memory_order_relaxed) >= after ? delay : std::chrono::microseconds(0);
}

// FAKECUDA_GPU_HANG_FILE=PATH: a hung GPU. Once PATH exists, this process's
// streams stop: the next work item never starts (a kernel before it never
// finished), nor anything queued behind it; the host goes on until it waits
// for them.
bool gpuHung() {
  static const char* path = std::getenv("FAKECUDA_GPU_HANG_FILE");
  return path && *path && ::access(path, F_OK) == 0;
}

void runStreamWorker(std::shared_ptr<CUstream_st> stream) {
  std::unique_lock lock(stream->mu);
  for (;;) {
    stream->cv.wait(lock, [&] { return !stream->queue.empty() || stream->destroyed; });
    if (stream->queue.empty()) return;  // destroyed and drained
    std::function<void()> work = std::move(stream->queue.front());
    stream->queue.pop_front();
    lock.unlock();
    if (gpuHung())
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    if (auto delay = gpuDelay(); delay.count() > 0) std::this_thread::sleep_for(delay);
    work();
    lock.lock();
    ++stream->completed;
    stream->cv.notify_all();
  }
}

// Caller holds runtime().mu.
std::shared_ptr<CUstream_st> startStreamLocked(int device) {
  auto stream = std::make_shared<CUstream_st>();
  auto& list = runtime().deviceStreams[device];
  std::erase_if(list, [](const std::weak_ptr<CUstream_st>& s) { return s.expired(); });
  list.push_back(stream);
  std::thread(runStreamWorker, stream).detach();
  return stream;
}

bool isNullStream(cudaStream_t handle) {
  return handle == nullptr || handle == cudaStreamLegacy || handle == cudaStreamPerThread;
}

// The stream a handle names; the NULL stream (and the per-thread default
// stream, treated alike here) is `device`'s default stream. Empty when the
// handle names no live stream.
std::shared_ptr<CUstream_st> findStream(cudaStream_t handle, int device) {
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  if (isNullStream(handle)) {
    if (!validDevice(device)) return nullptr;
    auto& stream = rt.defaultStreams[device];
    if (!stream) stream = startStreamLocked(device);
    return stream;
  }
  auto it = rt.userStreams.find(handle);
  return it == rt.userStreams.end() ? nullptr : it->second;
}

void enqueue(CUstream_st& stream, std::function<void()> work) {
  std::lock_guard lock(stream.mu);
  stream.queue.push_back(std::move(work));
  ++stream.enqueued;
  stream.cv.notify_all();
}

// Blocks until everything queued on `stream` before this call has run.
void drainStream(CUstream_st& stream) {
  std::unique_lock lock(stream.mu);
  const uint64_t ticket = stream.enqueued;
  stream.cv.wait(lock, [&] { return stream.completed >= ticket; });
}

bool streamIdle(CUstream_st& stream) {
  std::lock_guard lock(stream.mu);
  return stream.completed == stream.enqueued;
}

void drainDevice(int device) {
  if (!validDevice(device)) return;
  std::vector<std::shared_ptr<CUstream_st>> streams;
  {
    Runtime& rt = runtime();
    std::lock_guard lock(rt.mu);
    for (const auto& weak : rt.deviceStreams[device]) {
      if (auto stream = weak.lock()) streams.push_back(std::move(stream));
    }
  }
  for (const auto& stream : streams) drainStream(*stream);
}

// ---------------------------------------------------------------- events --

bool knownEvent(cudaEvent_t event) {
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  return event != nullptr && rt.events.count(event) != 0;
}

bool eventDone(EventState& state) {
  std::lock_guard lock(state.mu);
  return state.completed == state.recorded;
}

// ---------------------------------------------------------------- memory --

constexpr size_t kAllocationAlignment = 256;  // cudaMalloc's documented minimum

cudaError_t allocate(void** ptr, size_t size, cudaMemoryType type) {
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  const size_t rounded = (size + kAllocationAlignment - 1) / kAllocationAlignment * kAllocationAlignment;
  void* memory = std::aligned_alloc(kAllocationAlignment, rounded);
  if (memory == nullptr) return fail(cudaErrorMemoryAllocation);
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  rt.allocations[reinterpret_cast<uintptr_t>(memory)] = {size, tlsDevice, type};
  *ptr = memory;
  return cudaSuccess;
}

cudaError_t release(void* ptr, cudaMemoryType type) {
  if (ptr == nullptr) return cudaSuccess;
  int device;
  {
    // Forgotten first, so that a second free of the same pointer fails
    // instead of freeing twice.
    Runtime& rt = runtime();
    std::lock_guard lock(rt.mu);
    auto it = rt.allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == rt.allocations.end() || it->second.type != type) {
      return fail(cudaErrorInvalidValue);
    }
    device = it->second.device;
    rt.allocations.erase(it);
  }
  // cudaFree synchronizes the device; here that also keeps queued work from
  // touching freed memory.
  drainDevice(device);
  std::free(ptr);
  return cudaSuccess;
}

// The allocation that contains `ptr`, if any.
std::optional<Allocation> findAllocation(const void* ptr) {
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  auto it = rt.allocations.upper_bound(address);
  if (it == rt.allocations.begin()) return std::nullopt;
  --it;
  if (address >= it->first + it->second.size) return std::nullopt;
  return it->second;
}

// The attributes programs commonly ask for, of an H100-like device (compute
// capability 9.0); empty for the others.
std::optional<int> deviceAttribute(cudaDeviceAttr attr, int device) {
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      return 1024;
    case cudaDevAttrWarpSize:
      return 32;
    case cudaDevAttrMultiProcessorCount:
      return 132;
    case cudaDevAttrComputeCapabilityMajor:
      return 9;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      return 48 * 1024;
    case cudaDevAttrPciBusId:
      return visibleDevices()[device] + 1;
    case cudaDevAttrUnifiedAddressing:
    case cudaDevAttrConcurrentKernels:
      return 1;
    case cudaDevAttrComputeCapabilityMinor:
    case cudaDevAttrPciDeviceId:
    case cudaDevAttrPciDomainId:
    case cudaDevAttrIntegrated:
      return 0;
    default:
      return std::nullopt;
  }
}

bool validCopyKind(cudaMemcpyKind kind) {
  return kind >= cudaMemcpyHostToHost && kind <= cudaMemcpyDefault;
}

}  // namespace
}  // namespace rankscope::fakecuda

using namespace rankscope::fakecuda;

extern "C" {

// ------------------------------------------------------- fakecuda bridge --

FAKENCCL_EXPORT cudaError_t fakecuda_stream_enqueue(cudaStream_t handle, int device, fakecuda_work_fn fn, void* arg) {
  std::shared_ptr<CUstream_st> stream = findStream(handle, device);
  if (!stream) return cudaErrorInvalidResourceHandle;
  enqueue(*stream, [fn, arg] { fn(arg); });
  return cudaSuccess;
}

FAKENCCL_EXPORT int fakecuda_stream_is_valid(cudaStream_t handle, int device) {
  return findStream(handle, device) != nullptr;
}

FAKENCCL_EXPORT int fakecuda_device_count(void) {
  return deviceCount();
}

FAKENCCL_EXPORT int fakecuda_current_device(void) {
  return tlsDevice;
}

// --------------------------------------------------------------- errors --

FAKENCCL_EXPORT cudaError_t cudaGetLastError(void) {
  cudaError_t error = tlsLastError;
  tlsLastError = cudaSuccess;
  return error;
}

FAKENCCL_EXPORT cudaError_t cudaPeekAtLastError(void) {
  return tlsLastError;
}

FAKENCCL_EXPORT const char* cudaGetErrorName(cudaError_t error) {
  const ErrorText* entry = findErrorText(error);
  return entry != nullptr ? entry->name : "cudaErrorUnknown";
}

FAKENCCL_EXPORT const char* cudaGetErrorString(cudaError_t error) {
  const ErrorText* entry = findErrorText(error);
  return entry != nullptr ? entry->text : "unrecognized error code";
}

// ------------------------------------------------------ versions, devices --

FAKENCCL_EXPORT cudaError_t cudaDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return fail(cudaErrorInvalidValue);
  *driverVersion = CUDART_VERSION;
  return cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaRuntimeGetVersion(int* runtimeVersion) {
  if (runtimeVersion == nullptr) return fail(cudaErrorInvalidValue);
  *runtimeVersion = CUDART_VERSION;
  return cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = deviceCount();
  return *count == 0 ? fail(cudaErrorNoDevice) : cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaSetDevice(int device) {
  if (!validDevice(device)) return fail(cudaErrorInvalidDevice);
  tlsDevice = device;
  return cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = tlsDevice;
  return cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return fail(cudaErrorInvalidValue);
  if (!validDevice(device)) return fail(cudaErrorInvalidDevice);
  std::optional<int> known = deviceAttribute(attr, device);
  if (!known) return fail(cudaErrorInvalidValue);
  *value = *known;
  return cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (!validDevice(device)) return fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  const int physical = visibleDevices()[device];
  std::snprintf(prop->name, sizeof(prop->name), "fakecuda GPU %d", physical);
  prop->uuid.bytes[0] = static_cast<char>(physical);
  prop->totalGlobalMem = size_t{80} << 30;
  prop->sharedMemPerBlock = size_t{48} * 1024;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->concurrentKernels = 1;
  prop->pciBusID = physical + 1;
  prop->unifiedAddressing = 1;
  return cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaDeviceSynchronize(void) {
  drainDevice(tlsDevice);
  return cudaSuccess;
}

// --------------------------------------------------------------- streams --

// Flags and priority change nothing here: every stream is its own FIFO with
// its own thread, and there is no device scheduler to prioritise.
FAKENCCL_EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t* pStream, unsigned int /*flags*/,
                                                         int /*priority*/) {
  if (pStream == nullptr) return fail(cudaErrorInvalidValue);
  if (!validDevice(tlsDevice)) return fail(cudaErrorNoDevice);
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  std::shared_ptr<CUstream_st> stream = startStreamLocked(tlsDevice);
  rt.userStreams[stream.get()] = stream;
  *pStream = stream.get();
  return cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  return cudaStreamCreateWithPriority(pStream, flags, 0);
}

FAKENCCL_EXPORT cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
  return cudaStreamCreateWithPriority(pStream, cudaStreamDefault, 0);
}

// Returns at once, like the runtime: work already queued still runs, and the
// worker exits when the queue is empty.
FAKENCCL_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t handle) {
  std::shared_ptr<CUstream_st> stream;
  {
    Runtime& rt = runtime();
    std::lock_guard lock(rt.mu);
    auto it = rt.userStreams.find(handle);
    if (it == rt.userStreams.end()) return fail(cudaErrorInvalidResourceHandle);
    stream = std::move(it->second);
    rt.userStreams.erase(it);
  }
  std::lock_guard lock(stream->mu);
  stream->destroyed = true;
  stream->cv.notify_all();
  return cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t handle) {
  std::shared_ptr<CUstream_st> stream = findStream(handle, tlsDevice);
  if (!stream) return fail(cudaErrorInvalidResourceHandle);
  drainStream(*stream);
  return cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaStreamQuery(cudaStream_t handle) {
  std::shared_ptr<CUstream_st> stream = findStream(handle, tlsDevice);
  if (!stream) return fail(cudaErrorInvalidResourceHandle);
  // cudaErrorNotReady is an answer, not a failure: it is not left for
  // cudaGetLastError.
  return streamIdle(*stream) ? cudaSuccess : cudaErrorNotReady;
}

FAKENCCL_EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t handle, cudaHostFn_t fn, void* userData) {
  if (fn == nullptr) return fail(cudaErrorInvalidValue);
  std::shared_ptr<CUstream_st> stream = findStream(handle, tlsDevice);
  if (!stream) return fail(cudaErrorInvalidResourceHandle);
  enqueue(*stream, [fn, userData] { fn(userData); });
  return cudaSuccess;
}

// ---------------------------------------------------------------- events --

FAKENCCL_EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr) return fail(cudaErrorInvalidValue);
  auto* created = new CUevent_st{flags};
  Runtime& rt = runtime();
  std::lock_guard lock(rt.mu);
  rt.events.insert(created);
  *event = created;
  return cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

FAKENCCL_EXPORT cudaError_t cudaEventDestroy(cudaEvent_t event) {
  {
    Runtime& rt = runtime();
    std::lock_guard lock(rt.mu);
    if (event == nullptr || rt.events.erase(event) == 0) {
      return fail(cudaErrorInvalidResourceHandle);
    }
  }
  delete event;
  return cudaSuccess;
}

// The event completes when the stream reaches this point; a later record
// supersedes an earlier one, as in the runtime.
FAKENCCL_EXPORT cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t handle) {
  if (!knownEvent(event)) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<CUstream_st> stream = findStream(handle, tlsDevice);
  if (!stream) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<EventState> state = event->state;
  uint64_t generation;
  {
    std::lock_guard lock(state->mu);
    generation = ++state->recorded;
  }
  enqueue(*stream, [state, generation] {
    std::lock_guard lock(state->mu);
    state->completed = std::max(state->completed, generation);
    state->when = std::chrono::steady_clock::now();
    state->cv.notify_all();
  });
  return cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!knownEvent(event)) return fail(cudaErrorInvalidResourceHandle);
  return eventDone(*event->state) ? cudaSuccess : cudaErrorNotReady;
}

FAKENCCL_EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!knownEvent(event)) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<EventState> state = event->state;
  std::unique_lock lock(state->mu);
  const uint64_t generation = state->recorded;
  state->cv.wait(lock, [&] { return state->completed >= generation; });
  return cudaSuccess;
}

// Work queued on `stream` after this call waits for the event's latest record.
FAKENCCL_EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t handle, cudaEvent_t event, unsigned int /*flags*/) {
  if (!knownEvent(event)) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<CUstream_st> stream = findStream(handle, tlsDevice);
  if (!stream) return fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<EventState> state = event->state;
  uint64_t generation;
  {
    std::lock_guard lock(state->mu);
    generation = state->recorded;
  }
  if (generation == 0) return cudaSuccess;  // never recorded: nothing to wait for
  enqueue(*stream, [state, generation] {
    std::unique_lock lock(state->mu);
    state->cv.wait(lock, [&] { return state->completed >= generation; });
  });
  return cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return fail(cudaErrorInvalidValue);
  if (!knownEvent(start) || !knownEvent(end)) return fail(cudaErrorInvalidResourceHandle);
  if ((start->flags | end->flags) & cudaEventDisableTiming) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  std::scoped_lock lock(start->state->mu, end->state->mu);
  for (const EventState* state : {start->state.get(), end->state.get()}) {
    if (state->recorded == 0) return fail(cudaErrorInvalidResourceHandle);
    if (state->completed != state->recorded) return cudaErrorNotReady;
  }
  *ms = std::chrono::duration<float, std::milli>(end->state->when - start->state->when).count();
  return cudaSuccess;
}

// ---------------------------------------------------------------- memory --

FAKENCCL_EXPORT cudaError_t cudaMalloc(void** devPtr, size_t size) {
  return allocate(devPtr, size, cudaMemoryTypeDevice);
}

FAKENCCL_EXPORT cudaError_t cudaFree(void* devPtr) {
  return release(devPtr, cudaMemoryTypeDevice);
}

FAKENCCL_EXPORT cudaError_t cudaMallocHost(void** ptr, size_t size) {
  return allocate(ptr, size, cudaMemoryTypeHost);
}

FAKENCCL_EXPORT cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int /*flags*/) {
  return allocate(pHost, size, cudaMemoryTypeHost);
}

FAKENCCL_EXPORT cudaError_t cudaFreeHost(void* ptr) {
  return release(ptr, cudaMemoryTypeHost);
}

// Host memory is already usable by the fake device.
FAKENCCL_EXPORT cudaError_t cudaHostRegister(void* ptr, size_t /*size*/, unsigned int /*flags*/) {
  return ptr == nullptr ? fail(cudaErrorInvalidValue) : cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaHostUnregister(void* ptr) {
  return ptr == nullptr ? fail(cudaErrorInvalidValue) : cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (free == nullptr || total == nullptr) return fail(cudaErrorInvalidValue);
  *total = size_t{80} << 30;
  *free = *total;
  return cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  if (attributes == nullptr) return fail(cudaErrorInvalidValue);
  std::memset(attributes, 0, sizeof(*attributes));
  std::optional<Allocation> allocation = findAllocation(ptr);
  if (!allocation) {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = tlsDevice;
    return cudaSuccess;
  }
  attributes->type = allocation->type;
  attributes->device = allocation->device;
  attributes->devicePointer = const_cast<void*>(ptr);
  if (allocation->type == cudaMemoryTypeHost) attributes->hostPointer = const_cast<void*>(ptr);
  return cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (!validCopyKind(kind)) return fail(cudaErrorInvalidMemcpyDirection);
  if (count != 0 && (dst == nullptr || src == nullptr)) return fail(cudaErrorInvalidValue);
  drainDevice(tlsDevice);  // a synchronous copy runs after all queued device work
  if (count != 0) std::memmove(dst, src, count);
  return cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                                            cudaStream_t handle) {
  if (!validCopyKind(kind)) return fail(cudaErrorInvalidMemcpyDirection);
  if (count != 0 && (dst == nullptr || src == nullptr)) return fail(cudaErrorInvalidValue);
  std::shared_ptr<CUstream_st> stream = findStream(handle, tlsDevice);
  if (!stream) return fail(cudaErrorInvalidResourceHandle);
  if (count != 0) enqueue(*stream, [=] { std::memmove(dst, src, count); });
  return cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  if (count != 0 && devPtr == nullptr) return fail(cudaErrorInvalidValue);
  drainDevice(tlsDevice);
  if (count != 0) std::memset(devPtr, value, count);
  return cudaSuccess;
}

FAKENCCL_EXPORT cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t handle) {
  if (count != 0 && devPtr == nullptr) return fail(cudaErrorInvalidValue);
  std::shared_ptr<CUstream_st> stream = findStream(handle, tlsDevice);
  if (!stream) return fail(cudaErrorInvalidResourceHandle);
  if (count != 0) enqueue(*stream, [=] { std::memset(devPtr, value, count); });
  return cudaSuccess;
}

}  // extern "C"
