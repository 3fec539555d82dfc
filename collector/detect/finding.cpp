#include "collector/detect/finding.h"

#include "common/format.h"

namespace rankscope::collector {

const char* finding_kind_name(FindingKind kind) {
  switch (kind) {
    case FindingKind::hang: return "hang";
    case FindingKind::mismatch: return "mismatch";
    case FindingKind::straggler: return "straggler";
    case FindingKind::node_lost: return "node_lost";
  }
  return "?";
}

bool parse_finding_kind(const std::string& name, FindingKind& out) {
  for (FindingKind kind : {FindingKind::hang, FindingKind::mismatch, FindingKind::straggler, FindingKind::node_lost}) {
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
  // straggler is about one rank of one communicator; a lost node is a node.
  std::string base = std::string(finding_kind_name(kind)) + "/" + hex64(comm) + "/";
  switch (kind) {
    case FindingKind::hang:
    case FindingKind::mismatch: return base + std::to_string(seq);
    case FindingKind::straggler: return base + (ranks.empty() ? "" : std::to_string(ranks.front()));
    case FindingKind::node_lost: return base + (nodes.empty() ? "" : nodes.front());
  }
  return base;
}

}  // namespace rankscope::collector
