// The hang detector: collectives and Send/Recv pairs some ranks wait in for
// longer than the hang timeout, followed to the rank holding the job up.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string_view>

#include "collector/detect/detector.h"
#include "collector/detect/text.h"
#include "common/format.h"
#include "proto/records.h"

namespace rankscope::collector {

namespace {
// The note a mismatch finding gets when the job goes on past it.
constexpr const char* kWentOn = "Every rank went on past this collective by";
// The note a mismatch finding gets while other communicators of its job wait behind it.
constexpr const char* kHeldBehind = "Held behind it: ";
// Send/Recv halves waiting this long (or the hang timeout, if shorter) are a stall.
constexpr uint64_t kPairStallNs = 1'000'000'000ull;
// How a hang in Send/Recv says what is missing (and how it is told from a collective's).
constexpr const char* kNeverPosted = " never posted ";
// An agent tells what it captured at least at each heartbeat, every second:
// a node that told it within this much of a stall's due time is taken as
// having told it (nodes heartbeat out of step; the stalls of one stopped
// rank fall due in the order they stalled).
constexpr uint64_t kReportSlackNs = 1'000'000'000ull;
// Stalls folded into a hang that its detail names one by one.
constexpr size_t kFoldedTold = 16;
// Every rank inside a collective that does not move, but some running on
// the CPU more than this share of the context window: working, not hung.
constexpr double kBusyRunningShare = 0.2;
// A process that cannot take part in anything: stopped, exited, a zombie.
bool stuck_process(const ProcessHealth& health) {
  return !health.alive() || health.state() == 'T' || health.state() == 't' || health.state() == 'Z';
}
}  // namespace

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
                       "(rankscope ack " +
                       std::to_string(f->id) + ").";
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
  if (stall.timed_out) stall.timed_out = judged_now(*stall.state, {0, f.seq}, missing_nodes(stall), reached_ns, now_ns);
  // Missing ranks whose agent went silent are unseen, not hung: the
  // node_lost finding of their node tells it (and counts this one).
  if (fold_into_lost_nodes(comm, f.ranks, stall.timed_out)) return false;
  // Told (and its culprits narrowed) only if it is raised or folded into
  // one that is: most stalls of a busy fleet are collectives in flight.
  stall.instance = instance;
  stall.instance_seq = instance_seq;
  stall.others = n - static_cast<int>(f.ranks.size());
  // Ranks that called something else: the ranks that issued it wait there
  // for ever (or NCCL moves past it with what it computed wrong).
  if (instance_seq == n_seq && instance->mismatched) {
    stall.mismatch = true;
    inside_stalls_[{comm.hash, n_seq}] = stalls_.size();
  }
  return true;
}

std::vector<const std::string*> Detector::missing_nodes(const Stall& stall) const {
  std::vector<const std::string*> nodes;
  for (const ProcKey& p : stall.missing) nodes.push_back(&p.first);
  // A missing rank no agent reported: its node may be one not heard in full yet.
  if (untold_nodes_ && stall.missing.size() < stall.finding.ranks.size()) nodes.push_back(nullptr);
  return nodes;
}

bool Detector::judged_now(CommDetect& state, std::pair<int64_t, int64_t> which,
                          const std::vector<const std::string*>& nodes, uint64_t since_ns, uint64_t now_ns) {
  bool told = true;
  for (const std::string* node : nodes) told = told && node && reported_past(*node, since_ns);
  if (told) return true;
  if (state.held_stall != which) {
    state.held_stall = which;
    state.held_since_ns = now_ns;
  }
  return now_ns >= state.held_since_ns + options_.hang_timeout_ns;
}

