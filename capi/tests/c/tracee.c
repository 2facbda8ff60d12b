/* Traced functions of the C API test: compiled with the arch's patch-site
 * flags (capi/build.rs), so each has a patch site. */

long capi_tracee_add(long a, long b) { return a + b; }

long capi_tracee_six(long a, long b, long c, long d, long e, long f)
{
    return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f;
}

long capi_tracee_other(long a) { return a * 3; }

long capi_tracee_redirected(long a, long b) { return a * 100 + b; }

/* Where an IPMODIFY ops sends capi_tracee_redirected. */
long capi_alt(long a, long b) { return -(a + b); }

double capi_tracee_fp(double x, double y) { return x * y + 1.0; }

long capi_tracee_recurse(long a) { return a + 1; }
