/*
 * A parent that reads what its child writes to stdout and stderr (as a
 * shell's command substitution or a build reading a compiler does) and
 * prints it between markers; the child makes many traced calls, so that
 * small buffers lose some.  Under `ftramp record` the child's output must
 * be its own:
 *
 *   loss_child            the parent: runs `loss_child child 2>&1`
 *   loss_child child      makes 200000 calls, prints `child done`
 */
#include <stdio.h>
#include <string.h>

__attribute__((noinline)) long step(long x)
{
	__asm__ volatile("" : "+r"(x));
	return x + 1;
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "child")) {
		long s = 0;
		for (long i = 0; i < 200000; i++)
			s = step(s);
		printf("child done %ld\n", s);
		return 0;
	}
	char cmd[4096];
	snprintf(cmd, sizeof cmd, "%s child 2>&1", argv[0]);
	FILE *p = popen(cmd, "r");
	if (!p)
		return 2;
	char buf[4096];
	size_t n = fread(buf, 1, sizeof buf - 1, p);
	buf[n] = 0;
	int st = pclose(p);
	printf("[%s] status %d\n", buf, st);
	return 0;
}
