/* Functions of the site-discovery tests linked into the test binary,
 * built with the arch's patch-site flags (`site.flags`). */
#define TRACEE __attribute__((noinline, noclone, noipa))

/* Its site is overwritten before discovery: it must be refused. */
TRACEE long sites_victim(long a)
{
	return a * 3 + 1;
}

/* Untouched neighbour of the victim. */
TRACEE long sites_neighbour(long a)
{
	return a * 5 + 2;
}
