#pragma once
// Who owns what in a fleet of collectors. Each collector is a member, known
// by the record it keeps in etcd under its lease. Each job (or, for
// processes with no job id, each communicator) is owned by exactly one live
// member, chosen by rendezvous hashing: every member scores the key and the
// highest score wins. Every collector, agent and client that knows the same
// members computes the same owner without asking anyone, and when a member
// goes only the keys it owned move (each to the member that scored next).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace rankscope::fleet {

// A collector as the fleet knows it: what it writes to etcd.
struct Member {
  std::string id;           // unique in the fleet (--collector-id)
  std::string agents;       // the endpoint agents send to, e.g. tcp://10.0.0.5:7600
  std::string queries;      // the endpoint clients query, e.g. tcp://10.0.0.5:7601
  std::string metrics;      // HOST:PORT of its /metrics ("" off)
  std::string public_key;   // its CurveZMQ public key (Z85; "" with --insecure)
  std::string version;      // the collector's version
  uint64_t started_ns = 0;  // unix ns
};

std::string member_json(const Member& member);
// A record read back from etcd; an error for anything that is not one (etcd
// is shared: another program may have written under the prefix).
Result<Member> parse_member(std::string_view json);

// The placement key of a job, or of a communicator when its processes gave
// no job id.
std::string placement_key(std::string_view job, uint64_t comm);

// The member that owns `key`: the highest rendezvous score. Null when there
// are no members.
const Member* owner(std::string_view key, const std::vector<Member>& members);
// The score itself (BLAKE2b of the member id and the key, 64 bits).
uint64_t rendezvous_score(std::string_view member_id, std::string_view key);

}  // namespace rankscope::fleet
