// libnccl.so.2 stand-in: NCCL's API (nccl.h of NCCL 2.28) over TCP between
// the rank processes, with NCCL's blocking behaviour: a collective only
// queues work on its stream and returns; the stream then waits until every
// rank involved has arrived, and a rank that never arrives blocks the others
// forever.
//
// nccl.h declares every entry point twice, ncclX for programs and pncclX for
// profilers that interpose ncclX. As in the real library, pncclX holds the
// code and ncclX is a weak alias of it (the list at the end of this file).

#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>

#include "tools/fakenccl/bootstrap.h"
#include "tools/fakenccl/collectives.h"
#include "tools/fakenccl/comm.h"
#include "tools/fakenccl/error.h"
#include "tools/fakenccl/fakecuda.h"
#include "tools/fakenccl/group.h"
#include "tools/fakenccl/lifecycle.h"
#include "tools/fakenccl/reduce.h"

using namespace rankscope::fakenccl;

namespace {

ncclResult_t lookup(const char* api, ncclComm_t handle, std::shared_ptr<Communicator>* comm) {
  if (handle == nullptr) return fail(ncclInvalidArgument, "%s: comm is NULL", api);
  *comm = findCommunicator(handle);
  if (!*comm) {
    return fail(ncclInvalidArgument, "%s: comm %p is not a live communicator (destroyed?)", api,
                static_cast<void*>(handle));
  }
  return ncclSuccess;
}

// nccl.h: "Config initializer must be assigned to initialize config structure
// when it is created. Not initialized config will result in NCCL error."
ncclResult_t checkConfig(const char* api, const ncclConfig_t* config) {
  constexpr unsigned kConfigMagic = 0xcafebeef;  // NCCL_CONFIG_INITIALIZER's magic
  if (config != nullptr && config->magic != kConfigMagic) {
    return fail(ncclInvalidArgument, "%s: config was not set up with NCCL_CONFIG_INITIALIZER", api);
  }
  return ncclSuccess;
}

bool hasRoot(OpKind kind) {
  return kind == OpKind::kBroadcast || kind == OpKind::kReduce || kind == OpKind::kGather || kind == OpKind::kScatter ||
         kind == OpKind::kSend || kind == OpKind::kRecv;
}

// Which buffers a call reads or writes on `rank` (nccl.h: Reduce's recvbuff
// "may be NULL on all calls except for root device", Gather's recvbuff and
// Scatter's sendbuff are only used at the root).
bool usesSendbuff(const CollectiveCall& call, int rank) {
  switch (call.kind) {
    case OpKind::kBroadcast:
    case OpKind::kScatter:
      return rank == call.root;
    case OpKind::kRecv:
      return false;
    default:
      return true;
  }
}

bool usesRecvbuff(const CollectiveCall& call, int rank) {
  switch (call.kind) {
    case OpKind::kReduce:
    case OpKind::kGather:
      return rank == call.root;
    case OpKind::kSend:
      return false;
    default:
      return true;
  }
}

// The largest buffer a call touches, in elements, is count times this.
size_t bufferBlocks(OpKind kind, int nranks) {
  switch (kind) {
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
    case OpKind::kAlltoAll:
    case OpKind::kGather:
    case OpKind::kScatter:
      return static_cast<size_t>(nranks);
    default:
      return 1;
  }
}

ncclResult_t checkCall(const char* api, const Communicator& comm, const CollectiveCall& call) {
  const size_t elementSize = datatypeSize(call.datatype);
  if (elementSize == 0) {
    return fail(ncclInvalidArgument, "%s: invalid datatype %d", api, static_cast<int>(call.datatype));
  }
  if (hasRoot(call.kind) && (call.root < 0 || call.root >= comm.nranks())) {
    const bool p2p = call.kind == OpKind::kSend || call.kind == OpKind::kRecv;
    return fail(ncclInvalidArgument, "%s: %s %d is not a rank of %s (nranks %d)", api, p2p ? "peer" : "root", call.root,
                comm.name().c_str(), comm.nranks());
  }
  if (call.count > SIZE_MAX / elementSize / bufferBlocks(call.kind, comm.nranks())) {
    return fail(ncclInvalidArgument, "%s: count %zu is too large", api, call.count);
  }
  if (call.count > 0 && usesSendbuff(call, comm.rank()) && call.sendbuff == nullptr) {
    return fail(ncclInvalidArgument, "%s: sendbuff is NULL", api);
  }
  if (call.count > 0 && usesRecvbuff(call, comm.rank()) && call.recvbuff == nullptr) {
    return fail(ncclInvalidArgument, "%s: recvbuff is NULL", api);
  }
  if (!fakecuda_stream_is_valid(call.stream, comm.device())) {
    return fail(ncclInvalidArgument, "%s: stream %p is not a live cudaStream_t", api, static_cast<void*>(call.stream));
  }
  return ncclSuccess;
}

ncclResult_t enqueue(const char* api, ncclComm_t handle, CollectiveCall call) {
  std::shared_ptr<Communicator> comm;
  FAKENCCL_TRY(lookup(api, handle, &comm));
  FAKENCCL_TRY(checkCall(api, *comm, call));
  return submit(comm, call);
}

ncclResult_t enqueueReduction(const char* api, ncclComm_t handle, CollectiveCall call, ncclRedOp_t op) {
  std::shared_ptr<Communicator> comm;
  FAKENCCL_TRY(lookup(api, handle, &comm));
  std::optional<Reduction> reduction = comm->findReduction(op, call.datatype);
  if (!reduction) {
    return fail(ncclInvalidArgument, "%s: reduction operator %d is neither built in nor a PreMulSum of %s for %s", api,
                static_cast<int>(op), datatypeName(call.datatype), comm->name().c_str());
  }
  call.reduction = *reduction;
  FAKENCCL_TRY(checkCall(api, *comm, call));
  return submit(comm, call);
}

CollectiveCall makeCall(OpKind kind, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        int root, cudaStream_t stream) {
  CollectiveCall call;
  call.kind = kind;
  call.sendbuff = sendbuff;
  call.recvbuff = recvbuff;
  call.count = count;
  call.datatype = datatype;
  call.root = root;
  call.stream = stream;
  return call;
}

ncclResult_t initRankChecked(const char* api, ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank,
                             const ncclConfig_t* config) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "%s: comm is NULL", api);
  if (nranks < 1) return fail(ncclInvalidArgument, "%s: nranks %d is not positive", api, nranks);
  if (rank < 0 || rank >= nranks) {
    return fail(ncclInvalidArgument, "%s: rank %d is not in [0, %d)", api, rank, nranks);
  }
  FAKENCCL_TRY(checkConfig(api, config));
  // The device is the caller's current one when it calls, even if a group
  // defers the work (nccl.h: "Each rank is associated to a CUDA device, which
  // has to be set before calling ncclCommInitRank").
  const int device = fakecuda_current_device();
  if (device >= fakecuda_device_count()) {
    return fail(ncclUnhandledCudaError, "%s: no CUDA device %d (FAKECUDA_DEVICES, CUDA_VISIBLE_DEVICES)", api, device);
  }
  return submitInit([=] { return initRank(api, comm, nranks, id, rank, device); });
}

}  // namespace

