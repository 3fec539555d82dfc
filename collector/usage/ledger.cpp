#include "collector/usage/ledger.h"

#include <sodium.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <tuple>
#include <unordered_map>

#include "collector/store/bytes.h"
#include "common/cgroup_path.h"
#include "common/format.h"
#include "common/log.h"
#include "proto/records.h"

namespace rankscope::collector {

namespace {
constexpr uint8_t kRowVersion = 1;
constexpr size_t kDigestBytes = 16;  // Identity::digest: BLAKE2b-128
constexpr uint64_t kNs = 1'000'000'000ull;
// A process first seen this long after it started: counted from the first
// sample, not from its start (the agent or the collector came later).
constexpr uint64_t kMaxStartGapNs = 120 * kNs;
// How long a process's first sample waits for its identity (see take_samples).
constexpr uint64_t kIdentityWaitNs = 10 * kNs;
// A process counted by the collector's previous run and not heard of for
// this long after the restart has ended while it was away.
constexpr uint64_t kRestoredGraceNs = 600 * kNs;
constexpr uint8_t kTrackVersion = 1;

using bytes::get_be;
using bytes::put_be;

void put_text(std::string& out, const std::string& text) {
  uint32_t n = static_cast<uint32_t>(std::min<size_t>(text.size(), 65535));
  out.push_back(static_cast<char>(n >> 8));
  out.push_back(static_cast<char>(n & 0xff));
  out.append(text.data(), n);
}
void put_double(std::string& out, double value) {
  char bytes[8];
  std::memcpy(bytes, &value, 8);
  out.append(bytes, 8);
}

// Reads what put_text/put_double wrote; any short read makes it bad.
struct Reader {
  std::string_view in;
  bool bad = false;
  std::string text() {
    if (in.size() < 2) return bad = true, std::string();
    size_t n = static_cast<uint8_t>(in[0]) << 8 | static_cast<uint8_t>(in[1]);
    if (in.size() < 2 + n) return bad = true, std::string();
    std::string out(in.substr(2, n));
    in.remove_prefix(2 + n);
    return out;
  }
  double number() {
    if (in.size() < 8) return bad = true, 0.0;
    double value;
    std::memcpy(&value, in.data(), 8);
    in.remove_prefix(8);
    return value;
  }
  uint8_t byte() {
    if (in.empty()) return bad = true, 0;
    uint8_t b = static_cast<uint8_t>(in[0]);
    in.remove_prefix(1);
    return b;
  }
};

std::string track_key(const std::string& node, uint32_t pid) {
  std::string key(1, 't');
  key += node;
  key.push_back('\0');
  put_be(key, pid, 4);
  return key;
}

std::string hang_key(const std::string& finding) {
  return "k" + finding;
}

void put_identity(std::string& out, const Identity& id) {
  for (const std::string* f :
       {&id.job, &id.step, &id.user, &id.account, &id.namespace_, &id.pod_uid, &id.container_id, &id.cgroup_path})
    put_text(out, *f);
}
Identity read_identity(Reader& in) {
  Identity id;
  for (std::string* f :
       {&id.job, &id.step, &id.user, &id.account, &id.namespace_, &id.pod_uid, &id.container_id, &id.cgroup_path})
    *f = in.text();
  return id;
}

void put_usage(std::string& out, const Usage& u) {
  for (double v : {u.gpu_s, u.cpu_s, u.off_cpu_s, u.collective_s, u.wait_s, u.bytes, u.collectives}) put_double(out, v);
}
Usage read_usage(Reader& in) {
  Usage u;
  for (double* v : {&u.gpu_s, &u.cpu_s, &u.off_cpu_s, &u.collective_s, &u.wait_s, &u.bytes, &u.collectives})
    *v = in.number();
  return u;
}

// A row's key: level, bucket start and kind, then the row's parties.
constexpr size_t kKeyPrefixBytes = 10;
std::string key_prefix(Level level, uint64_t bucket_s, char kind) {
  std::string key(1, static_cast<char>(level));
  put_be(key, bucket_s, 8);
  key.push_back(kind);
  return key;
}

// A party's part of a row's key: its node and its identity's digest.
std::string party_key(const std::string& node, const Identity& identity) {
  std::string part = node;
  part.push_back('\0');
  part += identity.digest();
  return part;
}

// A waste row's cause's part of its key, after the victim's.
std::string cause_key(const WasteRow& row) {
  std::string part = party_key(row.cause_node, row.cause);
  part.push_back(static_cast<char>(row.reason));
  return part;
}

// The spread row of a victim: its waiting on causes beyond the named ones
// (UsageOptions::named_causes). Its cause part has the spread node and a
// digest no identity has (all ones), so no named cause shares its key.
const std::string& spread_marker() {
  static const std::string marker = std::string(kSpreadCauseNode) + '\0' + std::string(16, '\xff');
  return marker;
}

std::string spread_cause_key(WasteReason reason) {
  return spread_marker() + static_cast<char>(reason);
}

bool is_spread_cause(std::string_view cause_part) {
  return cause_part.size() == spread_marker().size() + 1 && cause_part.starts_with(spread_marker());
}

// A waste row's key whose cause is the spread one (the cause part ends it).
bool is_spread_row(std::string_view key) {
  return key.size() > spread_marker().size() && is_spread_cause(key.substr(key.size() - spread_marker().size() - 1));
}

// What two identities have in common: each field they agree on (a job's
// late ranks share its job, user and account; their cgroups and pods differ).
Identity common_fields(const Identity& a, const Identity& b) {
  Identity out;
  auto keep = [](std::string& to, const std::string& x, const std::string& y) {
    if (x == y) to = x;
  };
  keep(out.job, a.job, b.job);
  keep(out.step, a.step, b.step);
  keep(out.user, a.user, b.user);
  keep(out.account, a.account, b.account);
  keep(out.namespace_, a.namespace_, b.namespace_);
  keep(out.pod_uid, a.pod_uid, b.pod_uid);
  keep(out.container_id, a.container_id, b.container_id);
  keep(out.cgroup_path, a.cgroup_path, b.cgroup_path);
  return out;
}

// The key of the same row in another bucket: only the prefix differs.
std::string rekeyed(const std::string& key, Level level, uint64_t bucket_s) {
  return key_prefix(level, bucket_s, key[kKeyPrefixBytes - 1]) + key.substr(kKeyPrefixBytes);
}

// The (node, identity) parties of one fold of the ledger, each made and
// digested once: the thousands of rows a fold adds to at thousands of
// ranks name a few parties each (a node's processes of one job).
class Parties {
 public:
  struct Party {
    std::string node;
    Identity identity;
    std::string key;  // party_key
  };
  explicit Parties(const ClusterModel& model) : model_(model) {}

