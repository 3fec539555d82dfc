#include "collector/detect/finding.h"

#include "common/format.h"

namespace rankscope::collector {

const char* finding_kind_name(FindingKind kind) {
  switch (kind) {
    case FindingKind::hang: return "hang";
    case FindingKind::mismatch: return "mismatch";
    case FindingKind::straggler: return "straggler";
    case FindingKind::node_lost: return "node_lost";
    case FindingKind::slow_link: return "slow_link";
  }
  return "?";
}

bool parse_finding_kind(const std::string& name, FindingKind& out) {
  for (FindingKind kind : kAllFindingKinds) {
    if (name == finding_kind_name(kind)) {
      out = kind;
      return true;
    }
  }
  return false;
}

std::string Finding::key() const {
  // One open finding per condition: a hang or a mismatch is about one
  // collective instance (whichever ranks turn out to be missing); a
  // straggler is about one rank of one communicator; a slow link about one
  // link (sender, receiver) of one; a lost node is a node.
  std::string base = std::string(finding_kind_name(kind)) + "/" + hex64(comm) + "/";
  switch (kind) {
    case FindingKind::hang:
    case FindingKind::mismatch: return base + std::to_string(seq);
    case FindingKind::straggler: return base + (ranks.empty() ? "" : std::to_string(ranks.front()));
    case FindingKind::node_lost: return base + (nodes.empty() ? "" : nodes.front());
    case FindingKind::slow_link:
      return base + (ranks.size() < 2 ? "" : std::to_string(ranks[0]) + ">" + std::to_string(ranks[1]));
  }
  return base;
}

}  // namespace rankscope::collector
