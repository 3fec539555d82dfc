#pragma once
// The CLI's view of a fleet of collectors (docs/operations.md "A fleet of
// collectors"): which collectors to ask, asked all at once, and what each
// answered or why it did not.
#include <capnp/message.h>

#include <memory>
#include <string>
#include <vector>

#include "collector/alert/http.h"
#include "common/curve.h"
#include "common/result.h"
#include "proto/query.capnp.h"

namespace rankscope::cli {

struct FleetTarget {
  std::string id;        // "" for a collector that is alone
  std::string endpoint;  // its query endpoint
  curve::ClientKeys keys;
};

// Who to ask. With `etcd` (endpoints; `etcd_tls`: its CA and a client
// certificate): every collector registered under `prefix`, read from etcd. Else the collector at `endpoint`, asked for
// its fleet: every member it knows, or itself alone. Each member is asked with this client's key pair and the member's
// own public key, as its record gives it (the first collector, or etcd, vouches for it).
Result<std::vector<FleetTarget>> fleet_targets(const std::string& endpoint, const curve::ClientKeys& keys,
                                               const std::string& etcd, collector::HttpClientOptions etcd_tls,
                                               const std::string& prefix, int timeout_ms);

// An older collector's answer to a request it does not know (a fleet
// request): it is alone.
bool unknown_request(const std::string& error);

struct FleetAnswer {
  FleetTarget target;
  std::unique_ptr<capnp::MallocMessageBuilder> reply;  // null when it did not answer
  std::string error;                                   // why not
  proto::query::Reply::Reader get() const { return reply->getRoot<proto::query::Reply>().asReader(); }
};

// Sends `request` to every target at once; the answers in the targets' order.
std::vector<FleetAnswer> ask_all(const std::vector<FleetTarget>& targets, capnp::MallocMessageBuilder& request,
                                 int timeout_ms);

}  // namespace rankscope::cli
