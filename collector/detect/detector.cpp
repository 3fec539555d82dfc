#include "collector/detect/detector.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>

#include "common/format.h"
#include "common/stats.h"
#include "proto/records.h"

namespace rankscope::collector {

namespace {
constexpr uint64_t kStragglerUpdateNs = 10'000'000'000ull;
// Lateness samples held for the metrics between two takes (dropped past it when nobody takes them).
constexpr size_t kMaxLatenessSamples = 65536;
// Exchanges remembered per process: those of the last few seconds (scoring
// looks back settle_ns plus one evaluation), at most this many.
constexpr size_t kProcExchanges = 1024;
constexpr uint64_t kProcHistoryNs = 5'000'000'000ull;
// Complete instances waiting to be scored, per communicator: this many
// bytes of them, and at least kMinSettling.
constexpr size_t kSettlingBytes = 16u << 20;
constexpr size_t kMinSettling = 1024;
// The note a mismatch finding gets when the job goes on past it.
constexpr const char* kWentOn = "Every rank went on past this collective by";
// An agent heartbeats every second: silent for this long, its ranks are unseen.
constexpr uint64_t kUnseenNs = 3'000'000'000ull;
// How long a clock estimate's error is remembered after a better one
// replaced it: records converted with it are scored within this (the
// batching, the settling time and one re-send of a lost batch).
constexpr uint64_t kMarginMemoryNs = 3'000'000'000ull;
// Send/Recv halves waiting this long (or the hang timeout, if shorter) are a stall.
constexpr uint64_t kPairStallNs = 1'000'000'000ull;
// How a hang in Send/Recv says what is missing (and how it is told from a collective's).
constexpr const char* kNeverPosted = " never posted ";
// Processes followed from one stall's missing ranks to the one holding them up.
constexpr size_t kMaxChase = 4096;
// Stalls folded into a hang that its detail names one by one.
constexpr size_t kFoldedTold = 16;
// Every rank inside a collective that does not move, but some running on
// the CPU more than this share of the context window: working, not hung.
constexpr double kBusyRunningShare = 0.2;
// A neighbouring cgroup using at least this many CPUs is named in a
// straggler's host context.
constexpr double kBusyNeighbourCpus = 0.25;
// Communicators smaller than this compare a rank with its peers excluding
// it; larger ones with the median of all (cached per evaluation).
constexpr int32_t kPeerCacheMinRanks = 8;

// At most kJoined of them: a communicator may have 65,536 ranks, and a
// finding that names them all is neither readable nor small.
constexpr size_t kJoined = 64;
std::string join(const std::vector<int32_t>& values) {
  std::string out;
  for (size_t i = 0; i < values.size() && i < kJoined; ++i) out += (out.empty() ? "" : ",") + std::to_string(values[i]);
  if (values.size() > kJoined) out += " and " + std::to_string(values.size() - kJoined) + " more";
  return out;
}

std::string short_comm(uint64_t comm) { return hex64(comm).substr(0, 8); }
// How every finding of a communicator starts: "hang in job 4711, comm 1a2b3c4d".
std::string where(const char* kind, const CommState& comm) {
  return std::string(kind) + " in job " + comm.job + ", comm " + short_comm(comm.hash);
}

// A process that cannot take part in anything: stopped, exited, a zombie.
bool stuck_process(const ProcessHealth& health) {
  return !health.alive() || health.state() == 'T' || health.state() == 't' || health.state() == 'Z';
}

// A straggler finding with only what makes its key (comm, rank).
Finding straggler_of(uint64_t comm, int32_t rank) {
  Finding f;
  f.kind = FindingKind::straggler;
  f.comm = comm;
  f.ranks = {rank};
  return f;
}
}  // namespace

Detector::Detector(const Ingest& ingest, CollectiveMatcher& matcher, FindingBook& book, const Clock& clock,
                   DetectOptions options)
    : ingest_(ingest), matcher_(matcher), book_(book), clock_(clock), options_(options) {
  matcher.subscribe(*this);
}

void Detector::ProcHistory::add(uint64_t arrival, uint64_t release) {
  exchanges.emplace_back(arrival, release);
  while (exchanges.size() > kProcExchanges ||
         (exchanges.front().first + kProcHistoryNs < arrival && exchanges.size() > 1))
    exchanges.pop_front();
}

void Detector::ProcHistory::add_issue(uint64_t issue) {
  // Batches of different communicators interleave: keep time order.
  auto at = issues.end();
  while (at != issues.begin() && *(at - 1) > issue) --at;
  issues.insert(at, issue);
  while (issues.size() > kProcExchanges || (issues.front() + kProcHistoryNs < issues.back() && issues.size() > 1))
    issues.pop_front();
}

std::pair<Detector::ProcHistory::Release, uint64_t> Detector::ProcHistory::base_before(uint64_t t) const {
  // The latest release over the exchanges before t (the calls of one group,
  // a Send/Recv to each pipeline neighbour, are all waited for). If the
  // host issued t before its latest exchange completed, it ran ahead (back
  // to back buckets, asynchronous calls): nothing held it, and its lateness
  // is carried, not its own to measure afresh.
  uint64_t base = 0, latest_arrival = 0, latest_release = 0;
  for (const auto& [arrival, release] : exchanges) {
    if (arrival >= t) continue;
    if (arrival >= latest_arrival) latest_arrival = arrival, latest_release = release;
    if (release <= t) base = std::max(base, release);
  }
  // A call after the latest known exchange: an exchange whose release is not
  // known (a Send whose Recv never arrived). The release before it would
  // make everything since look like its own time.
  auto later = std::lower_bound(issues.begin(), issues.end(), t);
  if (later != issues.begin() && *(later - 1) > latest_arrival) return {Release::unknown, 0};
  if (latest_arrival == 0 || latest_release > t || base == 0) return {Release::ahead, 0};
  return {Release::known, base};
}

Detector::ProcHistory* Detector::proc_of(const CommState& comm, CommDetect& state, int32_t rank) {
  if (state.procs.size() != static_cast<size_t>(comm.nranks)) state.procs.assign(comm.nranks, nullptr);
  ProcHistory*& p = state.procs[rank];
  if (!p) {
    auto m = comm.members.find(rank);
    if (m == comm.members.end()) return nullptr;
    p = &procs_[{m->second.node, m->second.pid}];
  }
  return p;
}

Detector::CommDetect& Detector::state_of(const CommState& comm) {
  CommDetect& state = comms_[comm.hash];
  if (!state.waits || state.waits->nranks() != comm.nranks) {
    state.waits = std::make_unique<WaitAttribution>(comm.nranks, options_.straggler);
    state.ranks.assign(comm.nranks, RankStats{});
  }
  return state;
}

void Detector::on_pair(const PairComplete& pair) {
  // The pair is released when both sides are posted.
  CommDetect& state = comms_[pair.comm.hash];
  uint64_t release = std::max(pair.send_issue_ns, pair.recv_issue_ns);
  if (ProcHistory* sender = proc_of(pair.comm, state, pair.sender)) sender->add(pair.send_issue_ns, release);
  if (ProcHistory* receiver = proc_of(pair.comm, state, pair.receiver)) receiver->add(pair.recv_issue_ns, release);
}

void Detector::on_issue(const CommState& comm, int32_t rank, uint32_t lane, uint64_t seq, uint64_t issue_ns) {
  CommDetect& state = comms_[comm.hash];
  ProcHistory* p = proc_of(comm, state, rank);
  if (!p) return;
  p->add_issue(issue_ns);
  if (issue_ns >= p->last_issue_ns) {
    p->last_comm = comm.hash;
    p->last_rank = rank;
    p->last_lane = lane;
    p->last_seq = seq;
    p->last_issue_ns = issue_ns;
  }
}

void Detector::on_mismatch(const CollectiveMismatch& mismatch) {
  // The culprits are the ranks outside the largest group of ranks that
  // made the same call (every rank when the largest is tied).
  const CommState& comm = mismatch.comm;
  size_t largest = 0, tied = 0;
  for (const auto& [call, ranks] : mismatch.groups) largest = std::max(largest, ranks.size());
  for (const auto& [call, ranks] : mismatch.groups) tied += ranks.size() == largest ? 1 : 0;
  Finding f;
  f.kind = FindingKind::mismatch;
  f.job = comm.job;
  f.comm = comm.hash;
  f.seq = static_cast<int64_t>(mismatch.seq);
  std::string calls;
  for (const auto& [call, ranks] : mismatch.groups) {
    if (tied > 1 || ranks.size() < largest) f.ranks.insert(f.ranks.end(), ranks.begin(), ranks.end());
    calls += (calls.empty() ? "" : "; ") + std::string(ranks.size() > 1 ? "ranks " : "rank ") + join(ranks) +
             " called " + call.describe();
  }
  std::sort(f.ranks.begin(), f.ranks.end());
  if (const Finding* open = book_.open_finding(f.key()); open && open->ranks == f.ranks) return;
  uint64_t now = clock_.realtime_ns();
  for (int32_t r : f.ranks) {
    auto m = comm.members.find(r);
    if (m != comm.members.end() && std::find(f.nodes.begin(), f.nodes.end(), m->second.node) == f.nodes.end())
      f.nodes.push_back(m->second.node);
  }
  f.summary = where("mismatch", comm) + " at collective #" + std::to_string(mismatch.seq) + ": " + calls;
  f.detail = f.summary + ".\nNCCL requires every rank to issue the same collectives in the same order; this job "
                         "will hang or corrupt data at this point. Culprit rank(s): " + join(f.ranks) + ".";
  for (int32_t r : f.ranks) f.detail += "\n  " + describe_rank(comm, r, now);
  book_.raise(std::move(f), now);
}

void Detector::on_complete(const CollectiveComplete& done) {
  const CommState& comm = done.comm;
  CommDetect& state = state_of(comm);
  const int32_t n = static_cast<int32_t>(done.issue.size());
  if (n < 2) return;
  int32_t last = static_cast<int32_t>(std::max_element(done.issue.begin(), done.issue.end()) - done.issue.begin());
  // Every member was free to go on from here: the exchange's release.
  for (int32_t r = 0; r < n; ++r)
    if (ProcHistory* p = proc_of(comm, state, r)) p->add(done.issue[r], done.issue[last]);
  // The last arrival's lateness against the median of the others, for the lateness histogram.
  if (lateness_samples_.size() < kMaxLatenessSamples) {
    std::vector<int64_t> others;
    for (int32_t r = 0; r < n; ++r)
      if (r != last) others.push_back(static_cast<int64_t>(done.issue[r]));
    lateness_samples_.push_back(static_cast<double>(static_cast<int64_t>(done.issue[last]) - median(others)) / 1e9);
  }
  if (!state.margin) refresh_margins(comm, state);  // its first instance before its first evaluation
  state.done.push_back(Completed{done.issue, done.issue[last], state.margin});
  // A job completing thousands of collectives a second (FSDP's per-layer
  // calls) fills the settling queue within settle_ns: past its budget the
  // oldest is scored early (its exchanges have mostly arrived), not dropped.
  const size_t cap = std::max<size_t>(kMinSettling, kSettlingBytes / (sizeof(Completed) + sizeof(uint64_t) * n));
  while (state.done.size() > cap) score_front(state);
}

void Detector::score(CommDetect& state, uint64_t now_ns) {
  while (!state.done.empty() && state.done.front().last_ns + options_.settle_ns <= now_ns) score_front(state);
}

void Detector::score_front(CommDetect& state) {
  // Blame is judged on each rank's own duration: from the moment it was
  // free to go on (the release of its previous exchange: a collective or a
  // Send/Recv pair) to this arrival. A rank that waited for someone else
  // (a slowed pipeline partner, a slow rank of another communicator) was
  // released late and is not to blame for it; the rank that arrived last
  // there took long from its own release, and is. Where a member's release
  // is unknown, plain arrival times are used.
  const Completed& c = state.done.front();
  const size_t n = c.issue.size();
  // Without margins from when it completed, how far apart its arrivals
  // really were is unknown: not scored.
  if (n == state.ranks.size() && c.margin && state.margin && c.margin->size() == n && state.margin->size() == n) {
    std::vector<int64_t> v(c.issue.begin(), c.issue.end());
    bool durations = true, unknown = state.procs.size() != n;
    for (size_t r = 0; r < n && !unknown; ++r) {
      if (!state.procs[r]) {
        unknown = true;
        break;
      }
      auto [release, base] = state.procs[r]->base_before(c.issue[r]);
      if (release == ProcHistory::Release::unknown) unknown = true;
      else if (release == ProcHistory::Release::ahead) durations = false;
      else v[r] = static_cast<int64_t>(c.issue[r] - base);
    }
    // A member whose last exchange is not known: its own time cannot be
    // told from time it spent waiting for that exchange. Not scored.
    if (unknown) {
      state.done.pop_front();
      return;
    }
    if (!durations) v.assign(c.issue.begin(), c.issue.end());
    state.scratch.resize(n);
    for (size_t r = 0; r < n; ++r) state.scratch[r] = std::max((*c.margin)[r], (*state.margin)[r]);
    state.waits->add(v, c.issue, state.scratch, c.last_ns);
  }
  state.done.pop_front();
}

std::vector<double> Detector::take_lateness_samples() {
  std::vector<double> out;
  out.swap(lateness_samples_);
  return out;
}

const NodeState* Detector::node_named(const std::string& name) const {
  // Nodes are never forgotten by the ingest: the pointer stays good.
  if (last_node_ && last_node_->name == name) return last_node_;
  auto it = ingest_.nodes().find(name);
  if (it == ingest_.nodes().end()) return nullptr;
  last_node_ = &it->second;
  return last_node_;
}

const ProcessHealth* Detector::health_of(const MemberState& member) const {
  const NodeState* node = node_named(member.node);
  if (!node) return nullptr;
  auto health = node->health.find(member.pid);
  return health == node->health.end() ? nullptr : &health->second;
}

uint64_t Detector::clock_uncertainty(const std::string& node, uint64_t since_ns) const {
  const NodeState* it = node_named(node);
  return it ? it->clock.uncertainty_since(since_ns) : UINT64_MAX / 4;
}

std::string Detector::describe_rank(const CommState& comm, int32_t rank, uint64_t now_ns) const {
  auto it = comm.members.find(rank);
  if (it == comm.members.end())
    return "rank " + std::to_string(rank) + ": never joined this communicator (no agent reported it)";
  const MemberState& m = it->second;
  std::string who = "pid " + std::to_string(m.pid);
  if (const ProcessInfo* process = ingest_.process(m.node, m.pid)) {
    std::string gpu = process->gpu();
    if (!gpu.empty()) who += ", GPU " + gpu;
    if (!process->user.empty()) who += ", user " + process->user;
    if (!process->account.empty()) who += ", account " + process->account;
    if (!process->slurm_step.empty()) who += ", step " + process->slurm_step;
    if (!process->pod_uid.empty()) who += ", pod " + process->pod_uid;
    if (!process->container_id.empty()) who += ", container " + process->container_id.substr(0, 12);
  }
  std::string text = "rank " + std::to_string(rank) + " on node " + m.node + " (" + who + ")";
  if (m.last_seq >= 0) {
    text += ": last collective #" + std::to_string(m.last_seq) + " issued at " + format_time_ns(m.last_issue_ns);
  } else {
    text += ": no collective issued yet";
  }
  if (m.error)
    text += "; NCCL reported its communicator broken at " + format_time_ns(m.error->ns) + " (" +
            proto::result_name(m.error->async_error ? m.error->async_error : m.error->result) + ")";
  const ProcessHealth* health = health_of(m);
  text += "; process " + (health ? health->describe() : std::string("state unknown"));
  std::string context = host_context(comm, rank);
  if (!context.empty()) text += "; " + context;
  return text;
}

std::string Detector::host_context(const CommState& comm, int32_t rank) const {
  auto it = comm.members.find(rank);
  if (it == comm.members.end()) return {};
  const ProcessHealth* health = health_of(it->second);
  if (!health) return {};
  CpuShares mine = health->shares(options_.context_window_ns);
  if (!mine.known) return {};
  // The peers' medians, once per communicator and evaluation: walking every
  // member's health for each rank explained is O(ranks^2) at scale. Past 8
  // ranks the median of all members stands for the median of the others.
  auto summarise = [&](int32_t except) {
    PeerShares p;
    std::vector<int64_t> running, waiting, off;
    for (const auto& [r, m] : comm.members) {
      if (r == except) continue;
      const ProcessHealth* peer = health_of(m);
      if (!peer) continue;
      CpuShares s = peer->shares(options_.context_window_ns);
      if (!s.known) continue;
      running.push_back(static_cast<int64_t>(s.running * 1000));
      waiting.push_back(static_cast<int64_t>(s.waiting * 1000));
      off.push_back(static_cast<int64_t>(s.off_cpu * 1000));
    }
    p.known = !running.empty();
    p.running = median(running) / 1000.0;
    p.waiting = median(waiting) / 1000.0;
    p.off_cpu = median(off) / 1000.0;
    return p;
  };
  PeerShares peers;
  if (comm.nranks < kPeerCacheMinRanks) {
    peers = summarise(rank);
  } else {
    auto cached = peer_cache_.find(comm.hash);
    if (cached == peer_cache_.end()) cached = peer_cache_.emplace(comm.hash, summarise(-1)).first;
    peers = cached->second;
  }
  std::string text = health->describe_cpu(options_.context_window_ns);
  if (peers.known) {
    if (mine.host)
      text += " (peers, median: off-CPU " + format_percent(peers.off_cpu) + ", waiting for a CPU " +
              format_percent(peers.waiting) + ")";
    else
      text +=
          " (peers, median: ran " + format_percent(peers.running) + ", waited " + format_percent(peers.waiting) + ")";
  }
  std::string neighbours = busy_neighbours(it->second);
  if (!neighbours.empty()) text += "; " + neighbours;
  return text;
}

std::string Detector::busy_neighbours(const MemberState& member) const {
  auto node = ingest_.nodes().find(member.node);
  if (node == ingest_.nodes().end()) return {};
  const ProcessInfo* process = ingest_.process(member.node, member.pid);
  uint64_t own = process ? process->cgroup_id : 0;
  // Other ranks' cgroups on the node are the job itself, not neighbours.
  std::set<uint64_t> job_cgroups{own};
  for (const auto& [pid, health] : node->second.health)
    if (const ProcessInfo* other = ingest_.process(member.node, pid))
      if (process && other->job == process->job) job_cgroups.insert(other->cgroup_id);
  std::vector<std::pair<double, std::string>> busy;
  for (const auto& [id, usage] : node->second.cgroups) {
    if (job_cgroups.count(id)) continue;
    auto rate = usage.rate(node->second.last_monotonic_ns, options_.context_window_ns);
    if (!rate.known || rate.cpus < kBusyNeighbourCpus) continue;
    std::string name = usage.path.empty() ? "cgroup " + std::to_string(id) : usage.path;
    busy.emplace_back(rate.cpus, name);
  }
  if (busy.empty()) return {};
  std::sort(busy.begin(), busy.end(), std::greater<>());
  std::string text = "busiest other cgroups on " + member.node + ": ";
  for (size_t i = 0; i < busy.size() && i < 3; ++i) {
    char cpus[32];
    snprintf(cpus, sizeof(cpus), "%.1f", busy[i].first);
    text += (i ? ", " : "") + busy[i].second + " " + cpus + " CPUs";
  }
  return text;
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
  for (const auto& [name, node] : ingest_.nodes()) {
    uint64_t heard = std::max(node.last_contact_ns, ingest_.started_ns());
    if (now_ns > heard && now_ns - heard > unseen_after) silent_.insert(name);
  }
  forget_retired(now_ns);
  for (const auto& [hash, comm] : ingest_.comms()) {
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
    if (ingest_.live(it->first)) {
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

void Detector::evaluate_hang(const CommState& comm, CommDetect& state, uint64_t now_ns,
                             const std::vector<const Finding*>& open_of_comm) {
  const int32_t n = comm.nranks;
  std::vector<int64_t> last(n, -1);
  bool any_alive = false, any_known = false;
  uint64_t last_activity = 0;
  for (const auto& [rank, m] : comm.members) {
    if (rank < 0 || rank >= n) continue;
    last[rank] = m.last_seq;
    last_activity = std::max(last_activity, m.last_issue_ns);
    const ProcessHealth* health = health_of(m);
    any_known |= health && health->known();
    any_alive |= !health || health->alive();
  }
  if (any_known && !any_alive) {  // the job is gone: nothing hangs any more
    resolve_comm(comm.hash, now_ns);
    return;
  }
  int64_t min_last = *std::min_element(last.begin(), last.end());
  int64_t max_last = *std::max_element(last.begin(), last.end());
  resolve_progressed(state, now_ns, open_of_comm, min_last, max_last, last_activity);
  if (max_last < 0) return;

  Stall stall;
  stall.comm = &comm;
  stall.state = &state;
  stall.finding.kind = FindingKind::hang;
  stall.finding.job = comm.job;
  stall.finding.comm = comm.hash;
  bool noted = min_last < max_last ? note_partial_stall(stall, last, min_last, now_ns)
                                   : note_inside_stall(stall, max_last, last_activity, now_ns);
  if (noted) stalls_.push_back(std::move(stall));
}

void Detector::resolve_progressed(CommDetect& state, uint64_t now_ns, const std::vector<const Finding*>& open_of_comm,
                                  int64_t min_last, int64_t max_last, uint64_t last_activity) {
  for (const Finding* f : open_of_comm) {
    if (is_pair_hang(*f)) continue;  // evaluate_pairs
    std::string key = f->key();
    bool inside = state.all_inside.count(key) > 0;
    if (f->kind == FindingKind::mismatch) {
      // Never resolved by itself: NCCL moving past a mismatched call can
      // mean corrupted data. Said once when every rank went on past it.
      if (min_last > f->seq && f->detail.find(kWentOn) == std::string::npos) {
        Finding told = *f;
        told.detail += std::string("\n") + kWentOn + " " + format_time_ns(last_activity) +
                       ": what it computed since may be corrupt. This finding stays open until acknowledged "
                       "(rankscope ack " + std::to_string(f->id) + ").";
        book_.raise(std::move(told), now_ns);
      }
      continue;
    }
    bool progressed = inside ? max_last > f->seq : min_last >= f->seq;
    if (progressed) {
      state.all_inside.erase(key);
      state.told.erase(key);
      book_.resolve(key, now_ns);
    }
  }
}

bool Detector::note_partial_stall(Stall& stall, const std::vector<int64_t>& last, int64_t min_last, uint64_t now_ns) {
  const CommState& comm = *stall.comm;
  const int32_t n = comm.nranks;
  Finding& f = stall.finding;
  // Some ranks reached N = min_last + 1, the others never entered it.
  uint64_t n_seq = static_cast<uint64_t>(min_last + 1);
  auto [instance_seq, instance] = matcher_.open_from(comm.hash, n_seq);
  if (!instance) return false;
  uint64_t reached_ns = instance->first_issue_ns;
  stall.partial = true;
  stall.since_ns = reached_ns;
  stall.timed_out = now_ns >= reached_ns && now_ns - reached_ns >= options_.hang_timeout_ns;
  f.seq = static_cast<int64_t>(n_seq);
  for (int32_t r = 0; r < n; ++r) {
    if (last[r] != min_last) continue;
    f.ranks.push_back(r);
    if (auto m = comm.members.find(r); m != comm.members.end())
      stall.missing.emplace_back(m->second.node, m->second.pid);
  }
  // Missing ranks whose agent went silent are unseen, not hung: the
  // node_lost finding of their node tells it (and counts this one).
  if (fold_into_lost_nodes(comm, f.ranks, stall.timed_out)) return false;
  // Told (and its culprits narrowed) only if it is raised or folded into
  // one that is: most stalls of a busy fleet are collectives in flight.
  stall.instance = instance;
  stall.instance_seq = instance_seq;
  stall.others = n - static_cast<int>(f.ranks.size());
  return true;
}

bool Detector::note_inside_stall(Stall& stall, int64_t max_last, uint64_t last_activity, uint64_t now_ns) {
  const CommState& comm = *stall.comm;
  CommDetect& state = *stall.state;
  const int32_t n = comm.nranks;
  Finding& f = stall.finding;
  // The detail is the summary (which folding may extend) followed by this.
  std::string& tail = f.detail;
  // Every rank issued the same last collective and nothing moves.
  if (now_ns < last_activity || now_ns - last_activity < options_.hang_timeout_ns) return false;
  std::vector<int32_t> all;
  for (const auto& [rank, m] : comm.members) all.push_back(rank);
  if (fold_into_lost_nodes(comm, all, true)) return false;
  std::vector<int32_t> stuck, busy;
  size_t in_gpu_wait = 0;
  for (const auto& [rank, m] : comm.members) {
    const ProcessHealth* health = health_of(m);
    if (!health || !health->known()) continue;
    in_gpu_wait += health->open_waits().empty() ? 0 : 1;
    if (stuck_process(*health))
      stuck.push_back(rank);
    else if (health->shares(options_.context_window_ns).running > kBusyRunningShare)
      busy.push_back(rank);
  }
  if (stuck.empty() && !busy.empty()) return false;  // ranks busy on the CPU: working, not hung
  stall.since_ns = last_activity;
  stall.timed_out = true;
  f.seq = max_last;
  f.ranks = stuck.empty() ? std::vector<int32_t>{} : stuck;
  if (f.ranks.empty())
    for (int32_t r = 0; r < n; ++r) f.ranks.push_back(r);
  std::string idle = format_time_ns(last_activity);
  if (!stuck.empty())
    f.summary = where("hang", comm) + ": every rank entered collective #" + std::to_string(max_last) + " but rank" +
                (stuck.size() > 1 ? "s " : " ") + join(stuck) +
                " cannot progress (process stopped or exited); nothing has moved since " + idle;
  else
    f.summary = where("hang", comm) + ": all " + std::to_string(n) + " ranks entered collective #" +
                std::to_string(max_last) + " and none has progressed since " + idle +
                ": no rank is missing; suspect the network or a GPU (every process is alive and idle" +
                (in_gpu_wait == static_cast<size_t>(n) ? ", every rank blocked in a CUDA wait)" : ")");
  tail = ".\nRanks:";
  state.all_inside.insert(f.key());
  inside_stalls_[{comm.hash, static_cast<uint64_t>(max_last)}] = stalls_.size();
  return true;
}

void Detector::evaluate_pairs(const CommState& comm, CommDetect& state, uint64_t now_ns,
                              const std::vector<const Finding*>& open_of_comm, bool stalled) {
  if (comm.lanes.empty() || (comm.lanes.size() == 1 && comm.lanes.count(0))) return;  // no Send/Recv
  std::vector<CollectiveMatcher::PendingPair> pending = matcher_.pending_pairs(comm.hash, now_ns);
  // A half whose missing peer issued anything since (in any communicator)
  // is not waited on by a stopped rank: its match was lost before the wire
  // (a full ring buffer), like a sequence gap of a collective.
  pending.erase(std::remove_if(pending.begin(), pending.end(),
                               [&](const auto& p) {
                                 auto m = comm.members.find(p.missing);
                                 if (m == comm.members.end()) return false;
                                 auto h = procs_.find({m->second.node, m->second.pid});
                                 return h != procs_.end() && h->second.last_issue_ns > p.since_ns;
                               }),
                pending.end());
  // A hang in Send/Recv resolves once its missing ranks hold no half back.
  for (const Finding* f : open_of_comm) {
    if (!is_pair_hang(*f)) continue;
    bool held = std::any_of(pending.begin(), pending.end(), [&](const auto& p) {
      return std::find(f->ranks.begin(), f->ranks.end(), p.missing) != f->ranks.end();
    });
    if (held) continue;
    state.told.erase(f->key());
    book_.resolve(f->key(), now_ns);
  }
  if (stalled) return;  // its collectives stall: that tells it (one finding per instance key)
  // Halves waiting for a while: a stall (raised after the hang timeout, or
  // folded with the stalls of the job that wait on it).
  const uint64_t after = std::min(options_.hang_timeout_ns, kPairStallNs);
  std::vector<CollectiveMatcher::PendingPair> stuck;
  for (const auto& p : pending)
    if (now_ns >= p.since_ns && now_ns - p.since_ns >= after) stuck.push_back(p);
  if (stuck.empty()) return;
  std::sort(stuck.begin(), stuck.end(), [](const auto& a, const auto& b) { return a.since_ns < b.since_ns; });
  Stall stall;
  stall.comm = &comm;
  stall.state = &state;
  stall.partial = true;
  stall.since_ns = stuck.front().since_ns;
  stall.timed_out = now_ns - stall.since_ns >= options_.hang_timeout_ns;
  Finding& f = stall.finding;
  f.kind = FindingKind::hang;
  f.job = comm.job;
  f.comm = comm.hash;
  f.seq = static_cast<int64_t>(stuck.front().k);
  std::set<int32_t> missing, waiting;
  for (const auto& p : stuck) missing.insert(p.missing), waiting.insert(p.waiting);
  f.ranks.assign(missing.begin(), missing.end());
  if (fold_into_lost_nodes(comm, f.ranks, stall.timed_out)) return;
  for (int32_t r : f.ranks)
    if (auto m = comm.members.find(r); m != comm.members.end()) stall.missing.emplace_back(m->second.node, m->second.pid);
  std::vector<int32_t> waiters(waiting.begin(), waiting.end());
  const auto& first = stuck.front();
  std::string head = where("hang", comm) + ": ";
  if (stuck.size() == 1)
    f.summary = head + "rank " + std::to_string(first.missing) + kNeverPosted + "the " +
                (first.waiting_receives ? "Send" : "Recv") + " matching rank " + std::to_string(first.waiting) +
                "'s " + (first.waiting_receives ? "Recv" : "Send") + " #" + std::to_string(first.k) + "; rank " +
                std::to_string(first.waiting) + " has waited for it since " + format_time_ns(first.since_ns);
  else
    f.summary = head + "rank" + (f.ranks.size() > 1 ? "s " : " ") + join(f.ranks) + kNeverPosted + "their halves of " +
                std::to_string(stuck.size()) + " Send/Recv pairs; rank" + (waiters.size() > 1 ? "s " : " ") +
                join(waiters) + " have waited since " + format_time_ns(first.since_ns);
  f.detail = ".\nMissing:";
  stalls_.push_back(std::move(stall));
}

bool Detector::is_pair_hang(const Finding& f) {
  return f.kind == FindingKind::hang && f.summary.find(kNeverPosted) != std::string::npos;
}

void Detector::describe_stall(Stall& stall) const {
  Finding& f = stall.finding;
  if (!stall.partial || !f.summary.empty()) return;
  const CommState& comm = *stall.comm;
  const uint64_t n_seq = static_cast<uint64_t>(f.seq);
  std::string call = stall.instance_seq == n_seq ? stall.instance->first.describe() : "the next collective";
  std::string op = proto::op_name(stall.instance->first.op());
  // Of the missing ranks, those whose process is stopped or gone are the
  // culprits; the live ones are most often blocked behind them inside the
  // previous collective, where host tracing cannot see it.
  std::vector<int32_t> stuck;
  for (int32_t r : f.ranks)
    if (auto m = comm.members.find(r); m != comm.members.end())
      if (const ProcessHealth* health = health_of(m->second); health && health->known() && stuck_process(*health))
        stuck.push_back(r);
  if (!stuck.empty() && stuck.size() < f.ranks.size()) {
    for (int32_t r : f.ranks)
      if (std::find(stuck.begin(), stuck.end(), r) == stuck.end()) stall.also_missing.push_back(r);
    f.ranks = stuck;
  }
  f.summary = where("hang", comm) + ": rank" + (f.ranks.size() > 1 ? "s " : " ") + join(f.ranks) + " never entered " +
              op + " #" + std::to_string(n_seq);
  if (!stall.also_missing.empty())
    f.summary += " and cannot progress (process stopped or exited); rank" +
                 std::string(stall.also_missing.size() > 1 ? "s " : " ") + join(stall.also_missing) +
                 " never entered it either (alive)";
  f.summary += "; " + std::to_string(stall.others) + " other rank(s) entered it from " +
               format_time_ns(stall.since_ns) + " on and wait there";
  f.detail = " (" + call + ").\nMissing:";
}

std::vector<Detector::ProcKey> Detector::waits_for(const ProcKey& p, size_t* inside) const {
  *inside = SIZE_MAX;
  std::vector<ProcKey> out;
  auto h = procs_.find(p);
  if (h == procs_.end() || h->second.last_issue_ns == 0) return out;
  const ProcHistory& last = h->second;
  auto comm = ingest_.comms().find(last.last_comm);
  if (comm == ingest_.comms().end() || comm->second.ended) return out;
  if (last.last_lane == 0) {
    if (auto in = inside_stalls_.find({last.last_comm, last.last_seq}); in != inside_stalls_.end()) {
      *inside = in->second;
      return out;
    }
  }
  for (int32_t r : matcher_.awaited(last.last_comm, last.last_rank, last.last_lane, last.last_seq))
    if (auto m = comm->second.members.find(r); m != comm->second.members.end())
      out.emplace_back(m->second.node, m->second.pid);
  return out;
}

void Detector::raise_stalls(uint64_t now_ns) {
  bool any_due = false;
  for (const Stall& s : stalls_) any_due |= s.timed_out;
  if (!any_due) return;
  fold_stalls(link_stalls());
  for (Stall& s : stalls_)
    if (!s.owned && s.timed_out) raise_stall(s, now_ns);
}

bool Detector::tells_better(size_t a, size_t b) const {
  bool open_a = book_.open_finding(stalls_[a].finding.key()) != nullptr;
  bool open_b = book_.open_finding(stalls_[b].finding.key()) != nullptr;
  if (open_a != open_b) return open_a;
  if (stalls_[a].since_ns != stalls_[b].since_ns) return stalls_[a].since_ns < stalls_[b].since_ns;
  return a < b;
}

Detector::StallLinks Detector::link_stalls() {
  // Follow each stall's missing ranks through the exchanges they wait in,
  // to the processes that wait in none (or to a stall every rank is
  // inside). A stall that names one of those itself is where the job is
  // held up; the others stall behind it.
  StallLinks links;
  links.roots.resize(stalls_.size());
  links.insides.resize(stalls_.size());
  links.direct.assign(stalls_.size(), true);
  auto& roots = links.roots;
  auto& insides = links.insides;
  auto& direct = links.direct;
  auto chase = [&](size_t i, const std::vector<ProcKey>& from) {
    std::set<ProcKey> own(from.begin(), from.end()), seen = own;
    std::deque<ProcKey> queue(from.begin(), from.end());
    bool names_root = false;
    for (size_t visited = 0; !queue.empty() && visited < kMaxChase; ++visited) {
      ProcKey p = std::move(queue.front());
      queue.pop_front();
      size_t inside = SIZE_MAX;
      std::vector<ProcKey> next = waits_for(p, &inside);
      if (inside != SIZE_MAX) {
        if (inside != i) insides[i].insert(inside);
        continue;
      }
      if (next.empty()) {
        names_root |= own.count(p) > 0;
        roots[i].push_back(std::move(p));
        continue;
      }
      for (auto& q : next)
        if (seen.insert(q).second) queue.push_back(std::move(q));
    }
    return names_root;
  };
  for (size_t i = 0; i < stalls_.size(); ++i) {
    Stall& s = stalls_[i];
    if (s.partial) {
      direct[i] = chase(i, s.missing) || (roots[i].empty() && insides[i].empty());
      continue;
    }
    // Every rank entered its last collective and nothing moved, but none
    // of them is in it any more: they all went on and wait elsewhere, so
    // it stalls behind whatever holds them.
    std::vector<ProcKey> members;
    bool here = false, elsewhere = false;
    for (const auto& [rank, m] : s.comm->members) {
      members.emplace_back(m.node, m.pid);
      size_t inside = SIZE_MAX;
      elsewhere |= !waits_for(members.back(), &inside).empty();
      here |= inside == i;
      elsewhere |= inside != SIZE_MAX && inside != i;
    }
    if (here || !elsewhere) continue;
    s.finding.summary = where("hang", *s.comm) + ": all " + std::to_string(members.size()) +
                        " ranks went on past collective #" + std::to_string(s.finding.seq) +
                        " and wait in other communicators; nothing has moved since " + format_time_ns(s.since_ns);
    s.finding.ranks.clear();
    for (const auto& [rank, m] : s.comm->members) s.finding.ranks.push_back(rank);
    chase(i, members);
    direct[i] = false;
  }
  return links;
}

void Detector::fold_stalls(const StallLinks& links) {
  const auto& roots = links.roots;
  const auto& insides = links.insides;
  const auto& direct = links.direct;
  // The stalls that name each process as missing.
  std::map<ProcKey, std::vector<size_t>> naming;
  for (size_t i = 0; i < stalls_.size(); ++i)
    for (const ProcKey& p : stalls_[i].missing) naming[p].push_back(i);
  // Stalls that name the same held-up process are one story: the best tells it.
  std::vector<size_t> owner(stalls_.size());
  for (size_t i = 0; i < stalls_.size(); ++i) owner[i] = i;
  std::function<size_t(size_t)> find = [&](size_t i) { return owner[i] == i ? i : owner[i] = find(owner[i]); };
  auto unite = [&](size_t a, size_t b) {
    a = find(a), b = find(b);
    if (a == b) return;
    if (tells_better(a, b))
      owner[b] = a;
    else owner[a] = b;
  };
  for (const auto& [p, named] : naming) {
    size_t first = SIZE_MAX;
    for (size_t c : named) {
      if (!direct[c]) continue;
      if (first == SIZE_MAX) first = c;
      else unite(first, c);
    }
  }
  // A stall behind others joins the best of the stalls it waits on.
  for (size_t i = 0; i < stalls_.size(); ++i) {
    if (direct[i]) continue;
    size_t best = SIZE_MAX;
    auto consider = [&](size_t c) {
      c = find(c);
      if (c != i && (best == SIZE_MAX || tells_better(c, best))) best = c;
    };
    for (const ProcKey& p : roots[i])
      if (auto named = naming.find(p); named != naming.end())
        for (size_t c : named->second)
          if (direct[c]) consider(c);
    for (size_t c : insides[i])
      if (direct[c]) consider(c);
    if (best != SIZE_MAX) {
      owner[i] = best;
      continue;
    }
    // Held up by ranks whose agent went silent: their node's finding tells it.
    bool all_unseen = !roots[i].empty() && insides[i].empty();
    for (const ProcKey& p : roots[i]) all_unseen &= unseen(p.first);
    if (all_unseen && stalls_[i].timed_out) {
      for (const ProcKey& p : roots[i]) folded_[p.first].insert(stalls_[i].comm->hash);
      stalls_[i].owned = true;
    }
  }
  for (size_t i = 0; i < stalls_.size(); ++i) {
    size_t o = find(i);
    if (o == i) continue;
    stalls_[i].owned = true;
    stalls_[o].folded.push_back(i);
    stalls_[o].timed_out |= stalls_[i].timed_out;
  }
}

void Detector::raise_stall(Stall& stall, uint64_t now_ns) {
  const CommState& comm = *stall.comm;
  describe_stall(stall);
  for (size_t k : stall.folded) describe_stall(stalls_[k]);
  Finding f = stall.finding;
  // The story is told once, when the hang is found; it is rewritten only if
  // the culprits change, what their processes are doing does (a rank found
  // missing that then dies: its signal belongs in the story), or more
  // communicators stall behind it.
  std::string states;
  const size_t told = std::min(f.ranks.size(), kJoined);  // the ranks the story names one by one
  for (size_t i = 0; i < told; ++i) {
    int32_t r = f.ranks[i];
    auto m = comm.members.find(r);
    const ProcessHealth* health = m == comm.members.end() ? nullptr : health_of(m->second);
    states += std::to_string(r) + ":" + (health ? health->describe() : "?") + ";";
  }
  states += "behind:" + std::to_string(stall.folded.size());
  const Finding* open = book_.open_finding(f.key());
  if (open && open->ranks == f.ranks && stall.state->told[f.key()] == states) return;
  stall.state->told[f.key()] = states;
  if (!stall.folded.empty())
    f.summary += "; " + std::to_string(stall.folded.size()) + " other communicator(s) stall behind it";
  f.detail = f.summary + f.detail;
  for (size_t i = 0; i < told; ++i) f.detail += "\n  " + describe_rank(comm, f.ranks[i], now_ns);
  if (f.ranks.size() > told) f.detail += "\n  ... and " + std::to_string(f.ranks.size() - told) + " more rank(s)";
  if (!stall.also_missing.empty()) {
    f.detail += "\nAlso missing, alive:";
    for (size_t i = 0; i < stall.also_missing.size() && i < kJoined; ++i)
      f.detail += "\n  " + describe_rank(comm, stall.also_missing[i], now_ns);
  }
  if (!stall.folded.empty()) {
    // Oldest first: the order the job stopped in.
    std::vector<size_t> behind = stall.folded;
    std::sort(behind.begin(), behind.end(),
              [&](size_t a, size_t b) { return stalls_[a].since_ns < stalls_[b].since_ns; });
    f.detail += "\nStalled behind it (their ranks wait on this one; not reported as separate hangs):";
    for (size_t k = 0; k < behind.size() && k < kFoldedTold; ++k)
      f.detail += "\n  " + stalls_[behind[k]].finding.summary;
    if (behind.size() > kFoldedTold)
      f.detail += "\n  ... and " + std::to_string(behind.size() - kFoldedTold) + " more communicator(s)";
  }
  for (int32_t r : f.ranks) {
    auto m = comm.members.find(r);
    if (m != comm.members.end() && std::find(f.nodes.begin(), f.nodes.end(), m->second.node) == f.nodes.end())
      f.nodes.push_back(m->second.node);
  }
  book_.raise(std::move(f), now_ns);
}

void Detector::refresh_margins(const CommState& comm, CommDetect& state) const {
  // A rank is compared with the others: its clock's error and the largest
  // of theirs add up. The largest among the others is the largest overall,
  // or the second largest for the rank that holds the largest: O(n).
  // Records of the last few seconds may have been put on the cluster clock
  // with an estimate a tighter probe replaced since: its error counts.
  const uint64_t now = clock_.realtime_ns();
  const uint64_t since = now > kMarginMemoryNs ? now - kMarginMemoryNs : 0;
  const int32_t n = comm.nranks;
  std::vector<uint64_t> u(n, UINT64_MAX / 4);
  for (const auto& [rank, m] : comm.members)
    if (rank >= 0 && rank < n) u[rank] = clock_uncertainty(m.node, since);
  int32_t top = 0;
  for (int32_t r = 1; r < n; ++r)
    if (u[r] > u[top]) top = r;
  uint64_t second = 0;
  for (int32_t r = 0; r < n; ++r)
    if (r != top) second = std::max(second, u[r]);
  auto margin = std::make_shared<std::vector<uint64_t>>(n);
  for (int32_t r = 0; r < n; ++r) (*margin)[r] = std::min(UINT64_MAX / 2, u[r] + (r == top ? second : u[top]));
  state.margin = std::move(margin);
}

void Detector::evaluate_stragglers(const CommState& comm, CommDetect& state, uint64_t now_ns,
                                   const std::set<int32_t>* open_ranks) {
  const int32_t n = comm.nranks;
  if (n < 2) return;
  std::vector<Standing> standings = state.waits->standings();
  for (int32_t r = 0; r < n; ++r) {
    RankStats& stats = state.ranks[r];
    const Standing& st = standings[r];
    bool is_open = open_ranks && open_ranks->count(r) > 0;
    state.waits->set_open(r, is_open);
    stats.under = st.under ? stats.under + 1 : 0;
    Finding key_probe = straggler_of(comm.hash, r);
    if (is_open && stats.under >= options_.close_after) {
      book_.resolve(key_probe.key(), now_ns);
      state.waits->set_open(r, false);
      continue;
    }
    if (!st.over) continue;
    // Figures are refreshed every 10 s; an explanation that became available
    // is added at once. The host context is worked out only then (not for
    // every rank over at every evaluation: at 8,192 ranks that kept the
    // collector from keeping up).
    std::string key = key_probe.key();
    const Finding* open = is_open ? book_.open_finding(key) : nullptr;
    bool refresh = !open || now_ns - open->updated_ns >= kStragglerUpdateNs;
    bool unexplained = open && open->detail.find("\nWhy: ") == std::string::npos;
    if (!refresh && !unexplained) continue;
    std::string context = host_context(comm, r);
    if (!refresh && context.empty()) continue;

    Finding f = key_probe;
    f.job = comm.job;
    f.seq = -1;
    double lateness = st.lateness_ns;
    f.lateness_s = lateness / 1e9;
    f.wait_share = std::min(1.0, st.share);
    // Opening: the waste already seen in the evidence counts.
    f.gpu_hours_lost = std::max(st.gpu_ns, static_cast<double>(st.owed_ns) * (n - 1)) / 1e9 / 3600.0;
    auto m = comm.members.find(r);
    std::string placed =
        m == comm.members.end() ? "" : " on " + m->second.node + " (pid " + std::to_string(m->second.pid) + ")";
    if (m != comm.members.end()) f.nodes.push_back(m->second.node);
    char figures[320];
    snprintf(figures, sizeof(figures),
             "held up %u of the last %zu collectives, %s late when it did; the other %d ranks spent %s of the time "
             "waiting for it",
             st.held, st.instances, format_duration_ns(static_cast<int64_t>(lateness)).c_str(), n - 1,
             format_percent(f.wait_share).c_str());
    f.summary = where("straggler", comm) + ": rank " + std::to_string(r) + placed + " " + figures;
    char cost[160];
    snprintf(cost, sizeof(cost), "GPU-hours lost waiting for it so far: %.4f (%d GPUs idle while it was late)",
             f.gpu_hours_lost, n - 1);
    char why[480];
    snprintf(why, sizeof(why),
             "Waiting owed to it: %s of the job's time over the last %s (a typical rank: %s; its own structural share: "
             "%s), against an allowance of %s; evidence %s beyond the allowance (a finding opens at %s). Its lateness "
             "is its own (time from when it was free to go on, the end of its previous exchange, against the others'), "
             "less the clocks' uncertainty of %s.",
             format_percent(st.share).c_str(), format_duration_ns(static_cast<int64_t>(st.window_ns)).c_str(),
             format_percent(st.typical).c_str(), format_percent(st.baseline).c_str(),
             format_percent(st.allowance).c_str(), format_duration_ns(static_cast<int64_t>(st.evidence_ns)).c_str(),
             format_duration_ns(static_cast<int64_t>(options_.straggler.evidence_ns)).c_str(),
             format_duration_ns(static_cast<int64_t>(state.margin ? (*state.margin)[r] : 0)).c_str());
    f.detail = f.summary + ".\n" + cost + ".\n" + why;
    if (!context.empty()) f.detail += "\nWhy: " + context + ".";
    book_.raise(std::move(f), now_ns);
    state.waits->set_open(r, true);
  }
}

bool Detector::fold_into_lost_nodes(const CommState& comm, const std::vector<int32_t>& ranks, bool note) {
  // Folded when the ranks in question are all unseen (the missing ranks of a
  // partial hang), or, for ranks all inside, when any member is unseen (its
  // progress cannot be known).
  std::set<std::string> nodes;
  size_t unseen_ranks = 0;
  for (int32_t r : ranks) {
    auto m = comm.members.find(r);
    if (m == comm.members.end() || !unseen(m->second.node)) continue;
    nodes.insert(m->second.node);
    unseen_ranks += 1;
  }
  bool all_inside = ranks.size() == comm.members.size() && !ranks.empty();
  if (nodes.empty() || (!all_inside && unseen_ranks < ranks.size())) return false;
  if (note)
    for (const auto& node : nodes) folded_[node].insert(comm.hash);
  return true;
}

void Detector::evaluate_nodes(uint64_t now_ns) {
  // Which live ranks (and jobs) each node runs, gathered only when some node
  // is silent, in one pass over the members (not one pass per node).
  std::map<std::string, std::pair<std::vector<int32_t>, std::set<std::string>>> ran;
  bool gathered = false;
  for (const auto& [name, node] : ingest_.nodes()) {
    // After a restart, a node's last contact is at least our own start.
    uint64_t heard = std::max(node.last_contact_ns, ingest_.started_ns());
    bool silent = now_ns > heard && now_ns - heard > options_.node_lost_timeout_ns;
    if (!silent) {
      if (open_lost_.count(name)) {
        Finding f;
        f.kind = FindingKind::node_lost;
        f.nodes = {name};
        book_.resolve(f.key(), now_ns);
      }
      folded_told_.erase(name);
      continue;
    }
    Finding f;
    f.kind = FindingKind::node_lost;
    f.nodes = {name};
    if (!gathered) {
      for (const auto& [hash, comm] : ingest_.comms()) {
        if (comm.ended) continue;
        for (const auto& [rank, m] : comm.members) {
          const ProcessHealth* health = health_of(m);
          if (health && !health->alive()) continue;
          auto& [ranks, jobs] = ran[m.node];
          if (std::find(ranks.begin(), ranks.end(), rank) == ranks.end()) ranks.push_back(rank);
          jobs.insert(comm.job);
        }
      }
      gathered = true;
    }
    std::set<std::string> jobs;
    if (auto it = ran.find(name); it != ran.end()) {
      f.ranks = it->second.first;
      jobs = it->second.second;
    }
    if (f.ranks.empty()) continue;  // nothing of value ran there
    std::sort(f.ranks.begin(), f.ranks.end());
    for (const auto& job : jobs) f.job += (f.job.empty() ? "" : ",") + job;
    f.summary = "node " + name + " lost: its agent has been silent since " + format_time_ns(heard) +
                "; it ran rank(s) " + join(f.ranks) + " of job " + f.job;
    f.detail = f.summary + ".\nLast contact " + format_time_ns(node.last_contact_ns) +
               ". The node, its network or its agent is down; rankscope cannot see these ranks until it returns.";
    size_t& told = folded_told_[name];  // only grows while the node stays lost: no rewrite every tick
    if (auto folded = folded_.find(name); folded != folded_.end()) told = std::max(told, folded->second.size());
    if (told > 0)
      f.detail += "\nThe other ranks of " + std::to_string(told) +
                  " communicator(s) wait on these unseen ranks; those waits are not reported as separate hangs.";
    book_.raise(std::move(f), now_ns);
  }
}

}  // namespace rankscope::collector
