/* C++ exceptions thrown through traced frames (exectest/tests/unwind.rs).
 * Built with the arch's patch-site flags, like tracee.c.
 *
 * Every traced function counts its calls and its normal returns itself, and
 * notes what happens in `trail`, so a traced run can be compared with an
 * untraced one and fgraph's entry/return callbacks with the truth. */
#include <cstring>
#include <stdexcept>

#define TRACEE extern "C" __attribute__((noinline, noclone, noipa))

enum { F_CLEANUP, F_DEEP, F_CATCH, F_RETHROW, F_NESTED, F_INNER_TRY, F_GUARDED, F_DRIVER, F_LOOP, NF };

static char trail[1 << 16];
static unsigned tlen;
static long calls[NF], rets[NF];

static void note(char c)
{
	if (tlen + 1 < sizeof trail)
		trail[tlen++] = c;
}

#define ENTER(f) (calls[f]++)
#define RETURN(f, v)                                                                                                   \
	do {                                                                                                           \
		rets[f]++;                                                                                             \
		return (v);                                                                                            \
	} while (0)

struct Err {
	long v;
};

TRACEE long unw_cleanup(long c);
TRACEE long unw_inner_try(long n);

/* A destructor calling a traced function: runs in cleanup landing pads. */
struct Guard {
	long c;
	~Guard() { unw_cleanup(c); }
};

/* A destructor that throws and catches inside, while an exception unwinds. */
struct TryingGuard {
	long n;
	~TryingGuard() { unw_inner_try(n); }
};

TRACEE long unw_cleanup(long c)
{
	ENTER(F_CLEANUP);
	note('0' + (char)(c % 10));
	RETURN(F_CLEANUP, c + 1);
}

/* Recursion through a volatile pointer (each level a traced call with a
 * Guard), throwing at depth 0: kind 0 std::runtime_error, 1 Err, 2 int. */
TRACEE long unw_deep(long n, long kind);
static long (*volatile deep_self)(long, long) = unw_deep;

TRACEE long unw_deep(long n, long kind)
{
	ENTER(F_DEEP);
	Guard g{n};
	if (n <= 0) {
		note('t');
		if (kind == 0)
			throw std::runtime_error("deep");
		if (kind == 1)
			throw Err{42};
		throw 7;
	}
	long r = deep_self(n - 1, kind) + 1;
	RETURN(F_DEEP, r);
}

/* Caught here; the handler calls a traced function. */
TRACEE long unw_catch(long n)
{
	ENTER(F_CATCH);
	long r;
	try {
		r = unw_deep(n, 0);
	} catch (const std::exception &e) {
		note('C');
		r = 100 + unw_cleanup(n);
	}
	RETURN(F_CATCH, r);
}

/* Caught, noted, rethrown. */
TRACEE long unw_rethrow(long n)
{
	ENTER(F_RETHROW);
	try {
		unw_deep(n, 1);
	} catch (Err &e) {
		note('R');
		throw;
	}
	RETURN(F_RETHROW, 0);
}

/* Nested try blocks (the inner one does not match), then a throw from
 * inside a catch handler, caught there. */
TRACEE long unw_nested(long n)
{
	ENTER(F_NESTED);
	long r = 0;
	try {
		try {
			unw_rethrow(n);
		} catch (int) {
			note('X');
			r = -1;
		}
	} catch (Err &e) {
		note('N');
		r += e.v;
		try {
			unw_deep(1, 2);
		} catch (int v) {
			note('I');
			r += v;
		}
	}
	RETURN(F_NESTED, r);
}

/* Run by a destructor during unwinding: throws and catches inside. */
TRACEE long unw_inner_try(long n)
{
	ENTER(F_INNER_TRY);
	long r;
	try {
		r = unw_deep(n, 2);
	} catch (int v) {
		note('i');
		r = v;
	}
	RETURN(F_INNER_TRY, r);
}

TRACEE long unw_guarded(long n)
{
	ENTER(F_GUARDED);
	TryingGuard g{n};
	long r = unw_deep(n, 0);
	RETURN(F_GUARDED, r);
}

/* Every case once; a checksum of what was caught. */
TRACEE long unw_driver(long n)
{
	ENTER(F_DRIVER);
	long r = unw_catch(n);
	try {
		unw_rethrow(n);
	} catch (Err &e) {
		note('D');
		r += e.v;
	}
	r += unw_nested(n);
	try {
		unw_guarded(n);
	} catch (std::exception &) {
		note('G');
		r += 1000;
	}
	r += unw_catch(0);
	RETURN(F_DRIVER, r * 10 + n);
}

/* The driver `iters` times from one traced caller. */
TRACEE long unw_loop(long iters, long n)
{
	ENTER(F_LOOP);
	long total = 0;
	for (long i = 0; i < iters; i++)
		total += unw_driver(n + i % 3);
	RETURN(F_LOOP, total);
}

extern "C" const char *unw_trail(void)
{
	trail[tlen] = 0;
	return trail;
}

extern "C" void unw_reset(void)
{
	tlen = 0;
	memset(calls, 0, sizeof calls);
	memset(rets, 0, sizeof rets);
}

extern "C" long unw_nfuncs(void)
{
	return NF;
}

