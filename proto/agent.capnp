# The agent wire protocol: node agent <-> collector, over one ZeroMQ
# DEALER (agent) / ROUTER (collector) connection. One Cap'n Proto message
# per ZeroMQ frame, packed encoding. Evolution rules: docs/protocol.md.
@0xe264f13f2abb4822;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("rankscope::proto::wire");

# Bumped only for a change an older collector cannot read. Additive changes
# (new fields, new union members) keep the number.
const protocolVersion :UInt32 = 1;

# ---------------------------------------------------------------- agent -> collector

struct AgentMessage {
  union {
    hello @0 :Hello;
    batch @1 :Batch;
    heartbeat @2 :Heartbeat;
    clockProbe @3 :ClockProbe;
    # A batch message (AgentMessage with a batch), packed, then compressed
    # as one zstd frame that states its size (proto/compress.h), to a
    # collector whose HelloReply says readsCompact.
    compressed @4 :Data;
  }
}

struct Hello {
  protocolVersion @0 :UInt32;
  node @1 :Text;            # the node name this agent speaks for
  instanceId @2 :UInt64;    # random per agent start; batch numbers restart with it
  bootId @3 :Text;          # /proc/sys/kernel/random/boot_id: a new boot is a new clock origin
  agentVersion @4 :Text;
  kernelRelease @5 :Text;
  monotonicNs @6 :UInt64;   # the clock every event is stamped with (CLOCK_MONOTONIC)
  realtimeNs @7 :UInt64;    # the node's wall clock at the same instant (a first, rough offset)
  takesDetail @8 :Bool;     # the agent reads DetailRequest (an older one is never sent it)
  followsFleet @9 :Bool;    # the agent reads FleetMap and sends each job's batches to the collector that owns it
}

struct Batch {
  instanceId @0 :UInt64;
  seq @1 :UInt64;           # 1, 2, 3... per instance; the collector acks each one
  processes @2 :List(Process);
  comms @3 :List(Comm);
  commEnds @4 :List(CommEnd);
  collectives @5 :List(CollectiveColumns);
  clockSamples @6 :List(ClockSample);
  drops @7 :DropCounters;   # cumulative since the instance started
  createdNs @8 :UInt64;     # agent clock when the batch was closed
  baseNs @9 :UInt64;        # time base of the collective blocks (agent clock)
  commTable @10 :List(UInt64);    # communicator hashes the blocks refer to by index
  waits @11 :List(WaitColumns);  # host waits on the GPU that ended in this interval, per thread
  asyncErrors @12 :List(AsyncError);  # communicators found broken (ncclCommGetAsyncError)
  gpuCollectives @13 :List(GpuColumns);  # the GPU side of collectives, from NCCL's profiler plugin
  # In a fleet of collectors (docs/operations.md, "A fleet of collectors"):
  # the placement key of every process in the batch ("job:ID", or "nojob"),
  # whose owner it was sent to. Each key's batches are a stream of their own,
  # numbered by an instance id of their own (a job that moves is re-sent to
  # its new owner from that stream). "": a node's only stream (no fleet).
  placementKey @14 :Text;
  # The collector whose clock the clockSamples were taken against (its
  # --collector-id); another collector ignores them. "": the one it is sent to.
  clockOf @15 :Text;
  # The collective records of every block, in one table (CollectiveTable),
  # where the collector said it reads one (HelloReply.readsCompact); the
  # blocks of `collectives`, if any, are read first.
  collectiveTable @16 :CollectiveTable;
}

# The GPU side of the collectives of one (process, communicator, operation),
# read from rankscope's NCCL profiler plugin (docs/gpu-timing.md), in NCCL's
# seqNumber order. A collective is sent once the kernels of all its channels
# stopped. Times are the agent's clock: GPU times were put on it per process.
# Joined to the host records and across ranks by (commHash, op, seqNumber).
struct GpuColumns {
  pid @0 :UInt32;
  comm @1 :UInt32;          # index into Batch.commTable (NCCL's commHash)
  rank @2 :Int32;
  op @3 :UInt8;             # rs_nccl_op (bpf/nccl_events.h)
  count @4 :UInt32;         # number of records
  firstSeq @5 :UInt64;      # NCCL's seqNumber of the first (per communicator and operation)
  baseOffsetNs @6 :Int64;   # enqueue time of the first minus Batch.baseNs
  seqGap @7 :List(UInt32);  # seq[i] - seq[i-1] - 1
  enqueueDeltaNs @8 :List(Int64);  # enqueued[i] - enqueued[i-1] (0 for the first)
  startNs @9 :List(Int64);  # kernel start - enqueued: the time it queued on the GPU (below 0 only
                            # within the GPU clock's uncertainty)
  kernelNs @10 :List(UInt64);      # kernel end - kernel start
  elements @11 :List(UInt64);      # element count, xor previous (previous of the first: 0)
  # NCCL's proxy steps, while the agent asks for them (docs/gpu-timing.md):
  # per collective, the send link whose transfers waited longest on the
  # network. Empty when no collective of the block has them.
  linkPeer @12 :List(UInt32);      # the peer's rank + 1; 0: no proxy steps seen
  linkWaitNs @13 :List(UInt64);    # time its transfers to that peer were posted and not done
}

