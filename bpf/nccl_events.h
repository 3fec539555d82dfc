/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The records that bpf/nccl.bpf.c writes into its ring buffer, and the
 * codes shared by the BPF side, the agent and the wire format. This is the
 * only description of their layout: C++ includes this header, nobody
 * restates it. Fixed-width fields, explicit padding, the common header first.
 */
#ifndef RANKSCOPE_BPF_NCCL_EVENTS_H
#define RANKSCOPE_BPF_NCCL_EVENTS_H

#ifdef __cplusplus
#include <linux/types.h>
#endif

#define RS_TASK_COMM_LEN 16
#define RS_UNIQUE_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES in nccl.h */

enum rs_event_kind {
  RS_EV_CALL = 1,      /* one NCCL collective or point-to-point call, entry and return */
  RS_EV_COMM_INIT = 2, /* a communicator created (CommInitRank and friends) */
  RS_EV_COMM_END = 3,  /* a communicator destroyed or aborted */
  RS_EV_WAIT = 4,      /* a host thread waited on the GPU (libcudart synchronize calls) */
  RS_EV_EXIT = 5,      /* a process that used NCCL exited */
  RS_EV_SETENV = 6,    /* setenv("CUDA_VISIBLE_DEVICES", ...) in a process in scope */
  RS_EV_SET_DEVICE = 7,   /* cudaSetDevice(device) */
  RS_EV_ASYNC_ERROR = 8,  /* ncclCommGetAsyncError found an error (or failed) */
};

/* CUDA runtime calls in which a host thread waits for the GPU. */
enum rs_wait_kind {
  RS_WAIT_STREAM_SYNC = 1, /* cudaStreamSynchronize(stream) */
  RS_WAIT_DEVICE_SYNC = 2, /* cudaDeviceSynchronize() */
  RS_WAIT_EVENT_SYNC = 3,  /* cudaEventSynchronize(event) */
};

/* NCCL entry points, numbered for the wire: never renumber, only append. */
enum rs_nccl_op {
  RS_OP_NONE = 0,
  RS_OP_ALLREDUCE = 1,
  RS_OP_BROADCAST = 2,
  RS_OP_BCAST = 3,
  RS_OP_REDUCE = 4,
  RS_OP_ALLGATHER = 5,
  RS_OP_REDUCESCATTER = 6,
  RS_OP_ALLTOALL = 7,
  RS_OP_GATHER = 8,
  RS_OP_SCATTER = 9,
  RS_OP_SEND = 10,
  RS_OP_RECV = 11,
  RS_OP_COMM_INIT_RANK = 32,
  RS_OP_COMM_INIT_RANK_CONFIG = 33,
  RS_OP_COMM_INIT_ALL = 34,
  RS_OP_COMM_SPLIT = 35,
  RS_OP_COMM_DESTROY = 36,
  RS_OP_COMM_ABORT = 37,
  RS_OP_COMM_GET_ASYNC_ERROR = 38,
  RS_OP_GROUP_START = 40,
  RS_OP_GROUP_END = 41,
};

/* The sizes of the tables every traced process shares (each user may
 * hold a share of each: bpf/nccl.bpf.c, user_shares). */
#define RS_PROCESSES 16384
#define RS_COMM_SLOTS 131072
#define RS_P2P_LANES 262144
#define RS_THREADS 65536

/* Ways the BPF side loses data; each is a slot of the `drops` per-CPU array. */
enum rs_drop_reason {
  RS_DROP_RINGBUF_FULL = 0,
  RS_DROP_MAP_FULL = 1,
  RS_DROP_NESTED = 2, /* an NCCL API call made from inside another one */
  RS_DROP_LOST_RETURN = 3, /* a call whose return was not seen (it ran while the agent attached) */
  RS_DROP_USER_SHARE = 4, /* its user holds its share of a shared table: not traced, or not in full */
  RS_DROP_MAX = 5,
};

/* Flags of one call record (also carried on the wire, proto/records.h). */
enum rs_call_flag {
  RS_CALL_IN_GROUP = 1 << 0,     /* issued between GroupStart and GroupEnd */
  RS_CALL_UNKNOWN_COMM = 1 << 1, /* the communicator's creation was not seen */
  RS_CALL_DURATION_SAT = 1 << 2, /* wire only: duration did not fit, saturated */
};

/* Lane 0 numbers a communicator's collectives; point-to-point calls with one
 * peer are numbered apart, because NCCL orders them per peer only. */
#define RS_P2P_LANE(peer, is_recv) (1u + 2u * (__u32)(peer) + ((is_recv) ? 1u : 0u))

struct rs_event_header {
  __u64 ts_ns;     /* bpf_ktime_get_ns() (CLOCK_MONOTONIC) at the event */
  __u64 cgroup_id; /* bpf_get_current_cgroup_id() */
  __u32 pid;       /* thread-group id */
  __u32 tid;
  __u16 kind;      /* enum rs_event_kind */
  __u16 reserved0;
  __u32 reserved1;
  char comm[RS_TASK_COMM_LEN]; /* the thread's name; empty on call records (the hot path) */
};

