#include "tools/sim/model.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "bpf/nccl_events.h"
#include "common/stats.h"

namespace rankscope::sim {

namespace {
constexpr uint8_t kFloat32 = 7;   // ncclFloat32 (nccl.h)
constexpr uint8_t kBfloat16 = 9;  // ncclBfloat16
constexpr uint64_t kMs = 1'000'000;
}  // namespace

namespace {
bool queued_pattern(const std::string& pattern) {
  return pattern == "ddp" || pattern == "sync-each" || pattern == "fsdp" || pattern == "accum" || pattern == "jitter";
}
}  // namespace

bool apply_pattern(FleetConfig& c, std::string* why) {
  const std::string& p = c.pattern;
  if (p.empty()) return true;
  if (queued_pattern(p)) {
    // One communicator of every rank; no tensor or pipeline parallelism.
    c.pp = 1;
    c.tp_ops = 0;
    c.world_op = true;
    c.dp_buckets = std::max(c.dp_buckets, 1);
    if (p == "jitter") c.jitter_sigma = 0.25;
    if (p == "fsdp" && c.layers < 1) return *why = "--layers must be at least 1", false;
    if (p == "accum" && c.accum_steps < 1) return *why = "--accum-steps must be at least 1", false;
    return true;
  }
  if (p == "tp-dp") {
    if (c.gpus < 2) return *why = "--pattern tp-dp needs --gpus 2 or more (the tensor-parallel group)", false;
    c.pp = 1;
    c.world_op = false;
    c.tp_ops = std::max(c.tp_ops, 1);
    c.dp_buckets = std::max(c.dp_buckets, 1);
    return true;
  }
  if (p == "pipeline") {
    if (c.pp < 2) c.pp = 2;
    if (c.nodes_per_job % c.pp != 0 || c.nodes_per_job < 2 * c.pp)
      return *why = "--pattern pipeline needs --nodes-per-job a multiple of --pp and at least 2 x --pp (two "
                    "replicas, for its data-parallel AllReduce)", false;
    c.tp_ops = 0;
    c.world_op = false;
    c.dp_buckets = std::max(c.dp_buckets, 1);
    return true;
  }
  *why = "unknown --pattern " + p + " (ddp, sync-each, fsdp, pipeline, tp-dp, accum, jitter)";
  return false;
}

const char* fault_kind_name(FaultKind kind) {
  switch (kind) {
    case FaultKind::slowdown_rank: return "slowdown_rank";
    case FaultKind::slowdown_node: return "slowdown_node";
    case FaultKind::hang_stop: return "hang_stop";
    case FaultKind::hang_kill: return "hang_kill";
    case FaultKind::mismatch: return "mismatch";
    case FaultKind::agent_death: return "agent_death";
  }
  return "?";
}

const char* expected_finding(FaultKind kind) {
  switch (kind) {
    case FaultKind::slowdown_rank:
    case FaultKind::slowdown_node: return "straggler";
    case FaultKind::hang_stop:
    case FaultKind::hang_kill: return "hang";
    case FaultKind::mismatch: return "mismatch";
    case FaultKind::agent_death: return "node_lost";
  }
  return "?";
}

Fleet::Fleet(const FleetConfig& config) : config_(config), rng_(config.seed * 0x9e3779b97f4a7c15ull + 17) {
  if (config.pattern == "fsdp")
    segments_ = 3 * config.layers + 1;
  else if (queued_pattern(config.pattern))
    segments_ = config.dp_buckets + 1;
  else
    segments_ = config.tp_ops + config.dp_buckets + 3;
  build();
  draw_faults();
}

size_t Fleet::total_ranks() const {
  size_t n = 0;
  for (const auto& job : jobs_) n += job.ranks.size();
  return n;
}

uint64_t Fleet::comm_hash(int j, const std::string& what) const {
  std::string id = config_.prefix + "/" + std::to_string(config_.seed) + "/" + jobs_[j].name + "/" + what;
  return proto::comm_hash_of_unique_id(reinterpret_cast<const uint8_t*>(id.data()), id.size());
}

void Fleet::build() {
  const int G = config_.gpus, M = config_.nodes_per_job, P = config_.pp;
  std::uniform_real_distribution<double> unit(0, 1);
  for (int j = 0; j < config_.jobs; ++j) {
    JobDef job;
    char name[64];
    snprintf(name, sizeof(name), "%s-job%03d", config_.prefix.c_str(), j);
    job.name = name;
    jobs_.push_back(job);
    JobDef& jd = jobs_.back();
    jd.ranks.resize(static_cast<size_t>(M) * G);
    for (int m = 0; m < M; ++m) {
      NodeDef node;
      snprintf(name, sizeof(name), "%s-n%04d", config_.prefix.c_str(), static_cast<int>(nodes_.size()));
      node.name = name;
      node.job = j;
      node.boot_ns = static_cast<uint64_t>((1e3 + unit(rng_) * 5e5) * 1e9);  // up 1000 s .. 6 days
      node.drift = (unit(rng_) * 2 - 1) * config_.max_drift_ppm * 1e-6;
      double skew = std::exp(std::log(config_.min_skew_s) +
                             unit(rng_) * (std::log(config_.max_skew_s) - std::log(config_.min_skew_s)));
      node.wall_skew_ns = static_cast<int64_t>((unit(rng_) < 0.5 ? -1 : 1) * skew * 1e9);
      node.instance = rng_() | 1;
      jd.nodes.push_back(static_cast<int>(nodes_.size()));
      for (int l = 0; l < G; ++l) {
        int r = m * G + l;
        RankDef& rd = jd.ranks[r];
        rd.node = static_cast<int>(nodes_.size());
        rd.local = l;
        rd.stage = m % P;
        rd.replica = m / P;
        rd.pid = 4000 + static_cast<uint32_t>(l) * 7;
        node.ranks.push_back(r);
      }
      nodes_.push_back(node);
    }
    wire_comms(j, jd);
    JobRun run;
    run.t.assign(jd.ranks.size(), 0);
    run.own.assign(jd.ranks.size(), 0);
    // Ranks start their first step a little apart, as processes do.
    for (auto& t : run.t) t = static_cast<int64_t>(unit(rng_) * 2 * kMs);
    run.comm_seq.assign(jd.comms.size(), 0);
    run.stream = run.t;
    run.mismatch_fault.assign(jd.ranks.size(), -1);
    runs_.push_back(std::move(run));
    state_.emplace_back(jd.ranks.size());
    steps_.push_back(0);
    job_rng_.emplace_back(config_.seed * 1000003ull + static_cast<uint64_t>(j) * 7919ull + 1);
  }
}

void Fleet::wire_comms(int j, JobDef& jd) {
  const int G = config_.gpus, M = config_.nodes_per_job, P = config_.pp, D = M / P;
  auto add_comm = [&](const std::string& kind, const std::string& what, std::vector<int> members) {
    CommDef c;
    c.kind = kind;
    c.hash = comm_hash(j, what);
    c.members = std::move(members);
    jd.comms.push_back(std::move(c));
    return static_cast<int>(jd.comms.size()) - 1;
  };
  if (queued_pattern(config_.pattern)) {
    std::vector<int> members;
    for (size_t r = 0; r < jd.ranks.size(); ++r) members.push_back(static_cast<int>(r));
    jd.world = add_comm("world", "world", members);
    return;
  }
  if (G > 1)
    for (int m = 0; m < M; ++m) {
      std::vector<int> members;
      for (int l = 0; l < G; ++l) members.push_back(m * G + l);
      int c = add_comm("tp", "tp" + std::to_string(m), members);
      jd.has_tp = true;
      for (int l = 0; l < G; ++l) jd.ranks[m * G + l].tp = c, jd.ranks[m * G + l].tp_rank = l;
    }
  if (D > 1)
    for (int s = 0; s < P; ++s)
      for (int l = 0; l < G; ++l) {
        std::vector<int> members;
        for (int d = 0; d < D; ++d) members.push_back((d * P + s) * G + l);
        int c = add_comm("dp", "dp" + std::to_string(s) + "." + std::to_string(l), members);
        for (int d = 0; d < D; ++d) jd.ranks[members[d]].dp = c, jd.ranks[members[d]].dp_rank = d;
      }
  if (P > 1)
    for (int d = 0; d < D; ++d)
      for (int l = 0; l < G; ++l) {
        std::vector<int> members;
        for (int s = 0; s < P; ++s) members.push_back((d * P + s) * G + l);
        int c = add_comm("pp", "pp" + std::to_string(d) + "." + std::to_string(l), members);
        for (int s = 0; s < P; ++s) jd.ranks[members[s]].pp = c, jd.ranks[members[s]].pp_rank = s;
      }
  if (config_.world_op && jd.ranks.size() > 1) {
    std::vector<int> members;
    for (size_t r = 0; r < jd.ranks.size(); ++r) members.push_back(static_cast<int>(r));
    jd.world = add_comm("world", "world", members);
  }
}

void Fleet::draw_faults() {
  std::uniform_real_distribution<double> unit(0, 1);
  for (int j = 0; j < config_.jobs; ++j) {
    std::string kind = config_.scenario;
    if (kind == "mixed") {
      static const char* cycle[] = {"healthy",   "slowdown",  "node-slowdown", "hang-stop",
                                    "hang-kill", "mismatch",  "agent-death"};
      kind = cycle[j % 7];
    }
    if (kind == "healthy") continue;
    const JobDef& job = jobs_[j];
    int culprits = (kind == "slowdown" || kind == "node-slowdown") ? config_.culprits_per_job : 1;
    culprits = std::min<int>(culprits, static_cast<int>(job.nodes.size()));
    // Culprits on distinct nodes, so that each incident stands alone in its node.
    std::vector<int> node_order(job.nodes.size());
    for (size_t i = 0; i < node_order.size(); ++i) node_order[i] = static_cast<int>(i);
    std::shuffle(node_order.begin(), node_order.end(), rng_);
    for (int c = 0; c < culprits; ++c) {
      FaultDef f;
      f.id = static_cast<int>(faults_.size());
      f.job = j;
      int m = node_order[c];
      int rank = m * config_.gpus + static_cast<int>(rng_() % static_cast<uint64_t>(config_.gpus));
      f.onset_ns = static_cast<int64_t>((config_.fault_after_s + unit(rng_) * config_.fault_window_s) * 1e9);
      if (kind == "slowdown" || kind == "node-slowdown") {
        f.kind = kind == "slowdown" ? FaultKind::slowdown_rank : FaultKind::slowdown_node;
        f.factor = config_.factor > 0 ? config_.factor
                                      : std::exp(std::log(config_.min_factor) +
                                                 unit(rng_) * (std::log(config_.max_factor) - std::log(config_.min_factor)));
        if (config_.fault_duration_s > 0) f.end_ns = f.onset_ns + static_cast<int64_t>(config_.fault_duration_s * 1e9);
      } else if (kind == "hang" || kind == "hang-stop" || kind == "hang-kill") {
        bool stop = kind == "hang" ? unit(rng_) < 0.5 : kind == "hang-stop";
        f.kind = stop ? FaultKind::hang_stop : FaultKind::hang_kill;
      } else if (kind == "mismatch") {
        f.kind = FaultKind::mismatch;
      } else if (kind == "agent-death") {
        f.kind = FaultKind::agent_death;
      } else {
        continue;  // main() checks the names
      }
      f.nodes = {job.nodes[m]};
      if (f.kind == FaultKind::slowdown_node || f.kind == FaultKind::agent_death) {
        for (int l = 0; l < config_.gpus; ++l) f.ranks.push_back(m * config_.gpus + l);
      } else {
        f.ranks = {rank};
      }
      faults_.push_back(f);
    }
  }
}

bool Fleet::agent_dead(int node, int64_t rel_ns) const {
  for (const auto& f : faults_)
    if (f.kind == FaultKind::agent_death && f.nodes[0] == node && rel_ns >= f.onset_ns) return true;
  return false;
}

double Fleet::slowdown(int j, int r, int64_t at) const {
  double factor = 1;
  for (const auto& f : faults_) {
    if (f.job != j || (f.kind != FaultKind::slowdown_rank && f.kind != FaultKind::slowdown_node)) continue;
    if (at < f.onset_ns || at >= f.end_ns) continue;
    if (std::find(f.ranks.begin(), f.ranks.end(), r) != f.ranks.end()) factor *= f.factor;
  }
  return factor;
}

bool Fleet::stops_at(int j, int r, int64_t at) {
  RankState& st = state_[j][r];
  if (st.stopped || st.killed) return true;
  for (const auto& f : faults_) {
    if (f.job != j || (f.kind != FaultKind::hang_stop && f.kind != FaultKind::hang_kill)) continue;
    if (f.ranks[0] != r || at < f.onset_ns) continue;
    (f.kind == FaultKind::hang_stop ? st.stopped : st.killed) = true;
    st.since_ns = f.onset_ns;
    return true;
  }
  return false;
}

void Fleet::compute(int j, int r, double base_ns) {
  JobRun& run = runs_[j];
  if (run.t[r] >= kNever) return;
  std::mt19937_64& rng = job_rng_[j];
  const RankDef& rd = jobs_[j].ranks[r];
  double sigma = config_.jitter_sigma;
  double jitter = std::exp(std::normal_distribution<double>(-sigma * sigma / 2, sigma)(rng));
  double stage = rd.stage == config_.pp - 1 && config_.pp > 1 ? config_.last_stage_factor : 1.0;
  double ns = base_ns * stage * jitter;
  if (double slow = slowdown(j, r, run.t[r]); slow > 1 && config_.slowdown_shape == "stalls") {
    RankState& st = state_[j][r];
    st.stall_owed_ns += ns * (slow - 1);
    if (st.stall_owed_ns >= config_.stall_ms * 1e6) ns += std::exchange(st.stall_owed_ns, 0.0);
  } else {
    ns *= slow;
  }
  if (std::uniform_real_distribution<double>(0, 1)(rng) < config_.gc_rate / segments_)
    ns += std::uniform_real_distribution<double>(config_.gc_min_ms, config_.gc_max_ms)(rng) * 1e6;
  run.t[r] += static_cast<int64_t>(ns);
  run.own[r] += static_cast<int64_t>(ns);
}

void Fleet::emit(int j, int r, int comm, int32_t comm_rank, uint32_t lane, uint64_t seq, uint8_t op, uint8_t datatype,
                 uint64_t count, int32_t peer, uint8_t flags, int64_t issue, std::vector<std::vector<SimEvent>>& out,
                 size_t& made) {
  const RankDef& rd = jobs_[j].ranks[r];
  std::mt19937_64& rng = job_rng_[j];
  SimEvent e;
  e.pid = rd.pid;
  e.comm = jobs_[j].comms[comm].hash;
  e.comm_rank = comm_rank;
  e.lane = lane;
  e.call.seq = seq;
  e.call.issue_ns = static_cast<uint64_t>(issue);
  // Enqueueing takes microseconds: NCCL returns long before the collective ends.
  int64_t call = 3000 + static_cast<int64_t>(rng() % 12000);
  e.call.return_ns = static_cast<uint64_t>(issue + call);
  e.call.count = count;
  e.call.peer = peer;
  e.call.op = op;
  e.call.datatype = datatype;
  e.call.redop = 0;
  e.call.flags = flags;
  e.at_ns = issue + call;
  runs_[j].own[r] = 0;  // its own time starts again at its next compute
  out[rd.node].push_back(e);
  ++made;
}

Fleet::Arrivals Fleet::arrive(int j, int c, uint8_t op, uint8_t datatype, uint64_t count, bool mismatch_point,
                              std::vector<std::vector<SimEvent>>& out, size_t& made) {
  JobRun& run = runs_[j];
  const CommDef& comm = jobs_[j].comms[c];
  uint64_t seq = run.comm_seq[c]++;
  Arrivals a;
  a.at.assign(comm.members.size(), kNever);
  a.own.assign(comm.members.size(), 0);
  for (size_t k = 0; k < comm.members.size(); ++k) {
    int r = comm.members[k];
    if (run.t[r] >= kNever || stops_at(j, r, run.t[r])) {
      run.t[r] = kNever;
      a.complete = false;
      continue;
    }
    a.at[k] = run.t[r];
    a.own[k] = run.own[r];
    uint64_t my_count = count;
    if (mismatch_point && run.mismatch_fault[r] < 0) {
      for (auto& f : faults_)
        if (f.job == j && f.kind == FaultKind::mismatch && f.ranks[0] == r && a.at[k] >= f.onset_ns) {
          run.mismatch_fault[r] = f.id;
          f.onset_ns = a.at[k];  // the truth: when the wrong call was issued
          my_count = count / 2 + 1;
          a.mismatched = true;
        }
    }
    emit(j, r, c, static_cast<int32_t>(k), 0, seq, op, datatype, my_count, -1, 0, a.at[k], out, made);
  }
  return a;
}

void Fleet::sample_clocks(const JobDef& job, const CommDef& comm, uint64_t seq, const std::vector<int64_t>& arrival) {
  // Stored issue times against the true ones, for the clocks' score: a
  // tensor-parallel group's first rank (one group per node), or where a
  // job has none that calls (one GPU per node, FSDP's and DDP's one
  // communicator, a pipeline's stages), each node's first member, less
  // often: every 64th instance, and at least one a second for a
  // communicator of few calls a step.
  if (comm.kind == "tp" && seq % 8 == 0 && arrival[0] < kNever)
    clock_samples_.push_back({job.ranks[comm.members[0]].node, comm.hash, 0, seq, arrival[0]});
  if (comm.kind == "tp" || (job.has_tp && config_.tp_ops > 0)) return;
  const int64_t first = *std::min_element(arrival.begin(), arrival.end());
  if (first >= kNever) return;
  auto [sampled, fresh] = clock_sampled_ns_.try_emplace(comm.hash, first);
  if (seq % 64 == 0 || fresh || first - sampled->second >= static_cast<int64_t>(1000 * kMs)) {
    sampled->second = first;
    for (size_t k = 0; k < comm.members.size(); ++k) {
      const int node = job.ranks[comm.members[k]].node;
      if (arrival[k] < kNever && (k == 0 || job.ranks[comm.members[k - 1]].node != node))
        clock_samples_.push_back({node, comm.hash, static_cast<int>(k), seq, arrival[k]});
    }
  }
}

void Fleet::collective(int j, const std::vector<int>& comms, uint8_t op, uint8_t datatype, uint64_t count,
                       bool step_end, bool mismatch_point, std::vector<std::vector<SimEvent>>& out, size_t& made) {
  JobRun& run = runs_[j];
  const JobDef& job = jobs_[j];
  std::mt19937_64& rng = job_rng_[j];
  for (int c : comms) {
    const CommDef& comm = job.comms[c];
    uint64_t seq = run.comm_seq[c];
    const Arrivals arrived = arrive(j, c, op, datatype, count, mismatch_point, out, made);
    const auto& [arrival, own, complete, mismatched] = arrived;
    sample_clocks(jobs_[j], comm, seq, arrival);
    if (!complete || mismatched) {
      // Whoever arrived waits for ever; the job cannot go past this point.
      for (size_t k = 0; k < comm.members.size(); ++k) {
        int r = comm.members[k];
        if (arrival[k] >= kNever) continue;
        state_[j][r].blocked_at = std::min(state_[j][r].blocked_at, arrival[k] + 20000);
        run.t[r] = kNever;
      }
      continue;
    }
    int64_t last = *std::max_element(arrival.begin(), arrival.end());
    // Transfer time grows with the group (a ring's steps) and the payload.
    double xfer = config_.step_ms * kMs * (comm.kind == "world" ? 0.004 : comm.kind == "dp" ? 0.02 : 0.006);
    int64_t leave = last + static_cast<int64_t>(xfer);
    std::normal_distribution<double> spread(0, config_.exit_spread_us * 1000);
    for (size_t k = 0; k < comm.members.size(); ++k) {
      int r = comm.members[k];
      run.t[r] = leave + static_cast<int64_t>(std::fabs(spread(rng)));
      if (step_end) {
        SimEvent w;
        w.wait = true;
        w.pid = job.ranks[r].pid;
        w.wait_start = arrival[k] + 20000;
        w.wait_end = run.t[r];
        w.at_ns = run.t[r];
        out[job.ranks[r].node].push_back(w);
      }
    }
    note_lateness(j, comm, arrived, last);
  }
}

void Fleet::note_lateness(int j, const CommDef& comm, const Arrivals& a, int64_t last) {
  // The truth of each active slowdown: the culprit's lateness against the
  // median of the others, and its own time's.
  const std::vector<int64_t>& arrival = a.at;
  for (const auto& f : faults_) {
    if (f.job != j || (f.kind != FaultKind::slowdown_rank && f.kind != FaultKind::slowdown_node)) continue;
    if (last < f.onset_ns || last >= f.end_ns) continue;
    for (size_t k = 0; k < comm.members.size(); ++k) {
      int r = comm.members[k];
      if (std::find(f.ranks.begin(), f.ranks.end(), r) == f.ranks.end()) continue;
      std::vector<int64_t> others, others_own;
      for (size_t o = 0; o < comm.members.size(); ++o)
        if (o != k) others.push_back(arrival[o]), others_own.push_back(a.own[o]);
      lateness_[{f.id, comm.hash, r}].push_back(arrival[k] - median(others));
      own_lag_[{f.id, comm.hash, r}].push_back(a.own[k] - median(others_own));
    }
  }
}

void Fleet::queued_collective(int j, int c, uint8_t op, uint8_t datatype, uint64_t count, double xfer_ns, bool sync,
                              bool mismatch_point, std::vector<std::vector<SimEvent>>& out, size_t& made) {
  JobRun& run = runs_[j];
  const CommDef& comm = jobs_[j].comms[c];
  std::mt19937_64& rng = job_rng_[j];
  const uint64_t seq = run.comm_seq[c];
  const Arrivals arrived = arrive(j, c, op, datatype, count, mismatch_point, out, made);
  const auto& [arrival, own, complete, mismatched] = arrived;
  sample_clocks(jobs_[j], comm, seq, arrival);
  for (size_t k = 0; k < comm.members.size(); ++k)
    if (arrival[k] < kNever) run.t[comm.members[k]] = arrival[k] + 15'000;  // enqueued: the host computes on
  if (!complete || mismatched) {
    // The collective never ends: every stream that reached it stays there.
    for (size_t k = 0; k < comm.members.size(); ++k)
      if (arrival[k] < kNever) run.stream[comm.members[k]] = kNever;
  } else {
    int64_t last = 0;
    for (size_t k = 0; k < comm.members.size(); ++k)
      last = std::max(last, std::max(arrival[k], run.stream[comm.members[k]]));
    std::normal_distribution<double> spread(0, config_.exit_spread_us * 1000);
    for (int r : comm.members) run.stream[r] = last + static_cast<int64_t>(xfer_ns) + static_cast<int64_t>(std::fabs(spread(rng)));
    note_lateness(j, comm, arrived, *std::max_element(arrival.begin(), arrival.end()));
  }
  if (sync) host_waits(j, out);
}

void Fleet::host_waits(int j, std::vector<std::vector<SimEvent>>& out) {
  JobRun& run = runs_[j];
  const JobDef& job = jobs_[j];
  for (size_t r = 0; r < job.ranks.size(); ++r) {
    if (run.t[r] >= kNever) continue;
    if (run.stream[r] >= kNever) {
      // Waits for a collective that never ends.
      state_[j][r].blocked_at = std::min(state_[j][r].blocked_at, run.t[r] + 20000);
      run.t[r] = kNever;
      continue;
    }
    SimEvent w;
    w.wait = true;
    w.pid = job.ranks[r].pid;
    w.wait_start = run.t[r] + 20000;
    run.t[r] = std::max(run.t[r] + 20000, run.stream[r]);
    w.wait_end = run.t[r];
    w.at_ns = run.t[r];
    out[job.ranks[r].node].push_back(w);
  }
}

void Fleet::data_parallel_step(int j, std::vector<std::vector<SimEvent>>& out, size_t& made) {
  const JobDef& job = jobs_[j];
  const int n = static_cast<int>(job.ranks.size());
  const double step = config_.step_ms * kMs;
  const std::string& p = config_.pattern;
  if (p == "accum" && (steps_[j] + 1) % static_cast<uint64_t>(config_.accum_steps) != 0) {
    for (int r = 0; r < n; ++r) compute(j, r, step);  // a micro-step: no collective
    return;
  }
  struct Op {
    uint8_t op, datatype;
    uint64_t count;
  };
  std::vector<Op> ops;
  if (p == "fsdp") {
    for (int l = 0; l < config_.layers; ++l) ops.push_back({RS_OP_ALLGATHER, kBfloat16, 1u << 18});
    for (int l = 0; l < config_.layers; ++l) {
      ops.push_back({RS_OP_ALLGATHER, kBfloat16, 1u << 18});
      ops.push_back({RS_OP_REDUCESCATTER, kFloat32, 1u << 16});
    }
  } else {
    for (int b = 0; b < config_.dp_buckets; ++b) ops.push_back({RS_OP_ALLREDUCE, kFloat32, 25u << 20});
  }
  // The step's compute, spread over the collectives; their transfers take
  // a third of a step on the stream, overlapped with the compute.
  const double compute_ns = step * 0.9 / static_cast<double>(ops.size());
  const double xfer_ns = step * 0.3 / static_cast<double>(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    for (int r = 0; r < n; ++r) compute(j, r, compute_ns);
    bool last = i + 1 == ops.size();
    queued_collective(j, job.world, ops[i].op, ops[i].datatype, ops[i].count, xfer_ns, p == "sync-each" || last,
                      i == 0, out, made);
  }
  for (int r = 0; r < n; ++r) compute(j, r, step * 0.1);  // the optimizer
}

void Fleet::p2p(int j, std::vector<std::vector<SimEvent>>& out, size_t& made) {
  JobRun& run = runs_[j];
  const JobDef& job = jobs_[j];
  std::mt19937_64& rng = job_rng_[j];
  for (int c = 0; c < static_cast<int>(job.comms.size()); ++c) {
    const CommDef& comm = job.comms[c];
    if (comm.kind != "pp") continue;
    std::vector<int64_t> arrival(comm.members.size(), kNever);
    for (size_t s = 0; s < comm.members.size(); ++s) {
      int r = comm.members[s];
      if (run.t[r] >= kNever || stops_at(j, r, run.t[r])) {
        run.t[r] = kNever;
        continue;
      }
      arrival[s] = run.t[r];
      // Forward activations to the next stage, gradients back to the previous: one group of calls.
      int64_t at = arrival[s];
      for (int peer : {static_cast<int>(s) - 1, static_cast<int>(s) + 1}) {
        if (peer < 0 || peer >= static_cast<int>(comm.members.size())) continue;
        for (uint32_t recv : {0u, 1u}) {
          uint32_t lane = 1 + 2 * static_cast<uint32_t>(peer) + recv;
          uint64_t seq = run.p2p_seq[{c, r, lane}]++;
          emit(j, r, c, static_cast<int32_t>(s), lane, seq, recv ? RS_OP_RECV : RS_OP_SEND, kBfloat16, 1u << 22, peer,
               RS_CALL_IN_GROUP, at, out, made);
          at += 2000;
        }
      }
    }
    // NCCL point-to-point semantics: a Send completes when its peer posts
    // the Recv, and the calls of one group run side by side, so a stage
    // waits for its direct neighbours only (not for the whole pipeline):
    // one whose neighbour never posted waits for ever, the others go on
    // (and wait, at their next exchange, on the stage that waits).
    std::normal_distribution<double> spread(0, config_.exit_spread_us * 1000);
    const int64_t transfer = static_cast<int64_t>(config_.step_ms * kMs * 0.01);
    const int stages = static_cast<int>(comm.members.size());
    for (int s = 0; s < stages; ++s) {
      if (arrival[s] >= kNever) continue;
      int64_t leave = arrival[s];
      if (s > 0) leave = std::max(leave, arrival[s - 1]);
      if (s + 1 < stages) leave = std::max(leave, arrival[s + 1]);
      if (leave >= kNever) {
        state_[j][comm.members[s]].blocked_at = std::min(state_[j][comm.members[s]].blocked_at, arrival[s] + 20000);
        run.t[comm.members[s]] = kNever;
        continue;
      }
      run.t[comm.members[s]] = leave + transfer + static_cast<int64_t>(std::fabs(spread(rng)));
    }
  }
}

void Fleet::step(int j, std::vector<std::vector<SimEvent>>& out, size_t& made) {
  if (queued_pattern(config_.pattern)) return data_parallel_step(j, out, made);
  const JobDef& job = jobs_[j];
  const int n = static_cast<int>(job.ranks.size());
  const double step = config_.step_ms * kMs;
  // The step's compute, split over its segments: tensor-parallel layers,
  // the pipeline exchange, the gradient buckets, the optimizer.
  const double tp_c = step * 0.5 / std::max(1, config_.tp_ops);
  const double pp_c = step * 0.08;
  const double dp_c = step * 0.22 / std::max(1, config_.dp_buckets);
  const double opt_c = step * 0.1;
  std::vector<int> tp, dp;
  for (int c = 0; c < static_cast<int>(job.comms.size()); ++c) {
    if (job.comms[c].kind == "tp") tp.push_back(c);
    if (job.comms[c].kind == "dp") dp.push_back(c);
  }
  bool has_pp = config_.pp > 1;
  bool dp_mismatch_point = !dp.empty();
  int last_op_kind = job.world >= 0 ? 3 : !dp.empty() ? 2 : 1;
  for (int l = 0; l < config_.tp_ops; ++l) {
    for (int r = 0; r < n; ++r) compute(j, r, tp_c);
    collective(j, tp, RS_OP_ALLREDUCE, kBfloat16, 1u << 22, last_op_kind == 1 && l == config_.tp_ops - 1,
               !dp_mismatch_point && l == 0, out, made);
  }
  if (has_pp) {
    for (int r = 0; r < n; ++r) compute(j, r, pp_c);
    p2p(j, out, made);
  }
  for (int b = 0; b < config_.dp_buckets && !dp.empty(); ++b) {
    for (int r = 0; r < n; ++r) compute(j, r, dp_c);
    collective(j, dp, RS_OP_ALLREDUCE, kFloat32, 25u << 20, last_op_kind == 2 && b == config_.dp_buckets - 1, b == 0,
               out, made);
  }
  if (job.world >= 0) {
    for (int r = 0; r < n; ++r) compute(j, r, opt_c);
    collective(j, {job.world}, RS_OP_ALLREDUCE, kFloat32, 1, true, false, out, made);
  }
}

size_t Fleet::advance(int64_t horizon_ns, std::vector<std::vector<SimEvent>>& out) {
  out.resize(nodes_.size());
  size_t made = 0;
  for (int j = 0; j < static_cast<int>(jobs_.size()); ++j) {
    JobRun& run = runs_[j];
    while (!run.frozen) {
      int64_t start = *std::min_element(run.t.begin(), run.t.end());
      if (start >= kNever) {
        run.frozen = true;
        break;
      }
      if (start >= horizon_ns) break;
      step(j, out, made);
      ++steps_[j];
    }
  }
  return made;
}

std::vector<Fleet::ClockSample> Fleet::take_clock_samples() {
  std::vector<ClockSample> out;
  out.swap(clock_samples_);
  return out;
}

}  // namespace rankscope::sim
