// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Probes on the host side of GPU work: NCCL's API and the CUDA runtime's
 * synchronize calls.
 *
 * NCCL: an entry uprobe per NCCL API function and one shared return
 * probe. The entry probe decodes the arguments (System V x86-64 calling
 * convention: integer arguments in rdi, rsi, rdx, rcx, r8, r9, the rest on
 * the stack above the return address) into a per-thread slot; the
 * return probe adds the result and the return time and emits one record.
 *
 * Sequence numbers are assigned here, per (process, communicator, lane), so a
 * record lost to a full ring buffer leaves a visible gap instead of shifting
 * every later number (collectives are matched across ranks by sequence).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "bpf/nccl_events.h"

/* libbpf 1.1 (Debian 12) defines PT_REGS_PARM1..5 only; the sixth integer
 * argument of the x86-64 System V ABI is in r9. */
#ifndef PT_REGS_PARM6
#define PT_REGS_PARM6(x) (((struct pt_regs *)(x))->r9)
#endif

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Scope: which processes this agent speaks for (several agents on one kernel
 * act as several nodes in tests). Zero means "no filter". */
const volatile __u32 filter_netns_ino = 0;
const volatile __u64 filter_cgroup_id = 0;
const volatile __u32 filter_cgroup_level = 0;
const volatile __u8 filter_by_pid = 0;

/* Each user's share of the tables every traced process shares: set by
 * the agent (--user-table-share); unset, the whole table. */
const volatile __u32 user_max_processes = RS_PROCESSES;
const volatile __u32 user_max_comms = RS_COMM_SLOTS;
const volatile __u32 user_max_lanes = RS_P2P_LANES;
const volatile __u32 user_max_threads = RS_THREADS;

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 4 * 1024 * 1024);
} events SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, RS_DROP_MAX);
  __type(key, __u32);
  __type(value, __u64);
} drops SEC(".maps");

static __always_inline void drops__count(__u32 reason)
{
  __u64 *slot = bpf_map_lookup_elem(&drops, &reason);
  if (slot)
    *slot += 1;
}

/* Processes to trace when filter_by_pid is set (filled by the agent). */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 4096);
  __type(key, __u32);
  __type(value, __u8);
} traced_pids SEC(".maps");

struct pending_call {
  __u64 entry_ns;
  __u64 comm;
  __u64 count;
  __u64 seq;
  __u64 comm_out;    /* ncclComm_t* to read at return (communicator creation) */
  __u64 parent_comm; /* CommSplit */
  __s32 peer;
  __s32 nranks;
  __s32 rank;
  __s32 color;
  __s32 key;
  __u32 lane;
  __u32 group_id;
  __u32 nested;      /* NCCL API calls made from inside this one */
  __u32 reserved0;
  __u64 entry_sp;    /* the stack pointer at entry: a call made from inside this one is below it */
  __u8 op;
  __u8 datatype;
  __u8 redop;
  __u8 flags;
  __u8 unique_id[RS_UNIQUE_ID_BYTES];
};

/* A communicator a thread called lately, and its slot in comm_slots. */
#define RS_THREAD_COMMS 4

struct thread_comm {
  __u64 comm;
  __u32 slot;
  __u32 reserved;
};

/* Per thread, in task-local storage: the NCCL API call in progress (one at a
 * time; `open` says whether it is) and the GroupStart/GroupEnd nesting. The
 * slot is made at the thread's first NCCL call, reused by every later call
 * (no insert and delete per call) and freed by the kernel with the thread.
 * It also caches what only needs deciding once per thread: that the thread is
 * in this agent's scope (a slot is only made for one that is) and that its
 * process and scheduling rows exist. */
struct thread_calls {
  struct pending_call call;
  struct thread_comm recent[RS_THREAD_COMMS]; /* the communicators it called last, and their slots */
  __u32 recent_next;  /* the entry replaced next */
  __u32 reserved0;
  __u64 cgroup_id;    /* the thread's cgroup, as last read */
  __u64 cgroup_at_ns; /* when: call records reuse it for up to a second */
  __u32 group_depth;
  __u32 group_id;
  __u8 open;
  __u8 sched_noted; /* its scheduling is followed (threads map) */
  __u8 reserved[6];
};

struct {
  __uint(type, BPF_MAP_TYPE_TASK_STORAGE);
  __uint(map_flags, BPF_F_NO_PREALLOC);
  __type(key, int);
  __type(value, struct thread_calls);
} calls SEC(".maps");

/* A communicator's numbering lives in a slot of an array, named by its
 * index in `comms` (keyed by process and ncclComm_t). A thread remembers
 * the slots of the last few communicators it called, so a call on one of
 * them skips the hash lookup: an array element is reached by an index
 * check and an add, and the slot itself says whom it numbers (a slot freed
 * or given to another communicator is seen as such). The counter is in the
 * slot, shared by every thread of the process. */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, RS_COMM_SLOTS);
  __type(key, struct rs_comm_key);
  __type(value, __u32); /* index in comm_slots */
} comms SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, RS_COMM_SLOTS);
  __type(key, __u32);
  __type(value, struct rs_comm_slot);
} comm_slots SEC(".maps");

/* Slots given back (communicator destroyed, process gone), reused first. */
struct {
  __uint(type, BPF_MAP_TYPE_QUEUE);
  __uint(max_entries, RS_COMM_SLOTS);
  __type(value, __u32);
} free_comm_slots SEC(".maps");

/* Slots never used yet start here (64 bits: failed takes past the end
 * never wrap it around). */
__u64 comm_slots_taken = 0;

struct p2p_key {
  __u32 pid;
  __u32 lane;
  __u64 comm;
  __u64 epoch;
};

/* Point-to-point lanes are many and never destroyed explicitly: LRU. */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, RS_P2P_LANES);
  __type(key, struct p2p_key);
  __type(value, __u64);
} p2p_seqs SEC(".maps");

/* Processes that called NCCL or a CUDA wait: their exit is reported (and
 * only theirs), and their entries in the tables below are removed then. */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, RS_PROCESSES);
  __type(key, __u32);
  __type(value, struct rs_host_stats);
} nccl_processes SEC(".maps");

/* The threads that called NCCL or waited on the GPU (struct rs_thread_sched). */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, RS_THREADS);
  __type(key, __u32); /* tid */
  __type(value, struct rs_thread_sched);
} threads SEC(".maps");

/* Every traced process: its user, and what it holds in the tables that
 * every traced process shares. Its exit removes its entries of `comms` and
 * `p2p_seqs` by walking the table whole, every bucket (their keys begin
 * with the process, but a hash table has no order): 393,216 buckets, some
 * milliseconds. A process that destroyed its communicators and never sent
 * point to point walks neither. (Walking these two and the two tables
 * keyed by thread at every exit took 6.1 ms a process on the development
 * machine.) */
