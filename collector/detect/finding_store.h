#pragma once
// The findings in the database: each one as a Cap'n Proto `Finding` (the
// query's own message, so a stored finding reads back as it is served),
// written with the commit that follows its change and read back at start.
#include <cstdint>
#include <string>

#include "collector/commit.h"
#include "collector/detect/findings.h"
#include "collector/store/timeline_store.h"
#include "common/result.h"
#include "proto/query.capnp.h"

namespace rankscope::collector {

// Takes part in the commit for the book: what changed since the last stage.
class FindingWriter final : public CommitParticipant {
 public:
  explicit FindingWriter(FindingBook& book) : book_(book) {}
  // Reads every stored finding back into the book.
  Result<void> restore(const TimelineStore& store);
  Result<void> stage(WriteSet& writes, uint64_t now_ns, bool final) override;

 private:
  FindingBook& book_;
};

void fill_finding(const Finding& finding, proto::query::Finding::Builder out);
std::string encode_finding(const Finding& finding);
Result<Finding> decode_finding(const std::string& bytes);

}  // namespace rankscope::collector
