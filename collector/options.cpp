#include "collector/options.h"

#include <boost/program_options.hpp>

#include <cmath>
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
    ("db", po::value(&options.db)->default_value(options.db), "RocksDB directory (created if missing)")
    ("liveness-ms", po::value(&options.liveness_ms)->default_value(options.liveness_ms), "a node silent for longer is shown as disconnected (100 ms to 24 h)")
    ("hang-timeout-s", po::value(&options.hang_timeout_s)->default_value(options.hang_timeout_s), "ranks missing from a collective for this long are a hang (1 s to a week)")
    ("node-lost-timeout-s", po::value(&options.node_lost_timeout_s)->default_value(options.node_lost_timeout_s), "an agent silent for this long, with ranks running, is a lost node (3 s to a week)")
    ("metrics", po::value(&options.metrics), "serve Prometheus metrics on HOST:PORT (e.g. 0.0.0.0:9464)")
    ("alertmanager", po::value(&options.alertmanager), "push findings to this Alertmanager (http://HOST:PORT, API v2)")
    ("log-level", po::value(&options.log_level)->default_value(options.log_level), "error, warn, info or debug");
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

Result<void> validate(const Options& o) {
  if (!log::parse_level(o.log_level)) return make_error(Errc::invalid_argument, "--log-level must be error, warn, info or debug");
  for (const auto& [name, value] : {std::pair{"--listen", &o.listen}, {"--query", &o.query}, {"--db", &o.db}})
    if (value->empty()) return make_error(Errc::invalid_argument, std::string(name) + " must not be empty");
  if (o.liveness_ms < kMinLivenessMs || o.liveness_ms > kMaxLivenessMs)
    return make_error(Errc::invalid_argument, "--liveness-ms must be between 100 and 86400000 (24 h)");
  // !(x >= min) also refuses NaN.
  if (!(o.hang_timeout_s >= 1) || !(o.hang_timeout_s <= kMaxTimeoutS))
    return make_error(Errc::invalid_argument,
                      "--hang-timeout-s must be between 1 and 604800 (a week); collectives legitimately take "
                      "milliseconds to seconds");
  if (!(o.node_lost_timeout_s >= 3) || !(o.node_lost_timeout_s <= kMaxTimeoutS))
    return make_error(Errc::invalid_argument,
                      "--node-lost-timeout-s must be between 3 (agents send a heartbeat every second) and 604800 (a week)");
  return {};
}

}  // namespace rankscope::collector
