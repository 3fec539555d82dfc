#pragma once
// CurveZMQ keys: making them, the key files that hold them, and setting them
// on a socket. Every rankscope socket that crosses the network (agent ->
// collector, CLI -> collector) is CurveZMQ by default: encrypted, and each
// end proves it holds the secret key of the public key the other expects.
//
// Key files (`rankscope keygen` writes them) use the text layout of czmq's
// zcert, so the tools of the ZeroMQ world read them too:
//
//   #   rankscope CurveZMQ secret key: keep this file 0600
//   metadata
//       name = "node-7"
//       role = "agent"
//   curve
//       public-key = "<40 Z85 characters>"
//       secret-key = "<40 Z85 characters>"
//
// NAME.key holds both keys (mode 0600); NAME.pub the same without
// secret-key (mode 0644), the file handed to the other side. `role` is one
// of collector, agent, client; `name` binds an agent's key to its node name.
#include <optional>
#include <string>
#include <string_view>
#include <zmq.hpp>

#include "common/result.h"

namespace rankscope::curve {

inline constexpr size_t kZ85KeySize = 40;  // a 32-byte Curve25519 key in Z85

// Whether this libzmq was built with CurveZMQ (zmq_has("curve")).
bool available();

struct KeyFile {
  std::string name;
  std::string role;        // collector, agent, client
  std::string public_key;  // Z85
  std::string secret_key;  // Z85; empty in a public key file
};

bool valid_role(std::string_view role);
// A new key pair from libzmq (zmq_curve_keypair).
Result<KeyFile> generate(const std::string& name, const std::string& role);
// The text of a key file; with the secret key or without (NAME.pub).
std::string format(const KeyFile& key, bool with_secret);
// Reads the text of a key file; `where` names it in errors.
Result<KeyFile> parse(std::string_view text, const std::string& where);
Result<KeyFile> read(const std::string& path);
// Writes PREFIX.key (0600) and PREFIX.pub (0644). Refuses to replace an
// existing file unless `overwrite`.
Result<void> write(const std::string& prefix, const KeyFile& key, bool overwrite);

// What a client socket (agent, CLI) needs: its own pair and the collector's
// public key. Empty: plaintext (--insecure).
struct ClientKeys {
  std::string public_key, secret_key, server_key;
  bool enabled() const { return !server_key.empty(); }
};
// Loads the client's key file (with its secret) and the collector's public key file.
Result<ClientKeys> load_client_keys(const std::string& key_file, const std::string& collector_key_file);
// Sets the keys on a socket before it connects; nothing when !keys.enabled().
void apply(zmq::socket_t& socket, const ClientKeys& keys);
// Makes `socket` a CurveZMQ server with `key`; its clients are admitted by
// the ZAP handler for `zap_domain` (collector/auth.h).
void apply_server(zmq::socket_t& socket, const KeyFile& key, const std::string& zap_domain);

// Z85 of a 32-byte binary key (the form ZAP hands over).
std::string z85_of(std::string_view binary32);

}  // namespace rankscope::curve
