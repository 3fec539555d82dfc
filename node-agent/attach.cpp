#include "node-agent/attach.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <linux/bpf.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <map>
#include <system_error>
#include <thread>

#include "common/log.h"
#include "nccl.skel.h"

namespace rankscope::agent {

namespace {

struct ProbeSpec {
  const char* symbol;
  bpf_program* (*program)(nccl*);
  bpf_program* (*return_program)(nccl*);  // nullptr: no return probe
};

bpf_program* nccl_return(nccl* s) { return s->progs.nccl_call_return; }
bpf_program* wait_return(nccl* s) { return s->progs.cuda_wait_return; }

// Every NCCL API entry point we probe (signatures: nccl.h, NCCL 2.28).
const ProbeSpec kNcclProbes[] = {
    {"ncclAllReduce", [](nccl* s) { return s->progs.nccl_allreduce_enter; }, nccl_return},
    {"ncclReduceScatter", [](nccl* s) { return s->progs.nccl_reducescatter_enter; }, nccl_return},
    {"ncclReduce", [](nccl* s) { return s->progs.nccl_reduce_enter; }, nccl_return},
    {"ncclBroadcast", [](nccl* s) { return s->progs.nccl_broadcast_enter; }, nccl_return},
    {"ncclBcast", [](nccl* s) { return s->progs.nccl_bcast_enter; }, nccl_return},
    {"ncclAllGather", [](nccl* s) { return s->progs.nccl_allgather_enter; }, nccl_return},
    {"ncclAlltoAll", [](nccl* s) { return s->progs.nccl_alltoall_enter; }, nccl_return},
    {"ncclGather", [](nccl* s) { return s->progs.nccl_gather_enter; }, nccl_return},
    {"ncclScatter", [](nccl* s) { return s->progs.nccl_scatter_enter; }, nccl_return},
    {"ncclSend", [](nccl* s) { return s->progs.nccl_send_enter; }, nccl_return},
    {"ncclRecv", [](nccl* s) { return s->progs.nccl_recv_enter; }, nccl_return},
    {"ncclCommInitRank", [](nccl* s) { return s->progs.nccl_comm_init_rank_enter; }, nccl_return},
    {"ncclCommInitRankConfig", [](nccl* s) { return s->progs.nccl_comm_init_rank_config_enter; }, nccl_return},
    {"ncclCommInitAll", [](nccl* s) { return s->progs.nccl_comm_init_all_enter; }, nccl_return},
    {"ncclCommSplit", [](nccl* s) { return s->progs.nccl_comm_split_enter; }, nccl_return},
    {"ncclCommDestroy", [](nccl* s) { return s->progs.nccl_comm_destroy_enter; }, nccl_return},
    {"ncclCommAbort", [](nccl* s) { return s->progs.nccl_comm_abort_enter; }, nccl_return},
    {"ncclCommGetAsyncError", [](nccl* s) { return s->progs.nccl_comm_get_async_error_enter; }, nccl_return},
    {"ncclGroupStart", [](nccl* s) { return s->progs.nccl_group_start_enter; }, nullptr},
    {"ncclGroupEnd", [](nccl* s) { return s->progs.nccl_group_end_enter; }, nullptr},
};

// Where a host thread waits for the GPU (cuda_runtime_api.h), and the device
// it works on.
const ProbeSpec kCudaProbes[] = {
    {"cudaStreamSynchronize", [](nccl* s) { return s->progs.cuda_stream_sync_enter; }, wait_return},
    {"cudaDeviceSynchronize", [](nccl* s) { return s->progs.cuda_device_sync_enter; }, wait_return},
    {"cudaEventSynchronize", [](nccl* s) { return s->progs.cuda_event_sync_enter; }, wait_return},
    {"cudaSetDevice", [](nccl* s) { return s->progs.cuda_set_device_enter; },
     [](nccl* s) { return s->progs.cuda_set_device_return; }},
};

// CUDA_VISIBLE_DEVICES changed at run time.
const ProbeSpec kLibcProbes[] = {
    {"setenv", [](nccl* s) { return s->progs.libc_setenv_enter; }, nullptr},
};

std::vector<ProbeSpec> probes_for(LibraryKind kind) {
  switch (kind) {
    case LibraryKind::nccl: return {std::begin(kNcclProbes), std::end(kNcclProbes)};
    case LibraryKind::cudart: return {std::begin(kCudaProbes), std::end(kCudaProbes)};
    case LibraryKind::libc: return {std::begin(kLibcProbes), std::end(kLibcProbes)};
  }
  return {};
}

int libbpf_to_log(enum libbpf_print_level level, const char* format, va_list args) {
  log::Level ours = level == LIBBPF_WARN ? log::Level::warn : log::Level::debug;
  if (ours > log::level()) return 0;
  char message[1024];
  vsnprintf(message, sizeof(message), format, args);
  size_t len = strlen(message);
  while (len > 0 && message[len - 1] == '\n') message[--len] = '\0';
  log::write(ours, "%s", message);  // libbpf prefixes its own name
  return 0;
}

std::string bpf_failure(const char* what, int err) {
  std::string text = std::string(what) + ": " + strerror(err);
  if (err == EPERM || err == EACCES)
    text += ". Loading eBPF programs needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_RESOURCE); run the agent as root";
  return text;
}

}  // namespace

void route_libbpf_logs() { libbpf_set_print(libbpf_to_log); }

Result<std::vector<std::pair<std::string, uint64_t>>> find_function_offsets(const std::string& path,
                                                                            const std::vector<std::string>& names) {
  if (elf_version(EV_CURRENT) == EV_NONE) return make_error(Errc::system, "libelf is too old");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(Errc::io, "cannot open " + path + ": " + strerror(errno));
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  if (!elf) {
    ::close(fd);
    return make_error(Errc::io, path + " is not an ELF file: " + elf_errmsg(-1));
  }
  std::map<std::string, uint64_t> found;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr shdr;
    if (!gelf_getshdr(scn, &shdr) || (shdr.sh_type != SHT_DYNSYM && shdr.sh_type != SHT_SYMTAB)) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (!data || shdr.sh_entsize == 0) continue;
    size_t count = shdr.sh_size / shdr.sh_entsize;
    for (size_t i = 0; i < count; ++i) {
      GElf_Sym sym;
      if (!gelf_getsym(data, static_cast<int>(i), &sym)) continue;
      if (GELF_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_shndx == SHN_UNDEF || sym.st_value == 0) continue;
      const char* name = elf_strptr(elf, shdr.sh_link, sym.st_name);
      if (!name) continue;
      for (const auto& wanted : names) {
        if (wanted != name || found.count(wanted)) continue;
        // Uprobes take a file offset: translate the symbol's address through
        // the section that holds it.
        Elf_Scn* code = elf_getscn(elf, sym.st_shndx);
        GElf_Shdr code_hdr;
        if (code && gelf_getshdr(code, &code_hdr)) found[wanted] = sym.st_value - code_hdr.sh_addr + code_hdr.sh_offset;
      }
    }
  }
  elf_end(elf);
  ::close(fd);
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const auto& name : names) {
    auto it = found.find(name);
    if (it != found.end()) out.emplace_back(name, it->second);
  }
  return out;
}

