# The query protocol: rankscope CLI (ZeroMQ REQ) <-> collector (ROUTER).
# One Cap'n Proto message per frame, packed. Evolution rules: docs/protocol.md.
@0xb56f5e3716083caa;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("rankscope::proto::query");

using Agent = import "agent.capnp";

const queryProtocolVersion :UInt32 = 1;

struct Request {
  protocolVersion @0 :UInt32;
  union {
    status @1 :Void;
    jobs @2 :Void;
    timeline @3 :TimelineQuery;
    findings @4 :FindingsQuery;
    report @5 :ReportQuery;
    ack @6 :AckRequest;
    fleet @7 :Void;         # the collectors sharing the fleet (docs/operations.md "A fleet of collectors")
  }
}

# Closes a finding: an operator has seen it. A mismatch stays open until
# this (NCCL moving past a mismatched call may have corrupted data); any
# other finding may be closed this way too, and opens again as a new finding
# if its condition is still there.
struct AckRequest {
  id @0 :UInt64;
  by @1 :Text;              # who says so, as the client tells it (the collector adds the client's key)
  collector @2 :Text;       # in a fleet, the collector that holds the finding (ids are per collector):
                            # another one refuses; "": whichever is asked
}

# Usage and cost per tenant over a time range, from the usage ledger
# (collector/usage/ledger.h; docs/usage.md).
struct ReportQuery {
  sinceNs @0 :UInt64;       # unix ns; 0: from the start
  untilNs @1 :UInt64;       # unix ns; 0: now
  by @2 :Text;              # account | user | job | namespace | pod | cgroup | node
  job @3 :Text;             # non-empty: one job's bill (rows by node, its waste causes and findings)
}

struct FindingsQuery {
  openOnly @0 :Bool;
  kind @1 :Text;            # "" for every kind; else hang | mismatch | straggler | node_lost | slow_link
  limit @2 :UInt32 = 200;   # newest first
}

struct TimelineQuery {
  comm @0 :Text;            # communicator hash in hex, or a unique prefix of it
  rank @1 :Int32 = -1;      # -1: every rank
  last @2 :UInt32 = 20;     # the last N sequence numbers (per rank); 0: all
}

struct Reply {
  union {
    error @0 :Text;
    status @1 :StatusReply;
    jobs @2 :JobsReply;
    timeline @3 :TimelineReply;
    findings @4 :FindingsReply;
    report @5 :ReportReply;
    ack @6 :Finding;          # the finding as it now stands
    fleet @7 :FleetReply;
  }
}

# The fleet as the asked collector last read it from etcd. A collector run
# without --etcd answers with an empty `self` and no members: it is alone.
struct FleetReply {
  self @0 :Text;            # this collector's id
  etcd @1 :Text;            # the etcd endpoints it uses
  etcdOk @2 :Bool;          # its last exchange with etcd succeeded
  etcdError @3 :Text;       # why not, when not
  readNs @4 :UInt64;        # unix ns of its last read of the members (0: never)
  registrations @5 :UInt64; # leases it was granted (more than 1: it lost one and came back)
  leaseTtlS @6 :UInt32;
  members @7 :List(FleetMember);  # by id
}

struct FleetMember {
  id @0 :Text;
  agents @1 :Text;          # the endpoint its agents send to
  queries @2 :Text;         # the endpoint it answers queries on
  metrics @3 :Text;         # HOST:PORT of its /metrics ("" off)
  publicKey @4 :Text;       # its CurveZMQ public key (Z85; "" with --insecure)
  version @5 :Text;
  startedNs @6 :UInt64;
}

struct ReportReply {
  sinceNs @0 :UInt64;
  untilNs @1 :UInt64;
  by @2 :Text;              # the tenant key of the rows ("node" for a job's bill)
  job @3 :Text;
  rows @4 :List(ReportRow); # largest GPU-hours first; the unknown identity is a row of its own, "(unknown)"
  total @5 :ReportRow;      # tenant "TOTAL"
  causes @6 :List(WasteCause);  # who waited on whom, largest first
  findings @7 :List(Finding);   # a job's bill: the job's findings
  entries @8 :UInt64;       # ledger rows read
}

struct ReportRow {
  tenant @0 :Text;
  gpuHours @1 :Float64;     # GPU-hours held
  cpuSeconds @2 :Float64;
  offCpuSeconds @3 :Float64;
  collectiveSeconds @4 :Float64;
  waitSeconds @5 :Float64;  # host waits on the GPU
  bytes @6 :Float64;        # moved by its collectives
  collectives @7 :Float64;
  wasteGpuHours @8 :Float64;   # its GPU-hours idle waiting on stragglers and hangs
  causedGpuHours @9 :Float64;  # other ranks' GPU-hours idle waiting on it
  topCause @10 :Text;          # the tenant its waste is most owed to ("" none)
  topCauseGpuHours @11 :Float64;
  nodes @12 :UInt32;
}

struct WasteCause {
  victim @0 :Text;          # tenant that waited
  cause @1 :Text;           # tenant that made it wait
  reason @2 :Text;          # straggler | cpu-neighbour | hang
  causeNode @3 :Text;
  causeDetail @4 :Text;     # "rank 3 (pid 123)", "cgroup /.../job_7/step_0 (2.0 CPUs)"
  gpuHours @5 :Float64;
  causeJob @6 :Text;
}

struct FindingsReply {
  nowNs @0 :UInt64;
  findings @1 :List(Finding);
}