struct process_tables {
  __u32 uid;     /* its user when it was first traced: whose share it counts in */
  __u32 comms;   /* entries in `comms` (made less destroyed) */
  __u32 lanes;   /* entries made in `p2p_seqs` (LRU: some may have gone since) */
  __u32 threads; /* entries in `threads` (made less exited) */
};

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, RS_PROCESSES);
  __type(key, __u32); /* tgid */
  __type(value, struct process_tables);
} process_tables SEC(".maps");

/* Any user of a node can run a program that calls NCCL (a stand-in
 * libnccl.so is enough), and the tables above are shared by every traced
 * process: one user making processes, communicators, point-to-point lanes
 * or threads without end would fill them, and the other users' jobs would
 * go untraced (the LRU tables would evict their rows). So each user holds
 * at most its share of each; past it, its new ones are not traced (counted
 * as RS_DROP_USER_SHARE). */
struct user_share {
  __u32 processes;
  __u32 comms;
  __u32 lanes;
  __u32 threads;
};

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 4096);
  __type(key, __u32); /* uid */
  __type(value, struct user_share);
} user_shares SEC(".maps");

/* The row of `key` in a hash map, made from `fresh` if it has none (NULL:
 * the map is full). */
static __always_inline void *map__row(void *map, const void *key, const void *fresh)
{
  void *row = bpf_map_lookup_elem(map, key);
  if (row)
    return row;
  bpf_map_update_elem(map, key, fresh, BPF_NOEXIST);
  return bpf_map_lookup_elem(map, key);
}

static __always_inline struct user_share *user__share(__u32 uid)
{
  struct user_share fresh = {};
  return map__row(&user_shares, &uid, &fresh);
}

/* Takes one from `used` if it is under `max`; counts the drop if not.
 * (Processes of one user racing on several CPUs may pass it by a few.) */
static __always_inline bool share__take(__u32 *used, __u32 max)
{
  if (*used >= max) {
    drops__count(RS_DROP_USER_SHARE);
    return false;
  }
  __sync_fetch_and_add(used, 1);
  return true;
}

static __always_inline void share__give_back(__u32 *used, __u32 n)
{
  if (n)
    __sync_fetch_and_add(used, -n); /* an atomic add is all the BPF ISA has */
}

/* User namespaces nest at most 32 deep (the kernel's limit). */
#define RS_USER_NS_DEPTH 32

/* The user whose share the calling process counts in: its kernel uid, or,
 * where it runs in a user namespace an unprivileged user made, that user.
 * Such a user can map the subordinate uids /etc/subuid gives it (rootless
 * containers: tens of thousands) and run a process as each; counted by
 * kernel uid, every one would hold a share of its own. Of the namespaces
 * from the process's out, the outermost one made by a user other than root
 * names it. A namespace made by root (a container runtime's, for a pod
 * with user namespaces) keeps its processes' own uids: root chose them. */
static __always_inline __u32 share__user(void)
{
  __u32 uid = (__u32)bpf_get_current_uid_gid();
  struct task_struct *task = bpf_get_current_task_btf();
  struct user_namespace *ns = BPF_CORE_READ(task, cred, user_ns);
  for (int i = 0; i < RS_USER_NS_DEPTH && ns; i++) {
    if (BPF_CORE_READ(ns, level) == 0)
      break; /* the initial namespace */
    __u32 owner = BPF_CORE_READ(ns, owner.val);
    if (owner != 0)
      uid = owner;
    ns = BPF_CORE_READ(ns, parent);
  }
  return uid;
}

/* The row of a traced process, made at its first NCCL call or CUDA wait
 * within its user's share of processes; NULL when it is over the share (or
 * a table is full): the process is not traced. */
static __always_inline struct process_tables *process__admit(__u32 tgid)
{
  struct process_tables *t = bpf_map_lookup_elem(&process_tables, &tgid);
  if (t)
    return t;
  __u32 uid = share__user();
  struct user_share *share = user__share(uid);
  if (!share) {
    drops__count(RS_DROP_MAP_FULL);
    return NULL;
  }
  if (share->processes >= user_max_processes) {
    drops__count(RS_DROP_USER_SHARE);
    return NULL;
  }
  struct process_tables fresh = {.uid = uid};
  if (bpf_map_update_elem(&process_tables, &tgid, &fresh, BPF_NOEXIST) == 0)
    __sync_fetch_and_add(&share->processes, 1);
  t = bpf_map_lookup_elem(&process_tables, &tgid);
  if (!t)
    drops__count(RS_DROP_MAP_FULL);
  return t;
}

/* The share of the user a traced process counts in (NULL: not traced). */
static __always_inline struct user_share *share__of(struct process_tables *t)
{
  return t ? bpf_map_lookup_elem(&user_shares, &t->uid) : NULL;
}

/* Notes a process (and, with calling_thread, the calling thread, whose
 * scheduling is then followed): false when it is not admitted. Once per
 * thread, off the calls' path: a function of its own, not inlined into
 * every probe. (Inlined, with the user shares, the probes' programs grew
 * by half and each call took 20-85 ns more in them, their path through
 * the same instructions spread over more of the JIT image.) */
static __noinline bool processes__note(__u64 pid_tgid, bool calling_thread)
{
  __u32 tgid = pid_tgid >> 32;
  __u32 tid = (__u32)pid_tgid;
  struct process_tables *tables = process__admit(tgid);
  if (!tables)
    return false;
  struct rs_host_stats fresh_stats = {};
  struct rs_host_stats *stats = map__row(&nccl_processes, &tgid, &fresh_stats);
  if (!stats)
    return true;
  if (!calling_thread || bpf_map_lookup_elem(&threads, &tid))
    return true;
  struct user_share *share = share__of(tables);
  if (!share || !share__take(&share->threads, user_max_threads))
    return true; /* traced, its scheduling not followed */
  struct task_struct *task = (struct task_struct *)bpf_get_current_task();
  struct rs_thread_sched fresh = {.tgid = tgid, .last_maj_flt = BPF_CORE_READ(task, maj_flt)};
  if (bpf_map_update_elem(&threads, &tid, &fresh, BPF_NOEXIST) == 0) {
    __sync_fetch_and_add(&stats->threads, 1);
    __sync_fetch_and_add(&tables->threads, 1);
  } else {
    share__give_back(&share->threads, 1);
  }
  return true;
}