  // The party of process `pid` on `node`, and the process (null: not known).
  size_t of(const std::string& node, uint32_t pid, const ProcessInfo** process = nullptr) {
    const ProcessInfo* p = model_.process(node, pid);
    if (process) *process = p;
    if (p) {
      auto [it, fresh] = by_process_.try_emplace(p, 0);
      if (fresh) it->second = intern(node, Identity::of(*p));
      return it->second;
    }
    auto [it, fresh] = unknown_by_node_.try_emplace(node, 0);
    if (fresh) it->second = intern(node, Identity{});
    return it->second;
  }
  const Party& operator[](size_t i) const { return all_[i]; }

 private:
  size_t intern(const std::string& node, Identity identity) {
    std::string key = party_key(node, identity);
    auto [it, fresh] = by_key_.try_emplace(key, all_.size());
    if (fresh) all_.push_back(Party{node, std::move(identity), std::move(key)});
    return it->second;
  }

  const ClusterModel& model_;
  std::deque<Party> all_;  // a reference to a party stays good as others are added
  std::unordered_map<std::string, size_t> by_key_;
  std::unordered_map<const ProcessInfo*, size_t> by_process_;
  std::unordered_map<std::string, size_t> unknown_by_node_;
};

uint64_t minute_of(uint64_t ns) {
  return ns / kNs / 60 * 60;
}

// A span of years (a hostile wait's times) would make millions of minute
// rows: heartbeats come every second and waits last seconds, so whatever
// lasted longer than a day is counted in its last day.
constexpr uint64_t kMaxSpanNs = 24ull * 3600 * kNs;
uint64_t span_start(uint64_t from_ns, uint64_t to_ns) {
  return to_ns - std::min(to_ns - from_ns, kMaxSpanNs);
}

// Calls at(from, to) for each minute's piece of the span [from_ns, to_ns)
// (to_ns > from_ns), cut to its last day.
template <typename At>
void for_each_minute(uint64_t from_ns, uint64_t to_ns, At at) {
  for (uint64_t from = span_start(from_ns, to_ns); from < to_ns;) {
    const uint64_t end = std::min(to_ns, (minute_of(from) + 60) * kNs);
    at(from, end);
    from = end;
  }
}

double clock_ticks_per_s() {
  static const double ticks = [] {
    long t = sysconf(_SC_CLK_TCK);
    return t > 0 ? static_cast<double>(t) : 100.0;
  }();
  return ticks;
}
}  // namespace

std::string Identity::digest() const {
  static const bool ready = sodium_init() >= 0;  // picks the fastest implementation; idempotent
  (void)ready;
  crypto_generichash_state state;
  crypto_generichash_init(&state, nullptr, 0, kDigestBytes);
  for (const std::string* f : {&job, &step, &user, &account, &namespace_, &pod_uid, &container_id, &cgroup_path}) {
    unsigned char length[8];
    for (int i = 0; i < 8; ++i)
      length[i] = static_cast<unsigned char>(static_cast<uint64_t>(f->size()) >> (56 - 8 * i));
    crypto_generichash_update(&state, length, sizeof(length));
    crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(f->data()), f->size());
  }
  unsigned char out[kDigestBytes];
  crypto_generichash_final(&state, out, sizeof(out));
  return std::string(reinterpret_cast<const char*>(out), sizeof(out));
}

Identity Identity::of(const ProcessInfo& p) {
  Identity id;
  id.job = p.job;
  id.step = p.slurm_step;
  id.user = p.user;
  id.account = p.account;
  id.pod_uid = p.pod_uid;
  id.namespace_ = p.pod_namespace;
  id.container_id = p.container_id;
  id.cgroup_path = p.cgroup_path;
  return id;
}

Identity Identity::of_cgroup_path(const std::string& path) {
  CgroupIdentity found = parse_cgroup_path(path);
  Identity id;
  id.cgroup_path = path;
  id.job = found.slurm_job;
  id.step = found.slurm_step;
  id.pod_uid = found.pod_uid;
  id.container_id = found.container_id;
  return id;
}

bool parse_tenant_key(const std::string& name, TenantKey& out) {
  static const std::pair<const char*, TenantKey> kKeys[] = {
      {"account", TenantKey::account},      {"user", TenantKey::user}, {"job", TenantKey::job},
      {"namespace", TenantKey::namespace_}, {"pod", TenantKey::pod},   {"cgroup", TenantKey::cgroup},
      {"container", TenantKey::cgroup},     {"node", TenantKey::node}};
  for (const auto& [n, k] : kKeys)
    if (name == n) return out = k, true;
  return false;
}

const char* tenant_key_name(TenantKey key) {
  switch (key) {
    case TenantKey::account:
      return "account";
    case TenantKey::user:
      return "user";
    case TenantKey::job:
      return "job";
    case TenantKey::namespace_:
      return "namespace";
    case TenantKey::pod:
      return "pod";
    case TenantKey::cgroup:
      return "cgroup";
    case TenantKey::node:
      return "node";
  }
  return "?";
}

std::string tenant_of(const Identity& id, const std::string& node, TenantKey key) {
  const std::string* value = nullptr;
  switch (key) {
    case TenantKey::account:
      value = &id.account;
      break;
    case TenantKey::user:
      value = &id.user;
      break;
    case TenantKey::job:
      value = &id.job;
      break;
    case TenantKey::namespace_:
      value = &id.namespace_;
      break;
    case TenantKey::pod:
      value = &id.pod_uid;
      break;
    case TenantKey::cgroup:
      // The container when there is one, else the cgroup.
      value = !id.container_id.empty() ? &id.container_id : &id.cgroup_path;
      break;
    case TenantKey::node:
      value = &node;
      break;
  }
  return value == nullptr || value->empty() ? kUnknownTenant : *value;
}

void Usage::add(const Usage& o) {
  gpu_s += o.gpu_s;
  cpu_s += o.cpu_s;
  off_cpu_s += o.off_cpu_s;
  collective_s += o.collective_s;
  wait_s += o.wait_s;
  bytes += o.bytes;
  collectives += o.collectives;
}

Usage Usage::minus(const Usage& o) const {
  Usage d = *this;
  d.gpu_s -= o.gpu_s;
  d.cpu_s -= o.cpu_s;
  d.off_cpu_s -= o.off_cpu_s;
  d.collective_s -= o.collective_s;
  d.wait_s -= o.wait_s;
  d.bytes -= o.bytes;
  d.collectives -= o.collectives;
  return d;
}

const char* waste_reason_name(WasteReason reason) {
  switch (reason) {
    case WasteReason::straggler:
      return "straggler";
    case WasteReason::cpu_neighbour:
      return "cpu-neighbour";
    case WasteReason::hang:
      return "hang";
  }
  return "?";
}

uint64_t bucket_seconds(Level level) {
  switch (level) {
    case Level::minute:
      return 60;
    case Level::hour:
      return 3600;
    case Level::day:
      return 86400;
  }
  return 60;
}

