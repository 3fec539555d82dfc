// rankscope-bench-report: how long a 30-day usage report over a 1,000-node
// fleet takes, from a usage ledger in a real RocksDB (the collector's store),
// filled with the rows the ledger keeps: day and hour rollups for every node
// and identity, and minute rows for the report's ragged edges.
// With --template, the rows are those a real collector wrote while
// rankscope-sim's fleet ran against it (scripts/bench-report.sh does that
// first): each node's identities and per-minute figures, and the waste
// edges, repeated over the 30 days with one job turnover a day. Without it,
// a synthetic fleet of --nodes nodes with --jobs-per-node jobs.
// The baseline is the same report read without the day rollups (every hour
// row), measured in the same run. docs/benchmarks.md, scripts/bench-report.sh.
#include <unistd.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "collector/store/timeline_store.h"
#include "collector/usage/ledger.h"
#include "collector/usage/report.h"

namespace po = boost::program_options;
using namespace rankscope::collector;

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A collector's ledger made by rankscope-sim: per (node, identity) and per
// waste edge, the figures of an average full minute.
struct Template {
  std::vector<UsageRow> rows;
  std::vector<WasteRow> edges;
  size_t nodes = 0;
  uint64_t full_minutes = 0;
};

std::optional<Template> read_template(const std::string& path) {
  auto store = TimelineStore::open(path);
  if (!store) {
    std::cerr << "--template " << path << ": " << store.error().message << "\n";
    return std::nullopt;
  }
  std::set<uint64_t> buckets;
  std::vector<LedgerEntry> entries;
  auto scanned = (*store)->scan_usage("m", "n", [&](std::string_view key, std::string_view value) {
    auto entry = decode_ledger_entry(key, value);
    if (entry) {
      buckets.insert(entry->bucket_s);
      entries.push_back(std::move(*entry));
    }
    return true;
  });
  if (!scanned) {
    std::cerr << "--template " << path << ": " << scanned.error().message << "\n";
    return std::nullopt;
  }
  // The first and last minutes are partial (the run started and stopped in them).
  if (buckets.size() < 3) {
    std::cerr << "--template " << path << " holds " << buckets.size()
              << " minute(s) of usage: run rankscope-sim against its collector for 3 minutes or more\n";
    return std::nullopt;
  }
  uint64_t first = *buckets.begin(), last = *buckets.rbegin();
  Template out;
  out.full_minutes = buckets.size() - 2;
  std::map<std::pair<std::string, Identity>, UsageRow> rows;
  std::map<std::string, WasteRow> edges;
  std::set<std::string> nodes;
  for (const auto& e : entries) {
    if (e.bucket_s == first || e.bucket_s == last) continue;
    if (!e.waste) {
      UsageRow& row = rows[{e.usage.node, e.usage.identity}];
      row.node = e.usage.node;
      row.identity = e.usage.identity;
      row.usage.add(e.usage.usage);
      nodes.insert(e.usage.node);
    } else {
      std::string key = waste_key(Level::minute, 0, e.edge);
      auto [it, created] = edges.try_emplace(key, e.edge);
      if (!created) it->second.gpu_s += e.edge.gpu_s;
    }
  }
  double per_minute = 1.0 / static_cast<double>(out.full_minutes);
  for (auto& [key, row] : rows) {
    Usage avg;
    avg.add(row.usage);
    for (double* v : {&avg.gpu_s, &avg.cpu_s, &avg.off_cpu_s, &avg.collective_s, &avg.wait_s, &avg.bytes, &avg.collectives})
      *v *= per_minute;
    row.usage = avg;
    out.rows.push_back(row);
  }
  for (auto& [key, edge] : edges) {
    edge.gpu_s *= per_minute;
    out.edges.push_back(edge);
  }
  out.nodes = nodes.size();
  return out;
}

// A template identity on day `day`: the same tenant, its job renamed (jobs turn over daily).
Identity on_day(Identity id, uint32_t day) {
  if (!id.job.empty()) id.job += "-d" + std::to_string(day);
  return id;
}

Usage times(Usage u, double factor) {
  for (double* v : {&u.gpu_s, &u.cpu_s, &u.off_cpu_s, &u.collective_s, &u.wait_s, &u.bytes, &u.collectives}) *v *= factor;
  return u;
}

// The identities on one node on one day: `slots` jobs, each spread over 8 nodes.
Identity identity_of(uint64_t day, uint32_t node, uint32_t slot) {
  Identity id;
  uint64_t job = 100000 + (day * 1000 + node / 8) * 4 + slot;
  id.job = std::to_string(job);
  id.step = "0";
  id.account = "acct-" + std::to_string(job % 40);
  id.user = "user-" + std::to_string(job % 200);
  id.cgroup_path = "/slurm/uid_" + std::to_string(1000 + job % 200) + "/job_" + id.job + "/step_0";
  return id;
}
}  // namespace