# ncclCommGetAsyncError returned an error or reported one: the communicator
# is broken (a peer died, the network failed). Polling that finds nothing is
# not sent.
struct AsyncError {
  pid @0 :UInt32;
  commHash @1 :UInt64;
  ns @2 :UInt64;            # agent clock at the call's return
  result @3 :Int32;         # ncclResult_t returned by the call
  asyncError @4 :Int32;     # ncclResult_t it reported for the communicator
}

# The ended waits of one thread, column by column like the collectives.
struct WaitColumns {
  pid @0 :UInt32;
  tid @1 :UInt32;
  count @2 :UInt32;
  baseOffsetNs @3 :Int64;   # start of the first wait minus Batch.baseNs
  gapNs @4 :List(UInt64);   # start[i] - end[i-1] (0 for the first)
  durationNs @5 :List(UInt64);
  kind @6 :List(UInt8);     # WaitKind, xor previous (previous of the first: firstKind)
  object @7 :List(UInt64);  # stream or event, xor previous (previous of the first: firstObject)
  result @8 :List(Int32);   # cudaError_t
  firstKind @9 :UInt8;
  firstObject @10 :UInt64;
}

enum WaitKind {
  unknown @0;
  streamSynchronize @1;     # cudaStreamSynchronize
  deviceSynchronize @2;     # cudaDeviceSynchronize
  eventSynchronize @3;      # cudaEventSynchronize
}

# A host thread blocked until the GPU finished (libcudart synchronize calls).
struct Wait {
  pid @0 :UInt32;
  tid @1 :UInt32;
  kind @2 :WaitKind;
  object @3 :UInt64;        # the stream or event waited on (0: the device)
  startNs @4 :UInt64;       # agent clock
  endNs @5 :UInt64;         # agent clock; 0 while still waiting (heartbeats)
  result @6 :Int32;         # cudaError_t
}

# A traced process, sent when it is first seen and when its identity changes.
struct Process {
  pid @0 :UInt32;
  startTime @1 :UInt64;     # /proc/PID/stat field 22: (pid, startTime) names one process
  exe @2 :Text;
  cgroupId @3 :UInt64;
  job @4 :Text;             # SLURM_JOB_ID, TORCHELASTIC_RUN_ID, RANKSCOPE_JOB, or "" (collector derives one)
  rank @5 :Int32 = -1;      # from the environment (RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK)
  localRank @6 :Int32 = -1;
  worldSize @7 :Int32 = -1;
  uid @8 :UInt32;
  user @9 :Text;
  account @10 :Text;        # SLURM_JOB_ACCOUNT
  visibleDevices @11 :Text; # CUDA_VISIBLE_DEVICES as the process sees it
  cgroupPath @12 :Text;     # cgroup v2 path (else the first v1 hierarchy's)
  slurmStep @13 :Text;      # SLURM_STEP_ID, else the cgroup path's step_<n>
  podUid @14 :Text;         # Kubernetes pod, from the cgroup path
  containerId @15 :Text;    # containerd, CRI-O or Docker container, from the cgroup path
  cudaDevices @16 :List(Int32);  # device ordinals selected with cudaSetDevice (within visibleDevices), in order first used
  podNamespace @17 :Text;   # Kubernetes: POD_NAMESPACE, else the container runtime's annotations
  podName @18 :Text;        # Kubernetes: POD_NAME, else the container runtime's annotations
}

enum CommOrigin {
  initRank @0;
  initRankConfig @1;
  initAll @2;
  split @3;
  unknown @4;               # collectives on a communicator whose creation was not seen
}

