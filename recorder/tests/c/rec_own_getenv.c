/*
 * A program with its own getenv and setenv (as bash has: they look up and
 * bind its shell variables rather than `environ`), built with patch sites.
 * The recorder must read and set its variables without them: bash's would
 * answer from its shell variables, and the calls were counted as the
 * program's (or, between the flush before an exec and its failure, as
 * events lost "after the process's final flush").  Modes:
 *
 *   fail-exec  an exec that fails, then exit; prints
 *                getenv_calls N   calls of getenv while main ran (0: main makes none)
 *                setenv_calls N   calls of setenv since the start (0)
 *   clearenv   clears its environment (keeping nothing, as make's test
 *              driver or a sandbox does), then execs itself as `child`:
 *              the new image must be recorded still
 *   child      calls own_work once and exits
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;
volatile long getenv_calls, setenv_calls;
volatile int in_main;

char *getenv(const char *name)
{
	if (in_main)
		getenv_calls++;
	size_t n = strlen(name);
	for (char **e = environ; e && *e; e++)
		if (!strncmp(*e, name, n) && (*e)[n] == '=')
			return *e + n + 1;
	return NULL;
}

int setenv(const char *name, const char *value, int overwrite)
{
	(void)name, (void)value, (void)overwrite;
	setenv_calls++;
	return 0;
}

volatile int sink;

__attribute__((noinline)) int own_work(int x)
{
	sink = x;
	return x * 2 + 1;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	if (!strcmp(mode, "child"))
		return own_work(20) == 41 ? 0 : 1;
	if (!strcmp(mode, "clearenv")) {
		own_work(1);
		clearenv();
		char *args[] = {argv[0], "child", NULL};
		execv("/proc/self/exe", args);
		perror("execv");
		return 1;
	}
	in_main = 1;
	own_work(2);
	execl("/nonexistent/ftramp-test-prog", "prog", (char *)0);
	in_main = 0;
	own_work(3);
	printf("getenv_calls %ld\nsetenv_calls %ld\n", getenv_calls, setenv_calls);
	return 0;
}
