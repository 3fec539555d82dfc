#pragma once
// A minimal blocking HTTP/1.1 client for plain-HTTP services on the
// collector's own network (Alertmanager). One request per connection
// (`Connection: close`), responses framed by Content-Length, chunked
// encoding or the end of the connection. No TLS, redirects, proxies or
// keep-alive: the collector posts a few small requests a minute to an
// address the operator configured.
#include <cstdint>
#include <string>

#include "common/result.h"

namespace rankscope::collector {

struct HttpUrl {
  std::string host;  // a name or an address; IPv6 without the brackets
  uint16_t port = 80;
  std::string path = "/";  // with the query string, if any

  // "host:port" as the Host header and messages write it.
  std::string authority() const;
};

// Accepts http://HOST[:PORT][/PATH]. Refuses https:// (no TLS here) and
// credentials in the URL, each with a message that says what to do instead.
Result<HttpUrl> parse_http_url(const std::string& url);

struct HttpResponse {
  int status = 0;
  std::string body;  // decoded from chunked encoding when it was chunked
};

// Sends one request and reads the whole response. `timeout_ms` bounds the
// exchange from connect to the last byte; the name lookup before it
// (getaddrinfo) has no timeout of its own, so prefer addresses where that
// matters. Any status is a response; only transport and framing problems
// are errors.
Result<HttpResponse> http_request(const std::string& method, const std::string& url, const std::string& body = "",
                                  const std::string& content_type = "", int timeout_ms = 5000);

}  // namespace rankscope::collector
