# What the collector keeps in RocksDB besides the collective records (whose
# values have a fixed binary layout: encode_record_value in
# collector/store/write_set.h).
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
  retired @9 :Bool;       # out of the live model (over and quiet): kept for queries, not restored
  # A child of ncclCommSplit (collector/ingest/split.cpp): its parent, the
  # split's index and color, and whether its size and ranks were derived
  # (SplitSizing in collector/model/cluster.h: 0 none, 1 pending, 2 derived,
  # 3 abandoned). Members of a pending or abandoned child are keyed by
  # their parent ranks; of a derived one, by their ranks in the child.
  parentHash @10 :UInt64;
  splitIndex @11 :Int32;
  splitColor @12 :Int32;
  splitSizing @13 :UInt8;
  splitSinceNs @14 :UInt64;  # when the collector first heard of it (realtime), for the sizing's grace
}

# How far one member of a communicator has got, written with every commit
# that moved it (column family "progress", key: comm hash, rank): a big
# communicator's members and their counters are then not re-serialised
# whole at each commit. On restore it overrides the counters in StoredComm.
struct StoredProgress {
  records @0 :UInt64;
  lastSeq @1 :Int64;
  lastIssueNs @2 :UInt64;
  commLastNs @3 :UInt64;   # the communicator's last activity when written
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
  # Batches already stored, per agent instance (the newest few instances):
  # a batch re-sent after a restart of the collector, or replayed from an
  # agent's spool after a restart of the agent, is acked again, not stored twice.
  ackedBatches @10 :List(AckedBatches);
  # The node's clock fit, restored at start until new probes replace it
  # (offset = clockOffsetNs at clockReferenceNs of the node's clock, of
  # which clockRefinementNs came from the collectives).
  clockDriftPpb @11 :Float64;
  clockRefinementNs @12 :Int64;
  clockReferenceNs @13 :UInt64;
}

struct AckedBatches {
  instanceId @0 :UInt64;
  through @1 :UInt64;        # every seq from 1 to this one is stored
  above @2 :List(UInt64);    # and these, above it
}

# Findings are stored as Query.Finding (the CLI sees exactly what is stored).
