// Data movement between the ranks of a communicator over its TCP mesh.
//
// Every payload travels as a segment: a SegmentHeader naming the call it
// belongs to, then the bytes. The receiver knows which segment it expects
// next from each peer (the calls are made in the same order on every rank, as
// NCCL requires), so a header that differs from the expected one is a
// collective mismatch, caught before a byte of payload lands in user memory.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tools/fakenccl/net.h"

namespace rankscope::fakenccl {

constexpr uint32_t kSegmentMagic = 0x666b7331;  // "fks1"

struct SegmentHeader {
  uint32_t magic = kSegmentMagic;
  uint8_t kind = 0;      // OpKind of the call that sent it
  uint8_t datatype = 0;  // ncclDataType_t of the call
  uint8_t phase = 0;     // step of a multi-step algorithm
  uint8_t reserved = 0;
  uint64_t seq = 0;    // the call's sequence number (collectives: per communicator;
                       // Send/Recv: per ordered pair of ranks)
  uint64_t count = 0;  // the call's count argument
  uint64_t bytes = 0;  // payload bytes after this header

  bool operator==(const SegmentHeader&) const = default;
};
static_assert(sizeof(SegmentHeader) == 32);

struct SendSegment {
  int peer;
  SegmentHeader header;
  const void* data;       // header.bytes bytes
  void* owner = nullptr;  // the profiler plugin's handle of the call it belongs to (profiler.h), if any
  int ownerMask = 0;      // the plugin's activation mask when that call was enqueued
};

// Told when each send segment is handed to the network (its first byte may
// go: NCCL's proxy posts a step) and when its last byte went: the network
// side of the call, as NCCL's proxy steps report it.
class SendObserver {
 public:
  virtual ~SendObserver() = default;
  // `handed`: given to the network (false: it waits for data that never
  // comes, behind a dead link, and is never done).
  virtual void posted(const SendSegment& segment, bool handed) = 0;
  virtual void done(const SendSegment& segment) = 0;
};

struct RecvSegment {
  int peer;
  SegmentHeader expected;
  void* data;  // room for expected.bytes bytes
};

struct ExchangeOutcome {
  enum class Status { kDone, kMismatch, kPeerLost, kAborted };
  Status status = Status::kDone;
  int peer = -1;             // kMismatch, kPeerLost
  SegmentHeader expected{};  // kMismatch
  SegmentHeader received{};  // kMismatch
  std::string reason;        // kPeerLost
};

class Mesh {
 public:
  // peers[r] is the connection to rank r (empty for this rank itself), as
  // connectMesh leaves them.
  static ncclResult_t create(std::vector<Fd> peers, std::unique_ptr<Mesh>* mesh);
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  // Moves every segment, all peers at once, driven by poll(): no ordering of
  // sends and receives can deadlock on full socket buffers. Segments to (and
  // from) one peer go in the order given. Returns when all are done, or at
  // the first mismatch, lost peer or abort(). A rank's transfers to itself
  // are not segments. One exchange at a time per mesh. `observer`, if any,
  // hears each send segment posted and done.
  //
  // FAKECUDA_LINK_DELAY_US=N: a slow link. Each segment this process sends
  // (to FAKECUDA_LINK_PEER only, when set: one link; else on every link: its
  // NIC) goes N microseconds after it was posted, as if the network took
  // that long with it; with FAKECUDA_LINK_DELAY_AFTER=M, from the process's
  // M-th exchange on (a link that degrades while the job runs).
  // FAKECUDA_LINK_STALL_FILE=PATH: a link that dies. Once PATH exists, a
  // segment posted on it (FAKECUDA_LINK_PEER's, or every link) is never sent.
  ExchangeOutcome exchange(std::span<const SendSegment> sends, std::span<const RecvSegment> recvs,
                           SendObserver* observer = nullptr);

  // Makes the running exchange and every later one return kAborted, and
  // shuts the connections down so that the peers' exchanges end too.
  void abort();

 private:
  Mesh(std::vector<Fd> peers, Fd wake);

  std::vector<Fd> peers_;
  Fd wake_;  // an eventfd that becomes readable on abort()
};

}  // namespace rankscope::fakenccl