Detector::GpuSplit Detector::gpu_split(const CommState& comm) const {
  GpuSplit split;
  for (const auto& [rank, m] : comm.members) {
    const ProcessHealth* health = health_of(m);
    if (!health) continue;
    const GpuOpen* oldest = nullptr;  // of this communicator, any op
    for (const auto& g : health->gpu_open())
      if (g.comm == comm.hash && (!oldest || g.enqueued_ns < oldest->enqueued_ns)) oldest = &g;
    if (!oldest) continue;
    if (!oldest->detail && !oldest->proxy_steps)  // proxy steps seen: on, from an agent that predates `detail`
      split.without_detail.push_back(rank);
    else if (!oldest->proxy_steps)
      split.without_steps.push_back(rank);
    if (oldest->send_peer >= 0 && oldest->send_peer < comm.nranks && oldest->send_peer != rank &&
        oldest->send_since_ns != 0 && (split.link_from < 0 || oldest->send_since_ns < split.link_since_ns)) {
      split.link_from = rank;
      split.link_to = oldest->send_peer;
      split.link_since_ns = oldest->send_since_ns;
    }
    if (oldest->kernel_start_ns != 0) {
      ++split.started;
    } else {
      split.not_started.push_back(rank);
      split.enqueued_ns = std::max(split.enqueued_ns, oldest->enqueued_ns);
    }
  }
  return split;
}

