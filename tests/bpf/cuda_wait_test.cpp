// Host waits on the GPU, traced by the agent's BPF probes on libcudart: a
// child process blocks in cudaStreamSynchronize for a known time, another
// wait stays open, and NVIDIA's real libcudart.so.13 is called with known
// arguments (no GPU: it fails at once, with its arguments still real).
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>
#include <variant>
#include <vector>

#include "node-agent/attach.h"
#include "node-agent/drain.h"
#include "tests/support/harness.h"

namespace {

using rankscope::agent::Discovery;
using rankscope::agent::Event;
using rankscope::agent::NcclProbes;
using rankscope::agent::Scope;

constexpr const char* kRealCudart = "/usr/local/cuda/lib/libcudart.so.13";
const std::string kFakeCudart = std::string(RANKSCOPE_FAKENCCL_DIR) + "/libcudart.so.13";

// A forked child that waits for "go" and then runs `body`; killed and reaped
// by the destructor.
struct Child {
  explicit Child(void (*body)(int out_fd)) {
    int go_pipe[2], out_pipe[2];
    if (pipe(go_pipe) != 0 || pipe(out_pipe) != 0) abort();
    pid = fork();
    if (pid == 0) {
      char c;
      if (read(go_pipe[0], &c, 1) != 1) _exit(10);
      body(out_pipe[1]);
      _exit(0);
    }
    go = go_pipe[1];
    out = out_pipe[0];
    close(go_pipe[0]);
    close(out_pipe[1]);
  }
  ~Child() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  void start() { ASSERT_EQ(write(go, "g", 1), 1); }
  template <typename T>
  T read_value() {
    T value{};
    EXPECT_EQ(read(out, &value, sizeof(value)), static_cast<ssize_t>(sizeof(value)));
    return value;
  }
  pid_t pid;
  int go, out;
};

// In the child, against the stand-in: one synchronize that blocks 300 ms,
// then one that never returns.
void stand_in_waits(int out_fd) {
  void* lib = dlopen(kFakeCudart.c_str(), RTLD_NOW);
  if (!lib) _exit(11);
  using Enqueue = cudaError_t (*)(cudaStream_t, int, void (*)(void*), void*);
  auto enqueue = reinterpret_cast<Enqueue>(dlsym(lib, "fakecuda_stream_enqueue"));
  auto create = reinterpret_cast<decltype(&cudaStreamCreate)>(dlsym(lib, "cudaStreamCreate"));
  auto sync = reinterpret_cast<decltype(&cudaStreamSynchronize)>(dlsym(lib, "cudaStreamSynchronize"));
  if (!enqueue || !create || !sync) _exit(12);
  cudaStream_t stream = nullptr;
  if (create(&stream) != cudaSuccess) _exit(13);
  auto sleep_ms = [](void* ms) { std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<intptr_t>(ms))); };
  enqueue(stream, 0, sleep_ms, reinterpret_cast<void*>(300));
  int result = sync(stream);
  if (write(out_fd, &stream, sizeof(stream)) != sizeof(stream) || write(out_fd, &result, sizeof(result)) != sizeof(result))
    _exit(14);
  enqueue(stream, 0, sleep_ms, reinterpret_cast<void*>(600'000));  // a GPU that never finishes
  sync(stream);
}

// In the child, against NVIDIA's libcudart: each call fails without a GPU.
void real_cudart_calls(int out_fd) {
  void* lib = dlopen(kRealCudart, RTLD_NOW);
  if (!lib) _exit(11);
  auto stream_sync = reinterpret_cast<decltype(&cudaStreamSynchronize)>(dlsym(lib, "cudaStreamSynchronize"));
  auto event_sync = reinterpret_cast<decltype(&cudaEventSynchronize)>(dlsym(lib, "cudaEventSynchronize"));
  auto device_sync = reinterpret_cast<decltype(&cudaDeviceSynchronize)>(dlsym(lib, "cudaDeviceSynchronize"));
  int results[3] = {stream_sync(reinterpret_cast<cudaStream_t>(0x5a5a)),
                    event_sync(reinterpret_cast<cudaEvent_t>(0x6b6b)), device_sync()};
  if (write(out_fd, results, sizeof(results)) != sizeof(results)) _exit(12);
}

class CudaWaits : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "loading eBPF programs needs root: run the suite as root (sudo make test)";
  }
  void trace(pid_t pid, const std::string& library_path) {
    Scope scope;
    scope.pids = {static_cast<uint32_t>(pid)};
    auto probes = NcclProbes::open(scope, [&](const void* data, size_t size) {
      auto event = rankscope::agent::decode_event(data, size);
      ASSERT_TRUE(event.has_value());
      if (auto* wait = std::get_if<rs_wait_event>(&*event)) waits.push_back(*wait);
    });
    ASSERT_TRUE(probes) << probes.error().message;
    probes_ = std::move(*probes);
    auto library = Discovery::from_path(library_path);
    ASSERT_TRUE(library);
    ASSERT_EQ(library->kind, rankscope::agent::LibraryKind::cudart);
    auto attached = probes_->attach(*library);
    ASSERT_TRUE(attached) << attached.error().message;
    EXPECT_TRUE(attached->missing.empty());
  }
  void drain_until(size_t n) {
    rankscope::testing::wait_for(
        [&] {
          probes_->poll(20);
          return waits.size() >= n;
        },
        std::chrono::seconds(10));
  }
  std::unique_ptr<NcclProbes> probes_;
  std::vector<rs_wait_event> waits;
};

