#pragma once
// The loader of bpf/nccl.bpf.c, with a fixed lifecycle: open -> configure
// (scope filters in rodata) -> load -> attach to each libnccl file -> drain.
// Owns every libbpf object it creates.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bpf/nccl_events.h"
#include "common/drops.h"
#include "common/result.h"
#include "node-agent/discover.h"

struct nccl;  // the generated skeleton (nccl.skel.h)
struct ring_buffer;
struct bpf_link;

namespace rankscope::agent {

struct AttachedLibrary {
  std::string path;
  LibraryKind kind = LibraryKind::nccl;
  std::vector<std::string> functions;  // functions probed in it
  std::vector<std::string> missing;    // functions of its kind this copy does not export
};



class NcclProbes {  // NCCL, CUDA runtime, libc and host-context probes (bpf/nccl.bpf.c)
 public:
  // Called once per ring-buffer record; decode with decode_event().
  using Handler = std::function<void(const void* data, size_t size)>;

  // host_context: also attach the scheduler and TCP probes (off-CPU time,
  // run-queue latency, CPU per cgroup, retransmits). multi_uprobes: attach
  // the uprobes as multi-uprobe links where the kernel has them (Linux 6.6+).
  static Result<std::unique_ptr<NcclProbes>> open(const Scope& scope, Handler handler, bool host_context = true,
                                                  bool multi_uprobes = true);
  ~NcclProbes();
  NcclProbes(const NcclProbes&) = delete;
  NcclProbes& operator=(const NcclProbes&) = delete;

  // Puts an entry probe on every function of its kind the file exports (the
  // NCCL API; libcudart's synchronize calls) and the shared return probe on
  // those that need one. Applies to every process that maps the file, now or later.
  Result<AttachedLibrary> attach(const LibraryFile& library);
  // Admits a process when the scope is a pid list.
  Result<void> allow_pid(uint32_t pid);
  // Drains the ring buffer, waiting up to timeout_ms; returns records handled.
  int poll(int timeout_ms);
  // Drains what is there without waiting.
  int consume();
  // A descriptor that becomes readable when records are waiting (for poll(2)).
  int wait_fd() const;
  // The counts BPF keeps (ringbuf_full, map_full, nested, lost_returns); the
  // others are zero here.
  DropCounts drops() const;
  // Entries a process holds in the BPF tables (communicators, waits in
  // progress, followed threads): zero once it exited. The call in progress
  // and the group nesting live in task-local storage, which the kernel frees
  // with the thread (and which cannot be listed from user space).
  struct TableEntries {
    size_t comms = 0, p2p = 0, waits = 0, threads = 0;
    bool processes = false;  // its host-counter row
  };
  TableEntries table_entries(uint32_t pid) const;
  // Entries in every per-process table, all processes together.
  struct TableSizes {
    size_t processes = 0, threads = 0, comms = 0, p2p = 0, waits = 0;
    size_t comm_slots = 0;        // counter slots numbering a communicator now
    size_t comm_slots_made = 0;   // slots ever taken fresh (the others were given back and reused)
  };
  TableSizes table_sizes() const;
  // What a user's traced processes hold of the tables (their share's use):
  // nullopt if none of its processes was ever traced.
  struct UserUse {
    uint32_t processes = 0, comms = 0, lanes = 0, threads = 0;
  };
  std::optional<UserUse> user_use(uint32_t uid) const;
  // Waits on the GPU in progress right now: (pid_tgid, wait).
  std::vector<std::pair<uint64_t, rs_open_wait>> open_waits() const;
  // Host counters of a process that called NCCL or waited on the GPU
  // (cumulative; nullopt once it exited or if it never did).
  std::optional<rs_host_stats> host_stats(uint32_t pid) const;
  // CPU and TCP retransmits per cgroup v2 id (cumulative).
  std::vector<std::pair<uint64_t, rs_cgroup_stats>> cgroup_stats() const;
  const std::vector<AttachedLibrary>& libraries() const { return libraries_; }
  // The host-context tracepoints attached, in words.
  const std::vector<std::string>& host_probes() const { return host_probes_; }
  // Whether the uprobes are attached as multi-uprobe links (Linux 6.6+).
  bool multi_uprobes() const { return multi_; }

 private:
  NcclProbes() = default;
  static int on_record(void* self, void* data, size_t size);

  nccl* skel_ = nullptr;
  ring_buffer* ring_ = nullptr;
  Handler handler_;
  std::vector<bpf_link*> links_;
  // Multi-uprobe links (Linux 6.6+), one per program and library, where
  // the kernel has them; uprobes one by one (links_) otherwise.
  bool multi_ = false;
  std::vector<int> multi_links_;
  std::vector<AttachedLibrary> libraries_;
  std::vector<std::string> host_probes_;
};

// Function name -> file offset of the symbol's code, for the functions asked
// for (ELF .dynsym and .symtab). Missing names are absent from the result.
Result<std::vector<std::pair<std::string, uint64_t>>> find_function_offsets(const std::string& path,
                                                                            const std::vector<std::string>& names);

// Routes libbpf's own messages into the rankscope log (once per process).
void route_libbpf_logs();

}  // namespace rankscope::agent