# A communicator as one member process created it.
struct Comm {
  pid @0 :UInt32;
  commHash @1 :UInt64;      # the same on every member: hash of the ncclUniqueId
  handle @2 :UInt64;        # the ncclComm_t value inside this process
  rank @3 :Int32;
  nranks @4 :Int32;
  origin @5 :CommOrigin;
  entryNs @6 :UInt64;
  returnNs @7 :UInt64;
  result @8 :Int32;         # ncclResult_t of the creating call
  parentHash @9 :UInt64;    # for a split child
  splitColor @10 :Int32;    # for a split child: ncclCommSplit's color and key (NCCL orders the child's
  splitKey @11 :Int32;      # ranks by key, then parent rank; rank above is the member's parent rank)
  splitIndex @12 :Int32;    # for a split child: which split of the parent it came from (NCCL's childCount:
                            # 1 for the first; NCCL_SPLIT_NOCOLOR splits count). 0: not sent (older agents).
                            # A member that took part with NCCL_SPLIT_NOCOLOR (-1) and got no child is
                            # announced too (splitColor -1, handle 0), so the collector knows when every
                            # rank of the parent has said what it did in that split.
}

enum CommEndKind {
  destroy @0;
  abort @1;
}

struct CommEnd {
  pid @0 :UInt32;
  commHash @1 :UInt64;
  kind @2 :CommEndKind;
  ns @3 :UInt64;
  result @4 :Int32;
}

enum TimingSource {
  hostIssue @0;             # host-side API call times (uprobes): when work was enqueued
  gpuProfiler @1;           # reserved (GPU-side times travel in GpuColumns)
}

# The collective records of one (process, communicator, lane), in sequence
# order, stored column by column. Each column is delta- or xor-encoded
# against the previous record so that the packed encoding turns the usual
# run of identical calls into zero words. An empty list means "all zero".
# The block header is kept small (a comm index, a time relative to the
# batch) because a block often holds only the few calls of one interval.
struct CollectiveColumns {
  pid @0 :UInt32;
  comm @1 :UInt32;          # index into Batch.commTable
  rank @2 :Int32;
  lane @3 :UInt32;          # 0: collectives; 1 + 2*peer + isRecv: point-to-point with one peer
  firstSeq @4 :UInt64;
  baseOffsetNs @5 :Int64;   # issue time of the first record minus Batch.baseNs
  count @6 :UInt32;         # number of records
  source @7 :TimingSource;
  seqGap @8 :List(UInt32);  # seq[i] - seq[i-1] - 1
  issueDeltaNs @9 :List(UInt64);  # issue[i] - issue[i-1]; issue[-1] = the block's base time
  durationNs @10 :List(UInt32);   # return - issue, saturated (flag RS_CALL_DURATION_SAT)
  code @11 :List(UInt32);   # op | datatype << 8 | redop << 16 | flags << 24, xor previous (previous of the first: firstCode)
  countDelta @12 :List(Int64);    # element count minus the previous one (previous of the first: firstCount)
  peer @13 :List(Int32);    # root or peer (-1: none), xor previous
  result @14 :List(UInt8);  # ncclResult_t
  firstCode @15 :UInt32;    # the code "previous" to the first record: usually the first's own, so the column is all zero
  firstCount @16 :UInt64;   # likewise for the element count
}

# The host-issue records of many blocks (each as one CollectiveColumns), in
# one set of columns: a block's header is a row, each field coded against
# the previous row's, so that the rows of a node's ranks in one
# communicator (sent side by side) cost a few bytes each, not ~40. Record
# columns hold the blocks' records one block after another, coded as in
# CollectiveColumns (the first record of each block against its row).
# Every column is empty (all zero) or exactly `blocks` (header) or the sum
# of the counts (records) long. zigzag(d) = (d << 1) ^ (d >> width-1), of
# the difference taken modulo 2^width.
struct CollectiveTable {
  blocks @0 :UInt32;              # rows
  pid @1 :List(UInt32);           # xor the previous row's (previous of the first: 0)
  comm @2 :List(UInt32);          # index into Batch.commTable, minus the previous row's
  rank @3 :List(UInt32);          # zigzag(rank - the previous row's)
  lane @4 :List(UInt32);          # xor the previous row's
  firstSeq @5 :List(UInt64);      # zigzag(firstSeq - the previous row's)
  baseOffsetNs @6 :List(UInt64);  # zigzag(issue of the first record - Batch.baseNs - the previous row's)
  count @7 :List(UInt32);         # records in the block (at least 1), xor the previous row's
  firstCode @8 :List(UInt32);     # as CollectiveColumns.firstCode, xor the previous row's
  firstCount @9 :List(UInt64);    # as CollectiveColumns.firstCount, xor the previous row's
  seqGap @10 :List(UInt32);
  issueDeltaNs @11 :List(UInt64);
  durationNs @12 :List(UInt32);
  code @13 :List(UInt32);
  countDelta @14 :List(Int64);
  peer @15 :List(Int32);           # xor the previous record's; a block's first against its lane's peer
                                  # ((lane - 1) / 2, and -1 on lane 0), not -1
  result @16 :List(UInt8);
}

