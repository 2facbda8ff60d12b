/* Calls a traced function on the main thread, then overflows the stack of
 * a second thread.  That thread got an alternate signal stack from the
 * recorder at its first traced call, so the recorder's handler runs and
 * writes the trace; with the argument "no-altstack" the thread disables
 * it first, and the process dies of SIGSEGV where the recorder's handler
 * cannot run.  Untraced: status 139 either way. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

__attribute__((noinline)) int work(int n) { return n * 3 + 1; }

__attribute__((noinline)) int rec(volatile int n)
{
	volatile char pad[256];
	pad[0] = (char)n;
	return rec(n + 1) + pad[0];
}

static int no_altstack;

static void *thread_main(void *arg)
{
	(void)arg;
	volatile int first = work(-1);
	(void)first;
	if (no_altstack) {
		stack_t off = { .ss_flags = SS_DISABLE };
		sigaltstack(&off, 0);
	}
	return (void *)(long)rec(0);
}

int main(int argc, char **argv)
{
	no_altstack = argc > 1 && strcmp(argv[1], "no-altstack") == 0;
	long s = 0;
	for (int i = 0; i < 1000; i++)
		s += work(i);
	printf("s=%ld\n", s);
	fflush(stdout);
	pthread_t t;
	pthread_create(&t, 0, thread_main, 0);
	pthread_join(t, 0);
	return 0;
}