uint64_t bucket_start(Level level, uint64_t unix_s) {
  return unix_s / bucket_seconds(level) * bucket_seconds(level);
}

std::string usage_key(Level level, uint64_t bucket_s, const std::string& node, const Identity& identity) {
  return key_prefix(level, bucket_s, 'u') + party_key(node, identity);
}

std::string waste_key(Level level, uint64_t bucket_s, const WasteRow& row) {
  return key_prefix(level, bucket_s, 'w') + party_key(row.node, row.identity) + cause_key(row);
}

std::string encode_usage_row(const UsageRow& row) {
  std::string out(1, static_cast<char>(kRowVersion));
  put_text(out, row.node);
  put_identity(out, row.identity);
  put_usage(out, row.usage);
  return out;
}

std::string encode_waste_row(const WasteRow& row) {
  std::string out(1, static_cast<char>(kRowVersion));
  put_text(out, row.node);
  put_identity(out, row.identity);
  put_text(out, row.cause_node);
  put_identity(out, row.cause);
  out.push_back(static_cast<char>(row.reason));
  put_text(out, row.cause_detail);
  put_double(out, row.gpu_s);
  return out;
}

Result<LedgerEntry> decode_ledger_entry(std::string_view key, std::string_view value) {
  if (key.size() < 10 || value.empty() || static_cast<uint8_t>(value[0]) != kRowVersion)
    return make_error(Errc::storage, "a usage ledger row of an unknown layout");
  LedgerEntry entry;
  char level = key[0];
  if (level != 'm' && level != 'h' && level != 'd') return make_error(Errc::storage, "a usage ledger key of no level");
  entry.level = static_cast<Level>(level);
  entry.bucket_s = get_be(key.data() + 1, 8);
  entry.waste = key[9] == 'w';
  Reader in{value.substr(1)};
  if (!entry.waste) {
    entry.usage.node = in.text();
    entry.usage.identity = read_identity(in);
    entry.usage.usage = read_usage(in);
  } else {
    entry.edge.node = in.text();
    entry.edge.identity = read_identity(in);
    entry.edge.cause_node = in.text();
    entry.edge.cause = read_identity(in);
    entry.edge.reason = static_cast<WasteReason>(in.byte());
    entry.edge.cause_detail = in.text();
    entry.edge.gpu_s = in.number();
  }
  if (in.bad) return make_error(Errc::storage, "a truncated usage ledger row");
  return entry;
}

std::vector<LevelRange> plan_ranges(uint64_t since_s, uint64_t until_s, Level coarsest) {
  std::vector<LevelRange> out;
  if (until_s <= since_s) return out;
  // Recursively: the whole coarse buckets inside, finer ones at the edges.
  std::function<void(uint64_t, uint64_t, int)> plan = [&](uint64_t from, uint64_t to, int depth) {
    if (to <= from) return;
    static const Level kLevels[] = {Level::day, Level::hour, Level::minute};
    Level level = kLevels[depth];
    uint64_t size = bucket_seconds(level);
    if (level == Level::minute) {
      // Minute buckets that start inside [from, to).
      uint64_t first = (from + size - 1) / size * size;
      if (first < to) out.push_back({level, first, (to + size - 1) / size * size});
      return;
    }
    uint64_t first = (from + size - 1) / size * size;  // first whole bucket
    uint64_t last = to / size * size;                  // end of the last whole bucket
    if (first >= last) {
      plan(from, to, depth + 1);
      return;
    }
    plan(from, first, depth + 1);
    out.push_back({level, first, last});
    plan(last, to, depth + 1);
  };
  plan(since_s, until_s, coarsest == Level::day ? 0 : coarsest == Level::hour ? 1 : 2);
  return out;
}

Result<void> scan_ledger(const UsageRows& store, uint64_t since_s, uint64_t until_s,
                         const std::function<void(const LedgerEntry&)>& entry, Level coarsest) {
  for (const LevelRange& range : plan_ranges(since_s, until_s, coarsest)) {
    std::string from(1, static_cast<char>(range.level)), to(1, static_cast<char>(range.level));
    put_be(from, range.from_s, 8);
    put_be(to, range.to_s, 8);
    Error error;
    bool failed = false;
    auto scanned = store.scan_usage(from, to, [&](std::string_view key, std::string_view value) {
      auto decoded = decode_ledger_entry(key, value);
      if (!decoded) {
        error = decoded.error();
        failed = true;
        return false;
      }
      entry(*decoded);
      return true;
    });
    if (!scanned) return scanned.error();
    if (failed) return error;
  }
  return {};
}

// ---------------------------------------------------------------- the ledger

UsageLedger::UsageLedger(const ClusterModel& model, CollectiveMatcher& matcher, const UsageRows& rows,
                         UsageOptions options)
    : model_(model), rows_(rows), options_(options) {
  matcher.subscribe(*this);
}

double UsageLedger::gpus_of(const ProcessInfo* process) const {
  // A traced process loaded NCCL or the CUDA runtime: it holds the devices it
  // selected with cudaSetDevice, else the one CUDA gives it by default.
  if (!process || process->cuda_devices.empty()) return 1;
  std::set<int32_t> distinct(process->cuda_devices.begin(), process->cuda_devices.end());
  return static_cast<double>(distinct.size());
}

std::string UsageLedger::encode_track(const ProcessTrack& t) {
  std::string out(1, static_cast<char>(kTrackVersion));
  for (uint64_t v : {t.start_time, t.last_sample_ns, t.last_cluster_ns, t.cpu_ns, t.off_cpu_ns, t.stat_cpu_ns})
    put_be(out, v, 8);
  out.push_back(static_cast<char>((t.alive ? 1 : 0) | (t.done ? 2 : 0) | (t.host_at_last ? 4 : 0)));
  return out;
}

std::optional<UsageLedger::ProcessTrack> UsageLedger::decode_track(std::string_view value) {
  if (value.size() != 1 + 6 * 8 + 1 || static_cast<uint8_t>(value[0]) != kTrackVersion) return std::nullopt;
  ProcessTrack t;
  const char* at = value.data() + 1;
  for (uint64_t* v : {&t.start_time, &t.last_sample_ns, &t.last_cluster_ns, &t.cpu_ns, &t.off_cpu_ns, &t.stat_cpu_ns}) {
    *v = get_be(at, 8);
    at += 8;
  }
  uint8_t flags = static_cast<uint8_t>(*at);
  t.alive = flags & 1;
  t.done = flags & 2;
  t.host_at_last = flags & 4;
  t.seen = true;
  return t;
}

