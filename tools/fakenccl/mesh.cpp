#include "tools/fakenccl/mesh.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>

#include "tools/fakenccl/error.h"

namespace rankscope::fakenccl {
namespace {

constexpr size_t kHeaderBytes = sizeof(SegmentHeader);

// Where one exchange stands with one peer: the segments still to go each way
// and how far the current one in each direction has got (header included).
struct PeerProgress {
  std::vector<const SendSegment*> sends;
  size_t sendIndex = 0;
  size_t sendOffset = 0;
  std::vector<const RecvSegment*> recvs;
  size_t recvIndex = 0;
  size_t recvOffset = 0;
  SegmentHeader header;  // the incoming header, as far as it has arrived
  bool posted = false;   // the send segment at sendIndex was posted (SendObserver)
  std::chrono::steady_clock::time_point heldUntil;  // ...and the link holds it until then

  bool sending() const { return sendIndex < sends.size(); }
  bool receiving() const { return recvIndex < recvs.size(); }
};

ExchangeOutcome peerLost(int peer, const char* what) {
  ExchangeOutcome outcome;
  outcome.status = ExchangeOutcome::Status::kPeerLost;
  outcome.peer = peer;
  outcome.reason = what;
  return outcome;
}

ExchangeOutcome mismatch(int peer, const SegmentHeader& expected, const SegmentHeader& received) {
  ExchangeOutcome outcome;
  outcome.status = ExchangeOutcome::Status::kMismatch;
  outcome.peer = peer;
  outcome.expected = expected;
  outcome.received = received;
  return outcome;
}

// Writes as much of the segment being sent as the socket takes. Returns a
// failure, or nothing when the socket is full or the segment is done (the
// next one is posted by the caller).
std::optional<ExchangeOutcome> progressSends(int fd, int peer, PeerProgress& p, SendObserver* observer) {
  while (p.sending()) {
    const SendSegment& segment = *p.sends[p.sendIndex];
    iovec parts[2];
    int partCount = 0;
    if (p.sendOffset < kHeaderBytes) {
      parts[partCount++] = {const_cast<char*>(reinterpret_cast<const char*>(&segment.header)) + p.sendOffset,
                            kHeaderBytes - p.sendOffset};
    }
    const size_t payloadDone = p.sendOffset > kHeaderBytes ? p.sendOffset - kHeaderBytes : 0;
    if (segment.header.bytes > payloadDone) {
      parts[partCount++] = {const_cast<char*>(static_cast<const char*>(segment.data)) + payloadDone,
                            segment.header.bytes - payloadDone};
    }
    msghdr message{};
    message.msg_iov = parts;
    message.msg_iovlen = partCount;
    ssize_t sent = ::sendmsg(fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return std::nullopt;
      return peerLost(peer, std::strerror(errno));
    }
    p.sendOffset += static_cast<size_t>(sent);
    if (p.sendOffset == kHeaderBytes + segment.header.bytes) {
      ++p.sendIndex;
      p.sendOffset = 0;
      p.posted = false;
      if (observer) observer->done(segment);
      return std::nullopt;
    }
  }
  return std::nullopt;
}

long long linkPeer() {
  static const long long only = [] {
    const char* env = std::getenv("FAKECUDA_LINK_PEER");
    return env && *env ? std::strtoll(env, nullptr, 10) : -1;
  }();
  return only;
}

// FAKECUDA_LINK_STALL_FILE exists: the link to FAKECUDA_LINK_PEER (every
// link without one) is dead.
bool linkDead() {
  static const char* stall = std::getenv("FAKECUDA_LINK_STALL_FILE");
  return stall && *stall && ::access(stall, F_OK) == 0;
}

// FAKECUDA_LINK_DELAY_US, FAKECUDA_LINK_PEER, FAKECUDA_LINK_DELAY_AFTER,
// FAKECUDA_LINK_STALL_FILE (Mesh::exchange): how long the link to `peer` holds a segment this exchange.
std::chrono::microseconds linkDelay(int peer, long long exchange, bool dead) {
  static const long long delay = [] {
    const char* env = std::getenv("FAKECUDA_LINK_DELAY_US");
    return env ? std::strtoll(env, nullptr, 10) : 0;
  }();
  static const long long after = [] {
    const char* env = std::getenv("FAKECUDA_LINK_DELAY_AFTER");
    return env ? std::strtoll(env, nullptr, 10) : 0;
  }();
  if (linkPeer() >= 0 && linkPeer() != peer) return std::chrono::microseconds(0);
  // A dead link: once the file exists, what is posted on it is never sent
  // (held a day; an abort still ends the exchange).
  if (dead) return std::chrono::hours(24);
  if (delay <= 0 || exchange < after) return std::chrono::microseconds(0);
  return std::chrono::microseconds(delay);
}

// Whether this rank's data for `peer` waits for data that will never come:
// in NCCL's rings every rank's result passes through every link, so behind
// a dead link the sender's other transfers stall too, before the network
// (waiting for data, not handed over), and no rank finishes the collective.
// fakenccl's mesh sends each peer its data directly, so it withholds them.
bool withheldBehindDeadLink(int peer, bool dead) { return dead && linkPeer() >= 0 && linkPeer() != peer; }

// Reads what has arrived, never past the end of the segments expected (the
// bytes after them belong to a later call). Checks each header as soon as it
// is complete.
std::optional<ExchangeOutcome> progressRecvs(int fd, int peer, PeerProgress& p) {
  while (p.receiving()) {
    const RecvSegment& segment = *p.recvs[p.recvIndex];
    char* target;
    size_t wanted;
    if (p.recvOffset < kHeaderBytes) {
      target = reinterpret_cast<char*>(&p.header) + p.recvOffset;
      wanted = kHeaderBytes - p.recvOffset;
    } else {
      const size_t payloadDone = p.recvOffset - kHeaderBytes;
      target = static_cast<char*>(segment.data) + payloadDone;
      wanted = segment.expected.bytes - payloadDone;
    }
    if (wanted > 0) {
      ssize_t received = ::recv(fd, target, wanted, MSG_DONTWAIT);
      if (received < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return std::nullopt;
        return peerLost(peer, std::strerror(errno));
      }
      if (received == 0) return peerLost(peer, "connection closed");
      p.recvOffset += static_cast<size_t>(received);
      if (p.recvOffset == kHeaderBytes && !(p.header == segment.expected)) {
        return mismatch(peer, segment.expected, p.header);
      }
    }
    if (p.recvOffset == kHeaderBytes + segment.expected.bytes) {
      ++p.recvIndex;
      p.recvOffset = 0;
    }
  }
  return std::nullopt;
}

}  // namespace

ncclResult_t Mesh::create(std::vector<Fd> peers, std::unique_ptr<Mesh>* mesh) {
  Fd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return fail(ncclSystemError, "eventfd: %s", std::strerror(errno));
  mesh->reset(new Mesh(std::move(peers), std::move(wake)));
  return ncclSuccess;
}

Mesh::Mesh(std::vector<Fd> peers, Fd wake) : peers_(std::move(peers)), wake_(std::move(wake)) {}

ExchangeOutcome Mesh::exchange(std::span<const SendSegment> sends, std::span<const RecvSegment> recvs,
                               SendObserver* observer) {
  static std::atomic<long long> exchanges{0};
  const long long exchange = exchanges.fetch_add(1, std::memory_order_relaxed);
  std::vector<PeerProgress> progress(peers_.size());
  for (const SendSegment& segment : sends) progress[segment.peer].sends.push_back(&segment);
  for (const RecvSegment& segment : recvs) progress[segment.peer].recvs.push_back(&segment);

  std::vector<pollfd> watched;
  std::vector<int> watchedPeer;  // watched[i] is the connection to rank watchedPeer[i]
  for (;;) {
    // The wake fd first: an abort wins over any progress.
    watched.assign(1, pollfd{wake_.get(), POLLIN, 0});
    watchedPeer.assign(1, -1);
    const auto now = std::chrono::steady_clock::now();
    const bool dead = linkDead();  // once per pass: every peer's segment sees the same
    std::optional<std::chrono::steady_clock::time_point> wakeAt;  // the first held segment's release
    bool busy = false;
    for (int peer = 0; peer < static_cast<int>(peers_.size()); ++peer) {
      PeerProgress& p = progress[peer];
      if (p.sending() && !p.posted) {
        p.posted = true;
        const bool withheld = withheldBehindDeadLink(peer, dead);
        // Withheld: never handed to the network (an abort still ends it).
        p.heldUntil = now + (withheld ? std::chrono::hours(24) : linkDelay(peer, exchange, dead));
        if (observer) observer->posted(*p.sends[p.sendIndex], !withheld);
      }
      const bool held = p.sending() && p.heldUntil > now;
      if (held) wakeAt = std::min(wakeAt.value_or(p.heldUntil), p.heldUntil);
      busy |= p.sending() || p.receiving();
      const short events = (p.sending() && !held ? POLLOUT : 0) | (p.receiving() ? POLLIN : 0);
      if (events == 0) continue;
      watched.push_back({peers_[peer].get(), events, 0});
      watchedPeer.push_back(peer);
    }
    if (!busy) return {};  // all done

    timespec timeout{};
    if (wakeAt) {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(*wakeAt - now).count();
      timeout = {static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    }
    if (::ppoll(watched.data(), watched.size(), wakeAt ? &timeout : nullptr, nullptr) < 0) {
      if (errno == EINTR) continue;
      return peerLost(-1, std::strerror(errno));
    }
    if (watched[0].revents != 0) {
      ExchangeOutcome aborted;
      aborted.status = ExchangeOutcome::Status::kAborted;
      return aborted;
    }
    for (size_t i = 1; i < watched.size(); ++i) {
      const short ready = watched[i].revents;
      if (ready == 0) continue;
      const int peer = watchedPeer[i];
      PeerProgress& p = progress[peer];
      // A hang-up or error shows through the read or write it makes fail.
      if (ready & (POLLIN | POLLHUP | POLLERR)) {
        if (auto failure = progressRecvs(watched[i].fd, peer, p)) return *failure;
      }
      if (ready & (POLLOUT | POLLHUP | POLLERR)) {
        if (auto failure = progressSends(watched[i].fd, peer, p, observer)) return *failure;
      }
    }
  }
}

void Mesh::abort() {
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  for (const Fd& peer : peers_) {
    if (peer.valid()) ::shutdown(peer.get(), SHUT_RDWR);
  }
}

}  // namespace rankscope::fakenccl
