// A user's own stand-in libnccl.so.2: NCCL's real signatures (nccl.h), no
// work at all. Every call succeeds at once; a communicator is a number. This
// is what any unprivileged user on a GPU node can build and load, and what the
// agent then probes like the real library (docs/operations.md, Threat model):
// the adversary e2e test (tests/e2e/adversary_test.cpp) uses it to make the
// real agent report whatever communicator sizes, ranks and ends it likes.
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <cstring>

namespace {
std::atomic<uintptr_t> next_comm{0x1000};
}  // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0x5a, sizeof(*id));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int, ncclUniqueId, int) {
  *comm = reinterpret_cast<ncclComm_t>(next_comm.fetch_add(0x100));
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclSuccess; }

}  // extern "C"
