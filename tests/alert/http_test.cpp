// The collector's HTTP client (libcurl) against a canned server on
// loopback: framing (chunked, Content-Length), what it sends (credentials
// included), and how it fails. Over TLS, against a real Alertmanager:
// alertmanager_test.cpp.
#include "collector/alert/http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>

#include "collector/alert/alertmanager.h"
#include "tests/support/harness.h"

namespace rankscope::collector {
namespace {

// Serves one connection on 127.0.0.1: reads the request, answers with
// `response` byte for byte (or never, when it is empty), then closes.
class CannedServer {
 public:
  explicit CannedServer(std::string response) : response_(std::move(response)) {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (bind(listener_, reinterpret_cast<sockaddr*>(&address), length) != 0 || listen(listener_, 1) != 0) abort();
    getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~CannedServer() {
    stop_ = true;
    thread_.join();
    close(listener_);
  }

  std::string url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }
  int port() const { return port_; }
  std::string request() {
    std::lock_guard lock(mutex_);
    return request_;
  }

 private:
  // Waits for `fd` to be readable, giving up when the test is over.
  bool readable(int fd) {
    while (!stop_) {
      pollfd entry{fd, POLLIN, 0};
      if (poll(&entry, 1, 20) > 0) return true;
    }
    return false;
  }

  void serve() {
    if (!readable(listener_)) return;
    int fd = accept(listener_, nullptr, nullptr);
    std::string request;
    char buffer[4096];
    while (!complete(request) && readable(fd)) {
      ssize_t got = recv(fd, buffer, sizeof(buffer), 0);
      if (got <= 0) break;
      request.append(buffer, static_cast<size_t>(got));
    }
    {
      std::lock_guard lock(mutex_);
      request_ = request;
    }
    if (response_.empty()) {
      while (!stop_) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } else {
      send(fd, response_.data(), response_.size(), MSG_NOSIGNAL);
    }
    close(fd);
  }

  // The header and as many body bytes as its Content-Length says.
  static bool complete(const std::string& request) {
    size_t header_end = request.find("\r\n\r\n");
    if (header_end == std::string::npos) return false;
    size_t length_at = request.find("Content-Length: ");
    size_t body_length = length_at < header_end ? std::stoul(request.substr(length_at + 16)) : 0;
    return request.size() >= header_end + 4 + body_length;
  }