/* An NCCL collective or Send/Recv, written at return; ts_ns is the return. */
struct rs_call_event {
  struct rs_event_header hdr;
  __u64 entry_ns;
  __u64 comm;     /* ncclComm_t, local to the process */
  __u64 count;    /* element count as passed (sendcount for AllGather, recvcount for ReduceScatter) */
  __u64 seq;      /* per (process, communicator, lane), from 0, numbered in BPF */
  __s32 peer;     /* root or peer; -1 when the call has none */
  __s32 result;   /* ncclResult_t returned */
  __u32 lane;
  __u32 group_id; /* per-thread count of outermost GroupStart calls; valid with RS_CALL_IN_GROUP */
  __u8 op;        /* enum rs_nccl_op */
  __u8 datatype;  /* ncclDataType_t */
  __u8 redop;     /* ncclRedOp_t (0 when the call has none) */
  __u8 flags;     /* enum rs_call_flag */
  __u32 reserved;
};

/* A communicator created by this process; ts_ns is the return. */
struct rs_comm_init_event {
  struct rs_event_header hdr;
  __u64 entry_ns;
  __u64 comm;        /* the new ncclComm_t, read through the ncclComm_t* argument at return */
  __u64 parent_comm; /* CommSplit's parent; 0 otherwise */
  __s32 nranks;
  __s32 rank;
  __s32 result;
  __s32 color;       /* CommSplit */
  __s32 key;         /* CommSplit */
  __u8 op;           /* enum rs_nccl_op */
  __u8 reserved[3];
  __u8 unique_id[RS_UNIQUE_ID_BYTES]; /* the ncclUniqueId passed by value (read from the stack) */
};

struct rs_comm_end_event {
  struct rs_event_header hdr;
  __u64 entry_ns;
  __u64 comm;
  __s32 result;
  __u8 op;
  __u8 reserved[3];
};

/* A host wait on the GPU, written at return; ts_ns is the return. A wait
 * that has not returned is in the `waits` map (struct rs_open_wait). */
struct rs_wait_event {
  struct rs_event_header hdr;
  __u64 entry_ns;
  __u64 object;  /* the cudaStream_t or cudaEvent_t waited on (0 for the device) */
  __s32 result;  /* cudaError_t returned */
  __u8 kind;     /* enum rs_wait_kind */
  __u8 reserved[3];
};

/* CUDA_VISIBLE_DEVICES set by the process itself (libc setenv); the later
 * value wins over /proc/PID/environ. */
#define RS_ENV_VALUE_BYTES 96
struct rs_setenv_event {
  struct rs_event_header hdr;
  char value[RS_ENV_VALUE_BYTES]; /* NUL-terminated, truncated if longer */
  __s32 overwrite;                /* setenv's third argument: 0 keeps an existing value */
  __u32 reserved;
};

/* cudaSetDevice(device), written at return. */
struct rs_set_device_event {
  struct rs_event_header hdr;
  __s32 device;
  __s32 result; /* cudaError_t */
};

/* ncclCommGetAsyncError(comm, &error) that returned an error or found one:
 * a communicator broken by a peer's death or the network. */
struct rs_async_error_event {
  struct rs_event_header hdr;
  __u64 comm;
  __s32 result;      /* ncclResult_t returned by the call */
  __s32 async_error; /* the ncclResult_t it wrote */
};

/* Host context of one process that uses NCCL or waits on the GPU,
 * cumulative since its first call was seen (value of `nccl_processes`).
 * The thread counters cover the threads that made those calls: the ones whose
 * delays delay the collectives. cpu_ns covers all its threads. */
struct rs_host_stats {
  __u64 cpu_ns;               /* all threads, on a CPU */
  __u64 on_cpu_ns;            /* calling threads, on a CPU */
  __u64 off_cpu_ns;           /* calling threads, switched out (sleeping, waiting, preempted) */
  __u64 runqueue_ns;          /* calling threads, runnable but waiting for a CPU */
  __u64 iowait_ns;            /* calling threads, asleep on block I/O (in_iowait) */
  __u64 voluntary_switches;   /* calling threads: blocked or slept */
  __u64 involuntary_switches; /* calling threads: preempted while runnable */
  __u64 major_faults;         /* calling threads: page faults that read from disk */
  __u32 threads;              /* calling threads seen */
  __u32 reserved;
};

/* A process that called NCCL exited (its thread-group leader did);
 * ts_ns is the exit. */
struct rs_exit_event {
  struct rs_event_header hdr;
  __s32 exit_code; /* task_struct.exit_code: (status << 8) after exit(), the signal number when killed */
  __u32 reserved;
  struct rs_host_stats host; /* its final host counters (the table entry goes with it) */
};