namespace {

// Multi-uprobe links (BPF_TRACE_UPROBE_MULTI, Linux 6.6): one link puts a
// program on many offsets of one file. Removing a uprobe attached alone
// closes a perf event, which waits out RCU grace periods under a
// kernel-wide lock: about 115 ms apiece on this VM, so an agent with 85 of
// them took 10 s to stop (and a node's next agent waited behind it). A
// multi-uprobe link waits once, for all its uprobes, and outside that lock.
// Debian 12's UAPI headers and libbpf 1.1 predate it: the attach type, the
// flag and link_create's uprobe_multi member are the kernel's UAPI
// (include/uapi/linux/bpf.h), stable since 6.6.
constexpr uint32_t kTraceUprobeMulti = 48;        // enum bpf_attach_type: BPF_TRACE_UPROBE_MULTI
constexpr uint32_t kUprobeMultiReturn = 1u << 0;  // BPF_F_UPROBE_MULTI_RETURN
struct UprobeMultiLinkAttr {                      // union bpf_attr, BPF_LINK_CREATE
  uint32_t prog_fd, target_fd, attach_type, flags;
  uint64_t path, offsets, ref_ctr_offsets, cookies;  // uprobe_multi
  uint32_t cnt, multi_flags, pid, pad;
};
static_assert(sizeof(UprobeMultiLinkAttr) == 64);

int uprobe_multi_link(int prog_fd, const char* path, const std::vector<uint64_t>& offsets, bool ret) {
  UprobeMultiLinkAttr attr{};
  attr.prog_fd = static_cast<uint32_t>(prog_fd);
  attr.attach_type = kTraceUprobeMulti;
  attr.path = reinterpret_cast<uint64_t>(path);
  attr.offsets = reinterpret_cast<uint64_t>(offsets.data());
  attr.cnt = static_cast<uint32_t>(offsets.size());
  attr.multi_flags = ret ? kUprobeMultiReturn : 0;
  return static_cast<int>(syscall(__NR_bpf, BPF_LINK_CREATE, &attr, sizeof(attr)));
}

// Whether this kernel has multi-uprobe links: a program that does nothing,
// loaded for them, and a link to a path that is not a file, which such a
// kernel refuses with EBADF (the way libbpf probes for them).
bool have_uprobe_multi() {
  const bpf_insn insns[] = {{BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 0}, {BPF_JMP | BPF_EXIT, 0, 0, 0, 0}};
  LIBBPF_OPTS(bpf_prog_load_opts, opts, .expected_attach_type = static_cast<bpf_attach_type>(kTraceUprobeMulti));
  int prog = bpf_prog_load(BPF_PROG_TYPE_KPROBE, nullptr, "GPL", insns, 2, &opts);
  if (prog < 0) return false;
  int link = uprobe_multi_link(prog, "/", {0}, false);
  int err = errno;
  if (link >= 0) ::close(link);
  ::close(prog);
  return link < 0 && err == EBADF;
}

}  // namespace

