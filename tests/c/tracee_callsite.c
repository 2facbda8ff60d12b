/* A tracee with room for an ops pointer before its entry
 * (arch-specs/<arch>.toml `site.callsite_flags`). */
#define TRACEE __attribute__((noinline, noclone, noipa))

TRACEE long tracee_callsite(long a, long b)
{
	return a * 7 + b;
}
