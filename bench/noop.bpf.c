// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * The floor of the overhead benchmark (bench/overhead.cpp): an entry uprobe
 * and a return probe that do nothing. Attached to a no-op function, their
 * cost per call is what any uprobe-based tracer pays on this kernel before it
 * does any work: the breakpoint trap, the single-step out of line, the
 * return-address hijack and the BPF program calls themselves.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("uprobe")
int BPF_KPROBE(noop_enter)
{
  return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(noop_return)
{
  return 0;
}