extern "C" {

// ------------------------------------------------------------- versions --

FAKENCCL_EXPORT ncclResult_t pncclGetVersion(int* version) {
  if (version == nullptr) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

FAKENCCL_EXPORT const char* pncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

FAKENCCL_EXPORT const char* pncclGetLastError(ncclComm_t /*comm*/) {
  return lastErrorText();
}

// Logging is not configurable here: errors always go to stderr.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
FAKENCCL_EXPORT void pncclResetDebugInit() {}
FAKENCCL_EXPORT void ncclResetDebugInit() {}
#pragma GCC diagnostic pop

// -------------------------------------------------------- communicators --

FAKENCCL_EXPORT ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == nullptr) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  return startRendezvousRoot(uniqueId);
}

FAKENCCL_EXPORT ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                                     ncclConfig_t* config) {
  return initRankChecked("ncclCommInitRankConfig", comm, nranks, commId, rank, config);
}

FAKENCCL_EXPORT ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return initRankChecked("ncclCommInitRank", comm, nranks, commId, rank, nullptr);
}

// nccl.h lets ranks spread the bootstrap over several ids; one root is
// enough here, so the first id serves.
FAKENCCL_EXPORT ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                       ncclUniqueId* commIds, ncclConfig_t* config) {
  if (nId < 1 || commIds == nullptr) {
    return fail(ncclInvalidArgument, "ncclCommInitRankScalable: needs at least one unique id");
  }
  return initRankChecked("ncclCommInitRankScalable", newcomm, nranks, commIds[0], myrank, config);
}

