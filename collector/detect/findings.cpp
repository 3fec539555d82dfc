#include "collector/detect/findings.h"

#include <algorithm>

#include "common/log.h"

namespace rankscope::collector {

void FindingBook::restore(std::vector<Finding> stored) {
  for (Finding& f : stored) {
    next_id_ = std::max(next_id_, f.id + 1);
    if (f.open()) open_[f.key()] = f.id;
    findings_[f.id] = std::move(f);
  }
  trim();
}

const Finding& FindingBook::raise(Finding f, uint64_t now_ns) {
  std::string key = f.key();
  auto it = open_.find(key);
  if (it == open_.end()) {
    f.id = next_id_++;
    f.opened_ns = f.opened_ns ? f.opened_ns : now_ns;
    f.resolved_ns = 0;
    f.updated_ns = now_ns;
    open_[key] = f.id;
    dirty_.insert(f.id);
    RS_LOG(warn, "finding #%llu opened: %s", static_cast<unsigned long long>(f.id), f.summary.c_str());
    return findings_[f.id] = std::move(f);
  }
  Finding& current = findings_[it->second];
  bool changed = current.summary != f.summary || current.detail != f.detail || current.ranks != f.ranks ||
                 current.nodes != f.nodes || current.lateness_s != f.lateness_s ||
                 current.gpu_hours_lost != f.gpu_hours_lost;
  if (changed) {
    current.ranks = std::move(f.ranks);
    current.nodes = std::move(f.nodes);
    current.summary = std::move(f.summary);
    current.detail = std::move(f.detail);
    current.lateness_s = f.lateness_s;
    current.wait_share = f.wait_share;
    current.gpu_hours_lost = f.gpu_hours_lost;
    if (!f.job.empty()) current.job = f.job;
    current.updated_ns = now_ns;
    dirty_.insert(current.id);
  }
  return current;
}

void FindingBook::resolve(const std::string& key, uint64_t now_ns) {
  auto it = open_.find(key);
  if (it == open_.end()) return;
  Finding& f = findings_[it->second];
  f.resolved_ns = now_ns;
  f.updated_ns = now_ns;
  dirty_.insert(f.id);
  RS_LOG(info, "finding #%llu resolved: %s", static_cast<unsigned long long>(f.id), f.summary.c_str());
  open_.erase(it);
  trim();
}

Result<Finding> FindingBook::acknowledge(uint64_t id, const std::string& by, uint64_t now_ns) {
  auto it = findings_.find(id);
  if (it == findings_.end())
    return Error{Errc::not_found, "no finding #" + std::to_string(id) +
                                      " in memory (the collector keeps every open finding and the newest " +
                                      std::to_string(kResolvedInMemory) + " resolved ones)"};
  Finding& f = it->second;
  if (f.acknowledged_ns == 0) {
    f.acknowledged_ns = now_ns;
    f.acknowledged_by = by;
    f.updated_ns = now_ns;
    dirty_.insert(id);
    RS_LOG(info, "finding #%llu acknowledged by %s", static_cast<unsigned long long>(id), by.c_str());
  }
  if (f.open()) resolve(f.key(), now_ns);  // trims only what is written: `id` is dirty, it stays
  return findings_.at(id);
}

const Finding* FindingBook::open_finding(const std::string& key) const {
  auto it = open_.find(key);
  return it == open_.end() ? nullptr : &findings_.at(it->second);
}

std::vector<const Finding*> FindingBook::open() const {
  std::vector<const Finding*> out;
  for (const auto& [key, id] : open_) out.push_back(&findings_.at(id));
  std::sort(out.begin(), out.end(), [](const Finding* a, const Finding* b) { return a->id > b->id; });
  return out;
}

std::vector<const Finding*> FindingBook::all() const {
  std::vector<const Finding*> out;
  for (auto it = findings_.rbegin(); it != findings_.rend(); ++it) out.push_back(&it->second);
  return out;
}

std::vector<Finding> FindingBook::for_alerts(uint64_t since_ns) const {
  std::vector<Finding> out;
  for (const auto& [id, f] : findings_)
    if (f.open() || f.resolved_ns >= since_ns) out.push_back(f);
  return out;
}

size_t FindingBook::open_count(FindingKind kind) const {
  size_t n = 0;
  for (const auto& [key, id] : open_) n += findings_.at(id).kind == kind ? 1 : 0;
  return n;
}

std::vector<Finding> FindingBook::take_changed() {
  std::vector<Finding> out;
  for (uint64_t id : dirty_) {
    auto it = findings_.find(id);
    if (it != findings_.end()) out.push_back(it->second);
  }
  dirty_.clear();
  return out;
}

void FindingBook::trim() {
  // RocksDB keeps every finding; memory keeps the open ones and the newest resolved.
  size_t resolved = findings_.size() - open_.size();
  for (auto it = findings_.begin(); it != findings_.end() && resolved > kResolvedInMemory;) {
    if (!it->second.open() && !dirty_.count(it->first)) {
      it = findings_.erase(it);
      --resolved;
    } else {
      ++it;
    }
  }
}

}  // namespace rankscope::collector
