/* An LD_PRELOAD shim that refuses Linux's AMX permission request (arch_prctl(ARCH_REQ_XCOMP_PERM, ...)), so that
   onnxruntime's MLAS and qlinear both run their AVX-512 VNNI kernels on a CPU with AMX: the instruction set of
   an AMD Zen 4, measured on an Intel Sapphire or Emerald Rapids. benchmarks/cpu_goals.py --no-amx builds it with
   the system's C compiler and runs itself under it. Every other system call goes through unchanged. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>

#define SYS_ARCH_PRCTL 158
#define ARCH_REQ_XCOMP_PERM 0x1023

long syscall(long number, ...) {
    static long (*next)(long, ...) = 0;
    long a[6];
    va_list ap;
    va_start(ap, number);
    for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);  /* a system call takes at most six arguments */
    va_end(ap);
    if (number == SYS_ARCH_PRCTL && a[0] == ARCH_REQ_XCOMP_PERM) {
        errno = EPERM;
        return -1;
    }
    if (!next) next = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return next(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}
