/* Built with `site.flags` and the arch's landing pads (-fcf-protection /
 * -mbranch-protection): the compiler records the NOPs after `endbr64` /
 * `bti c`. */
#define TRACEE __attribute__((noinline, noclone, noipa))

TRACEE long sites_pad(long a)
{
	return a + 11;
}
