// Fuzz target: what agents (or anything that reaches the agent port) send
// the collector. One input is a sequence of messages (split at
// kMessageSeparator) from two nodes, node-a and node-b, each on its own
// connection bound to its own key as CurveZMQ binds them; each message's
// first byte routes it (tests/fuzz/samples.h: which node, whether with the
// other node's key, whether a commit round follows). Each goes through the
// collector's real ingest path (Ingest::on_agent_message: read_packed with
// the wire limits, hello, batch decoding and validation, the communicator
// bindings, heartbeats, clock probes) on a real RocksDB, with every observer
// watching: the detectors, the clock refiner and the usage ledger. A commit
// round is the collector loop's: retire, refit, evaluate, tick the ledger, persist
// findings and ledger rows, commit. At the end a second collector restores
// from the same database and evaluates what it restored (a crash on replay
// would take the collector down at every restart).
//
// Besides the sanitizers, it checks that every reply the collector would
// send back is itself a readable message.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "collector/service.h"
#include "common/log.h"
#include "proto/codec.h"
#include "tests/fuzz/fuzz_store.h"
#include "tests/fuzz/samples.h"

using namespace rankscope;

namespace {
constexpr const char* kConnections[] = {"connection-a", "connection-b"};
constexpr size_t kInputsPerDatabase = 256;  // each input restores the database: keep it small
// Communicators over and quiet this long retire (the last rounds, a minute
// on, retire what the input ended or whose processes it said exited).
constexpr uint64_t kRetireAfterNs = 30'000'000'000ull;

void check_reply(const std::string& bytes) {
  auto read = proto::read_packed<proto::wire::CollectorMessage>(bytes, proto::ReadLimits{}, [](auto) {});
  if (!read) {
    fprintf(stderr, "the collector's reply is unreadable: %s\n", read.error().message.c_str());
    abort();
  }
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  log::set_level(log::Level::error);  // bad input is logged at warn: keep the fuzzer fast
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::FuzzStore store;
  static size_t inputs = 0;
  if (++inputs % kInputsPerDatabase == 0) store.reset();

  fuzz::ManualClock clock;
  collector::Outbox out;
  {
    collector::ServiceOptions options;
    options.retire_after_ns = kRetireAfterNs;
    collector::Service service(store.store(), clock, options);
    collector::Ingest& ingest = service.ingest();
    auto round = [&] {
      service.evaluate(clock.now);
      (void)service.commit().run(clock.now, true);
    };

    const char* const nodes[] = {"node-a", "node-b"};
    ingest.on_agent_message(kConnections[0], fuzz::hello(nodes[0]), out, nodes[0]);
    ingest.on_agent_message(kConnections[1], fuzz::hello(nodes[1], fuzz::kInstance + 1), out, nodes[1]);
    std::string_view input(reinterpret_cast<const char*>(data), size);
    for (std::string_view message : fuzz::split_messages(input)) {
      if (message.empty()) continue;
      uint8_t route = static_cast<uint8_t>(message.front());
      message.remove_prefix(1);
      int node = route & fuzz::kNodeB ? 1 : 0;
      int key = route & fuzz::kOtherKey ? 1 - node : node;
      ingest.on_agent_message(kConnections[node], message, out, nodes[key]);
      clock.now += 100'000'000;
      if (route & fuzz::kCommitAfter) round();
    }
    round();
    clock.now += 60'000'000'000ull;  // past the hang and node-lost timeouts
    round();
  }
  // A restart on the same database: restore, then look at what came back.
  {
    collector::Service service(store.store(), clock, collector::ServiceOptions{});
    if (service.restore()) {
      clock.now += 1'000'000'000ull;
      service.evaluate(clock.now);
    }
  }

  for (const auto& [id, bytes] : out.now) check_reply(bytes);
  for (const auto& [id, bytes] : out.after_commit) check_reply(bytes);
  return 0;
}
