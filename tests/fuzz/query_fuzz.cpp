// Fuzz target: what a client (or anything that reaches the query port)
// sends the collector. Each input is one request, answered by the real query
// service (answer_query: read_packed with the query limits, then status,
// jobs, timeline and findings) from a small real state: two nodes whose
// ranks ran collectives on one communicator into a real RocksDB, rank 1
// stopped behind rank 0 long enough to be a hang finding.
//
// Besides the sanitizers, it checks that every reply is a readable message.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string_view>

#include "collector/query.h"
#include "collector/service.h"
#include "common/log.h"
#include "proto/codec.h"
#include "tests/fuzz/fuzz_store.h"
#include "tests/fuzz/samples.h"

using namespace rankscope;

namespace {
struct World {
  fuzz::FuzzStore store;
  fuzz::ManualClock clock;
  collector::Service service{store.store(), clock, collector::ServiceOptions{}};
  collector::Ingest& ingest = service.ingest();
  collector::FindingBook& findings = service.findings();
  collector::QueryContext context{ingest, store.store(), findings, clock, 5'000'000'000ull};

  World() {
    collector::Outbox out;
    ingest.on_agent_message("conn-a", fuzz::hello("node-a", 1), out);
    ingest.on_agent_message("conn-b", fuzz::hello("node-b", 2), out);
    ingest.on_agent_message("conn-a", fuzz::batch(1, 0, 0, 40, 1), out);
    ingest.on_agent_message("conn-b", fuzz::batch(1, 1, 0, 25, 2), out);
    ingest.on_agent_message("conn-a", fuzz::heartbeat(100, true, false), out);
    ingest.on_agent_message("conn-b", fuzz::heartbeat(101, true, true), out);
    for (int i = 0; i < 4; ++i) {
      clock.now += 31'000'000'000ull;
      service.evaluate(clock.now);
    }
    if (auto committed = service.commit().run(clock.now); !committed) {
      fprintf(stderr, "query fuzz: %s\n", committed.error().message.c_str());
      abort();
    }
    if (ingest.comms().empty() || findings.all().empty()) {
      fprintf(stderr, "query fuzz: the state to query has no communicator or no finding; fix the samples\n");
      abort();
    }
  }
};
World* world = nullptr;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  log::set_level(log::Level::error);
  world = new World;  // lives as long as the process; its store folder goes in its destructor at exit
  atexit([] { delete world; });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string reply = collector::answer_query(std::string_view(reinterpret_cast<const char*>(data), size), world->context);
  auto read = proto::read_packed<proto::query::Reply>(reply, proto::ReadLimits{}, [](auto) {});
  if (!read) {
    fprintf(stderr, "the collector's reply is unreadable: %s\n", read.error().message.c_str());
    abort();
  }
  return 0;
}
