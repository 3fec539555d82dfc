#include "node-agent/transport.h"

#include <sys/utsname.h>

#include <algorithm>
#include <random>
#include <set>
#include <utility>

#include "common/log.h"
#include "common/version.h"
#include "node-agent/identify.h"
#include "proto/agent_wire.h"
#include "proto/codec.h"

namespace rankscope::agent {

namespace {
constexpr uint64_t kHelloRetryNs = 2'000'000'000ull;
// Batches sent and not yet acked at once (the socket's send high-water mark
// is the same): a replay of a long outage goes at the pace of the acks.
constexpr size_t kMaxInFlight = 1000;
// The longest wait for an ack before a batch is sent again.
constexpr uint64_t kMaxAckWaitNs = 60'000'000'000ull;
// Silence from the collector this long before the first reply: say why it may be.
constexpr uint64_t kNoReplyNs = 10'000'000'000ull;
constexpr uint64_t kNoReplyLogIntervalNs = 60'000'000'000ull;
constexpr const char* kAgentVersion = kVersion;
}  // namespace

uint64_t random_instance_id() {
  std::random_device device;
  uint64_t id = (static_cast<uint64_t>(device()) << 32) ^ device();
  return id == 0 ? 1 : id;
}

std::string boot_id() {
  auto id = read_file("/proc/sys/kernel/random/boot_id");
  if (!id) return {};
  std::string text = *id;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

std::optional<std::string> strip_detail(const std::string& batch_bytes, uint64_t& records) {
  capnp::MallocMessageBuilder message;
  bool ok = false;
  records = 0;
  auto read = proto::read_packed<wire::AgentMessage>(batch_bytes, proto::ReadLimits{}, [&](auto in) {
    if (in.which() != wire::AgentMessage::BATCH) return;
    auto from = in.getBatch();
    if (auto shape = proto::block_shape(from)) records += shape->records;
    for (auto w : from.getWaits()) records += w.getCount();
    auto to = message.initRoot<wire::AgentMessage>().initBatch();
    to.setInstanceId(from.getInstanceId());
    to.setSeq(from.getSeq());
    to.setProcesses(from.getProcesses());
    to.setComms(from.getComms());
    to.setCommEnds(from.getCommEnds());
    to.setClockSamples(from.getClockSamples());
    to.setDrops(from.getDrops());
    to.setCreatedNs(from.getCreatedNs());
    to.setBaseNs(from.getBaseNs());
    to.setCommTable(from.getCommTable());
    to.setAsyncErrors(from.getAsyncErrors());
    ok = true;
  });
  if (!read || !ok) return std::nullopt;
  return proto::to_packed(message);
}

Transport::Link::Link(zmq::context_t& context, std::string endpoint, curve::ClientKeys keys, uint64_t ack_min_ns,
                      uint64_t ack_max_ns)
    : endpoint(std::move(endpoint)),
      keys(std::move(keys)),
      socket(std::make_unique<zmq::socket_t>(context, zmq::socket_type::dealer)),
      ack_timer(ack_min_ns, ack_max_ns) {
  socket->set(zmq::sockopt::linger, 0);
  // Queue only on a live connection: while the collector is away, batches
  // wait in our own bounded queue, not in ZeroMQ's.
  socket->set(zmq::sockopt::immediate, 1);
  socket->set(zmq::sockopt::sndhwm, static_cast<int>(kMaxInFlight));
  socket->set(zmq::sockopt::reconnect_ivl, 100);
  socket->set(zmq::sockopt::reconnect_ivl_max, 2000);
  curve::apply(*socket, this->keys);
  socket->connect(this->endpoint);
}

Transport::Transport(zmq::context_t& context, const Options& options, const Clock& clock, uint64_t instance_id,
                     ClockSampleSink on_clock_sample, std::unique_ptr<Spool> spool)
    : context_(context),
      options_(options),
      clock_(clock),
      instance_id_(instance_id),
      on_clock_sample_(std::move(on_clock_sample)),
      spool_(std::move(spool)) {
  // What an earlier run left unacknowledged goes first, as it was (its own
  // instance id and seq: the collector recognises what it already stored).
  if (spool_) {
    // Their bytes stay on disk until each is sent; their key is read then.
    for (auto& recovered : spool_->take_recovered()) {
      Pending pending{recovered.instance, recovered.seq, std::string(), recovered.ref};
      pending.key_known = false;
      queue_.push_back(std::move(pending));
    }
    enforce_bounds();
  }
  links_.push_back(open_link(options_.collector, options_.keys, ""));
}

std::unique_ptr<Transport::Link> Transport::open_link(const std::string& endpoint, const curve::ClientKeys& keys,
                                                      const std::string& id) {
  auto link = std::make_unique<Link>(context_, endpoint, keys,
                                     static_cast<uint64_t>(options_.ack_timeout_ms) * 1'000'000ull, kMaxAckWaitNs);
  link->id = id;
  link->waiting_since_ns = now();
  send_hello(*link);
  return link;
}

bool Transport::send_bytes(Link& link, const std::string& bytes) {
  try {
    auto sent = link.socket->send(zmq::buffer(bytes), zmq::send_flags::dontwait);
    if (sent) ++messages_sent_;
    return sent.has_value();
  } catch (const zmq::error_t& e) {
    RS_LOG(warn, "send to %s failed: %s", link.endpoint.c_str(), e.what());
    return false;
  }
}

void Transport::send_hello(Link& link) {
  proto::Hello hello;
  hello.node = options_.node;
  hello.instance_id = instance_id_;
  hello.boot_id = boot_id();
  hello.agent_version = kAgentVersion;
  utsname uts{};
  if (uname(&uts) == 0) hello.kernel_release = uts.release;
  hello.monotonic_ns = now();
  hello.realtime_ns = clock_.realtime_ns();
  hello.follows_fleet = true;
  // Not sent (no connection yet): try again on the next service() call.
  link.last_hello_ns = send_bytes(link, proto::encode_hello(hello)) ? now() : 0;
}

void Transport::track(const std::string& key) {
  if (key.empty()) return;
  Stream& stream = streams_[key];
  if (stream.instance != 0) return;
  stream.instance = random_instance_id();
  // Until now everything went to the configured collector (there was no fleet, or no such key).
  stream.owner = links_.front()->id;
  refresh_owners();
}

std::pair<uint64_t, uint64_t> Transport::batch_id(const std::string& key) {
  if (key.empty()) return {instance_id_, ++seq_};
  track(key);
  Stream& stream = streams_[key];
  return {stream.instance, ++stream.seq};
}

void Transport::refresh_owners() {
  for (auto& [key, stream] : streams_) {
    std::string owner = route(key);
    if (owner == stream.owner) continue;
    RS_LOG(info, "%s goes to collector %s now (was %s)", key.c_str(), owner.c_str(),
           stream.owner.empty() ? "the configured one" : stream.owner.c_str());
    stream.owner = owner;
    stream.held = true;
    if (std::find(moved_.begin(), moved_.end(), key) == moved_.end()) moved_.push_back(key);
  }
}

std::string Transport::route(const std::string& key) const {
  if (key.empty() || members_.empty()) return links_.front()->id;
  const fleet::Member* owner = fleet::owner(key, members_);
  return owner ? owner->id : links_.front()->id;
}

std::vector<std::string> Transport::take_moved() {
  return std::exchange(moved_, {});
}

void Transport::forget_streams(const std::set<std::string>& live) {
  for (auto it = streams_.begin(); it != streams_.end();) {
    const std::string& key = it->first;
    // The queue is read only for a stream whose processes are gone (rare: a backlog can be long).
    const bool kept = live.count(key) || it->second.held ||
                      std::any_of(queue_.begin(), queue_.end(), [&](const Pending& p) { return p.key == key; });
    if (kept)
      ++it;
    else
      it = streams_.erase(it);  // a job over on this node: a later move has nothing of it to announce
  }
}

Transport::Link* Transport::link_for(const std::string& key) {
  const std::string id = route(key);
  for (auto& link : links_)
    if (link->id == id) return link.get();
  return nullptr;  // a member whose connection could not be made (no public key)
}

std::vector<zmq::pollitem_t> Transport::poll_items() const {
  std::vector<zmq::pollitem_t> items;
  for (const auto& link : links_) {
    items.push_back({link->socket->handle(), 0, ZMQ_POLLIN, 0});
    if (link->clock_socket) items.push_back({link->clock_socket->handle(), 0, ZMQ_POLLIN, 0});
  }
  return items;
}

void Transport::submit(uint64_t instance, uint64_t seq, std::string bytes, const std::string& key, bool first) {
  SpoolRef ref;
  if (spool_) {
    auto written = spool_->append(instance, seq, bytes);
    if (written) {
      ref = *written;
    } else if (now() - last_spool_error_log_ns_ > 30'000'000'000ull || last_spool_error_log_ns_ == 0) {
      // Kept in memory only (a full disk must not stop tracing).
      RS_LOG(error, "%s; batches are kept in memory only until the spool is writable again",
             written.error().message.c_str());
      last_spool_error_log_ns_ = now();
    }
    spool_->maybe_sync(now());
  }
  queued_bytes_ += bytes.size();
  Pending pending{instance, seq, std::move(bytes), ref};
  pending.key = key;
  auto at = queue_.end();
  if (first) {
    at = std::find_if(queue_.begin(), queue_.end(), [&](const Pending& p) { return p.key_known && p.key == key; });
    if (auto stream = streams_.find(key); stream != streams_.end()) stream->second.held = false;
  }
  queue_.insert(at, std::move(pending));
  enforce_bounds();
  // Sent now if its link is up and every older batch of the link went before it (order is kept).
  resend_due();
}

void Transport::drop_detail(Pending& pending) {
  uint64_t records = 0;
  auto summary = pending.bytes.empty() && spool_ ? spool_->read(pending.ref) : Result<std::string>(pending.bytes);
  std::optional<std::string> stripped;
  if (summary) stripped = strip_detail(*summary, records);
  queued_bytes_ -= pending.bytes.size();
  pending.bytes = stripped ? std::move(*stripped) : std::string();
  queued_bytes_ += pending.bytes.size();
  pending.ref = SpoolRef{};
  if (!pending.stripped) ++discarded_;
  pending.stripped = true;
  lost_records_ += records;
}

void Transport::enforce_bounds() {
  // The spool: its oldest segment goes; the batches in it keep their summaries in memory.
  while (spool_) {
    auto segment = spool_->segment_to_drop();
    if (!segment) break;
    size_t before = discarded_;
    for (auto& pending : queue_)
      if (pending.ref.segment == *segment) drop_detail(pending);
    spool_->drop_segment(*segment);
    RS_LOG(warn, "spool %s is full (%llu bytes): the records of its %zu oldest batch(es) are dropped, their summaries kept",
           spool_->dir().c_str(), static_cast<unsigned long long>(spool_->bytes()), discarded_ - before);
  }
  // Memory: batches on disk are only dropped from the cache; the others (no
  // spool, or a summary) lose their records, then go whole, oldest first.
  for (auto& pending : queue_) {
    if (queued_bytes_ <= options_.max_unacked_bytes) break;
    if (pending.ref.segment != 0 && !pending.bytes.empty()) {
      queued_bytes_ -= pending.bytes.size();
      std::string().swap(pending.bytes);
    }
  }
  for (auto& pending : queue_) {
    if (queued_bytes_ <= options_.max_unacked_bytes) break;
    if (pending.ref.segment == 0 && !pending.bytes.empty() && !pending.stripped) drop_detail(pending);
  }
  while (queued_bytes_ > options_.max_unacked_bytes && queue_.size() > 1 && queue_.front().ref.segment == 0) {
    queued_bytes_ -= queue_.front().bytes.size();
    if (!queue_.front().stripped) ++discarded_;
    queue_.pop_front();
  }
}

void Transport::read_key(Pending& pending) {
  pending.key_known = true;
  auto bytes = pending.bytes.empty() && spool_ ? spool_->read(pending.ref) : Result<std::string>(pending.bytes);
  if (!bytes) return;  // unreadable: send_pending says so and forgets it
  auto read = proto::read_packed<wire::AgentMessage>(*bytes, proto::ReadLimits{}, [&](auto in) {
    if (in.which() == wire::AgentMessage::BATCH) pending.key = in.getBatch().getPlacementKey();
  });
  (void)read;  // not a batch: sent as it is, to the configured collector, which says what is wrong
}

bool Transport::reads_compact() const {
  bool any = false;
  for (const auto& link : links_) {
    if (!link->accepted) continue;
    if (!link->reads_compact) return false;
    any = true;
  }
  return any;
}

bool Transport::send_pending(Link& link, Pending& pending) {
  std::optional<std::string> read;
  if (pending.bytes.empty()) {
    if (pending.ref.segment == 0 || !spool_) return true;  // nothing left to send; resend_due forgets it
    auto bytes = spool_->read(pending.ref);
    if (!bytes) {
      RS_LOG(error, "%s; batch %llu is lost", bytes.error().message.c_str(), static_cast<unsigned long long>(pending.seq));
      pending.ref = SpoolRef{};
      ++discarded_;
      return true;
    }
    read = std::move(*bytes);
  }
  const std::string& bytes = read ? *read : pending.bytes;
  // An older collector would ignore the table, and with it the records.
  const std::optional<std::string> wire =
      link.reads_compact ? proto::encode_compact(bytes) : proto::batch_without_table(bytes);
  if (!send_bytes(link, wire ? *wire : bytes)) return false;
  if (pending.last_sent_ns != 0) ++pending.resends;
  pending.last_sent_ns = now();
  pending.to = &link;
  return true;
}

uint64_t Transport::ack_wait_ns(const Pending& pending) const {
  // A collector that is slow, not gone, would otherwise get the same batches
  // again every ack timeout on top of its backlog: the wait follows the acks'
  // round trip, and doubles with each re-send (2, 4, 8 ... s by default), up
  // to a minute.
  const Link* link = pending.to ? pending.to : links_.front().get();
  return link->ack_timer.wait_ns(pending.resends);
}

uint64_t Transport::ack_timeout_ns() const {
  return links_.front()->ack_timer.timeout_ns();
}

void Transport::open_clock(Link& link, uint16_t port) {
  if (port == link.clock_port && (port == 0 || link.clock_socket)) return;
  link.clock_socket.reset();
  link.clock_port = 0;
  const std::string endpoint = proto::clock_probe_endpoint(link.endpoint, port);
  if (endpoint.empty()) return;
  try {
    auto socket = std::make_unique<zmq::socket_t>(clock_context_, zmq::socket_type::dealer);
    socket->set(zmq::sockopt::linger, 0);
    // No connection, no queue: the probe goes on the link instead.
    socket->set(zmq::sockopt::immediate, 1);
    socket->set(zmq::sockopt::sndhwm, 4);
    socket->set(zmq::sockopt::reconnect_ivl, 100);
    socket->set(zmq::sockopt::reconnect_ivl_max, 2000);
    curve::apply(*socket, link.keys);
    socket->connect(endpoint);
    link.clock_socket = std::move(socket);
    link.clock_port = port;
    RS_LOG(info, "collector %s answers clock probes on %s", link.endpoint.c_str(), endpoint.c_str());
  } catch (const zmq::error_t& e) {
    RS_LOG(warn, "clock probes to %s stay on the collector's connection: %s", endpoint.c_str(), e.what());
  }
}

void Transport::send_clock_probe() {
  for (auto& link : links_) {
    if (!link->accepted) continue;
    const std::string bytes = proto::encode_clock_probe(now());
    bool sent = false;
    if (link->clock_socket) {
      try {
        sent = link->clock_socket->send(zmq::buffer(bytes), zmq::send_flags::dontwait).has_value();
      } catch (const zmq::error_t&) {
        sent = false;  // as if unconnected: on the link
      }
    }
    if (sent)
      ++messages_sent_;
    else
      send_bytes(*link, bytes);
  }
}

void Transport::take_clock_replies(Link& link) {
  while (link.clock_socket) {
    zmq::message_t reply;
    zmq::recv_result_t got;
    try {
      got = link.clock_socket->recv(reply, zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& e) {
      break;
    }
    if (!got) break;
    const uint64_t t4 = now();  // before the reply is read: its reading is not on the way back
    ++messages_received_;
    auto times = proto::read_clock_reply(std::string_view(static_cast<const char*>(reply.data()), reply.size()));
    if (times) on_clock_sample_((*times)[0], (*times)[1], (*times)[2], t4, link.id);
  }
}

bool Transport::send_heartbeat(const std::function<void(wire::Heartbeat::Builder)>& fill) {
  std::string bytes;
  bool taken = false;
  for (auto& link : links_) {
    if (!link->accepted) continue;
    if (bytes.empty()) {
      proto::HeartbeatHeader header{instance_id_, now(), static_cast<uint32_t>(queue_.size())};
      bytes = proto::encode_heartbeat(header, [&](wire::Heartbeat::Builder hb) {
        fill(hb);
        auto drops = hb.getDrops();
        drops.setSendQueueFull(discarded_);
        drops.setLostRecords(lost_records_);
        drops.setSpoolDamaged(spool_damaged());
      });
    }
    taken = send_bytes(*link, bytes) || taken;
  }
  return taken;
}

void Transport::service() {
  for (size_t i = 0; i < links_.size(); ++i) {
    Link& link = *links_[i];
    take_clock_replies(link);
    for (;;) {
      zmq::message_t reply;
      zmq::recv_result_t got;
      try {
        got = link.socket->recv(reply, zmq::recv_flags::dontwait);
      } catch (const zmq::error_t& e) {
        RS_LOG(warn, "receive from %s failed: %s", link.endpoint.c_str(), e.what());
        break;
      }
      if (!got) break;
      ++messages_received_;
      link.waiting_since_ns = 0;
      handle(link, std::string(static_cast<const char*>(reply.data()), reply.size()));
      if (i >= links_.size() || links_[i].get() != &link) break;  // a FleetMap closed this link
    }
  }
  for (auto& link : links_) {
    warn_if_unanswered(*link);
    if (!link->accepted && (link->last_hello_ns == 0 || now() - link->last_hello_ns > kHelloRetryNs)) send_hello(*link);
  }
  resend_due();
}

void Transport::warn_if_unanswered(Link& link) {
  // A CurveZMQ handshake the collector refuses (unknown key, wrong collector
  // key, plaintext against CurveZMQ) gives this side no error: only silence.
  if (link.waiting_since_ns == 0 || now() - link.waiting_since_ns < kNoReplyNs) return;
  // libzmq gives up on a connection whose handshake was refused (a key not
  // yet in the allow-list): connect anew now and then, so that a key added
  // later is taken without restarting the agent.
  if (now() - link.last_reconnect_ns >= kNoReplyNs) {
    link.last_reconnect_ns = now();
    try {
      link.socket->disconnect(link.endpoint);
    } catch (const zmq::error_t&) {
      // Already gone: libzmq dropped it after the refusal.
    }
    link.socket->connect(link.endpoint);
  }
  if (link.last_silence_log_ns != 0 && now() - link.last_silence_log_ns < kNoReplyLogIntervalNs) return;
  link.last_silence_log_ns = now();
  const auto silent_s = static_cast<unsigned long long>((now() - link.waiting_since_ns) / 1'000'000'000ull);
  if (!link.id.empty())
    RS_LOG(error,
           "no reply from collector %s (%s) of the fleet in %llu s: is it running, and is this node's public key "
           "%s in its allow-list too?",
           link.id.c_str(), link.endpoint.c_str(), silent_s, options_.keys.public_key.c_str());
  else if (options_.keys.enabled())
    RS_LOG(error,
           "no reply from collector %s in %llu s: is it running, with CurveZMQ, is --collector-key its public "
           "key, and is this node's public key %s in its allow-list (bound to node %s)?",
           link.endpoint.c_str(), silent_s, options_.keys.public_key.c_str(), options_.node.c_str());
  else
    RS_LOG(error,
           "no reply from collector %s in %llu s: is it running, and with --insecure? (a collector with "
           "CurveZMQ never answers a plaintext agent)",
           link.endpoint.c_str(), silent_s);
}

void Transport::take_fleet(Link& from, wire::FleetMap::Reader map) {
  // Bounded, and only what can be a member: an id (once), a ZeroMQ endpoint.
  std::vector<fleet::Member> members;
  for (auto m : map.getMembers()) {
    if (members.size() == kMaxMembers) break;
    fleet::Member member;
    member.id = m.getId();
    member.agents = m.getAgents();
    member.public_key = m.getPublicKey();
    const bool endpoint = member.agents.rfind("tcp://", 0) == 0 || member.agents.rfind("ipc://", 0) == 0;
    const bool seen = std::any_of(members.begin(), members.end(), [&](const auto& o) { return o.id == member.id; });
    if (member.id.empty() || !endpoint || seen) continue;
    members.push_back(std::move(member));
  }
  std::sort(members.begin(), members.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  auto same = [](const fleet::Member& a, const fleet::Member& b) {
    return a.id == b.id && a.agents == b.agents && a.public_key == b.public_key;
  };
  if (members.empty() ||
      (members.size() == members_.size() && std::equal(members.begin(), members.end(), members_.begin(), same)))
    return;
  RS_LOG(info, "the fleet has %zu collector(s) now (told by %s)", members.size(),
         from.id.empty() ? from.endpoint.c_str() : from.id.c_str());
  members_ = std::move(members);
  refresh_owners();
  // A connection to every member: the configured collector's is one of them.
  Link* home = links_.front().get();
  std::vector<std::unique_ptr<Link>> links;
  links.push_back(std::move(links_.front()));
  for (const auto& member : members_) {
    if (member.id == home->id) continue;
    auto kept = std::find_if(links_.begin() + 1, links_.end(), [&](const auto& l) {
      return l && l->id == member.id && l->endpoint == member.agents && l->keys.server_key == member.public_key;
    });
    if (kept != links_.end()) {
      links.push_back(std::move(*kept));
      continue;
    }
    if (options_.keys.enabled() && member.public_key.size() != curve::kZ85KeySize) {
      RS_LOG(error, "collector %s of the fleet has no CurveZMQ public key: its jobs' batches wait for it",
             member.id.c_str());
      continue;
    }
    curve::ClientKeys keys = options_.keys;
    if (keys.enabled()) keys.server_key = member.public_key;
    try {
      links.push_back(open_link(member.agents, keys, member.id));
      RS_LOG(info, "connecting to collector %s of the fleet at %s", member.id.c_str(), member.agents.c_str());
    } catch (const zmq::error_t& e) {
      RS_LOG(error, "collector %s of the fleet: cannot connect to %s: %s", member.id.c_str(), member.agents.c_str(),
             e.what());
    }
  }
  // Links no longer in the fleet close; what was sent on them goes to the new owners.
  for (auto& old : links_)
    if (old)
      for (auto& pending : queue_)
        if (pending.to == old.get()) {
          pending.to = nullptr;
          pending.last_sent_ns = 0;  // its key's new owner gets it at once
          pending.resends = 0;
        }
  links_ = std::move(links);
}

void Transport::handle(Link& link, const std::string& bytes) {
  auto result = proto::read_packed<wire::CollectorMessage>(bytes, proto::ReadLimits{}, [&](auto message) {
    switch (message.which()) {
      case wire::CollectorMessage::HELLO_REPLY: {
        auto reply = message.getHelloReply();
        if (reply.getAccepted()) {
          if (!link.accepted) {
            RS_LOG(info, "collector %s accepted node %s (%zu batch(es) to send)", link.endpoint.c_str(),
                   options_.node.c_str(), queue_.size());
            ++welcomes_;
            link.ack_timer.reset();  // a new connection: what was learnt of the old one no longer holds
          }
          link.accepted = true;
          link.reads_compact = reply.getReadsCompact();
          open_clock(link, reply.getClockPort());
          // The configured collector says who it is in the fleet (its id names its jobs' owner).
          if (&link == links_.front().get() && reply.getCollectorId().size() > 0) link.id = reply.getCollectorId();
          for (auto& pending : queue_)  // send all again, in order (a new connection: no backing off)
            if (pending.to == &link || pending.to == nullptr) {
              pending.last_sent_ns = 0;
              pending.resends = 0;
            }
          if (reply.hasFleet()) take_fleet(link, reply.getFleet());
          resend_due();
        } else if (now() - link.last_refusal_log_ns > 30'000'000'000ull || link.last_refusal_log_ns == 0) {
          RS_LOG(error, "collector %s refused node %s: %s", link.endpoint.c_str(), options_.node.c_str(),
                 reply.getReason().cStr());
          link.last_refusal_log_ns = now();
        }
        break;
      }
      case wire::CollectorMessage::ACK: {
        auto ack = message.getAck();
        // Batches of an earlier instance (replayed from the spool) are acked under their own id.
        auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Pending& p) {
          return p.seq == ack.getSeq() && p.instance == ack.getInstanceId();
        });
        if (it != queue_.end()) {
          if (it->resends == 0 && it->last_sent_ns != 0 && it->to == &link)
            link.ack_timer.sample(now() - it->last_sent_ns);
          queued_bytes_ -= it->bytes.size();
          if (spool_) spool_->acked(it->instance, it->seq, it->ref);
          queue_.erase(it);
        }
        break;
      }
      case wire::CollectorMessage::CLOCK_REPLY: {
        auto reply = message.getClockReply();
        on_clock_sample_(reply.getT1(), reply.getT2(), reply.getT3(), now(), link.id);
        break;
      }
      case wire::CollectorMessage::ERROR: {
        auto error = message.getError();
        if (error.getCode() == wire::ErrorCode::NEED_HELLO) {
          // The collector restarted and forgot this connection. Every
          // message in flight gets this answer: one Hello for all of them
          // (service() sends it again if it goes unanswered).
          if (link.accepted) {
            RS_LOG(info, "collector %s asks for a new hello", link.endpoint.c_str());
            link.accepted = false;
            send_hello(link);
          }
        } else {
          RS_LOG(warn, "collector %s: %s", link.endpoint.c_str(), error.getMessage().cStr());
        }
        break;
      }
      case wire::CollectorMessage::DETAIL: {
        auto comms = message.getDetail().getComms();
        if (comms.size() > 0 && link.detail_comms.empty())
          RS_LOG(info, "collector %s asks for NCCL's proxy steps of %u communicator(s)", link.endpoint.c_str(),
                 comms.size());
        link.detail_comms.clear();
        for (uint64_t comm : comms) {
          if (link.detail_comms.size() >= kMaxDetailComms) break;
          link.detail_comms.push_back(comm);
        }
        link.detail_at_ns = now();
        break;
      }
      case wire::CollectorMessage::FLEET:
        if (link.accepted) take_fleet(link, message.getFleet());
        break;
      default:
        // A newer collector's (it may send one with every reply): said once.
        if (!warned_unknown_message_) RS_LOG(warn, "collector sent a message this agent does not know; ignored");
        warned_unknown_message_ = true;
        break;
    }
  });
  if (!result) RS_LOG(warn, "from collector %s: %s", link.endpoint.c_str(), result.error().message.c_str());
}

std::vector<uint64_t> Transport::detail_comms(uint64_t lease_ns) const {
  std::vector<uint64_t> comms;
  for (const auto& link : links_) {
    if (link->detail_comms.empty() || now() - link->detail_at_ns > lease_ns) continue;
    for (uint64_t comm : link->detail_comms)
      if (comms.size() < kMaxDetailComms) comms.push_back(comm);
  }
  std::sort(comms.begin(), comms.end());
  comms.erase(std::unique(comms.begin(), comms.end()), comms.end());
  return comms;
}

void Transport::resend_due() {
  if (std::none_of(links_.begin(), links_.end(), [](const auto& l) { return l->accepted; })) return;
  uint64_t t = now();
  // Never more than the socket's high-water mark in flight at once on a
  // link: the rest wait here (or on disk), not in ZeroMQ's memory. A link
  // that cannot send now (down, or not accepted) holds its batches back, in
  // order; the others go on. Once every link is held back, the scan stops.
  std::map<const Link*, size_t> in_flight;
  std::set<const Link*> blocked;
  auto block = [&](const Link* link) {
    if (link) blocked.insert(link);
  };
  std::map<std::string, Link*> links_of;  // by key, this call (placement hashes each member)
  for (auto it = queue_.begin(); it != queue_.end() && blocked.size() < links_.size();) {
    if (it->bytes.empty() && it->ref.segment == 0) {  // nothing left of it (unreadable, or lost)
      it = queue_.erase(it);
      continue;
    }
    // Alone, every batch goes to the one collector: an earlier run's need not be read to say where.
    if (!it->key_known && in_fleet()) {
      read_key(*it);
      track(it->key);  // announced first where its processes were not told of
    }
    const std::string& key = it->key_known ? it->key : std::string();
    if (auto stream = streams_.find(key); stream != streams_.end() && stream->second.held) {
      ++it;  // its new owner is told of its processes first
      continue;
    }
    auto cached = links_of.find(key);
    Link* link = cached != links_of.end() ? cached->second : (links_of[key] = link_for(key));
    if (link && it->to != nullptr && it->to != link && !it->to->accepted) {
      // Its key moved from a collector that is gone: the new owner gets it now. (One still
      // there may yet acknowledge it: it goes to the new owner only when its ack is late.)
      it->last_sent_ns = 0;
      it->resends = 0;
      it->to = nullptr;
    }
    if (!link || !link->accepted || blocked.count(link)) {
      block(link);  // (null: a member this agent cannot reach)
      ++it;
      continue;
    }
    if (it->last_sent_ns != 0 && t - it->last_sent_ns < ack_wait_ns(*it)) {
      ++in_flight[link];
      ++it;
      continue;
    }
    if (in_flight[link] >= kMaxInFlight || !send_pending(*link, *it)) {
      block(link);  // no room or no connection now; keep order, try later
      ++it;
      continue;
    }
    ++in_flight[link];
    ++it;
  }
  if (spool_) spool_->maybe_sync(t);
}

}  // namespace rankscope::agent
