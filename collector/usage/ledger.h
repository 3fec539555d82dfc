#pragma once
// The usage ledger: who held how many GPUs, used how much CPU, spent how long
// in collectives and host waits, moved how many bytes, and how many GPU-hours
// were lost waiting on stragglers and hangs, and on whom.
//
// Rolled up per minute, per node, per process identity (job, step, user,
// account, pod, container, cgroup), with hour and day rollups of the same
// rows, in the store's `usage` column family:
//   key   = level ('m' | 'h' | 'd') | bucket start, s since the epoch (BE 8) |
//           kind ('u' usage | 'w' waste edge) | node | 0 | identity digest (16)
//           [| cause node | 0 | cause identity digest (16)   for 'w']
//   value = the identities and the figures (encode_usage_row below)
// and, beside them, what the ledger has counted so far of what is still
// running, written in the same commits as the rows it produced (a restarted
// collector goes on from there, counting nothing twice):
//   't' | node | 0 | pid (BE 4)  -> a running process's counters (ProcessTrack)
//   'k' | finding key            -> the cluster time an open hang's waste is counted to
// A report over a range reads whole days, then whole hours, then minutes at
// its edges: a month over 1,000 nodes reads tens of thousands of rows, not
// tens of millions. Tenants (--by) are computed at report time from the
// identities, so one ledger serves every way of billing.
// What is measured and how: docs/usage.md.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "collector/commit.h"
#include "collector/detect/finding.h"
#include "collector/match/matcher.h"
#include "collector/model/cluster.h"
#include "collector/store/write_set.h"
#include "common/result.h"

namespace rankscope::collector {

// Who a process is, as far as billing goes (not which rank or pid).
struct Identity {
  std::string job, step, user, account, namespace_, pod_uid, container_id, cgroup_path;
  auto tie() const { return std::tie(job, step, user, account, namespace_, pod_uid, container_id, cgroup_path); }
  bool operator<(const Identity& o) const { return tie() < o.tie(); }
  bool operator==(const Identity& o) const { return tie() == o.tie(); }
  // 16 bytes naming the identity in the ledger's keys: BLAKE2b-128 of its
  // fields, each length-prefixed. Collision-resistant: the fields are
  // strings users choose (job names, cgroup paths), and two identities
  // sharing a key would share a row.
  std::string digest() const;
  static Identity of(const ProcessInfo& process);
  // What a cgroup path alone says: Slurm job and step (job_<id>/step_<n>),
  // Kubernetes pod and container; the path itself.
  static Identity of_cgroup_path(const std::string& path);
};

enum class TenantKey { account, user, job, namespace_, pod, cgroup, node };
bool parse_tenant_key(const std::string& name, TenantKey& out);
const char* tenant_key_name(TenantKey key);
// The tenant an identity on `node` bills to; "(unknown)" when it does not say.
std::string tenant_of(const Identity& identity, const std::string& node, TenantKey key);
constexpr const char* kUnknownTenant = "(unknown)";

struct Usage {
  double gpu_s = 0;         // GPU-seconds held
  double cpu_s = 0;         // CPU-seconds, all threads
  double off_cpu_s = 0;     // seconds its NCCL/CUDA-calling threads were switched out
  double collective_s = 0;  // seconds in NCCL calls (host side: issue to return)
  double wait_s = 0;        // seconds in host waits on the GPU (cudaStreamSynchronize...)
  double bytes = 0;         // bytes moved by its collectives (per rank, as NCCL counts them)
  double collectives = 0;   // NCCL calls
  void add(const Usage& o);
  Usage minus(const Usage& o) const;
};

// GPU-seconds a victim's GPUs sat idle because of a cause.
enum class WasteReason : uint8_t { straggler = 1, cpu_neighbour = 2, hang = 3 };
const char* waste_reason_name(WasteReason reason);
// The cause node of a victim's spread row: its waiting in a minute on
// causes beyond the ones named (UsageOptions::named_causes), whose cause
// identity keeps only what those causes had in common.
constexpr const char* kSpreadCauseNode = "(spread)";

struct UsageRow {
  std::string node;
  Identity identity;
  Usage usage;
};
struct WasteRow {
  std::string node;   // the victim's
  Identity identity;  // the victim's
  std::string cause_node;
  Identity cause;
  WasteReason reason = WasteReason::straggler;
  std::string cause_detail;  // "rank 3 (pid 123)", "cgroup /sys/.../job_5/step_0 (2.0 CPUs)"
  double gpu_s = 0;
};

enum class Level : char { minute = 'm', hour = 'h', day = 'd' };
uint64_t bucket_start(Level level, uint64_t unix_s);
uint64_t bucket_seconds(Level level);
std::string usage_key(Level level, uint64_t bucket_s, const std::string& node, const Identity& identity);
std::string waste_key(Level level, uint64_t bucket_s, const WasteRow& row);
std::string encode_usage_row(const UsageRow& row);
std::string encode_waste_row(const WasteRow& row);
// A stored row of either kind: what the key says it is.
struct LedgerEntry {
  Level level = Level::minute;
  uint64_t bucket_s = 0;
  bool waste = false;
  UsageRow usage;
  WasteRow edge;
};
Result<LedgerEntry> decode_ledger_entry(std::string_view key, std::string_view value);

// [since, until) as the fewest whole buckets: days, then hours, then minutes
// (a minute bucket is taken when it starts inside the range).
struct LevelRange {
  Level level;
  uint64_t from_s, to_s;  // bucket starts, to exclusive
};
// `coarsest`: the largest buckets to use (Level::hour reads no day rows:
// the benchmark's baseline).
std::vector<LevelRange> plan_ranges(uint64_t since_s, uint64_t until_s, Level coarsest = Level::day);
// Every entry of [since, until) (unix seconds), each bucket counted once.
Result<void> scan_ledger(const UsageRows& rows, uint64_t since_s, uint64_t until_s,
                         const std::function<void(const LedgerEntry&)>& entry, Level coarsest = Level::day);

struct UsageOptions {
  uint64_t flush_interval_ns = 5'000'000'000ull;
  uint64_t min_wait_ns = 2'000'000;        // a wait for a late rank shorter than this is jitter, not waste
  double neighbour_cpus = 0.5;             // a neighbour cgroup this busy on a straggler's node is the cause...
  double neighbour_runqueue_share = 0.05;  // ...when the late rank waited this share of its time for a CPU
  uint64_t neighbour_window_ns = 10'000'000'000ull;
  uint64_t hang_timeout_ns = 30'000'000'000ull;  // hang waste counts from when the ranks started waiting
  // Causes named per victim (node and identity) and minute, the most waited
  // on first; the rest of its waiting that minute is one spread row. Bounds
  // the rows a job's jitter writes at thousands of ranks.
  size_t named_causes = 8;
};

// A record observer for what each process did (calls, bytes, time in
// collectives and waits), a match listener for whom it waited on.
class UsageLedger final : public RecordObserver, public MatchListener, public CommitParticipant {
 public:
  // Reads the cluster `model`, hears `matcher`'s completed collectives, and
  // reads back its own rows from `rows`; records reach it as a
  // RecordObserver of whoever applies them (the ingest: collector/service.h).
  UsageLedger(const ClusterModel& model, CollectiveMatcher& matcher, const UsageRows& rows, UsageOptions options);
  // What an earlier run had counted of the processes and hangs still going.
  Result<void> restore();