Result<std::unique_ptr<NcclProbes>> NcclProbes::open(const Scope& scope, Handler handler, bool host_context,
                                                     bool multi_uprobes) {
  route_libbpf_logs();
  std::unique_ptr<NcclProbes> probes(new NcclProbes());
  probes->handler_ = std::move(handler);
  probes->skel_ = nccl__open();
  if (!probes->skel_) return make_error(Errc::system, bpf_failure("opening the NCCL BPF object", errno));
  probes->skel_->rodata->filter_netns_ino = scope.netns_ino;
  probes->skel_->rodata->filter_cgroup_id = scope.cgroup_id;
  probes->skel_->rodata->filter_cgroup_level = scope.cgroup_level;
  probes->skel_->rodata->filter_by_pid = scope.pids.empty() ? 0 : 1;
  probes->skel_->rodata->user_max_processes = scope.shares.processes;
  probes->skel_->rodata->user_max_comms = scope.shares.comms;
  probes->skel_->rodata->user_max_lanes = scope.shares.lanes;
  probes->skel_->rodata->user_max_threads = scope.shares.threads;
  if (!host_context) {
    bpf_program__set_autoload(probes->skel_->progs.sched_switch, false);
    bpf_program__set_autoload(probes->skel_->progs.sched_wakeup, false);
    bpf_program__set_autoload(probes->skel_->progs.tcp_retransmit, false);
  }
  // The uprobe programs are loaded for multi-uprobe links where the kernel
  // has them (a program loaded so attaches only that way).
  probes->multi_ = multi_uprobes && have_uprobe_multi();
  if (probes->multi_) {
    bpf_program* program = nullptr;
    bpf_object__for_each_program(program, probes->skel_->obj) {
      if (bpf_program__type(program) == BPF_PROG_TYPE_KPROBE)
        bpf_program__set_expected_attach_type(program, static_cast<bpf_attach_type>(kTraceUprobeMulti));
    }
  }
  if (int err = nccl__load(probes->skel_))
    return make_error(Errc::system, bpf_failure("loading the NCCL BPF programs", -err));
  for (uint32_t pid : scope.pids) {
    if (auto r = probes->allow_pid(pid); !r) return r.error();
  }
  // Process exits (exit code, killing signal) of the processes that used NCCL.
  // Without tp_btf support the agent still runs; it then only sees that a process is gone.
  if (bpf_link* exit_link = bpf_program__attach(probes->skel_->progs.process_exit))
    probes->links_.push_back(exit_link);
  else
    RS_LOG(warn, "no sched_process_exit tracepoint (%s): exit codes and signals of ranks will not be known",
           strerror(errno));
  if (host_context) {
    // Host context: CPU per cgroup, off-CPU and run-queue time of the calling
    // threads, TCP retransmits. Each is optional: without one the agent still traces NCCL.
    struct {
      bpf_program* program;
      const char* what;
    } host[] = {{probes->skel_->progs.sched_switch, "sched_switch (off-CPU time, run-queue latency, CPU per cgroup)"},
                {probes->skel_->progs.sched_wakeup, "sched_wakeup (run-queue latency after a sleep)"},
                {probes->skel_->progs.tcp_retransmit, "tcp_retransmit_skb (TCP retransmits per cgroup)"}};
    for (const auto& h : host) {
      if (bpf_link* link = bpf_program__attach(h.program)) {
        probes->links_.push_back(link);
        probes->host_probes_.emplace_back(h.what);
      } else {
        RS_LOG(warn, "no %s: %s", h.what, strerror(errno));
      }
    }
  }
  probes->ring_ = ring_buffer__new(bpf_map__fd(probes->skel_->maps.events), &NcclProbes::on_record, probes.get(),
                                   nullptr);
  if (!probes->ring_) return make_error(Errc::system, bpf_failure("creating the ring buffer reader", errno));
  return probes;
}

