#include "tools/fakenccl/group.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "tools/fakenccl/error.h"
#include "tools/fakenccl/fakecuda.h"

namespace rankscope::fakenccl {
namespace {

struct PendingCall {
  std::shared_ptr<Communicator> comm;
  CollectiveCall call;
};

struct GroupState {
  int depth = 0;
  std::vector<PendingCall> calls;
  std::vector<std::function<ncclResult_t()>> inits;
};

thread_local GroupState tlsGroup;

// When one communicator's calls in a group name several streams, they run on
// the first stream once the others have reached the group, and the others
// go on once the calls are done: the join NCCL makes with events.
class StreamJoin {
 public:
  void expect(int streams) {
    std::lock_guard lock(mu_);
    expected_ = streams;
  }
  void arrive() {
    std::lock_guard lock(mu_);
    ++arrived_;
    cv_.notify_all();
  }
  void waitArrivals() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return arrived_ >= expected_; });
  }
  void finish() {
    std::lock_guard lock(mu_);
    finished_ = true;
    cv_.notify_all();
  }
  void waitFinished() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return finished_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int expected_ = 0;
  int arrived_ = 0;
  bool finished_ = false;
};

// One communicator's calls from one launch: the unit of stream work.
struct Task {
  std::shared_ptr<Communicator> comm;
  std::vector<CollectiveCall> calls;
  std::shared_ptr<StreamJoin> join;  // set when the calls name several streams
};

void runTask(void* arg) {
  std::unique_ptr<Task> task(static_cast<Task*>(arg));
  if (task->join) task->join->waitArrivals();
  task->comm->execute(task->calls);
  if (task->join) task->join->finish();
}

void runJoiner(void* arg) {
  std::unique_ptr<std::shared_ptr<StreamJoin>> join(static_cast<std::shared_ptr<StreamJoin>*>(arg));
  (*join)->arrive();
  (*join)->waitFinished();
}

// cudaStreamLegacy and cudaStreamPerThread name the NULL stream here; one
// name per stream, or a join would wait on itself.
cudaStream_t canonical(cudaStream_t stream) {
  return stream == cudaStreamLegacy || stream == cudaStreamPerThread ? nullptr : stream;
}

ncclResult_t launch(const std::shared_ptr<Communicator>& comm, std::vector<CollectiveCall> calls) {
  std::vector<cudaStream_t> streams;  // distinct, in call order
  for (const CollectiveCall& call : calls) {
    const cudaStream_t stream = canonical(call.stream);
    if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
  }
  auto task = std::make_unique<Task>(Task{comm, std::move(calls), nullptr});
  if (streams.size() > 1) {
    task->join = std::make_shared<StreamJoin>();
    int joined = 0;
    for (size_t i = 1; i < streams.size(); ++i) {
      auto* arg = new std::shared_ptr<StreamJoin>(task->join);
      if (fakecuda_stream_enqueue(streams[i], comm->device(), runJoiner, arg) == cudaSuccess) {
        ++joined;
      } else {
        delete arg;
      }
    }
    task->join->expect(joined);
  }
  std::shared_ptr<StreamJoin> join = task->join;
  Task* queued = task.release();  // runTask deletes it
  if (fakecuda_stream_enqueue(streams[0], comm->device(), runTask, queued) == cudaSuccess) {
    return ncclSuccess;
  }
  delete queued;
  if (join) join->finish();
  comm->markBroken();
  return fail(ncclInvalidArgument, "rank %d %s: the stream of a call was destroyed before the call could be queued",
              comm->rank(), comm->name().c_str());
}

// Runs the inits concurrently: each blocks until its peers arrive, and the
// peers may be among the others.
ncclResult_t runInits(std::vector<std::function<ncclResult_t()>>& inits) {
  std::vector<ncclResult_t> results(inits.size(), ncclSuccess);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < inits.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = inits[i](); });
  }
  for (std::thread& thread : threads) thread.join();
  for (ncclResult_t result : results) {
    if (result != ncclSuccess) return result;
  }
  return ncclSuccess;
}

// Launches the calls, one task per communicator (in the order the
// communicators first appear), so that a communicator's calls progress
// together.
ncclResult_t launchGroup(std::vector<PendingCall>& pending) {
  std::vector<std::pair<std::shared_ptr<Communicator>, std::vector<CollectiveCall>>> byComm;
  for (PendingCall& entry : pending) {
    auto it = std::find_if(byComm.begin(), byComm.end(), [&](const auto& item) { return item.first == entry.comm; });
    if (it == byComm.end()) it = byComm.insert(byComm.end(), {entry.comm, {}});
    it->second.push_back(entry.call);
  }
  ncclResult_t result = ncclSuccess;
  for (auto& [comm, calls] : byComm) {
    ncclResult_t launched = launch(comm, std::move(calls));
    if (result == ncclSuccess) result = launched;
  }
  return result;
}

}  // namespace

ncclResult_t submit(const std::shared_ptr<Communicator>& comm, CollectiveCall call) {
  comm->number(call);
  if (inGroup()) {
    tlsGroup.calls.push_back({comm, call});
    return ncclSuccess;
  }
  return launch(comm, {call});
}

ncclResult_t submitInit(std::function<ncclResult_t()> init) {
  if (!inGroup()) return init();
  tlsGroup.inits.push_back(std::move(init));
  return ncclSuccess;
}

bool inGroup() {
  return tlsGroup.depth > 0;
}

void groupStart() {
  ++tlsGroup.depth;
}

ncclResult_t groupEnd() {
  if (tlsGroup.depth == 0) {
    return fail(ncclInvalidUsage, "ncclGroupEnd: no group is open (missing ncclGroupStart)");
  }
  if (--tlsGroup.depth > 0) return ncclSuccess;
  std::vector<std::function<ncclResult_t()>> inits = std::move(tlsGroup.inits);
  std::vector<PendingCall> calls = std::move(tlsGroup.calls);
  tlsGroup.inits.clear();
  tlsGroup.calls.clear();
  const ncclResult_t initialised = runInits(inits);
  const ncclResult_t launched = launchGroup(calls);
  return initialised != ncclSuccess ? initialised : launched;
}

}  // namespace rankscope::fakenccl
