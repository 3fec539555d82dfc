#include "collector/detect/detector.h"

#include <algorithm>
#include <cstdint>

#include "collector/detect/host_wait.h"
#include "common/search.h"
#include "common/stats.h"

namespace rankscope::collector {

namespace {
// Lateness samples held for the metrics between two takes (dropped past it when nobody takes them).
constexpr size_t kMaxLatenessSamples = 65536;
// Exchanges remembered per process: those of the last few seconds (scoring
// looks back settle_ns plus one evaluation), at most this many.
constexpr size_t kProcExchanges = 1024;
// Kernel ends kept per process: those of the last kProcHistoryNs, as many
// as a process that runs thousands of kernels a second (FSDP's per-layer
// calls) ends while its instances settle and wait to be scored.
constexpr size_t kProcGpuEnds = 16384;
constexpr uint64_t kProcHistoryNs = kBatchGapWaitNs + 2'000'000'000ull;  // ... or waits for a missing batch
// Complete instances waiting to be scored, per communicator: this many
// bytes of them, and at least kMinSettling.
constexpr size_t kSettlingBytes = 16u << 20;
constexpr size_t kMinSettling = 1024;
// An agent heartbeats every second: silent for this long, its ranks are unseen.
constexpr uint64_t kUnseenNs = 3'000'000'000ull;

// A member's clocks' margin as its communicator's last evaluation put it (0:
// a rank it did not know yet).
uint64_t margin_of(const std::vector<uint64_t>& margins, int32_t rank) {
  return rank >= 0 && rank < std::ssize(margins) ? margins[rank] : 0;
}
}  // namespace

Detector::Detector(const ClusterModel& model, CollectiveMatcher& matcher, FindingBook& book, const Clock& clock,
                   DetectOptions options)
    : model_(model), matcher_(matcher), book_(book), clock_(clock), options_(options) {
  matcher.subscribe(*this);
}

uint64_t Detector::ProcHistory::free_bound_of(const Exchange& e) {
  return e.waited ? std::max(e.release, e.data->data_ns) : e.release;
}

void Detector::ProcHistory::add(uint64_t arrival, const std::shared_ptr<ExchangeData>& data, uint64_t margin) {
  margin = std::min(margin, kWaitLookbackNs);
  Exchange e{arrival, data->release, static_cast<uint32_t>(margin), false, data};
  // Its waits that ended before the exchange completed here (the last
  // member's records came later than its wait's).
  for (auto w = waits.rbegin(); w != waits.rend() && w->second + margin >= data->release; ++w)
    if (waited_for(w->first, w->second, arrival, data->release, margin)) {
      e.waited = true;
      data->data_ns = std::min(data->data_ns, data_moved(w->second, data->release));
    }
  const Exchange* before = exchanges.empty() ? nullptr : &exchanges.back();
  e.arrival_bound = std::max(before ? before->arrival_bound : 0, arrival);
  e.free_bound = std::max(before ? before->free_bound : 0, free_bound_of(e));
  e.arrival_after = arrival;
  e.release_min = std::min(before ? before->release_min : UINT64_MAX, data->release);
  for (auto earlier = exchanges.rbegin(); earlier != exchanges.rend() && earlier->arrival_after > arrival; ++earlier)
    earlier->arrival_after = arrival;
  exchanges.push_back(std::move(e));
  while (exchanges.size() > kProcExchanges ||
         (exchanges.front().arrival + kProcHistoryNs < arrival && exchanges.size() > 1))
    exchanges.pop_front(), ++exchanges_dropped;
}

void Detector::ProcHistory::add_wait(uint64_t start, uint64_t end) {
  auto at = waits.end();
  while (at != waits.begin() && (at - 1)->second > end) --at;
  waits.insert(at, {start, end});
  while (waits.size() > kProcExchanges ||
         (waits.front().second + kProcHistoryNs < waits.back().second && waits.size() > 1))
    waits.pop_front();
  size_t earliest = exchanges.size();
  for (auto e = exchanges.rbegin(); e != exchanges.rend(); ++e) {
    if (e->arrival + kWaitLookbackNs < start) break;
    if (!waited_for(start, end, e->arrival, e->release, e->margin)) continue;
    e->waited = true;
    e->data->data_ns = std::min(e->data->data_ns, data_moved(end, e->release));
    earliest = static_cast<size_t>(exchanges.rend() - e) - 1;
  }
  // An exchange now waited for may be free later than its bound said: raise
  // the bounds from it on.
  for (size_t i = earliest; i < exchanges.size(); ++i) {
    Exchange& e = exchanges[i];
    e.free_bound = std::max({e.free_bound, free_bound_of(e), i > 0 ? exchanges[i - 1].free_bound : 0});
  }
}

void Detector::ProcHistory::add_issue(uint64_t issue) {
  // Batches of different communicators interleave: keep time order.
  auto at = issues.end();
  while (at != issues.begin() && *(at - 1) > issue) --at;
  issues.insert(at, issue);
  while (issues.size() > kProcExchanges || (issues.front() + kProcHistoryNs < issues.back() && issues.size() > 1))
    issues.pop_front(), ++issues_dropped;
}

void Detector::ProcHistory::add_call(const Call& call) {
  // Blocks of different communicators and lanes interleave: keep time order
  // (a call at the same time as the latest is the latest).
  if (recent.size() == kRecentCalls && call.issue_ns < recent.front().issue_ns) return;
  auto at = recent.end();
  while (at != recent.begin() && (at - 1)->issue_ns > call.issue_ns) --at;
  recent.insert(at, call);
  if (recent.size() > kRecentCalls) recent.erase(recent.begin());
}

void Detector::ProcHistory::add_gpu_end(uint64_t end) {
  // A batch's blocks (one per communicator and op) each span the batch:
  // keep time order.
  if (gpu_ends.size() >= kProcGpuEnds && end < gpu_ends.front()) return;
  gpu_ends.insert(std::upper_bound(gpu_ends.begin(), gpu_ends.end(), end), end);
  while (gpu_ends.size() > kProcGpuEnds ||
         (gpu_ends.front() + kProcHistoryNs < gpu_ends.back() && gpu_ends.size() > 1))
    gpu_ends.pop_front();
}

uint64_t Detector::ProcHistory::gpu_end_before(uint64_t start) const {
  if (several_gpus) return 0;  // whose stream an end is of is not known: plain starts
  auto after = std::upper_bound(gpu_ends.begin(), gpu_ends.end(), start);
  return after == gpu_ends.begin() ? 0 : *(after - 1);
}

std::pair<Detector::ProcHistory::Release, uint64_t> Detector::ProcHistory::base_before(uint64_t t) const {
  // The latest release over the exchanges before t (the calls of one group,
  // a Send/Recv to each pipeline neighbour, are all waited for). If the
  // host issued t before its latest exchange completed, it ran ahead (back
  // to back buckets, asynchronous calls): nothing held it, and its lateness
  // is carried, not its own to measure afresh. Where its host waited on the
  // GPU for an exchange, it was free once the exchange's data had moved
  // (ExchangeData), not at its release.
  //
  // From the latest exchange that arrived before t back, until nothing
  // earlier can change the answer (its bounds are no later than what is
  // found): a process's history holds up to kProcExchanges, and a pass over
  // all of them for each call scored was most of the collector's time at
  // FSDP's call rates.
  uint64_t base = 0, latest_arrival = 0, latest_release = 0;
  bool arrival_found = false;
  // Those from the first whose earliest arrival onward is at or after t
  // all arrived at or after t: none counts.
  const size_t from_at =
      partition_from(exchanges.size(), exchanges_finger - std::min(exchanges_finger, exchanges_dropped),
                     [&](size_t i) { return exchanges[i].arrival_after < t; });
  exchanges_finger = exchanges_dropped + from_at;
  auto from = exchanges.begin() + static_cast<std::ptrdiff_t>(from_at);
  // A call after the latest known exchange: an exchange whose release is not
  // known (a Send whose Recv never arrived). The release before it would
  // make everything since look like its own time.
  auto after_unknown = [&] {
    const size_t later = partition_from(issues.size(), issues_finger - std::min(issues_finger, issues_dropped),
                                        [&](size_t i) { return issues[i] < t; });
    issues_finger = issues_dropped + later;
    return later > 0 && issues[later - 1] > latest_arrival;
  };
  // Some exchange before t released by t: the oldest kept, where the history is in order.
  auto released_by_t = [&] {
    const Exchange& oldest = exchanges.front();
    return oldest.arrival < t && oldest.release > 0 && oldest.release <= t;
  };
  for (auto e = std::make_reverse_iterator(from); e != exchanges.rend(); ++e) {
    if (arrival_found && e->arrival_bound <= latest_arrival) {
      // The latest arrival before t is settled: nothing earlier arrived later.
      // Nor is anything from here back free later than what is found, or
      // free by t at all.
      if (e->free_bound <= base || e->release_min > t) break;
      // Released after t: the host ran ahead of it, whatever released
      // earlier (a host many calls ahead of a slow rank would otherwise be
      // walked back through all of them).
      if (latest_release > t && latest_arrival != 0 && released_by_t())
        return after_unknown() ? std::pair{Release::unknown, uint64_t{0}} : std::pair{Release::ahead, uint64_t{0}};
    }
    if (e->arrival >= t) continue;
    const uint64_t release = e->release;
    // Of equal arrivals the latest in the history (met first here).
    if (!arrival_found || e->arrival > latest_arrival) {
      latest_arrival = e->arrival, latest_release = release;
      arrival_found = true;
    }
    uint64_t free = release;
    if (e->waited && e->data->data_ns <= t) free = std::max(free, e->data->data_ns);
    if (free <= t) base = std::max(base, free);
  }
  if (after_unknown()) return {Release::unknown, 0};
  if (latest_arrival == 0 || base == 0) return {Release::none, 0};
  if (latest_release > t) return {Release::ahead, 0};
  return {Release::known, base};
}

Detector::ProcHistory* Detector::proc_of(const CommState& comm, CommDetect& state, int32_t rank) {
  // A split child not yet sized (or given up on) has members and no size.
  if (comm.nranks <= 0 || rank < 0 || rank >= comm.nranks) return nullptr;
  if (state.procs.size() != static_cast<size_t>(comm.nranks)) state.procs.assign(comm.nranks, nullptr);
  ProcHistory*& p = state.procs[rank];
  if (!p) {
    auto m = comm.members.find(rank);
    if (m == comm.members.end()) return nullptr;
    p = &procs_[{m->second.node, m->second.pid}];
    // A process that holds two ranks of one communicator drives two GPUs
    // (ncclCommInitAll): its kernels' ends are of several streams.
    if (p->first_comm == 0) p->first_comm = comm.hash, p->first_rank = rank;
    else if (p->first_comm == comm.hash && p->first_rank != rank) p->several_gpus = true;
  }
  return p;
}

Detector::CommDetect& Detector::state_of(const CommState& comm) {
  CommDetect& state = comms_[comm.hash];
  if (!state.waits || state.waits->nranks() != comm.nranks) {
    state.waits = std::make_unique<WaitAttribution>(comm.nranks, options_.straggler);
    state.ranks.assign(comm.nranks, RankStats{});
    state.gpu_waits.reset();
    state.gpu_done.clear();
  }
  return state;
}

void Detector::on_pair(const PairComplete& pair) {
  // The pair is released when both sides are posted.
  CommDetect& state = comms_[pair.comm.hash];
  auto data = std::make_shared<ExchangeData>(std::max(pair.send_issue_ns, pair.recv_issue_ns));
  if (!state.margin) refresh_margins(pair.comm, state);
  if (ProcHistory* sender = proc_of(pair.comm, state, pair.sender))
    sender->add(pair.send_issue_ns, data, margin_of(*state.margin, pair.sender));
  if (ProcHistory* receiver = proc_of(pair.comm, state, pair.receiver))
    receiver->add(pair.recv_issue_ns, data, margin_of(*state.margin, pair.receiver));
}

void Detector::on_waits(const std::string& node, uint32_t pid, std::span<const HostWait> waits) {
  // Only processes a communicator's collectives made known.
  auto p = procs_.find({node, pid});
  if (p == procs_.end()) return;
  for (const HostWait& wait : waits)
    if (wait.end_ns >= wait.start_ns) p->second.add_wait(wait.start_ns, wait.end_ns);
}

void Detector::on_gpu(const CommState& comm, int32_t rank, uint8_t, const proto::GpuRecord& record) {
  // Each kernel's end as its record comes, of any op (a Recv's kernel that
  // waited for a slow stage's data holds up the collective behind it as a
  // collective's does), for the next kernels of its process on this
  // communicator or another (score_gpu_front).
  if (record.kernel_end_ns == 0 || !model_.live(comm.hash)) return;
  if (ProcHistory* p = proc_of(comm, comms_[comm.hash], rank)) p->add_gpu_end(record.kernel_end_ns);
}

void Detector::on_issues(const CommState& comm, int32_t rank, uint32_t lane, std::span<const Issue> issues) {
  ProcHistory* p = proc_of(comm, comms_[comm.hash], rank);
  if (!p) return;
  for (const Issue& issue : issues) {
    p->add_issue(issue.issue_ns);
    p->add_call({comm.hash, rank, lane, issue.seq, issue.issue_ns});
  }
}

void Detector::on_complete(const CollectiveComplete& done) {
  const CommState& comm = done.comm;
  CommDetect& state = state_of(comm);
  const int32_t n = static_cast<int32_t>(done.issue.size());
  if (n < 2) return;
  int32_t last = static_cast<int32_t>(std::max_element(done.issue.begin(), done.issue.end()) - done.issue.begin());
  // Every member was free to go on from here: the exchange's release (or
  // once its data moved, for a member that waited for it).
  auto data = std::make_shared<ExchangeData>(done.issue[last]);
  if (!state.margin) refresh_margins(comm, state);  // its first instance before its first evaluation
  for (int32_t r = 0; r < n; ++r)
    if (ProcHistory* p = proc_of(comm, state, r)) p->add(done.issue[r], data, margin_of(*state.margin, r));
  // The last arrival's lateness against the median of the others, for the lateness histogram.
  if (lateness_samples_.size() < kMaxLatenessSamples) {
    std::vector<int64_t> others;
    for (int32_t r = 0; r < n; ++r)
      if (r != last) others.push_back(static_cast<int64_t>(done.issue[r]));
    lateness_samples_.push_back(static_cast<double>(static_cast<int64_t>(done.issue[last]) - median(others)) / 1e9);
  }
  state.done.push_back(Completed{done.issue, done.issue[last], state.margin, {}});
  if (!model_.gaps.empty()) note_gaps(comm, state.done.back());
  // A job completing thousands of collectives a second (FSDP's per-layer
  // calls) fills the settling queue within settle_ns: past its budget the
  // oldest is scored early (its exchanges have mostly arrived), not dropped,
  // even one still waiting for a missing batch.
  const size_t cap = std::max<size_t>(kMinSettling, kSettlingBytes / (sizeof(Completed) + sizeof(uint64_t) * n));
  while (state.done.size() > cap) {
    if (ready(state.done.front(), clock_.realtime_ns()) != Ready::score) ++incomplete_;
    score_front(state);
  }
}

void Detector::on_gpu_complete(const GpuComplete& done) {
  const CommState& comm = done.comm;
  CommDetect& state = state_of(comm);
  const size_t n = done.kernel_start.size();
  if (n < 2 || n != static_cast<size_t>(comm.nranks)) return;
  if (!state.gpu_waits) state.gpu_waits = std::make_unique<WaitAttribution>(comm.nranks, options_.straggler);
  if (!state.margin) refresh_margins(comm, state);
  const uint64_t last = *std::max_element(done.kernel_start.begin(), done.kernel_start.end());
  state.gpu_done.push_back(Completed{done.kernel_start, last, state.margin, {}});
  const size_t cap = std::max<size_t>(kMinSettling, kSettlingBytes / (sizeof(Completed) + sizeof(uint64_t) * n));
  while (state.gpu_done.size() > cap) score_gpu_front(state);
}

std::vector<double> Detector::take_lateness_samples() {
  std::vector<double> out;
  out.swap(lateness_samples_);
  return out;
}

const NodeState* Detector::node_named(const std::string& name) const {
  // Nodes are never forgotten by the ingest: the pointer stays good.
  if (last_node_ && last_node_->name == name) return last_node_;
  auto it = model_.nodes.find(name);
  if (it == model_.nodes.end()) return nullptr;
  last_node_ = &it->second;
  return last_node_;
}

const ProcessHealth* Detector::health_of(const MemberState& member) const {
  const NodeState* node = node_named(member.node);
  if (!node) return nullptr;
  auto health = node->health.find(member.pid);
  return health == node->health.end() ? nullptr : &health->second;
}

bool Detector::silent_for(const NodeState& node, uint64_t now_ns, uint64_t after_ns) const {
  const uint64_t heard = std::max(node.last_contact_ns, model_.started_ns);
  if (now_ns <= heard || now_ns - heard <= after_ns) return false;
  const uint64_t drained = model_.drained_ns;
  if (drained == 0) return true;  // no loop tells it (a replay, a test of the rule alone)
  return drained >= heard + after_ns || (now_ns > drained && now_ns - drained > 2 * options_.node_lost_timeout_ns);
}

void Detector::evaluate(uint64_t now_ns) {
  // The open hangs and mismatches by communicator, gathered once: asking the
  // book per communicator costs (communicators x open findings).
  std::map<uint64_t, std::vector<const Finding*>> open_by_comm;
  std::map<uint64_t, std::set<int32_t>> open_stragglers;
  open_lost_.clear();
  for (const Finding* f : book_.open()) {
    if (f->kind == FindingKind::hang || f->kind == FindingKind::mismatch) open_by_comm[f->comm].push_back(f);
    if (f->kind == FindingKind::straggler && !f->ranks.empty()) open_stragglers[f->comm].insert(f->ranks.front());
    if (f->kind == FindingKind::node_lost && !f->nodes.empty()) open_lost_.insert(f->nodes.front());
  }
  static const std::vector<const Finding*> kNone;
  peer_cache_.clear();
  // Nodes whose agent has been silent for longer than a few heartbeats (or
  // the node-lost timeout, if shorter): their ranks are unseen, not hung.
  silent_.clear();
  folded_.clear();
  stalls_.clear();
  inside_stalls_.clear();
  uint64_t unseen_after = std::min(options_.node_lost_timeout_ns, kUnseenNs);
  untold_nodes_ = false;
  for (const auto& [name, node] : model_.nodes) {
    const bool silent = silent_for(node, now_ns, unseen_after);
    if (silent) silent_.insert(name);
    untold_nodes_ |= !silent && node.batches == 0 && node.reported_ns == 0;
  }
  forget_retired(now_ns);
  for (const auto& [hash, comm] : model_.comms) {
    if (comm.ended) continue;  // forget_retired
    if (comm.nranks <= 0) continue;
    CommDetect& state = state_of(comm);
    auto open = open_by_comm.find(hash);
    const auto& open_of_comm = open == open_by_comm.end() ? kNone : open->second;
    size_t stalls = stalls_.size();
    evaluate_hang(comm, state, now_ns, open_of_comm);
    evaluate_pairs(comm, state, now_ns, open_of_comm, stalls_.size() > stalls);
    refresh_margins(comm, state);
    score(state, now_ns);
    auto stragglers = open_stragglers.find(hash);
    evaluate_stragglers(comm, state, now_ns, stragglers == open_stragglers.end() ? nullptr : &stragglers->second);
  }
  raise_stalls(now_ns);
  evaluate_nodes(now_ns);
}

void Detector::forget_retired(uint64_t now_ns) {
  // Communicators ended, or out of the live model (collector/ingest/ingest.h,
  // retire): their state goes, their open findings resolve, and so does the
  // history of the processes no communicator still tracked has as a member.
  bool any = false;
  for (auto it = comms_.begin(); it != comms_.end();) {
    if (model_.live(it->first)) {
      ++it;
      continue;
    }
    resolve_comm(it->first, now_ns);
    it = comms_.erase(it);
    any = true;
  }
  if (!any) return;
  std::set<const ProcHistory*> tracked;
  for (const auto& [hash, state] : comms_) tracked.insert(state.procs.begin(), state.procs.end());
  for (auto it = procs_.begin(); it != procs_.end();)
    it = tracked.count(&it->second) ? std::next(it) : procs_.erase(it);
}

void Detector::resolve_comm(uint64_t comm, uint64_t now_ns) {
  // A mismatch outlives its job: only an operator closes it.
  for (const Finding* f : book_.open())
    if (f->comm == comm && f->kind != FindingKind::node_lost && f->kind != FindingKind::mismatch)
      book_.resolve(f->key(), now_ns);
}

}  // namespace rankscope::collector