FAKENCCL_EXPORT ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommInitAll: comm is NULL");
  if (ndev < 1) return fail(ncclInvalidArgument, "ncclCommInitAll: ndev %d is not positive", ndev);
  const int devices = fakecuda_device_count();
  if (devlist == nullptr && ndev > devices) {
    return fail(ncclInvalidArgument, "ncclCommInitAll: ndev %d but only %d devices", ndev, devices);
  }
  for (int i = 0; devlist != nullptr && i < ndev; ++i) {
    if (devlist[i] < 0 || devlist[i] >= devices || std::find(devlist, devlist + i, devlist[i]) != devlist + i) {
      return fail(ncclInvalidArgument, "ncclCommInitAll: devlist[%d] = %d is not a device (of %d) or is repeated", i,
                  devlist[i], devices);
    }
  }
  return initAll(comm, ndev, devlist);
}

FAKENCCL_EXPORT ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                            ncclConfig_t* config) {
  constexpr const char* kApi = "ncclCommSplit";
  std::shared_ptr<Communicator> parent;
  FAKENCCL_TRY(lookup(kApi, comm, &parent));
  if (newcomm == nullptr) return fail(ncclInvalidArgument, "%s: newcomm is NULL", kApi);
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    return fail(ncclInvalidArgument, "%s: color %d is negative and not NCCL_SPLIT_NOCOLOR", kApi, color);
  }
  FAKENCCL_TRY(checkConfig(kApi, config));
  if (inGroup()) {
    return fail(ncclInvalidUsage, "%s inside ncclGroupStart/ncclGroupEnd is not supported by fakenccl", kApi);
  }
  return splitCommunicator(parent, color, key, newcomm);
}

FAKENCCL_EXPORT ncclResult_t pncclCommShrink(ncclComm_t /*comm*/, int* /*excludeRanksList*/, int /*excludeRanksCount*/,
                                             ncclComm_t* /*newcomm*/, ncclConfig_t* /*config*/, int /*shrinkFlags*/) {
  return fail(ncclInvalidUsage, "ncclCommShrink is not supported by fakenccl");
}

FAKENCCL_EXPORT ncclResult_t pncclCommRevoke(ncclComm_t /*comm*/, int /*revokeFlags*/) {
  return fail(ncclInvalidUsage, "ncclCommRevoke is not supported by fakenccl");
}

// Blocking communicators only: returns once every queued call has run.
FAKENCCL_EXPORT ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  std::shared_ptr<Communicator> communicator;
  FAKENCCL_TRY(lookup("ncclCommFinalize", comm, &communicator));
  communicator->waitIdle();
  return ncclSuccess;
}

// Like NCCL, a NULL comm is not an error for Destroy and Abort.
FAKENCCL_EXPORT ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  std::shared_ptr<Communicator> communicator;
  FAKENCCL_TRY(lookup("ncclCommDestroy", comm, &communicator));
  communicator->waitIdle();
  unregisterCommunicator(comm);
  return ncclSuccess;  // the connections close with the last reference
}

FAKENCCL_EXPORT ncclResult_t pncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  std::shared_ptr<Communicator> communicator = unregisterCommunicator(comm);
  if (!communicator) {
    return fail(ncclInvalidArgument, "ncclCommAbort: comm %p is not a live communicator", static_cast<void*>(comm));
  }
  communicator->abort();
  return ncclSuccess;
}

FAKENCCL_EXPORT ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  std::shared_ptr<Communicator> communicator;
  FAKENCCL_TRY(lookup("ncclCommGetAsyncError", comm, &communicator));
  if (asyncError == nullptr) {
    return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  }
  *asyncError = communicator->asyncError();
  return ncclSuccess;
}

FAKENCCL_EXPORT ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  std::shared_ptr<Communicator> communicator;
  FAKENCCL_TRY(lookup("ncclCommCount", comm, &communicator));
  if (count == nullptr) return fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
  *count = communicator->nranks();
  return ncclSuccess;
}

FAKENCCL_EXPORT ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  std::shared_ptr<Communicator> communicator;
  FAKENCCL_TRY(lookup("ncclCommCuDevice", comm, &communicator));
  if (device == nullptr) return fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
  *device = communicator->device();
  return ncclSuccess;
}

FAKENCCL_EXPORT ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  std::shared_ptr<Communicator> communicator;
  FAKENCCL_TRY(lookup("ncclCommUserRank", comm, &communicator));
  if (rank == nullptr) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
  *rank = communicator->rank();
  return ncclSuccess;
}

// ------------------------------------------------- memory and registration --

// Registration only speeds up real transports; here every buffer is host
// memory already, so the handles just have to be distinct and non-NULL.
FAKENCCL_EXPORT ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t /*size*/, void** handle) {
  std::shared_ptr<Communicator> communicator;
  FAKENCCL_TRY(lookup("ncclCommRegister", comm, &communicator));
  if (buff == nullptr || handle == nullptr) {
    return fail(ncclInvalidArgument, "ncclCommRegister: buff and handle must not be NULL");
  }
  *handle = buff;
  return ncclSuccess;
}

