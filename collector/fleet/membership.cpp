#include "collector/fleet/membership.h"

#include <algorithm>
#include <chrono>

#include "common/log.h"

namespace rankscope::fleet {

namespace {

uint64_t unix_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

}  // namespace

Result<std::unique_ptr<Membership>> Membership::start(FleetOptions options) {
  if (options.self.id.empty()) return make_error(Errc::invalid_argument, "a fleet member needs an id");
  if (options.lease_ttl_s < 2) return make_error(Errc::invalid_argument, "the lease must live 2 s or more");
  // A renewal that waits past a third of the lease's life would let it
  // expire while etcd is merely slow: each request is bounded below that.
  options.http.timeout_ms = std::min<int>(options.http.timeout_ms, static_cast<int>(options.lease_ttl_s * 1000 / 3));
  auto etcd = EtcdClient::make(options.etcd, options.http);
  if (!etcd) return etcd.error();
  std::unique_ptr<Membership> membership(new Membership(std::move(options), std::move(*etcd)));
  membership->view_.self = membership->options_.self.id;
  membership->thread_ = std::thread([m = membership.get()] { m->loop(); });
  return membership;
}

Membership::~Membership() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (lease_ != 0) {
    if (auto revoked = etcd_.revoke(lease_); !revoked)
      RS_LOG(warn,
             "etcd: could not revoke this collector's lease (%s): its jobs move when the lease expires, in %lld s",
             revoked.error().message.c_str(), static_cast<long long>(options_.lease_ttl_s));
    else
      RS_LOG(info, "etcd: left the fleet (lease revoked); its jobs move to the other collectors now");
  }
}

std::string Membership::etcd_endpoints() const {
  std::string out;
  for (const auto& endpoint : etcd_.endpoints()) out += (out.empty() ? "" : ",") + endpoint;
  return out;
}

FleetView Membership::view() const {
  std::lock_guard lock(mutex_);
  return view_;
}

std::optional<Member> Membership::owner_of(std::string_view key) const {
  std::lock_guard lock(mutex_);
  const Member* found = owner(key, view_.members);
  if (!found) return std::nullopt;
  return *found;
}

void Membership::set_error(const std::string& error) {
  std::lock_guard lock(mutex_);
  if (view_.etcd_ok || view_.etcd_error.empty())
    RS_LOG(error, "etcd: %s; going on with the %zu collector(s) last read, the jobs stay where they are", error.c_str(),
           view_.members.size());
  view_.etcd_ok = false;
  view_.etcd_error = error;
}

Result<void> Membership::round() {
  if (lease_ != 0) {
    auto left = etcd_.keep_alive(lease_);
    if (!left) return left.error();
    if (*left == 0) {
      RS_LOG(warn,
             "etcd: this collector's lease expired (etcd was out of reach for longer than %lld s): its jobs may "
             "have moved; registering again",
             static_cast<long long>(options_.lease_ttl_s));
      lease_ = 0;
    }
  }
  if (lease_ == 0) {
    auto lease = etcd_.grant_lease(options_.lease_ttl_s);
    if (!lease) return lease.error();
    // Under the lease: gone when this collector stops renewing it.
    if (auto put = etcd_.put(members_prefix(options_.prefix) + options_.self.id, member_json(options_.self), *lease);
        !put) {
      (void)etcd_.revoke(*lease);
      return put.error();
    }
    lease_ = *lease;
    std::lock_guard lock(mutex_);
    ++view_.registrations;
    RS_LOG(info, "etcd: registered as collector %s under lease %llx (%lld s)", options_.self.id.c_str(),
           static_cast<unsigned long long>(lease_), static_cast<long long>(options_.lease_ttl_s));
  }
  auto records = etcd_.range_prefix(members_prefix(options_.prefix));
  if (!records) return records.error();
  std::vector<Member> members;
  for (const auto& record : *records) {
    auto member = parse_member(record.value);
    if (!member) {
      RS_LOG(debug, "etcd: %s is not a collector's record (%s): ignored", record.key.c_str(),
             member.error().message.c_str());
      continue;
    }
    if (record.lease == 0) continue;  // not under a lease: nothing would ever remove it
    members.push_back(std::move(*member));
  }
  std::sort(members.begin(), members.end(), [](const Member& a, const Member& b) { return a.id < b.id; });
  std::lock_guard lock(mutex_);
  if (!view_.etcd_ok && !view_.etcd_error.empty()) RS_LOG(info, "etcd: reachable again");
  std::vector<std::string> before, after;
  for (const auto& m : view_.members) before.push_back(m.id);
  for (const auto& m : members) after.push_back(m.id);
  if (before != after) {
    std::string list;
    for (const auto& id : after) list += (list.empty() ? "" : ", ") + id;
    RS_LOG(info, "fleet: %zu collector(s): %s", after.size(), list.c_str());
  }
  view_.members = std::move(members);
  view_.etcd_ok = true;
  view_.etcd_error.clear();
  view_.read_ns = unix_ns();
  return {};
}

void Membership::loop() {
  // Renewed three times per lease, and the members read at least every second.
  const auto interval = std::chrono::milliseconds(std::min<int64_t>(1000, options_.lease_ttl_s * 1000 / 3));
  std::unique_lock lock(mutex_);
  while (!stop_) {
    lock.unlock();
    if (auto done = round(); !done) set_error(done.error().message);
    lock.lock();
    wake_.wait_for(lock, interval, [&] { return stop_; });
  }
}

}  // namespace rankscope::fleet