NcclProbes::~NcclProbes() {
  for (bpf_link* link : links_) bpf_link__destroy(link);
  // Each multi-uprobe link waits out its grace periods as it closes (40-50
  // ms on this VM); closed side by side, they wait them out together.
  std::atomic<size_t> next{0};
  auto close_links = [&] {
    for (size_t i; (i = next.fetch_add(1)) < multi_links_.size();) ::close(multi_links_[i]);
  };
  std::vector<std::thread> closers;
  try {
    for (size_t t = 1; t < std::min<size_t>(16, multi_links_.size()); ++t) closers.emplace_back(close_links);
  } catch (const std::system_error&) {  // no thread: the rest are closed here
  }
  close_links();
  for (auto& closer : closers) closer.join();
  if (ring_) ring_buffer__free(ring_);
  if (skel_) nccl__destroy(skel_);
}

Result<AttachedLibrary> NcclProbes::attach(const LibraryFile& library) {
  std::vector<ProbeSpec> specs = probes_for(library.kind);
  std::vector<std::string> names;
  for (const auto& spec : specs) names.emplace_back(spec.symbol);
  auto offsets = find_function_offsets(library.path, names);
  if (!offsets) return offsets.error();
  AttachedLibrary attached;
  attached.path = library.path;
  attached.kind = library.kind;
  std::map<std::string, uint64_t> by_name(offsets->begin(), offsets->end());
  std::vector<std::pair<const ProbeSpec*, uint64_t>> found;
  for (const auto& spec : specs) {
    auto it = by_name.find(spec.symbol);
    if (it == by_name.end())
      attached.missing.emplace_back(spec.symbol);
    else
      found.emplace_back(&spec, it->second);
  }
  if (found.empty())
    return make_error(Errc::not_found, library.path + " exports none of the functions rankscope probes");
  // A library is traced whole or not at all: where one probe fails, those
  // attached before it are removed, so that "not tracing" is true.
  const size_t multi_before = multi_links_.size(), links_before = links_.size();
  auto failed = [&](const char* what, int err) {
    for (size_t i = multi_before; i < multi_links_.size(); ++i) ::close(multi_links_[i]);
    multi_links_.resize(multi_before);
    for (size_t i = links_before; i < links_.size(); ++i) bpf_link__destroy(links_[i]);
    links_.resize(links_before);
    return make_error(Errc::system, bpf_failure(what, err));
  };
  // The return probes first: a call running while the two go on then has
  // neither seen, or only its return (ignored: no call open); with the
  // entry first, one could be seen entering and never returning.
  if (multi_) {
    // One link per program and file.
    std::map<bpf_program*, std::vector<uint64_t>> returns, entries;
    for (const auto& [spec, offset] : found) {
      if (spec->return_program) returns[spec->return_program(skel_)].push_back(offset);
      entries[spec->program(skel_)].push_back(offset);
    }
    for (auto* group : {&returns, &entries})
      for (const auto& [program, at] : *group) {
        int link = uprobe_multi_link(bpf_program__fd(program), library.path.c_str(), at, group == &returns);
        if (link < 0) return failed(("multi-uprobe link on " + library.path).c_str(), errno);
        multi_links_.push_back(link);
      }
  } else {
    for (const auto& [spec, offset] : found) {
      if (spec->return_program) {
        bpf_link* ret = bpf_program__attach_uprobe(spec->return_program(skel_), true, -1, library.path.c_str(), offset);
        if (!ret) return failed(("uretprobe on " + std::string(spec->symbol)).c_str(), errno);
        links_.push_back(ret);
      }
      bpf_link* entry = bpf_program__attach_uprobe(spec->program(skel_), false, -1, library.path.c_str(), offset);
      if (!entry) return failed(("uprobe on " + std::string(spec->symbol)).c_str(), errno);
      links_.push_back(entry);
    }
  }
  for (const auto& [spec, offset] : found) attached.functions.emplace_back(spec->symbol);
  libraries_.push_back(attached);
  return attached;
}