  void on_records(const CommState& comm, int32_t rank, uint32_t lane,
                  std::span<const proto::CallRecord> records) override;
  void on_waits(const std::string& node, uint32_t pid, std::span<const HostWait> waits) override;
  // The waiting at a collective is owed to its last arrival.
  void on_complete(const CollectiveComplete& done) override;
  // Takes the processes' new heartbeat samples (GPU, CPU and off-CPU time)
  // and the open hangs' waiting; `now_ns` on the cluster clock.
  // `open`: the open findings (the hangs' waiting is counted from them).
  void tick(uint64_t now_ns, const std::vector<const Finding*>& open);
  // Writes what changed into `writes` once per flush interval (or now, with
  // force); returns whether it wrote.
  Result<bool> persist(WriteSet& writes, uint64_t now_ns, bool force = false);
  // The commit protocol (collector/commit.h): persist(), forced when final.
  // Rows staged and not yet committed are read back from memory (an hour's
  // rollup adds to what the last flush wrote, durable or not).
  Result<void> stage(WriteSet& writes, uint64_t now_ns, bool final) override;
  void committed() override;

  // Direct entry (the rollup itself, tests and the benchmark's filler).
  void add_usage(uint64_t at_ns, const std::string& node, const Identity& identity, const Usage& usage);
  // Spreads `usage` over [from_ns, to_ns) in proportion to the time in each minute.
  void add_usage_span(uint64_t from_ns, uint64_t to_ns, const std::string& node, const Identity& identity,
                      const Usage& usage);
  void add_waste(uint64_t at_ns, const WasteRow& row);

  // GPU-seconds and waste so far per (tenant, key), for the metrics.
  struct Totals {
    double gpu_s = 0, waste_s = 0, caused_s = 0;
  };
  const std::map<std::string, Totals>& totals(TenantKey key);

 private:
  struct ProcessTrack {
    bool seen = false;
    bool alive = true;
    uint64_t last_sample_ns = 0;          // node clock of the last sample taken
    uint64_t last_cluster_ns = 0;         // its cluster time
    uint64_t cpu_ns = 0, off_cpu_ns = 0;  // BPF host counters (or the main thread's schedstat)
    uint64_t stat_cpu_ns = 0;             // /proc/PID/stat, kernel accounting
    bool done = false;                    // exited and counted to the end
    // Its last sample carried the BPF host counters: its exit's counters,
    // which a heartbeat may carry only after one that found it gone (the
    // exit event not read yet), will bill the CPU of its last interval.
    bool host_at_last = false;
    uint64_t deferred_since = 0;          // node clock of a first sample put off until its identity is known
    uint64_t start_time = 0;              // the process's (/proc/PID/stat): a pid reused is another process
    bool dirty = false;                   // changed since the last flush
  };
  struct CommTrack {
    std::vector<int64_t> blamed_until;  // by rank: waiting on it counted up to here
  };
  struct Cached {
    std::string value_key;
    UsageRow row;
    bool loaded = false;
  };
  struct MinuteRow {
    UsageRow row;
    Usage flushed;  // what the hour and day rollups already hold of it
    bool dirty = false;
  };
  struct MinuteEdge {
    WasteRow row;
    double flushed = 0;
    bool dirty = false;
  };

