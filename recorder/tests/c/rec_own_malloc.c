/*
 * A single-threaded program with its own malloc, free, calloc and realloc
 * (as bash has: an allocator without locks, made for one thread), built
 * with patch sites.  The recorder's threads must never be in them while
 * the program is, nor call them while main runs, and the recorder's own
 * allocations must not be recorded as the program's calls.  Each call made
 * by main's thread inside main takes ~20 us (so that a call from another
 * thread meanwhile would be caught).  Prints
 *
 *   foreign_in_main N    calls from other threads while main ran
 *   overlaps N           calls made while another thread was inside one
 *   allocations M        the calls main's thread made inside main
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

static atomic_long foreign_in_main, overlaps, in_main_calls;
static atomic_int inside, in_main;
static char *volatile sink;

static void enter(void)
{
	if (atomic_fetch_add(&inside, 1) != 0)
		atomic_fetch_add(&overlaps, 1);
	int main_thread = gettid() == getpid();
	if (!atomic_load(&in_main))
		return;
	if (!main_thread) {
		atomic_fetch_add(&foreign_in_main, 1);
		return;
	}
	atomic_fetch_add(&in_main_calls, 1);
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	do
		clock_gettime(CLOCK_MONOTONIC, &b);
	while ((b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec) < 20000);
}

static void leave(void) { atomic_fetch_sub(&inside, 1); }

void *malloc(size_t n) { enter(); void *p = __libc_malloc(n); leave(); return p; }
void *calloc(size_t n, size_t m) { enter(); void *p = __libc_calloc(n, m); leave(); return p; }
void *realloc(void *q, size_t n) { enter(); void *p = __libc_realloc(q, n); leave(); return p; }
void free(void *p) { enter(); __libc_free(p); leave(); }

__attribute__((noinline)) static long work(long i)
{
	char *p = malloc(64 + i);
	memset(p, (int)i, 64);
	sink = p;
	long s = p[3];
	free(p);
	return s;
}

int main(void)
{
	atomic_store(&in_main, 1);
	long s = 0;
	/* ~60 ms, two thirds of it inside the allocator, so that the
	 * recorder's threads run meanwhile. */
	for (long i = 0; i < 1000; i++) {
		s += work(i % 200);
		if (i % 5 == 0)
			usleep(100);
	}
	atomic_store(&in_main, 0);
	printf("foreign_in_main %ld\noverlaps %ld\nallocations %ld\nsum %ld\n", atomic_load(&foreign_in_main),
	       atomic_load(&overlaps), atomic_load(&in_main_calls), s);
	return 0;
}
