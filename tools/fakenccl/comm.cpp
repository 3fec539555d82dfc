#include "tools/fakenccl/comm.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "tools/fakenccl/error.h"

namespace rankscope::fakenccl {
namespace {

// "AllReduce #12 (count 65536, float32, phase 0, 131072 bytes)"
std::string describe(const SegmentHeader& header) {
  if (header.kind == 0) return "nothing";
  char text[160];
  std::snprintf(text, sizeof(text), "%s #%" PRIu64 " (count %" PRIu64 ", %s, phase %u, %" PRIu64 " bytes)",
                opKindName(static_cast<OpKind>(header.kind)), header.seq, header.count,
                datatypeName(static_cast<ncclDataType_t>(header.datatype)), static_cast<unsigned>(header.phase),
                header.bytes);
  return text;
}

// The phases that share one exchange.
struct Round {
  std::vector<Phase*> phases;
  std::vector<const CollectiveCall*> callOf;  // by phase
  const CollectiveCall* firstCall;
  bool open;  // single-phase calls may still join
};

// Consecutive single-phase calls share a round, so that the Send/Recv of a
// group progress together (nccl.h: "If multiple ncclSend and ncclRecv
// operations need to progress concurrently to complete, they must be fused
// within a ncclGroupStart/ncclGroupEnd section"). A multi-phase call runs
// alone, phase after phase. Each peer's segments stay in call order either
// way, so ranks that group the same calls differently still agree.
std::vector<Round> formRounds(const std::vector<CollectiveCall>& calls,
                              std::vector<std::unique_ptr<CollectivePlan>>& plans) {
  std::vector<Round> rounds;
  for (size_t i = 0; i < calls.size(); ++i) {
    std::vector<Phase>& phases = plans[i]->phases;
    if (phases.size() == 1 && !rounds.empty() && rounds.back().open) {
      rounds.back().phases.push_back(&phases[0]);
      rounds.back().callOf.push_back(&calls[i]);
      continue;
    }
    for (Phase& phase : phases) {
      rounds.push_back(Round{{&phase}, {&calls[i]}, &calls[i], phases.size() == 1});
    }
  }
  return rounds;
}

struct Registry {
  std::mutex mu;
  std::unordered_map<ncclComm*, std::unique_ptr<ncclComm>> handles;
};

Registry& registry() {
  static Registry* instance = new Registry;  // never destroyed: see error.cpp
  return *instance;
}

}  // namespace

Communicator::Communicator(int rank, int nranks, int device, uint64_t nonce, uint64_t hash, Endpoint self,
                           std::unique_ptr<Mesh> mesh)
    : rank_(rank),
      nranks_(nranks),
      device_(device),
      nonce_(nonce),
      hash_(hash),
      self_(self),
      mesh_(std::move(mesh)),
      sendSeq_(nranks),
      recvSeq_(nranks),
      profiler_(ProfilerComm::open(hash, nranks, rank)) {}

std::string Communicator::name() const {
  char text[32];
  std::snprintf(text, sizeof(text), "comm %016" PRIx64, nonce_);
  return text;
}

void Communicator::number(CollectiveCall& call) {
  std::lock_guard lock(mu_);
  call.issue = issued_++;
  switch (call.kind) {
    case OpKind::kSend:
      call.seq = sendSeq_[call.root]++;
      break;
    case OpKind::kRecv:
      call.seq = recvSeq_[call.root]++;
      break;
    default:
      call.seq = collectiveSeq_++;
      break;
  }
  if (profiler_ && call.kind != OpKind::kCommSplit) {
    call.profilerMask = profiler_->mask();  // NCCL reads it at the call, before the plugin hears of it
    call.profilerEvent = profiler_->enqueued(call, funcSeq_[call.kind]++);
  }
}

bool Communicator::waitTurn(uint64_t issue) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return aborted_ || (executed_ == issue && !broken_); });
  return !aborted_;
}

