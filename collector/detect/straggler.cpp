// The straggler detector: each settled collective's waiting attributed to
// the ranks that caused it (detect/attribution.h), judged per communicator.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string_view>

#include "collector/detect/detector.h"
#include "collector/detect/text.h"
#include "common/format.h"

namespace rankscope::collector {

namespace {
constexpr uint64_t kStragglerUpdateNs = 10'000'000'000ull;
// How long a clock estimate's error is remembered after a better one
// replaced it: records converted with it are scored within this (the
// batching, the settling time and one re-send of a lost batch).
constexpr uint64_t kMarginMemoryNs = 3'000'000'000ull;
// A straggler finding with only what makes its key (comm, rank).
Finding straggler_of(uint64_t comm, int32_t rank) {
  Finding f;
  f.kind = FindingKind::straggler;
  f.comm = comm;
  f.ranks = {rank};
  return f;
}
}  // namespace

size_t Detector::score(CommDetect& state, uint64_t now_ns, size_t members) {
  size_t scored = 0;
  while (scored < members && !state.done.empty() && state.done.front().last_ns + options_.settle_ns <= now_ns) {
    Ready r = ready(state.done.front(), now_ns);
    if (r == Ready::wait) break;  // in order: the communicator's later instances wait behind it
    if (r == Ready::late) ++incomplete_;
    scored += state.done.front().issue.size();
    score_front(state);
  }
  while (scored < members && !state.gpu_done.empty() && state.gpu_done.front().last_ns + options_.settle_ns <= now_ns) {
    scored += state.gpu_done.front().issue.size();
    score_gpu_front(state);
  }
  return scored;
}

size_t Detector::score_some(uint64_t now_ns, size_t members) {
  // Round the communicators from where the last call stopped, so that a
  // busy one does not keep the others waiting for their next evaluation.
  // A communicator not evaluated yet has no margins: the evaluation scores
  // it (on_complete has its first instance's).
  size_t scored = 0;
  auto it = comms_.lower_bound(score_from_);
  for (size_t visited = 0; visited < comms_.size() && scored < members; ++visited, ++it) {
    if (it == comms_.end()) it = comms_.begin();
    if (it->second.margin) scored += score(it->second, now_ns, members - scored);
  }
  score_from_ = it == comms_.end() ? 0 : it->first;
  return scored;
}

Detector::Ready Detector::ready(const Completed& c, uint64_t now_ns) const {
  for (const auto& [node, since] : c.gaps) {
    // Past the wait it is taken as lost, whether or not it came since.
    if (now_ns >= since + kBatchGapWaitNs) return Ready::late;
    if (node->gap_seq != 0 && node->gap_since_ns == since) return Ready::wait;
  }
  return Ready::score;
}

void Detector::note_gaps(const CommState& comm, Completed& c) const {
  const uint64_t now = clock_.realtime_ns();
  for (const auto& [rank, member] : comm.members) {
    auto gap = model_.gaps.find(member.node);
    if (gap == model_.gaps.end() || now >= gap->second + kBatchGapWaitNs) continue;
    const NodeState* node = model_.node(member.node);
    if (!node) continue;
    if (std::none_of(c.gaps.begin(), c.gaps.end(), [&](const auto& g) { return g.first == node; }))
      c.gaps.emplace_back(node, gap->second);
  }
}

void Detector::score_gpu_front(CommDetect& state) {
  // Blame on the GPU side is judged, as on the host's, on each rank's own
  // time: from when its GPU was free to go on to its kernels' start. That
  // is the end of its process's latest kernel before the start, of any op
  // and communicator: the kernel queued ahead of it on its stream. A
  // collective's kernels end when their last data came: the rank that
  // receives last (downstream of a slow link, or of a late peer in a ring)
  // ends last, and its next kernels start late for that alone, on this
  // communicator and on the others its process uses next (a data-parallel
  // collective behind a tensor-parallel one held up by a slow partner, or
  // behind a Recv that waited for a slow pipeline stage's data); it is not
  // to blame. Where a rank's previous end is not known, plain starts are
  // judged. A kernel waits inside its collective for the others: its
  // stream, and its next kernel, are held back with it; no lateness is
  // carried.
  const Completed& c = state.gpu_done.front();
  const size_t n = c.issue.size();
  if (state.gpu_waits && c.margin && state.margin && c.margin->size() == n && state.margin->size() == n) {
    std::vector<int64_t> v(c.issue.begin(), c.issue.end());
    bool durations = state.procs.size() == n;
    for (size_t r = 0; r < n && durations; ++r) {
      uint64_t free = state.procs[r] ? state.procs[r]->gpu_end_before(c.issue[r]) : 0;
      if (free == 0) durations = false;
      else v[r] = static_cast<int64_t>(c.issue[r] - free);
    }
    if (!durations) v.assign(c.issue.begin(), c.issue.end());
    state.scratch.resize(n);
    for (size_t r = 0; r < n; ++r) state.scratch[r] = std::max((*c.margin)[r], (*state.margin)[r]);
    state.gpu_waits->add(v, c.issue, state.scratch, c.last_ns, false);
  }
  state.gpu_done.pop_front();
}

void Detector::score_front(CommDetect& state) {
  // Blame is judged on each rank's own duration: from the moment it was
  // free to go on (the release of its previous exchange: a collective or a
  // Send/Recv pair; or when that exchange's data came, where its host waited
  // on the GPU for them) to this arrival. A rank that waited for someone else
  // (a slowed pipeline partner, a slow rank of another communicator) was
  // released late and is not to blame for it; the rank that arrived last
  // there took long from its own release, and is. Where a member's host ran
  // ahead (issued this before its previous exchange completed: back-to-back
  // buckets, FSDP's queued layers), plain arrivals are judged, each rank
  // owed only the lateness it added since its previous instance, or since
  // its release where that is known. Where a member's release is unknown,
  // plain arrivals too.
  const Completed& c = state.done.front();
  const size_t n = c.issue.size();
  // Without margins from when it completed, how far apart its arrivals
  // really were is unknown: not scored.
  if (n == state.ranks.size() && c.margin && state.margin && c.margin->size() == n && state.margin->size() == n) {
    std::vector<int64_t> v(c.issue.begin(), c.issue.end());
    std::vector<uint64_t>& released = state.released;
    released.assign(n, 0);
    bool durations = true, carried = false, unknown = state.procs.size() != n;
    for (size_t r = 0; r < n && !unknown; ++r) {
      if (!state.procs[r]) {
        unknown = true;
        break;
      }
      auto [release, base] = state.procs[r]->base_before(c.issue[r]);
      if (release == ProcHistory::Release::unknown) {
        unknown = true;
      } else if (release == ProcHistory::Release::ahead) {
        durations = false, carried = true;
      } else if (release == ProcHistory::Release::none) {
        durations = false;
      } else {
        v[r] = static_cast<int64_t>(c.issue[r] - base);
        released[r] = base;
      }
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
    state.waits->add(v, c.issue, state.scratch, c.last_ns, carried, carried ? &released : nullptr);
  }
  state.done.pop_front();
}

void Detector::refresh_margins(const CommState& comm, CommDetect& state) const {
  // A rank is compared with the others. Against a rank of another node its
  // clock's error and that node's add up: at most the largest of the other
  // nodes', which is the largest overall, or the largest of any other node
  // for the ranks of the node that holds it (O(n)). Against a rank of its
  // own node only how far that node's estimate moved lately counts: they
  // share its clock, and their records are off against each other only
  // where put on the cluster clock on either side of a new estimate.
  // Records of the last few seconds may have been put on the cluster clock
  // with an estimate a tighter probe replaced since: its error counts.
  const uint64_t now = clock_.realtime_ns();
  const uint64_t since = now > kMarginMemoryNs ? now - kMarginMemoryNs : 0;
  const int32_t n = comm.nranks;
  constexpr uint64_t kUnknown = UINT64_MAX / 4;
  std::vector<uint64_t> u(n, kUnknown), moved(n, kUnknown);
  std::vector<const std::string*> node(n, nullptr);  // not known: a node of its own
  std::map<std::string_view, int32_t> per_node;
  for (const auto& [rank, m] : comm.members) {
    if (rank < 0 || rank >= n) continue;
    if (const NodeState* state_of = node_named(m.node)) {
      u[rank] = state_of->clock.uncertainty_since(since);
      moved[rank] = state_of->clock.moved_since(since);
    }
    node[rank] = &m.node;
    ++per_node[m.node];
  }
  auto same_node = [&](int32_t a, int32_t b) { return a == b || (node[a] && node[b] && *node[a] == *node[b]); };
  int32_t top = 0;
  for (int32_t r = 1; r < n; ++r)
    if (u[r] > u[top]) top = r;
  int32_t other = -1;  // the largest error of a node other than top's
  for (int32_t r = 0; r < n; ++r)
    if (!same_node(r, top) && (other < 0 || u[r] > u[other])) other = r;
  auto margin = std::make_shared<std::vector<uint64_t>>(n);
  for (int32_t r = 0; r < n; ++r) {
    const int32_t across = same_node(r, top) ? other : top;
    const uint64_t apart = across < 0 ? 0 : std::min(UINT64_MAX / 2, u[r] + u[across]);
    const uint64_t together = node[r] && per_node[*node[r]] > 1 ? moved[r] : 0;
    (*margin)[r] = std::max(apart, together);
  }
  state.margin = std::move(margin);
}

void Detector::evaluate_stragglers(const CommState& comm, CommDetect& state, uint64_t now_ns,
                                   const std::set<int32_t>* open_ranks) {
  const int32_t n = comm.nranks;
  if (n < 2) return;
  // No collective of it scored yet and no finding of it open (one read back
  // at a restart resolves as before): nobody to judge. A communicator
  // announced with 65,536 ranks by a stand-in libnccl whose collectives
  // never complete would cost 65,536 standings each time.
  if (!state.waits->started() && !(state.gpu_waits && state.gpu_waits->started()) &&
      (!open_ranks || open_ranks->empty()))
    return;
  std::vector<Standing> standings = state.waits->standings();
  std::vector<Standing> gpu_standings;
  if (state.gpu_waits) gpu_standings = state.gpu_waits->standings();
  for (int32_t r = 0; r < n; ++r) {
    RankStats& stats = state.ranks[r];
    const Standing& st = standings[r];
    const Standing* gpu = gpu_standings.empty() ? nullptr : &gpu_standings[r];
    bool is_open = open_ranks && open_ranks->count(r) > 0;
    state.waits->set_open(r, is_open);
    if (state.gpu_waits) state.gpu_waits->set_open(r, is_open);
    // A host-side finding stays open while the rank lags beyond its allowance (a slow rank).
    stats.under = st.under && !st.lags ? stats.under + 1 : 0;
    stats.gpu_under = !gpu || !gpu->learnt || gpu->under ? stats.gpu_under + 1 : 0;
    Finding key_probe = straggler_of(comm.hash, r);
    if (is_open && stats.under >= options_.close_after && stats.gpu_under >= options_.close_after) {
      book_.resolve(key_probe.key(), now_ns);
      stats.raised_slow = false;
      state.waits->set_open(r, false);
      if (state.gpu_waits) state.gpu_waits->set_open(r, false);
      continue;
    }
    // Late on the host side: the host straggler (its kernels start late
    // too, since they cannot start before it issued), or a slow rank (one
    // that lags persistently but costs less than the allowance so far).
    // Late on the GPU side only: it issued on time and its GPU started late.
    const bool gpu_over = gpu && gpu->over;
    const bool host = st.over || (st.slow && !gpu_over);
    if (!host && !gpu_over) continue;
    // Figures are refreshed every 10 s; an explanation that became available
    // is added at once. The host context is worked out only then (not for
    // every rank over at every evaluation: at 8,192 ranks that kept the
    // collector from keeping up).
    std::string key = key_probe.key();
    const Finding* open = is_open ? book_.open_finding(key) : nullptr;
    // A slow rank's finding is told at once when it becomes a costly straggler.
    bool refresh =
        !open || now_ns - open->updated_ns >= kStragglerUpdateNs || (stats.raised_slow && (st.over || gpu_over));
    // Late on the GPU side, its host's CPU is told too: NCCL's proxy
    // thread, which moves the data between nodes, runs there, so a host
    // starved or throttled (a CPU quota) delays its GPU's collectives
    // although it issued them on time.
    const std::string label = host ? "\nWhy: " : "\nOn its host: ";
    bool unexplained = open && open->detail.find(label) == std::string::npos;
    if (!refresh && !unexplained) continue;
    std::string context = host_context(comm, r);
    if (!refresh && context.empty()) continue;
    Finding f = straggler_finding(comm, state, r, st, host ? nullptr : gpu);
    if (!context.empty()) f.detail += label + context + ".";
    book_.raise(std::move(f), now_ns);
    stats.raised_slow = host && !st.over;
    state.waits->set_open(r, true);
    if (state.gpu_waits) state.gpu_waits->set_open(r, true);
  }
}

Finding Detector::straggler_finding(const CommState& comm, const CommDetect& state, int32_t r, const Standing& host,
                                    const Standing* gpu) const {
  const int32_t n = comm.nranks;
  const Standing& st = gpu ? *gpu : host;
  Finding f = straggler_of(comm.hash, r);
  f.job = comm.job;
  f.seq = -1;
  // A slow rank (not owed enough waiting to be a costly straggler) is as
  // late as its lag.
  const bool slow = !gpu && !st.over && st.slow;
  const double lateness = slow ? st.lag_ns : st.lateness_ns;
  f.lateness_s = lateness / 1e9;
  f.wait_share = std::min(1.0, st.share);
  // Opening: the waste already seen in the evidence counts.
  f.gpu_hours_lost = std::max(st.gpu_ns, static_cast<double>(st.owed_ns) * (n - 1)) / 1e9 / 3600.0;
  auto m = comm.members.find(r);
  std::string placed =
      m == comm.members.end() ? "" : " on " + m->second.node + " (pid " + std::to_string(m->second.pid) + ")";
  if (m != comm.members.end()) f.nodes.push_back(m->second.node);
  const std::string late = format_duration_ns(static_cast<int64_t>(lateness));
  const std::string margin = format_duration_ns(static_cast<int64_t>(state.margin ? (*state.margin)[r] : 0));
  char figures[400];
  if (slow)
    snprintf(figures, sizeof(figures),
             "is slow: behind the median rank by %s at %u of the last %zu collectives (%s of the time, beyond its "
             "structure); it costs the other %d ranks %s of their time so far",
             late.c_str(), st.lagged, st.instances,
             format_percent(st.lag_share - std::max(0.0, st.lag_baseline)).c_str(), n - 1,
             format_percent(f.wait_share).c_str());
  else if (gpu)
    snprintf(figures, sizeof(figures),
             "issues its collectives on time but its GPU starts them late (GPU side): its kernels held up %u of the "
             "last %zu collectives, %s late when they did; the other %d ranks' GPUs spent %s of the time waiting for it",
             st.held, st.instances, late.c_str(), n - 1, format_percent(f.wait_share).c_str());
  else
    snprintf(figures, sizeof(figures),
             "held up %u of the last %zu collectives, %s late when it did; the other %d ranks spent %s of the time "
             "waiting for it",
             st.held, st.instances, late.c_str(), n - 1, format_percent(f.wait_share).c_str());
  f.summary = where("straggler", comm) + ": rank " + std::to_string(r) + placed + " " + figures;
  char cost[160];
  snprintf(cost, sizeof(cost), "GPU-hours lost waiting for it so far: %.4f (%d GPUs idle while it was late)",
           f.gpu_hours_lost, n - 1);
  char standing[360];
  snprintf(standing, sizeof(standing),
           "%s of the job's time over the last %s (a typical rank: %s; its own structural share: %s), against an "
           "allowance of %s; evidence %s beyond the allowance (%s at %s)",
           format_percent(st.share).c_str(), format_duration_ns(static_cast<int64_t>(st.window_ns)).c_str(),
           format_percent(st.typical).c_str(), format_percent(st.baseline).c_str(),
           format_percent(st.allowance).c_str(), format_duration_ns(static_cast<int64_t>(st.evidence_ns)).c_str(),
           slow ? "a costly straggler" : "a finding opens",
           format_duration_ns(static_cast<int64_t>(options_.straggler.evidence_ns)).c_str());
  const std::string chance =
      "; not chance: its lag behind the median rank gathered " + format_fixed(st.lag_evidence, 1) +
      " standard deviations of evidence (" + format_fixed(options_.straggler.lag_evidence_sd, 0) + " needed)" +
      (st.chance_scale > 1 ? " over buckets of " + std::to_string(st.chance_scale) + " of the window's" : "") +
      (st.far_buckets > 0
           ? ", at least " + format_fixed(options_.straggler.lag_evidence_sd / 4, 0) +
                 " of them behind in each of its last " + std::to_string(st.far_buckets) + " buckets of 1 s or more"
           : "") +
      ", where by chance a rank's lag varies by " + format_duration_ns(static_cast<int64_t>(st.noise_ns)) +
      (st.far_buckets > 0 || st.chance_scale > 1 ? " from one such bucket to the next" : "") + " in this job";
  std::string why;
  if (slow)
    why = "A slow rank: it lags the median rank persistently, " + format_percent(st.lag_share) +
          " of the time over the last " + format_duration_ns(static_cast<int64_t>(st.window_ns)) +
          " less the others' mean (its own structural lag: " + format_percent(std::max(0.0, st.lag_baseline)) +
          "), against an allowance of " + format_percent(options_.straggler.allowance) + " over it; evidence " +
          format_duration_ns(static_cast<int64_t>(st.slow_evidence_ns)) + " of lag beyond the allowance (" +
          format_duration_ns(static_cast<int64_t>(options_.straggler.evidence_ns)) +
          " needed). The waiting owed to it does not make it a costly straggler (yet): " + std::string(standing) +
          chance +
          ". Its lag is its own (time from when it was free to go on, the end of its previous exchange, against the "
          "median rank's), less the clocks' uncertainty of " +
          margin + ".";
  else if (gpu)
    why = "Waiting owed to its GPU: " + std::string(standing) + chance +
          ". Judged on when each rank's kernels started (NCCL's profiler plugin; each GPU's clock put on its host's "
          "per process), less the clocks' uncertainty of " + margin + ". On the host side it is within its allowance (" +
          format_percent(host.share) + " of the job's time owed to its issue times): the delay is added after it "
          "issued, on its GPU: a slow or throttled GPU, or GPU work queued before the collective on its stream.";
  else
    why = "Waiting owed to it: " + std::string(standing) + chance +
          ". Its lateness is its own (time from when it was free to go on, the end of its previous exchange, against "
          "the others'), less the clocks' uncertainty of " + margin + ".";
  f.detail = f.summary + ".\n" + cost + ".\n" + why;
  return f;
}

}  // namespace rankscope::collector
