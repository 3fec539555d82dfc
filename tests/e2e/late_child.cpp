// rankscope-late-child LIBNCCL DIR STEPS: a program that starts without NCCL
// and loads it late with dlopen (as Python does with a wheel's copy), then
// runs STEPS AllReduce calls on a 1-rank communicator. It writes DIR/loaded
// once the library is mapped and waits for DIR/attached before its first
// NCCL call, and for DIR/exit before it exits.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace {
bool wait_file(const std::string& path) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  struct stat st;
  while (::stat(path.c_str(), &st) != 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

int fail(const char* what) {
  std::fprintf(stderr, "rankscope-late-child: %s (%s)\n", what, dlerror());
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: rankscope-late-child LIBNCCL DIR STEPS\n");
    return 64;
  }
  std::string dir = argv[2];
  int steps = std::atoi(argv[3]);
  void* nccl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!nccl) return fail("dlopen libnccl");
  // The CUDA runtime came in as libnccl's dependency.
  void* cudart = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
  if (!cudart) return fail("libcudart.so.13 not loaded with libnccl");
#define SYM(lib, name) reinterpret_cast<decltype(&name)>(dlsym(lib, #name))
  auto get_id = SYM(nccl, ncclGetUniqueId);
  auto init = SYM(nccl, ncclCommInitRank);
  auto all_reduce = SYM(nccl, ncclAllReduce);
  auto destroy = SYM(nccl, ncclCommDestroy);
  // (cudaMalloc and cudaStreamCreate have C++ overloads: name the C ones.)
  auto malloc_dev = reinterpret_cast<cudaError_t (*)(void**, size_t)>(dlsym(cudart, "cudaMalloc"));
  auto stream_create = reinterpret_cast<cudaError_t (*)(cudaStream_t*)>(dlsym(cudart, "cudaStreamCreate"));
  auto sync = SYM(cudart, cudaStreamSynchronize);
#undef SYM
  if (!get_id || !init || !all_reduce || !destroy || !malloc_dev || !stream_create || !sync) return fail("dlsym");
  if (FILE* f = std::fopen((dir + "/loaded").c_str(), "w")) std::fclose(f);
  if (!wait_file(dir + "/attached")) return fail("never told the agent attached");

  float* buf = nullptr;
  cudaStream_t stream = nullptr;
  if (malloc_dev(reinterpret_cast<void**>(&buf), 64 * sizeof(float)) || stream_create(&stream)) return fail("cuda");
  ncclUniqueId id;
  ncclComm_t comm;
  if (get_id(&id) || init(&comm, 1, id, 0)) return fail("ncclCommInitRank");
  for (int i = 0; i < steps; ++i)
    if (all_reduce(buf, buf, 64, ncclFloat32, ncclSum, comm, stream)) return fail("ncclAllReduce");
  sync(stream);
  destroy(comm);
  wait_file(dir + "/exit");
  return 0;
}
