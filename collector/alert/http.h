#pragma once
// The collector's HTTP client (Alertmanager), on libcurl: plain HTTP or
// HTTPS (the system's CAs or a CA file, a client certificate for mutual
// TLS), basic auth or a bearer token, proxies from the usual environment
// (HTTPS_PROXY, NO_PROXY). One blocking request at a time, bounded in time
// and in the size of the response.
#include <cstdint>
#include <string>

#include "common/result.h"

namespace rankscope::collector {

struct HttpUrl {
  bool tls = false;  // https://
  std::string host;  // a name or an address; IPv6 without the brackets
  uint16_t port = 80;
  std::string path = "/";  // with the query string, if any

  // "host:port" as messages write it.
  std::string authority() const;
};

// Accepts http:// and https://HOST[:PORT][/PATH]. Refuses credentials in
// the URL with a message that says what to do instead.
Result<HttpUrl> parse_http_url(const std::string& url);

// How to reach and authenticate to the server. Secrets are read from files
// by the caller (never from the command line).
struct HttpClientOptions {
  int timeout_ms = 5000;       // the whole exchange, connect to last byte
  std::string ca_file;         // verify the server against these CAs ("": the system's)
  std::string cert_file;       // a client certificate (mutual TLS) ...
  std::string key_file;        // ... and its key
  std::string bearer_token;    // Authorization: Bearer (else ...)
  std::string username;        // ... basic auth, with `password`
  std::string password;
};

struct HttpResponse {
  int status = 0;
  std::string body;
};

// Sends one request and reads the whole response. Any status is a response;
// transport, TLS and framing problems are errors that say what failed.
Result<HttpResponse> http_request(const std::string& method, const std::string& url, const std::string& body,
                                  const std::string& content_type, const HttpClientOptions& options);
Result<HttpResponse> http_request(const std::string& method, const std::string& url, const std::string& body = "",
                                  const std::string& content_type = "", int timeout_ms = 5000);

}  // namespace rankscope::collector
