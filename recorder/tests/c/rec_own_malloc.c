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
 *
 * With arguments `dlopen LIB`, main also loads LIB (with sites) 10 times
 * while it runs, looks up `reclib_sum` in it, calls it and closes it, and
 * prints
 *
 *   in_dlsym N           allocator calls made while its dlsym ran (a lookup
 *                        that succeeds allocates nothing)
 *
 * The recorder must not look up, with a lookup that fails, the functions
 * its unwinder hooks need when no module imports them: glibc allocates
 * the error message with the program's malloc.
 *
 * With arguments `plugin LIB` (rec_plugin.cpp's library), main loads it
 * RTLD_LOCAL and has it catch 20 C++ exceptions, and prints
 *
 *   in_catch N           allocator calls made inside plugin_catch (the
 *                        exceptions' own: the same traced as untraced)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
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
static atomic_long in_dlsym_calls, in_catch_calls;
static atomic_int inside, in_main, in_dlsym, in_catch;
static char *volatile sink;

static void enter(void)
{
	if (atomic_fetch_add(&inside, 1) != 0)
		atomic_fetch_add(&overlaps, 1);
	if (atomic_load(&in_dlsym))
		atomic_fetch_add(&in_dlsym_calls, 1);
	if (atomic_load(&in_catch))
		atomic_fetch_add(&in_catch_calls, 1);
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

static long load_and_call(const char *lib)
{
	void *h = dlopen(lib, RTLD_NOW);
	if (!h) {
		fprintf(stderr, "dlopen %s: %s\n", lib, dlerror());
		return -1;
	}
	/* Time for the recorder's module watcher to see the library. */
	usleep(2000);
	atomic_store(&in_dlsym, 1);
	long (*f)(long) = (long (*)(long))dlsym(h, "reclib_sum");
	atomic_store(&in_dlsym, 0);
	long r = f ? f(10) : -1;
	dlclose(h);
	return r;
}

/* The C++ plugin's exceptions: how many plugin_catch caught, or -1. */
static long catch_in_plugin(const char *path)
{
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	int (*catcher)(int) = h ? (int (*)(int))dlsym(h, "plugin_catch") : NULL;
	if (!catcher) {
		fprintf(stderr, "plugin %s: %s\n", path, dlerror());
		return -1;
	}
	atomic_store(&in_catch, 1);
	long got = catcher(20);
	atomic_store(&in_catch, 0);
	dlclose(h);
	return got;
}

int main(int argc, char **argv)
{
	if (argc > 2 && strcmp(argv[1], "plugin") == 0) {
		long got = catch_in_plugin(argv[2]);
		printf("caught %ld\nin_catch %ld\nforeign_in_main %ld\n", got, atomic_load(&in_catch_calls), atomic_load(&foreign_in_main));
		return got == 20 ? 0 : 1;
	}
	const char *lib = argc > 2 && strcmp(argv[1], "dlopen") == 0 ? argv[2] : NULL;
	atomic_store(&in_main, 1);
	long s = 0;
	/* ~60 ms, two thirds of it inside the allocator, so that the
	 * recorder's threads run meanwhile. */
	for (long i = 0; i < 1000; i++) {
		s += work(i % 200);
		if (i % 5 == 0)
			usleep(100);
		if (lib && i % 100 == 0)
			s += load_and_call(lib);
	}
	atomic_store(&in_main, 0);
	printf("foreign_in_main %ld\noverlaps %ld\nallocations %ld\nsum %ld\n", atomic_load(&foreign_in_main),
	       atomic_load(&overlaps), atomic_load(&in_main_calls), s);
	if (lib)
		printf("in_dlsym %ld\n", atomic_load(&in_dlsym_calls));
	return 0;
}
