/*
 * libdemo_util.so: the shared library the demo calls into.  Built with the
 * same patch-site flags as the demo, so `ftramp record` traces it too (the
 * runtime patches every loaded module that has sites).
 *
 * Like the demo, each function counts its own calls; util_calls() hands the
 * counts to the demo, which prints them next to its own.
 */
#include <stddef.h>
#include <string.h>

#include "demo.h"

enum { U_CHECKSUM, U_MIX, U_SCALE, U_COUNT };
static const char *const util_names[U_COUNT] = { "util_checksum", "util_mix", "util_scale" };
static unsigned long util_counter[U_COUNT];
#define COUNT(f) __atomic_fetch_add(&util_counter[f], 1, __ATOMIC_RELAXED)

/* One round of a multiplicative hash (FNV-1a style) over a whole word. */
FUNC static unsigned long util_mix(unsigned long h, const char *word, size_t len)
{
	COUNT(U_MIX);
	for (size_t i = 0; i < len; i++)
		h = (h ^ (unsigned char)word[i]) * 0x100000001b3ul;
	return h;
}

/* Checksum of a line: every space-separated word is mixed in. */
unsigned long util_checksum(const char *line)
{
	unsigned long h = 0xcbf29ce484222325ul;
	const char *p = line;

	COUNT(U_CHECKSUM);
	while (*p) {
		size_t len = strcspn(p, " ");
		if (len)
			h = util_mix(h, p, len);
		p += len;
		p += strspn(p, " ");
	}
	return h;
}

/* x scaled by k/8 with a little floating-point work, k rounds of it. */
double util_scale(double x, int k)
{
	COUNT(U_SCALE);
	for (int i = 0; i < k; i++)
		x = x * 1.125 - x / (i + 2.0);
	return x;
}

/* The name and call count of counter i; NULL past the last. */
NOTRACE const char *util_calls(int i, unsigned long *calls)
{
	if (i < 0 || i >= U_COUNT)
		return NULL;
	*calls = __atomic_load_n(&util_counter[i], __ATOMIC_RELAXED);
	return util_names[i];
}