struct Finding {
  id @0 :UInt64;
  kind @1 :Text;            # hang | mismatch | straggler | node_lost | slow_link
  job @2 :Text;
  comm @3 :UInt64;
  seq @4 :Int64;            # -1 when the finding is not about one collective
  ranks @5 :List(Int32);    # the culprit ranks
  nodes @6 :List(Text);
  openedNs @7 :UInt64;      # cluster clock
  resolvedNs @8 :UInt64;    # 0 while open
  updatedNs @9 :UInt64;
  summary @10 :Text;
  detail @11 :Text;
  latenessS @12 :Float64;   # straggler: persistent lateness
  waitShare @13 :Float64;   # straggler: share of the time the others waited for it
  gpuHoursLost @14 :Float64;# straggler: GPU-hours the others spent waiting
  acknowledgedNs @15 :UInt64;  # 0: not acknowledged (rankscope ack)
  acknowledgedBy @16 :Text;
}

struct StatusReply {
  collectorVersion @0 :Text;
  startedNs @1 :UInt64;
  nowNs @2 :UInt64;
  nodes @3 :List(NodeStatus);
  batchesStored @4 :UInt64;
  recordsStored @5 :UInt64;
  duplicateBatches @6 :UInt64;
  badMessages @7 :UInt64;
  batchBytes @8 :UInt64;    # packed bytes of the batches stored: wire cost = batchBytes / recordsStored
  throttledMessages @9 :UInt64;  # agent messages dropped over the per-key rate limit
  refusedClaims @10 :UInt64;     # claims contradicting a communicator's binding (NodeStatus.refusedClaims)
  collectorId @11 :Text;    # its id in a fleet of collectors ("" alone)
}

struct NodeStatus {
  node @0 :Text;
  connected @1 :Bool;       # heard from within the liveness window
  lastContactNs @2 :UInt64; # collector clock
  agentVersion @3 :Text;
  instanceId @4 :UInt64;
  batches @5 :UInt64;
  records @6 :UInt64;
  drops @7 :Agent.DropCounters;
  clockOffsetNs @8 :Int64;  # add to the node's monotonic clock to get cluster time
  clockUncertaintyNs @9 :UInt64;
  clockSamples @10 :UInt32;
  tracedProcesses @11 :UInt32;
  wallClockSkewNs @12 :Int64; # the node's own wall clock minus the collector's (its NTP health)
  clockRefinementNs @13 :Int64;  # correction from the collectives, included in clockOffsetNs
  clockViolations @14 :UInt64;   # ranks seen leaving a collective before the last one arrived
  clockDriftPpb @15 :Int64;      # drift of its clock against the collector's, ns per s x 1000
  badMessages @16 :UInt64;       # its messages (or parts) refused as malformed or out of range
  throttledMessages @17 :UInt64; # its messages dropped over the per-key rate limit
  refusedClaims @18 :UInt64;     # its claims refused: another node's rank, a communicator's size changed,
                                 # an end of a communicator it is not a member of (docs/operations.md)
}

struct JobsReply {
  jobs @0 :List(JobInfo);
}

struct JobInfo {
  job @0 :Text;
  firstNs @1 :UInt64;
  lastNs @2 :UInt64;
  comms @3 :List(CommInfo);
}

struct CommInfo {
  commHash @0 :UInt64;
  nranks @1 :Int32;
  origin @2 :Agent.CommOrigin;
  ranks @3 :List(RankInfo);
  owner @4 :Text;           # the collector placement gives its job to, in a fleet ("" alone)
}

struct RankInfo {
  rank @0 :Int32;
  node @1 :Text;
  pid @2 :UInt32;
  records @3 :UInt64;
  lastSeq @4 :Int64;        # -1: none yet
  lastIssueNs @5 :UInt64;   # cluster time
  gpu @6 :Text;             # from CUDA_VISIBLE_DEVICES and the local rank; "" unknown
  user @7 :Text;
  account @8 :Text;
  slurmStep @9 :Text;
  podUid @10 :Text;
  containerId @11 :Text;
  # As the launcher told the process (RANK/SLURM_PROCID/OMPI_COMM_WORLD_RANK,
  # LOCAL_RANK/SLURM_LOCALID, WORLD_SIZE/SLURM_NTASKS); -1: not set.
  launcherRank @12 :Int32 = -1;
  localRank @13 :Int32 = -1;
  worldSize @14 :Int32 = -1;
  podNamespace @15 :Text;   # Kubernetes, where the agent could read it ("" otherwise)
  podName @16 :Text;
  ended @17 :Bool;          # its process destroyed or aborted the communicator
  # A split child's member: its rank in the parent communicator, the key it
  # gave ncclCommSplit, and the rank its agent named it by (its rank in the
  # communicator the chain of splits began from). -1: not a split child's.
  parentRank @18 :Int32 = -1;
  splitKey @19 :Int32;
  announcedRank @20 :Int32 = -1;
}

struct TimelineReply {
  commHash @0 :UInt64;
  job @1 :Text;
  nranks @2 :Int32;
  records @3 :List(TimelineRecord);
  # 0: every record asked for is here. Else a reply holds at most 262,144
  # records (the collector reads them between batches), and only the last
  # limitedTo of each (rank, lane) are: ask for one rank for more.
  limitedTo @4 :UInt32;
}

struct TimelineRecord {
  rank @0 :Int32;
  lane @1 :UInt32;
  seq @2 :UInt64;
  op @3 :UInt8;
  datatype @4 :UInt8;
  redop @5 :UInt8;
  peer @6 :Int32;
  count @7 :UInt64;
  bytes @8 :UInt64;
  issueNs @9 :UInt64;       # cluster time
  returnNs @10 :UInt64;     # cluster time
  result @11 :UInt8;
  flags @12 :UInt8;
  node @13 :Text;
  pid @14 :UInt32;
}