int main(int argc, char** argv) {
  std::string db, template_db;
  uint32_t nodes = 1000, days = 30, slots = 2, runs = 3;
  po::options_description desc("rankscope-bench-report: time a 30-day usage report over a simulated fleet's ledger");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("db", po::value(&db), "RocksDB folder to fill (default: a new folder under /tmp, removed at the end)")
    ("template", po::value(&template_db), "a collector's database that rankscope-sim's fleet filled: its nodes, identities and per-minute figures fill the 30 days (--nodes and --jobs-per-node are then ignored)")
    ("nodes", po::value(&nodes)->default_value(nodes), "nodes in the fleet")
    ("days", po::value(&days)->default_value(days), "days of usage")
    ("jobs-per-node", po::value(&slots)->default_value(slots), "identities (jobs) per node and day")
    ("runs", po::value(&runs)->default_value(runs), "timed runs of each report (the best is reported)");
  // clang-format on
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "rankscope-bench-report: " << e.what() << "\n" << desc;
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  std::optional<Template> from_sim;
  if (!template_db.empty()) {
    from_sim = read_template(template_db);
    if (!from_sim) return 1;
    std::printf("template %s: %zu nodes, %zu (node, identity) rows and %zu waste edges per minute, averaged over %llu "
                "full minutes of rankscope-sim through the collector\n",
                template_db.c_str(), from_sim->nodes, from_sim->rows.size(), from_sim->edges.size(),
                (unsigned long long)from_sim->full_minutes);
  }
  bool temporary = db.empty();
  if (temporary) db = "/tmp/rankscope-bench-report-" + std::to_string(getpid());
  auto store = TimelineStore::open(db);
  if (!store) {
    std::cerr << store.error().message << "\n";
    return 1;
  }

  // 30 days from a UTC midnight; the report starts 30 minutes into the first
  // day and ends 20 minutes before the last day does, as "the last 30 days" would.
  const uint64_t t0 = 1'793'491'200;  // 2026-11-01 00:00:00 UTC
  const uint64_t end = t0 + uint64_t{days} * 86400;
  auto fill_start = std::chrono::steady_clock::now();
  uint64_t rows = 0;
  WriteSet writes = (*store)->writes();
  auto put = [&](const std::string& key, std::string value) -> bool {
    writes.put_usage(key, std::move(value));
    if (++rows % 20000 == 0) {
      if (auto r = (*store)->commit(writes); !r) {
        std::cerr << r.error().message << "\n";
        return false;
      }
    }
    return true;
  };
  double gpu_s_per_minute = 0;  // the fleet's, for the expected total
  if (from_sim) {
    for (const auto& row : from_sim->rows) gpu_s_per_minute += row.usage.gpu_s;
    for (uint32_t day = 0; day < days; ++day) {
      uint64_t day_s = t0 + uint64_t{day} * 86400;
      for (const auto& tmpl : from_sim->rows) {
        UsageRow row{tmpl.node, on_day(tmpl.identity, day), times(tmpl.usage, 1440)};
        if (!put(usage_key(Level::day, day_s, row.node, row.identity), encode_usage_row(row))) return 1;
        row.usage = times(tmpl.usage, 60);
        for (int h = 0; h < 24; ++h)
          if (!put(usage_key(Level::hour, day_s + h * 3600, row.node, row.identity), encode_usage_row(row))) return 1;
        row.usage = tmpl.usage;
        for (uint64_t hour_s : {t0, end - 3600}) {
          if (hour_s < day_s || hour_s >= day_s + 86400) continue;
          for (int m = 0; m < 60; ++m)
            if (!put(usage_key(Level::minute, hour_s + m * 60, row.node, row.identity), encode_usage_row(row))) return 1;
        }
      }
      for (const auto& tmpl : from_sim->edges) {
        WasteRow w = tmpl;
        w.identity = on_day(w.identity, day);
        w.cause = on_day(w.cause, day);
        w.gpu_s = tmpl.gpu_s * 1440;
        if (!put(waste_key(Level::day, day_s, w), encode_waste_row(w))) return 1;
        w.gpu_s = tmpl.gpu_s * 60;
        for (int h = 0; h < 24; ++h)
          if (!put(waste_key(Level::hour, day_s + h * 3600, w), encode_waste_row(w))) return 1;
        w.gpu_s = tmpl.gpu_s;
        for (uint64_t hour_s : {t0, end - 3600}) {
          if (hour_s < day_s || hour_s >= day_s + 86400) continue;
          for (int m = 0; m < 60; ++m)
            if (!put(waste_key(Level::minute, hour_s + m * 60, w), encode_waste_row(w))) return 1;
        }
      }
    }
  }
  for (uint32_t day = 0; day < days && !from_sim; ++day) {
    for (uint32_t node = 0; node < nodes; ++node) {
      std::string name = "gpu-" + std::to_string(node);
      for (uint32_t slot = 0; slot < slots; ++slot) {
        UsageRow row{name, identity_of(day, node, slot), {}};
        Usage hour;
        hour.gpu_s = 4 * 3600.0;  // 4 GPUs each
        hour.cpu_s = 4 * 3600.0 * 1.5;
        hour.off_cpu_s = 600;
        hour.collective_s = 300;
        hour.wait_s = 200;
        hour.bytes = 4e12;
        hour.collectives = 36000;
        Usage minute = hour;
        for (double* v : {&minute.gpu_s, &minute.cpu_s, &minute.off_cpu_s, &minute.collective_s, &minute.wait_s,
                          &minute.bytes, &minute.collectives})
          *v /= 60;
        UsageRow day_row = row;
        for (int i = 0; i < 24; ++i) day_row.usage.add(hour);
        uint64_t day_s = t0 + uint64_t{day} * 86400;
        if (!put(usage_key(Level::day, day_s, name, row.identity), encode_usage_row(day_row))) return 1;
        row.usage = hour;
        for (int h = 0; h < 24; ++h)
          if (!put(usage_key(Level::hour, day_s + h * 3600, name, row.identity), encode_usage_row(row))) return 1;
        // Minute rows of the first and the last hour (the report's edges).
        row.usage = minute;
        for (uint64_t hour_s : {t0, end - 3600}) {
          if (hour_s < day_s || hour_s >= day_s + 86400) continue;
          for (int m = 0; m < 60; ++m)
            if (!put(usage_key(Level::minute, hour_s + m * 60, name, row.identity), encode_usage_row(row))) return 1;
        }
        // One node in 20 lost GPU time waiting on a neighbour that day.
        if ((node + day) % 20 == 0 && slot == 0) {
          WasteRow w;
          w.node = name;
          w.identity = row.identity;
          w.cause_node = name;
          w.cause = identity_of(day, node, 1);
          w.reason = WasteReason::cpu_neighbour;
          w.cause_detail = "cgroup " + w.cause.cgroup_path + " (3.0 CPUs)";
          w.gpu_s = 1800;
          if (!put(waste_key(Level::day, day_s, w), encode_waste_row(w))) return 1;
          w.gpu_s = 1800.0 / 24;
          for (int h = 0; h < 24; ++h)
            if (!put(waste_key(Level::hour, day_s + h * 3600, w), encode_waste_row(w))) return 1;
        }
      }
    }
  }
  if (auto r = (*store)->commit(writes); !r) {
    std::cerr << r.error().message << "\n";
    return 1;
  }
  double fill_s = seconds_since(fill_start);
  if (from_sim)
    std::printf("filled %llu ledger rows (%zu nodes x %u days, from the template) in %.1f s into %s\n",
                (unsigned long long)rows, from_sim->nodes, days, fill_s, db.c_str());
  else
    std::printf("filled %llu ledger rows (%u nodes x %u days x %u jobs) in %.1f s into %s\n", (unsigned long long)rows,
                nodes, days, slots, fill_s, db.c_str());

  uint64_t since = t0 + 30 * 60, until = end - 20 * 60;
  struct Case {
    const char* name;
    TenantKey by;
    Level coarsest;
  };
  double expected_gpu_h = from_sim ? static_cast<double>(until - since) / 60 * gpu_s_per_minute / 3600
                                  : (static_cast<double>(until - since) / 3600) * 4 * nodes * slots;
  std::printf("| report | by | ledger rows read | tenants | GPU-hours | best of %u (s) |\n| --- | --- | --- | --- | --- | --- |\n",
              runs);
  double best_rollup = 0, best_baseline = 0;
  for (const Case& c : {Case{"rollups", TenantKey::account, Level::day}, Case{"rollups", TenantKey::job, Level::day},
                        Case{"rollups", TenantKey::node, Level::day},
                        Case{"baseline: hour rows, no day rollups", TenantKey::account, Level::hour}}) {
    double best = 1e9;
    Report last;
    for (uint32_t run = 0; run < runs; ++run) {
      auto start = std::chrono::steady_clock::now();
      auto report = make_report(**store, since, until, c.by, "", c.coarsest);
      double took = seconds_since(start);
      if (!report) {
        std::cerr << report.error().message << "\n";
        return 1;
      }
      best = std::min(best, took);
      last = std::move(*report);
    }
    if (std::abs(last.total.usage.gpu_s / 3600 - expected_gpu_h) > 1e-6 * expected_gpu_h) {
      std::fprintf(stderr, "wrong total: %.3f GPU-hours, expected %.3f\n", last.total.usage.gpu_s / 3600, expected_gpu_h);
      return 1;
    }
    std::printf("| %s | %s | %llu | %zu | %.0f | %.3f |\n", c.name, tenant_key_name(c.by),
                (unsigned long long)last.entries, last.rows.size(), last.total.usage.gpu_s / 3600, best);
    if (c.coarsest == Level::day && c.by == TenantKey::account) best_rollup = best;
    if (c.coarsest == Level::hour) best_baseline = best;
  }
  std::printf("baseline / rollups (by account): %.1fx\n", best_baseline / best_rollup);
  store->reset();
  if (temporary) std::filesystem::remove_all(db);
  return 0;
}