// What NCCL's proxy steps tell of a collective every rank entered and no
// stopped process holds, when no GPU and no stopped link can be named.
std::string Detector::inside_cause(const GpuSplit& gpu, int32_t n) {
  if (!gpu.all_started(n)) return "suspect the network or a GPU";
  auto ranks = [](const std::vector<int32_t>& rs) { return "rank" + std::string(rs.size() > 1 ? "s " : " ") + join(rs); };
  const size_t unseen = gpu.without_detail.size() + gpu.without_steps.size();
  std::string out = "every rank's kernels started and none finished";
  if (gpu.link_from >= 0)  // held, but not long enough to call the link stopped
    out += "; the network has held rank " + std::to_string(gpu.link_from) + "'s data for rank " +
           std::to_string(gpu.link_to) + " only since " + format_time_ns(gpu.link_since_ns) + " (NCCL's proxy steps)";
  else if (unseen < static_cast<size_t>(n))
    out += std::string("; NCCL's proxy steps show no data held by the network") + (unseen ? " on the other ranks" : "");
  if (!gpu.without_detail.empty())
    out += "; NCCL's proxy steps were not on when it was enqueued" +
           (gpu.without_detail.size() == static_cast<size_t>(n) ? std::string(", so no link can be named")
                                                                 : " on " + ranks(gpu.without_detail) +
                                                                       ", so no link of theirs can be named");
  if (!gpu.without_steps.empty())
    out += "; " + ranks(gpu.without_steps) +
           " reported no network step of it (every peer on their node, where no proxy step reports, or proxy steps "
           "off when NCCL scheduled it)";
  if (gpu.link_from >= 0 || !gpu.without_detail.empty())
    return out + ": suspect the network (a link) or a GPU inside the collective";
  if (!gpu.without_steps.empty())
    return out + ": suspect a GPU, or a link those steps do not show (inside a node: NVLink, PCIe), inside the "
                 "collective";
  return out + ": suspect a GPU inside the collective";
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
  std::vector<const std::string*> nodes;
  for (const auto& [rank, m] : comm.members) nodes.push_back(&m.node);
  if (!judged_now(state, {1, max_last}, nodes, last_activity, now_ns)) return false;
  std::vector<int32_t> all;
  for (const auto& [rank, m] : comm.members) all.push_back(rank);
  if (fold_into_lost_nodes(comm, all, true)) return false;
  std::vector<int32_t> stuck, busy;
  size_t in_gpu_wait = 0;
  for (const auto& [rank, m] : comm.members) {
    const ProcessHealth* health = health_of(m);
    if (!health || !health->known()) continue;
    in_gpu_wait += health->open_waits().empty() ? 0 : 1;
    if (stuck_process(*health)) {
      stuck.push_back(rank);
      stall.stuck.emplace_back(m.node, m.pid);
    } else if (health->shares(options_.context_window_ns).running > kBusyRunningShare)
      busy.push_back(rank);
  }
  if (stuck.empty() && !busy.empty()) return false;  // ranks busy on the CPU: working, not hung
  stall.since_ns = last_activity;
  stall.timed_out = true;
  f.seq = max_last;
  const GpuSplit gpu = stuck.empty() ? gpu_split(comm) : GpuSplit{};
  // Every GPU inside and waiting, and one send handed to the network long
  // before and never done: that link stopped moving.
  const bool link = !gpu.named() && gpu.all_started(n) && gpu.link_from >= 0 && now_ns > gpu.link_since_ns &&
                    now_ns - gpu.link_since_ns >= options_.hang_timeout_ns / 2;
  f.ranks = !stuck.empty()  ? stuck
            : gpu.named()   ? gpu.not_started
            : link          ? std::vector<int32_t>{gpu.link_from, gpu.link_to}
                            : std::vector<int32_t>{};
  if (f.ranks.empty())
    for (int32_t r = 0; r < n; ++r) f.ranks.push_back(r);
  std::string idle = format_time_ns(last_activity);
  if (!stuck.empty())
    f.summary = where("hang", comm) + ": every rank entered collective #" + std::to_string(max_last) + " but rank" +
                (stuck.size() > 1 ? "s " : " ") + join(stuck) +
                " cannot progress (process stopped or exited); nothing has moved since " + idle;
  else if (gpu.named())
    f.summary = where("hang", comm) + ": every rank entered collective #" + std::to_string(max_last) +
                " and none has progressed since " + idle + ": the GPU of rank" +
                (gpu.not_started.size() > 1 ? "s " : " ") + join(gpu.not_started) +
                " never started its collective (NCCL enqueued it at " + format_time_ns(gpu.enqueued_ns) +
                "; a kernel before it never finished: a hung GPU, or work stuck on its stream), while the other " +
                "ranks' kernels started and wait for its data; every process is alive" +
                (in_gpu_wait == static_cast<size_t>(n) ? ", every rank blocked in a CUDA wait" : "");
  else if (link) {
    auto node_of = [&](int32_t r) {
      auto m = comm.members.find(r);
      return m == comm.members.end() || m->second.node.empty() ? std::string() : " on " + m->second.node;
    };
    f.summary = where("hang", comm) + ": all " + std::to_string(n) + " ranks entered collective #" +
                std::to_string(max_last) + " and none has progressed since " + idle +
                ": every rank's kernels started and wait; rank " + std::to_string(gpu.link_from) +
                node_of(gpu.link_from) + " handed its data for rank " + std::to_string(gpu.link_to) +
                node_of(gpu.link_to) + " to the network at " + format_time_ns(gpu.link_since_ns) +
                " and the network never finished with it: the link " + std::to_string(gpu.link_from) + " -> " +
                std::to_string(gpu.link_to) + " stopped moving (NCCL's proxy steps; every process is alive" +
                (in_gpu_wait == static_cast<size_t>(n) ? ", every rank blocked in a CUDA wait)" : ")");
  } else
    f.summary = where("hang", comm) + ": all " + std::to_string(n) + " ranks entered collective #" +
                std::to_string(max_last) + " and none has progressed since " + idle + ": no rank is missing; " +
                inside_cause(gpu, n) + " (every process is alive and idle" +
                (in_gpu_wait == static_cast<size_t>(n) ? ", every rank blocked in a CUDA wait)" : ")");
  tail = ".\nRanks:";
  state.all_inside.insert(f.key());
  inside_stalls_[{comm.hash, static_cast<uint64_t>(max_last)}] = stalls_.size();
  stall.mismatch = matcher_.mismatched(comm.hash, static_cast<uint64_t>(max_last));
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
                                 return h != procs_.end() && h->second.last_issue_ns() > p.since_ns;
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
  for (int32_t r : f.ranks)
    if (auto m = comm.members.find(r); m != comm.members.end())
      stall.missing.emplace_back(m->second.node, m->second.pid);
  if (stall.timed_out) stall.timed_out = judged_now(state, {2, f.seq}, missing_nodes(stall), stall.since_ns, now_ns);
  if (fold_into_lost_nodes(comm, f.ranks, stall.timed_out)) return;
  std::vector<int32_t> waiters(waiting.begin(), waiting.end());
  const auto& first = stuck.front();
  std::string head = where("hang", comm) + ": ";
  if (stuck.size() == 1)
    f.summary = head + "rank " + std::to_string(first.missing) + kNeverPosted + "the " +
                (first.waiting_receives ? "Send" : "Recv") + " matching rank " + std::to_string(first.waiting) + "'s " +
                (first.waiting_receives ? "Recv" : "Send") + " #" + std::to_string(first.k) + "; rank " +
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

// Who waits on whom: a process waits in the calls it made that did not
// complete, on the ranks those calls await. Each exchange's waiters are
// followed once per evaluation, memoized with what they reach: a job's
// world collective that thousands of ranks never entered is one exchange,
// not thousands of searches of thousands of processes.
class Detector::WaitGraph {
 public:
  // The processes waited on at the end of the chains (waiting in nothing),
  // and the stalls every rank is inside that the chains end in.
  struct Reach {
    std::set<ProcKey> roots;
    std::set<size_t> insides;
    bool mismatch = false;  // a chain ends at a mismatched collective
  };
  explicit WaitGraph(const Detector& detector) : d_(detector) {}

  // The calls `p` waits in: its latest, if that has not completed; else,
  // unless it is stopped or gone, the earlier of its latest calls that
  // have not (the calls of a group run side by side: a pipeline stage's
  // last half matched, an earlier one waits on a stage that never posted
  // its own). `inside`: its latest call (or, where none of them waits,
  // an earlier one) is in a stall every rank is inside. `mismatch`: it
  // waits in a collective whose ranks called different things.
  std::vector<size_t> waiting(const ProcKey& p, size_t* inside, bool* mismatch) {
    *inside = SIZE_MAX;
    *mismatch = false;
    std::vector<size_t> calls;
    auto h = d_.procs_.find(p);
    if (h == d_.procs_.end() || h->second.last_issue_ns() == 0) return calls;
    const std::vector<ProcHistory::Call>& recent = h->second.recent;
    if (open_call(recent.back(), calls, inside, mismatch) || *inside != SIZE_MAX || *mismatch) return calls;
    // A stopped or exited process is where the job is held, whatever it called before.
    if (const NodeState* node = d_.node_named(p.first)) {
      auto health = node->health.find(p.second);
      if (health != node->health.end() && health->second.known() && stuck_process(health->second)) return calls;
    }
    size_t inside_earlier = SIZE_MAX;
    for (auto call = recent.rbegin() + 1; call != recent.rend(); ++call) {  // the latest: above
      size_t in = SIZE_MAX;
      bool mismatched = false;
      open_call(*call, calls, &in, &mismatched);
      if (inside_earlier == SIZE_MAX) inside_earlier = in;
      *mismatch |= mismatched;
    }
    if (!calls.empty()) *mismatch = false;
    if (calls.empty() && !*mismatch) *inside = inside_earlier;
    return calls;
  }

  // Adds what `p` waits on to `out`; true when `p` itself waits in nothing.
  bool reach(const ProcKey& p, Reach& out, size_t depth = 0) {
    size_t inside = SIZE_MAX;
    bool mismatch = false;
    std::vector<size_t> calls = waiting(p, &inside, &mismatch);
    if (mismatch) {
      out.mismatch = true;
      return false;
    }
    if (inside != SIZE_MAX) {
      if (out.insides.size() < kMaxReach) out.insides.insert(inside);
      return false;
    }
    if (calls.empty()) {
      if (out.roots.size() < kMaxReach) out.roots.insert(p);
      return true;
    }
    if (depth >= kMaxDepth) return false;
    for (size_t c : calls) {
      const Reach& r = reach_call(c, depth + 1);
      for (const ProcKey& root : r.roots)
        if (out.roots.size() < kMaxReach) out.roots.insert(root);
      for (size_t in : r.insides)
        if (out.insides.size() < kMaxReach) out.insides.insert(in);
      out.mismatch |= r.mismatch;
    }
    return false;
  }

 private:
  // Bounds: what one chain reaches (a hang names a few processes), and how
  // long a chain is followed (each link two frames of the stack).
  static constexpr size_t kMaxReach = 256;
  static constexpr size_t kMaxDepth = 512;
  struct Node {
    std::vector<ProcKey> awaited;
    enum { fresh, following, done } state = fresh;
    Reach reach;
  };

  // Whether `call` waits on someone (adding its node to `calls`), or sets
  // `inside` where it is in a stall every rank is inside (or a mismatched
  // collective's stall), or `mismatch` where its collective is mismatched.
  bool open_call(const ProcHistory::Call& call, std::vector<size_t>& calls, size_t* inside, bool* mismatch) {
    auto comm = d_.model_.comms.find(call.comm);
    if (comm == d_.model_.comms.end() || comm->second.ended) return false;
    if (call.lane == 0) {
      if (auto in = d_.inside_stalls_.find({call.comm, call.seq}); in != d_.inside_stalls_.end()) {
        *inside = in->second;
        return false;
      }
      if (d_.matcher_.mismatched(call.comm, call.seq)) {
        *mismatch = true;
        return false;
      }
    }
    // A collective's instance is one node for all its ranks; a Send/Recv
    // half is its own.
    auto key = std::make_tuple(call.comm, call.lane == 0 ? -1 : call.rank, call.lane, call.seq);
    auto [at, fresh] = index_.try_emplace(key, nodes_.size());
    if (fresh) {
      Node& node = nodes_.emplace_back();
      for (int32_t r : d_.matcher_.awaited(call.comm, call.rank, call.lane, call.seq))
        if (auto m = comm->second.members.find(r); m != comm->second.members.end())
          node.awaited.emplace_back(m->second.node, m->second.pid);
    }
    if (nodes_[at->second].awaited.empty()) return false;
    calls.push_back(at->second);
    return true;
  }

  const Reach& reach_call(size_t n, size_t depth) {
    static const Reach kNothing;
    Node& node = nodes_[n];  // a deque: nodes added while following stay put
    if (node.state == Node::done) return node.reach;
    if (node.state == Node::following) return kNothing;  // a cycle
    node.state = Node::following;
    Reach r;
    for (const ProcKey& q : node.awaited) reach(q, r, depth);
    node.reach = std::move(r);
    node.state = Node::done;
    return node.reach;
  }

  const Detector& d_;
  std::map<std::tuple<uint64_t, int32_t, uint32_t, uint64_t>, size_t> index_;
  std::deque<Node> nodes_;
};

bool Detector::reported_past(const std::string& node, uint64_t since_ns) const {
  const NodeState* state = node_named(node);
  return !state || state->reported_ns == 0 ||
         state->reported_ns + kReportSlackNs >= since_ns + options_.hang_timeout_ns;
}

void Detector::raise_stalls(uint64_t now_ns) {
  bool any_due = false;
  for (const Stall& s : stalls_) any_due |= s.timed_out;
  if (!any_due) return;
  fold_stalls(link_stalls());
  for (Stall& s : stalls_)
    if (!s.owned && s.timed_out && !s.mismatch) raise_stall(s, now_ns);
  tell_held_behind_mismatch(now_ns);
}

void Detector::tell_held_behind_mismatch(uint64_t now_ns) {
  // By job: the stalls at a mismatched collective, and those folded into them.
  std::map<std::string_view, std::set<const Stall*>> held;
  for (const Stall& s : stalls_) {
    if (!s.timed_out || !s.mismatch || !s.comm) continue;
    held[s.comm->job].insert(&s);
    for (size_t k : s.folded) held[s.comm->job].insert(&stalls_[k]);
  }
  if (held.empty()) return;
  for (const Finding* f : book_.open()) {
    if (f->kind != FindingKind::mismatch) continue;
    auto of_job = held.find(f->job);
    if (of_job == held.end()) continue;
    size_t others = 0;
    uint64_t since = UINT64_MAX;
    for (const Stall* s : of_job->second)
      if (s->comm->hash != f->comm) ++others, since = std::min(since, s->since_ns);
    if (others == 0) continue;
    std::string detail = f->detail;
    if (auto at = detail.find(std::string("\n") + kHeldBehind); at != std::string::npos) {
      auto end = detail.find('\n', at + 1);
      detail.erase(at, end == std::string::npos ? std::string::npos : end - at);
    }
    detail += std::string("\n") + kHeldBehind + std::to_string(others) + " other communicator" +
              (others == 1 ? "" : "s") + " of this job, stalled since " + format_time_ns(since) +
              " (no hang is raised for them: this collective holds them).";
    if (detail == f->detail) continue;
    Finding told = *f;
    told.detail = std::move(detail);
    book_.raise(std::move(told), now_ns);
  }
}

bool Detector::tells_better(size_t a, size_t b, const std::vector<char>& open) const {
  if (stalls_[a].mismatch != stalls_[b].mismatch) return stalls_[a].mismatch;
  if (open[a] != open[b]) return open[a];
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
  WaitGraph graph(*this);
  // Whether a process it starts from waits in nothing: the stall names
  // where the job is held.
  auto chase = [&](size_t i, const std::vector<ProcKey>& from) {
    WaitGraph::Reach reach;
    bool names_root = false;
    for (const ProcKey& p : from) names_root |= graph.reach(p, reach);
    roots[i].assign(reach.roots.begin(), reach.roots.end());
    reach.insides.erase(i);
    insides[i] = std::move(reach.insides);
    // Held at a mismatched collective and nowhere else: its finding tells it.
    if (reach.mismatch && roots[i].empty() && insides[i].empty()) stalls_[i].mismatch = true;
    return names_root;
  };
  auto link = [&](size_t i) {
    Stall& s = stalls_[i];
    if (s.mismatch) return;  // the job is held here
    if (s.partial) {
      direct[i] = chase(i, s.missing) || (roots[i].empty() && insides[i].empty());
      return;
    }
    // Every rank entered its last collective and nothing moved, but none
    // of them is in it any more: they all went on and wait elsewhere, so
    // it stalls behind whatever holds them.
    std::vector<ProcKey> members, in_here;
    bool here = false, elsewhere = false;
    for (const auto& [rank, m] : s.comm->members) {
      members.emplace_back(m.node, m.pid);
      size_t inside = SIZE_MAX;
      bool mismatch = false;
      elsewhere |= !graph.waiting(members.back(), &inside, &mismatch).empty() || mismatch;
      here |= inside == i;
      if (inside == i) in_here.push_back(members.back());
      elsewhere |= inside != SIZE_MAX && inside != i;
    }
    if (here) {
      // Every rank is inside it, but one whose latest call it is entered,
      // before it, the stalled collective of another communicator: NCCL runs
      // a process's work on its GPU in the order it was issued, so this one
      // cannot move before that one does. It stalls behind it.
      std::set<size_t> before = entered_elsewhere(i, in_here);
      if (!before.empty()) {
        insides[i].insert(before.begin(), before.end());
        direct[i] = false;
      }
      return;
    }
    if (!elsewhere) return;
    s.finding.summary = where("hang", *s.comm) + ": all " + std::to_string(members.size()) +
                        " ranks went on past collective #" + std::to_string(s.finding.seq) +
                        " and wait in other communicators; nothing has moved since " + format_time_ns(s.since_ns);
    s.finding.ranks.clear();
    for (const auto& [rank, m] : s.comm->members) s.finding.ranks.push_back(rank);
    s.stuck.clear();  // a stopped member waits in another stall: that one names it
    chase(i, members);
    direct[i] = false;
  };
  // Only the jobs of the stalls that timed out are linked: a stall waits
  // on processes of its own job, and a fleet's every collective in flight
  // is a stall (linking them all, whenever one job hung anywhere, was a
  // tenth of the collector's time at 8,192 ranks). A stall reached from a
  // linked one brings its job in too; a stall of no known job, every stall.
  std::vector<char>& linked = links.linked;
  linked.assign(stalls_.size(), 0);
  std::vector<char> done(stalls_.size(), 0);
  std::set<std::string_view> jobs;
  auto take_job = [&](const std::string& job) {
    if (!jobs.insert(job).second) return;
    for (size_t j = 0; j < stalls_.size(); ++j)
      if (job.empty() || stalls_[j].comm->job == job) linked[j] = 1;
  };
  for (const Stall& s : stalls_)
    if (s.timed_out) take_job(s.comm->job);
  for (bool more = true; more;) {
    more = false;
    for (size_t i = 0; i < stalls_.size(); ++i) {
      if (!linked[i] || done[i]) continue;
      done[i] = 1;
      link(i);
      for (size_t j : insides[i])
        if (!linked[j]) {
          take_job(stalls_[j].comm->job);
          more = true;
        }
    }
  }
  return links;
}

std::set<size_t> Detector::entered_elsewhere(size_t i, const std::vector<ProcKey>& members) const {
  std::set<size_t> out;
  std::set<ProcKey> procs(members.begin(), members.end());
  for (size_t j = 0; j < stalls_.size(); ++j) {
    const Stall& other = stalls_[j];
    if (j == i || (other.partial && !other.instance)) continue;
    for (const auto& [rank, m] : other.comm->members) {
      if (!procs.count({m.node, m.pid})) continue;
      // Some rank never entered it: did this one? Every rank is inside it: yes.
      bool entered = !other.partial || (rank >= 0 && static_cast<size_t>(rank) < other.instance->issue.size() &&
                                        other.instance->issue[static_cast<size_t>(rank)] != 0);
      if (entered) {
        out.insert(j);
        break;
      }
    }
  }
  return out;
}

void Detector::fold_stalls(const StallLinks& links) {
  const auto& roots = links.roots;
  const auto& insides = links.insides;
  const auto& direct = links.direct;
  const auto& linked = links.linked;
  // A stall that was not followed is of a job that did not hang: it names
  // and waits on none of the followed stalls' processes, and stays as it is.
  // The stalls that name each process as missing, and whether each has its
  // finding open already (looked up once, for tells_better).
  std::map<ProcKey, std::vector<size_t>> naming;
  std::vector<char> open(stalls_.size(), 0);
  for (size_t i = 0; i < stalls_.size(); ++i) {
    if (!linked[i]) continue;
    for (const ProcKey& p : stalls_[i].missing) naming[p].push_back(i);
    for (const ProcKey& p : stalls_[i].stuck) naming[p].push_back(i);
    open[i] = book_.open_finding(stalls_[i].finding.key()) != nullptr;
  }
  auto better = [&](size_t a, size_t b) { return tells_better(a, b, open); };
  // Stalls that name the same held-up process are one story: the best tells it.
  std::vector<size_t> owner(stalls_.size());
  for (size_t i = 0; i < stalls_.size(); ++i) owner[i] = i;
  std::function<size_t(size_t)> find = [&](size_t i) { return owner[i] == i ? i : owner[i] = find(owner[i]); };
  auto unite = [&](size_t a, size_t b) {
    a = find(a), b = find(b);
    if (a == b) return;
    if (better(a, b))
      owner[b] = a;
    else
      owner[a] = b;
  };
  for (const auto& [p, named] : naming) {
    size_t first = SIZE_MAX;
    for (size_t c : named) {
      if (!direct[c]) continue;
      if (first == SIZE_MAX)
        first = c;
      else
        unite(first, c);
    }
  }
  // A stall behind others joins the best of the stalls it waits on.
  for (size_t i = 0; i < stalls_.size(); ++i) {
    if (!linked[i] || direct[i]) continue;
    size_t best = SIZE_MAX;
    auto consider = [&](size_t c) {
      c = find(c);
      if (c != i && (best == SIZE_MAX || better(c, best))) best = c;
    };
    // Through the stalls it is behind that are behind others in turn (a
    // data-parallel group behind a tensor-parallel one behind the stopped
    // rank's), to the ones that are not.
    std::set<size_t> visited{i};
    std::deque<size_t> behind;
    auto follow = [&](size_t k) {
      for (const ProcKey& p : roots[k])
        if (auto named = naming.find(p); named != naming.end())
          for (size_t c : named->second)
            if (direct[c]) consider(c);
      for (size_t c : insides[k]) behind.push_back(c);
    };
    follow(i);
    while (!behind.empty()) {
      size_t c = behind.front();
      behind.pop_front();
      if (!visited.insert(c).second) continue;
      if (direct[c]) consider(c);
      else follow(c);
    }
    // A ring of stalls every rank is inside, each behind another (the
    // host only enqueues: a stopped rank had issued every communicator's
    // next collective), with nothing outside it: held up where a process
    // cannot progress. The ring's stalls that name one fold into the one
    // that tells it best; the others into it too.
    if (best == SIZE_MAX) {
      for (size_t c : visited)
        if (!stalls_[c].stuck.empty() && (best == SIZE_MAX || better(c, best))) best = c;
      if (best == i) best = SIZE_MAX;
    }
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
  // Every rank inside: what the GPUs and NCCL's proxy steps show can change
  // with the same ranks named (a first look before every node reported).
  if (!stall.partial) states += "|" + stall.finding.summary;
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

}  // namespace rankscope::collector
