#include "tools/cli/fleet.h"

#include <thread>

#include "collector/fleet/etcd.h"
#include "collector/fleet/membership.h"
#include "tools/cli/client.h"

namespace rankscope::cli {

namespace {

FleetTarget target_of(const std::string& id, const std::string& endpoint, const std::string& public_key,
                      const curve::ClientKeys& keys) {
  FleetTarget out{id, endpoint, keys};
  // This client without a key (--insecure), or a collector run with
  // --insecure (it publishes no key): asked in plaintext, as it must be.
  out.keys.server_key = keys.public_key.empty() ? "" : public_key;
  return out;
}

}  // namespace

bool unknown_request(const std::string& error) {
  return error.find("does not know that request") != std::string::npos;
}

Result<std::vector<FleetTarget>> fleet_targets(const std::string& endpoint, const curve::ClientKeys& keys,
                                               const std::string& etcd, collector::HttpClientOptions etcd_tls,
                                               const std::string& prefix, int timeout_ms) {
  std::vector<FleetTarget> out;
  if (!etcd.empty()) {
    etcd_tls.timeout_ms = timeout_ms;
    auto client = fleet::EtcdClient::make(etcd, etcd_tls);
    if (!client) return client.error();
    auto records = fleet::read_members(*client, prefix);
    if (!records) return records.error();
    for (const auto& [member, lease] : *records)
      out.push_back(target_of(member.id, member.queries, member.public_key, keys));
    if (out.empty())
      return make_error(Errc::not_found, "no collector is registered in etcd under " + prefix +
                                             " (is --etcd-prefix the collectors' own?)");
    return out;
  }
  capnp::MallocMessageBuilder request;
  auto req = request.initRoot<proto::query::Request>();
  req.setProtocolVersion(proto::query::QUERY_PROTOCOL_VERSION);
  req.setFleet();
  QueryClient client(endpoint, timeout_ms, keys);
  auto asked = client.ask(request, [&](proto::query::Reply::Reader reply) {
    if (reply.which() != proto::query::Reply::FLEET) return;
    for (auto m : reply.getFleet().getMembers())
      out.push_back(target_of(m.getId(), m.getQueries(), m.getPublicKey(), keys));
  });
  if (!asked) {
    // A collector older than fleets does not know the request: it is alone.
    if (!unknown_request(asked.error().message)) return asked.error();
    out.clear();
  }
  if (out.empty()) out.push_back({"", endpoint, keys});
  return out;
}

std::vector<FleetAnswer> ask_all(const std::vector<FleetTarget>& targets, capnp::MallocMessageBuilder& request,
                                 int timeout_ms) {
  std::vector<FleetAnswer> answers(targets.size());
  std::vector<std::unique_ptr<capnp::MallocMessageBuilder>> copies;
  for (size_t i = 0; i < targets.size(); ++i) {  // one copy per thread: a builder is not shared
    copies.push_back(std::make_unique<capnp::MallocMessageBuilder>());
    copies.back()->setRoot(request.getRoot<proto::query::Request>().asReader());
  }
  std::vector<std::thread> threads;
  for (size_t i = 0; i < targets.size(); ++i) {
    threads.emplace_back([&, i] {
      FleetAnswer& answer = answers[i];
      answer.target = targets[i];
      QueryClient client(targets[i].endpoint, timeout_ms, targets[i].keys);
      auto asked = client.ask(*copies[i], [&](proto::query::Reply::Reader reply) {
        answer.reply = std::make_unique<capnp::MallocMessageBuilder>();
        answer.reply->setRoot(reply);
      });
      if (!asked) {
        answer.reply.reset();
        answer.error = asked.error().message;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return answers;
}

}  // namespace rankscope::cli
