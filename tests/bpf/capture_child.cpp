// rankscope-capture-child: NCCL programs that exercise one capture each, run
// by tests/bpf/capture_test.cpp under the agent's real BPF probes. Written
// against nccl.h and cuda_runtime_api.h only (the fakenccl stand-ins run it).
//
//   group                      a 1-rank communicator; AllReduce, AllGather and
//                              Broadcast inside one GroupStart/GroupEnd, then
//                              one AllReduce outside
//   split RANK NRANKS ID_FILE  NRANKS ranks split into colors RANK % 2 (key
//                              RANK); an AllReduce on each child
//   initall                    ncclCommInitAll of 2 ranks; an AllReduce on each
//   setenv                     setenv("CUDA_VISIBLE_DEVICES", "6,2") after the
//                              start, cudaSetDevice(1), then one AllReduce
//   peer-death RANK ID_FILE DIR   2 ranks; rank 1 writes DIR/ready.1 and waits
//                              to be killed; rank 0 issues an AllReduce, writes
//                              DIR/issued, then polls ncclCommGetAsyncError
//                              until it reports the error, and aborts
//   busy SECONDS               a 1-rank communicator and a CPU-bound loop with
//                              an AllReduce every 2 ms (a rank that computes)
//   churn COUNT                COUNT short-lived communicators: each split off
//                              a 1-rank parent, one AllReduce, destroyed
//   hoard COUNT                COUNT 1-rank communicators, one AllReduce on
//                              each, kept until it exits
//   pairs COUNT                COUNT 1-rank communicators, a Send and a Recv
//                              to itself in one group on each (two
//                              point-to-point lanes each), kept until it exits
//
// With CAPTURE_HOLD=PATH in the environment, it waits (30 s at most) for
// PATH to exist before it exits, so that the test reads /proc while it lives;
// with CAPTURE_DONE=PATH, it makes PATH once its calls are made.
// Exit status 0 when the scenario ran as planned.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "capture-child: %s\n", what.c_str());
  std::exit(1);
}

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) die(std::string(what) + ": " + ncclGetErrorString(r));
}