static __always_inline bool scope__in(__u32 pid)
{
  if (filter_by_pid && !bpf_map_lookup_elem(&traced_pids, &pid))
    return false;
  if (filter_netns_ino) {
    struct task_struct *task = (struct task_struct *)bpf_get_current_task();
    if (BPF_CORE_READ(task, nsproxy, net_ns, ns.inum) != filter_netns_ino)
      return false;
  }
  if (filter_cgroup_id && bpf_get_current_ancestor_cgroup_id(filter_cgroup_level) != filter_cgroup_id)
    return false;
  return true;
}

static __always_inline __u64 args__stack(struct pt_regs *ctx, int slot)
{
  /* At the first instruction of the callee, rsp points at the return
   * address; the first stack-passed argument is the next eight bytes. */
  __u64 value = 0;
  bpf_probe_read_user(&value, sizeof(value), (void *)(PT_REGS_SP(ctx) + 8 * (slot + 1)));
  return value;
}

static __always_inline void header__fill_cgroup(struct rs_event_header *hdr, __u64 pid_tgid, __u16 kind, __u64 ts_ns,
                                                __u64 cgroup_id)
{
  hdr->ts_ns = ts_ns;
  hdr->cgroup_id = cgroup_id;
  hdr->pid = pid_tgid >> 32;
  hdr->tid = (__u32)pid_tgid;
  hdr->kind = kind;
  hdr->reserved0 = 0;
  hdr->reserved1 = 0;
}

static __always_inline void header__fill(struct rs_event_header *hdr, __u64 pid_tgid, __u16 kind)
{
  header__fill_cgroup(hdr, pid_tgid, kind, bpf_ktime_get_ns(), bpf_get_current_cgroup_id());
  bpf_get_current_comm(hdr->comm, sizeof(hdr->comm));
}

/* This thread's slot, made at its first NCCL call if it is in scope and its
 * process is admitted (NULL otherwise). Making it notes the process (its
 * exit is then reported). */
