#include "collector/service.h"

namespace rankscope::collector {

Service::Service(TimelineStore& store, const Clock& clock, ServiceOptions options)
    : Service(store, std::make_unique<StoreTarget>(store), nullptr, clock, options) {}

Service::Service(TimelineStore& store, CommitTarget& target, const Clock& clock, ServiceOptions options)
    : Service(store, nullptr, &target, clock, options) {}

Service::Service(TimelineStore& store, std::unique_ptr<CommitTarget> own_target, CommitTarget* target,
                 const Clock& clock, ServiceOptions options)
    : store_(store),
      own_target_(std::move(own_target)),
      options_(options),
      commit_(target ? *target : *own_target_, options.max_commit_backlog_bytes),
      ingest_(store, commit_, clock),
      detector_(ingest_.model(), matcher_, findings_, clock, options.detect),
      links_(ingest_.model(), findings_, options.links),
      detail_(ingest_.model(), findings_, links_, options.detail),
      refiner_(ingest_.model()),
      ledger_(ingest_.model(), matcher_, store, options.usage) {
  // The ingest joined the commit first; then the findings, then the ledger.
  commit_.join(finding_writer_);
  commit_.join(ledger_);
  ingest_.add_observer(&matcher_);
  ingest_.add_observer(&refiner_);
  ingest_.add_observer(&ledger_);
  ingest_.add_observer(&gpu_matcher_);
  ingest_.add_observer(&detector_);  // host waits on the GPU (its records come through the matcher)
  matcher_.subscribe(refiner_);
  gpu_matcher_.subscribe(detector_);
  gpu_matcher_.subscribe(links_);
  gpu_matcher_.subscribe(detail_);
}

Result<void> Service::restore() {
  for (auto restored : {ingest_.restore(), finding_writer_.restore(store_), ledger_.restore()})
    if (!restored) return restored;
  return {};
}

void Service::evaluate(uint64_t now_ns) {
  ingest_.retire(now_ns, options_.retire_after_ns);
  ingest_.adjust_clocks(refiner_.update(), now_ns);
  matcher_.sweep(ingest_.comms());
  gpu_matcher_.sweep(ingest_.comms());
  detector_.evaluate(now_ns);
  links_.evaluate(now_ns);
  detail_.evaluate(now_ns);
  ingest_.set_detail_wanted(detail_.by_node());
  ledger_.tick(now_ns, findings_.open());
}

void Service::score_some(uint64_t now_ns) {
  // About 5-10 ms of scoring between two rounds of batches (a collective is scored whole).
  constexpr size_t kMembersBetweenBatches = 16'384;
  detector_.score_some(now_ns, kMembersBetweenBatches);
}

Result<void> Service::stop(uint64_t now_ns) {
  ledger_.tick(now_ns, findings_.open());
  return commit_.run(now_ns, true);
}

}  // namespace rankscope::collector