  std::string response_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::string request_;
  std::thread thread_;
};

TEST(HttpClient, DecodesAChunkedBody) {
  CannedServer server(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\nhello\r\n7;name=value\r\n, world\r\n0\r\n\r\n");
  auto response = http_request("GET", server.url("/"));
  ASSERT_TRUE(response) << response.error().message;
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, "hello, world");
}

TEST(HttpClient, TakesTheBodyThatContentLengthAnnounces) {
  CannedServer server("HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok");
  auto response = http_request("GET", server.url("/"));
  ASSERT_TRUE(response) << response.error().message;
  EXPECT_EQ(response->status, 201);
  EXPECT_EQ(response->body, "ok");
}

TEST(HttpClient, SendsMethodPathHostTypeLengthAndBody) {
  CannedServer server("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  auto response = http_request("POST", server.url("/api/v2/alerts?x=1"), "[1,2]", "application/json");
  ASSERT_TRUE(response) << response.error().message;
  std::string request = server.request();
  EXPECT_TRUE(request.starts_with("POST /api/v2/alerts?x=1 HTTP/1.1\r\n")) << request;
  EXPECT_NE(request.find("\r\nHost: 127.0.0.1:" + std::to_string(server.port()) + "\r\n"), std::string::npos);
  EXPECT_NE(request.find("\r\nContent-Type: application/json\r\n"), std::string::npos);
  EXPECT_NE(request.find("\r\nContent-Length: 5\r\n"), std::string::npos);
  EXPECT_EQ(request.find("Expect:"), std::string::npos) << request;
  EXPECT_EQ(request.find("Authorization:"), std::string::npos) << request;
  EXPECT_TRUE(request.ends_with("\r\n\r\n[1,2]")) << request;
}

TEST(HttpClient, SendsABearerTokenOrBasicAuth) {
  CannedServer bearer("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  HttpClientOptions token;
  token.bearer_token = "t0ken.value";
  ASSERT_TRUE(http_request("GET", bearer.url("/"), "", "", token));
  EXPECT_NE(bearer.request().find("\r\nAuthorization: Bearer t0ken.value\r\n"), std::string::npos)
      << bearer.request();

  CannedServer basic("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  HttpClientOptions user;
  user.username = "am";
  user.password = "pw";
  ASSERT_TRUE(http_request("GET", basic.url("/"), "", "", user));
  // base64("am:pw")
  EXPECT_NE(basic.request().find("\r\nAuthorization: Basic YW06cHc=\r\n"), std::string::npos) << basic.request();
}

TEST(HttpClient, ReportsABodyCutShort) {
  CannedServer server("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc");
  auto response = http_request("GET", server.url("/"));
  ASSERT_FALSE(response);
  EXPECT_NE(response.error().message.find("the connection closed before the whole response arrived"),
            std::string::npos)
      << response.error().message;
}

TEST(HttpClient, GivesUpOnAServerThatNeverAnswers) {
  CannedServer server("");
  auto response = http_request("GET", server.url("/"), "", "", 200);
  ASSERT_FALSE(response);
  EXPECT_TRUE(response.error().message.starts_with("no complete response from 127.0.0.1:" +
                                                   std::to_string(server.port()) + " within 200 ms"))
      << response.error().message;
}

TEST(HttpClient, ReportsARefusedConnection) {
  int port = rankscope::testing::free_port();
  auto response = http_request("GET", "http://127.0.0.1:" + std::to_string(port) + "/");
  ASSERT_FALSE(response);
  EXPECT_TRUE(response.error().message.starts_with("cannot connect to 127.0.0.1:" + std::to_string(port) + ": "))
      << response.error().message;
}

TEST(HttpUrl, SplitsHostPortAndPath) {
  auto url = parse_http_url("http://alertmanager.example:9093/am/api?x=1");
  ASSERT_TRUE(url) << url.error().message;
  EXPECT_EQ(url->host, "alertmanager.example");
  EXPECT_EQ(url->port, 9093);
  EXPECT_EQ(url->path, "/am/api?x=1");

  auto plain = parse_http_url("HTTP://10.0.0.7");
  ASSERT_TRUE(plain) << plain.error().message;
  EXPECT_EQ(plain->authority(), "10.0.0.7:80");
  EXPECT_EQ(plain->path, "/");

  auto ipv6 = parse_http_url("http://[::1]:9093");
  ASSERT_TRUE(ipv6) << ipv6.error().message;
  EXPECT_EQ(ipv6->host, "::1");
  EXPECT_EQ(ipv6->authority(), "[::1]:9093");
}

TEST(HttpUrl, RefusesWhatItCannotSpeak) {
  for (const char* bad : {"ftp://host/", "http://:9093/", "http://host:99999/", "http://host:/", "am:9093"}) {
    auto url = parse_http_url(bad);
    EXPECT_FALSE(url) << bad;
  }
  auto credentials = parse_http_url("http://user:secret@host:9093/");
  ASSERT_FALSE(credentials);
  EXPECT_NE(credentials.error().message.find("credentials in the URL are not supported"), std::string::npos);
  EXPECT_NE(credentials.error().message.find("--alertmanager-password-file"), std::string::npos);
}

TEST(HttpUrl, TakesHttpsOnPort443ByDefault) {
  auto url = parse_http_url("https://alertmanager:9093/am");
  ASSERT_TRUE(url) << url.error().message;
  EXPECT_TRUE(url->tls);
  EXPECT_EQ(url->port, 9093);
  auto plain = parse_http_url("HTTPS://am.example");
  ASSERT_TRUE(plain) << plain.error().message;
  EXPECT_TRUE(plain->tls);
  EXPECT_EQ(plain->authority(), "am.example:443");
  EXPECT_TRUE(AlertmanagerClient::create("https://alertmanager:9093"));
}

}  // namespace
}  // namespace rankscope::collector