// Notifies under the lock: a waitIdle() that wakes may free the object.
void Communicator::endTurn(uint64_t nextIssue) {
  std::lock_guard lock(mu_);
  executed_ = std::max(executed_, nextIssue);
  cv_.notify_all();
}

void Communicator::holdUntilAborted() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return aborted_; });
}

void Communicator::waitIdle() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return aborted_ || broken_ || executed_ == issued_; });
}

void Communicator::markBroken() {
  std::lock_guard lock(mu_);
  broken_ = true;
  cv_.notify_all();
}

void Communicator::abort() {
  {
    std::lock_guard lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }
  mesh_->abort();
}

ncclResult_t Communicator::asyncError() const {
  std::lock_guard lock(mu_);
  return asyncError_;
}

uint64_t Communicator::takeSplitIndex() {
  std::lock_guard lock(mu_);
  return splits_++;
}

void Communicator::execute(const std::vector<CollectiveCall>& calls) {
  // The calls' kernels start as the stream reaches them, and wait inside
  // for their peers (and for this rank's earlier calls on other streams).
  std::vector<void*> kernels;
  if (profiler_)
    for (const CollectiveCall& call : calls) kernels.push_back(profiler_->kernelStarted(call.profilerEvent));
  if (waitTurn(calls.front().issue)) {
    if (std::optional<Failure> failure = run(calls)) {
      report(*failure, /*onStream=*/true);
      holdUntilAborted();
    }
  }
  for (void* kernel : kernels) profiler_->kernelStopped(kernel);
  endTurn(calls.back().issue + 1);
}

ncclResult_t Communicator::allGatherOnHost(const void* mine, void* all, size_t bytes) {
  CollectiveCall call;
  call.kind = OpKind::kCommSplit;
  call.sendbuff = mine;
  call.recvbuff = all;
  call.count = bytes;
  call.datatype = ncclUint8;
  number(call);
  if (!waitTurn(call.issue)) {
    endTurn(call.issue + 1);
    return fail(ncclInvalidUsage, "ncclCommSplit: rank %d %s was aborted", rank_, name().c_str());
  }
  std::optional<Failure> failure = run({call});
  if (failure) {
    report(*failure, /*onStream=*/false);
    markBroken();
  }
  endTurn(call.issue + 1);
  if (!failure) return ncclSuccess;
  return failure->outcome.status == ExchangeOutcome::Status::kPeerLost ? ncclRemoteError : ncclInvalidUsage;
}

std::optional<Communicator::Failure> Communicator::run(const std::vector<CollectiveCall>& calls) {
  std::vector<std::unique_ptr<CollectivePlan>> plans;
  plans.reserve(calls.size());
  for (const CollectiveCall& call : calls) plans.push_back(planCall(call, rank_, nranks_));

  std::vector<SendSegment> selfSends;
  std::vector<RecvSegment> selfRecvs;
  for (const Round& round : formRounds(calls, plans)) {
    std::vector<SendSegment> sends;
    std::vector<RecvSegment> recvs;
    for (size_t k = 0; k < round.phases.size(); ++k) {
      const Phase* phase = round.phases[k];
      for (SendSegment segment : phase->sends) {
        segment.owner = round.callOf[k]->profilerEvent;
        segment.ownerMask = round.callOf[k]->profilerMask;
        sends.push_back(segment);
      }
      recvs.insert(recvs.end(), phase->recvs.begin(), phase->recvs.end());
      selfSends.insert(selfSends.end(), phase->selfSends.begin(), phase->selfSends.end());
      selfRecvs.insert(selfRecvs.end(), phase->selfRecvs.begin(), phase->selfRecvs.end());
    }
    ExchangeOutcome outcome = mesh_->exchange(sends, recvs, profiler_ ? profiler_.get() : nullptr);
    if (outcome.status != ExchangeOutcome::Status::kDone) {
      if (profiler_) profiler_->abandonSends();
      return Failure{std::move(outcome), round.firstCall};
    }
    for (Phase* phase : round.phases) {
      if (phase->finish) phase->finish();
    }
  }

  // A rank's Sends to itself meet its Recvs from itself in order, within the
  // group; anything left unmatched would never complete on a GPU either.
  for (size_t i = 0; i < std::max(selfSends.size(), selfRecvs.size()); ++i) {
    const SegmentHeader sent = i < selfSends.size() ? selfSends[i].header : SegmentHeader{};
    const SegmentHeader expected = i < selfRecvs.size() ? selfRecvs[i].expected : SegmentHeader{};
    if (!(sent == expected)) {
      ExchangeOutcome outcome;
      outcome.status = ExchangeOutcome::Status::kMismatch;
      outcome.peer = rank_;
      outcome.expected = expected;
      outcome.received = sent;
      return Failure{std::move(outcome), &calls.front()};
    }
    if (sent.bytes != 0 && selfRecvs[i].data != selfSends[i].data) {
      std::memmove(selfRecvs[i].data, selfSends[i].data, sent.bytes);
    }
  }
  return std::nullopt;
}

