/* A shared library with patchable entries (`site.flags`), opened and
 * closed by the discovery tests. */
#define TRACEE __attribute__((noinline, noclone, noipa))

TRACEE long sites_dl_tracee(long a)
{
	return a * 7 + 3;
}

TRACEE long sites_dl_other(long a)
{
	return sites_dl_tracee(a) + 1;
}

/* Not exported: named only through .symtab. */
TRACEE static long sites_dl_static(long a)
{
	return a - 1;
}

long (*volatile sites_dl_static_ptr)(long) = sites_dl_static;