/* Function f's address, calls and normal returns. */
extern "C" void unw_func(long f, void **addr, long *ncalls, long *nrets)
{
	static void *const addrs[NF] = {
		(void *)unw_cleanup, (void *)unw_deep,	  (void *)unw_catch,   (void *)unw_rethrow, (void *)unw_nested,
		(void *)unw_inner_try, (void *)unw_guarded, (void *)unw_driver, (void *)unw_loop,
	};
	*addr = addrs[f];
	*ncalls = calls[f];
	*nrets = rets[f];
}

/* --- pthread_exit inside traced frames: glibc unwinds the thread
 * (_Unwind_ForcedUnwind, reached through dlsym), running the destructors of
 * every frame on the way.  The innermost traced function has none, so the
 * unwinder meets a hijacked return before any hook would run. */
#include <pthread.h>

static long pexit_dtors;

/* Counts its destruction in `*Counter`. */
template <long *Counter> struct DtorCount {
	~DtorCount() { __atomic_add_fetch(Counter, 1, __ATOMIC_SEQ_CST); }
};
typedef DtorCount<&pexit_dtors> CountingGuard;

TRACEE void unw_pexit_finish(long v)
{
	pthread_exit((void *)v);
}

TRACEE void unw_pexit_mid(long v)
{
	CountingGuard g;
	unw_pexit_finish(v);
}

TRACEE void *unw_pexit_worker(void *arg)
{
	CountingGuard g;
	unw_pexit_mid((long)arg);
	return nullptr;
}

/* Runs `n` threads that leave through pthread_exit two traced frames down:
 * the sum of their exit values times 1000 plus the destructors run (2 per
 * thread when the unwinder gets through every frame). */
extern "C" long unw_pexit_run(long n)
{
	pexit_dtors = 0;
	pthread_t t[16];
	long sum = 0;
	for (long i = 0; i < n && i < 16; i++)
		pthread_create(&t[i], nullptr, unw_pexit_worker, (void *)(i + 1));
	for (long i = 0; i < n && i < 16; i++) {
		void *r;
		pthread_join(t[i], &r);
		sum += (long)r;
	}
	return sum * 1000 + pexit_dtors;
}

/* --- pthread_cancel inside traced frames: the cancelled thread starts its
 * forced unwind inside libc (pthread_testcancel, or the cancellation signal
 * in a blocking call), so no hook runs before the unwinder meets the
 * innermost traced function's hijacked return; that function has no
 * cleanups.  The destructors above it must still run. */
#include <unistd.h>

static long cancel_dtors;
static long cancel_inside;

typedef DtorCount<&cancel_dtors> CancelGuard;

TRACEE void unw_cancel_wait(long v)
{
	__atomic_add_fetch(&cancel_inside, 1, __ATOMIC_SEQ_CST);
	for (long i = 0;; i++) {
		if (i & 1)
			pthread_testcancel();
		else
			usleep(200 + v);
	}
}

TRACEE void unw_cancel_mid(long v)
{
	CancelGuard g;
	unw_cancel_wait(v);
}

TRACEE void *unw_cancel_worker(void *arg)
{
	CancelGuard g;
	unw_cancel_mid((long)arg);
	return nullptr;
}

/* Runs `n` threads, cancels each once all are inside unw_cancel_wait: the
 * threads that ended cancelled times 1000 plus the destructors run (2 per
 * thread when the unwinder gets through every frame). */
extern "C" long unw_cancel_run(long n)
{
	cancel_dtors = 0;
	cancel_inside = 0;
	pthread_t t[16];
	if (n > 16)
		n = 16;
	for (long i = 0; i < n; i++)
		pthread_create(&t[i], nullptr, unw_cancel_worker, (void *)(i + 1));
	while (__atomic_load_n(&cancel_inside, __ATOMIC_SEQ_CST) < n)
		usleep(100);
	long cancelled = 0;
	for (long i = 0; i < n; i++) {
		pthread_cancel(t[i]);
		void *r;
		pthread_join(t[i], &r);
		cancelled += r == PTHREAD_CANCELED;
	}
	return cancelled * 1000 + __atomic_load_n(&cancel_dtors, __ATOMIC_SEQ_CST);
}

/* --- Exceptions inside a coroutine (makecontext): unw_loop run on a
 * coroutine's stack, static (which 0) or mmap'ed (which 1), every exception
 * thrown and caught there, no switch while its frames are live. */
#include <sys/mman.h>

extern "C" void uc_run_on_stack(void (*entry)(void), char *stack, size_t size); /* tracee_unwind.c */
static long coro_iters, coro_result;
static char coro_bss_stack[256 * 1024] __attribute__((aligned(16)));

/* The coroutine's function (traced, on the coroutine's stack); it ends
 * through uc_link. */
TRACEE void unw_coro_entry(void)
{
	coro_result = unw_loop(coro_iters, 2);
}

extern "C" long unw_coro(long iters, int which)
{
	size_t size = sizeof coro_bss_stack;
	char *stack = coro_bss_stack;
	if (which) {
		stack = (char *)mmap(0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (stack == MAP_FAILED)
			return -1;
	}
	coro_iters = iters;
	coro_result = -2;
	uc_run_on_stack(unw_coro_entry, stack, size);
	if (which)
		munmap(stack, size);
	return coro_result;
}