static __always_inline struct thread_calls *thread__slot(__u64 pid_tgid, bool create)
{
  struct task_struct *task = bpf_get_current_task_btf();
  struct thread_calls *t = bpf_task_storage_get(&calls, task, 0, 0);
  if (t || !create)
    return t;
  if (!scope__in(pid_tgid >> 32) || !processes__note(pid_tgid, false))
    return NULL;
  t = bpf_task_storage_get(&calls, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
  if (!t)
    drops__count(RS_DROP_MAP_FULL);
  return t;
}

/* Past this, an open slot that sees another entry from a stack at or
 * below its own was left open by a return never seen, not nested in. */
#define RS_NESTED_WITHIN_NS 1000000000ull

/* Opens the call slot of this thread, or notes a nested call in the one
 * already open (NCCL's own public entry points call each other, e.g.
 * ncclBcast -> ncclBroadcast; the user made one call).
 *
 * A slot can also be open because its call's return was never seen: an
 * agent that attaches to a busy process puts the entry probe on a function
 * before its return probe, and a call entered in between returns unseen.
 * Left so, every later call of the thread would look nested and be lost.
 * A nested call is made from inside the open one: from deeper in the stack
 * (a lower stack pointer) and while it runs; an entry from the same depth or
 * above, or long after, is a new call: the old one is counted as a lost
 * return and the slot starts afresh. */
static __always_inline struct thread_calls *pending__open(struct pt_regs *ctx, __u64 pid_tgid, __u8 op)
{
  struct thread_calls *t = thread__slot(pid_tgid, true);
  if (!t)
    return NULL;
  struct pending_call *p = &t->call;
  __u64 sp = PT_REGS_SP(ctx);
  if (t->open) {
    if (sp < p->entry_sp && bpf_ktime_get_ns() - p->entry_ns < RS_NESTED_WITHIN_NS) {
      p->nested += 1;
      drops__count(RS_DROP_NESTED);
      return NULL;
    }
    drops__count(RS_DROP_LOST_RETURN);
  }
  /* A watchdog thread polling for errors is not on the collectives' path:
   * only the threads that make calls have their scheduling followed. */
  if (!t->sched_noted && op != RS_OP_COMM_GET_ASYNC_ERROR) {
    processes__note(pid_tgid, true);
    t->sched_noted = 1;
  }
  t->open = 1;
  /* Only what every call sets or reads; the fields of the communicator
   * calls are cleared by init__enter, off the collectives' path. */
  p->entry_ns = bpf_ktime_get_ns();
  p->entry_sp = sp;
  p->seq = 0;
  p->lane = 0;
  p->group_id = 0;
  p->nested = 0;
  p->op = op;
  p->flags = 0;
  if (t->group_depth > 0) {
    p->flags = RS_CALL_IN_GROUP;
    p->group_id = t->group_id;
  }
  return t;
}

/* A slot no communicator uses, or -1 when all are taken. */
static __always_inline __s64 slot__take(void)
{
  __u32 index;
  if (bpf_map_pop_elem(&free_comm_slots, &index) == 0)
    return index;
  __u64 fresh = __sync_fetch_and_add(&comm_slots_taken, 1);
  return fresh < RS_COMM_SLOTS ? (__s64)fresh : -1;
}

static __always_inline void slot__give_back(__u32 index)
{
  struct rs_comm_slot* slot = bpf_map_lookup_elem(&comm_slots, &index);
  if (!slot)
    return;
  slot->pid = 0;
  slot->comm = 0;
  bpf_map_push_elem(&free_comm_slots, &index, 0);
}

static __always_inline void slot__start(struct rs_comm_slot* slot, __u32 pid, __u64 comm, __u64 epoch) {
  slot->next_seq = 0;
  slot->epoch = epoch;
  slot->comm = comm;
  slot->pid = pid;
}

/* The slot numbering (pid, comm), made for it when it has none: a
 * communicator met first in a call (created before the agent attached, or
 * its creation lost) is numbered from here with epoch 0. With `restart`
 * (its creation seen), numbering starts again from 0 at `epoch`. A call
 * finds its slot in its thread's recent ones first: this is off the calls'
 * path, a function of its own (not inlined) like processes__note. */
static __noinline struct rs_comm_slot* comm__slot(__u32 pid, __u64 comm, bool restart, __u64 epoch,
                                                  __u32* slot_index) {
  struct rs_comm_key key = {.pid = pid, .comm = comm};
  __u32 *mapped = bpf_map_lookup_elem(&comms, &key);
  __u32 index;
  struct rs_comm_slot* slot;
  if (!mapped) {
    /* A new communicator, within its user's share. */
    struct process_tables *tables = bpf_map_lookup_elem(&process_tables, &pid);
    struct user_share *share = share__of(tables);
    if (!tables || !share) {
      drops__count(RS_DROP_MAP_FULL);
      return NULL;
    }
    if (!share__take(&share->comms, user_max_comms))
      return NULL;
    __s64 taken = slot__take();
    if (taken < 0) {
      share__give_back(&share->comms, 1);
      drops__count(RS_DROP_MAP_FULL);
      return NULL;
    }
    index = (__u32)taken;
    slot = bpf_map_lookup_elem(&comm_slots, &index);
    if (!slot) {
      share__give_back(&share->comms, 1);
      return NULL;
    }
    slot__start(slot, pid, comm, epoch);
    if (bpf_map_update_elem(&comms, &key, &index, BPF_NOEXIST) == 0) {
      __sync_fetch_and_add(&tables->comms, 1);
      *slot_index = index;
      return slot;
    }
    /* Another thread mapped it first (or the table is full): use its. */
    share__give_back(&share->comms, 1);
    slot__give_back(index);
    mapped = bpf_map_lookup_elem(&comms, &key);
    if (!mapped) {
      drops__count(RS_DROP_MAP_FULL);
      return NULL;
    }
  }
  index = *mapped;
  slot = bpf_map_lookup_elem(&comm_slots, &index);
  if (!slot)
    return NULL;
  if (restart)
    slot__start(slot, pid, comm, epoch);
  *slot_index = index;
  return slot;
}

/* Forgets (pid, comm): its slot is given back. */
static __always_inline void comm__forget(__u32 pid, __u64 comm)
{
  struct rs_comm_key key = {.pid = pid, .comm = comm};
  __u32 *mapped = bpf_map_lookup_elem(&comms, &key);
  if (!mapped)
    return;
  __u32 index = *mapped;
  if (bpf_map_delete_elem(&comms, &key) == 0) {
    struct process_tables *tables = bpf_map_lookup_elem(&process_tables, &pid);
    struct user_share *share = share__of(tables);
    if (tables)
      share__give_back(&tables->comms, 1);
    if (share)
      share__give_back(&share->comms, 1);
  }
  slot__give_back(index);
}

/* The slot of the communicator of this call: from the thread's recent ones
 * when it is there and still numbers it, else from `comms` (and remembered). */
static __always_inline struct rs_comm_slot* comm__slot_for_call(struct thread_calls* t, __u32 pid, __u64 comm) {
  for (int i = 0; i < RS_THREAD_COMMS; i++) {
    if (t->recent[i].comm != comm)
      continue;
    __u32 index = t->recent[i].slot;
    struct rs_comm_slot* slot = bpf_map_lookup_elem(&comm_slots, &index);
    if (slot && slot->pid == pid && slot->comm == comm)
      return slot;
    break;
  }
  __u32 index = 0;
  struct rs_comm_slot* slot = comm__slot(pid, comm, false, 0, &index);
  if (slot) {
    __u32 i = t->recent_next % RS_THREAD_COMMS;
    t->recent_next = i + 1;
    if (i < RS_THREAD_COMMS) {
      t->recent[i].comm = comm;
      t->recent[i].slot = index;
    }
  }
  return slot;
}

/* Numbers the call; false when its communicator or lane could not be
 * numbered (a table full, or its user over its share): then it is not
 * recorded, as a record numbered wrongly would match the wrong calls. */
static __always_inline bool seq__assign(struct thread_calls *t, __u32 pid)
{
  struct pending_call *p = &t->call;
  struct rs_comm_slot* state = comm__slot_for_call(t, pid, p->comm);
  if (!state)
    return false;
  if (state->epoch == 0)
    p->flags |= RS_CALL_UNKNOWN_COMM;
  if (p->lane == 0) {
    p->seq = __sync_fetch_and_add(&state->next_seq, 1);
    return true;
  }
  struct p2p_key pkey = {.pid = pid, .lane = p->lane, .comm = p->comm, .epoch = state->epoch};
  __u64 *next = bpf_map_lookup_elem(&p2p_seqs, &pkey);
  if (!next) {
    /* A new lane, within its user's share. */
    struct process_tables *tables = bpf_map_lookup_elem(&process_tables, &pid);
    struct user_share *share = share__of(tables);
    if (!tables || !share) {
      drops__count(RS_DROP_MAP_FULL);
      return false;
    }
    if (!share__take(&share->lanes, user_max_lanes))
      return false;
    __u64 first = 0;
    if (bpf_map_update_elem(&p2p_seqs, &pkey, &first, BPF_NOEXIST) == 0)
      __sync_fetch_and_add(&tables->lanes, 1);
    else
      share__give_back(&share->lanes, 1);
    next = bpf_map_lookup_elem(&p2p_seqs, &pkey);
    if (!next) {
      drops__count(RS_DROP_MAP_FULL);
      return false;
    }
  }
  p->seq = __sync_fetch_and_add(next, 1);
  return true;
}

/* Common body of every collective and point-to-point entry probe. The
 * stream argument is not read: nothing downstream uses it, and as the
 * seventh argument of most collectives it sits on the stack, where reading
 * it was a third of this probe's time. */
static __always_inline int call__enter(struct pt_regs *ctx, __u8 op, __u64 count, __u64 datatype, __u64 redop,
                                       __s32 peer, __u64 comm)
{
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  struct thread_calls *t = pending__open(ctx, pid_tgid, op);
  if (!t)
    return 0;
  struct pending_call *p = &t->call;
  p->count = count;
  p->datatype = (__u8)datatype;
  p->redop = (__u8)redop;
  p->peer = peer;
  p->comm = comm;
  if (op == RS_OP_SEND || op == RS_OP_RECV)
    p->lane = RS_P2P_LANE(peer, op == RS_OP_RECV);
  if (!seq__assign(t, pid_tgid >> 32))
    t->open = 0; /* not recorded: its return finds the slot closed */
  return 0;
}

/* ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_allreduce_enter)
{
  return call__enter(ctx, RS_OP_ALLREDUCE, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), -1,
                     PT_REGS_PARM6(ctx));
}

/* ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_reducescatter_enter)
{
  return call__enter(ctx, RS_OP_REDUCESCATTER, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), -1,
                     PT_REGS_PARM6(ctx));
}

/* ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_reduce_enter)
{
  return call__enter(ctx, RS_OP_REDUCE, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx),
                     (__s32)PT_REGS_PARM6(ctx), args__stack(ctx, 0));
}

/* ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_broadcast_enter)
{
  return call__enter(ctx, RS_OP_BROADCAST, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0, (__s32)PT_REGS_PARM5(ctx),
                     PT_REGS_PARM6(ctx));
}

/* ncclGather / ncclScatter(sendbuff, recvbuff, count, datatype, root, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_gather_enter)
{
  return call__enter(ctx, RS_OP_GATHER, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0, (__s32)PT_REGS_PARM5(ctx),
                     PT_REGS_PARM6(ctx));
}

SEC("uprobe")
int BPF_KPROBE(nccl_scatter_enter)
{
  return call__enter(ctx, RS_OP_SCATTER, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0, (__s32)PT_REGS_PARM5(ctx),
                     PT_REGS_PARM6(ctx));
}

/* ncclBcast(buff, count, datatype, root, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_bcast_enter)
{
  return call__enter(ctx, RS_OP_BCAST, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), 0, (__s32)PT_REGS_PARM4(ctx),
                     PT_REGS_PARM5(ctx));
}

/* ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_allgather_enter)
{
  return call__enter(ctx, RS_OP_ALLGATHER, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0, -1, PT_REGS_PARM5(ctx));
}

/* ncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_alltoall_enter)
{
  return call__enter(ctx, RS_OP_ALLTOALL, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0, -1, PT_REGS_PARM5(ctx));
}

/* ncclSend(sendbuff, count, datatype, peer, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_send_enter)
{
  return call__enter(ctx, RS_OP_SEND, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), 0, (__s32)PT_REGS_PARM4(ctx),
                     PT_REGS_PARM5(ctx));
}

/* ncclRecv(recvbuff, count, datatype, peer, comm, stream) */
SEC("uprobe")
int BPF_KPROBE(nccl_recv_enter)
{
  return call__enter(ctx, RS_OP_RECV, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), 0, (__s32)PT_REGS_PARM4(ctx),
                     PT_REGS_PARM5(ctx));
}