NcclProbes::TableEntries NcclProbes::table_entries(uint32_t pid) const {
  TableEntries out;
  rs_comm_key comm_key{}, comm_next{};
  int fd = bpf_map__fd(skel_->maps.comms);
  void* previous = nullptr;
  while (bpf_map_get_next_key(fd, previous, &comm_next) == 0) {
    out.comms += comm_next.pid == pid ? 1 : 0;
    comm_key = comm_next;
    previous = &comm_key;
  }
  // A point-to-point lane's key begins with the process's pid (struct p2p_key).
  std::vector<uint8_t> p2p_key(bpf_map__key_size(skel_->maps.p2p_seqs)), p2p_next(p2p_key.size());
  previous = nullptr;
  while (bpf_map_get_next_key(bpf_map__fd(skel_->maps.p2p_seqs), previous, p2p_next.data()) == 0) {
    uint32_t key_pid = 0;
    std::memcpy(&key_pid, p2p_next.data(), sizeof(key_pid));
    out.p2p += key_pid == pid ? 1 : 0;
    p2p_key = p2p_next;
    previous = p2p_key.data();
  }
  auto count_threads = [&](bpf_map* map) {
    size_t n = 0;
    uint64_t key = 0, next = 0;
    void* prev = nullptr;
    while (bpf_map_get_next_key(bpf_map__fd(map), prev, &next) == 0) {
      n += (next >> 32) == pid ? 1 : 0;
      key = next;
      prev = &key;
    }
    return n;
  };
  uint32_t tid = 0, next_tid = 0;
  void* prev_tid = nullptr;
  int threads_fd = bpf_map__fd(skel_->maps.threads);
  while (bpf_map_get_next_key(threads_fd, prev_tid, &next_tid) == 0) {
    rs_thread_sched t{};
    if (bpf_map_lookup_elem(threads_fd, &next_tid, &t) == 0 && t.tgid == pid) ++out.threads;
    tid = next_tid;
    prev_tid = &tid;
  }
  uint32_t process_key = pid;
  rs_host_stats stats{};
  out.processes = bpf_map__lookup_elem(skel_->maps.nccl_processes, &process_key, sizeof(process_key), &stats,
                                       sizeof(stats), 0) == 0;
  out.waits = count_threads(skel_->maps.waits);
  return out;
}

namespace {
size_t count_keys(bpf_map* map) {
  std::vector<uint8_t> key(bpf_map__key_size(map)), next(bpf_map__key_size(map));
  size_t n = 0;
  void* previous = nullptr;
  while (bpf_map_get_next_key(bpf_map__fd(map), previous, next.data()) == 0) {
    ++n;
    key = next;
    previous = key.data();
  }
  return n;
}
}  // namespace

std::optional<NcclProbes::UserUse> NcclProbes::user_use(uint32_t uid) const {
  UserUse use;  // bpf/nccl.bpf.c, struct user_share: four u32, in this order
  static_assert(sizeof(UserUse) == 16, "user_share layout");
  if (bpf_map__lookup_elem(skel_->maps.user_shares, &uid, sizeof(uid), &use, sizeof(use), 0) != 0) return std::nullopt;
  return use;
}

