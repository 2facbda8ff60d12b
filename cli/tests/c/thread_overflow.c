/* Calls a traced function on the main thread, then overflows the stack of
 * a second thread: the process dies of SIGSEGV where the recorder's
 * handler cannot run (only the main thread has an alternate signal stack).
 * Untraced: status 139. */
#include <pthread.h>
#include <stdio.h>

__attribute__((noinline)) int work(int n) { return n * 3 + 1; }

__attribute__((noinline)) int rec(volatile int n)
{
	volatile char pad[256];
	pad[0] = (char)n;
	return rec(n + 1) + pad[0];
}

static void *thread_main(void *arg)
{
	(void)arg;
	return (void *)(long)rec(0);
}

int main(void)
{
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
