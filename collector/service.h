#pragma once
// The collector's stages, built and wired once, in flow order:
//
//   agents' messages -> ingest (decode, check, apply to the model, stage
//   the records) -> matcher (collectives across ranks) -> detector
//   (findings), clock refiner (node offsets), usage ledger (who waited on
//   whom, GPU-hours) -> one commit for every writer -> acks, outputs.
//
// One commit for every writer (collector/commit.h): the ingest first, then
// the findings and the ledger. The model and the findings are restored
// before anything observes them. Records reach the matcher first, then the
// clock refiner (waits) and the ledger; the matcher's events reach the
// detector, the clock refiner and the ledger. The socket loop
// (collector.cpp) and the tests drive the same object.
#include <cstdint>
#include <memory>

#include "collector/commit.h"
#include "collector/detect/detail.h"
#include "collector/detect/detector.h"
#include "collector/detect/finding_store.h"
#include "collector/detect/findings.h"
#include "collector/detect/link.h"
#include "collector/ingest/ingest.h"
#include "collector/match/matcher.h"
#include "collector/model/clock_refine.h"
#include "collector/store/timeline_store.h"
#include "collector/usage/ledger.h"
#include "common/clock.h"
#include "common/result.h"

namespace rankscope::collector {

struct ServiceOptions {
  DetectOptions detect;
  LinkOptions links;
  DetailOptions detail;
  UsageOptions usage;
  uint64_t retire_after_ns = 600'000'000'000ull;  // quiet communicators that are over leave the live model (Ingest::retire)
  uint64_t max_commit_backlog_bytes = Commit::kMaxBacklogBytes;  // while commits fail (Commit::holding)
};

class Service {
 public:
  // Commits go to `store`.
  Service(TimelineStore& store, const Clock& clock, ServiceOptions options);
  // Commits go to `target` (a test's store whose disk fails); reads from `store`.
  Service(TimelineStore& store, CommitTarget& target, const Clock& clock, ServiceOptions options);
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  // Reads back what the database holds (the model, the findings, the
  // ledger's open rows); an error says which part could not be read.
  Result<void> restore();
  // Retires quiet communicators, refines the clocks, drops what the matcher
  // holds of communicators gone, judges, and bills: the periodic pass.
  void evaluate(uint64_t now_ns);
  // Between evaluations, a bounded share of what evaluate() would score
  // (Detector::score_some): the loop calls it between batches.
  void score_some(uint64_t now_ns);
  // What the ledger counted since its last flush, then one last commit.
  Result<void> stop(uint64_t now_ns);

  Commit& commit() { return commit_; }
  Ingest& ingest() { return ingest_; }
  const Ingest& ingest() const { return ingest_; }
  FindingBook& findings() { return findings_; }
  CollectiveMatcher& matcher() { return matcher_; }
  Detector& detector() { return detector_; }
  LinkDetector& links() { return links_; }
  const DetailPolicy& detail() const { return detail_; }
  UsageLedger& ledger() { return ledger_; }

 private:
  Service(TimelineStore& store, std::unique_ptr<CommitTarget> own_target, CommitTarget* target, const Clock& clock,
          ServiceOptions options);

  TimelineStore& store_;
  std::unique_ptr<CommitTarget> own_target_;  // a StoreTarget, when commits go to the store
  ServiceOptions options_;
  Commit commit_;
  Ingest ingest_;
  FindingBook findings_;
  FindingWriter finding_writer_{findings_};
  CollectiveMatcher matcher_;
  GpuMatcher gpu_matcher_;
  Detector detector_;
  LinkDetector links_;
  DetailPolicy detail_;
  ClockRefiner refiner_;
  UsageLedger ledger_;
};

}  // namespace rankscope::collector
