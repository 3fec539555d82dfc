#pragma once
// A memory bound on the collectives an observer holds open (issued by some
// ranks of a communicator, not yet by all). Each open instance costs a slot
// per rank of its communicator, whoever sent it: a member of a 65,536-rank
// communicator makes a megabyte of state with one record. Counts alone do not
// bound that, so the observers (the detector, the usage ledger) charge every
// open instance here, by its bytes:
//   - per communicator, at most max_open(nranks) instances (the newest are
//     kept, a bound on a hang's evidence too: docs/detection.md);
//   - in all, at most `total_bytes`: past it, the communicator holding the
//     most gives up its oldest instance first. A user who inflates their own
//     communicator loses their own matching, never another job's.
// Times, decisions and what to evict are the observer's; this only counts.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace rankscope::collector {

class OpenBudget {
 public:
  static constexpr uint64_t kDefaultPerCommBytes = 64ull << 20;
  static constexpr uint64_t kDefaultTotalBytes = 512ull << 20;
  static constexpr size_t kMinOpen = 16;     // even the largest communicator keeps this many
  static constexpr size_t kMaxOpen = 4096;   // and the smallest no more

  OpenBudget(size_t bytes_per_slot, uint64_t per_comm_bytes = kDefaultPerCommBytes,
             uint64_t total_bytes = kDefaultTotalBytes)
      : bytes_per_slot_(bytes_per_slot), per_comm_bytes_(per_comm_bytes), total_bytes_(total_bytes) {}

  // Open instances a communicator of `nranks` may hold.
  size_t max_open(int32_t nranks) const {
    uint64_t each = bytes_of(nranks);
    return std::clamp<size_t>(static_cast<size_t>(per_comm_bytes_ / std::max<uint64_t>(each, 1)), kMinOpen, kMaxOpen);
  }
  uint64_t bytes_of(int32_t nranks) const {
    return static_cast<uint64_t>(std::max(nranks, 1)) * bytes_per_slot_ + kInstanceOverhead;
  }
  void opened(uint64_t comm, int32_t nranks) { change(comm, static_cast<int64_t>(bytes_of(nranks))); }
  void closed(uint64_t comm, int32_t nranks) { change(comm, -static_cast<int64_t>(bytes_of(nranks))); }
  // All of a communicator's instances went at once.
  void forget(uint64_t comm) {
    auto it = by_comm_.find(comm);
    if (it == by_comm_.end()) return;
    order_.erase({it->second, comm});
    total_ -= it->second;
    by_comm_.erase(it);
  }
  // While over the total: the communicator to take an instance from.
  std::optional<uint64_t> over() const {
    if (total_ <= total_bytes_ || order_.empty()) return std::nullopt;
    return order_.rbegin()->second;
  }
  uint64_t bytes() const { return total_; }
  uint64_t bytes(uint64_t comm) const {
    auto it = by_comm_.find(comm);
    return it == by_comm_.end() ? 0 : it->second;
  }
  uint64_t evicted() const { return evicted_; }
  void count_eviction() { ++evicted_; }

  // The instances are maps by sequence number (oldest first) of structs
  // whose `issue` vector has a slot per rank.
  // Drops one instance of `comm`'s (completed or evicted).
  template <typename Map>
  void close(uint64_t comm, Map& instances, typename Map::iterator it) {
    closed(comm, static_cast<int32_t>(it->second.issue.size()));
    instances.erase(it);
  }
  // After `comm` (of `nranks`) opened an instance in `instances`: trims it to
  // max_open(nranks), then, while over the total, drops the oldest instance
  // of the largest holder. `holder(comm)` is that communicator's map (null
  // when gone).
  template <typename Map, typename Holder>
  void enforce(uint64_t comm, int32_t nranks, Map& instances, Holder holder) {
    const size_t most = max_open(nranks);
    while (instances.size() > most) {
      count_eviction();
      close(comm, instances, instances.begin());
    }
    while (auto largest = over()) {
      Map* map = holder(*largest);
      if (!map || map->empty()) {
        forget(*largest);
        continue;
      }
      count_eviction();
      close(*largest, *map, map->begin());
    }
  }

 private:
  static constexpr uint64_t kInstanceOverhead = 96;  // the map node and the instance's own fields
  void change(uint64_t comm, int64_t delta) {
    uint64_t& held = by_comm_[comm];
    order_.erase({held, comm});
    held = static_cast<uint64_t>(static_cast<int64_t>(held) + delta);
    total_ = static_cast<uint64_t>(static_cast<int64_t>(total_) + delta);
    if (held == 0) {
      by_comm_.erase(comm);
      return;
    }
    order_.insert({held, comm});
  }

  size_t bytes_per_slot_;
  uint64_t per_comm_bytes_, total_bytes_;
  uint64_t total_ = 0, evicted_ = 0;
  std::map<uint64_t, uint64_t> by_comm_;           // comm -> bytes held
  std::set<std::pair<uint64_t, uint64_t>> order_;  // (bytes held, comm)
};

// Drops what `held` (an observer's open instances, by communicator) keeps
// of communicators that ended (every member ended them: what is open never
// completes) or that `comms` (the model's) lacks.
template <typename Held, typename Comms>
void sweep_open(Held& held, const Comms& comms, OpenBudget& budget) {
  for (auto it = held.begin(); it != held.end();) {
    auto comm = comms.find(it->first);
    if (comm != comms.end() && !comm->second.ended) {
      ++it;
      continue;
    }
    budget.forget(it->first);
    it = held.erase(it);
  }
}

}  // namespace rankscope::collector