NcclProbes::TableSizes NcclProbes::table_sizes() const {
  TableSizes out;
  out.processes = count_keys(skel_->maps.nccl_processes);
  out.threads = count_keys(skel_->maps.threads);
  out.comms = count_keys(skel_->maps.comms);
  out.p2p = count_keys(skel_->maps.p2p_seqs);
  out.waits = count_keys(skel_->maps.waits);
  // comm_slots is an array: the slots past the ones ever taken are unused.
  uint64_t taken = skel_->bss ? skel_->bss->comm_slots_taken : 0;
  uint32_t slots = bpf_map__max_entries(skel_->maps.comm_slots);
  out.comm_slots_made = static_cast<size_t>(std::min<uint64_t>(taken, slots));
  rs_comm_slot slot{};
  for (uint32_t i = 0; i < out.comm_slots_made; ++i)
    if (bpf_map__lookup_elem(skel_->maps.comm_slots, &i, sizeof(i), &slot, sizeof(slot), 0) == 0 && slot.pid != 0)
      ++out.comm_slots;
  return out;
}

std::optional<rs_host_stats> NcclProbes::host_stats(uint32_t pid) const {
  rs_host_stats stats{};
  if (bpf_map__lookup_elem(skel_->maps.nccl_processes, &pid, sizeof(pid), &stats, sizeof(stats), 0) != 0)
    return std::nullopt;
  return stats;
}

namespace {
// Every (u64 key, value) of a hash map; `limit` guards against a map that
// keeps changing under the walk.
template <typename Value>
std::vector<std::pair<uint64_t, Value>> dump_map(bpf_map* map, size_t limit) {
  std::vector<std::pair<uint64_t, Value>> out;
  int fd = bpf_map__fd(map);
  __u64 key = 0, next = 0;
  __u64* previous = nullptr;
  while (bpf_map_get_next_key(fd, previous, &next) == 0 && out.size() <= limit) {
    Value value{};
    if (bpf_map_lookup_elem(fd, &next, &value) == 0) out.emplace_back(next, value);
    key = next;
    previous = &key;
  }
  return out;
}
}  // namespace

std::vector<std::pair<uint64_t, rs_cgroup_stats>> NcclProbes::cgroup_stats() const {
  return dump_map<rs_cgroup_stats>(skel_->maps.cgroup_stats, 100000);  // the map holds at most 8192
}

std::vector<std::pair<uint64_t, rs_open_wait>> NcclProbes::open_waits() const {
  return dump_map<rs_open_wait>(skel_->maps.waits, 100000);  // the map holds at most 65536
}

Result<void> NcclProbes::allow_pid(uint32_t pid) {
  uint8_t one = 1;
  if (bpf_map__update_elem(skel_->maps.traced_pids, &pid, sizeof(pid), &one, sizeof(one), BPF_ANY) != 0)
    return make_error(Errc::system, "cannot add pid " + std::to_string(pid) + " to the BPF scope: " + strerror(errno));
  return {};
}

int NcclProbes::poll(int timeout_ms) {
  int n = ring_buffer__poll(ring_, timeout_ms);
  return n < 0 ? 0 : n;
}

int NcclProbes::consume() {
  int n = ring_buffer__consume(ring_);
  return n < 0 ? 0 : n;
}

int NcclProbes::wait_fd() const { return ring_buffer__epoll_fd(ring_); }

int NcclProbes::on_record(void* self, void* data, size_t size) {
  static_cast<NcclProbes*>(self)->handler_(data, size);
  return 0;
}

DropCounts NcclProbes::drops() const {
  int cpus = libbpf_num_possible_cpus();
  std::vector<uint64_t> values(cpus > 0 ? cpus : 1);
  auto sum = [&](uint32_t slot) {
    uint64_t total = 0;
    if (bpf_map__lookup_elem(skel_->maps.drops, &slot, sizeof(slot), values.data(), values.size() * sizeof(uint64_t),
                             0) == 0)
      for (uint64_t v : values) total += v;
    return total;
  };
  DropCounts out;
  out.ringbuf_full = sum(RS_DROP_RINGBUF_FULL);
  out.map_full = sum(RS_DROP_MAP_FULL);
  out.nested = sum(RS_DROP_NESTED);
  out.lost_returns = sum(RS_DROP_LOST_RETURN);
  out.user_share = sum(RS_DROP_USER_SHARE);
  return out;
}

}  // namespace rankscope::agent
