#include "collector/collector.h"

#include <unistd.h>

#include <cerrno>
#include <deque>
#include <iterator>
#include <zmq.hpp>

#include "collector/auth.h"
#include "collector/clock_responder.h"
#include "collector/fleet/membership.h"
#include "collector/ingest/rate_limit.h"
#include "collector/outputs.h"
#include "collector/query.h"
#include "collector/retention.h"
#include "collector/service.h"
#include "collector/store/timeline_store.h"
#include "common/clock.h"
#include "common/curve.h"
#include "common/log.h"
#include "common/version.h"
#include "proto/limits.h"

namespace rankscope::collector {

namespace {
// How many agent messages are taken in before one durable write: the group
// commit that lets many agents share one fsync.
constexpr int kMaxMessagesPerCommit = 512;
constexpr int kAgentReceiveHighWaterMark = 128;  // messages per agent connection
constexpr int kQueryReceiveHighWaterMark = 16;   // requests per query connection
// The largest frame either socket reads (ZMQ_MAXMSGSIZE): libzmq checks a
// frame's length before it allocates it, on every frame, CurveZMQ handshake
// included, so a peer that is not on the allow-list cannot make the
// collector buffer more than this. An agent's batch holds 100 ms of calls:
// kilobytes, a few megabytes in a storm of calls; a query request is a few
// hundred bytes. The agent keeps its batches under it (proto/limits.h).
constexpr int64_t kMaxAgentMessageBytes = static_cast<int64_t>(proto::kMaxAgentMessageBytes);
constexpr int64_t kMaxQueryMessageBytes = 64ll << 10;
// How often the hang, straggler and node-lost detectors look at the picture.
constexpr uint64_t kEvaluationIntervalNs = 500'000'000ull;

std::string frame(const zmq::message_t& message) {
  return std::string(static_cast<const char*>(message.data()), message.size());
}

void send_to(zmq::socket_t& socket, const std::string& routing_id, const std::string& bytes, bool delimiter) {
  try {
    socket.send(zmq::buffer(routing_id), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    if (delimiter) socket.send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    socket.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
  } catch (const zmq::error_t& e) {
    RS_LOG(warn, "reply not sent: %s", e.what());
  }
}

struct Received {
  std::string routing_id, payload;
  std::string user_id;  // what the ZAP handler bound to the connection's key; "" without CurveZMQ
};

// Reads one multipart message from a ROUTER: routing id, [empty], payload.
std::optional<Received> receive(zmq::socket_t& socket) {
  std::vector<zmq::message_t> parts;
  for (;;) {
    zmq::message_t part;
    auto got = socket.recv(part, parts.empty() ? zmq::recv_flags::dontwait : zmq::recv_flags::none);
    if (!got) return std::nullopt;
    bool more = part.more();
    parts.push_back(std::move(part));
    if (!more) break;
  }
  if (parts.size() < 2) return std::nullopt;
  Received received{frame(parts.front()), frame(parts.back()), {}};
  try {
    // zmq_msg_gets: the connection's metadata, on every frame it delivers.
    if (const char* user = parts.back().gets("User-Id")) received.user_id = user;
  } catch (const zmq::error_t&) {
    // No User-Id: a plaintext connection (--insecure).
  }
  return received;
}

// Whose rate budget a message spends: its CurveZMQ key's (what the ZAP
// handler bound it to), else (--insecure) its connection's.
std::string limit_key(const Received& message) {
  return message.user_id.empty() ? "connection " + message.routing_id : "key " + message.user_id;
}

Result<void> bind(zmq::socket_t& socket, const std::string& endpoint, const char* what) {
  try {
    socket.bind(endpoint);
  } catch (const zmq::error_t& e) {
    return make_error(Errc::io, std::string("cannot listen for ") + what + " on " + endpoint + ": " + e.what());
  }
  return {};
}
// The agents' and the queries' sockets: bounded, then CurveZMQ with the
// ZAP handler (unless --insecure), then bound. nullopt after logging why not.
struct Sockets {
  zmq::socket_t agents, queries;
  std::unique_ptr<ZapHandler> zap;  // none with --insecure
  std::string public_key;           // the collector's (Z85; "" with --insecure)
  std::optional<curve::KeyFile> key;  // the collector's pair (none with --insecure)
};
std::optional<Sockets> open_sockets(zmq::context_t& context, const Options& options) {
  Sockets out{zmq::socket_t(context, zmq::socket_type::router),
              zmq::socket_t(context, zmq::socket_type::router),
              {},
              {},
              std::nullopt};
  for (auto* socket : {&out.agents, &out.queries}) {
    socket->set(zmq::sockopt::linger, 0);
    socket->set(zmq::sockopt::router_mandatory, 0);
  }
  // Back-pressure, and a bound on memory: at most this many messages wait
  // per agent connection. Past it ZeroMQ stops reading that connection, the
  // agent's sends fail without blocking, and its batches wait in its own
  // bounded queue (re-sent in order). A thousand agents then hold at most
  // ~128k messages here, not whatever a fleet can push.
  out.agents.set(zmq::sockopt::rcvhwm, kAgentReceiveHighWaterMark);
  out.queries.set(zmq::sockopt::rcvhwm, kQueryReceiveHighWaterMark);
  out.agents.set(zmq::sockopt::maxmsgsize, kMaxAgentMessageBytes);
  out.queries.set(zmq::sockopt::maxmsgsize, kMaxQueryMessageBytes);
  // Started before the sockets bind, so no handshake ever finds it missing.
  if (options.insecure) {
    RS_LOG(warn,
           "*** --insecure: plaintext and NO authentication on %s, %s and the clock probes' port: anyone who "
           "reaches these ports can send data as any node and read every timeline. Use it only on a trusted test "
           "network. ***",
           options.listen.c_str(), options.query.c_str());
  } else {
    auto key = curve::available() ? curve::read(options.key)
                                  : Result<curve::KeyFile>(make_error(Errc::unsupported_version,
                                        "this libzmq has no CurveZMQ (zmq_has(\"curve\") is false)"));
    if (key && key->secret_key.empty())
      key = make_error(Errc::invalid_argument, options.key + " holds no secret-key: --key takes the .key file, not the .pub");
    if (!key) {
      RS_LOG(error, "--key: %s (make one with `rankscope keygen --role collector --out %s`, or run with --insecure on a "
                    "trusted test network)", key.error().message.c_str(), "/etc/rankscope/collector");
      return std::nullopt;
    }
    auto started = ZapHandler::start(context, options.allow);
    if (!started) {
      RS_LOG(error, "--allow: %s", started.error().message.c_str());
      return std::nullopt;
    }
    out.zap = std::move(*started);
    out.public_key = key->public_key;
    out.key = *key;
    curve::apply_server(out.agents, *key, kAgentDomain);
    curve::apply_server(out.queries, *key, kQueryDomain);
    RS_LOG(info, "CurveZMQ on both sockets, collector public key %s; admitting the keys in %s", key->public_key.c_str(),
           options.allow.c_str());
  }
  for (auto r : {bind(out.agents, options.listen, "agents"), bind(out.queries, options.query, "queries")}) {
    if (!r) {
      RS_LOG(error, "%s", r.error().message.c_str());
      return std::nullopt;
    }
  }
  RS_LOG(info, "listening for agents on %s, queries on %s; database %s", options.listen.c_str(),
         options.query.c_str(), options.db.c_str());
  return out;
}

// How other machines reach what this collector bound to `endpoint`
// (tcp://HOST:PORT or HOST:PORT): --advertise, else the address it bound,
// unless that is a wildcard, else this machine's name. `bound_wins`: an
// address bound (not a wildcard) is kept even with --advertise.
std::string reachable(const std::string& endpoint, const std::string& advertise, bool bound_wins = false) {
  const bool zmq = endpoint.rfind("tcp://", 0) == 0;
  std::string authority = zmq ? endpoint.substr(6) : endpoint;
  size_t colon = authority.rfind(':');
  std::string host = authority.substr(0, colon), port = colon == std::string::npos ? "" : authority.substr(colon);
  const bool wildcard = host.empty() || host == "*" || host == "0.0.0.0" || host == "[::]" || host == "::";
  if (!advertise.empty() && (wildcard || !bound_wins)) {
    host = advertise;
  } else if (wildcard) {
    char name[256] = {};
    host = gethostname(name, sizeof name - 1) == 0 && name[0] ? name : "localhost";
  }
  return (zmq ? "tcp://" : "") + host + port;
}

// This collector's id in the fleet: --collector-id, else the HOST:PORT agents
// reach it at; "" without --etcd (alone).
std::string fleet_id(const Options& options) {
  if (options.etcd.empty()) return "";
  return options.collector_id.empty() ? reachable(options.listen, options.advertise).substr(6) : options.collector_id;
}

// Joins the fleet in etcd (--etcd); null when this collector is alone.
Result<std::unique_ptr<fleet::Membership>> join_fleet(const Options& options, const std::string& public_key,
                                                      uint64_t now_ns) {
  if (options.etcd.empty()) return std::unique_ptr<fleet::Membership>();
  fleet::FleetOptions fleet;
  fleet.etcd = options.etcd;
  fleet.prefix = options.etcd_prefix;
  fleet.lease_ttl_s = options.lease_ttl_s;
  fleet.http.ca_file = options.etcd_ca_file;
  fleet.http.cert_file = options.etcd_cert_file;
  fleet.http.key_file = options.etcd_key_file;
  fleet::Member& self = fleet.self;
  self.agents = reachable(options.listen, options.advertise);
  self.queries = reachable(options.query, options.advertise);
  // /metrics may be bound apart from the sockets (e.g. to a monitoring network): as bound.
  self.metrics = options.metrics.empty() ? "" : reachable(options.metrics, options.advertise, true);
  self.id = fleet_id(options);
  self.public_key = public_key;
  self.version = kVersion;
  self.started_ns = now_ns;
  RS_LOG(info, "joining the fleet in etcd %s%s as collector %s (agents %s, queries %s)", options.etcd.c_str(),
         options.etcd_prefix.c_str(), self.id.c_str(), self.agents.c_str(), self.queries.c_str());
  return fleet::Membership::start(std::move(fleet));
}

ServiceOptions service_options(const Options& options) {
  ServiceOptions out;
  out.detect.hang_timeout_ns = options.hang_timeout_ns();
  out.detect.node_lost_timeout_ns = options.node_lost_timeout_ns();
  out.usage.hang_timeout_ns = options.hang_timeout_ns();
  out.retire_after_ns = options.retire_after_ns();
  return out;
}

// Every kEvaluationIntervalNs: retire, refine the clocks, judge, bill, and
// tell the outputs.
void evaluate(Service& service, Outputs& outputs, const Sockets& sockets, uint64_t now, uint64_t liveness_ns,
              uint64_t query_throttled, const fleet::Membership* fleet, const LoopTime& loop,
              const ClockResponder* clock_responder) {
  service.evaluate(now);
  Evaluated evaluated{now,
                      liveness_ns,
                      service.ingest(),
                      service.findings(),
                      service.detector(),
                      service.ledger(),
                      service.commit(),
                      service.detail(),
                      sockets.zap ? sockets.zap->admitted() : 0,
                      sockets.zap ? sockets.zap->refused() : 0,
                      query_throttled,
                      std::nullopt,
                      loop};
  if (fleet) {
    fleet::FleetView view = fleet->view();
    evaluated.fleet = Evaluated::Fleet{view.members.size(), view.etcd_ok, view.registrations};
  }
  if (clock_responder) {
    evaluated.clock_probes_apart = clock_responder->answered();
    evaluated.clock_probes_apart_dropped = clock_responder->dropped();
    evaluated.keys_admitted += clock_responder->keys_admitted();
    evaluated.keys_refused += clock_responder->keys_refused();
  }
  for (auto& output : outputs) output->publish(evaluated);
}

// Agent messages read off the socket ahead of the one being applied. A
// clock probe among them is answered as it is read: behind a queue of
// other agents' batches its `t2` would be stamped late, which reads as a
// long way in (the node's offset off by half the wait). Bounded in
// messages and bytes; past either, ZeroMQ's own queue (its high-water mark
// per connection) holds the rest.
struct ReadAhead {
  std::deque<Received> messages;
  size_t bytes = 0;
};
constexpr size_t kMaxReadAheadMessages = kMaxMessagesPerCommit;
constexpr size_t kMaxReadAheadBytes = 64ull << 20;
// Messages of any kind read in one round (probes answered, messages over
// their budget dropped, and the rest): a peer that sends without end still
// lets the round end, and the evaluation and the commit run.
constexpr int kMaxReadsPerRound = 2 * kMaxMessagesPerCommit;

// Sends each (routing id, bytes) to the agents, and empties the list.
void send_all(zmq::socket_t& agents, std::vector<std::pair<std::string, std::string>>& replies) {
  for (const auto& [id, bytes] : replies) send_to(agents, id, bytes, false);
  replies.clear();
}

// Reads what the agents' socket holds, within the read-ahead's bounds and
// the round's `reads`, each message within its key's budget; answers clock
// probes at once.
void read_ahead(Sockets& sockets, Ingest& ingest, RateLimiter& limit, const Options& options, const Clock& clock,
                ReadAhead& ahead, int& reads) {
  while (ahead.messages.size() < kMaxReadAheadMessages && ahead.bytes < kMaxReadAheadBytes &&
         reads < kMaxReadsPerRound) {
    auto message = receive(sockets.agents);
    if (!message) {
      ingest.note_drained(clock.realtime_ns());
      break;
    }
    ++reads;
    if (!options.insecure && message->user_id.empty()) continue;  // never: the ZAP handler names every key
    // Budgets are per key (the node the ZAP handler bound it to), not per
    // connection: a key that opens many connections shares one budget.
    if (!limit.admit(limit_key(*message), message->payload.size(), clock.monotonic_ns())) {
      ingest.on_throttled(message->routing_id, message->user_id,
                          std::to_string(message->payload.size()) + " bytes over --max-messages-per-s " +
                              std::to_string(options.max_messages_per_s) + " or --max-bytes-per-s " +
                              std::to_string(options.max_bytes_per_s));
      continue;
    }
    Outbox outbox;
    if (ingest.answer_clock_probe(message->routing_id, message->payload, outbox, message->user_id)) {
      send_all(sockets.agents, outbox.now);
      continue;
    }
    ahead.bytes += message->payload.size();
    ahead.messages.push_back(std::move(*message));
  }
}

// Applies up to kMaxMessagesPerCommit agent messages in the order they
// came, reading ahead before each; replies that need no commit go at once.
void take_agent_messages(Sockets& sockets, Ingest& ingest, RateLimiter& limit, const Options& options,
                         const Clock& clock, ReadAhead& ahead, Outbox& outbox) {
  int reads = 0;
  for (int i = 0; i < kMaxMessagesPerCommit; ++i) {
    read_ahead(sockets, ingest, limit, options, clock, ahead, reads);
    if (ahead.messages.empty()) break;
    Received message = std::move(ahead.messages.front());
    ahead.messages.pop_front();
    ahead.bytes -= message.payload.size();
    ingest.on_agent_message(message.routing_id, message.payload, outbox, message.user_id);
    send_all(sockets.agents, outbox.now);
  }
}

// The members as last read from etcd, to the agents that follow the fleet
// (in their HelloReply, and a FleetMap to each when they changed).
void tell_agents_the_fleet(const fleet::Membership& fleet, Ingest& ingest, Sockets& sockets) {
  const fleet::FleetView view = fleet.view();
  std::vector<FleetEntry> members;
  for (const auto& m : view.members) members.push_back(FleetEntry{m.id, m.agents, m.public_key});
  Outbox outbox;
  ingest.set_fleet(view.self, members, outbox);
  send_all(sockets.agents, outbox.now);
}

}  // namespace

int run(const Options& options, const std::atomic<bool>& stop) {
  auto store = TimelineStore::open(options.db, StoreOptions{options.max_disk(), uint64_t{options.db_memory_mb} << 20});
  if (!store) {
    RS_LOG(error, "%s", store.error().message.c_str());
    return 2;
  }
  SystemClock clock;
  Service service(**store, clock, service_options(options));
  service.ingest().set_reads_compact(!options.plain_batches);
  if (auto started = service.restore(); !started) {
    RS_LOG(error, "%s", started.error().message.c_str());
    return 2;
  }
  auto outputs = start_outputs(options, fleet_id(options));
  if (!outputs) return 2;
  zmq::context_t context(1);
  auto sockets = open_sockets(context, options);
  if (!sockets) return 2;

  // Clock probes apart from the batches. Its port was chosen here ("auto"):
  // one that cannot be had leaves probes on the agents' socket; one the
  // operator named must be had.
  std::unique_ptr<ClockResponder> clock_responder;
  if (const std::string at = clock_endpoint(options.clock_listen, options.listen); !at.empty()) {
    auto started = ClockResponder::start(at, sockets->key ? &*sockets->key : nullptr, options.allow, clock);
    if (started) {
      clock_responder = std::move(*started);
      service.ingest().set_clock_port(clock_responder->port());
      RS_LOG(info, "answering clock probes on %s, a thread of their own", clock_responder->endpoint().c_str());
    } else if (options.clock_listen == "auto") {
      RS_LOG(warn, "%s; clock probes are answered on the agents' socket", started.error().message.c_str());
    } else {
      RS_LOG(error, "--clock-listen: %s", started.error().message.c_str());
      return 2;
    }
  }

  auto fleet = join_fleet(options, sockets->public_key, clock.realtime_ns());
  if (!fleet) {
    RS_LOG(error, "--etcd: %s", fleet.error().message.c_str());
    return 2;
  }
  if (*fleet) tell_agents_the_fleet(**fleet, service.ingest(), *sockets);

  auto retention = Retention::start(**store, clock, options);
  RateLimiter agent_limit(options.max_messages_per_s, options.max_bytes_per_s);
  RateLimiter query_limit(options.max_messages_per_s, options.max_bytes_per_s);
  uint64_t query_throttled = 0;  // query requests dropped over the limit (the metrics count them)
  BadMessageLog query_throttle_log;
  QueryContext query_context{service.ingest(), **store, service.findings(), clock, options.liveness_ns(), fleet->get()};
  uint64_t last_evaluation = 0;
  // The store's writes run on a thread of their own (Commit, pipelined):
  // while one round's write is in flight the next round's batches are
  // taken in, and its acks (`acks_written`) go out once it is durable.
  // `acks_waiting`: the acks of batches applied since the last write began.
  Commit& commit = service.commit();
  commit.start_writer();
  std::vector<std::pair<std::string, std::string>> acks_waiting, acks_written;
  ReadAhead ahead;
  LoopTime loop;  // for the metrics
  auto timed = [&](LoopTime::Phase phase, auto&& work) {
    uint64_t start = clock.monotonic_ns();
    work();
    uint64_t took = clock.monotonic_ns() - start;
    loop.total_ns[phase] += took;
    return took;
  };
  auto write_finished = [&] {
    if (commit.finish()) send_all(sockets->agents, acks_written);
    // else logged by the commit; these acks are dropped, and the agents' re-sends are acknowledged by the commit that
    // writes them
    acks_written.clear();
  };
  while (!stop.load()) {
    zmq::pollitem_t items[] = {{sockets->agents.handle(), 0, ZMQ_POLLIN, 0},
                               {sockets->queries.handle(), 0, ZMQ_POLLIN, 0},
                               {nullptr, commit.done_fd(), ZMQ_POLLIN, 0}};
    try {
      // Without an eventfd (done_fd() < 0) a finished write is seen at the next wake-up, at most 10 ms on.
      // Messages read ahead and not yet applied: no wait.
      zmq::poll(items, commit.done_fd() >= 0 ? 3 : 2,
                std::chrono::milliseconds(!ahead.messages.empty()                    ? 0
                                          : commit.writing() && commit.done_fd() < 0 ? 10
                                                                                     : 100));
    } catch (const zmq::error_t& e) {
      // A signal (SIGTERM, SIGINT) interrupts the poll: check `stop` again.
      if (e.num() == EINTR) continue;
      throw;
    }
    Outbox outbox;
    timed(LoopTime::agents,
          [&] { take_agent_messages(*sockets, service.ingest(), agent_limit, options, clock, ahead, outbox); });
    uint64_t now = clock.realtime_ns();
    if (now - last_evaluation >= kEvaluationIntervalNs) {
      loop.last_evaluation_ns = timed(LoopTime::evaluate, [&] {
        evaluate(service, *outputs, *sockets, now, query_context.liveness_ns, query_throttled, fleet->get(), loop,
                 clock_responder.get());
        if (*fleet) tell_agents_the_fleet(**fleet, service.ingest(), *sockets);
      });
      last_evaluation = now;
    } else {
      timed(LoopTime::evaluate, [&] { service.score_some(now); });
    }
    acks_waiting.insert(acks_waiting.end(), std::make_move_iterator(outbox.after_commit.begin()),
                        std::make_move_iterator(outbox.after_commit.end()));
    timed(LoopTime::commit, [&] {
      if (commit.writing() && commit.write_done()) write_finished();
      if (!commit.writing()) {
        if (commit.begin(now)) {
          acks_written = std::move(acks_waiting);
        } else {
          // Nothing to write: what these batches needed is durable already.
          send_all(sockets->agents, acks_waiting);
        }
        acks_waiting.clear();
      }
    });
    timed(LoopTime::queries, [&] {
      while (auto request = receive(sockets->queries)) {
        if (!query_limit.admit(limit_key(*request), request->payload.size(), clock.monotonic_ns())) {
          ++query_throttled;
          query_throttle_log.report(request->user_id.empty() ? "a query client" : request->user_id,
                                    "query over the rate limit, dropped", clock.realtime_ns());
          continue;
        }
        send_to(sockets->queries, request->routing_id, answer_query(request->payload, query_context, request->user_id),
                true);
      }
    });
  }
  if (commit.writing()) write_finished();
  // The batches applied since are written by the last commit (service.stop): acknowledged once it is durable.
  if (auto committed = service.stop(clock.realtime_ns()); !committed)
    RS_LOG(error, "stopping with %llu bytes not written: %s",
           static_cast<unsigned long long>(service.commit().backlog_bytes()), committed.error().message.c_str());
  else
    send_all(sockets->agents, acks_waiting);
  fleet->reset();  // leaves the fleet: its lease revoked, its jobs move at once
  RS_LOG(info, "stopped");
  return 0;
}

}  // namespace rankscope::collector
