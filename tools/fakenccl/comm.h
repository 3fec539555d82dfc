// A communicator: one rank's view of the group it reduces with.
#pragma once

#include <nccl.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tools/fakenccl/collectives.h"
#include "tools/fakenccl/mesh.h"
#include "tools/fakenccl/net.h"
#include "tools/fakenccl/profiler.h"
#include "tools/fakenccl/reduce.h"

namespace rankscope::fakenccl {

class Communicator {
 public:
  // `hash`: NCCL's commHash of it (proto/records.h), what a profiler plugin is told.
  Communicator(int rank, int nranks, int device, uint64_t nonce, uint64_t hash, Endpoint self,
               std::unique_ptr<Mesh> mesh);

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int device() const { return device_; }
  uint64_t nonce() const { return nonce_; }
  uint64_t hash() const { return hash_; }
  const Endpoint& self() const { return self_; }
  std::string name() const;  // "comm 1f2e3d4c5b6a7988", for messages

  // Gives `call` its place in this rank's issue order and its sequence number
  // on the wire, and tells the profiler plugin (if any) it is enqueued. Host
  // thread, in call order.
  void number(CollectiveCall& call);

  // Runs `calls` (numbered consecutively, one group's calls on this
  // communicator) on a stream's worker thread: waits until the calls issued
  // before them have run, whatever stream they were on, then moves the data.
  // A mismatch or a lost peer leaves it blocked, as NCCL's kernels would
  // stay, until abort().
  void execute(const std::vector<CollectiveCall>& calls);

  // ncclCommSplit's exchange: every rank contributes `bytes` bytes, and
  // `all` receives rank r's at offset r * bytes. Runs on the calling thread,
  // in turn with the calls issued before it.
  ncclResult_t allGatherOnHost(const void* mine, void* all, size_t bytes);

  // How many ncclCommSplit calls came before this one (equal on all ranks).
  uint64_t takeSplitIndex();

  // Blocks until every numbered call has run (or the communicator is aborted
  // or broken).
  void waitIdle();

  // ncclCommAbort: unblocks everything waiting on this communicator; queued
  // calls finish without moving data.
  void abort();

  // Gives up on the calls not run yet (their stream work could not be
  // queued): later calls wait for abort(), and waitIdle() no longer waits.
  void markBroken();

  // ncclSuccess, or ncclRemoteError once a peer was lost.
  ncclResult_t asyncError() const;

  // Reduction operators made by ncclRedOpCreatePreMulSum, valid only on this
  // communicator and with their datatype (nccl.h).
  ncclRedOp_t addPreMulSum(ncclDataType_t type, const Reduction& reduction);
  bool removePreMulSum(ncclRedOp_t op);
  // The reduction `op` names for `type`; empty when it names none.
  std::optional<Reduction> findReduction(ncclRedOp_t op, ncclDataType_t type) const;

 private:
  struct Failure {
    ExchangeOutcome outcome;
    const CollectiveCall* call;  // the first call of the failed exchange
  };

  bool waitTurn(uint64_t issue);
  void endTurn(uint64_t nextIssue);
  void holdUntilAborted();
  std::optional<Failure> run(const std::vector<CollectiveCall>& calls);
  // One line on stderr; a lost peer also becomes the async error.
  void report(const Failure& failure, bool onStream);

  const int rank_;
  const int nranks_;
  const int device_;
  const uint64_t nonce_;
  const uint64_t hash_;
  const Endpoint self_;
  const std::unique_ptr<Mesh> mesh_;

  mutable std::mutex mu_;
  std::condition_variable cv_;     // signalled on every change below
  uint64_t issued_ = 0;            // calls numbered so far
  uint64_t executed_ = 0;          // calls run so far, in issue order
  uint64_t collectiveSeq_ = 0;     // wire sequence of collectives (and splits)
  std::vector<uint64_t> sendSeq_;  // wire sequence of Sends to each peer
  std::vector<uint64_t> recvSeq_;  // wire sequence of Recvs from each peer
  uint64_t splits_ = 0;
  bool aborted_ = false;
  bool broken_ = false;  // a host-side exchange failed: the wire is out of step
  ncclResult_t asyncError_ = ncclSuccess;
  std::map<int, std::pair<ncclDataType_t, Reduction>> preMulSums_;
  int nextCustomOp_ = ncclNumOps;  // nccl.h: dynamic ops start at ncclNumOps
  std::map<OpKind, uint64_t> funcSeq_;      // NCCL's seqNumber: per collective function
  std::unique_ptr<ProfilerComm> profiler_;  // null without a plugin
};

// The registry of live ncclComm_t handles, so that a NULL, destroyed or
// foreign handle is an ncclInvalidArgument rather than a crash.
ncclComm_t registerCommunicator(std::shared_ptr<Communicator> communicator);
std::shared_ptr<Communicator> findCommunicator(ncclComm_t handle);
// Forgets the handle; returns what it named (empty if nothing).
std::shared_ptr<Communicator> unregisterCommunicator(ncclComm_t handle);

}  // namespace rankscope::fakenccl

// nccl.h's opaque communicator. Queued stream work holds the Communicator
// too, so ncclCommAbort can free the handle while that work drains.
struct ncclComm {
  std::shared_ptr<rankscope::fakenccl::Communicator> impl;
};
