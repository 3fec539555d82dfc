#include "common/curve.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

namespace rankscope::curve {

namespace {
bool is_z85(std::string_view key) {
  if (key.size() != kZ85KeySize) return false;
  // The Z85 alphabet (ZeroMQ RFC 32).
  static constexpr std::string_view kAlphabet =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  for (char c : key)
    if (kAlphabet.find(c) == std::string_view::npos) return false;
  return true;
}

std::string trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

Result<void> write_file(const std::string& path, const std::string& text, mode_t mode, bool overwrite) {
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (overwrite ? O_TRUNC : O_EXCL);
  int fd = ::open(path.c_str(), flags, mode);
  if (fd < 0) {
    if (errno == EEXIST)
      return make_error(Errc::io, path + " already exists; move it away first (or pass --force to replace it)");
    return make_error(Errc::io, "cannot write " + path + ": " + std::strerror(errno));
  }
  // The mode given to open() is reduced by the umask and not applied to an existing file.
  bool ok = ::fchmod(fd, mode) == 0;
  size_t done = 0;
  while (ok && done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ::fsync(fd) == 0 && ok;
  std::string why = std::strerror(errno);
  ::close(fd);
  if (!ok) return make_error(Errc::io, "cannot write " + path + ": " + why);
  return {};
}
}  // namespace

bool available() { return zmq_has("curve") != 0; }

bool valid_role(std::string_view role) { return role == "collector" || role == "agent" || role == "client"; }

Result<KeyFile> generate(const std::string& name, const std::string& role) {
  if (!available())
    return make_error(Errc::unsupported_version, "this libzmq was built without CurveZMQ (zmq_has(\"curve\") is false)");
  if (!valid_role(role)) return make_error(Errc::invalid_argument, "role must be collector, agent or client");
  for (char c : name)
    if (c <= ' ' || c > '~' || c == '"')
      return make_error(Errc::invalid_argument, "key name must be printable ASCII without spaces or quotes");
  char public_key[41] = {}, secret_key[41] = {};
  if (zmq_curve_keypair(public_key, secret_key) != 0)
    return make_error(Errc::system, std::string("zmq_curve_keypair: ") + zmq_strerror(zmq_errno()));
  return KeyFile{name, role, public_key, secret_key};
}

std::string format(const KeyFile& key, bool with_secret) {
  std::ostringstream out;
  if (with_secret)
    out << "#   rankscope CurveZMQ secret key (" << key.role << " " << key.name
        << "): keep this file 0600, never copy it off its host\n";
  else
    out << "#   rankscope CurveZMQ public key (" << key.role << " " << key.name
        << "): give this file to the other side\n";
  out << "#   written by `rankscope keygen`; the layout of czmq's zcert\n\n"
      << "metadata\n"
      << "    name = \"" << key.name << "\"\n"
      << "    role = \"" << key.role << "\"\n"
      << "curve\n"
      << "    public-key = \"" << key.public_key << "\"\n";
  if (with_secret) out << "    secret-key = \"" << key.secret_key << "\"\n";
  return out.str();
}

Result<KeyFile> parse(std::string_view text, const std::string& where) {
  KeyFile key;
  std::istringstream in{std::string(text)};
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    std::string t = trim(line);
    if (t.empty() || t[0] == '#' || t == "metadata" || t == "curve") continue;
    size_t eq = t.find('=');
    if (eq == std::string::npos) continue;  // other zcert sections: ignored
    std::string name = trim(std::string_view(t).substr(0, eq));
    std::string value = trim(std::string_view(t).substr(eq + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
    auto bad_key = [&](const char* what) {
      return make_error(Errc::invalid_argument, where + " line " + std::to_string(number) + ": " + what +
                                                    " is not a 40-character Z85 key");
    };
    if (name == "public-key") {
      if (!is_z85(value)) return bad_key("public-key");
      key.public_key = value;
    } else if (name == "secret-key") {
      if (!is_z85(value)) return bad_key("secret-key");
      key.secret_key = value;
    } else if (name == "name") {
      key.name = value;
    } else if (name == "role") {
      key.role = value;
    }
  }
  if (key.public_key.empty())
    return make_error(Errc::invalid_argument, where + " has no public-key: not a key file (`rankscope keygen` writes them)");
  return key;
}

Result<KeyFile> read(const std::string& path) {
  std::ifstream file(path);
  if (!file) return make_error(Errc::io, "cannot read key file " + path + ": " + std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (text.size() > 64 * 1024) return make_error(Errc::invalid_argument, path + " is too large to be a key file");
  return parse(text, path);
}

Result<void> write(const std::string& prefix, const KeyFile& key, bool overwrite) {
  if (auto r = write_file(prefix + ".key", format(key, true), 0600, overwrite); !r) return r;
  return write_file(prefix + ".pub", format(key, false), 0644, overwrite);
}

Result<ClientKeys> load_client_keys(const std::string& key_file, const std::string& collector_key_file) {
  if (!available())
    return make_error(Errc::unsupported_version,
                      "this libzmq was built without CurveZMQ; install Debian's libzmq5 or pass --insecure");
  auto own = read(key_file);
  if (!own) return own.error();
  if (own->secret_key.empty())
    return make_error(Errc::invalid_argument, key_file + " holds no secret-key: give the .key file, not the .pub");
  auto server = read(collector_key_file);
  if (!server) return server.error();
  return ClientKeys{own->public_key, own->secret_key, server->public_key};
}

void apply(zmq::socket_t& socket, const ClientKeys& keys) {
  if (!keys.enabled()) return;
  socket.set(zmq::sockopt::curve_serverkey, keys.server_key);
  socket.set(zmq::sockopt::curve_publickey, keys.public_key);
  socket.set(zmq::sockopt::curve_secretkey, keys.secret_key);
}

void apply_server(zmq::socket_t& socket, const KeyFile& key, const std::string& zap_domain) {
  socket.set(zmq::sockopt::curve_server, 1);
  socket.set(zmq::sockopt::curve_secretkey, key.secret_key);
  socket.set(zmq::sockopt::zap_domain, zap_domain);
}

std::string z85_of(std::string_view binary32) {
  if (binary32.size() != 32) return {};
  char out[41] = {};
  zmq_z85_encode(out, reinterpret_cast<const uint8_t*>(binary32.data()), 32);
  return out;
}

}  // namespace rankscope::curve