  // A ledger row as the next commit will leave it: staged, else stored.
  Result<std::optional<std::string>> stored_usage(const std::string& key) const;
  void put(WriteSet& writes, const std::string& key, std::string value);
  void erase(WriteSet& writes, const std::string& key);
  static std::string encode_track(const ProcessTrack& track);
  static std::optional<ProcessTrack> decode_track(std::string_view value);
  // Moves what the record path gathered (per process, per late rank) into the rows.
  void fold_records();
  // add_usage and add_waste with the row's key made (fold_records makes
  // each party's part of it once); `cause`: the waste row's cause fields.
  void add_usage_at(std::string key, const std::string& node, const Identity& identity, const Usage& usage);
  // `spread`: the row gathers many causes; its cause identity keeps what they have in common.
  void add_waste_at(std::string key, const std::string& node, const Identity& identity, const WasteRow& cause,
                    double gpu_s, bool spread = false);
  double gpus_of(const ProcessInfo* process) const;
  // The neighbour cgroup to blame for a late rank on `node`, if any.
  std::optional<WasteRow> neighbour_cause(const std::string& node, const ProcessInfo* late, uint32_t late_pid) const;
  void take_samples(uint64_t now_ns);
  // persist()'s hour and day rows: what is stored of each, plus this flush's change.
  Result<void> write_rollups(WriteSet& writes, std::map<std::string, UsageRow>& rollups,
                             std::map<std::string, WasteRow>& edge_rollups);
  // persist()'s progress rows: each process's counting so far and the hangs
  // counted, and the removal of those gone.
  void write_progress(WriteSet& writes);
  // One process's newest health sample: the usage since its last one.
  void take_sample(const std::string& name, const NodeState& node, uint32_t pid, const HealthSample& sample);
  void hang_waste(uint64_t now_ns, const std::vector<const Finding*>& open);
  void count_totals(const std::string& node, const Identity& identity, double gpu_s, double waste_s, double caused_s,
                    const std::string& cause_node, const Identity* cause);

  const ClusterModel& model_;
  const UsageRows& rows_;
  UsageOptions options_;
  std::map<std::pair<std::string, uint32_t>, ProcessTrack> processes_;
  std::map<uint64_t, CommTrack> comms_;
  // The record and wait paths only add up, cheaply; tick() attributes. By (minute, node, pid):
  std::map<std::tuple<uint64_t, std::string, uint32_t>, Usage> record_usage_;
  Usage& record_usage(uint64_t minute, const std::string& node, uint32_t pid);
  // The entry the last record or wait went to: a block's share it (cleared with record_usage_).
  struct LastUsage {
    uint64_t minute = 0;
    uint32_t pid = 0;
    std::string node;
    Usage* usage = nullptr;
  } last_usage_;
  // By (comm, late rank, minute): seconds the others waited on it.
  struct PendingWait {
    double seconds = 0;
    uint64_t first_ns = 0;
  };
  std::map<std::tuple<uint64_t, int32_t, uint64_t>, PendingWait> pending_waits_;
  std::map<std::string, MinuteRow> minutes_;         // by key
  std::map<std::string, MinuteEdge> edges_;          // by key
  std::map<std::string, uint64_t> hang_counted_ns_;  // open hang key -> cluster time counted up to
  std::set<std::string> hangs_dirty_, hangs_gone_;   // to write, to delete at the next flush
  // Counted by an earlier run, until the process is heard of again (or not,
  // for kRestoredGraceNs after the restart).
  std::map<std::pair<std::string, uint32_t>, ProcessTrack> restored_;
  uint64_t restored_at_ns_ = 0;
  std::set<std::pair<std::string, uint32_t>> tracks_gone_;  // to delete at the next flush
  // Tracks whose health entry left the table (evicted over its bound): with
  // when, kept a while in case the process's exit is reported after.
  std::map<std::pair<std::string, uint32_t>, std::pair<ProcessTrack, uint64_t>> left_;
  static constexpr uint64_t kLeftKeptNs = 60'000'000'000ull;
  static constexpr size_t kLeftKept = 1 << 16;
  uint64_t last_flush_ns_ = 0;
  // Since the collector started, for the metrics: by identity and node.
  struct Running {
    Identity identity;
    std::string node;
    Totals totals;
  };
  std::map<std::pair<std::string, Identity>, Running> running_;
  std::map<std::string, Totals> totals_view_;
  std::map<std::string, std::optional<std::string>> unsettled_;  // staged, not committed (nullopt: deleted)
};

}  // namespace rankscope::collector