Result<void> UsageLedger::restore() {
  size_t unreadable = 0;
  auto tracks = rows_.scan_usage("t", "u", [&](std::string_view key, std::string_view value) {
    size_t zero = key.find('\0', 1);
    auto track = decode_track(value);
    if (zero == std::string_view::npos || key.size() != zero + 5 || !track) {
      ++unreadable;
      return true;
    }
    restored_[{std::string(key.substr(1, zero - 1)), static_cast<uint32_t>(get_be(key.data() + zero + 1, 4))}] = *track;
    return true;
  });
  if (!tracks) return tracks.error();
  auto hangs = rows_.scan_usage("k", "l", [&](std::string_view key, std::string_view value) {
    if (value.size() != 8) {
      ++unreadable;
      return true;
    }
    hang_counted_ns_[std::string(key.substr(1))] = get_be(value.data(), 8);
    return true;
  });
  if (!hangs) return hangs.error();
  if (unreadable) RS_LOG(warn, "usage ledger: %zu unreadable progress row(s) ignored", unreadable);
  if (!restored_.empty() || !hang_counted_ns_.empty())
    RS_LOG(info, "usage ledger: going on from the last run's counts of %zu process(es) and %zu open hang(s)",
           restored_.size(), hang_counted_ns_.size());
  return {};
}

void UsageLedger::add_usage(uint64_t at_ns, const std::string& node, const Identity& identity, const Usage& usage) {
  add_usage_at(usage_key(Level::minute, minute_of(at_ns), node, identity), node, identity, usage);
}

void UsageLedger::add_usage_at(std::string key, const std::string& node, const Identity& identity, const Usage& usage) {
  auto [it, created] = minutes_.try_emplace(std::move(key));
  MinuteRow& row = it->second;
  if (created) {
    row.row.node = node;
    row.row.identity = identity;
    // Late data for a minute already written and forgotten: start from what is stored.
    if (auto stored = stored_usage(it->first); stored && *stored)
      if (auto entry = decode_ledger_entry(it->first, **stored); entry && !entry->waste) {
        row.row.usage = entry->usage.usage;
        row.flushed = entry->usage.usage;
      }
  }
  row.row.usage.add(usage);
  row.dirty = true;
  count_totals(node, identity, usage.gpu_s, 0, 0, "", nullptr);
}

void UsageLedger::add_usage_span(uint64_t from_ns, uint64_t to_ns, const std::string& node, const Identity& identity,
                                 const Usage& usage) {
  if (to_ns <= from_ns) {
    add_usage(to_ns, node, identity, usage);
    return;
  }
  const double total = static_cast<double>(to_ns - span_start(from_ns, to_ns));
  for_each_minute(from_ns, to_ns, [&](uint64_t at, uint64_t end) {
    const double share = static_cast<double>(end - at) / total;
    Usage part;
    part.gpu_s = usage.gpu_s * share;
    part.cpu_s = usage.cpu_s * share;
    part.off_cpu_s = usage.off_cpu_s * share;
    part.collective_s = usage.collective_s * share;
    part.wait_s = usage.wait_s * share;
    part.bytes = usage.bytes * share;
    part.collectives = usage.collectives * share;
    add_usage(at, node, identity, part);
  });
}

void UsageLedger::add_waste(uint64_t at_ns, const WasteRow& row) {
  add_waste_at(waste_key(Level::minute, minute_of(at_ns), row), row.node, row.identity, row, row.gpu_s);
}

void UsageLedger::add_waste_at(std::string key, const std::string& node, const Identity& identity,
                               const WasteRow& cause, double gpu_s, bool spread) {
  auto [it, created] = edges_.try_emplace(std::move(key));
  MinuteEdge& edge = it->second;
  if (created) {
    edge.row = cause;
    edge.row.node = node;
    edge.row.identity = identity;
    edge.row.gpu_s = 0;
    if (auto stored = stored_usage(it->first); stored && *stored)
      if (auto entry = decode_ledger_entry(it->first, **stored); entry && entry->waste) {
        edge.row.gpu_s = entry->edge.gpu_s;
        edge.flushed = entry->edge.gpu_s;
        if (spread) edge.row.cause = common_fields(entry->edge.cause, cause.cause);
      }
  } else if (spread) {
    edge.row.cause = common_fields(edge.row.cause, cause.cause);
  }
  edge.row.gpu_s += gpu_s;
  if (!cause.cause_detail.empty()) edge.row.cause_detail = cause.cause_detail;
  edge.dirty = true;
  count_totals(node, identity, 0, gpu_s, 0, cause.cause_node, &cause.cause);
}

void UsageLedger::count_totals(const std::string& node, const Identity& identity, double gpu_s, double waste_s,
                               double caused_s, const std::string& cause_node, const Identity* cause) {
  Running& r = running_[{node, identity}];
  r.identity = identity;
  r.node = node;
  r.totals.gpu_s += gpu_s;
  r.totals.waste_s += waste_s;
  r.totals.caused_s += caused_s;
  if (cause) {
    Running& c = running_[{cause_node, *cause}];
    c.identity = *cause;
    c.node = cause_node;
    c.totals.caused_s += waste_s;
  }
}

const std::map<std::string, UsageLedger::Totals>& UsageLedger::totals(TenantKey key) {
  totals_view_.clear();
  for (const auto& [k, r] : running_) {
    Totals& t = totals_view_[tenant_of(r.identity, r.node, key)];
    t.gpu_s += r.totals.gpu_s;
    t.waste_s += r.totals.waste_s;
    t.caused_s += r.totals.caused_s;
  }
  return totals_view_;
}

Usage& UsageLedger::record_usage(uint64_t minute, const std::string& node, uint32_t pid) {
  if (!last_usage_.usage || last_usage_.minute != minute || last_usage_.pid != pid || last_usage_.node != node) {
    last_usage_.usage = &record_usage_[{minute, node, pid}];
    last_usage_.minute = minute;
    last_usage_.pid = pid;
    last_usage_.node = node;
  }
  return *last_usage_.usage;
}

void UsageLedger::on_records(const CommState& comm, int32_t rank, uint32_t lane,
                             std::span<const proto::CallRecord> records) {
  auto member = comm.members.find(rank);
  if (member == comm.members.end()) return;
  const std::string& node = member->second.node;
  const uint32_t pid = member->second.pid;
  for (const auto& record : records) {
    Usage& usage = record_usage(minute_of(record.issue_ns), node, pid);
    usage.collectives += 1;
    usage.bytes += static_cast<double>(proto::record_bytes(record));
    if (record.return_ns > record.issue_ns)
      usage.collective_s += static_cast<double>(record.return_ns - record.issue_ns) / 1e9;
  }
}

