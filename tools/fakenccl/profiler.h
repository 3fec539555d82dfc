// NCCL's profiler plugin, driven as NCCL 2.28 drives it, so that rankscope's
// plugin (nccl-profiler/) is exercised by real multi-rank jobs on machines
// without a GPU.
//
// The plugin is named by NCCL_PROFILER_PLUGIN (a path, or a name NAME for
// libnccl-profiler-NAME.so) and loaded once per process; its table is
// ncclProfiler_v5, else ncclProfiler_v4 (nccl-profiler/abi.h). Each
// communicator calls init with NCCL's commHash and finalize when it ends.
// Each collective and Send/Recv is started and stopped as it is enqueued
// (NCCL's stop means "enqueued"), with NCCL's seqNumber: per communicator and
// collective function. Its kernel is a kernel-channel event on channel 0,
// started when the stream reaches the call and stopped when the call has
// run, with "GPU" times: CLOCK_REALTIME, as %globaltimer reads (shifted by
// FAKECUDA_GPU_CLOCK_OFFSET_NS, a GPU whose timer is off).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "tools/fakenccl/collectives.h"

namespace rankscope::fakenccl {

class ProfilerComm final : public SendObserver {
 public:
  // The plugin's session for one communicator; null without a plugin (or
  // when its init fails, said once on stderr).
  static std::unique_ptr<ProfilerComm> open(uint64_t commHash, int nranks, int rank);
  ~ProfilerComm();  // finalize
  ProfilerComm(const ProfilerComm&) = delete;
  ProfilerComm& operator=(const ProfilerComm&) = delete;

  // `call` enqueued (host thread), with the mask as NCCL read it before
  // (call.profilerMask): its event started and stopped; the handle its
  // kernel hangs off (null: not recorded).
  void* enqueued(const CollectiveCall& call, uint64_t seqNumber);
  // NCCL's activation mask now: one per process, which every plugin init
  // gets (the plugin may change it at any event; a call keeps the mask it
  // was enqueued with).
  int mask() const;
  // The call's kernel on its stream: started now; stopped (GPU stop time now).
  void* kernelStarted(void* call);
  void kernelStopped(void* kernel);
  // NCCL's proxy, sending a segment of a call over the network (mesh.h):
  // one proxy operation of one step per segment, when the plugin asks for
  // them. Only the send side is modelled (the side rankscope reads).
  void posted(const SendSegment& segment, bool handed) override;
  void done(const SendSegment& segment) override;
  // An exchange ended early (a mismatch, a lost peer, an abort): the sends
  // it posted stop where they are.
  void abandonSends();

 private:
  explicit ProfilerComm(int rank) : rank_(rank) {}
  const int rank_;
  void* context_ = nullptr;
  struct Proxy {
    void* op = nullptr;
    void* step = nullptr;
  };
  std::unordered_map<const SendSegment*, Proxy> proxies_;  // segments posted and not done
};

}  // namespace rankscope::fakenccl
