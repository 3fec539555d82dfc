// fakenccl-probe: one rank of a two-rank scenario driven by fakenccl_test.
// It writes marker files into --dir for the test to follow and to order
// events across processes without timing anything.
//
//   --mode order       rank 0 issues an AllReduce and records whether the
//                      call returned (and the stream was still busy) before
//                      rank 1 was allowed to call it; rank 1 waits for the
//                      test to create DIR/release first.
//   --mode peer-death  both ranks report DIR/ready.R; rank 1 then waits to be
//                      killed; rank 0's AllReduce must then end in
//                      ncclRemoteError, and ncclCommAbort must free its stream.
//   --mode duplicate   two processes claim rank 1 while rank 0 holds back
//                      until DIR/go exists: one claim must be refused (exit
//                      4), the other must end up in a working communicator.
//
// The rank comes from RANK; the communicator always has 2 ranks.

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kCount = 1 << 16;
constexpr auto kDeadline = std::chrono::seconds(30);
constexpr auto kPollInterval = std::chrono::milliseconds(5);

int gRank = -1;

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "fakenccl-probe rank %d: %s\n", gRank, message.c_str());
  std::exit(1);
}

void checkCuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) die(std::string(what) + " failed: " + cudaGetErrorString(error));
}

void checkNccl(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) die(std::string(what) + " failed: " + ncclGetErrorString(result));
}

bool exists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0;
}

// Creates `path` with `content`, atomically (the test polls for it).
void writeMarker(const std::string& path, const std::string& content) {
  const std::string temporary = path + ".tmp";
  FILE* file = std::fopen(temporary.c_str(), "wb");
  if (file == nullptr || std::fwrite(content.data(), 1, content.size(), file) != content.size() ||
      std::fclose(file) != 0 || std::rename(temporary.c_str(), path.c_str()) != 0) {
    die("cannot write " + path);
  }
}

void waitForFile(const std::string& path) {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (!exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) die("timed out waiting for " + path);
    std::this_thread::sleep_for(kPollInterval);
  }
}

ncclUniqueId shareUniqueId(const std::string& dir) {
  const std::string path = dir + "/id";
  ncclUniqueId id;
  if (gRank == 0) {
    checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    writeMarker(path, std::string(id.internal, sizeof(id.internal)));
    return id;
  }
  waitForFile(path);
  FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr || std::fread(&id, sizeof(id), 1, file) != 1) die("cannot read " + path);
  std::fclose(file);
  return id;
}

struct Rank {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* buffer = nullptr;
};

Rank start(const std::string& dir) {
  Rank rank;
  const ncclUniqueId id = shareUniqueId(dir);
  checkNccl(ncclCommInitRank(&rank.comm, 2, id, gRank), "ncclCommInitRank");
  checkCuda(cudaStreamCreate(&rank.stream), "cudaStreamCreate");
  checkCuda(cudaMalloc(reinterpret_cast<void**>(&rank.buffer), kCount * sizeof(float)), "cudaMalloc");
  const std::vector<float> ones(kCount, static_cast<float>(gRank + 1));
  checkCuda(cudaMemcpy(rank.buffer, ones.data(), kCount * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  return rank;
}

void allReduce(const Rank& rank) {
  checkNccl(ncclAllReduce(rank.buffer, rank.buffer, kCount, ncclFloat32, ncclSum, rank.comm, rank.stream),
            "ncclAllReduce");
}

// Ranks hold 1 and 2: every element of the sum is 3.
void expectSum(const Rank& rank) {
  std::vector<float> result(kCount);
  checkCuda(cudaMemcpy(result.data(), rank.buffer, kCount * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
  for (float value : result) {
    if (value != 3.0f) die("AllReduce result " + std::to_string(value) + ", expected 3");
  }
}

int runOrder(const std::string& dir) {
  Rank rank = start(dir);
  if (gRank == 1) {
    waitForFile(dir + "/release");
    allReduce(rank);
    checkCuda(cudaStreamSynchronize(rank.stream), "cudaStreamSynchronize");
    expectSum(rank);
    return 0;
  }
  allReduce(rank);
  // Rank 1 cannot have called ncclAllReduce yet: the test releases it only
  // after seeing this marker.
  const cudaError_t query = cudaStreamQuery(rank.stream);
  writeMarker(dir + "/enqueued", query == cudaErrorNotReady ? "stream busy" : "stream idle");
  checkCuda(cudaStreamSynchronize(rank.stream), "cudaStreamSynchronize");
  const bool released = exists(dir + "/release");
  expectSum(rank);
  std::printf("fakenccl-probe rank 0: synchronize returned %s\n",
              released ? "after the peer was released" : "BEFORE the peer was released");
  return released ? 0 : 3;
}

int runPeerDeath(const std::string& dir) {
  Rank rank = start(dir);
  writeMarker(dir + "/ready." + std::to_string(gRank), "ready");
  if (gRank == 1) {
    for (;;) pause();  // until the test kills this rank
  }
  allReduce(rank);  // needs rank 1, which never calls it
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  ncclResult_t asyncError = ncclSuccess;
  while (asyncError == ncclSuccess) {
    if (std::chrono::steady_clock::now() > deadline) die("no async error after the peer died");
    std::this_thread::sleep_for(kPollInterval);
    checkNccl(ncclCommGetAsyncError(rank.comm, &asyncError), "ncclCommGetAsyncError");
  }
  const bool busy = cudaStreamQuery(rank.stream) == cudaErrorNotReady;
  checkNccl(ncclCommAbort(rank.comm), "ncclCommAbort");
  checkCuda(cudaStreamSynchronize(rank.stream), "cudaStreamSynchronize");
  std::printf("fakenccl-probe rank 0: async error %s, stream %s until ncclCommAbort\n",
              asyncError == ncclRemoteError ? "ncclRemoteError" : ncclGetErrorString(asyncError),
              busy ? "blocked" : "NOT blocked");
  return asyncError == ncclRemoteError && busy ? 0 : 3;
}

int runDuplicate(const std::string& dir) {
  const ncclUniqueId id = shareUniqueId(dir);
  if (gRank == 0) waitForFile(dir + "/go");
  ncclComm_t comm = nullptr;
  const ncclResult_t result = ncclCommInitRank(&comm, 2, id, gRank);
  if (result != ncclSuccess) {
    std::printf("fakenccl-probe rank %d: refused: %s\n", gRank, ncclGetLastError(nullptr));
    return 4;
  }
  checkNccl(ncclCommDestroy(comm), "ncclCommDestroy");
  std::printf("fakenccl-probe rank %d: joined\n", gRank);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode;
  std::string dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--mode") == 0) mode = argv[i + 1];
    if (std::strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
  }
  const char* rankText = std::getenv("RANK");
  gRank = rankText != nullptr ? std::atoi(rankText) : -1;
  if (dir.empty() || (gRank != 0 && gRank != 1)) {
    std::fprintf(stderr, "usage: RANK=0|1 fakenccl-probe --mode order|peer-death|duplicate --dir DIR\n");
    return 2;
  }
  if (mode == "order") return runOrder(dir);
  if (mode == "peer-death") return runPeerDeath(dir);
  if (mode == "duplicate") return runDuplicate(dir);
  die("unknown --mode " + mode);
}