/* CPU and network of one cgroup (v2 id) as seen by sched_switch and
 * tcp_retransmit_skb: who else used this host (value of `cgroup_stats`). */
struct rs_cgroup_stats {
  __u64 cpu_ns;
  __u64 involuntary_switches;
  __u64 tcp_retransmits;
  __u64 reserved;
};

/* Value of the per-thread `waits` map: a wait in progress. */
struct rs_open_wait {
  __u64 entry_ns;
  __u64 object;
  __u64 cgroup_id;
  __u8 kind;
  __u8 reserved[7];
};

/* Key of the `comms` map: a process's ncclComm_t. The agent walks it to
 * count a process's communicators. */
struct rs_comm_key {
  __u32 pid;
  __u32 reserved;
  __u64 comm;
};

/* Value of the `comm_slots` array: one communicator's numbering. The
 * counter is in the slot, shared by every thread of the process. */
struct rs_comm_slot {
  __u64 next_seq; /* lane 0 */
  __u64 epoch;    /* creation time: tells a reused ncclComm_t address apart; 0: created before the agent saw it */
  __u64 comm;
  __u32 pid; /* 0: free */
  __u32 reserved;
};

/* Value of the `threads` map (by tid): a thread that called NCCL or waited
 * on the GPU, followed by the sched_switch probe. */
struct rs_thread_sched {
  __u64 off_ns;       /* when it was switched out; 0 while it runs */
  __u64 ready_ns;     /* when it became runnable again (preempted or woken); 0 if not yet */
  __u64 last_maj_flt; /* task_struct.maj_flt at its last switch-out */
  __u32 tgid;
  __u8 iowait; /* asleep on block I/O at switch-out */
  __u8 reserved[3];
};

#ifdef __cplusplus
static_assert(sizeof(struct rs_comm_key) == 16, "rs_comm_key layout");
static_assert(sizeof(struct rs_comm_slot) == 32, "rs_comm_slot layout");
static_assert(sizeof(struct rs_thread_sched) == 32, "rs_thread_sched layout");
static_assert(sizeof(struct rs_setenv_event) == 48 + RS_ENV_VALUE_BYTES + 8, "rs_setenv_event layout");
static_assert(sizeof(struct rs_set_device_event) == 56, "rs_set_device_event layout");
static_assert(sizeof(struct rs_async_error_event) == 64, "rs_async_error_event layout");
static_assert(sizeof(struct rs_host_stats) == 72, "rs_host_stats layout");
static_assert(sizeof(struct rs_cgroup_stats) == 32, "rs_cgroup_stats layout");
static_assert(sizeof(struct rs_exit_event) == 56 + 72, "rs_exit_event layout");
static_assert(sizeof(struct rs_wait_event) == 72, "rs_wait_event layout");
static_assert(sizeof(struct rs_open_wait) == 32, "rs_open_wait layout");
static_assert(sizeof(struct rs_event_header) == 48, "rs_event_header layout");
static_assert(sizeof(struct rs_call_event) == 104, "rs_call_event layout");
static_assert(sizeof(struct rs_comm_init_event) == 48 + 24 + 24 + 128, "rs_comm_init_event layout");
static_assert(sizeof(struct rs_comm_end_event) == 72, "rs_comm_end_event layout");
#else
_Static_assert(sizeof(struct rs_comm_key) == 16, "rs_comm_key layout");
_Static_assert(sizeof(struct rs_comm_slot) == 32, "rs_comm_slot layout");
_Static_assert(sizeof(struct rs_thread_sched) == 32, "rs_thread_sched layout");
_Static_assert(sizeof(struct rs_setenv_event) == 48 + RS_ENV_VALUE_BYTES + 8, "rs_setenv_event layout");
_Static_assert(sizeof(struct rs_set_device_event) == 56, "rs_set_device_event layout");
_Static_assert(sizeof(struct rs_async_error_event) == 64, "rs_async_error_event layout");
_Static_assert(sizeof(struct rs_host_stats) == 72, "rs_host_stats layout");
_Static_assert(sizeof(struct rs_cgroup_stats) == 32, "rs_cgroup_stats layout");
_Static_assert(sizeof(struct rs_exit_event) == 56 + 72, "rs_exit_event layout");
_Static_assert(sizeof(struct rs_wait_event) == 72, "rs_wait_event layout");
_Static_assert(sizeof(struct rs_open_wait) == 32, "rs_open_wait layout");
_Static_assert(sizeof(struct rs_event_header) == 48, "rs_event_header layout");
_Static_assert(sizeof(struct rs_call_event) == 104, "rs_call_event layout");
_Static_assert(sizeof(struct rs_comm_init_event) == 48 + 24 + 24 + 128, "rs_comm_init_event layout");
_Static_assert(sizeof(struct rs_comm_end_event) == 72, "rs_comm_end_event layout");
#endif

#endif /* RANKSCOPE_BPF_NCCL_EVENTS_H */
