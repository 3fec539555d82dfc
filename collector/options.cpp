#include "collector/options.h"

#include <boost/program_options.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>

#include "common/log.h"
#include "common/options_text.h"

namespace rankscope::collector {

namespace po = boost::program_options;

namespace {
constexpr double kMaxTimeoutS = 7 * 24 * 3600.0;  // a week: longer is a typo, and would overflow nanoseconds
constexpr uint32_t kMinLivenessMs = 100, kMaxLivenessMs = 24 * 3600 * 1000;

po::options_description describe(Options& options) {
  po::options_description desc(
      "rankscope-collector: the central collector of rankscope. Node agents send it their NCCL traces; the "
      "rankscope CLI asks it questions.\n\nUsage: rankscope-collector [options]\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("config", po::value<std::string>(), "read options from this file (key = value, same names as the flags)")
    ("listen", po::value(&options.listen)->default_value(options.listen), "ZeroMQ endpoint the agents connect to")
    ("query", po::value(&options.query)->default_value(options.query), "ZeroMQ endpoint the CLI connects to")
    ("clock-listen", po::value(&options.clock_listen)->default_value(options.clock_listen), "ZeroMQ endpoint where clock probes are answered on a thread of their own (agents reach its port at --listen's host): auto (--listen's address, any free port), none (on the agents' socket), or tcp://HOST:PORT (fixed, for a firewall or a Service)")
    ("db", po::value(&options.db)->default_value(options.db), "RocksDB directory (created if missing)")
    ("liveness-ms", po::value(&options.liveness_ms)->default_value(options.liveness_ms), "a node silent for longer is shown as disconnected (100 ms to 24 h)")
    ("hang-timeout-s", po::value(&options.hang_timeout_s)->default_value(options.hang_timeout_s), "ranks missing from a collective for this long are a hang (1 s to a week)")
    ("retire-after-s", po::value(&options.retire_after_s)->default_value(options.retire_after_s), "a communicator that is over (ended, or none of its processes alive) and quiet this long leaves the live model: `jobs` no longer lists it, its timeline stays (1 s to a week)")
    ("drain-after-jobs", po::value(&options.drain_after_jobs)->default_value(options.drain_after_jobs), "drain a Slurm node (scontrol update NodeName=N State=DRAIN) whose ranks straggled in this many jobs within --drain-window-h; 0: never (2 to 100)")
    ("drain-window-h", po::value(&options.drain_window_h)->default_value(options.drain_window_h), "the window of --drain-after-jobs, in hours (and a node is drained at most once in it)")
    ("drain-command", po::value(&options.drain_command)->default_value(options.drain_command), "the scontrol to run (found in PATH; it needs the collector host's Slurm configuration and munge)")
    ("drain-dry-run", po::bool_switch(&options.drain_dry_run), "log the scontrol command a drain would run, and do not run it")
    ("node-lost-timeout-s", po::value(&options.node_lost_timeout_s)->default_value(options.node_lost_timeout_s), "an agent silent for this long, with ranks running, is a lost node (3 s to a week)")
    ("metrics", po::value(&options.metrics), "serve Prometheus metrics on HOST:PORT (e.g. 0.0.0.0:9464)")
    ("alertmanager", po::value(&options.alertmanager), "push findings to this Alertmanager (http://HOST:PORT or https://HOST:PORT, API v2)")
    ("alertmanager-ca-file", po::value(&options.alertmanager_ca_file), "https: the CA certificate(s) that signed Alertmanager's (default: the system's)")
    ("alertmanager-cert-file", po::value(&options.alertmanager_cert_file), "https: a client certificate to present (mutual TLS), with --alertmanager-key-file")
    ("alertmanager-key-file", po::value(&options.alertmanager_key_file), "https: the client certificate's key")
    ("alertmanager-bearer-token-file", po::value(&options.alertmanager_bearer_token_file), "send the token in this file as Authorization: Bearer")
    ("alertmanager-basic-auth-user", po::value(&options.alertmanager_basic_auth_user), "basic auth as this user, with --alertmanager-password-file")
    ("alertmanager-password-file", po::value(&options.alertmanager_password_file), "the basic-auth password, in this file")
    ("log-level", po::value(&options.log_level)->default_value(options.log_level), "error, warn, info or debug")
    ("key", po::value(&options.key)->default_value(options.key), "the collector's CurveZMQ key pair (rankscope keygen --role collector)")
    ("allow", po::value(&options.allow)->default_value(options.allow), "directory of the agents' and clients' public key files admitted; re-read when it changes")
    ("insecure", po::bool_switch(&options.insecure), "plaintext and no authentication on both sockets (anyone can send data and read it): for tests and labs only")
    ("max-messages-per-s", po::value(&options.max_messages_per_s)->default_value(options.max_messages_per_s), "per key (per connection with --insecure): messages beyond this rate are dropped and counted (0: no limit)")
    ("max-bytes-per-s", po::value(&options.max_bytes_per_s)->default_value(options.max_bytes_per_s), "per key (per connection with --insecure): bytes beyond this rate are dropped and counted (0: no limit)")
    ("plain-batches", po::bool_switch(&options.plain_batches), "ask agents for batches as an older collector reads them: a block per communicator and rank, not compressed (about twice the bytes; to read the wire with capnp decode, or to compare)")
    ("retention", po::value(&options.retention), "remove timeline records older than this (e.g. 30d, 12h, 90m); default: keep")
    ("max-disk-bytes", po::value(&options.max_disk_bytes), "keep the database under this size (e.g. 500G, 64M), removing the oldest records first; default: no cap")
    ("db-memory-mb", po::value(&options.db_memory_mb)->default_value(options.db_memory_mb), "memory for the database's write buffers (memtables), all column families together (16 to 65536)")
    ("retention-check-s", po::value(&options.retention_check_s)->default_value(options.retention_check_s), "how often retention and the disk cap are enforced (1 s to 1 day)")
    ("etcd", po::value(&options.etcd), "share the fleet with other collectors through this etcd cluster (http[s]://HOST:PORT, comma-separated members); default: this collector is alone")
    ("etcd-prefix", po::value(&options.etcd_prefix)->default_value(options.etcd_prefix), "the fleet's keys in etcd (fleets sharing one etcd need their own)")
    ("etcd-ca-file", po::value(&options.etcd_ca_file), "https: the CA certificate(s) that signed etcd's")
    ("etcd-cert-file", po::value(&options.etcd_cert_file), "https: a client certificate for etcd (mutual TLS), with --etcd-key-file")
    ("etcd-key-file", po::value(&options.etcd_key_file), "https: the client certificate's key")
    ("collector-id", po::value(&options.collector_id), "this collector's name in the fleet, unique (default: HOST:PORT it is reached at for agents)")
    ("advertise", po::value(&options.advertise), "the host name or address other machines reach this collector at (default: --listen's address, else this machine's name)")
    ("lease-ttl-s", po::value(&options.lease_ttl_s)->default_value(options.lease_ttl_s), "a collector that stops renewing its etcd lease for this long leaves the fleet, and its jobs move (2 to 300)");
  // clang-format on
  return desc;
}

// `open_config` gives the stream to read for the file --config names (null: none).
template <typename OpenConfig>
Result<CommandLine> parse(int argc, const char* const* argv, OpenConfig open_config) {
  CommandLine line;
  po::options_description desc = describe(line.options);
  for (int i = 1; i < argc; ++i)
    if (auto r = check_no_placeholders(argv[i], "argument " + std::to_string(i)); !r) return r.error();
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    std::string config = vm.count("config") ? vm["config"].as<std::string>() : "";
    auto file = open_config(config);
    if (!file) return file.error();
    if (*file) {
      std::string text(std::istreambuf_iterator<char>(**file), {});
      if (auto r = check_no_placeholders(text, "config file " + config); !r) return r.error();
      std::istringstream stream(text);
      po::store(po::parse_config_file(stream, desc), vm);
    }
    po::notify(vm);
  } catch (const std::exception& e) {
    return make_error(Errc::invalid_argument, e.what());
  }
  line.help = vm.count("help") > 0;
  if (line.help) return line;
  if (auto valid = validate(line.options); !valid) return valid.error();
  return line;
}
}  // namespace

std::string usage() {
  Options options;
  std::ostringstream out;
  out << describe(options);
  return out.str();
}

Result<CommandLine> parse_command_line(int argc, const char* const* argv) {
  std::unique_ptr<std::ifstream> file;
  return parse(argc, argv, [&](const std::string& name) -> Result<std::istream*> {
    if (name.empty()) return static_cast<std::istream*>(nullptr);
    file = std::make_unique<std::ifstream>(name);
    if (!*file) return make_error(Errc::io, "cannot read config file " + name);
    return static_cast<std::istream*>(file.get());
  });
}

Result<CommandLine> parse_command_line(int argc, const char* const* argv, std::istream* config) {
  return parse(argc, argv, [&](const std::string&) -> Result<std::istream*> { return config; });
}

Result<uint64_t> parse_age_ns(const std::string& text) {
  if (text.empty()) return uint64_t{0};
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  double scale = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : unit == "d" ? 86400 : 0;
  // !(x >= 0) also refuses NaN; ten years is far past any use and within 64-bit nanoseconds.
  if (used == 0 || scale == 0 || !(value >= 0) || value * scale > 10 * 365 * 86400.0)
    return make_error(Errc::invalid_argument, "'" + text + "' is not an age: a number with s, m, h or d (e.g. 30d)");
  return static_cast<uint64_t>(value * scale * 1e9);
}

Result<uint64_t> parse_bytes(const std::string& text) {
  if (text.empty()) return uint64_t{0};
  size_t used = 0;
  unsigned long long value = 0;
  try {
    if (text[0] != '-') value = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  if (unit.size() == 2 && (unit[1] == 'B' || unit[1] == 'b')) unit.pop_back();
  int shift = unit.empty() ? 0 : unit == "K" || unit == "k" ? 10 : unit == "M" ? 20 : unit == "G" ? 30 : unit == "T" ? 40 : -1;
  if (used == 0 || shift < 0 || value > (UINT64_MAX >> shift))
    return make_error(Errc::invalid_argument, "'" + text + "' is not a size: bytes, or a number with K, M, G or T");
  return static_cast<uint64_t>(value) << shift;
}

uint64_t Options::retention_ns() const {
  auto parsed = parse_age_ns(retention);
  return parsed ? *parsed : 0;
}

uint64_t Options::max_disk() const {
  auto parsed = parse_bytes(max_disk_bytes);
  return parsed ? *parsed : 0;
}

Result<void> validate(const Options& o) {
  if (!log::parse_level(o.log_level)) return make_error(Errc::invalid_argument, "--log-level must be error, warn, info or debug");
  for (const auto& [name, value] : {std::pair{"--listen", &o.listen}, {"--query", &o.query}, {"--db", &o.db}})
    if (value->empty()) return make_error(Errc::invalid_argument, std::string(name) + " must not be empty");
  if (o.clock_listen != "auto" && o.clock_listen != "none" && o.clock_listen.rfind("tcp://", 0) != 0)
    return make_error(Errc::invalid_argument,
                      "--clock-listen takes auto, none or tcp://HOST:PORT, not '" + o.clock_listen + "'");
  if (o.liveness_ms < kMinLivenessMs || o.liveness_ms > kMaxLivenessMs)
    return make_error(Errc::invalid_argument, "--liveness-ms must be between 100 and 86400000 (24 h)");
  // !(x >= min) also refuses NaN.
  if (!(o.hang_timeout_s >= 1) || !(o.hang_timeout_s <= kMaxTimeoutS))
    return make_error(Errc::invalid_argument,
                      "--hang-timeout-s must be between 1 and 604800 (a week); collectives legitimately take "
                      "milliseconds to seconds");
  if (o.drain_after_jobs == 1 || o.drain_after_jobs > 100)
    return make_error(Errc::invalid_argument,
                      "--drain-after-jobs must be 0 (off) or between 2 and 100: one slow job can be the job's own doing");
  if (!(o.drain_window_h >= 1) || !(o.drain_window_h <= 24 * 30))
    return make_error(Errc::invalid_argument, "--drain-window-h must be between 1 and 720 (30 days)");
  if (o.drain_after_jobs > 0 && o.drain_command.empty())
    return make_error(Errc::invalid_argument, "--drain-command must not be empty");
  if (!(o.retire_after_s >= 1) || !(o.retire_after_s <= kMaxTimeoutS))
    return make_error(Errc::invalid_argument, "--retire-after-s must be between 1 and 604800 (a week)");
  if (!(o.node_lost_timeout_s >= 3) || !(o.node_lost_timeout_s <= kMaxTimeoutS))
    return make_error(Errc::invalid_argument,
                      "--node-lost-timeout-s must be between 3 (agents send a heartbeat every second) and 604800 (a week)");
  if (!o.insecure)
    for (const auto& [name, value] : {std::pair{"--key", &o.key}, {"--allow", &o.allow}})
      if (value->empty())
        return make_error(Errc::invalid_argument, std::string(name) + " must not be empty (or pass --insecure)");
  if (auto age = parse_age_ns(o.retention); !age)
    return make_error(Errc::invalid_argument, "--retention: " + age.error().message);
  else if (*age != 0 && *age < 1'000'000'000ull)
    return make_error(Errc::invalid_argument, "--retention must be at least 1s (or 0: keep everything)");
  if (auto cap = parse_bytes(o.max_disk_bytes); !cap)
    return make_error(Errc::invalid_argument, "--max-disk-bytes: " + cap.error().message);
  else if (*cap != 0 && *cap < (1ull << 20))
    return make_error(Errc::invalid_argument, "--max-disk-bytes must be at least 1M (RocksDB needs room for its logs)");
  if (o.db_memory_mb < 16 || o.db_memory_mb > 65536)
    return make_error(Errc::invalid_argument, "--db-memory-mb must be between 16 and 65536");
  if (o.retention_check_s < 1 || o.retention_check_s > 86400)
    return make_error(Errc::invalid_argument, "--retention-check-s must be between 1 and 86400");
  const bool alertmanager_extras = !o.alertmanager_ca_file.empty() || !o.alertmanager_cert_file.empty() ||
                                   !o.alertmanager_key_file.empty() || !o.alertmanager_bearer_token_file.empty() ||
                                   !o.alertmanager_basic_auth_user.empty() || !o.alertmanager_password_file.empty();
  if (alertmanager_extras && o.alertmanager.empty())
    return make_error(Errc::invalid_argument, "the --alertmanager-* options need --alertmanager URL");
  if (o.alertmanager_cert_file.empty() != o.alertmanager_key_file.empty())
    return make_error(Errc::invalid_argument, "--alertmanager-cert-file and --alertmanager-key-file go together");
  if (o.alertmanager_basic_auth_user.empty() != o.alertmanager_password_file.empty())
    return make_error(Errc::invalid_argument,
                      "--alertmanager-basic-auth-user and --alertmanager-password-file go together");
  if (!o.alertmanager_bearer_token_file.empty() && !o.alertmanager_basic_auth_user.empty())
    return make_error(Errc::invalid_argument, "give Alertmanager a bearer token or basic auth, not both");
  const bool etcd_extras = !o.etcd_ca_file.empty() || !o.etcd_cert_file.empty() || !o.etcd_key_file.empty() ||
                           !o.collector_id.empty() || !o.advertise.empty();
  if (etcd_extras && o.etcd.empty())
    return make_error(Errc::invalid_argument, "--etcd-*, --collector-id and --advertise need --etcd (a fleet)");
  if (o.etcd_cert_file.empty() != o.etcd_key_file.empty())
    return make_error(Errc::invalid_argument, "--etcd-cert-file and --etcd-key-file go together");
  if (o.etcd_prefix.empty() || o.etcd_prefix.front() != '/' || o.etcd_prefix.back() != '/')
    return make_error(Errc::invalid_argument, "--etcd-prefix must start and end with '/' (e.g. /rankscope/)");
  if (o.collector_id.size() > 128 ||
      o.collector_id.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-") !=
          std::string::npos)
    return make_error(Errc::invalid_argument, "--collector-id takes up to 128 letters, digits and . _ : -");
  if (o.lease_ttl_s < 2 || o.lease_ttl_s > 300)
    return make_error(Errc::invalid_argument, "--lease-ttl-s must be between 2 and 300");
  if (o.advertise.size() > 253 ||
      o.advertise.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-:[]") !=
          std::string::npos ||
      (o.advertise.find(':') != std::string::npos && o.advertise.front() != '['))
    return make_error(Errc::invalid_argument,
                      "--advertise takes a host name or an address (an IPv6 address in brackets: [fd00::5])");
  if (!o.etcd.empty()) {
    // Other collectors and clients reach this one by the address its
    // record gives; one bound to loopback only by a loopback address (a
    // fleet on one machine).
    auto loopback = [](const std::string& host) {
      return host.rfind("127.", 0) == 0 || host == "localhost" || host == "[::1]";
    };
    for (const auto& [name, endpoint] : {std::pair{"--listen", &o.listen}, {"--query", &o.query}}) {
      if (endpoint->rfind("tcp://", 0) != 0)
        return make_error(Errc::invalid_argument, std::string("--etcd needs ") + name + " on tcp://HOST:PORT");
      const std::string host = endpoint->substr(6, endpoint->rfind(':') - 6);
      if (loopback(host) && !loopback(o.advertise))
        return make_error(
            Errc::invalid_argument,
            std::string(name) + " " + *endpoint +
                " listens on loopback, which no other machine reaches: with --etcd listen on an "
                "address they can (e.g. tcp://0.0.0.0:7601); only a fleet on one machine (--advertise 127.0.0.1) may");
    }
  }
  return {};
}

}  // namespace rankscope::collector
