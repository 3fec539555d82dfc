#include "collector/match/matcher.h"

#include <algorithm>

#include "proto/records.h"

namespace rankscope::collector {

namespace {
bool has_root(uint8_t op) {
  return op == RS_OP_BROADCAST || op == RS_OP_BCAST || op == RS_OP_REDUCE || op == RS_OP_GATHER ||
         op == RS_OP_SCATTER;
}
}  // namespace

CallShape CallShape::of(const proto::CallRecord& r) {
  CallShape shape;
  shape.code = static_cast<uint32_t>(r.op) | static_cast<uint32_t>(r.datatype) << 8 | static_cast<uint32_t>(r.redop) << 16;
  shape.count = r.count;
  shape.root = has_root(r.op) ? r.peer : -1;
  return shape;
}

std::string CallShape::describe() const {
  std::string text = proto::op_name(op()) + " " + std::to_string(count) + " x " +
                     proto::datatype_name(static_cast<uint8_t>(code >> 8));
  if (op() == RS_OP_ALLREDUCE || op() == RS_OP_REDUCE || op() == RS_OP_REDUCESCATTER)
    text += " " + proto::redop_name(static_cast<uint8_t>(code >> 16));
  if (has_root(op())) text += " root " + std::to_string(root);
  return text;
}

void CollectiveMatcher::on_records(const CommState& comm, int32_t rank, uint32_t lane,
                                   std::span<const proto::CallRecord> records) {
  // Sized by the communicator's size, which the ingest binds once and for
  // all; every index is checked against it anyway.
  if (comm.nranks <= 0 || rank < 0 || rank >= comm.nranks) return;
  // Lane 0 carries the collectives, a peer's lane its Sends and Recvs.
  auto exchange = [lane](const proto::CallRecord& record) {
    return lane == 0 ? proto::op_is_collective(record.op) : record.op == RS_OP_SEND || record.op == RS_OP_RECV;
  };
  issues_.clear();
  for (const auto& record : records)
    if (exchange(record)) issues_.push_back(MatchListener::Issue{record.seq, record.issue_ns});
  if (issues_.empty()) return;
  for (MatchListener* listener : listeners_) listener->on_issues(comm, rank, lane, issues_);
  // Listeners hear of what completes as it does; none of them changes comms_.
  CommMatch& state = comms_[comm.hash];
  for (const auto& record : records) {
    if (!exchange(record)) continue;
    if (lane == 0)
      on_collective(comm, state, rank, record);
    else
      on_p2p(comm, state, rank, lane, record);
  }
}

void CollectiveMatcher::on_collective(const CommState& comm, CommMatch& state, int32_t rank,
                                      const proto::CallRecord& record) {
  auto [slot, opened] = state.open.try_emplace(record.seq);
  OpenCollective& instance = slot->second;
  CallShape call = CallShape::of(record);
  if (opened) {
    budget_.opened(comm.hash, comm.nranks);
    instance.issue.assign(comm.nranks, 0);
    instance.signature.assign(comm.nranks, 0);
    instance.first = call;
    instance.first_signature = call.signature();
    instance.first_issue_ns = record.issue_ns;
  }
  if (static_cast<size_t>(rank) >= instance.issue.size() || instance.issue[rank] != 0) return;  // or seen already
  instance.issue[rank] = std::max<uint64_t>(record.issue_ns, 1);
  instance.signature[rank] = call.signature();
  instance.distinct.try_emplace(instance.signature[rank], call);  // no node made for a call seen already
  instance.arrived += 1;
  instance.first_issue_ns = std::min(instance.first_issue_ns, record.issue_ns);
  if (instance.signature[rank] != instance.first_signature || instance.mismatched) mismatch(comm, record.seq, instance);
  if (instance.arrived == comm.nranks && !instance.mismatched) {
    CollectiveComplete done{comm, record.seq, instance.issue};
    for (MatchListener* listener : listeners_) listener->on_complete(done);
    budget_.close(comm.hash, state.open, slot);
  }
  budget_.enforce(comm.hash, comm.nranks, state.open, [&](uint64_t hash) {
    auto it = comms_.find(hash);
    return it == comms_.end() ? nullptr : &it->second.open;
  });
}

void CollectiveMatcher::mismatch(const CommState& comm, uint64_t seq, OpenCollective& instance) {
  std::map<uint64_t, std::vector<int32_t>> by_call;
  const int32_t n = std::min<int32_t>(comm.nranks, static_cast<int32_t>(instance.issue.size()));
  for (int32_t r = 0; r < n; ++r)
    if (instance.issue[r] != 0) by_call[instance.signature[r]].push_back(r);
  if (by_call.size() < 2) return;
  instance.mismatched = true;
  CollectiveMismatch event{comm, seq, {}};
  for (auto& [signature, ranks] : by_call) event.groups.emplace_back(instance.distinct.at(signature), std::move(ranks));
  for (MatchListener* listener : listeners_) listener->on_mismatch(event);
}

void CollectiveMatcher::on_p2p(const CommState& comm, CommMatch& state, int32_t rank, uint32_t lane,
                               const proto::CallRecord& record) {
  int32_t peer = static_cast<int32_t>((lane - 1) / 2);
  bool recv = ((lane - 1) & 1) != 0;
  if (peer < 0 || peer >= comm.nranks || peer == rank) return;
  auto key = recv ? std::make_tuple(peer, rank, static_cast<uint64_t>(record.seq))
                  : std::make_tuple(rank, peer, static_cast<uint64_t>(record.seq));
  auto it = state.p2p.find(key);
  if (it == state.p2p.end()) {
    state.p2p[key] = PendingHalf{record.issue_ns, recv};
    while (state.p2p.size() > kMaxPendingPairs) state.p2p.erase(state.p2p.begin());
    return;
  }
  if (it->second.recv == recv) return;  // the same side again (a re-sent record)
  uint64_t other = it->second.issue_ns;
  state.p2p.erase(it);
  PairComplete pair{comm, recv ? peer : rank, recv ? rank : peer, recv ? other : record.issue_ns,
                    recv ? record.issue_ns : other};
  for (MatchListener* listener : listeners_) listener->on_pair(pair);
}

void CollectiveMatcher::sweep(const std::map<uint64_t, CommState>& comms) { sweep_open(comms_, comms, budget_); }

bool CollectiveMatcher::mismatched(uint64_t comm, uint64_t seq) const {
  auto state = comms_.find(comm);
  if (state == comms_.end()) return false;
  auto it = state->second.open.find(seq);
  return it != state->second.open.end() && it->second.mismatched;
}

std::pair<uint64_t, const OpenCollective*> CollectiveMatcher::open_from(uint64_t comm, uint64_t seq) const {
  auto state = comms_.find(comm);
  if (state == comms_.end()) return {0, nullptr};
  auto it = state->second.open.lower_bound(seq);
  if (it == state->second.open.end()) return {0, nullptr};
  return {it->first, &it->second};
}

std::vector<CollectiveMatcher::PendingPair> CollectiveMatcher::pending_pairs(uint64_t comm, uint64_t before_ns) const {
  std::vector<PendingPair> out;
  auto state = comms_.find(comm);
  if (state == comms_.end()) return out;
  for (const auto& [key, half] : state->second.p2p) {
    if (half.issue_ns > before_ns) continue;
    auto [sender, receiver, k] = key;
    out.push_back(PendingPair{half.recv ? receiver : sender, half.recv ? sender : receiver, k, half.issue_ns, half.recv});
  }
  return out;
}

std::vector<int32_t> CollectiveMatcher::awaited(uint64_t comm, int32_t rank, uint32_t lane, uint64_t seq) const {
  std::vector<int32_t> ranks;
  auto state = comms_.find(comm);
  if (state == comms_.end()) return ranks;
  if (lane == 0) {
    auto it = state->second.open.find(seq);
    if (it == state->second.open.end() || it->second.mismatched) return ranks;
    const auto& issue = it->second.issue;
    if (rank < 0 || static_cast<size_t>(rank) >= issue.size() || issue[rank] == 0) return ranks;
    for (size_t r = 0; r < issue.size(); ++r)
      if (issue[r] == 0) ranks.push_back(static_cast<int32_t>(r));
    return ranks;
  }
  int32_t peer = static_cast<int32_t>((lane - 1) / 2);
  bool recv = ((lane - 1) & 1) != 0;
  auto key = recv ? std::make_tuple(peer, rank, seq) : std::make_tuple(rank, peer, seq);
  auto half = state->second.p2p.find(key);
  if (half != state->second.p2p.end() && half->second.recv == recv) ranks.push_back(peer);
  return ranks;
}

}  // namespace rankscope::collector
