// rec_pac.cpp: exceptions, a cancelled thread and backtrace() through
// traced frames; on aarch64 record.rs builds it with pointer
// authentication (-mbranch-protection=standard), whose frames keep their
// return addresses signed.
#include <cstdio>
#include <execinfo.h>
#include <pthread.h>
#include <stdexcept>
#include <unistd.h>
#include <cstring>

static int thrower_calls, middle_calls, outer_calls, dtors, bt_frames;
struct Guard {
  ~Guard() { __atomic_add_fetch(&dtors, 1, __ATOMIC_RELAXED); }
};
__attribute__((noinline)) int pac_thrower(int i) {
  thrower_calls++;
  if (i % 3 == 0) throw std::runtime_error("boom");
  return i;
}
__attribute__((noinline)) int pac_middle(int i) {
  Guard g;
  middle_calls++;
  return pac_thrower(i) + 1;
}
__attribute__((noinline)) int pac_outer(int i) {
  outer_calls++;
  try {
    return pac_middle(i) + 1;
  } catch (const std::exception &) {
    return -1;
  }
}
/* Throws from 25 traced frames down, 300 times, each time 16 bytes deeper
   in the stack (in 64 steps): the frames' return_to_handler is signed with
   1 600 different stack pointers, and a pointer authentication code is all
   zeros about once in 128 (7 bits under qemu-user), where the signed and
   plain forms of an address meet. */
static int deep_calls;
__attribute__((noinline)) int pac_deep(int n, int i) {
  deep_calls++;
  if (n == 0) {
    if (i >= 0) throw i;
    return 0;
  }
  return pac_deep(n - 1, i) + 1;
}
__attribute__((noinline)) int pac_shift(int i) {
  volatile char *pad = (volatile char *)__builtin_alloca(16 * (i % 64) + 16);
  pad[0] = 0;
  return pac_deep(23, i) + pad[0];
}
__attribute__((noinline)) void pac_wait(void) {
  Guard g;
  for (;;) pause();
}
__attribute__((noinline)) void pac_above(void) {
  Guard g;
  pac_wait();
}
/* Cancelled in a traced frame with nothing to clean up: the forced unwind
   meets its hijacked return before any hook runs, and the FDE registered
   for return_to_handler restores (its rule strips the code from the
   return address the frame signed). */
__attribute__((noinline)) void pac_bare_wait(void) {
  for (;;) pause();
}
__attribute__((noinline)) void pac_bare_above(void) {
  Guard g;
  pac_bare_wait();
}
static void *cancelled_bare(void *) {
  pac_bare_above();
  return nullptr;
}
static void *cancelled(void *) {
  pac_above();
  return nullptr;
}
__attribute__((noinline)) int pac_backtrace(int n) {
  if (n > 0) return pac_backtrace(n - 1) + 0 * n;
  void *buf[64];
  return backtrace(buf, 64);
}
int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "all";
  bool all = !strcmp(what, "all");
  long sum = 0;
  if (all || !strcmp(what, "throw"))
    for (int i = 0; i < 30; i++) sum += pac_outer(i);
  if (all || !strcmp(what, "cancel")) {
    pthread_t t;
    pthread_create(&t, nullptr, cancelled, nullptr);
    usleep(100000);
    pthread_cancel(t);
    pthread_join(t, nullptr);
  }
  if (all || !strcmp(what, "cancel-bare")) {
    pthread_t t;
    pthread_create(&t, nullptr, cancelled_bare, nullptr);
    usleep(100000);
    pthread_cancel(t);
    pthread_join(t, nullptr);
  }
  if (all || !strcmp(what, "backtrace")) bt_frames = pac_backtrace(3);
  if (all || !strcmp(what, "deep")) {
    long caught = 0;
    for (int i = 0; i < 300; i++) {
      try {
        sum += pac_shift(i);
      } catch (int v) {
        caught += v;
      }
    }
    printf("caught %ld\npac_deep %d\n", caught, deep_calls);
  }
  printf("sum %ld\npac_outer %d\npac_middle %d\npac_thrower %d\ndtors %d\nbacktrace_frames %d\n", sum, outer_calls,
         middle_calls, thrower_calls, dtors, bt_frames);
  return 0;
}