FAKENCCL_EXPORT ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* /*handle*/) {
  std::shared_ptr<Communicator> communicator;
  return lookup("ncclCommDeregister", comm, &communicator);
}

FAKENCCL_EXPORT ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t /*size*/, ncclWindow_t* win,
                                                     int /*winFlags*/) {
  std::shared_ptr<Communicator> communicator;
  FAKENCCL_TRY(lookup("ncclCommWindowRegister", comm, &communicator));
  if (buff == nullptr || win == nullptr) {
    return fail(ncclInvalidArgument, "ncclCommWindowRegister: buff and win must not be NULL");
  }
  *win = static_cast<ncclWindow_t>(buff);
  return ncclSuccess;
}

FAKENCCL_EXPORT ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t /*win*/) {
  std::shared_ptr<Communicator> communicator;
  return lookup("ncclCommWindowDeregister", comm, &communicator);
}

FAKENCCL_EXPORT ncclResult_t pncclMemAlloc(void** ptr, size_t size) {
  if (ptr == nullptr) return fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  cudaError_t error = cudaMalloc(ptr, size);
  if (error != cudaSuccess) {
    return fail(ncclUnhandledCudaError, "ncclMemAlloc: cudaMalloc(%zu): %s", size, cudaGetErrorString(error));
  }
  return ncclSuccess;
}

FAKENCCL_EXPORT ncclResult_t pncclMemFree(void* ptr) {
  cudaError_t error = cudaFree(ptr);
  if (error != cudaSuccess) {
    return fail(ncclUnhandledCudaError, "ncclMemFree: cudaFree: %s", cudaGetErrorString(error));
  }
  return ncclSuccess;
}

// ------------------------------------------------------------ reductions --

FAKENCCL_EXPORT ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                       ncclScalarResidence_t residence, ncclComm_t comm) {
  constexpr const char* kApi = "ncclRedOpCreatePreMulSum";
  std::shared_ptr<Communicator> communicator;
  FAKENCCL_TRY(lookup(kApi, comm, &communicator));
  const size_t size = datatypeSize(datatype);
  if (op == nullptr || scalar == nullptr || size == 0) {
    return fail(ncclInvalidArgument, "%s: op and scalar must not be NULL, datatype must be valid", kApi);
  }
  Reduction reduction;
  reduction.preMulSum = true;
  switch (residence) {
    case ncclScalarHostImmediate:
      std::memcpy(reduction.scalar.data(), scalar, size);
      break;
    case ncclScalarDevice:
      reduction.scalarAddress = scalar;
      break;
    default:
      return fail(ncclInvalidArgument, "%s: invalid residence %d", kApi, static_cast<int>(residence));
  }
  *op = communicator->addPreMulSum(datatype, reduction);
  return ncclSuccess;
}

FAKENCCL_EXPORT ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  std::shared_ptr<Communicator> communicator;
  FAKENCCL_TRY(lookup("ncclRedOpDestroy", comm, &communicator));
  if (!communicator->removePreMulSum(op)) {
    return fail(ncclInvalidArgument, "ncclRedOpDestroy: %d is not a PreMulSum of %s", static_cast<int>(op),
                communicator->name().c_str());
  }
  return ncclSuccess;
}

// ----------------------------------------------------------- collectives --

FAKENCCL_EXPORT ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueueReduction("ncclAllReduce", comm,
                          makeCall(OpKind::kAllReduce, sendbuff, recvbuff, count, datatype, 0, stream), op);
}

FAKENCCL_EXPORT ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueueReduction("ncclReduce", comm,
                          makeCall(OpKind::kReduce, sendbuff, recvbuff, count, datatype, root, stream), op);
}

FAKENCCL_EXPORT ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                                cudaStream_t stream) {
  return enqueueReduction("ncclReduceScatter", comm,
                          makeCall(OpKind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, 0, stream), op);
}

FAKENCCL_EXPORT ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                            int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueue("ncclBroadcast", comm,
                 makeCall(OpKind::kBroadcast, sendbuff, recvbuff, count, datatype, root, stream));
}

// nccl.h: the deprecated in-place form of ncclBroadcast.
FAKENCCL_EXPORT ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                        cudaStream_t stream) {
  return enqueue("ncclBcast", comm, makeCall(OpKind::kBroadcast, buff, buff, count, datatype, root, stream));
}

