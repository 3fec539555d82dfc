#include "collector/auth.h"

#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <vector>

#include "common/clock.h"
#include "common/curve.h"
#include "common/log.h"

namespace rankscope::collector {

namespace {
constexpr uint64_t kRefreshIntervalNs = 1'000'000'000ull;
constexpr uint64_t kRefusalLogIntervalNs = 10'000'000'000ull;

int64_t mtime_ns(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -2;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000ll + st.st_mtim.tv_nsec;
}
}  // namespace

Result<void> AllowList::load() {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir_, ec))
    return make_error(Errc::not_found, "allow-list " + dir_ +
                                           " is not a directory: make it and put the agents' and clients' .pub "
                                           "files in it (rankscope keygen writes them; see docs/operations.md)");
  int64_t mtime = mtime_ns(dir_);
  std::map<std::string, Entry> keys;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const auto& path = entry.path();
    if (!entry.is_regular_file(ec) || (path.extension() != ".pub" && path.extension() != ".key")) continue;
    auto key = curve::read(path.string());
    if (!key) {
      RS_LOG(warn, "allow-list: %s skipped: %s", path.c_str(), key.error().message.c_str());
      continue;
    }
    if (key->role != "agent" && key->role != "client") {
      RS_LOG(warn, "allow-list: %s skipped: role \"%s\" (agent or client admitted)", path.c_str(), key->role.c_str());
      continue;
    }
    if (key->role == "agent" && key->name.empty()) {
      RS_LOG(warn, "allow-list: %s skipped: an agent key needs the node name it speaks for", path.c_str());
      continue;
    }
    auto [it, added] = keys.emplace(key->public_key, Entry{key->name, key->role});
    if (!added && (it->second.name != key->name || it->second.role != key->role))
      RS_LOG(warn, "allow-list: %s repeats a public key already admitted as %s %s; the first one holds", path.c_str(),
             it->second.role.c_str(), it->second.name.c_str());
  }
  if (ec) return make_error(Errc::io, "reading allow-list " + dir_ + ": " + ec.message());
  bool changed = loaded_mtime_ns_ != -1;
  // Re-reads of an unchanged directory (see racy_) are not worth a line.
  bool same = keys.size() == keys_.size() &&
              std::equal(keys.begin(), keys.end(), keys_.begin(), [](const auto& a, const auto& b) {
                return a.first == b.first && a.second.name == b.second.name && a.second.role == b.second.role;
              });
  keys_ = std::move(keys);
  loaded_mtime_ns_ = mtime;
  // A directory time is stamped from a coarse clock: a change made just
  // after this read may leave it as it is. Until the time is safely in the
  // past, read the directory again on every check.
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  int64_t now_ns = static_cast<int64_t>(now.tv_sec) * 1'000'000'000ll + now.tv_nsec;
  racy_ = now_ns - mtime < 2'000'000'000ll;
  if (!changed || !same)
    RS_LOG(info, "allow-list %s: %zu key(s)%s", dir_.c_str(), keys_.size(), changed ? " (reloaded)" : "");
  return {};
}

void AllowList::refresh(uint64_t now_ns) {
  if (checked_ns_ != 0 && now_ns - checked_ns_ < kRefreshIntervalNs) return;
  checked_ns_ = now_ns;
  if (mtime_ns(dir_) == loaded_mtime_ns_ && !racy_) return;
  // A failed reload keeps the keys loaded before (a directory being replaced).
  if (auto r = load(); !r) RS_LOG(error, "%s; keeping the %zu key(s) loaded before", r.error().message.c_str(), keys_.size());
}

std::optional<AllowList::Entry> AllowList::find(const std::string& public_key_z85) const {
  auto it = keys_.find(public_key_z85);
  if (it == keys_.end()) return std::nullopt;
  return it->second;
}

ZapDecision decide(const AllowList& allow, const std::string& domain, const std::string& mechanism,
                   const std::string& public_key_z85) {
  if (mechanism != "CURVE") return {false, {}, "mechanism " + mechanism + " (CurveZMQ required)"};
  auto entry = allow.find(public_key_z85);
  if (!entry) return {false, {}, "public key " + public_key_z85 + " is not in the allow-list " + allow.dir()};
  if (domain == kAgentDomain) {
    if (entry->role != "agent")
      return {false, {}, "key of " + entry->role + " " + entry->name + " used on the agent socket"};
    return {true, entry->name, {}};
  }
  if (domain == kQueryDomain) {
    if (entry->role != "client")
      return {false, {}, "key of " + entry->role + " " + entry->name + " used on the query socket"};
    return {true, "client:" + entry->name, {}};
  }
  return {false, {}, "unknown ZAP domain " + domain};
}

ZapHandler::ZapHandler(zmq::context_t& context, std::string allow_dir)
    : socket_(context, zmq::socket_type::rep), allow_(std::move(allow_dir)) {}

Result<std::unique_ptr<ZapHandler>> ZapHandler::start(zmq::context_t& context, const std::string& allow_dir) {
  std::unique_ptr<ZapHandler> handler(new ZapHandler(context, allow_dir));
  if (auto r = handler->allow_.load(); !r) return r.error();
  try {
    handler->socket_.set(zmq::sockopt::linger, 0);
    handler->socket_.bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    return make_error(Errc::system, std::string("cannot start the ZAP handler: ") + e.what());
  }
  handler->thread_ = std::thread([h = handler.get()] { h->serve(); });
  return handler;
}

ZapHandler::~ZapHandler() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void ZapHandler::serve() {
  SystemClock clock;
  uint64_t logged_ns = 0, unlogged = 0;
  while (!stop_.load()) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    try {
      if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) == 0) continue;
      std::vector<zmq::message_t> frames;
      for (;;) {
        zmq::message_t frame;
        if (!socket_.recv(frame, zmq::recv_flags::none)) break;
        bool more = frame.more();
        frames.push_back(std::move(frame));
        if (!more) break;
      }
      auto text = [&](size_t i) { return i < frames.size() ? frames[i].to_string() : std::string(); };
      // RFC 27: version, request id, domain, address, identity, mechanism, credentials...
      uint64_t now = clock.monotonic_ns();
      allow_.refresh(now);
      ZapDecision decision;
      if (frames.size() < 6 || text(0) != "1.0")
        decision.reason = "malformed ZAP request";
      else
        decision = decide(allow_, text(2), text(5), frames.size() > 6 ? curve::z85_of(text(6)) : "");
      if (decision.allowed) {
        admitted_.fetch_add(1);
        RS_LOG(debug, "admitted %s from %s on the %s socket", decision.user_id.c_str(), text(3).c_str(), text(2).c_str());
      } else {
        refused_.fetch_add(1);
        if (logged_ns == 0 || now - logged_ns >= kRefusalLogIntervalNs) {
          RS_LOG(warn, "refused a connection from %s on the %s socket: %s%s", text(3).c_str(), text(2).c_str(),
                 decision.reason.c_str(),
                 unlogged ? (" (and " + std::to_string(unlogged) + " more refusals not logged)").c_str() : "");
          logged_ns = now;
          unlogged = 0;
        } else {
          ++unlogged;
        }
      }
      socket_.send(zmq::buffer(std::string("1.0")), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(text(1)), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(std::string(decision.allowed ? "200" : "400")), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(decision.allowed ? std::string("OK") : decision.reason), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(decision.user_id), zmq::send_flags::sndmore);
      socket_.send(zmq::message_t(), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      if (e.num() != EINTR) RS_LOG(error, "ZAP handler: %s", e.what());
    }
  }
}

}  // namespace rankscope::collector
