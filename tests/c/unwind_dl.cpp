/* A library dlopen'ed after the unwinder hooks were installed
 * (exectest/tests/unwind.rs): its landing pads reach _Unwind_Resume and
 * __cxa_begin_catch through its own GOT.  Built with the arch's patch-site
 * flags. */
#define TRACEE extern "C" __attribute__((noinline, noclone, noipa, visibility("default")))

static long cleaned;

TRACEE long unwdl_cleanup(long c)
{
	cleaned = cleaned * 7 + c;
	return c;
}

struct Guard {
	long c;
	~Guard() { unwdl_cleanup(c); }
};

TRACEE long unwdl_deep(long n);
static long (*volatile deep_self)(long) = unwdl_deep;

TRACEE long unwdl_deep(long n)
{
	Guard g{n};
	if (n <= 0)
		throw 40L;
	return deep_self(n - 1) + 1;
}

/* 100 + 40 + the cleanups' checksum. */
TRACEE long unwdl_run(long n)
{
	cleaned = 0;
	try {
		return unwdl_deep(n);
	} catch (long v) {
		long r = 100 + v + unwdl_cleanup(0);
		return r + cleaned;
	}
}
