#include "tools/fakenccl/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "tools/fakenccl/error.h"

namespace rankscope::fakenccl {
namespace {

sockaddr_in toSockaddr(const Endpoint& endpoint) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = endpoint.ip;
  address.sin_port = endpoint.port;
  return address;
}

Endpoint fromSockaddr(const sockaddr_in& address) {
  return Endpoint{address.sin_addr.s_addr, address.sin_port, 0};
}

// One entry of NCCL_SOCKET_IFNAME's list against an interface name: a prefix,
// or the whole name when the list starts with '='.
bool nameMatches(std::string_view name, std::string_view entry, bool exact) {
  if (entry.empty()) return false;
  return exact ? name == entry : name.starts_with(entry);
}

// NCCL_SOCKET_IFNAME, as NCCL's documentation ("Environment Variables")
// defines it: comma-separated name prefixes; a leading '^' turns the list
// into exclusions; a following '=' makes the names exact.
bool interfaceSelected(std::string_view name, std::string_view spec) {
  const bool exclude = spec.starts_with('^');
  if (exclude) spec.remove_prefix(1);
  const bool exact = spec.starts_with('=');
  if (exact) spec.remove_prefix(1);
  bool listed = false;
  while (!spec.empty() && !listed) {
    const size_t comma = spec.find(',');
    listed = nameMatches(name, spec.substr(0, comma), exact);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
  }
  return listed != exclude;
}

}  // namespace

std::string toString(const Endpoint& endpoint) {
  char text[INET_ADDRSTRLEN] = "?";
  in_addr address{endpoint.ip};
  inet_ntop(AF_INET, &address, text, sizeof(text));
  return std::string(text) + ":" + std::to_string(ntohs(endpoint.port));
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

int Fd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

bool socketInterfaceChosen() {
  const char* spec = std::getenv("NCCL_SOCKET_IFNAME");
  return spec != nullptr && *spec != '\0';
}

ncclResult_t chooseInterfaceAddress(uint32_t* ip) {
  const char* spec = std::getenv("NCCL_SOCKET_IFNAME");
  const bool chosen = socketInterfaceChosen();
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) {
    return fail(ncclSystemError, "getifaddrs failed: %s", std::strerror(errno));
  }
  bool found = false;
  for (ifaddrs* it = interfaces; it != nullptr && !found; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if (!(it->ifa_flags & IFF_UP)) continue;
    const std::string_view name = it->ifa_name;
    const bool selected =
        chosen ? interfaceSelected(name, spec) : !(it->ifa_flags & IFF_LOOPBACK) && !name.starts_with("docker");
    if (!selected) continue;
    *ip = reinterpret_cast<const sockaddr_in*>(it->ifa_addr)->sin_addr.s_addr;
    found = true;
  }
  freeifaddrs(interfaces);
  if (found) return ncclSuccess;
  if (chosen) {
    return fail(ncclSystemError, "no UP IPv4 interface matches NCCL_SOCKET_IFNAME=%s", spec);
  }
  *ip = htonl(INADDR_LOOPBACK);
  return ncclSuccess;
}

ncclResult_t listenOn(uint32_t ip, Fd* listener, Endpoint* bound) {
  Fd socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!socket.valid()) return fail(ncclSystemError, "socket: %s", std::strerror(errno));
  sockaddr_in address = toSockaddr(Endpoint{ip, 0, 0});
  if (::bind(socket.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return fail(ncclSystemError, "bind to %s: %s", toString(Endpoint{ip, 0, 0}).c_str(), std::strerror(errno));
  }
  // Every peer of a communicator may connect before this rank accepts.
  if (::listen(socket.get(), SOMAXCONN) != 0) {
    return fail(ncclSystemError, "listen: %s", std::strerror(errno));
  }
  FAKENCCL_TRY(localEndpoint(socket, bound));
  *listener = std::move(socket);
  return ncclSuccess;
}

ncclResult_t acceptFrom(const Fd& listener, Fd* connection) {
  for (;;) {
    int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      *connection = Fd(fd);
      return ncclSuccess;
    }
    if (errno != EINTR && errno != ECONNABORTED) {
      return fail(ncclSystemError, "accept: %s", std::strerror(errno));
    }
  }
}

ncclResult_t connectTo(const Endpoint& endpoint, const std::string& peer, Fd* connection, const char* hint) {
  Fd socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!socket.valid()) return fail(ncclSystemError, "socket: %s", std::strerror(errno));
  sockaddr_in address = toSockaddr(endpoint);
  int rc;
  do {
    rc = ::connect(socket.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    return fail(ncclSystemError, "cannot connect to %s at %s: %s%s", peer.c_str(), toString(endpoint).c_str(),
                std::strerror(errno), hint);
  }
  *connection = std::move(socket);
  return ncclSuccess;
}

ncclResult_t localEndpoint(const Fd& socket, Endpoint* endpoint) {
  sockaddr_in address{};
  socklen_t length = sizeof(address);
  if (::getsockname(socket.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return fail(ncclSystemError, "getsockname: %s", std::strerror(errno));
  }
  *endpoint = fromSockaddr(address);
  return ncclSuccess;
}

ncclResult_t sendAll(const Fd& socket, const void* data, size_t bytes) {
  const char* cursor = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t sent = ::send(socket.get(), cursor, bytes, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0) {
      return fail(errno == EPIPE || errno == ECONNRESET ? ncclRemoteError : ncclSystemError, "send: %s",
                  std::strerror(errno));
    }
    cursor += sent;
    bytes -= static_cast<size_t>(sent);
  }
  return ncclSuccess;
}

ncclResult_t recvAll(const Fd& socket, void* data, size_t bytes) {
  char* cursor = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t received = ::recv(socket.get(), cursor, bytes, 0);
    if (received < 0 && errno == EINTR) continue;
    if (received == 0) return fail(ncclRemoteError, "recv: connection closed by peer");
    if (received < 0) {
      return fail(errno == ECONNRESET ? ncclRemoteError : ncclSystemError, "recv: %s", std::strerror(errno));
    }
    cursor += received;
    bytes -= static_cast<size_t>(received);
  }
  return ncclSuccess;
}

ncclResult_t makeDataConnection(const Fd& socket) {
  int one = 1;
  if (::setsockopt(socket.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return fail(ncclSystemError, "setsockopt(TCP_NODELAY): %s", std::strerror(errno));
  }
  int flags = ::fcntl(socket.get(), F_GETFL);
  if (flags < 0 || ::fcntl(socket.get(), F_SETFL, flags | O_NONBLOCK) != 0) {
    return fail(ncclSystemError, "fcntl(O_NONBLOCK): %s", std::strerror(errno));
  }
  return ncclSuccess;
}

}  // namespace rankscope::fakenccl