# One field per row of common/drops.h's table, in its order (proto/drops.h
# binds them; a test holds the three together).
struct DropCounters {
  ringbufFull @0 :UInt64;   # events lost because the BPF ring buffer was full
  mapFull @1 :UInt64;       # BPF map updates that failed (too many threads/communicators)
  unknownComm @2 :UInt64;   # collectives on a communicator whose creation was not seen
  nested @3 :UInt64;        # NCCL API calls made from inside another (not recorded twice)
  sendQueueFull @4 :UInt64; # batches whose records were dropped unacked (spool or memory bound reached; their summaries kept when possible)
  lostRecords @5 :UInt64;   # collective records and waits in those batches
  spoolDamaged @6 :UInt64;  # spool segments found cut short or corrupt at start (their tails skipped)
  lostReturns @7 :UInt64;   # calls whose return was not seen (they ran while the agent attached): not recorded
  malformed @8 :UInt64;     # ring-buffer records the agent could not decode (wrong size or kind): not recorded
  profilerDropped @9 :UInt64;  # records NCCL's profiler plugin could not write while the agent read its ring (full)
  userShare @10 :UInt64;    # calls, communicators, lanes and threads not traced: their user held its share of the BPF tables
}

struct Heartbeat {
  instanceId @0 :UInt64;
  monotonicNs @1 :UInt64;
  drops @2 :DropCounters;
  tracedProcesses @3 :UInt32;
  unackedBatches @4 :UInt32;
  processes @5 :List(ProcessHealth);
  openWaits @6 :List(Wait); # waits on the GPU in progress now (a hang is a wait that never ends)
  cgroups @7 :List(CgroupUsage);  # who used this host's CPUs (cgroups busy since the last heartbeat, busiest first)
  gpuOpen @8 :List(GpuOpen);      # collectives enqueued whose kernels have not all stopped (NCCL's profiler plugin)
}

# Per traced process, communicator and op, the oldest collective NCCL
# enqueued whose kernels have not all stopped: where a GPU that stopped is
# stuck. A hang with every host alive is told apart by it: the ranks whose
# kernels never started, beside ranks whose kernels started and wait.
struct GpuOpen {
  pid @0 :UInt32;
  commHash @1 :UInt64;
  rank @2 :Int32;
  op @3 :UInt8;
  seq @4 :UInt64;           # NCCL's seqNumber
  enqueuedNs @5 :UInt64;    # agent clock
  kernelStartNs @6 :UInt64; # agent clock; 0: no channel's kernel started
  # Where NCCL's proxy steps were asked for when it was enqueued: its send
  # step handed to the network longest ago and not done, the peer it goes
  # to, and when it was handed over (a link that stopped moving).
  sendPeer @7 :Int32 = -1;  # -1: none in flight (or no proxy steps seen)
  sendSinceNs @8 :UInt64;   # agent clock; 0: none
  proxySteps @9 :Bool;      # proxy steps of it were seen at all
  detail @10 :Bool;         # NCCL reports its proxy work: proxy events were asked for when it was
                            # enqueued (a rank whose peers are all on its node has none to report)
}

# One cgroup's use of the host, cumulative since the agent started (BPF
# sched_switch and tcp_retransmit_skb).
struct CgroupUsage {
  cgroupId @0 :UInt64;      # cgroup v2 id (the directory's inode)
  path @1 :Text;            # below the cgroup v2 mount; "" if it could not be found (removed)
  cpuNs @2 :UInt64;
  involuntarySwitches @3 :UInt64;
  tcpRetransmits @4 :UInt64;
}

# What the scheduler did to the threads of a process that call NCCL or wait
# on the GPU, cumulative since the agent first saw it (BPF sched_switch).
struct HostCounters {
  cpuNs @0 :UInt64;               # all threads of the process, on a CPU
  onCpuNs @1 :UInt64;             # calling threads, on a CPU
  offCpuNs @2 :UInt64;            # calling threads, switched out
  runqueueNs @3 :UInt64;          # calling threads, runnable and waiting for a CPU
  iowaitNs @4 :UInt64;            # calling threads, asleep on block I/O
  voluntarySwitches @5 :UInt64;
  involuntarySwitches @6 :UInt64; # preempted while runnable
  majorFaults @7 :UInt64;
  threads @8 :UInt32;             # calling threads seen
}

