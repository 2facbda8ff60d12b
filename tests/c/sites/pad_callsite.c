/* Built with `site.callsite_flags` and landing pads: the recorded address
 * is before the symbol, the site after the landing pad. */
#define TRACEE __attribute__((noinline, noclone, noipa))

TRACEE long sites_pad_callsite(long a)
{
	return a + 13;
}

/* Its reserved NOPs before the symbol are overwritten before discovery. */
TRACEE long sites_victim_callsite(long a)
{
	return a + 17;
}