void UsageLedger::on_complete(const CollectiveComplete& done) {
  const CommState& comm = done.comm;
  const std::vector<uint64_t>& issue = done.issue;
  const int32_t n = static_cast<int32_t>(issue.size());
  if (n <= 1) return;
  CommTrack& track = comms_[comm.hash];
  // Made when a collective completes: every rank sent a record for it.
  if (track.blamed_until.size() != static_cast<size_t>(n)) track.blamed_until.assign(n, 0);
  int32_t last = static_cast<int32_t>(std::max_element(issue.begin(), issue.end()) - issue.begin());
  int64_t max_others = 0;
  for (int32_t r = 0; r < n; ++r)
    if (r != last) max_others = std::max<int64_t>(max_others, static_cast<int64_t>(issue[r]));
  int64_t t_last = static_cast<int64_t>(issue[last]);
  // Back-to-back collectives wait for the same late arrival: counted once.
  int64_t from = std::max(max_others, track.blamed_until[last]);
  track.blamed_until[last] = std::max(track.blamed_until[last], t_last);
  if (t_last <= from) return;
  uint64_t delay = static_cast<uint64_t>(t_last - from);
  auto late = comm.members.find(last);
  if (late == comm.members.end()) return;
  // Never waste by less than the clock can tell apart.
  uint64_t uncertainty = 0;
  if (const NodeState* node = model_.node(late->second.node))
    uncertainty = node->clock.uncertainty_ns() > 1'000'000'000ull ? 0 : node->clock.uncertainty_ns();
  if (delay < options_.min_wait_ns + 2 * uncertainty) return;
  PendingWait& wait = pending_waits_[{comm.hash, last, minute_of(static_cast<uint64_t>(from))}];
  if (wait.seconds == 0) wait.first_ns = static_cast<uint64_t>(from);
  wait.seconds += static_cast<double>(delay) / 1e9;
}

