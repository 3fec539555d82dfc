#pragma once
// The agent's messages as the wire carries them (proto/agent.capnp), built
// from plain values: the node agent and the simulator's agents (rankscope-sim)
// assemble their Hello, clock probes, heartbeats and batches with these, so
// that what the simulator sends is what an agent sends.
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "proto/agent.capnp.h"

namespace rankscope::proto {

struct Hello {
  std::string node;
  uint64_t instance_id = 0;
  std::string boot_id, agent_version, kernel_release;
  uint64_t monotonic_ns = 0;  // the node's clock
  uint64_t realtime_ns = 0;   // its wall clock (the collector compares it with its own)
  bool follows_fleet = false;  // it reads FleetMap (a node agent; not the simulator's)
};
// Packed bytes of an AgentMessage holding `hello` at this build's protocol version.
std::string encode_hello(const Hello& hello);

// Packed bytes of a clock probe sent at `t1` (node clock).
std::string encode_clock_probe(uint64_t t1);
// The collector's side of a probe: its `t1` if `packed` is a clock probe
// (nothing else, and at most kMaxClockProbeBytes: a larger message is not
// one, and is not unpacked to find that out); and the packed reply.
inline constexpr size_t kMaxClockProbeBytes = 128;
std::optional<uint64_t> read_clock_probe(std::string_view packed);
std::string encode_clock_reply(uint64_t t1, uint64_t t2, uint64_t t3);
// The agent's side: t1, t2, t3 if `packed` is a clock reply.
std::optional<std::array<uint64_t, 3>> read_clock_reply(std::string_view packed);
// Where a collector reached at `connected_to` (tcp://HOST:PORT) answers
// probes apart (HelloReply.clockPort): the same host, `port`. "" where
// there is none (port 0, or not a TCP endpoint).
std::string clock_probe_endpoint(const std::string& connected_to, uint16_t port);

struct HeartbeatHeader {
  uint64_t instance_id = 0;
  uint64_t monotonic_ns = 0;
  uint32_t unacked_batches = 0;
};
// Packed bytes of a heartbeat: the header, then what `fill` writes.
std::string encode_heartbeat(const HeartbeatHeader& header, const std::function<void(wire::Heartbeat::Builder)>& fill);

// Packed bytes of a batch: the header, then what `fill` writes.
std::string encode_batch(uint64_t instance_id, uint64_t seq, uint64_t created_ns,
                         const std::function<void(wire::Batch::Builder)>& fill);

// `packed` (a batch message) as AgentMessage.compressed, for a collector
// that reads one (HelloReply.readsCompact).
std::string encode_compressed(std::string_view packed);
// The same where that is smaller, else `packed` as it is (a batch of a few
// hundred bytes gains less than a frame costs).
std::string encode_compact(std::string_view packed);

// Who a traced process is, as the agent announces it once per process.
struct ProcessIdentity {
  uint32_t pid = 0;
  uint64_t start_time = 0;  // /proc/PID/stat field 22, clock ticks since boot
  std::string exe;
  uint32_t uid = 0;
  std::string user;
  std::string job;      // SLURM_JOB_ID, RANKSCOPE_JOB_ID, TORCHELASTIC_RUN_ID; "" if none
  std::string account;  // the Slurm job's, as its Prolog recorded it
  int32_t rank = -1;
  int32_t local_rank = -1;
  int32_t world_size = -1;
  std::string visible_devices;        // CUDA_VISIBLE_DEVICES; a later setenv in the process wins
  std::vector<int32_t> cuda_devices;  // ordinals chosen with cudaSetDevice, in order first used
  // From the cgroup path (cgroup v2, else the first v1 hierarchy); the job and
  // step only where the environment does not name them:
  std::string cgroup_path;
  uint64_t cgroup_id = 0;         // from the events (bpf_get_current_cgroup_id)
  std::string slurm_step;         // SLURM_STEP_ID, else the cgroup's step_<n>: "0", "batch", "extern"...
  int64_t slurm_uid = -1;         // not sent: the job's owner, to check a Prolog record against
  std::string pod_uid;            // Kubernetes
  std::string pod_namespace;      // POD_NAMESPACE, else the container runtime's annotations
  std::string pod_name;           // POD_NAME, else the container runtime's annotations
  std::string container_id;       // Kubernetes or Docker
  std::string container_runtime;  // not sent: containerd, crio, docker
};
void write_processes(const std::vector<const ProcessIdentity*>& processes, wire::Batch::Builder batch);
// Clears each string of `identity` past its bound (proto/limits.h) and
// keeps its first kMaxCudaDevices devices; what it changed, for a log line
// ("job of 131072 bytes"), empty when nothing.
std::vector<std::string> limit_identity(ProcessIdentity& identity);
// What announcing `identity` may cost a batch at most (kWireProcessBytes
// and its strings).
uint64_t identity_wire_bytes(const ProcessIdentity& identity);

// A communicator a process joined (ncclCommInitRank, ncclCommSplit...).
struct CommJoined {
  uint32_t pid = 0;
  uint64_t hash = 0, handle = 0, parent_hash = 0;
  uint64_t entry_ns = 0, return_ns = 0;  // of the init call, node clock
  int32_t rank = -1, nranks = -1, result = 0;
  wire::CommOrigin origin = wire::CommOrigin::UNKNOWN;
  int32_t color = 0, key = 0;  // CommSplit's
  int32_t split_index = 0;     // CommSplit's: NCCL's childCount of the parent (1 for its first split)
};
void write_comms(const std::vector<CommJoined>& comms, wire::Batch::Builder batch);

// NTP-style samples (t1..t4) of the node's clock against the collector's.
void write_clock_samples(const std::vector<std::array<uint64_t, 4>>& samples, wire::Batch::Builder batch);

}  // namespace rankscope::proto
