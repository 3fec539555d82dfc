// Fuzz target: what an agent (or anything that reaches the agent port) sends
// the collector. One input is one connection's messages (split at
// kMessageSeparator), each fed as packed bytes through the collector's real
// ingest path (Ingest::on_agent_message: read_packed with the wire limits,
// hello, batch decoding and validation, heartbeats, clock probes) on a real
// RocksDB, with the real detectors and clock refiner watching, then
// evaluated and committed as the collector loop does. A connection that said
// hello first is what a deep input needs, so one valid Hello always comes
// first; the input may say hello again.
//
// Besides the sanitizers, it checks that every reply the collector would
// send back is itself a readable message.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "collector/clock_refine.h"
#include "collector/detect/detector.h"
#include "collector/detect/findings.h"
#include "collector/ingest.h"
#include "common/log.h"
#include "proto/codec.h"
#include "tests/fuzz/fuzz_store.h"
#include "tests/fuzz/samples.h"

using namespace rankscope;

namespace {
constexpr const char* kConnection = "fuzz-connection";
constexpr size_t kInputsPerDatabase = 4096;

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
  collector::Ingest ingest(store.store(), clock);
  collector::FindingBook findings;
  collector::Detector detector(ingest, findings, clock, collector::DetectOptions{});
  collector::ClockRefiner refiner(ingest);
  ingest.add_observer(&detector);
  ingest.add_observer(&refiner);

  collector::Outbox out;
  ingest.on_agent_message(kConnection, fuzz::hello("node-a"), out);
  std::string_view input(reinterpret_cast<const char*>(data), size);
  for (std::string_view message : fuzz::split_messages(input)) {
    ingest.on_agent_message(kConnection, message, out);
    clock.now += 100'000'000;
  }
  // One turn of the collector loop: detectors, findings into the write set, commit.
  refiner.update();
  detector.evaluate(clock.now);
  clock.now += 60'000'000'000ull;  // past the hang and node-lost timeouts
  detector.evaluate(clock.now);
  findings.persist(ingest.pending_writes());
  (void)ingest.commit();

  for (const auto& [id, bytes] : out.now) check_reply(bytes);
  for (const auto& [id, bytes] : out.after_commit) check_reply(bytes);
  return 0;
}
