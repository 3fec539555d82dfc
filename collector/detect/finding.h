#pragma once
// A finding: what the detectors tell an operator. Open until the condition
// ends; stored, exported as metrics, pushed to Alertmanager.
#include <cstdint>
#include <string>
#include <vector>

namespace rankscope::collector {

// slow_link: a network link between two ranks whose transfers are slow
// (NCCL's proxy steps, docs/gpu-timing.md).
enum class FindingKind { hang, mismatch, straggler, node_lost, slow_link };
inline constexpr FindingKind kAllFindingKinds[] = {FindingKind::hang, FindingKind::mismatch, FindingKind::straggler,
                                                   FindingKind::node_lost, FindingKind::slow_link};

const char* finding_kind_name(FindingKind kind);  // "hang", "mismatch", "straggler", "node_lost", "slow_link"
bool parse_finding_kind(const std::string& name, FindingKind& out);

struct Finding {
  uint64_t id = 0;               // unique, increasing; stable across restarts
  FindingKind kind = FindingKind::hang;
  std::string job;
  uint64_t comm = 0;             // communicator hash; 0 for node_lost
  int64_t seq = -1;              // the sequence number concerned; -1 when none
  std::vector<int32_t> ranks;    // the culprit ranks (slow_link: the sender, then the receiver)
  std::vector<std::string> nodes;
  uint64_t opened_ns = 0;        // cluster clock
  uint64_t resolved_ns = 0;      // 0 while open
  uint64_t updated_ns = 0;       // last time the detail changed
  std::string summary;           // one line an operator reads first
  std::string detail;            // the whole story, several lines
  // Straggler cost (0 otherwise).
  double lateness_s = 0;         // persistent lateness against its peers
  double wait_share = 0;         // share of the job's time the others spent waiting for it
  double gpu_hours_lost = 0;     // GPU-hours the others spent waiting, since the finding opened
  uint64_t acknowledged_ns = 0;  // an operator closed it (rankscope ack); 0: not
  std::string acknowledged_by;

  bool open() const { return resolved_ns == 0; }
  // The identity of the condition: one open finding per key.
  std::string key() const;
};

}  // namespace rankscope::collector
