#include "collector/fleet/membership.h"

#include <algorithm>
#include <chrono>

#include "common/clock.h"
#include "common/log.h"

namespace rankscope::fleet {

Result<std::vector<MemberRecord>> read_members(EtcdClient& etcd, const std::string& prefix) {
  auto records = etcd.range_prefix(Membership::members_prefix(prefix));
  if (!records) return records.error();
  std::vector<MemberRecord> out;
  for (const auto& record : *records) {
    auto member = parse_member(record.value);
    if (!member) {
      RS_LOG(debug, "etcd: %s is not a collector's record (%s): ignored", record.key.c_str(),
             member.error().message.c_str());
      continue;
    }
    if (record.lease != 0) out.push_back({std::move(*member), record.lease});
  }
  std::sort(out.begin(), out.end(),
            [](const MemberRecord& a, const MemberRecord& b) { return a.member.id < b.member.id; });
  return out;
}

Result<std::unique_ptr<Membership>> Membership::start(FleetOptions options) {
  if (options.self.id.empty()) return make_error(Errc::invalid_argument, "a fleet member needs an id");
  if (options.lease_ttl_s < 2) return make_error(Errc::invalid_argument, "the lease must live 2 s or more");
  // A renewal that waits past a third of the lease's life would let it
  // expire while etcd is merely slow: each request is bounded below that.
  // Also at most 2 s, so that a stop waits little on an etcd out of reach.
  options.http.timeout_ms =
      std::min<int>({options.http.timeout_ms, static_cast<int>(options.lease_ttl_s * 1000 / 3), 2000});
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

void Membership::set_error(const std::string& error) {
  std::lock_guard lock(mutex_);
  if (view_.etcd_ok || view_.etcd_error.empty())
    RS_LOG(error, "etcd: %s; going on with the %zu collector(s) last read, the jobs stay where they are", error.c_str(),
           view_.members.size());
  view_.etcd_ok = false;
  view_.etcd_error = error;
}

Result<void> Membership::register_self() {
  auto lease = etcd_.grant_lease(options_.lease_ttl_s);
  if (!lease) return lease.error();
  // Under the lease: gone when this collector stops renewing it. Only
  // where no record of this id exists: another collector may hold it (or
  // this one's last run, until its lease expires).
  auto created = etcd_.create(self_key(), member_json(options_.self), *lease);
  if (!created || !*created) {
    (void)etcd_.revoke(*lease);
    if (!created) return created.error();
    return make_error(Errc::refused, "a collector with the id " + options_.self.id +
                                         " is registered already (another one, or this one's last run until its "
                                         "lease expires): every --collector-id must be unique; trying again");
  }
  lease_ = *lease;
  std::lock_guard lock(mutex_);
  ++view_.registrations;
  RS_LOG(info, "etcd: registered as collector %s under lease %llx (%lld s)", options_.self.id.c_str(),
         static_cast<unsigned long long>(lease_), static_cast<long long>(options_.lease_ttl_s));
  return {};
}

Result<void> Membership::round() {
  if (lease_ != 0) {
    auto left = etcd_.keep_alive(lease_);
    if (!left) return left.error();
    if (*left == 0) {
      RS_LOG(warn,
             "etcd: this collector's lease expired (etcd was out of reach for longer than %lld s, or the lease "
             "was revoked): its jobs may have moved; registering again",
             static_cast<long long>(options_.lease_ttl_s));
      lease_ = 0;
    }
  }
  if (lease_ == 0)
    if (auto registered = register_self(); !registered) return registered.error();
  auto records = read_members(etcd_, options_.prefix);
  if (!records) return records.error();
  auto self = std::find_if(records->begin(), records->end(),
                           [&](const MemberRecord& r) { return r.member.id == options_.self.id; });
  if (self == records->end()) {
    // The record went (deleted by hand, a restore) while the lease lives on.
    RS_LOG(warn, "etcd: this collector's record is gone; writing it again");
    if (auto put = etcd_.put(self_key(), member_json(options_.self), lease_); !put) return put.error();
  } else if (self->lease != lease_) {  // never, with create(): a record written by hand
    return make_error(Errc::refused, "the record of " + options_.self.id +
                                         " is held by another lease: every --collector-id must be unique");
  }
  std::vector<Member> members;
  for (auto& record : *records) members.push_back(std::move(record.member));
  if (self == records->end()) members.push_back(options_.self);
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
  view_.read_ns = SystemClock::read(CLOCK_REALTIME);
  return {};
}

void Membership::loop() {
  // Renewed three times per lease, and the members read at least every second.
  const auto interval = std::chrono::milliseconds(std::min<int64_t>(1000, options_.lease_ttl_s * 1000 / 3));
  std::unique_lock lock(mutex_);
  while (!stop_) {
    lock.unlock();
    try {
      if (auto done = round(); !done) set_error(done.error().message);
    } catch (const std::exception& e) {  // never: what etcd sends is checked, not trusted
      set_error(std::string("unexpected: ") + e.what());
    }
    lock.lock();
    wake_.wait_for(lock, interval, [&] { return stop_; });
  }
}

}  // namespace rankscope::fleet