/* Common body of the communicator entry probes (creation, destruction,
 * errors): the fields a collective's entry sets are cleared here. */
static __always_inline struct pending_call *init__enter(struct pt_regs *ctx, __u8 op)
{
  struct thread_calls *t = pending__open(ctx, bpf_get_current_pid_tgid(), op);
  if (!t)
    return NULL;
  struct pending_call *p = &t->call;
  p->comm = 0;
  p->count = 0;
  p->comm_out = 0;
  p->parent_comm = 0;
  p->peer = -1;
  p->nranks = 0;
  p->rank = 0;
  p->color = 0;
  p->key = 0;
  p->datatype = 0;
  p->redop = 0;
  return p;
}

/* ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank)
 * and ncclCommInitRankConfig(..., int rank, ncclConfig_t* config).
 * The 128-byte ncclUniqueId is a MEMORY-class argument: it is copied onto the
 * stack and takes no register, so `rank` is the third integer register. */
static __always_inline int init_rank__enter(struct pt_regs *ctx, __u8 op)
{
  struct pending_call *p = init__enter(ctx, op);
  if (!p)
    return 0;
  p->comm_out = PT_REGS_PARM1(ctx);
  p->nranks = (__s32)PT_REGS_PARM2(ctx);
  p->rank = (__s32)PT_REGS_PARM3(ctx);
  bpf_probe_read_user(p->unique_id, sizeof(p->unique_id), (void *)(PT_REGS_SP(ctx) + 8));
  return 0;
}

SEC("uprobe")
int BPF_KPROBE(nccl_comm_init_rank_enter)
{
  return init_rank__enter(ctx, RS_OP_COMM_INIT_RANK);
}

SEC("uprobe")
int BPF_KPROBE(nccl_comm_init_rank_config_enter)
{
  return init_rank__enter(ctx, RS_OP_COMM_INIT_RANK_CONFIG);
}

/* ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) */
SEC("uprobe")
int BPF_KPROBE(nccl_comm_split_enter)
{
  struct pending_call *p = init__enter(ctx, RS_OP_COMM_SPLIT);
  if (!p)
    return 0;
  __builtin_memset(p->unique_id, 0, sizeof(p->unique_id));
  p->parent_comm = PT_REGS_PARM1(ctx);
  p->color = (__s32)PT_REGS_PARM2(ctx);
  p->key = (__s32)PT_REGS_PARM3(ctx);
  p->comm_out = PT_REGS_PARM4(ctx);
  return 0;
}

/* ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist): one
 * process creates all ndev ranks of a communicator. */
SEC("uprobe")
int BPF_KPROBE(nccl_comm_init_all_enter)
{
  struct pending_call *p = init__enter(ctx, RS_OP_COMM_INIT_ALL);
  if (!p)
    return 0;
  p->comm_out = PT_REGS_PARM1(ctx);
  p->nranks = (__s32)PT_REGS_PARM2(ctx);
  return 0;
}

/* ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError): polled by
 * frameworks' watchdogs; only an error found (or returned) is an event. */
SEC("uprobe")
int BPF_KPROBE(nccl_comm_get_async_error_enter)
{
  struct pending_call *p = init__enter(ctx, RS_OP_COMM_GET_ASYNC_ERROR);
  if (!p)
    return 0;
  p->comm = PT_REGS_PARM1(ctx);
  p->comm_out = PT_REGS_PARM2(ctx);
  return 0;
}

/* ncclCommDestroy(ncclComm_t comm) / ncclCommAbort(ncclComm_t comm) */
SEC("uprobe")
int BPF_KPROBE(nccl_comm_destroy_enter)
{
  struct pending_call *p = init__enter(ctx, RS_OP_COMM_DESTROY);
  if (p)
    p->comm = PT_REGS_PARM1(ctx);
  return 0;
}

SEC("uprobe")
int BPF_KPROBE(nccl_comm_abort_enter)
{
  struct pending_call *p = init__enter(ctx, RS_OP_COMM_ABORT);
  if (p)
    p->comm = PT_REGS_PARM1(ctx);
  return 0;
}

/* ncclGroupStart() / ncclGroupEnd(): only the per-thread nesting is kept. */
SEC("uprobe")
int BPF_KPROBE(nccl_group_start_enter)
{
  struct thread_calls *t = thread__slot(bpf_get_current_pid_tgid(), true);
  if (!t)
    return 0;
  if (t->group_depth == 0)
    t->group_id += 1;
  t->group_depth += 1;
  return 0;
}

SEC("uprobe")
int BPF_KPROBE(nccl_group_end_enter)
{
  struct thread_calls *t = thread__slot(bpf_get_current_pid_tgid(), false);
  if (t && t->group_depth > 0)
    t->group_depth -= 1;
  return 0;
}

/* How long a thread's cgroup id, read once, stands for it in its call
 * records. The collector takes a process's cgroup from its first record;
 * a process moved to another cgroup is seen in this time. */
#define RS_CGROUP_REREAD_NS 1000000000ull

