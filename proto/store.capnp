# What the collector keeps in RocksDB besides the collective records (whose
# values have a fixed binary layout, collector/store/record_codec.h).
# Private to the collector; the same additive evolution rules apply, since a
# collector must read the database an older one wrote.
@0xa4024f985fc01ea1;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("rankscope::proto::store");

using Agent = import "agent.capnp";
using Query = import "query.capnp";

struct StoredComm {
  commHash @0 :UInt64;
  job @1 :Text;
  nranks @2 :Int32;
  origin @3 :Agent.CommOrigin;
  members @4 :List(Query.RankInfo);
  firstNs @5 :UInt64;
  lastNs @6 :UInt64;
  lanes @7 :List(UInt32);   # lanes seen (0: collectives; others: point-to-point)
  ended @8 :Bool;
}

struct StoredNode {
  node @0 :Text;
  lastContactNs @1 :UInt64;
  agentVersion @2 :Text;
  instanceId @3 :UInt64;
  bootId @4 :Text;
  batches @5 :UInt64;
  records @6 :UInt64;
  drops @7 :Agent.DropCounters;
  clockOffsetNs @8 :Int64;
  clockUncertaintyNs @9 :UInt64;
}

# Findings are stored as Query.Finding (the CLI sees exactly what is stored).
