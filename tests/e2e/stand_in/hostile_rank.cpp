// rankscope-hostile-rank LIBNCCL DIR STEP...: what an unprivileged user can
// make a process do with their own libnccl (tests/e2e/stand_in/nccl.cpp),
// loaded late with dlopen, the way Python loads a wheel's copy. It writes
// DIR/loaded once the library is mapped, waits for DIR/attached before its
// first NCCL call, runs the steps in order, writes DIR/done, and waits for
// DIR/exit.
//
//   init NRANKS RANK ID    ncclCommInitRank; ID is file:PATH (the 128 bytes
//                          of a job's ncclUniqueId, as fakenccl-train writes
//                          them) or fill:HEX (128 bytes of that value)
//   allreduce K N          N ncclAllReduce calls on the K-th communicator made
//   destroy K              ncclCommDestroy of the K-th communicator
#include <dlfcn.h>
#include <nccl.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

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

void touch(const std::string& path) {
  if (FILE* f = std::fopen(path.c_str(), "w")) std::fclose(f);
}

int fail(const std::string& what) {
  std::fprintf(stderr, "rankscope-hostile-rank: %s\n", what.c_str());
  return 1;
}

bool unique_id(const std::string& spec, ncclUniqueId& id) {
  if (spec.rfind("file:", 0) == 0) {
    FILE* file = std::fopen(spec.c_str() + 5, "rb");
    if (!file) return false;
    bool complete = std::fread(&id, sizeof(id), 1, file) == 1;
    std::fclose(file);
    return complete;
  }
  if (spec.rfind("fill:", 0) == 0) {
    std::memset(&id, static_cast<int>(std::strtol(spec.c_str() + 5, nullptr, 16)), sizeof(id));
    return true;
  }
  return false;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return fail("usage: rankscope-hostile-rank LIBNCCL DIR STEP...");
  std::string dir = argv[2];
  void* nccl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!nccl) return fail(std::string("dlopen: ") + dlerror());
#define SYM(name) reinterpret_cast<decltype(&name)>(dlsym(nccl, #name))
  auto init = SYM(ncclCommInitRank);
  auto all_reduce = SYM(ncclAllReduce);
  auto destroy = SYM(ncclCommDestroy);
#undef SYM
  if (!init || !all_reduce || !destroy) return fail("the library lacks ncclCommInitRank, ncclAllReduce or ncclCommDestroy");
  touch(dir + "/loaded");
  if (!wait_file(dir + "/attached")) return fail("never told the agent attached");

  std::vector<ncclComm_t> comms;
  float buffer[4] = {};
  for (int i = 3; i < argc; ++i) {
    std::string step = argv[i];
    auto arg = [&](int k) -> std::string { return i + k < argc ? argv[i + k] : ""; };
    if (step == "init") {
      ncclUniqueId id;
      if (!unique_id(arg(3), id)) return fail("init: cannot read the unique id " + arg(3));
      ncclComm_t comm = nullptr;
      if (init(&comm, std::atoi(arg(1).c_str()), id, std::atoi(arg(2).c_str())) != ncclSuccess) return fail("init");
      comms.push_back(comm);
      i += 3;
    } else if (step == "allreduce") {
      size_t k = std::strtoul(arg(1).c_str(), nullptr, 10);
      int n = std::atoi(arg(2).c_str());
      if (k >= comms.size()) return fail("allreduce: no communicator #" + arg(1));
      for (int c = 0; c < n; ++c) all_reduce(buffer, buffer, 4, ncclFloat32, ncclSum, comms[k], nullptr);
      i += 2;
    } else if (step == "destroy") {
      size_t k = std::strtoul(arg(1).c_str(), nullptr, 10);
      if (k >= comms.size()) return fail("destroy: no communicator #" + arg(1));
      destroy(comms[k]);
      i += 1;
    } else {
      return fail("unknown step " + step);
    }
  }
  touch(dir + "/done");
  if (!wait_file(dir + "/exit")) return fail("never told to exit");
  return 0;
}