void check(cudaError_t r, const char* what) {
  if (r != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(r));
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void write_marker(const std::string& path, const void* data, size_t size) {
  std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (std::rename(tmp.c_str(), path.c_str()) != 0) die("cannot write " + path);
}

ncclUniqueId shared_id(int rank, const std::string& file) {
  ncclUniqueId id;
  if (rank == 0) {
    check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    write_marker(file, &id, sizeof(id));
    return id;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!exists(file)) {
    if (std::chrono::steady_clock::now() > deadline) die("no id file " + file);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::ifstream in(file, std::ios::binary);
  in.read(reinterpret_cast<char*>(&id), sizeof(id));
  if (!in) die("short id file " + file);
  return id;
}

struct Buffers {
  float* send = nullptr;
  float* recv = nullptr;
  cudaStream_t stream = nullptr;
  static constexpr size_t kCount = 256;
  Buffers() {
    check(cudaMalloc(reinterpret_cast<void**>(&send), kCount * sizeof(float)), "cudaMalloc");
    check(cudaMalloc(reinterpret_cast<void**>(&recv), kCount * sizeof(float)), "cudaMalloc");
    check(cudaStreamCreate(&stream), "cudaStreamCreate");
  }
};

ncclComm_t solo_comm() {
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  ncclComm_t comm;
  check(ncclCommInitRank(&comm, 1, id, 0), "ncclCommInitRank");
  return comm;
}

int group() {
  Buffers b;
  ncclComm_t comm = solo_comm();
  check(ncclGroupStart(), "ncclGroupStart");
  check(ncclAllReduce(b.send, b.recv, Buffers::kCount, ncclFloat32, ncclSum, comm, b.stream), "ncclAllReduce");
  check(ncclAllGather(b.send, b.recv, 64, ncclFloat32, comm, b.stream), "ncclAllGather");
  check(ncclBroadcast(b.send, b.recv, 32, ncclFloat32, 0, comm, b.stream), "ncclBroadcast");
  check(ncclGroupEnd(), "ncclGroupEnd");
  check(ncclAllReduce(b.send, b.recv, 16, ncclFloat32, ncclSum, comm, b.stream), "ncclAllReduce");
  check(cudaStreamSynchronize(b.stream), "cudaStreamSynchronize");
  check(ncclCommDestroy(comm), "ncclCommDestroy");
  return 0;
}

int split(int rank, int nranks, const std::string& id_file) {
  Buffers b;
  ncclComm_t parent, child;
  check(ncclCommInitRank(&parent, nranks, shared_id(rank, id_file), rank), "ncclCommInitRank");
  check(ncclCommSplit(parent, rank % 2, rank, &child, nullptr), "ncclCommSplit");
  check(ncclAllReduce(b.send, b.recv, Buffers::kCount, ncclFloat32, ncclSum, child, b.stream), "ncclAllReduce");
  check(cudaStreamSynchronize(b.stream), "cudaStreamSynchronize");
  check(ncclCommDestroy(child), "ncclCommDestroy");
  check(ncclCommDestroy(parent), "ncclCommDestroy");
  return 0;
}

int initall() {
  ncclComm_t comms[2];
  int devices[2] = {0, 1};
  check(ncclCommInitAll(comms, 2, devices), "ncclCommInitAll");
  Buffers b[2];  // one per device, as a real program would
  check(ncclGroupStart(), "ncclGroupStart");
  for (int i = 0; i < 2; ++i)
    check(ncclAllReduce(b[i].send, b[i].recv, Buffers::kCount, ncclFloat32, ncclSum, comms[i], b[i].stream),
          "ncclAllReduce");
  check(ncclGroupEnd(), "ncclGroupEnd");
  for (int i = 0; i < 2; ++i) check(cudaStreamSynchronize(b[i].stream), "cudaStreamSynchronize");
  for (int i = 0; i < 2; ++i) check(ncclCommDestroy(comms[i]), "ncclCommDestroy");
  return 0;
}

int set_env() {
  if (setenv("CUDA_VISIBLE_DEVICES", "6,2", 1) != 0) die("setenv");
  check(cudaSetDevice(1), "cudaSetDevice");
  Buffers b;
  ncclComm_t comm = solo_comm();
  check(ncclAllReduce(b.send, b.recv, Buffers::kCount, ncclFloat32, ncclSum, comm, b.stream), "ncclAllReduce");
  check(cudaStreamSynchronize(b.stream), "cudaStreamSynchronize");
  check(ncclCommDestroy(comm), "ncclCommDestroy");
  return 0;
}

int peer_death(int rank, const std::string& id_file, const std::string& dir) {
  Buffers b;
  ncclComm_t comm;
  check(ncclCommInitRank(&comm, 2, shared_id(rank, id_file), rank), "ncclCommInitRank");
  if (rank == 1) {
    char one = '1';
    write_marker(dir + "/ready.1", &one, 1);
    for (;;) pause();  // until killed
  }
  check(ncclAllReduce(b.send, b.recv, Buffers::kCount, ncclFloat32, ncclSum, comm, b.stream), "ncclAllReduce");
  char one = '1';
  write_marker(dir + "/issued", &one, 1);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  ncclResult_t async = ncclSuccess;
  while (async == ncclSuccess || async == ncclInProgress) {
    check(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError");
    if (std::chrono::steady_clock::now() > deadline) die("the peer's death was never reported");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ncclCommAbort(comm);
  return async == ncclRemoteError ? 0 : 2;
}

int busy(int seconds) {
  Buffers b;
  ncclComm_t comm = solo_comm();
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  volatile uint64_t sink = 0;
  while (std::chrono::steady_clock::now() < end) {
    auto next = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
    while (std::chrono::steady_clock::now() < next) sink = sink + 1;  // computing
    check(ncclAllReduce(b.send, b.recv, 16, ncclFloat32, ncclSum, comm, b.stream), "ncclAllReduce");
  }
  check(cudaStreamSynchronize(b.stream), "cudaStreamSynchronize");
  check(ncclCommDestroy(comm), "ncclCommDestroy");
  return 0;
}

int churn(long count) {
  Buffers b;
  ncclComm_t parent = solo_comm();
  for (long i = 0; i < count; ++i) {
    ncclComm_t child;
    check(ncclCommSplit(parent, 0, 0, &child, nullptr), "ncclCommSplit");
    check(ncclAllReduce(b.send, b.recv, 4, ncclFloat32, ncclSum, child, b.stream), "ncclAllReduce");
    check(ncclCommDestroy(child), "ncclCommDestroy");
  }
  check(cudaStreamSynchronize(b.stream), "cudaStreamSynchronize");
  check(ncclCommDestroy(parent), "ncclCommDestroy");
  return 0;
}

int hoard(long count) {
  Buffers b;
  for (long i = 0; i < count; ++i)
    check(ncclAllReduce(b.send, b.recv, 4, ncclFloat32, ncclSum, solo_comm(), b.stream), "ncclAllReduce");
  check(cudaStreamSynchronize(b.stream), "cudaStreamSynchronize");
  return 0;
}

int pairs(long count) {
  Buffers b;
  for (long i = 0; i < count; ++i) {
    ncclComm_t comm = solo_comm();
    check(ncclGroupStart(), "ncclGroupStart");
    check(ncclSend(b.send, 4, ncclFloat32, 0, comm, b.stream), "ncclSend");
    check(ncclRecv(b.recv, 4, ncclFloat32, 0, comm, b.stream), "ncclRecv");
    check(ncclGroupEnd(), "ncclGroupEnd");
  }
  check(cudaStreamSynchronize(b.stream), "cudaStreamSynchronize");
  return 0;
}

// Calls that test the numbering of communicators: one communicator called
// from two threads in turn, then more communicators in rotation than a
// thread remembers, then one destroyed and another made (which may reuse its
// address). The tests expect, per communicator, 0, 1, 2... in call order.
int rotate() {
  Buffers b;
  auto all_reduce = [&](ncclComm_t comm) {
    check(ncclAllReduce(b.send, b.recv, 4, ncclFloat32, ncclSum, comm, b.stream), "ncclAllReduce");
  };
  constexpr int kComms = 6;
  ncclComm_t comms[kComms];
  for (auto& comm : comms) comm = solo_comm();
  all_reduce(comms[0]);
  std::thread other([&] { all_reduce(comms[0]); });
  other.join();
  all_reduce(comms[0]);
  for (int round = 0; round < 2; ++round)
    for (auto& comm : comms) all_reduce(comm);
  check(cudaStreamSynchronize(b.stream), "cudaStreamSynchronize");
  check(ncclCommDestroy(comms[1]), "ncclCommDestroy");
  comms[1] = solo_comm();
  all_reduce(comms[1]);
  all_reduce(comms[0]);
  check(cudaStreamSynchronize(b.stream), "cudaStreamSynchronize");
  for (auto& comm : comms) check(ncclCommDestroy(comm), "ncclCommDestroy");
  return 0;
}

}  // namespace

int run(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "group") return group();
  if (mode == "split" && argc == 5) return split(std::atoi(argv[2]), std::atoi(argv[3]), argv[4]);
  if (mode == "initall") return initall();
  if (mode == "setenv") return set_env();
  if (mode == "peer-death" && argc == 5) return peer_death(std::atoi(argv[2]), argv[3], argv[4]);
  if (mode == "busy" && argc == 3) return busy(std::atoi(argv[2]));
  if (mode == "churn" && argc == 3) return churn(std::atol(argv[2]));
  if (mode == "rotate") return rotate();
  if (mode == "hoard" && argc == 3) return hoard(std::atol(argv[2]));
  if (mode == "pairs" && argc == 3) return pairs(std::atol(argv[2]));
  std::fprintf(stderr,
               "usage: rankscope-capture-child group|split R N IDFILE|initall|setenv|peer-death R IDFILE DIR|busy "
               "S|churn N|rotate|hoard N|pairs N\n");
  return 64;
}

int main(int argc, char** argv) {
  int status = run(argc, argv);
  if (const char* done = std::getenv("CAPTURE_DONE")) write_marker(done, "", 0);
  if (const char* hold = std::getenv("CAPTURE_HOLD")) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!exists(hold) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status;
}