TEST_F(CudaWaits, SynchronizeThatBlocksIsTimedAndOneThatNeverReturnsIsOpen) {
  Child child(stand_in_waits);
  trace(child.pid, kFakeCudart);
  child.start();
  auto stream = child.read_value<cudaStream_t>();
  int result = child.read_value<int>();
  drain_until(1);
  ASSERT_EQ(waits.size(), 1u);
  const rs_wait_event& done = waits[0];
  EXPECT_EQ(done.hdr.pid, static_cast<uint32_t>(child.pid));
  EXPECT_EQ(done.kind, RS_WAIT_STREAM_SYNC);
  EXPECT_EQ(done.object, reinterpret_cast<uint64_t>(stream));
  EXPECT_EQ(done.result, result);
  EXPECT_EQ(done.result, cudaSuccess);
  EXPECT_GE(done.hdr.ts_ns - done.entry_ns, 300'000'000u) << "it waited for the 300 ms of queued work";

  std::vector<std::pair<uint64_t, rs_open_wait>> open;
  ASSERT_TRUE(rankscope::testing::wait_for(
      [&] {
        open = probes_->open_waits();
        return !open.empty();
      },
      std::chrono::seconds(10)));
  ASSERT_EQ(open.size(), 1u);
  EXPECT_EQ(open[0].first >> 32, static_cast<uint64_t>(child.pid));
  EXPECT_EQ(open[0].second.kind, RS_WAIT_STREAM_SYNC);
  EXPECT_EQ(open[0].second.object, reinterpret_cast<uint64_t>(stream));
  EXPECT_GE(open[0].second.entry_ns, done.hdr.ts_ns);
  probes_->poll(50);
  EXPECT_EQ(waits.size(), 1u) << "the open wait has not returned";
}

TEST_F(CudaWaits, RealLibcudartArgumentsAreDecoded) {
  ASSERT_EQ(access(kRealCudart, R_OK), 0) << kRealCudart << " is part of this machine's CUDA install";
  Child child(real_cudart_calls);
  trace(child.pid, kRealCudart);
  child.start();
  int results[3];
  for (int& r : results) r = child.read_value<int>();
  drain_until(3);
  ASSERT_EQ(waits.size(), 3u);
  EXPECT_EQ(waits[0].kind, RS_WAIT_STREAM_SYNC);
  EXPECT_EQ(waits[0].object, 0x5a5au);
  EXPECT_EQ(waits[1].kind, RS_WAIT_EVENT_SYNC);
  EXPECT_EQ(waits[1].object, 0x6b6bu);
  EXPECT_EQ(waits[2].kind, RS_WAIT_DEVICE_SYNC);
  EXPECT_EQ(waits[2].object, 0u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(waits[i].result, results[i]);
    EXPECT_NE(waits[i].result, cudaSuccess) << "no GPU here: the real library must fail";
  }
}

}  // namespace
