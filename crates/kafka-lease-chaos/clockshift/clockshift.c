/*
 * clockshift: a library preloaded (LD_PRELOAD) into a gateway of the fault tests, so that
 * the clock fault (skew-gateway-clock) can step the gateway's wall clock while it runs.
 *
 * The wall clock (CLOCK_REALTIME and its coarse and TAI variants, gettimeofday, time) is
 * moved by a whole number of seconds read from the file named by KAFKA_LEASE_CLOCKSHIFT_FILE
 * ("+300", "-120", "0"), read again at most every 200 ms; the monotonic and boot clocks pass
 * through untouched, as under an NTP step. Without the variable, or with a file that cannot
 * be read, the offset stays what it was (0 at first).
 *
 * A real step moves the kernel's clock with the process's, so a wait until an absolute wall
 * time (a condition variable on CLOCK_REALTIME, which librdkafka's C11 cnd_timedwait is)
 * computed from the process's clock still lasts as long as was meant. Here only the
 * process's view moves, so those waits are given the kernel's time back: the deadline minus
 * the offset. (Without it every such wait on a clock stepped back timed out at once, and
 * librdkafka's metadata requests failed while the fault lasted.) A wait already under way
 * when the offset changes keeps the deadline it began with: under a real step back it would
 * last the step longer. These are the waits the gateway imports (nm -D --undefined-only).
 *
 * Nothing here allocates: an allocator may call the clock from inside its own
 * initialisation (jemalloc does, which is why a general-purpose faker that calls dlsym in
 * its constructor deadlocks the gateway before main).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static _Atomic(clock_gettime_fn) real_fn;
static _Atomic long long offset_s;
static _Atomic long long next_read_ns;
static atomic_flag reading = ATOMIC_FLAG_INIT;

/* The clock as the C library gives it (through the vDSO), else by the system call. */
static int real_clock_gettime(clockid_t id, struct timespec *ts) {
    clock_gettime_fn f = atomic_load_explicit(&real_fn, memory_order_acquire);
    if (f == NULL) {
        /* A symbol that exists: dlsym's success path does not allocate. */
        f = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
        if (f != NULL) {
            atomic_store_explicit(&real_fn, f, memory_order_release);
        }
    }
    if (f != NULL) {
        return f(id, ts);
    }
    return (int)syscall(SYS_clock_gettime, id, ts);
}

/* Parses "[+-]digits" (surrounding blanks allowed); 0 on success. */
static int parse_offset(const char *text, long len, long long *out) {
    long i = 0;
    int negative = 0;
    long long value = 0;
    int digits = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\t')) i++;
    if (i < len && (text[i] == '+' || text[i] == '-')) {
        negative = text[i] == '-';
        i++;
    }
    while (i < len && text[i] >= '0' && text[i] <= '9' && digits < 12) {
        value = value * 10 + (text[i] - '0');
        digits++;
        i++;
    }
    if (digits == 0) return -1;
    if (i < len && text[i] == 's') i++;
    while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r')) i++;
    if (i != len) return -1;
    *out = negative ? -value : value;
    return 0;
}

/* Reads the offset file again if 200 ms have passed since the last read. */
static void refresh(void) {
    struct timespec now;
    if (real_clock_gettime(CLOCK_MONOTONIC, &now) != 0) return;
    long long now_ns = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
    if (now_ns < atomic_load_explicit(&next_read_ns, memory_order_relaxed)) return;
    if (atomic_flag_test_and_set_explicit(&reading, memory_order_acquire)) return;
    atomic_store_explicit(&next_read_ns, now_ns + 200000000LL, memory_order_relaxed);
    const char *path = getenv("KAFKA_LEASE_CLOCKSHIFT_FILE");
    if (path != NULL) {
        int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            char buf[64];
            long n = (long)syscall(SYS_read, fd, buf, sizeof buf);
            syscall(SYS_close, fd);
            long long value;
            if (n > 0 && parse_offset(buf, n, &value) == 0) {
                atomic_store_explicit(&offset_s, value, memory_order_relaxed);
            }
        }
    }
    atomic_flag_clear_explicit(&reading, memory_order_release);
}

static int is_wall(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_TAI;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int r = real_clock_gettime(id, ts);
    if (r == 0 && is_wall(id)) {
        refresh();
        ts->tv_sec += (time_t)atomic_load_explicit(&offset_s, memory_order_relaxed);
    }
    return r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}

/* A wall-clock deadline of the process's clock, as the kernel's clock has it. */
static struct timespec unshifted(const struct timespec *deadline) {
    struct timespec ts = *deadline;
    refresh();
    ts.tv_sec -= (time_t)atomic_load_explicit(&offset_s, memory_order_relaxed);
    return ts;
}

typedef int (*cond_timedwait_fn)(void *, void *, const struct timespec *);

/* The next definition of `name` at `version` (the default one when that is missing). */
static cond_timedwait_fn next_wait(_Atomic(cond_timedwait_fn) *slot, const char *name,
                                   const char *version) {
    cond_timedwait_fn f = atomic_load_explicit(slot, memory_order_acquire);
    if (f == NULL) {
        f = (cond_timedwait_fn)dlvsym(RTLD_NEXT, name, version);
        if (f == NULL) f = (cond_timedwait_fn)dlsym(RTLD_NEXT, name);
        atomic_store_explicit(slot, f, memory_order_release);
    }
    return f;
}

static _Atomic(cond_timedwait_fn) real_cnd_timedwait;
static _Atomic(cond_timedwait_fn) real_pthread_cond_timedwait;

/* C11's wait: its deadline is always on TIME_UTC, the wall clock. */
int cnd_timedwait(void *restrict cond, void *restrict mutex, const struct timespec *restrict deadline) {
    cond_timedwait_fn f = next_wait(&real_cnd_timedwait, "cnd_timedwait", "GLIBC_2.34");
    if (deadline == NULL) return f(cond, mutex, deadline);
    struct timespec ts = unshifted(deadline);
    return f(cond, mutex, &ts);
}

/* POSIX's: on the wall clock unless the condition variable was made for the monotonic
 * one, which glibc keeps in bit 0 of __wrefs. */
int pthread_cond_timedwait(pthread_cond_t *restrict cond, pthread_mutex_t *restrict mutex,
                           const struct timespec *restrict deadline) {
    cond_timedwait_fn f = next_wait(&real_pthread_cond_timedwait, "pthread_cond_timedwait", "GLIBC_2.3.2");
    if ((cond->__data.__wrefs & 1) != 0) return f(cond, mutex, deadline);
    struct timespec ts = unshifted(deadline);
    return f(cond, mutex, &ts);
}
