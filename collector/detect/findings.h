#pragma once
// The book of findings: opened, updated and resolved by the detectors, one
// open finding per condition (Finding::key). What changed is written to the
// database with the next commit, and read back after a restart, by
// FindingWriter (detect/finding_store.h).
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "collector/detect/finding.h"
#include "common/result.h"

namespace rankscope::collector {

class FindingBook final {
 public:
  // Takes back the findings a database held (after a restart).
  void restore(std::vector<Finding> stored);

  // Opens a finding for f's condition, or updates the open one with f's
  // ranks, nodes, text and cost (keeping its id and opening time).
  const Finding& raise(Finding f, uint64_t now_ns);
  // Resolves the open finding with this key, if any.
  void resolve(const std::string& key, uint64_t now_ns);
  // An operator has seen finding `id`: marked acknowledged (once) and
  // resolved if open; the finding as it now stands, or not_found.
  Result<Finding> acknowledge(uint64_t id, const std::string& by, uint64_t now_ns);
  const Finding* open_finding(const std::string& key) const;

  std::vector<const Finding*> open() const;
  // Every finding still in memory (all open ones and the newest resolved), newest first.
  std::vector<const Finding*> all() const;
  // Open findings and those resolved since `since_ns` (what Alertmanager must hear about).
  std::vector<Finding> for_alerts(uint64_t since_ns) const;
  size_t open_count(FindingKind kind) const;

  // The findings changed since the last call (opened, updated, resolved,
  // acknowledged), to be written; each is kept in memory until then.
  std::vector<Finding> take_changed();

 private:
  static constexpr size_t kResolvedInMemory = 10000;
  void trim();

  std::map<uint64_t, Finding> findings_;      // by id
  std::map<std::string, uint64_t> open_;      // key -> id
  std::set<uint64_t> dirty_;
  uint64_t next_id_ = 1;
};

}  // namespace rankscope::collector
