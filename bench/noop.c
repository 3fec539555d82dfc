/* The functions the overhead benchmark probes to measure the floor. They do
 * nothing (return their argument + 1) and live in a shared library of their
 * own, so they are reached through the PLT and probed by file offset, as
 * libnccl's functions are.
 *
 * They are written in assembly because a uprobe's cost depends on the first
 * instruction of the function: the kernel emulates some instructions in
 * place (push among them on recent kernels: arch/x86/kernel/uprobes.c) and
 * single-steps the others out of line, which costs a second trap. NCCL's API
 * entry points start with a push (`push %r15` / `push %r14` in NVIDIA's
 * libnccl.so.2 2.28, `push %rbp` in fakenccl), and so does
 * rankscope_bench_noop: its pair is the floor. rankscope_bench_noop_stepped starts with an instruction that
 * must be single-stepped, to show the difference. */
#include <stdint.h>

uint64_t rankscope_bench_noop(uint64_t value);
uint64_t rankscope_bench_noop_stepped(uint64_t value);

__asm__(
    "  .text\n"
    "  .globl rankscope_bench_noop\n"
    "  .type rankscope_bench_noop, @function\n"
    "rankscope_bench_noop:\n"
    "  push %rbp\n"
    "  mov %rsp, %rbp\n"
    "  lea 1(%rdi), %rax\n"
    "  pop %rbp\n"
    "  ret\n"
    "  .size rankscope_bench_noop, .-rankscope_bench_noop\n"
    "  .globl rankscope_bench_noop_stepped\n"
    "  .type rankscope_bench_noop_stepped, @function\n"
    "rankscope_bench_noop_stepped:\n"
    "  lea 1(%rdi), %rax\n"
    "  ret\n"
    "  .size rankscope_bench_noop_stepped, .-rankscope_bench_noop_stepped\n");
