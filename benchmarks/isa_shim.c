/* A preloaded shim (LD_PRELOAD) that makes an Intel CPU with AMX run the kernels of a CPU with less, in onnxruntime
   and qlinear alike, for benchmarks/cpu_goals.py --isa. The mode is read from ISA_SHIM at load:

   avx512vnni  Linux's AMX permission request (arch_prctl(ARCH_REQ_XCOMP_PERM), made through libc's syscall) is
               refused, so both libraries run their AVX-512 VNNI kernels: an AMD Zen 4's instruction set.
   avx2        CPUID faults (arch_prctl(ARCH_SET_CPUID, 0), a CPU with cpuid_fault) and the handler answers with
               AVX-512, VNNI (both widths) and AMX cleared: a Zen 3's instruction set. Everything that asks the
               CPU after this library loads sees that (LLVM under numba, onnxruntime's MLAS, NumPy); glibc asked
               before and keeps its own string functions.

   It copies instruction sets, not caches or clocks. Anything else in ISA_SHIM, or no cpuid_fault, stops the
   process with a message. */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023

static long (*next_syscall)(long, ...);

long syscall(long number, ...) {
    long a[6];
    va_list ap;
    va_start(ap, number);
    for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long); /* a system call takes at most six arguments */
    va_end(ap);
    if (number == SYS_arch_prctl && a[0] == ARCH_REQ_XCOMP_PERM) {
        errno = EPERM;
        return -1;
    }
    if (!next_syscall) next_syscall = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return next_syscall(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

static long set_cpuid(long enabled) {
    if (!next_syscall) next_syscall = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return next_syscall(SYS_arch_prctl, ARCH_SET_CPUID, enabled, 0, 0, 0, 0);
}

static void on_fault(int sig, siginfo_t *info, void *context) {
    greg_t *r = ((ucontext_t *)context)->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)r[REG_RIP];
    (void)info;
    if (ip[0] != 0x0f || ip[1] != 0xa2) { /* not a CPUID: the default action, on the fault's return */
        signal(sig, SIG_DFL);
        return;
    }
    unsigned leaf = (unsigned)r[REG_RAX], sub = (unsigned)r[REG_RCX], a, b, c, d;
    set_cpuid(1); /* the real answer, with faulting off for this one instruction */
    __cpuid_count(leaf, sub, a, b, c, d);
    set_cpuid(0);
    if (leaf == 7 && sub == 0) {
        /* EBX: AVX512F, DQ, IFMA, PF, ER, CD, BW, VL; ECX: VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ;
           EDX: 4VNNIW, 4FMAPS, VP2INTERSECT, AMX-BF16, AVX512-FP16, AMX-TILE, AMX-INT8 */
        b &= ~(1u << 16 | 1u << 17 | 1u << 21 | 1u << 26 | 1u << 27 | 1u << 28 | 1u << 30 | 1u << 31);
        c &= ~(1u << 1 | 1u << 6 | 1u << 11 | 1u << 12 | 1u << 14);
        d &= ~(1u << 2 | 1u << 3 | 1u << 8 | 1u << 22 | 1u << 23 | 1u << 24 | 1u << 25);
    } else if (leaf == 7 && sub == 1) {
        a &= ~(1u << 4 | 1u << 5); /* AVX-VNNI, AVX512-BF16 */
    }
    r[REG_RAX] = a;
    r[REG_RBX] = b;
    r[REG_RCX] = c;
    r[REG_RDX] = d;
    r[REG_RIP] += 2;
}

__attribute__((constructor)) static void start(void) {
    const char *mode = getenv("ISA_SHIM");
    if (mode && !strcmp(mode, "avx512vnni")) return;
    if (!mode || strcmp(mode, "avx2")) {
        fprintf(stderr, "isa_shim: ISA_SHIM must be avx512vnni or avx2, got %s\n", mode ? mode : "nothing");
        _exit(2);
    }
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_fault;
    action.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &action, 0);
    if (set_cpuid(0) != 0) { /* threads made later inherit the setting */
        fprintf(stderr, "isa_shim: this CPU or kernel cannot make CPUID fault (no cpuid_fault): avx2 not possible\n");
        _exit(2);
    }
}
