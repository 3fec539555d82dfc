#pragma once
// Who may talk to the collector: a ZAP handler (ZeroMQ RFC 27) that admits
// CurveZMQ clients by an allow-list of public keys, and binds each agent's
// key to its node name.
//
// The allow-list is a directory of key files (common/curve.h), one per
// admitted key; only their public keys are read. A file with role "agent"
// admits that key on the agent socket, speaking for node `name` and no other:
// the handler hands the name to libzmq as the connection's User-Id, the
// collector reads it from each message ("User-Id" metadata) and Ingest
// refuses a Hello for another node. A file with role "client" admits a CLI
// (or other query client) on the query socket. The directory is read again
// whenever its modification time changes (a file added, removed or renamed
// into place), at most once a second, so keys are added and revoked without
// a restart.
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "common/result.h"

namespace rankscope::collector {

inline constexpr const char* kAgentDomain = "agents";
inline constexpr const char* kQueryDomain = "queries";

class AllowList {
 public:
  struct Entry {
    std::string name, role;
  };
  explicit AllowList(std::string dir) : dir_(std::move(dir)) {}
  // Reads the directory; files that are not key files are skipped with a warning.
  Result<void> load();
  // Reads it again if it changed (checked at most once per `min_interval_ns` of `now_ns`).
  void refresh(uint64_t now_ns);
  std::optional<Entry> find(const std::string& public_key_z85) const;
  size_t size() const { return keys_.size(); }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::map<std::string, Entry> keys_;  // Z85 public key -> entry
  int64_t loaded_mtime_ns_ = -1;
  bool racy_ = false;  // the directory changed too recently to trust its time
  uint64_t checked_ns_ = 0;
};

// What the ZAP handler decides for one handshake (pure: unit-tested).
struct ZapDecision {
  bool allowed = false;
  std::string user_id;  // agents: the node name; clients: "client:NAME"
  std::string reason;   // when refused
};
ZapDecision decide(const AllowList& allow, const std::string& domain, const std::string& mechanism,
                   const std::string& public_key_z85);

// Serves inproc://zeromq.zap.01 on `context` from its own thread until destroyed.
// Must be started before the CurveZMQ sockets bind.
class ZapHandler {
 public:
  static Result<std::unique_ptr<ZapHandler>> start(zmq::context_t& context, const std::string& allow_dir);
  ~ZapHandler();
  uint64_t refused() const { return refused_.load(); }
  uint64_t admitted() const { return admitted_.load(); }

 private:
  ZapHandler(zmq::context_t& context, std::string allow_dir);
  void serve();

  zmq::socket_t socket_;
  AllowList allow_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refused_{0}, admitted_{0};
  std::thread thread_;
};

}  // namespace rankscope::collector
