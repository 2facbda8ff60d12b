/* The tracees of Linux's samples/ftrace/ftrace-ops.c, built with patch sites. */
#define TRACEE __attribute__((noinline, noclone, noipa))

TRACEE void tracee_relevant(void)
{
	__asm__ volatile("" ::: "memory");
}

TRACEE void tracee_irrelevant(void)
{
	__asm__ volatile("" ::: "memory");
}
