#pragma once
// The collector's options: flags, and the same names in a config file.
#include <cstdint>
#include <istream>
#include <string>

#include "common/result.h"

namespace rankscope::collector {

struct Options {
  std::string listen = "tcp://0.0.0.0:7600";      // agents connect here (ZeroMQ ROUTER)
  std::string query = "tcp://127.0.0.1:7601";     // the CLI connects here
  // Clock probes on a thread of their own (collector/clock_responder.h):
  // "auto" (--listen's host, any free port), "none", or an endpoint.
  std::string clock_listen = "auto";
  std::string db = "/var/lib/rankscope/db";       // RocksDB directory
  uint32_t liveness_ms = 5000;                    // a node silent for longer is shown as disconnected
  double hang_timeout_s = 30;                     // ranks missing from a collective this long: a hang
  double node_lost_timeout_s = 15;                // an agent silent this long: node_lost
  // A communicator over (ended, or no process of it alive) and quiet this
  // long leaves the live model (Ingest::retire); its timeline stays.
  double retire_after_s = 600;
  std::string metrics;                            // HOST:PORT for Prometheus; empty: off
  std::string alertmanager;                       // http[s]://HOST:PORT of an Alertmanager; empty: off
  // Reaching it: the CA that signed its certificate, a client certificate,
  // and a bearer token or a basic-auth user, secrets in files.
  std::string alertmanager_ca_file, alertmanager_cert_file, alertmanager_key_file;
  std::string alertmanager_bearer_token_file, alertmanager_basic_auth_user, alertmanager_password_file;
  std::string log_level = "info";
  // Who may connect (collector/auth.h, docs/operations.md "Keys").
  std::string key = "/etc/rankscope/collector.key";  // the collector's CurveZMQ key pair
  std::string allow = "/etc/rankscope/allowed";      // directory of admitted agents' and clients' .pub files
  bool insecure = false;                             // plaintext, anyone admitted: tests and labs only
  // Per connection, on both sockets: more than this is dropped (0: no limit).
  uint32_t max_messages_per_s = 2000;
  uint64_t max_bytes_per_s = 64ull << 20;
  // Ask agents for batches as an older collector reads them (no table, not compressed).
  bool plain_batches = false;
  // Retention: records older than this go ("" or "0": kept); the database
  // stays under max_disk_bytes ("" or "0": no cap), oldest records first.
  std::string retention;                             // e.g. 30d, 12h, 90m, 3600s
  std::string max_disk_bytes;                        // e.g. 500G, 64M, 1048576
  uint32_t retention_check_s = 60;                   // how often retention and the cap are enforced
  uint32_t db_memory_mb = 256;                       // RocksDB memtables, all column families
  // Opt-in: drain a Slurm node that straggled in this many jobs within the
  // window (collector/alert/drain.h); 0: off.
  uint32_t drain_after_jobs = 0;
  double drain_window_h = 24;
  std::string drain_command = "scontrol";
  bool drain_dry_run = false;
  // A fleet of collectors sharing the nodes through etcd (collector/fleet/);
  // empty `etcd`: this collector is alone.
  std::string etcd;                         // http[s]://HOST:PORT[,...] of etcd's members
  std::string etcd_prefix = "/rankscope/";  // this fleet's keys
  std::string etcd_ca_file, etcd_cert_file, etcd_key_file;
  std::string collector_id;  // unique in the fleet; "": HOST:PORT of --advertise and --listen
  std::string advertise;     // the host others reach this collector at; "": --listen's, else
                             // this machine's name
  uint32_t lease_ttl_s = 5;  // a collector silent this long leaves the fleet

  // The timeouts in nanoseconds; valid once validate() accepted the options.
  uint64_t hang_timeout_ns() const { return static_cast<uint64_t>(hang_timeout_s * 1e9); }
  uint64_t node_lost_timeout_ns() const { return static_cast<uint64_t>(node_lost_timeout_s * 1e9); }
  uint64_t retire_after_ns() const { return static_cast<uint64_t>(retire_after_s * 1e9); }
  uint64_t liveness_ns() const { return static_cast<uint64_t>(liveness_ms) * 1'000'000ull; }
  // Valid once validate() accepted the options; 0: off.
  uint64_t retention_ns() const;
  uint64_t max_disk() const;
};

// What a command line asked for.
struct CommandLine {
  Options options;
  bool help = false;  // --help: print usage() and stop
};

// The text --help prints.
std::string usage();

// Parses the flags and the config file that --config names (a flag wins over
// the same key in the file), then checks every value. Never throws: an error
// carries a message for the user, without the program's name.
Result<CommandLine> parse_command_line(int argc, const char* const* argv);
// The same with the config file's contents already at hand (`config` may be
// null: no file); the name --config gives is not opened.
Result<CommandLine> parse_command_line(int argc, const char* const* argv, std::istream* config);
// "30d", "12h", "90m", "45s", "3600" (seconds) -> nanoseconds; "" and "0" -> 0.
Result<uint64_t> parse_age_ns(const std::string& text);
// "500G", "64M", "4K", "1048576" (bytes; powers of 1024) -> bytes; "" and "0" -> 0.
Result<uint64_t> parse_bytes(const std::string& text);

// Checks the ranges and forms of the values (done by parse_command_line).
Result<void> validate(const Options& options);

}  // namespace rankscope::collector
