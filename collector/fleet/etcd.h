#pragma once
// A client of etcd's v3 API through its JSON gateway (POST /v3/...), on the
// collector's libcurl HTTP client: leases, puts under a lease, reads by
// prefix. It takes several endpoints (the members of an etcd cluster): a
// request goes to the one that answered last, and on a transport error to
// the next, so one dead etcd member is not an outage. Blocking, each try
// bounded by the HTTP timeout.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "collector/alert/http.h"
#include "common/result.h"

namespace rankscope::fleet {

struct EtcdKeyValue {
  std::string key, value;
  int64_t lease = 0;
  int64_t mod_revision = 0;
};

class EtcdClient {
 public:
  // `endpoints`: "http://HOST:PORT[,https://HOST:PORT...]", checked here.
  static Result<EtcdClient> make(const std::string& endpoints, collector::HttpClientOptions http = {});

  Result<int64_t> grant_lease(int64_t ttl_s);
  // The lease's remaining time to live, in seconds, after this renewal; 0
  // when etcd no longer has it (it expired, or was revoked).
  Result<int64_t> keep_alive(int64_t lease);
  Result<void> revoke(int64_t lease);
  Result<void> put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Puts only where `key` does not exist (one transaction); false when it does.
  Result<bool> create(const std::string& key, const std::string& value, int64_t lease);
  // Every key that starts with `prefix`, in key order.
  Result<std::vector<EtcdKeyValue>> range_prefix(const std::string& prefix);

  const std::vector<std::string>& endpoints() const { return endpoints_; }

 private:
  EtcdClient(std::vector<std::string> endpoints, collector::HttpClientOptions http)
      : endpoints_(std::move(endpoints)), http_(std::move(http)) {}
  // POSTs `body` to `path` on the endpoints in turn; the reply's JSON, or
  // etcd's own error, or what every endpoint failed with.
  Result<nlohmann::json> call(const std::string& path, const nlohmann::json& body);

  std::vector<std::string> endpoints_;
  collector::HttpClientOptions http_;
  size_t current_ = 0;  // the endpoint that answered last
};

// etcd's JSON carries bytes as base64 and 64-bit integers as strings.
std::string base64(std::string_view bytes);
Result<std::string> from_base64(std::string_view text);

}  // namespace rankscope::fleet