static __always_inline void emit__call(struct thread_calls *t, __u64 pid_tgid, __s32 result)
{
  struct pending_call *p = &t->call;
  __u64 now = bpf_ktime_get_ns();
  if (now - t->cgroup_at_ns > RS_CGROUP_REREAD_NS) {
    t->cgroup_id = bpf_get_current_cgroup_id();
    t->cgroup_at_ns = now;
  }
  struct rs_call_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
  if (!e) {
    drops__count(RS_DROP_RINGBUF_FULL);
    return;
  }
  /* The hot record: the thread's name is left out (the agent reads the
   * process's from /proc once), the cgroup id is the thread's last read. */
  header__fill_cgroup(&e->hdr, pid_tgid, RS_EV_CALL, now, t->cgroup_id);
  __builtin_memset(e->hdr.comm, 0, sizeof(e->hdr.comm));
  e->entry_ns = p->entry_ns;
  e->comm = p->comm;
  e->count = p->count;
  e->seq = p->seq;
  e->peer = p->peer;
  e->result = result;
  e->lane = p->lane;
  e->group_id = p->group_id;
  e->op = p->op;
  e->datatype = p->datatype;
  e->redop = p->redop;
  e->flags = p->flags;
  e->reserved = 0;
  bpf_ringbuf_submit(e, 0);
}

static __always_inline void emit__comm_init(struct pending_call *p, __u64 pid_tgid, __s32 result)
{
  __u64 comm = 0;
  if (p->comm_out)
    bpf_probe_read_user(&comm, sizeof(comm), (void *)p->comm_out);
  if (result == 0 && comm) {
    /* Start numbering the new communicator; a stale entry at the same
     * address (a destroyed communicator's memory reused) is replaced. */
    __u32 index;
    comm__slot(pid_tgid >> 32, comm, true, bpf_ktime_get_ns(), &index);
  }
  struct rs_comm_init_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
  if (!e) {
    drops__count(RS_DROP_RINGBUF_FULL);
    return;
  }
  header__fill(&e->hdr, pid_tgid, RS_EV_COMM_INIT);
  e->entry_ns = p->entry_ns;
  e->comm = comm;
  e->parent_comm = p->parent_comm;
  e->nranks = p->nranks;
  e->rank = p->rank;
  e->result = result;
  e->color = p->color;
  e->key = p->key;
  e->op = p->op;
  e->reserved[0] = e->reserved[1] = e->reserved[2] = 0;
  __builtin_memcpy(e->unique_id, p->unique_id, sizeof(e->unique_id));
  bpf_ringbuf_submit(e, 0);
}

static __always_inline void emit__comm_end(struct pending_call *p, __u64 pid_tgid, __s32 result)
{
  comm__forget(pid_tgid >> 32, p->comm);
  struct rs_comm_end_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
  if (!e) {
    drops__count(RS_DROP_RINGBUF_FULL);
    return;
  }
  header__fill(&e->hdr, pid_tgid, RS_EV_COMM_END);
  e->entry_ns = p->entry_ns;
  e->comm = p->comm;
  e->result = result;
  e->op = p->op;
  e->reserved[0] = e->reserved[1] = e->reserved[2] = 0;
  bpf_ringbuf_submit(e, 0);
}

/* ncclCommInitAll made comms[0..ndev): one record per rank, all with the
 * entry time of the one call (the agent names the communicator by it). */
#define RS_INIT_ALL_MAX 64
static __always_inline void emit__comm_init_all(struct pending_call *p, __u64 pid_tgid, __s32 result)
{
  __s32 n = p->nranks;
  if (n > RS_INIT_ALL_MAX)
    n = RS_INIT_ALL_MAX;
  for (__s32 i = 0; i < RS_INIT_ALL_MAX; i++) {
    if (i >= n)
      break;
    __u64 comm = 0;
    if (p->comm_out)
      bpf_probe_read_user(&comm, sizeof(comm), (void *)(p->comm_out + 8 * (__u64)i));
    if (result == 0 && comm) {
      __u32 index;
      comm__slot(pid_tgid >> 32, comm, true, bpf_ktime_get_ns(), &index);
    }
    struct rs_comm_init_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
    if (!e) {
      drops__count(RS_DROP_RINGBUF_FULL);
      continue;
    }
    header__fill(&e->hdr, pid_tgid, RS_EV_COMM_INIT);
    e->entry_ns = p->entry_ns;
    e->comm = comm;
    e->parent_comm = 0;
    e->nranks = p->nranks;
    e->rank = i;
    e->result = result;
    e->color = 0;
    e->key = 0;
    e->op = RS_OP_COMM_INIT_ALL;
    e->reserved[0] = e->reserved[1] = e->reserved[2] = 0;
    __builtin_memset(e->unique_id, 0, sizeof(e->unique_id));
    bpf_ringbuf_submit(e, 0);
  }
}

static __always_inline void emit__async_error(struct pending_call *p, __u64 pid_tgid, __s32 result)
{
  __s32 async_error = 0;
  if (p->comm_out)
    bpf_probe_read_user(&async_error, sizeof(async_error), (void *)p->comm_out);
  /* ncclInProgress (7) is a non-blocking communicator still initialising. */
  if (result == 0 && (async_error == 0 || async_error == 7))
    return;
  struct rs_async_error_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
  if (!e) {
    drops__count(RS_DROP_RINGBUF_FULL);
    return;
  }
  header__fill(&e->hdr, pid_tgid, RS_EV_ASYNC_ERROR);
  e->comm = p->comm;
  e->result = result;
  e->async_error = async_error;
  bpf_ringbuf_submit(e, 0);
}

/* The one return probe, attached to every function that has an entry probe. */
SEC("uretprobe")
int BPF_KRETPROBE(nccl_call_return, long ret)
{
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  struct thread_calls *t = thread__slot(pid_tgid, false);
  if (!t || !t->open)
    return 0;
  struct pending_call *p = &t->call;
  if (p->nested > 0) {
    p->nested -= 1;
    return 0;
  }
  __s32 result = (__s32)ret;
  switch (p->op) {
  case RS_OP_COMM_INIT_RANK:
  case RS_OP_COMM_INIT_RANK_CONFIG:
  case RS_OP_COMM_SPLIT:
    emit__comm_init(p, pid_tgid, result);
    break;
  case RS_OP_COMM_INIT_ALL:
    emit__comm_init_all(p, pid_tgid, result);
    break;
  case RS_OP_COMM_DESTROY:
  case RS_OP_COMM_ABORT:
    emit__comm_end(p, pid_tgid, result);
    break;
  case RS_OP_COMM_GET_ASYNC_ERROR:
    emit__async_error(p, pid_tgid, result);
    break;
  default:
    emit__call(t, pid_tgid, result);
    break;
  }
  t->open = 0;
  return 0;
}

/* ---------------------------------------------------------------- CUDA host waits
 * cudaStreamSynchronize / cudaDeviceSynchronize / cudaEventSynchronize in
 * libcudart: the host thread blocks until the GPU work is done. An open wait
 * lives in `waits` (the agent reports those as in flight: a hang shows as a
 * wait that never ends); the return writes one record. Kernel launches and
 * other hot paths are not probed. */

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 65536);
  __type(key, __u64); /* pid_tgid */
  __type(value, struct rs_open_wait);
} waits SEC(".maps");

