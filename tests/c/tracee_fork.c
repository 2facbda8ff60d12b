/* Functions for the fgraph fork/exec tests (exectest/tests/fgraph.rs):
 * fork and exec from inside traced calls.  Built like tracee.c (the arch's
 * patch-site flags). */
#include <unistd.h>

#define TRACEE __attribute__((noinline, noclone, noipa))

/* fork() inside a traced call; both processes run `after(pid)` (which
 * calls traced functions) and return through the hijacked return:
 * after(pid) * 10 + n. */
TRACEE long tracee_fork_call(long (*after)(long), long n)
{
	long pid = fork();
	long r = after(pid);
	return r * 10 + n;
}

/* execv() inside a traced call: returns only when it fails, with
 * 1000 + n. */
TRACEE long tracee_exec_call(const char *path, char *const argv[], long n)
{
	execv(path, argv);
	return 1000 + n;
}