void Communicator::report(const Failure& failure, bool onStream) {
  const ExchangeOutcome& outcome = failure.outcome;
  switch (outcome.status) {
    case ExchangeOutcome::Status::kMismatch:
      warn("rank %d %s: collective mismatch at op #%" PRIu64
           ": expected %s from rank %d, "
           "received %s; %s",
           rank_, name().c_str(), outcome.expected.seq, describe(outcome.expected).c_str(), outcome.peer,
           describe(outcome.received).c_str(), onStream ? "hanging as NCCL would" : "ncclCommSplit fails");
      break;
    case ExchangeOutcome::Status::kPeerLost: {
      {
        std::lock_guard lock(mu_);
        asyncError_ = ncclRemoteError;
      }
      warn("rank %d %s: lost the connection to rank %d during %s #%" PRIu64
           " (%s); ncclCommGetAsyncError reports ncclRemoteError; %s",
           rank_, name().c_str(), outcome.peer, opKindName(failure.call->kind), failure.call->seq,
           outcome.reason.c_str(), onStream ? "the stream waits for ncclCommAbort" : "ncclCommSplit fails");
      break;
    }
    case ExchangeOutcome::Status::kAborted:
    case ExchangeOutcome::Status::kDone:
      break;  // ncclCommAbort asked for it; nothing to say
  }
}

ncclRedOp_t Communicator::addPreMulSum(ncclDataType_t type, const Reduction& reduction) {
  std::lock_guard lock(mu_);
  const int op = nextCustomOp_++;
  preMulSums_[op] = {type, reduction};
  return static_cast<ncclRedOp_t>(op);
}

bool Communicator::removePreMulSum(ncclRedOp_t op) {
  std::lock_guard lock(mu_);
  return preMulSums_.erase(op) != 0;
}

std::optional<Reduction> Communicator::findReduction(ncclRedOp_t op, ncclDataType_t type) const {
  if (op >= 0 && op < ncclNumOps) {
    Reduction builtin;
    builtin.builtin = op;
    return builtin;
  }
  std::lock_guard lock(mu_);
  auto it = preMulSums_.find(op);
  if (it == preMulSums_.end() || it->second.first != type) return std::nullopt;
  return it->second.second;
}

ncclComm_t registerCommunicator(std::shared_ptr<Communicator> communicator) {
  auto handle = std::make_unique<ncclComm>(ncclComm{std::move(communicator)});
  ncclComm* raw = handle.get();
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.handles.emplace(raw, std::move(handle));
  return raw;
}

std::shared_ptr<Communicator> findCommunicator(ncclComm_t handle) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.handles.find(handle);
  return it == r.handles.end() ? nullptr : it->second->impl;
}

std::shared_ptr<Communicator> unregisterCommunicator(ncclComm_t handle) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.handles.find(handle);
  if (it == r.handles.end()) return nullptr;
  std::shared_ptr<Communicator> communicator = std::move(it->second->impl);
  r.handles.erase(it);
  return communicator;
}

}  // namespace rankscope::fakenccl
