/* x86_64: -pg -mfentry -mnop-mcount -mrecord-mcount -fno-PIE sites
 * (a 5-byte NOP at the entry, recorded in __mcount_loc), as a shared
 * library: the non-PIC code links into a .so with text relocations
 * (__mcount_loc is read-only). */
#define TRACEE __attribute__((noinline, noclone, noipa))

TRACEE long sites_mcount_tracee(long a)
{
	return a * 9 + 4;
}

TRACEE long sites_mcount_other(long a)
{
	return sites_mcount_tracee(a) - 4;
}
