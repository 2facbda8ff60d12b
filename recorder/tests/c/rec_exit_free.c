/* A program whose own free (with a site) glibc calls as each thread ends,
 * after every key destructor (__libc_thread_freeres frees the thread's
 * storage): past the recorder's and fgraph's exit hooks.  Prints how many
 * times free ran on the worker threads. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

extern void *__libc_malloc(size_t), *__libc_calloc(size_t, size_t), *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
static atomic_long frees;

void *malloc(size_t n) { return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { return __libc_realloc(p, n); }
void free(void *p)
{
	if (syscall(SYS_gettid) != getpid())
		atomic_fetch_add(&frees, 1);
	__libc_free(p);
}

static void *worker(void *arg)
{
	free(malloc(16));
	return arg;
}

int main(void)
{
	for (int i = 0; i < 4; i++) {
		pthread_t t;
		pthread_create(&t, 0, worker, 0);
		pthread_join(t, 0);
	}
	printf("worker free %ld\n", atomic_load(&frees));
	return 0;
}