FAKENCCL_EXPORT ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return enqueue("ncclAllGather", comm,
                 makeCall(OpKind::kAllGather, sendbuff, recvbuff, sendcount, datatype, 0, stream));
}

FAKENCCL_EXPORT ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                           ncclComm_t comm, cudaStream_t stream) {
  return enqueue("ncclAlltoAll", comm, makeCall(OpKind::kAlltoAll, sendbuff, recvbuff, count, datatype, 0, stream));
}

FAKENCCL_EXPORT ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueue("ncclGather", comm, makeCall(OpKind::kGather, sendbuff, recvbuff, count, datatype, root, stream));
}

FAKENCCL_EXPORT ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                          int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueue("ncclScatter", comm, makeCall(OpKind::kScatter, sendbuff, recvbuff, count, datatype, root, stream));
}

FAKENCCL_EXPORT ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                       ncclComm_t comm, cudaStream_t stream) {
  return enqueue("ncclSend", comm, makeCall(OpKind::kSend, sendbuff, nullptr, count, datatype, peer, stream));
}

FAKENCCL_EXPORT ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                       cudaStream_t stream) {
  return enqueue("ncclRecv", comm, makeCall(OpKind::kRecv, nullptr, recvbuff, count, datatype, peer, stream));
}

// ---------------------------------------------------------------- groups --

FAKENCCL_EXPORT ncclResult_t pncclGroupStart() {
  groupStart();
  return ncclSuccess;
}

FAKENCCL_EXPORT ncclResult_t pncclGroupEnd() {
  return groupEnd();
}

FAKENCCL_EXPORT ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* /*simInfo*/) {
  return fail(ncclInvalidUsage, "ncclGroupSimulateEnd is not supported by fakenccl");
}

}  // extern "C"

// ncclX = pncclX, weak, as in libnccl.so.2. (`name` is a declarator here, so
// it cannot be parenthesised.)
// NOLINTNEXTLINE(bugprone-macro-parentheses)
#define FAKENCCL_ALIAS(name) extern "C" FAKENCCL_EXPORT __attribute__((weak, alias("p" #name))) decltype(name) name;

FAKENCCL_ALIAS(ncclGetVersion)
FAKENCCL_ALIAS(ncclGetErrorString)
FAKENCCL_ALIAS(ncclGetLastError)
FAKENCCL_ALIAS(ncclGetUniqueId)
FAKENCCL_ALIAS(ncclCommInitRankConfig)
FAKENCCL_ALIAS(ncclCommInitRank)
FAKENCCL_ALIAS(ncclCommInitRankScalable)
FAKENCCL_ALIAS(ncclCommInitAll)
FAKENCCL_ALIAS(ncclCommSplit)
FAKENCCL_ALIAS(ncclCommShrink)
FAKENCCL_ALIAS(ncclCommRevoke)
FAKENCCL_ALIAS(ncclCommFinalize)
FAKENCCL_ALIAS(ncclCommDestroy)
FAKENCCL_ALIAS(ncclCommAbort)
FAKENCCL_ALIAS(ncclCommGetAsyncError)
FAKENCCL_ALIAS(ncclCommCount)
FAKENCCL_ALIAS(ncclCommCuDevice)
FAKENCCL_ALIAS(ncclCommUserRank)
FAKENCCL_ALIAS(ncclCommRegister)
FAKENCCL_ALIAS(ncclCommDeregister)
FAKENCCL_ALIAS(ncclCommWindowRegister)
FAKENCCL_ALIAS(ncclCommWindowDeregister)
FAKENCCL_ALIAS(ncclMemAlloc)
FAKENCCL_ALIAS(ncclMemFree)
FAKENCCL_ALIAS(ncclRedOpCreatePreMulSum)
FAKENCCL_ALIAS(ncclRedOpDestroy)
FAKENCCL_ALIAS(ncclAllReduce)
FAKENCCL_ALIAS(ncclReduce)
FAKENCCL_ALIAS(ncclReduceScatter)
FAKENCCL_ALIAS(ncclBroadcast)
FAKENCCL_ALIAS(ncclBcast)
FAKENCCL_ALIAS(ncclAllGather)
FAKENCCL_ALIAS(ncclAlltoAll)
FAKENCCL_ALIAS(ncclGather)
FAKENCCL_ALIAS(ncclScatter)
FAKENCCL_ALIAS(ncclSend)
FAKENCCL_ALIAS(ncclRecv)
FAKENCCL_ALIAS(ncclGroupStart)
FAKENCCL_ALIAS(ncclGroupEnd)
FAKENCCL_ALIAS(ncclGroupSimulateEnd)
