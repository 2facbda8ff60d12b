/*
 * The bundled demo of `ftramp demo`: a small program with something to see
 * in a call graph.
 *
 *   - three worker threads and the main thread;
 *   - recursion (fib);
 *   - nesting: process_line -> tokenize -> classify, checksum through the
 *     shared library libdemo_util.so (util_checksum -> util_mix);
 *   - a little busy work (spin) whose length varies, so durations differ.
 *
 * Every traced function counts its own calls; at the end the program
 * prints the counts (`calls <function> <n>`, its own and the library's),
 * which the tests compare with the recorded trace.
 *
 * Build by hand (x86_64 with gcc; `ftramp cflags` prints the site flags of an
 * arch, `ftramp demo --build-dir DIR --build-only` the flags it uses):
 *   F="-O2 -fpatchable-function-entry=5 -fno-ipa-ra -fno-optimize-sibling-calls"
 *   cc $F -fPIC -shared -o libdemo_util.so demo_util.c
 *   cc $F -pthread -o demo demo.c -L. -ldemo_util -Wl,-rpath,'$ORIGIN'
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "demo.h"

#define FUNCS(X) X(main) X(worker) X(fib) X(process_line) X(tokenize) X(classify) X(spin) X(summarize)
#define ENUM(f) F_##f,
#define NAME(f) #f,
enum { FUNCS(ENUM) F_COUNT };
static const char *const names[F_COUNT] = { FUNCS(NAME) };
static unsigned long counter[F_COUNT];
#define COUNT(f) __atomic_fetch_add(&counter[F_##f], 1, __ATOMIC_RELAXED)

#define NWORKERS 3

static const char *const lines[] = {
	"open the file and read it",
	"count words",
	"sort them by length then by name",
	"print",
};
#define NLINES (sizeof(lines) / sizeof(lines[0]))

/* Busy work: about n rounds of arithmetic the compiler cannot drop. */
FUNC static unsigned long spin(unsigned long n)
{
	unsigned long x = n;

	COUNT(spin);
	for (unsigned long i = 0; i < n; i++)
		__asm__ volatile("" : "+r"(x));
	return x;
}

FUNC static long fib(int n)
{
	COUNT(fib);
	if (n < 2)
		return n;
	return fib(n - 1) + fib(n - 2);
}

/* A word's class: 0 short, 1 medium, 2 long (and longer words cost more). */
FUNC static int classify(const char *word, size_t len)
{
	COUNT(classify);
	spin(len * 200);
	(void)word;
	return len < 4 ? 0 : len < 6 ? 1 : 2;
}

/* Counts the words of each class in line. */
FUNC static int tokenize(const char *line, int classes[3])
{
	int words = 0;

	COUNT(tokenize);
	for (const char *p = line; *p;) {
		size_t len = strcspn(p, " ");
		if (len) {
			classes[classify(p, len)]++;
			words++;
		}
		p += len;
		p += strspn(p, " ");
	}
	return words;
}

FUNC static unsigned long process_line(const char *line)
{
	int classes[3] = { 0, 0, 0 };

	COUNT(process_line);
	int words = tokenize(line, classes);
	return util_checksum(line) ^ (unsigned long)(words * 3 + classes[2]);
}

struct job {
	int id;
	unsigned long result;
};

FUNC static void *worker(void *arg)
{
	struct job *job = arg;
	unsigned long h = 0;

	COUNT(worker);
	for (size_t i = 0; i < NLINES; i++)
		if ((i + job->id) % 2 == 0 || i == 0)
			h ^= process_line(lines[i]);
	h += (unsigned long)fib(3 + job->id);
	job->result = h + (unsigned long)util_scale((double)job->id, 4 + job->id);
	return NULL;
}

FUNC static void summarize(struct job *jobs, int n)
{
	unsigned long total = 0;

	COUNT(summarize);
	for (int i = 0; i < n; i++)
		total += jobs[i].result;
	spin(20000);
	printf("demo: %d workers, combined result %lx\n", n, total);
}

NOTRACE static void print_counts(void)
{
	unsigned long calls;
	const char *name;

	for (int i = 0; i < F_COUNT; i++)
		printf("calls %s %lu\n", names[i], __atomic_load_n(&counter[i], __ATOMIC_RELAXED));
	for (int i = 0; (name = util_calls(i, &calls)) != NULL; i++)
		printf("calls %s %lu\n", name, calls);
}

int main(void)
{
	pthread_t threads[NWORKERS];
	struct job jobs[NWORKERS];

	COUNT(main);
	for (int i = 0; i < NWORKERS; i++) {
		jobs[i] = (struct job){ .id = i + 1 };
		if (pthread_create(&threads[i], NULL, worker, &jobs[i]) != 0) {
			perror("demo: pthread_create");
			return 1;
		}
	}
	fib(5);
	for (int i = 0; i < NWORKERS; i++)
		pthread_join(threads[i], NULL);
	summarize(jobs, NWORKERS);
	print_counts();
	return 0;
}