void UsageLedger::fold_records() {
  Parties parties(model_);
  for (const auto& [key, usage] : record_usage_) {
    const auto& [minute_s, node, pid] = key;
    const auto& party = parties[parties.of(node, pid)];
    add_usage_at(key_prefix(Level::minute, minute_s, 'u') + party.key, party.node, party.identity, usage);
  }
  record_usage_.clear();
  last_usage_ = LastUsage{};
  // A communicator's victims, one per party with its GPUs and members: a
  // node's ranks of one job share theirs. Made once per communicator and
  // fold; each of its waits (one per late rank and minute) leaves out the
  // late rank.
  struct Victim {
    size_t party = 0;
    double gpus = 0;
    int32_t members = 0;
  };
  std::vector<Victim> victims;
  std::unordered_map<size_t, size_t> victim_of_party;
  uint64_t victims_of = 0;
  bool victims_made = false;
  // The causes of this fold (their victim fields unset) by their part of a
  // row's key, and the GPU-seconds owed by (minute, victim party, cause):
  // the waits of many late ranks and communicators of one job on the same
  // parties add up before their rows are looked up.
  std::vector<WasteRow> causes;
  std::vector<std::string> cause_keys;
  std::unordered_map<std::string, size_t> cause_index;
  std::map<std::tuple<uint64_t, size_t, size_t>, double> owed;
  for (const auto& [key, wait] : pending_waits_) {
    const auto& [hash, last, minute_s] = key;
    auto comm = model_.comms.find(hash);
    if (comm == model_.comms.end()) continue;
    auto late = comm->second.members.find(last);
    if (late == comm->second.members.end()) continue;
    const ProcessInfo* late_process = nullptr;
    const size_t late_party = parties.of(late->second.node, late->second.pid, &late_process);
    WasteRow cause;
    std::string cause_part;
    if (auto neighbour = neighbour_cause(late->second.node, late_process, late->second.pid)) {
      cause = std::move(*neighbour);
      cause_part = cause_key(cause);
    } else {
      cause.cause_node = late->second.node;
      cause.cause = parties[late_party].identity;
      cause.reason = WasteReason::straggler;
      cause.cause_detail = "rank " + std::to_string(last) + " (pid " + std::to_string(late->second.pid) + ")";
      cause_part = parties[late_party].key;
      cause_part.push_back(static_cast<char>(cause.reason));
    }
    auto [at, fresh] = cause_index.try_emplace(std::move(cause_part), causes.size());
    if (fresh) {
      causes.push_back(std::move(cause));
      cause_keys.push_back(at->first);
    } else if (!cause.cause_detail.empty()) {
      causes[at->second].cause_detail = std::move(cause.cause_detail);  // the last one told, as add_waste keeps it
    }
    const size_t cause_at = at->second;
    if (!victims_made || victims_of != hash) {
      victims.clear();
      victim_of_party.clear();
      for (const auto& [r, m] : comm->second.members) {
        const ProcessInfo* p = nullptr;
        const size_t party = parties.of(m.node, m.pid, &p);
        auto [v, added] = victim_of_party.try_emplace(party, victims.size());
        if (added) victims.push_back(Victim{party, 0, 0});
        victims[v->second].gpus += gpus_of(p);
        ++victims[v->second].members;
      }
      victims_of = hash;
      victims_made = true;
    }
    const double late_gpus = gpus_of(late_process);
    const uint64_t minute = minute_of(wait.first_ns);
    for (const Victim& v : victims) {
      const bool holds_late = v.party == late_party;
      if (v.members - (holds_late ? 1 : 0) == 0) continue;
      owed[{minute, v.party, cause_at}] += wait.seconds * (holds_late ? v.gpus - late_gpus : v.gpus);
    }
  }
  pending_waits_.clear();
  // Each (minute, victim party) names its causes up to a bound; the rest
  // of its waiting goes to one spread row per reason. A job's healthy
  // jitter makes every rank late now and then: at thousands of ranks,
  // naming each would write a row per (victim node, late node) every
  // minute, tens of thousands a minute for one job, kept as long as the
  // database. The most waited on are named first; a cause named earlier
  // in the minute stays named.
  std::vector<std::pair<double, size_t>> group;  // (GPU-seconds, cause) of one (minute, victim)
  std::set<std::string_view> named;
  for (auto it = owed.begin(); it != owed.end();) {
    const uint64_t minute_s = std::get<0>(it->first);
    const size_t victim = std::get<1>(it->first);
    group.clear();
    for (; it != owed.end() && std::get<0>(it->first) == minute_s && std::get<1>(it->first) == victim; ++it)
      group.emplace_back(it->second, std::get<2>(it->first));
    std::sort(group.begin(), group.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    const auto& party = parties[victim];
    const std::string prefix = key_prefix(Level::minute, minute_s, 'w') + party.key;
    named.clear();
    for (auto edge = edges_.lower_bound(prefix); edge != edges_.end() && edge->first.starts_with(prefix); ++edge) {
      const std::string_view cause_part = std::string_view(edge->first).substr(prefix.size());
      // Hangs are named whatever their number (one row per hang finding).
      if (!is_spread_cause(cause_part) && edge->second.row.reason != WasteReason::hang) named.insert(cause_part);
    }
    std::map<WasteReason, std::pair<WasteRow, double>> spread;
    for (const auto& [gpu_s, cause_at] : group) {
      const std::string& cause_part = cause_keys[cause_at];
      if (named.count(cause_part) || named.size() < options_.named_causes) {
        add_waste_at(prefix + cause_part, party.node, party.identity, causes[cause_at], gpu_s);
        named.insert(cause_part);  // cause_keys outlive this fold's use of `named`
        continue;
      }
      auto [at, fresh] = spread.try_emplace(causes[cause_at].reason, causes[cause_at], 0.0);
      if (!fresh) at->second.first.cause = common_fields(at->second.first.cause, causes[cause_at].cause);
      at->second.second += gpu_s;
    }
    for (auto& [reason, row_and_s] : spread) {
      WasteRow& row = row_and_s.first;
      row.cause_node = kSpreadCauseNode;
      row.cause_detail = "ranks beyond the " + std::to_string(options_.named_causes) + " most waited on this minute";
      add_waste_at(prefix + spread_cause_key(reason), party.node, party.identity, row, row_and_s.second, true);
    }
  }
}

std::optional<WasteRow> UsageLedger::neighbour_cause(const std::string& node_name, const ProcessInfo* late,
                                                     uint32_t late_pid) const {
  const NodeState* node = model_.node(node_name);
  if (!node) return std::nullopt;
  // Only when the late rank itself waited for a CPU: a busy neighbour of a
  // rank late for another reason is not the cause.
  auto health = node->health.find(late_pid);
  if (health == node->health.end()) return std::nullopt;
  CpuShares shares = health->second.shares(options_.neighbour_window_ns);
  if (!shares.known || shares.waiting < options_.neighbour_runqueue_share) return std::nullopt;
  // The job's own cgroups on the node are not neighbours.
  std::set<uint64_t> own;
  if (late) own.insert(late->cgroup_id);
  for (const auto& [pid, h] : node->health)
    if (const ProcessInfo* other = model_.process(node_name, pid))
      if (late && other->job == late->job) own.insert(other->cgroup_id);
  // Tenants first: a busy cgroup that is a Slurm job, a pod or runs traced
  // processes is billed as the cause before a busier system or session one.
  std::set<uint64_t> traced;
  for (const auto& [pid, h] : node->health)
    if (const ProcessInfo* p = model_.process(node_name, pid)) traced.insert(p->cgroup_id);
  double best = 0;
  bool best_tenant = false;
  uint64_t best_id = 0;
  const CgroupUsage* best_usage = nullptr;
  for (const auto& [id, usage] : node->cgroups) {
    if (own.count(id)) continue;
    auto rate = usage.rate(node->last_monotonic_ns, options_.neighbour_window_ns);
    if (!rate.known || rate.cpus < options_.neighbour_cpus) continue;
    Identity from_path = Identity::of_cgroup_path(usage.path);
    bool tenant = traced.count(id) || !from_path.job.empty() || !from_path.pod_uid.empty();
    if (std::tie(tenant, rate.cpus) <= std::tie(best_tenant, best)) continue;
    best = rate.cpus;
    best_tenant = tenant;
    best_id = id;
    best_usage = &usage;
  }
  if (!best_usage) return std::nullopt;
  WasteRow row;
  row.cause_node = node_name;
  row.reason = WasteReason::cpu_neighbour;
  // A traced process in that cgroup says who it is; else the path does.
  const ProcessInfo* owner = nullptr;
  for (const auto& [pid, h] : node->health)
    if (const ProcessInfo* p = model_.process(node_name, pid); p && p->cgroup_id == best_id) owner = p;
  row.cause = owner ? Identity::of(*owner) : Identity::of_cgroup_path(best_usage->path);
  if (row.cause.cgroup_path.empty()) row.cause.cgroup_path = best_usage->path;
  char cpus[32];
  snprintf(cpus, sizeof(cpus), "%.1f", best);
  row.cause_detail =
      "cgroup " + (best_usage->path.empty() ? std::to_string(best_id) : best_usage->path) + " (" + cpus + " CPUs)";
  return row;
}

void UsageLedger::on_waits(const std::string& node, uint32_t pid, std::span<const HostWait> waits) {
  // Added up by (minute, process) as records are; tick() finds whose they are.
  for (const HostWait& wait : waits)
    if (wait.end_ns > wait.start_ns)
      for_each_minute(wait.start_ns, wait.end_ns, [&](uint64_t at, uint64_t end) {
        record_usage(minute_of(at), node, pid).wait_s += static_cast<double>(end - at) / 1e9;
      });
}

void UsageLedger::tick(uint64_t now_ns, const std::vector<const Finding*>& open) {
  fold_records();
  // What is left open of communicators every member ended never completes.
  for (auto it = comms_.begin(); it != comms_.end();) {
    if (model_.live(it->first)) {
      ++it;
      continue;
    }
    it = comms_.erase(it);
  }
  take_samples(now_ns);
  hang_waste(now_ns, open);
}

void UsageLedger::take_samples(uint64_t now_ns) {
  for (const auto& [name, node] : model_.nodes) {
    for (const auto& [pid, health] : node.health) {
      const HealthSample* sample = health.last();
      if (!sample) continue;
      take_sample(name, node, pid, *sample);
    }
  }
  // Forget processes that left the collector's health table; each for a
  // while only, in case its exit is reported after.
  for (auto it = processes_.begin(); it != processes_.end();) {
    const NodeState* node = model_.node(it->first.first);
    bool known = node && node->health.count(it->first.second);
    if (!known) {
      // Its stored row goes with it (a restarted collector would go on
      // from it), once it is no longer kept here.
      if (it->second.seen)
        left_[it->first] = {it->second, now_ns};
      else
        tracks_gone_.insert(it->first);
    }
    it = known ? std::next(it) : processes_.erase(it);
  }
  for (auto it = left_.begin(); it != left_.end();) {
    const bool expired = now_ns - std::min(now_ns, it->second.second) > kLeftKeptNs;
    if (expired) tracks_gone_.insert(it->first);
    it = expired ? left_.erase(it) : std::next(it);
  }
  if (left_.size() > kLeftKept) {  // the oldest go
    std::vector<std::pair<uint64_t, std::pair<std::string, uint32_t>>> by_age;
    for (const auto& [key, left] : left_) by_age.emplace_back(left.second, key);
    const auto excess = static_cast<std::ptrdiff_t>(left_.size() - kLeftKept);
    std::nth_element(by_age.begin(), by_age.begin() + excess, by_age.end());
    for (auto it = by_age.begin(); it != by_age.begin() + excess; ++it) {
      tracks_gone_.insert(it->second);
      left_.erase(it->second);
    }
  }
  // The previous run's processes not heard of since: they ended while it was away.
  if (!restored_.empty() && restored_at_ns_ == 0) restored_at_ns_ = now_ns;
  if (!restored_.empty() && now_ns - restored_at_ns_ > kRestoredGraceNs) {
    for (const auto& [key, track] : restored_) tracks_gone_.insert(key);
    restored_.clear();
  }
}

void UsageLedger::take_sample(const std::string& name, const NodeState& node, uint32_t pid,
                              const HealthSample& sample) {
  ProcessTrack& track = processes_[{name, pid}];
  const ProcessInfo* process = model_.process(name, pid);
  // Counted by the previous run up to its last flush, or before its
  // health entry left the collector's table (evicted over its bound, its
  // exit reported after): go on from there (the same process: its start
  // time says a pid was not reused), never from zero again.
  if (!track.seen) {
    auto go_on = [&](const ProcessTrack& old) {
      if (!process || process->start_time == 0 || process->start_time == old.start_time) {
        track = old;
        track.dirty = true;
      }
    };
    if (auto old = restored_.find({name, pid}); old != restored_.end()) {
      go_on(old->second);
      restored_.erase(old);
    } else if (auto left = left_.find({name, pid}); left != left_.end()) {
      go_on(left->second.first);
      left_.erase(left);
    }
  }
  // A pid reused: the collector's entry for it (its health, its identity)
  // now speaks of another process, whose first live sample starts a track
  // of its own (the old one's was finished with its exit).
  if (track.seen && sample.alive && process && process->start_time != 0 && track.start_time != 0 &&
      process->start_time != track.start_time && sample.sample_ns != track.last_sample_ns)
    track = ProcessTrack{};
  if (track.done || (track.seen && sample.sample_ns == track.last_sample_ns)) return;
  // Alive after it was found gone: another process on its pid, not yet
  // named (its identity comes with its agent's next batch; above).
  if (track.seen && !track.alive && sample.alive) return;
  // Heartbeats can come before the batch that says who the process is:
  // its first sample waits for that (the counters are cumulative, and
  // the time counts from its start) for a while, then counts as unknown.
  if (!process && !track.seen) {
    if (track.deferred_since == 0) track.deferred_since = sample.sample_ns;
    if (sample.sample_ns - track.deferred_since < kIdentityWaitNs && sample.alive) return;
  }
  Identity identity = process ? Identity::of(*process) : Identity{};
  uint64_t cpu = sample.host_known ? sample.process_cpu_ns : sample.cpu_ns;
  uint64_t off = sample.host_known ? sample.off_cpu_ns : 0;
  uint64_t at = node.clock.to_cluster(sample.sample_ns);
  double gpus = gpus_of(process);
  Usage usage;
  uint64_t from = at;
  // CPU time as the kernel accounts it (/proc/PID/stat, all threads)
  // while the process is there to read; the BPF counters (wall time on a
  // CPU, which also holds interrupts and, in a VM, stolen time) for the
  // last stretch up to its exit, which only they saw.
  uint64_t stat_cpu = sample.stat_cpu_ns;
  if (!track.seen) {
    // From its start when the agent saw it start; CPU counters are cumulative from zero.
    if (process && process->start_time > 0) {
      // The agent's word: a start time past 2^64 ns (found by fuzz_agent_message) is no start time.
      double start_ns = static_cast<double>(process->start_time) / clock_ticks_per_s() * 1e9;
      uint64_t start_node = start_ns < 1.8e19 ? static_cast<uint64_t>(start_ns) : UINT64_MAX;
      if (start_node < sample.sample_ns && sample.sample_ns - start_node < kMaxStartGapNs)
        from = node.clock.to_cluster(start_node);
    }
    usage.cpu_s = static_cast<double>(stat_cpu ? stat_cpu : cpu) / 1e9;
    usage.off_cpu_s = static_cast<double>(off) / 1e9;
    if (sample.alive) usage.gpu_s = static_cast<double>(at - std::min(at, from)) / 1e9 * gpus;
    track.seen = true;
  } else {
    from = track.last_cluster_ns;
    if (stat_cpu && track.stat_cpu_ns)
      usage.cpu_s = static_cast<double>(stat_cpu - std::min(stat_cpu, track.stat_cpu_ns)) / 1e9;
    else if (sample.alive || track.host_at_last)
      usage.cpu_s = static_cast<double>(cpu - std::min(cpu, track.cpu_ns)) / 1e9;
    // else its exit's counters after a last sample without them (a
    // zombie's, whose /proc counters already ran to its exit): the BPF
    // counters' baseline is older than what the kernel's counted, nothing more.
    usage.off_cpu_s = static_cast<double>(off - std::min(off, track.off_cpu_ns)) / 1e9;
    // It exited somewhere between the last sample and this one: half way, on average.
    uint64_t end = sample.alive ? at : from + (at - std::min(at, from)) / 2;
    if (track.alive) usage.gpu_s = static_cast<double>(end - std::min(end, from)) / 1e9 * gpus;
  }
  add_usage_span(from, std::max(from, at), name, identity, usage);
  // Found gone without its counters at exit, where its samples had them:
  // its exit event was not read yet when the agent looked, and a later
  // heartbeat carries them (the CPU of its last interval). Its GPU time
  // ends here.
  const bool exit_counters_to_come = !sample.alive && !sample.host_known && track.host_at_last;
  track.alive = sample.alive;
  track.done = !sample.alive && !exit_counters_to_come;
  track.dirty = true;
  if (!exit_counters_to_come) track.host_at_last = sample.host_known;
  if (process && track.start_time == 0) track.start_time = process->start_time;
  track.last_sample_ns = sample.sample_ns;
  track.last_cluster_ns = at;
  track.cpu_ns = std::max(track.cpu_ns, cpu);
  track.stat_cpu_ns = std::max(track.stat_cpu_ns, stat_cpu);
  track.off_cpu_ns = std::max(track.off_cpu_ns, off);
}

void UsageLedger::hang_waste(uint64_t now_ns, const std::vector<const Finding*>& open_findings) {
  std::set<std::string> open;
  for (const Finding* f : open_findings) {
    if (f->kind != FindingKind::hang) continue;
    auto comm = model_.comms.find(f->comm);
    if (comm == model_.comms.end()) continue;
    std::string key = f->key();
    open.insert(key);
    auto [it, first] = hang_counted_ns_.try_emplace(key, 0);
    // The ranks waited from (about) the hang timeout before it was found.
    uint64_t from = first ? f->opened_ns - std::min(f->opened_ns, options_.hang_timeout_ns) : it->second;
    it->second = now_ns;
    hangs_dirty_.insert(key);
    if (now_ns <= from) continue;
    double seconds = static_cast<double>(now_ns - from) / 1e9;
    std::set<int32_t> culprits(f->ranks.begin(), f->ranks.end());
    bool everyone = culprits.size() >= comm->second.members.size();
    // The cause: the missing ranks (the first stands for them), or the job
    // itself when every rank is inside (network or GPU).
    WasteRow cause;
    cause.reason = WasteReason::hang;
    int32_t first_culprit = f->ranks.empty() ? -1 : f->ranks.front();
    auto culprit = comm->second.members.find(first_culprit);
    if (culprit != comm->second.members.end()) {
      const ProcessInfo* p = model_.process(culprit->second.node, culprit->second.pid);
      cause.cause_node = culprit->second.node;
      cause.cause = p ? Identity::of(*p) : Identity{};
      if (cause.cause.job.empty()) cause.cause.job = comm->second.job;
    }
    cause.cause_detail = std::string(everyone ? "hang with every rank inside" : "missing rank(s)") + " in finding #" +
                         std::to_string(f->id);
    for (const auto& [r, m] : comm->second.members) {
      if (!everyone && culprits.count(r)) continue;
      const ProcessInfo* p = model_.process(m.node, m.pid);
      WasteRow row = cause;
      row.node = m.node;
      row.identity = p ? Identity::of(*p) : Identity{};
      if (row.identity.job.empty()) row.identity.job = comm->second.job;
      row.gpu_s = seconds * gpus_of(p);
      add_waste(from, row);
    }
  }
  for (auto it = hang_counted_ns_.begin(); it != hang_counted_ns_.end();) {
    if (open.count(it->first)) {
      ++it;
      continue;
    }
    hangs_gone_.insert(it->first);
    hangs_dirty_.erase(it->first);
    it = hang_counted_ns_.erase(it);
  }
}

Result<std::optional<std::string>> UsageLedger::stored_usage(const std::string& key) const {
  if (auto it = unsettled_.find(key); it != unsettled_.end()) return it->second;
  return rows_.get_usage(key);
}

void UsageLedger::put(WriteSet& writes, const std::string& key, std::string value) {
  writes.put_usage(key, value);
  unsettled_[key] = std::move(value);
}

void UsageLedger::erase(WriteSet& writes, const std::string& key) {
  writes.delete_usage(key);
  unsettled_[key] = std::nullopt;
}

Result<void> UsageLedger::stage(WriteSet& writes, uint64_t now_ns, bool final) {
  auto wrote = persist(writes, now_ns, final);
  if (!wrote) return wrote.error();
  return {};
}

void UsageLedger::committed() {
  unsettled_.clear();
}

Result<bool> UsageLedger::persist(WriteSet& writes, uint64_t now_ns, bool force) {
  // (A clock read earlier than the last flush is not a reason to flush.)
  if (!force && now_ns < last_flush_ns_ + options_.flush_interval_ns) return false;
  fold_records();
  last_flush_ns_ = now_ns;
  // Minute rows are written whole; their change since the last flush goes
  // into the hour and day rows (read, added to, written once per flush).
  std::map<std::string, UsageRow> rollups;
  std::map<std::string, WasteRow> edge_rollups;
  bool wrote = false;
  for (auto& [key, minute] : minutes_) {
    if (!minute.dirty) continue;
    put(writes, key, encode_usage_row(minute.row));
    Usage delta = minute.row.usage.minus(minute.flushed);
    minute.flushed = minute.row.usage;
    minute.dirty = false;
    wrote = true;
    uint64_t minute_s = get_be(key.data() + 1, 8);
    for (Level level : {Level::hour, Level::day}) {
      auto [it, created] = rollups.try_emplace(rekeyed(key, level, bucket_start(level, minute_s)));
      if (created) {
        it->second.node = minute.row.node;
        it->second.identity = minute.row.identity;
      }
      it->second.usage.add(delta);
    }
  }
  for (auto& [key, edge] : edges_) {
    if (!edge.dirty) continue;
    put(writes, key, encode_waste_row(edge.row));
    double delta = edge.row.gpu_s - edge.flushed;
    edge.flushed = edge.row.gpu_s;
    edge.dirty = false;
    wrote = true;
    uint64_t minute_s = get_be(key.data() + 1, 8);
    for (Level level : {Level::hour, Level::day}) {
      auto [it, created] = edge_rollups.try_emplace(rekeyed(key, level, bucket_start(level, minute_s)), edge.row);
      if (created) it->second.gpu_s = 0;
      else if (is_spread_row(key))
        it->second.cause = common_fields(it->second.cause, edge.row.cause);
      it->second.gpu_s += delta;
    }
  }
  if (auto added = write_rollups(writes, rollups, edge_rollups); !added) return added.error();
  // How far the counting got, in the same commit as what it counted.
  write_progress(writes);
  // Minutes more than two minutes old are done (late data reloads them).
  uint64_t keep_from = minute_of(now_ns) - std::min<uint64_t>(minute_of(now_ns), 120);
  for (auto it = minutes_.begin(); it != minutes_.end();)
    it = !it->second.dirty && get_be(it->first.data() + 1, 8) < keep_from ? minutes_.erase(it) : std::next(it);
  for (auto it = edges_.begin(); it != edges_.end();)
    it = !it->second.dirty && get_be(it->first.data() + 1, 8) < keep_from ? edges_.erase(it) : std::next(it);
  return wrote;
}

Result<void> UsageLedger::write_rollups(WriteSet& writes, std::map<std::string, UsageRow>& rollups,
                                        std::map<std::string, WasteRow>& edge_rollups) {
  for (auto& [key, row] : rollups) {
    auto stored = stored_usage(key);
    if (!stored) return stored.error();
    if (*stored) {
      auto entry = decode_ledger_entry(key, **stored);
      if (!entry) return entry.error();
      row.usage.add(entry->usage.usage);
    }
    put(writes, key, encode_usage_row(row));
  }
  for (auto& [key, row] : edge_rollups) {
    auto stored = stored_usage(key);
    if (!stored) return stored.error();
    if (*stored) {
      auto entry = decode_ledger_entry(key, **stored);
      if (!entry) return entry.error();
      row.gpu_s += entry->edge.gpu_s;
      if (is_spread_row(key)) row.cause = common_fields(row.cause, entry->edge.cause);
    }
    put(writes, key, encode_waste_row(row));
  }
  return {};
}

void UsageLedger::write_progress(WriteSet& writes) {
  for (auto& [key, track] : processes_) {
    if (!track.dirty || !track.seen) continue;
    put(writes, track_key(key.first, key.second), encode_track(track));
    track.dirty = false;
  }
  for (auto& [key, left] : left_) {  // kept a while, and across a restart
    if (!left.first.dirty) continue;
    put(writes, track_key(key.first, key.second), encode_track(left.first));
    left.first.dirty = false;
  }
  for (const auto& key : tracks_gone_)
    if (!processes_.count(key)) erase(writes, track_key(key.first, key.second));
  tracks_gone_.clear();
  for (const auto& key : hangs_dirty_) {
    std::string value;
    put_be(value, hang_counted_ns_[key], 8);
    put(writes, hang_key(key), value);
  }
  for (const auto& key : hangs_gone_) erase(writes, hang_key(key));
  hangs_dirty_.clear();
  hangs_gone_.clear();
}

}  // namespace rankscope::collector
