#include "collector/alert/http.h"

#include <curl/curl.h>

#include <cctype>
#include <charconv>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>

namespace rankscope::collector {

namespace {

// Alertmanager answers a POST with an empty body and a listing with a few
// kilobytes per alert; anything far larger is not a response we asked for.
constexpr size_t kMaxResponseBytes = 64u << 20;

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

Result<uint16_t> parse_port(std::string_view text, const std::string& url) {
  uint32_t port = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || port == 0 || port > 65535)
    return make_error(Errc::invalid_argument, url + ": the port must be a number from 1 to 65535");
  return static_cast<uint16_t>(port);
}

// curl_global_init is not thread-safe: once, before the first handle.
void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Sink {
  std::string body;
  bool too_large = false;
};

size_t collect(char* data, size_t size, size_t count, void* user) {
  auto* sink = static_cast<Sink*>(user);
  const size_t bytes = size * count;
  if (sink->body.size() + bytes > kMaxResponseBytes) {
    sink->too_large = true;
    return 0;  // libcurl stops with CURLE_WRITE_ERROR
  }
  sink->body.append(data, bytes);
  return bytes;
}

// What went wrong, in words an operator can act on.
std::string describe(CURLcode code, const char* detail, const HttpUrl& url, int timeout_ms) {
  const std::string where = url.authority();
  std::string text = detail && *detail ? detail : curl_easy_strerror(code);
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
      return "cannot resolve " + url.host + ": " + text;
    case CURLE_COULDNT_CONNECT:
      return "cannot connect to " + where + ": " + text;
    case CURLE_OPERATION_TIMEDOUT:
      return "no complete response from " + where + " within " + std::to_string(timeout_ms) + " ms: " + text;
    case CURLE_PEER_FAILED_VERIFICATION:
      return where + ": the server's certificate cannot be trusted (" + text +
             "): give the CA that signed it (--alertmanager-ca-file, --etcd-ca-file)";
    case CURLE_SSL_CONNECT_ERROR:
      return where + ": the TLS handshake failed (" + text + ")";
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
      return where + ": a certificate file cannot be used (" + text + ")";
    case CURLE_PARTIAL_FILE:
      return where + ": the connection closed before the whole response arrived (" + text + ")";
    default:
      return where + ": " + text;
  }
}

struct CurlDeleter {
  void operator()(CURL* curl) const { curl_easy_cleanup(curl); }
};
struct ListDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};

}  // namespace

std::string HttpUrl::authority() const {
  std::string shown = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return shown + ":" + std::to_string(port);
}

Result<HttpUrl> parse_http_url(const std::string& url) {
  HttpUrl out;
  std::string_view rest = url;
  const std::string scheme = lower(rest.substr(0, rest.find("://") == std::string_view::npos ? 0 : rest.find("://")));
  if (scheme == "http") {
    rest.remove_prefix(7);
  } else if (scheme == "https") {
    out.tls = true;
    out.port = 443;
    rest.remove_prefix(8);
  } else {
    return make_error(Errc::invalid_argument, url + ": expected a URL of the form http[s]://HOST[:PORT][/PATH]");
  }
  size_t path_at = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, path_at);
  if (path_at != std::string_view::npos) {
    out.path = std::string(rest.substr(path_at));
    if (out.path.front() != '/') out.path = "/" + out.path;
  }
  if (authority.find('@') != std::string_view::npos)
    return make_error(Errc::invalid_argument,
                      url + ": credentials in the URL are not supported: give them in files "
                            "(--alertmanager-basic-auth-user with --alertmanager-password-file, or "
                            "--alertmanager-bearer-token-file)");
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos)
      return make_error(Errc::invalid_argument, url + ": missing ']' after IPv6 address");
    out.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty() && after.front() != ':')
      return make_error(Errc::invalid_argument, url + ": unexpected text after the IPv6 address");
    if (!after.empty()) port_text = after.substr(1);
    if (!after.empty() && port_text.empty()) return make_error(Errc::invalid_argument, url + ": empty port");
  } else {
    size_t colon = authority.rfind(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = authority.substr(colon + 1);
      if (port_text.empty()) return make_error(Errc::invalid_argument, url + ": empty port");
    }
  }
  if (out.host.empty()) return make_error(Errc::invalid_argument, url + ": no host");
  if (!port_text.empty()) {
    auto port = parse_port(port_text, url);
    if (!port) return port.error();
    out.port = *port;
  }
  return out;
}

Result<HttpResponse> http_request(const std::string& method, const std::string& url, const std::string& body,
                                  const std::string& content_type, const HttpClientOptions& options) {
  auto parsed = parse_http_url(url);
  if (!parsed) return parsed.error();
  init_curl_once();
  std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
  if (!curl) return make_error(Errc::system, "cannot start an HTTP request (curl_easy_init)");
  CURL* h = curl.get();
  char detail[CURL_ERROR_SIZE] = "";
  Sink sink;
  std::unique_ptr<curl_slist, ListDeleter> headers;
  auto header = [&](const std::string& line) { headers.reset(curl_slist_append(headers.release(), line.c_str())); };
  if (!content_type.empty()) header("Content-Type: " + content_type);
  header("Expect:");  // no 100-continue round trip for a small body
  if (!options.bearer_token.empty()) header("Authorization: Bearer " + options.bearer_token);

  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method.c_str());
  if (!body.empty() || method == "POST" || method == "PUT") {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);  // timeouts without SIGALRM: the collector has threads
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(options.timeout_ms));
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options.timeout_ms));
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, detail);
  curl_easy_setopt(h, CURLOPT_FORBID_REUSE, 1L);
  if (!options.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, options.ca_file.c_str());
  if (!options.cert_file.empty()) curl_easy_setopt(h, CURLOPT_SSLCERT, options.cert_file.c_str());
  if (!options.key_file.empty()) curl_easy_setopt(h, CURLOPT_SSLKEY, options.key_file.c_str());
  if (!options.username.empty()) {
    curl_easy_setopt(h, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
    curl_easy_setopt(h, CURLOPT_USERNAME, options.username.c_str());
    curl_easy_setopt(h, CURLOPT_PASSWORD, options.password.c_str());
  }

  CURLcode code = curl_easy_perform(h);
  if (sink.too_large)
    return make_error(Errc::protocol, parsed->authority() + ": the response is larger than " +
                                          std::to_string(kMaxResponseBytes >> 20) + " MiB");
  if (code != CURLE_OK)
    return make_error(Errc::io,
                      describe(code, detail, *parsed, options.timeout_ms));
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  return HttpResponse{static_cast<int>(status), std::move(sink.body)};
}

Result<HttpResponse> http_request(const std::string& method, const std::string& url, const std::string& body,
                                  const std::string& content_type, int timeout_ms) {
  HttpClientOptions options;
  options.timeout_ms = timeout_ms;
  return http_request(method, url, body, content_type, options);
}

}  // namespace rankscope::collector