static __always_inline int wait__enter(__u8 kind, __u64 object)
{
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  if (!scope__in(pid_tgid >> 32) || !processes__note(pid_tgid, true))
    return 0;
  /* `waits` is shared by every process too: only a thread within its
   * user's share of threads (followed in `threads`) opens one. */
  __u32 tid = (__u32)pid_tgid;
  if (!bpf_map_lookup_elem(&threads, &tid))
    return 0;
  struct rs_open_wait open = {
      .entry_ns = bpf_ktime_get_ns(), .object = object, .cgroup_id = bpf_get_current_cgroup_id(), .kind = kind};
  if (bpf_map_update_elem(&waits, &pid_tgid, &open, BPF_ANY))
    drops__count(RS_DROP_MAP_FULL);
  return 0;
}

/* cudaStreamSynchronize(cudaStream_t stream) */
SEC("uprobe")
int BPF_KPROBE(cuda_stream_sync_enter)
{
  return wait__enter(RS_WAIT_STREAM_SYNC, PT_REGS_PARM1(ctx));
}

/* cudaDeviceSynchronize(void) */
SEC("uprobe")
int BPF_KPROBE(cuda_device_sync_enter)
{
  return wait__enter(RS_WAIT_DEVICE_SYNC, 0);
}

/* cudaEventSynchronize(cudaEvent_t event) */
SEC("uprobe")
int BPF_KPROBE(cuda_event_sync_enter)
{
  return wait__enter(RS_WAIT_EVENT_SYNC, PT_REGS_PARM1(ctx));
}

SEC("uretprobe")
int BPF_KRETPROBE(cuda_wait_return, long ret)
{
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  struct rs_open_wait *open = bpf_map_lookup_elem(&waits, &pid_tgid);
  if (!open)
    return 0;
  struct rs_wait_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
  if (!e) {
    drops__count(RS_DROP_RINGBUF_FULL);
  } else {
    header__fill(&e->hdr, pid_tgid, RS_EV_WAIT);
    e->entry_ns = open->entry_ns;
    e->object = open->object;
    e->result = (__s32)ret;
    e->kind = open->kind;
    e->reserved[0] = e->reserved[1] = e->reserved[2] = 0;
    bpf_ringbuf_submit(e, 0);
  }
  bpf_map_delete_elem(&waits, &pid_tgid);
  return 0;
}

/* cudaSetDevice(int device): the GPU a thread works on from now on. */
struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 16384);
  __type(key, __u64); /* pid_tgid */
  __type(value, __s32);
} set_device_args SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(cuda_set_device_enter)
{
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  if (!scope__in(pid_tgid >> 32))
    return 0;
  __s32 device = (__s32)PT_REGS_PARM1(ctx);
  bpf_map_update_elem(&set_device_args, &pid_tgid, &device, BPF_ANY);
  return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(cuda_set_device_return, long ret)
{
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  __s32 *device = bpf_map_lookup_elem(&set_device_args, &pid_tgid);
  if (!device)
    return 0;
  struct rs_set_device_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
  if (!e) {
    drops__count(RS_DROP_RINGBUF_FULL);
  } else {
    header__fill(&e->hdr, pid_tgid, RS_EV_SET_DEVICE);
    e->device = *device;
    e->result = (__s32)ret;
    bpf_ringbuf_submit(e, 0);
  }
  bpf_map_delete_elem(&set_device_args, &pid_tgid);
  return 0;
}

/* ---------------------------------------------------------------- libc setenv
 * setenv(name, value, overwrite) in any process in scope: only
 * CUDA_VISIBLE_DEVICES is reported (a launcher or the framework narrowing
 * the GPUs after the process started; /proc/PID/environ keeps the old value). */
static const char visible_devices_name[] = "CUDA_VISIBLE_DEVICES";

SEC("uprobe")
int BPF_KPROBE(libc_setenv_enter)
{
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  if (!scope__in(pid_tgid >> 32))
    return 0;
  char name[sizeof(visible_devices_name)] = {};
  if (bpf_probe_read_user_str(name, sizeof(name), (void *)PT_REGS_PARM1(ctx)) != sizeof(name))
    return 0;
  for (int i = 0; i < sizeof(name); i++)
    if (name[i] != visible_devices_name[i])
      return 0;
  struct rs_setenv_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
  if (!e) {
    drops__count(RS_DROP_RINGBUF_FULL);
    return 0;
  }
  header__fill(&e->hdr, pid_tgid, RS_EV_SETENV);
  __builtin_memset(e->value, 0, sizeof(e->value));
  bpf_probe_read_user_str(e->value, sizeof(e->value), (void *)PT_REGS_PARM2(ctx));
  e->overwrite = (__s32)PT_REGS_PARM3(ctx);
  e->reserved = 0;
  bpf_ringbuf_submit(e, 0);
  return 0;
}

/* ---------------------------------------------------------------- host context
 * sched_switch: CPU time per cgroup (who used this host), and for the threads
 * that call NCCL or wait on the GPU: time on and off a CPU, time runnable but
 * waiting for one (run-queue latency, from preemption or wakeup to running),
 * time asleep on block I/O, voluntary and involuntary switches, major faults.
 * Cost: a few map lookups per context switch on the host. */

/* Scope for the host-wide rows: netns and cgroup filters, not the pid list. */
static __always_inline bool scope__host_in(struct task_struct *task)
{
  if (filter_netns_ino && BPF_CORE_READ(task, nsproxy, net_ns, ns.inum) != filter_netns_ino)
    return false;
  if (filter_cgroup_id && bpf_get_current_ancestor_cgroup_id(filter_cgroup_level) != filter_cgroup_id)
    return false;
  return true;
}

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, __u64);
} cpu_switch_ns SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 8192);
  __type(key, __u64); /* cgroup v2 id */
  __type(value, struct rs_cgroup_stats);
} cgroup_stats SEC(".maps");

