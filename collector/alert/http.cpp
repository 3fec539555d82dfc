#include "collector/alert/http.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>

namespace rankscope::collector {

namespace {

using SteadyClock = std::chrono::steady_clock;

// Alertmanager answers a POST with an empty body and a listing with a few
// kilobytes per alert; anything far larger is not a response we asked for.
constexpr size_t kMaxResponseBytes = 64u << 20;

constexpr std::string_view kTlsAdvice =
    "TLS is not supported; put Alertmanager behind a plain-HTTP listener on the collector's network or use a local "
    "relay";

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool starts_with_nocase(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && lower(text.substr(0, prefix.size())) == prefix;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

// Parses all of `text` as an unsigned number in `base`; nothing else may follow.
template <typename T>
std::optional<T> parse_number(std::string_view text, int base = 10) {
  T value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

Result<uint16_t> parse_port(std::string_view text, const std::string& url) {
  auto port = parse_number<uint32_t>(text);
  if (!port || *port == 0 || *port > 65535)
    return make_error(Errc::invalid_argument, url + ": the port must be a number from 1 to 65535");
  return static_cast<uint16_t>(*port);
}

class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

int ms_left(SteadyClock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

// Waits until the socket is ready for `events`, or fails once the deadline passes.
Result<void> wait_ready(int fd, short events, SteadyClock::time_point deadline, const std::string& doing) {
  for (;;) {
    pollfd entry{fd, events, 0};
    int ready = poll(&entry, 1, ms_left(deadline));
    if (ready > 0) return {};
    if (ready == 0) return make_error(Errc::io, "timed out " + doing);
    if (errno != EINTR) return make_error(Errc::system, doing + ": poll: " + strerror(errno));
  }
}

// Tries every address the name resolves to until one accepts the connection.
Result<UniqueFd> connect_to(const HttpUrl& url, SteadyClock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::string port = std::to_string(url.port);
  if (int rc = getaddrinfo(url.host.c_str(), port.c_str(), &hints, &found); rc != 0)
    return make_error(Errc::io, "cannot resolve " + url.host + ": " + gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addresses(found, freeaddrinfo);

  std::string last_error = "no address";
  for (const addrinfo* address = found; address; address = address->ai_next) {
    UniqueFd fd(socket(address->ai_family, address->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, address->ai_protocol));
    if (fd.get() < 0) {
      last_error = strerror(errno);
      continue;
    }
    if (connect(fd.get(), address->ai_addr, address->ai_addrlen) == 0) return fd;
    if (errno != EINPROGRESS) {
      last_error = strerror(errno);
      continue;
    }
    auto ready = wait_ready(fd.get(), POLLOUT, deadline, "connecting to " + url.authority());
    if (!ready) return ready.error();
    int error = 0;
    socklen_t length = sizeof(error);
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
    if (error == 0) return fd;
    last_error = strerror(error);
  }
  return make_error(Errc::io, "cannot connect to " + url.authority() + ": " + last_error);
}

Result<void> send_all(int fd, std::string_view data, SteadyClock::time_point deadline, const HttpUrl& url) {
  while (!data.empty()) {
    // MSG_NOSIGNAL: a peer that hung up must be an error here, not SIGPIPE for the whole collector.
    ssize_t sent = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (sent >= 0) {
      data.remove_prefix(static_cast<size_t>(sent));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      auto ready = wait_ready(fd, POLLOUT, deadline, "sending to " + url.authority());
      if (!ready) return ready;
    } else if (errno != EINTR) {
      return make_error(Errc::io, "sending to " + url.authority() + ": " + strerror(errno));
    }
  }
  return {};
}

// Reads until the server closes the connection, which it does after the
// response because the request said `Connection: close`.
Result<std::string> receive_all(int fd, SteadyClock::time_point deadline, const HttpUrl& url) {
  std::string data;
  char buffer[16384];
  for (;;) {
    auto ready = wait_ready(fd, POLLIN, deadline, "waiting for the response from " + url.authority());
    if (!ready) return ready.error();
    ssize_t got = recv(fd, buffer, sizeof(buffer), 0);
    if (got == 0) return data;
    if (got < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return make_error(Errc::io, "reading from " + url.authority() + ": " + strerror(errno));
    }
    data.append(buffer, static_cast<size_t>(got));
    if (data.size() > kMaxResponseBytes)
      return make_error(Errc::protocol,
                        url.authority() + " sent a response over " + std::to_string(kMaxResponseBytes >> 20) + " MiB");
  }
}

// RFC 9112 section 7.1: size line (hex, optional extensions), data, CRLF; a
// zero size ends the body. Trailer fields after it are ignored.
Result<std::string> decode_chunked(std::string_view body) {
  std::string out;
  size_t pos = 0;
  for (;;) {
    size_t line_end = body.find("\r\n", pos);
    if (line_end == std::string_view::npos) return make_error(Errc::protocol, "chunked body ends early");
    std::string_view size_text = body.substr(pos, line_end - pos);
    size_text = trim(size_text.substr(0, size_text.find(';')));
    auto size = parse_number<uint64_t>(size_text, 16);
    if (!size) return make_error(Errc::protocol, "bad chunk size '" + std::string(size_text) + "'");
    pos = line_end + 2;
    if (*size == 0) return out;
    if (*size > body.size() || body.size() - pos < *size + 2)
      return make_error(Errc::protocol, "chunked body ends early");
    out.append(body.substr(pos, *size));
    pos += *size;
    if (body.substr(pos, 2) != "\r\n") return make_error(Errc::protocol, "chunk not followed by CRLF");
    pos += 2;
  }
}

bool has_no_body(const std::string& method, int status) {
  return method == "HEAD" || status / 100 == 1 || status == 204 || status == 304;
}

Result<HttpResponse> parse_response(std::string_view raw, const std::string& method) {
  size_t header_end = raw.find("\r\n\r\n");
  if (header_end == std::string_view::npos)
    return make_error(Errc::protocol, raw.empty() ? "empty response" : "response header incomplete");
  std::string_view head = raw.substr(0, header_end);
  size_t line_end = std::min(head.find("\r\n"), head.size());
  std::string_view status_line = head.substr(0, line_end);
  // "HTTP/1.1 200 OK": the version, a space, three digits.
  std::optional<int> status;
  if (status_line.starts_with("HTTP/1.") && status_line.size() >= 12 && status_line[8] == ' ')
    status = parse_number<int>(status_line.substr(9, 3));
  if (!status) return make_error(Errc::protocol, "bad status line '" + std::string(status_line) + "'");

  std::optional<uint64_t> content_length;
  bool chunked = false;
  for (size_t pos = line_end; pos < head.size();) {
    size_t next = std::min(head.find("\r\n", pos + 2), head.size());
    std::string_view line = head.substr(pos + 2, next - pos - 2);
    pos = next;
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string name = lower(trim(line.substr(0, colon)));
    std::string_view value = trim(line.substr(colon + 1));
    if (name == "content-length") {
      content_length = parse_number<uint64_t>(value);
      if (!content_length) return make_error(Errc::protocol, "bad Content-Length '" + std::string(value) + "'");
    } else if (name == "transfer-encoding") {
      chunked = lower(value).find("chunked") != std::string::npos;
    }
  }

  HttpResponse response;
  response.status = *status;
  std::string_view body = raw.substr(header_end + 4);
  if (has_no_body(method, *status)) return response;
  // Chunked framing wins over a Content-Length sent beside it (RFC 9112 section 6.3).
  if (chunked) {
    auto decoded = decode_chunked(body);
    if (!decoded) return decoded.error();
    response.body = std::move(*decoded);
  } else if (content_length) {
    if (body.size() < *content_length)
      return make_error(Errc::protocol, "connection closed after " + std::to_string(body.size()) + " of " +
                                            std::to_string(*content_length) + " body bytes");
    response.body = std::string(body.substr(0, *content_length));
  } else {
    response.body = std::string(body);
  }
  return response;
}

std::string build_request(const std::string& method, const HttpUrl& url, const std::string& body,
                          const std::string& content_type) {
  std::string request = method + " " + url.path + " HTTP/1.1\r\nHost: " + url.authority() +
                        "\r\nUser-Agent: rankscope-collector\r\nConnection: close\r\n";
  if (!content_type.empty()) request += "Content-Type: " + content_type + "\r\n";
  if (!body.empty() || (method != "GET" && method != "HEAD"))
    request += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  request += "\r\n";
  request += body;
  return request;
}

}  // namespace

std::string HttpUrl::authority() const {
  bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<HttpUrl> parse_http_url(const std::string& url) {
  constexpr std::string_view kScheme = "http://";
  if (starts_with_nocase(url, "https://"))
    return make_error(Errc::invalid_argument, url + ": " + std::string(kTlsAdvice));
  if (!starts_with_nocase(url, kScheme))
    return make_error(Errc::invalid_argument, url + ": expected a URL of the form http://HOST[:PORT][/PATH]");

  std::string_view rest = std::string_view(url).substr(kScheme.size());
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  HttpUrl parsed;
  if (slash != std::string_view::npos) parsed.path = std::string(rest.substr(slash));
  if (authority.find('@') != std::string_view::npos)
    return make_error(Errc::invalid_argument, url + ": credentials in the URL are not supported");

  std::string_view host = authority;
  std::optional<std::string_view> port;
  if (authority.starts_with('[')) {  // [IPv6]:port
    size_t close = authority.find(']');
    if (close == std::string_view::npos)
      return make_error(Errc::invalid_argument, url + ": missing ']' after IPv6 address");
    host = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty() && after.front() != ':')
      return make_error(Errc::invalid_argument, url + ": unexpected text after the IPv6 address");
    if (!after.empty()) port = after.substr(1);
  } else if (size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  if (host.empty()) return make_error(Errc::invalid_argument, url + ": no host");
  parsed.host = std::string(host);
  if (port) {
    auto number = parse_port(*port, url);
    if (!number) return number.error();
    parsed.port = *number;
  }
  return parsed;
}

Result<HttpResponse> http_request(const std::string& method, const std::string& url, const std::string& body,
                                  const std::string& content_type, int timeout_ms) {
  auto parsed = parse_http_url(url);
  if (!parsed) return parsed.error();
  auto deadline = SteadyClock::now() + std::chrono::milliseconds(timeout_ms);
  auto connection = connect_to(*parsed, deadline);
  if (!connection) return connection.error();
  auto sent = send_all(connection->get(), build_request(method, *parsed, body, content_type), deadline, *parsed);
  if (!sent) return sent.error();
  auto raw = receive_all(connection->get(), deadline, *parsed);
  if (!raw) return raw.error();
  auto response = parse_response(*raw, method);
  if (!response) return make_error(response.error().code, parsed->authority() + ": " + response.error().message);
  return response;
}

}  // namespace rankscope::collector
