// TCP plumbing for the NCCL stand-in: endpoints, owned sockets, blocking
// whole-message I/O for the bootstrap, and the choice of local address.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace rankscope::fakenccl {

// An IPv4 address and port, both in network byte order as in sockaddr_in.
// Endpoints travel between ranks, so the padding is explicit.
struct Endpoint {
  uint32_t ip = 0;
  uint16_t port = 0;
  uint16_t reserved = 0;
};
static_assert(sizeof(Endpoint) == 8);

std::string toString(const Endpoint& endpoint);  // "10.0.0.2:41234"

// Owns a file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();

 private:
  int fd_ = -1;
};

// The IPv4 address of the interface NCCL_SOCKET_IFNAME selects, or, when the
// variable is unset, of the first UP interface that is neither loopback nor
// docker*, as NCCL chooses; 127.0.0.1 when there is none.
ncclResult_t chooseInterfaceAddress(uint32_t* ip);

// Whether NCCL_SOCKET_IFNAME is set, i.e. the user chose the interface.
bool socketInterfaceChosen();

// A listening socket on `ip` and a port the kernel picks; `bound` says which.
ncclResult_t listenOn(uint32_t ip, Fd* listener, Endpoint* bound);
ncclResult_t acceptFrom(const Fd& listener, Fd* connection);
// `peer` names the other end in the error message ("rank 3"); `hint`, if
// any, follows the reason.
ncclResult_t connectTo(const Endpoint& endpoint, const std::string& peer, Fd* connection, const char* hint = "");

// The local end of a connected socket.
ncclResult_t localEndpoint(const Fd& socket, Endpoint* endpoint);

// Blocking transfers of exactly `bytes`. A peer that closes the connection
// early is an ncclRemoteError.
ncclResult_t sendAll(const Fd& socket, const void* data, size_t bytes);
ncclResult_t recvAll(const Fd& socket, void* data, size_t bytes);

// The settings of a connection that carries collective data: no Nagle delay
// (segments are small headers followed by payloads) and non-blocking I/O.
ncclResult_t makeDataConnection(const Fd& socket);

}  // namespace rankscope::fakenccl
