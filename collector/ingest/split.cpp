// Children of ncclCommSplit: their size and ranks, derived from what every
// member of the parent said of the split (collector/model/cluster.h,
// SplitOf; docs/architecture.md, "Split communicators").
//
// NCCL makes one child per color among the parent's ranks, ranks each
// child's members by (key, rank in the parent), and names the child by its
// commHash of (parent's hash, the parent's split count, color)
// (NVIDIA/nccl src/init.cc). An agent sees one member: it names the child
// the way NCCL does and the member by the rank it had before the split. Once
// every rank of the parent has said which color it chose (or that it chose
// none), the collector knows every child's members, so its size and each
// member's rank in it. Until then, batches with records of such a child wait
// with their agent (not acknowledged; the agent sends them again): records
// are stored and matched under the child's own ranks only, never under two
// numberings.
#include <algorithm>
#include <deque>

#include "collector/ingest/ingest.h"
#include "common/format.h"
#include "common/log.h"

namespace rankscope::collector {

namespace {
std::string split_name(const SplitOf& split) {
  return "split " + std::to_string(split.index) + " of comm " + hex64(split.parent);
}
}  // namespace

std::optional<int32_t> Ingest::check_split(NodeState& node, wire::Comm::Reader c, SplitOf& split) {
  const int32_t announced = c.getRank();
  // The announcing process must be the parent's member it says it was: its
  // rank there, bound to its node and pid by the parent's own announcement.
  auto parent = model_.comms.find(split.parent);
  // A child of a split not sized yet (its other members' word is on its
  // way from their nodes): its own split waits for it, its members named
  // by the ranks announced in it until then (a child split within a batch
  // interval of its parent travels in the same batches).
  const bool parent_pending = parent != model_.comms.end() && parent->second.split.sizing == SplitSizing::pending &&
                              parent->second.split.color != kSplitNoColor;
  const bool sizable = split.index >= 1 && parent != model_.comms.end() &&
                       ((parent->second.nranks > 0 && (parent->second.split.sizing == SplitSizing::none ||
                                                       parent->second.split.sizing == SplitSizing::derived)) ||
                        parent_pending);
  if (!sizable) {
    // An agent too old to say the split's index, or a parent this collector
    // never saw sized (its creation unseen, retired): kept, never matched.
    split.sizing = SplitSizing::abandoned;
    return -1;
  }
  const CommState& p = parent->second;
  int32_t parent_rank = announced;
  if (p.split.sizing == SplitSizing::derived) {
    auto r = p.rank_of_announced.find(announced);
    parent_rank = r == p.rank_of_announced.end() ? -1 : r->second;
  }
  auto member = p.members.find(parent_rank);
  if (member == p.members.end() || member->second.node != node.name || member->second.pid != c.getPid()) {
    refuse_claim(node, "a split announcement (pid " + std::to_string(c.getPid()) + ") as rank " +
                           std::to_string(announced) + " of comm " + hex64(split.parent) +
                           ", which is not that process's rank there");
    return std::nullopt;
  }
  // NCCL's name for the child: a forged hash cannot join another split.
  if (proto::comm_hash_of_split(split.parent, split.index, split.color) != c.getCommHash()) {
    refuse_claim(node, "split child " + hex64(c.getCommHash()) + " is not NCCL's name for color " +
                           std::to_string(split.color) + " of " + split_name(split));
    return std::nullopt;
  }
  return parent_rank;
}

void Ingest::apply_split(NodeState& node, wire::Comm::Reader c, std::set<uint64_t>& changed) {
  const uint64_t hash = c.getCommHash();
  SplitOf split{c.getParentHash(), c.getSplitIndex(), c.getSplitColor(), SplitSizing::pending, clock_.realtime_ns()};
  const int32_t announced = c.getRank();
  std::optional<int32_t> parent_rank = check_split(node, c, split);
  if (!parent_rank) return;

  bool news = false;
  CommState& comm = comm_for(hash, node.name, c.getPid(), news);
  if (comm.split.sizing == SplitSizing::none) {
    comm.split = split;
    comm.origin = CommOrigin::split;
    if (split.sizing == SplitSizing::abandoned)
      RS_LOG(warn, "node %s: comm %s, a child of comm %s, cannot be sized (%s): kept, not matched", node.name.c_str(),
             hex64(hash).c_str(), hex64(split.parent).c_str(),
             split.index < 1 ? "its agent does not say which split made it" : "its parent is not known with its size");
    news = true;
  }
  int32_t rank = announced;
  // (The members that got no child keep the ranks they were announced by.)
  if (comm.split.sizing == SplitSizing::derived && comm.split.color != kSplitNoColor) {
    // Sized already (this is its agent sending a waiting batch again).
    auto r = comm.rank_of_announced.find(announced);
    if (r == comm.rank_of_announced.end()) {
      refuse_claim(node, "a split announcement as rank " + std::to_string(announced) + " of " +
                             split_name(comm.split) + ", sized without it");
      return;
    }
    rank = r->second;
  }
  MemberState* member = claim_member(node, comm, rank, c.getPid(), news, "a split announcement");
  if (!member) {
    if (comm.members.empty()) drop_if_empty(hash);
    return;
  }
  if (member->announced_rank != announced) {
    member->announced_rank = announced;
    member->parent_rank = *parent_rank;
    member->split_key = c.getSplitKey();
    news = true;
  }
  if (comm.split.color == kSplitNoColor && !comm.ended) {
    // The members that got no child: nothing to watch, only to count.
    comm.ended = true;
    news = true;
  }
  if (news) changed.insert(hash);
  if (comm.split.sizing == SplitSizing::pending) {
    model_.pending_splits[{comm.split.parent, comm.split.index}].insert(hash);
    size_split(comm.split.parent, comm.split.index, changed);
  }
}

void Ingest::size_split(uint64_t parent_hash, int32_t index, std::set<uint64_t>& changed) {
  // A child sized may have splits of its own that waited for it: sized in
  // turn, from a list (a chain of splits runs as long as a user makes it).
  std::deque<std::pair<uint64_t, int32_t>> todo{{parent_hash, index}};
  while (!todo.empty()) {
    const auto [p, i] = todo.front();
    todo.pop_front();
    size_one_split(p, i, changed, todo);
  }
}

void Ingest::size_one_split(uint64_t parent_hash, int32_t index, std::set<uint64_t>& changed,
                            std::deque<std::pair<uint64_t, int32_t>>& then) {
  auto group = model_.pending_splits.find({parent_hash, index});
  auto parent = model_.comms.find(parent_hash);
  if (group == model_.pending_splits.end()) return;
  if (parent != model_.comms.end() && parent->second.split.sizing == SplitSizing::pending) return;  // sized first
  if (parent == model_.comms.end() || parent->second.nranks <= 0) {
    abandon_split(parent_hash, index, changed,
                  parent == model_.comms.end() ? "its parent left the live model" : "its parent could not be sized");
    return;
  }
  // Every rank of the parent, once: then every child's members are known.
  std::vector<bool> said(static_cast<size_t>(parent->second.nranks), false);
  size_t heard = 0;
  for (uint64_t hash : group->second) {
    auto child = model_.comms.find(hash);
    if (child == model_.comms.end()) continue;
    for (const auto& [rank, m] : child->second.members) {
      if (m.parent_rank < 0 || m.parent_rank >= parent->second.nranks) continue;
      if (said[static_cast<size_t>(m.parent_rank)]) {
        // One process of the parent in two children of one split: NCCL
        // never does that; the members cannot be numbered.
        abandon_split(parent_hash, index, changed,
                      "rank " + std::to_string(m.parent_rank) + " of the parent is in two of its children");
        return;
      }
      said[static_cast<size_t>(m.parent_rank)] = true;
      ++heard;
    }
  }
  if (heard < said.size()) return;
  const std::set<uint64_t> children = std::move(group->second);
  model_.pending_splits.erase(group);
  for (uint64_t hash : children)
    if (auto child = model_.comms.find(hash); child != model_.comms.end()) derive_child(child->second, changed);
  // Their own splits, which waited for them: their members, named by the
  // ranks announced in these children, now by their ranks there.
  for (uint64_t hash : children) {
    auto child = model_.comms.find(hash);
    if (child == model_.comms.end() || child->second.split.color == kSplitNoColor) continue;
    for (auto g = model_.pending_splits.lower_bound({hash, INT32_MIN});
         g != model_.pending_splits.end() && g->first.first == hash; ++g) {
      for (uint64_t grandchild : g->second) {
        auto split_child = model_.comms.find(grandchild);
        if (split_child == model_.comms.end()) continue;
        for (auto& [rank, m] : split_child->second.members) {
          auto r = child->second.rank_of_announced.find(m.announced_rank);
          m.parent_rank = r == child->second.rank_of_announced.end() ? -1 : r->second;
        }
        changed.insert(grandchild);
      }
      then.emplace_back(hash, g->first.second);
    }
  }
}

void Ingest::derive_child(CommState& child, std::set<uint64_t>& changed) {
  child.split.sizing = SplitSizing::derived;
  changed.insert(child.hash);
  if (child.split.color == kSplitNoColor) return;  // no child: nothing to number
  // NCCL's order: by key, then by rank in the parent (src/init.cc, commGetSplitInfo).
  std::vector<const MemberState*> order;
  for (const auto& [rank, m] : child.members) order.push_back(&m);
  std::sort(order.begin(), order.end(), [](const MemberState* a, const MemberState* b) {
    return a->split_key != b->split_key ? a->split_key < b->split_key : a->parent_rank < b->parent_rank;
  });
  charge_nodes(child, false);
  std::map<int32_t, MemberState> members;
  child.rank_of_announced.clear();
  for (size_t i = 0; i < order.size(); ++i) {
    MemberState member = *order[i];
    member.rank = static_cast<int32_t>(i);
    child.rank_of_announced[member.announced_rank] = member.rank;
    members.emplace(member.rank, std::move(member));
  }
  child.members = std::move(members);
  child.nranks = static_cast<int32_t>(child.members.size());
  charge_nodes(child, true);
  ++counters_.splits_sized;
  RS_LOG(info, "comm %s: color %d of %s, %d ranks", hex64(child.hash).c_str(), child.split.color,
         split_name(child.split).c_str(), child.nranks);
}

void Ingest::abandon_split(uint64_t parent_hash, int32_t index, std::set<uint64_t>& changed, const std::string& why) {
  // With the splits of its children that waited for them (never sized
  // now), from a list as size_split's.
  std::deque<std::pair<uint64_t, int32_t>> todo{{parent_hash, index}};
  for (bool first = true; !todo.empty(); first = false) {
    const auto [p, i] = todo.front();
    todo.pop_front();
    auto group = model_.pending_splits.find({p, i});
    if (group == model_.pending_splits.end()) continue;
    for (uint64_t hash : group->second) {
      auto child = model_.comms.find(hash);
      if (child == model_.comms.end()) continue;
      child->second.split.sizing = SplitSizing::abandoned;
      changed.insert(hash);
      if (child->second.split.color != kSplitNoColor) ++counters_.splits_abandoned;
    }
    RS_LOG(warn,
           "split %d of comm %s cannot be sized (%s): its children are kept by the ranks their agents named, "
           "and not matched (no hang, mismatch or straggler is found on them)",
           i, hex64(p).c_str(), first ? why.c_str() : "its parent could not be sized");
    const std::set<uint64_t> children = std::move(group->second);
    model_.pending_splits.erase(group);
    for (uint64_t hash : children)
      for (auto g = model_.pending_splits.lower_bound({hash, INT32_MIN});
           g != model_.pending_splits.end() && g->first.first == hash; ++g)
        todo.emplace_back(hash, g->first.second);
  }
}

bool Ingest::held_for_split(NodeState& node, wire::Batch::Reader batch, std::set<uint64_t>& changed) {
  const uint64_t now = clock_.realtime_ns();
  auto table = batch.getCommTable();
  bool wait = false;
  for (uint32_t index : proto::block_comms(batch)) {
    if (index >= table.size()) continue;  // refused with the block
    auto comm = model_.comms.find(table[index]);
    if (comm == model_.comms.end() || comm->second.split.sizing != SplitSizing::pending) continue;
    const SplitOf split = comm->second.split;
    if (now - std::min(now, split.since_ns) > kSplitSizingGraceNs)
      abandon_split(split.parent, split.index, changed,
                    "not every rank of the parent said what it did in the split within " +
                        format_duration_ns(kSplitSizingGraceNs));
    else
      wait = true;
  }
  // A later batch of the same agent waits too: each rank's records are
  // applied in the order it made them.
  // (An agent in a fleet sends each job's batches as a stream of their own,
  // numbered by an instance id of their own: streams do not wait for each other.)
  const std::pair<std::string, uint64_t> stream{node.name, batch.getInstanceId()};
  auto held = held_batches_.find(stream);
  if (held != held_batches_.end() && now - std::min(now, held->second.since_ns) > kSplitSizingGraceNs) {
    held_batches_.erase(held);  // stored elsewhere, or never coming back
    held = held_batches_.end();
  }
  const bool same_agent = held != held_batches_.end();
  if (!wait && same_agent && batch.getSeq() > held->second.seq) wait = true;
  if (!wait) {
    if (same_agent && batch.getSeq() == held->second.seq) held_batches_.erase(held);
    return false;
  }
  if (!same_agent || batch.getSeq() < held->second.seq) held_batches_[stream] = HeldBatch{batch.getSeq(), now};
  ++counters_.split_waits;
  return true;
}

std::optional<int32_t> Ingest::rank_in(NodeState& node, const CommState& comm, int32_t announced) {
  if (comm.split.sizing != SplitSizing::derived) return announced;
  auto r = comm.rank_of_announced.find(announced);
  if (r != comm.rank_of_announced.end()) return r->second;
  refuse_claim(node, "collectives as rank " + std::to_string(announced) + " of " + split_name(comm.split) +
                         ", sized without it");
  return std::nullopt;
}

}  // namespace rankscope::collector