# How a traced process is doing right now, from /proc and the BPF host
# counters (every heartbeat).
struct ProcessHealth {
  pid @0 :UInt32;
  alive @1 :Bool;
  state @2 :UInt8;          # /proc/PID/stat state letter: R, S, D, T (stopped), t, Z, X...
  cpuNs @3 :UInt64;         # /proc/PID/schedstat: time its main thread ran on a CPU
  runqueueNs @4 :UInt64;    # /proc/PID/schedstat: time its main thread waited for a CPU
  sampleNs @5 :UInt64;      # agent clock when read
  exitStatus @6 :Int32 = -1;# when it exited normally: its exit status; -1 otherwise or unknown
  exitSignal @7 :Int32;     # when a signal killed it: the signal number
  host @8 :HostCounters;    # unset when the agent runs without host-context probes
  processCpuNs @9 :UInt64;  # /proc/PID/stat utime + stime: all threads, as the kernel accounts CPU time (0: unknown)
  # Its cgroup's CPU quota and throttling (cgroup v1 cpu.stat, cpu.cfs_quota_us;
  # v2 cpu.stat, cpu.max), cumulative; all 0 when unknown or not in a cpu cgroup.
  cpuPeriods @10 :UInt64;          # nr_periods
  cpuThrottledPeriods @11 :UInt64; # nr_throttled
  cpuThrottledNs @12 :UInt64;      # throttled_time (v1), throttled_usec x 1000 (v2)
  cpuQuotaMillicpus @13 :UInt32;   # the quota in thousandths of a CPU; 0: none
}

# NTP-style probe: t1 (agent send, agent clock); the collector answers with
# t2 (receive) and t3 (send) on its clock; the agent stamps t4 on receipt and
# reports the four times in its next batch.
struct ClockProbe {
  t1 @0 :UInt64;
}

struct ClockSample {
  t1 @0 :UInt64;
  t2 @1 :UInt64;
  t3 @2 :UInt64;
  t4 @3 :UInt64;
}

# ---------------------------------------------------------------- collector -> agent

struct CollectorMessage {
  union {
    helloReply @0 :HelloReply;
    ack @1 :Ack;
    clockReply @2 :ClockReply;
    error @3 :ErrorReply;
    detail @4 :DetailRequest;
    fleet @5 :FleetMap;
  }
}

# The communicators whose NCCL proxy steps the collector wants now (a
# straggler, a slow link or a hang suspected there: docs/gpu-timing.md),
# sent in reply to a heartbeat of a node with members in them, and once
# with an empty list when it no longer wants any. The agent asks the
# profiler plugin of each process in them for its proxy steps, and stops
# when told, or when no request renews it for a few heartbeats.
struct DetailRequest {
  comms @0 :List(UInt64);   # NCCL's commHash
}

struct HelloReply {
  accepted @0 :Bool;
  reason @1 :Text;
  protocolVersion @2 :UInt32;
  collectorVersion @3 :Text;
  collectorId @4 :Text;     # in a fleet: this collector's id ("" alone)
  fleet @5 :FleetMap;       # in a fleet, to an agent that follows it: the members now
  readsCompact @6 :Bool;    # the collector reads Batch.collectiveTable and AgentMessage.compressed
                            # (an older one would ignore the table, and refuse a compressed batch)
  clockPort @7 :UInt16;     # the port, on the host this connection reached, where this collector
                            # answers clock probes on a thread of its own, so that no batch queues
                            # ahead of them (same CurveZMQ keys; 0: none, probe on this connection)
}

# The collectors of a fleet, as the one sending it last read them from etcd:
# sent in the HelloReply and again whenever the members change, to every
# agent that follows the fleet. The agent connects to each member and sends
# each job's batches to the member that rendezvous hashing names its owner
# (common/placement.h).
struct FleetMap {
  members @0 :List(FleetMember);
}

struct FleetMember {
  id @0 :Text;
  agents @1 :Text;          # the endpoint agents connect to
  publicKey @2 :Text;       # its CurveZMQ public key (Z85; "" without CurveZMQ)
}

# Sent only after the batch is written to RocksDB (write-ahead log synced).
struct Ack {
  instanceId @0 :UInt64;
  seq @1 :UInt64;
}

struct ClockReply {
  t1 @0 :UInt64;
  t2 @1 :UInt64;
  t3 @2 :UInt64;
}

enum ErrorCode {
  needHello @0;             # the collector does not know this connection (it restarted)
  badMessage @1;
  unsupportedVersion @2;
  refused @3;
}

struct ErrorReply {
  code @0 :ErrorCode;
  message @1 :Text;
}
