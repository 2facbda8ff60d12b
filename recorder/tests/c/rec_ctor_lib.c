/*
 * A library whose constructor, destructor and an atexit handler its
 * constructor registers all call traced functions.  Linked by a program
 * (DT_NEEDED), the loader runs its constructor before the preloaded
 * recorder's, so only an early start (the audit module) sees those calls;
 * dlopened, it runs it inside dlopen, before the module watcher can have
 * patched it (the audit module's hook does, earlier).  Each counts its
 * calls and prints the count (write(2) on stdout: the destructor and the
 * handler run after main's output was buffered).
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static long ctor_calls, fini_calls, atexit_calls;

__attribute__((noinline)) long ctorlib_step(long x, long *counter)
{
	++*counter;
	__asm__ volatile("" : "+r"(x));
	return x + 1;
}

/* Called by main too: its count is the program's. */
long ctorlib_ctor_calls(void) { return ctor_calls; }

static void say(const char *name, long n)
{
	char buf[64];
	int len = snprintf(buf, sizeof buf, "%s %ld\n", name, n);
	if (write(1, buf, len) != len)
		_exit(3);
}

__attribute__((noinline)) static void ctorlib_at_exit(void)
{
	for (long i = 0; i < 4; i++)
		ctorlib_step(i, &atexit_calls);
	say("ctorlib_atexit", atexit_calls);
}

__attribute__((constructor, noinline)) static void ctorlib_init(void)
{
	for (long i = 0; i < 3; i++)
		ctorlib_step(i, &ctor_calls);
	atexit(ctorlib_at_exit);
}

__attribute__((destructor, noinline)) static void ctorlib_fini(void)
{
	for (long i = 0; i < 2; i++)
		ctorlib_step(i, &fini_calls);
	say("ctorlib_fini", fini_calls);
	/* (For a program that dlopens the library and has no other way to
	 * ask.) */
	say("ctorlib_ctor_at_fini", ctor_calls);
}
