#pragma once
// A collector's membership in a fleet kept in etcd. A thread of its own
// registers the collector's record under a lease, keeps the lease alive,
// and reads the other members' records, so the ingest loop never waits on
// etcd. When etcd cannot be reached the collector goes on with the last
// members it read (detection does not stop) and says so; when its lease
// expired meanwhile, it registers again. Stopping revokes the lease, so the
// survivors take over its jobs at once instead of after the lease's time.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collector/fleet/etcd.h"
#include "common/placement.h"

namespace rankscope::fleet {

struct FleetOptions {
  std::string etcd;                    // endpoints, comma-separated
  std::string prefix = "/rankscope/";  // this fleet's keys in etcd (several fleets may share one etcd)
  int64_t lease_ttl_s = 5;             // a member silent this long is gone and its jobs move
  collector::HttpClientOptions http;   // TLS and the timeout for etcd
  Member self;
};

// A member's record as read from etcd, with the lease that holds it.
struct MemberRecord {
  Member member;
  int64_t lease = 0;
};
// The members recorded under PREFIX/collectors/, by id. Records that are
// not a member's (etcd is shared), or not held by a lease (nothing would
// ever remove them), are left out.
Result<std::vector<MemberRecord>> read_members(EtcdClient& etcd, const std::string& prefix);

// The fleet as this collector last read it.
struct FleetView {
  std::string self;             // this collector's id
  std::vector<Member> members;  // by id; this collector among them once registered
  bool etcd_ok = false;         // the last exchange with etcd succeeded
  std::string etcd_error;       // why not, when not
  uint64_t read_ns = 0;         // unix ns of the last successful read of the members (0: never)
  uint64_t registrations = 0;   // leases granted to this collector (more than 1: it lost one and came back)
};

class Membership {
 public:
  // Starts the thread; the first registration is tried at once, and a dead
  // etcd is not an error here (it is retried, and reported by view()).
  static Result<std::unique_ptr<Membership>> start(FleetOptions options);
  ~Membership();  // stops the thread and revokes the lease

  FleetView view() const;
  const std::string& prefix() const { return options_.prefix; }
  std::string etcd_endpoints() const;  // as given, normalised: "http://HOST:PORT,..."
  int64_t lease_ttl_s() const { return options_.lease_ttl_s; }

  // Where members' records live: PREFIX + "collectors/".
  static std::string members_prefix(const std::string& prefix) { return prefix + "collectors/"; }

 private:
  Membership(FleetOptions options, EtcdClient etcd) : options_(std::move(options)), etcd_(std::move(etcd)) {}
  void loop();
  // One round: keep the lease (or get one), then read the members.
  Result<void> round();
  void set_error(const std::string& error);
  Result<void> register_self();
  std::string self_key() const { return members_prefix(options_.prefix) + options_.self.id; }

  const FleetOptions options_;
  EtcdClient etcd_;  // used by the thread only
  int64_t lease_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  FleetView view_;
  std::thread thread_;
};

}  // namespace rankscope::fleet
