#include "collector/fleet/etcd.h"

#include <sodium.h>

#include <charconv>

namespace rankscope::fleet {

namespace {

int64_t int_field(const nlohmann::json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end()) return 0;  // the gateway leaves out zero values
  if (it->is_number_integer()) return it->get<int64_t>();
  if (!it->is_string()) return 0;
  const std::string& text = it->get_ref<const std::string&>();
  int64_t value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value);
  return value;
}

// The first key after every key that starts with `prefix` (etcd's range_end).
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last < 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // the prefix was all 0xff (or empty): to the end of the keys
}

}  // namespace

std::string base64(std::string_view bytes) {
  std::string out(sodium_base64_encoded_len(bytes.size(), sodium_base64_VARIANT_ORIGINAL), '\0');
  sodium_bin2base64(out.data(), out.size(), reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
                    sodium_base64_VARIANT_ORIGINAL);
  out.resize(out.size() - 1);  // the terminating NUL
  return out;
}

Result<std::string> from_base64(std::string_view text) {
  std::string out(text.size() / 4 * 3 + 3, '\0');
  size_t length = 0;
  if (sodium_base642bin(reinterpret_cast<unsigned char*>(out.data()), out.size(), text.data(), text.size(), nullptr,
                        &length, nullptr, sodium_base64_VARIANT_ORIGINAL) != 0)
    return make_error(Errc::protocol, "etcd sent bytes that are not base64");
  out.resize(length);
  return out;
}

Result<EtcdClient> EtcdClient::make(const std::string& endpoints, collector::HttpClientOptions http) {
  std::vector<std::string> list;
  size_t start = 0;
  while (start <= endpoints.size()) {
    size_t end = endpoints.find(',', start);
    if (end == std::string::npos) end = endpoints.size();
    std::string url = endpoints.substr(start, end - start);
    start = end + 1;
    if (url.empty()) continue;
    auto parsed = collector::parse_http_url(url);
    if (!parsed) return make_error(Errc::invalid_argument, "etcd endpoint '" + url + "': " + parsed.error().message);
    if (parsed->path != "/")
      return make_error(Errc::invalid_argument,
                        "etcd endpoint '" + url + "': give only the scheme, host and port (e.g. http://10.0.0.5:2379)");
    list.push_back((parsed->tls ? "https://" : "http://") + parsed->authority());
  }
  if (list.empty())
    return make_error(Errc::invalid_argument,
                      "no etcd endpoint given (e.g. http://10.0.0.5:2379,http://10.0.0.6:2379)");
  if (sodium_init() < 0) return make_error(Errc::system, "libsodium could not be initialised");
  return EtcdClient(std::move(list), std::move(http));
}

Result<nlohmann::json> EtcdClient::call(const std::string& path, const nlohmann::json& body) {
  std::string failures;
  for (size_t tried = 0; tried < endpoints_.size(); ++tried) {
    const std::string& endpoint = endpoints_[current_];
    auto response = collector::http_request("POST", endpoint + path, body.dump(), "application/json", http_);
    if (!response) {
      failures += (failures.empty() ? "" : "; ") + endpoint + ": " + response.error().message;
      current_ = (current_ + 1) % endpoints_.size();
      continue;
    }
    auto reply = nlohmann::json::parse(response->body, nullptr, false);
    std::string failure;
    if (reply.is_discarded() || !reply.is_object()) {
      failure = "answered " + path + " with HTTP " + std::to_string(response->status) +
                " and no JSON object (is it etcd's client port, v3.4 or later?)";
    } else if (response->status != 200 || reply.contains("error")) {
      std::string message = "no message";
      for (const char* name : {"error", "message"})
        if (auto it = reply.find(name); it != reply.end() && it->is_string()) message = it->get<std::string>();
      failure = "refused " + path + " (HTTP " + std::to_string(response->status) + "): " + message;
      // What etcd itself refuses (a lease it does not have) fails alike on
      // every member; what this member cannot serve now (no leader, cut
      // off from the others: 5xx, gRPC Unavailable or DeadlineExceeded)
      // may succeed on the next.
      auto code = reply.find("code");
      const int grpc = code != reply.end() && code->is_number_integer() ? code->get<int>() : 0;
      if (response->status < 500 && grpc != 14 && grpc != 4)
        return make_error(Errc::refused, "etcd at " + endpoint + " " + failure);
    } else {
      return reply;
    }
    failures += (failures.empty() ? "" : "; ") + endpoint + ": " + failure;
    current_ = (current_ + 1) % endpoints_.size();
  }
  return make_error(Errc::io, "no etcd endpoint answered (" + failures + ")");
}

Result<int64_t> EtcdClient::grant_lease(int64_t ttl_s) {
  auto reply = call("/v3/lease/grant", {{"TTL", ttl_s}});
  if (!reply) return reply.error();
  int64_t id = int_field(*reply, "ID");
  if (id == 0) return make_error(Errc::protocol, "etcd granted a lease without an ID");
  return id;
}

Result<int64_t> EtcdClient::keep_alive(int64_t lease) {
  auto reply = call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}});
  if (!reply) return reply.error();
  // A stream in gRPC; through the gateway one message under "result". TTL
  // left out (zero): the lease is gone.
  auto result = reply->find("result");
  return result == reply->end() ? int64_t{0} : int_field(*result, "TTL");
}

Result<void> EtcdClient::revoke(int64_t lease) {
  // The gateway of etcd 3.4 serves revocation here, not at /v3/lease/revoke.
  auto reply = call("/v3/kv/lease/revoke", {{"ID", std::to_string(lease)}});
  if (!reply) return reply.error();
  return {};
}

Result<void> EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  nlohmann::json body = {{"key", base64(key)}, {"value", base64(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  auto reply = call("/v3/kv/put", body);
  if (!reply) return reply.error();
  return {};
}

Result<bool> EtcdClient::create(const std::string& key, const std::string& value, int64_t lease) {
  nlohmann::json put = {{"key", base64(key)}, {"value", base64(value)}, {"lease", std::to_string(lease)}};
  auto reply =
      call("/v3/kv/txn",
           {{"compare", {{{"key", base64(key)}, {"result", "EQUAL"}, {"target", "CREATE"}, {"create_revision", "0"}}}},
            {"success", {{{"request_put", put}}}}});
  if (!reply) return reply.error();
  auto succeeded = reply->find("succeeded");  // left out when false
  return succeeded != reply->end() && succeeded->is_boolean() && succeeded->get<bool>();
}

Result<std::vector<EtcdKeyValue>> EtcdClient::range_prefix(const std::string& prefix) {
  auto reply = call("/v3/kv/range", {{"key", base64(prefix)}, {"range_end", base64(prefix_end(prefix))}});
  if (!reply) return reply.error();
  std::vector<EtcdKeyValue> out;
  auto kvs = reply->find("kvs");
  if (kvs == reply->end()) return out;  // none
  if (!kvs->is_array()) return make_error(Errc::protocol, "etcd's range reply has no list of keys");
  for (const auto& kv : *kvs) {
    auto text = [&](const char* name) {
      auto it = kv.is_object() ? kv.find(name) : kv.end();
      return it != kv.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    if (!kv.is_object()) return make_error(Errc::protocol, "etcd's range reply holds something that is not a key");
    auto key = from_base64(text("key"));
    auto value = from_base64(text("value"));
    if (!key || !value) return make_error(Errc::protocol, "etcd's range reply: " + (key ? value : key).error().message);
    out.push_back({std::move(*key), std::move(*value), int_field(kv, "lease"), int_field(kv, "mod_revision")});
  }
  return out;
}

}  // namespace rankscope::fleet
