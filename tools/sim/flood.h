#pragma once
// The collector's scale benchmark: an N-rank job's batches (real model,
// real encoding, one agent connection per node) built ahead of time and
// sent as fast as the collector acknowledges them (each node keeps a few
// unacked, as the agent's queue would after an outage); then its memory and
// query latencies.
#include <cstdint>
#include <string>

namespace rankscope::sim {

struct FloodOptions {
  std::string collector = "tcp://127.0.0.1:7600";
  std::string query = "tcp://127.0.0.1:7601";
  int ranks = 512;
  int steps = 30;
  int steps_per_batch = 1;    // 1 s steps: one batch per node and second
  int history_steps = 3600;   // a one-node job with an hour of 1 s steps, for the timeline query
  int collector_pid = 0;
  bool columns =
      false;  // batches as to a collector that does not read them compact (CollectiveColumns, not compressed)
  uint64_t seed = 1;
};

int run_flood(const FloodOptions& options);

}  // namespace rankscope::sim