static __always_inline struct rs_cgroup_stats *cgroup__stats(__u64 id)
{
  struct rs_cgroup_stats fresh = {};
  return map__row(&cgroup_stats, &id, &fresh);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)
{
  __u64 now = bpf_ktime_get_ns();
  __u32 zero = 0;
  __u64 *last = bpf_map_lookup_elem(&cpu_switch_ns, &zero);
  if (!last)
    return 0;
  __u64 ran = *last ? now - *last : 0;
  *last = now;

  __u32 prev_tid = prev->pid;
  bool involuntary = preempt || prev_state == 0; /* TASK_RUNNING: still runnable */
  if (prev_tid != 0 && scope__host_in(prev)) {
    /* current is still prev here: its cgroup is the current one. */
    struct rs_cgroup_stats *row = cgroup__stats(bpf_get_current_cgroup_id());
    if (row) {
      __sync_fetch_and_add(&row->cpu_ns, ran);
      if (involuntary)
        __sync_fetch_and_add(&row->involuntary_switches, 1);
    }
  }
  if (prev_tid != 0) {
    __u32 prev_tgid = prev->tgid;
    struct rs_host_stats *stats = bpf_map_lookup_elem(&nccl_processes, &prev_tgid);
    if (stats) {
      __sync_fetch_and_add(&stats->cpu_ns, ran);
      struct rs_thread_sched* t = bpf_map_lookup_elem(&threads, &prev_tid);
      if (t) {
        __sync_fetch_and_add(&stats->on_cpu_ns, ran);
        if (involuntary)
          __sync_fetch_and_add(&stats->involuntary_switches, 1);
        else
          __sync_fetch_and_add(&stats->voluntary_switches, 1);
        __u64 faults = prev->maj_flt;
        if (faults > t->last_maj_flt)
          __sync_fetch_and_add(&stats->major_faults, faults - t->last_maj_flt);
        t->last_maj_flt = faults;
        t->off_ns = now;
        t->ready_ns = involuntary ? now : 0;
        t->iowait = involuntary ? 0 : (__u8)BPF_CORE_READ_BITFIELD(prev, in_iowait);
      }
    }
  }

  __u32 next_tid = next->pid;
  struct rs_thread_sched* t = bpf_map_lookup_elem(&threads, &next_tid);
  if (t && t->off_ns) {
    struct rs_host_stats *stats = bpf_map_lookup_elem(&nccl_processes, &t->tgid);
    if (stats) {
      __u64 off = now - t->off_ns;
      __sync_fetch_and_add(&stats->off_cpu_ns, off);
      if (t->iowait)
        __sync_fetch_and_add(&stats->iowait_ns, off);
      if (t->ready_ns && now > t->ready_ns)
        __sync_fetch_and_add(&stats->runqueue_ns, now - t->ready_ns);
    }
    t->off_ns = 0;
    t->ready_ns = 0;
    t->iowait = 0;
  }
  return 0;
}

/* A sleeping calling thread woken up: from now it waits for a CPU. */
static __always_inline int wakeup__note(struct task_struct *task)
{
  __u32 tid = task->pid;
  struct rs_thread_sched* t = bpf_map_lookup_elem(&threads, &tid);
  if (t && t->off_ns && !t->ready_ns)
    t->ready_ns = bpf_ktime_get_ns();
  return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(sched_wakeup, struct task_struct *task)
{
  return wakeup__note(task);
}

/* A TCP segment sent again: counted against the cgroup of the socket's owner
 * (this runs in softirq context more often than not: the current task is
 * not the sender). */
SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(tcp_retransmit, const struct sock *sk, const struct sk_buff *skb)
{
  if (filter_netns_ino && BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum) != filter_netns_ino)
    return 0;
  struct cgroup *cgrp = BPF_CORE_READ(sk, sk_cgrp_data.cgroup);
  if (!cgrp)
    return 0;
  __u64 id = BPF_CORE_READ(cgrp, kn, id);
  struct rs_cgroup_stats *row = cgroup__stats(id);
  if (row)
    __sync_fetch_and_add(&row->tcp_retransmits, 1);
  return 0;
}

/* ---------------------------------------------------------------- process exit
 * sched_process_exit fires for every exiting thread; the thread-group
 * leader's exit_code is the process's (kernel/exit.c: do_group_exit passes the
 * group exit code to every thread). Only processes that used NCCL count. */
/* bpf_for_each_map_elem callbacks: drop the exiting process's entries, so
 * that the tables hold live processes only (a rank killed inside a call, or
 * one that never destroyed its communicators, would otherwise stay). */
static long exit__drop_comm(struct bpf_map* map, struct rs_comm_key* key, __u32* slot_index, __u32* tgid) {
  if (key->pid == *tgid) {
    slot__give_back(*slot_index);
    bpf_map_delete_elem(map, key);
  }
  return 0;
}

static long exit__drop_p2p(struct bpf_map *map, struct p2p_key *key, void *value, __u32 *tgid)
{
  if (key->pid == *tgid)
    bpf_map_delete_elem(map, key);
  return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(process_exit, struct task_struct *task)
{
  __u32 pid = BPF_CORE_READ(task, pid);
  __u32 tgid = BPF_CORE_READ(task, tgid);
  /* Every thread's own entries, keyed by the thread, as it exits (this
   * fires for each). */
  __u64 pid_tgid = ((__u64)tgid << 32) | pid;
  struct process_tables *tables = bpf_map_lookup_elem(&process_tables, &tgid);
  if (bpf_map_delete_elem(&threads, &pid) == 0 && tables && tables->threads) {
    share__give_back(&tables->threads, 1);
    struct user_share *share = share__of(tables);
    if (share)
      share__give_back(&share->threads, 1);
  }
  bpf_map_delete_elem(&waits, &pid_tgid);
  bpf_map_delete_elem(&set_device_args, &pid_tgid);
  if (pid != tgid || !tables)
    return 0;
  /* The process's entries go back to its user's share (its threads that
   * exit after it find no row, and give none back). Only a traced process
   * has entries in `comms` and `p2p_seqs`. */
  struct process_tables done = *tables;
  struct user_share *share = share__of(tables);
  bpf_map_delete_elem(&process_tables, &tgid);
  if (share) {
    share__give_back(&share->processes, 1);
    share__give_back(&share->comms, done.comms);
    share__give_back(&share->lanes, done.lanes);
    share__give_back(&share->threads, done.threads);
  }
  bool walk_comms = done.comms != 0;
  bool walk_p2p = done.lanes != 0;
  if (walk_comms)
    bpf_for_each_map_elem(&comms, exit__drop_comm, &tgid, 0);
  if (walk_p2p)
    bpf_for_each_map_elem(&p2p_seqs, exit__drop_p2p, &tgid, 0);
  struct rs_host_stats *host = bpf_map_lookup_elem(&nccl_processes, &tgid);
  if (!host)
    return 0;
  struct rs_host_stats final_host = *host;
  bpf_map_delete_elem(&nccl_processes, &tgid);
  struct rs_exit_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
  if (!e) {
    drops__count(RS_DROP_RINGBUF_FULL);
    return 0;
  }
  header__fill(&e->hdr, ((__u64)tgid << 32) | pid, RS_EV_EXIT);
  e->exit_code = BPF_CORE_READ(task, exit_code);
  e->reserved = 0;
  e->host = final_host;
  bpf_ringbuf_submit(e, 0);
  return 0;
}
